"""MLP Fusion (arXiv 2307.08941): cluster FFN neurons, keep means plus a constant scaling P."""

from pipeline.methods.mlp_fusion.config import MlpFusionConfig
from pipeline.registry import register_stage

__all__ = ["MlpFusionConfig"]

register_stage(MlpFusionConfig, "pipeline.methods.mlp_fusion.stage:apply")

"""Static Model Pruning (arXiv 2210.06210): frozen weights, trained first-order mask scores."""

from pipeline.methods.smp.config import SmpConfig
from pipeline.registry import register_stage

__all__ = ["SmpConfig"]

register_stage(SmpConfig, "pipeline.methods.smp.stage:apply")

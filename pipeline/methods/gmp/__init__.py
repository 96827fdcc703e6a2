"""GMP* (arXiv 2210.06384): gradual magnitude pruning with a cubic schedule, KD and learning-rate re-warming."""

from pipeline.methods.gmp.config import GmpConfig
from pipeline.registry import register_stage

__all__ = ["GmpConfig"]

register_stage(GmpConfig, "pipeline.methods.gmp.stage:apply")

"""Distillation into smaller students: MiniLMv2 relations (arXiv 2012.15828), hidden-state and output transfer."""

from pipeline.methods.distill.config import DistillConfig
from pipeline.registry import register_stage

__all__ = ["DistillConfig"]

register_stage(DistillConfig, "pipeline.methods.distill.stage:apply")

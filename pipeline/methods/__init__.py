"""Compression methods; importing this package registers each one (explicitly, no auto-discovery)."""

from pipeline.methods import mlp_fusion

__all__ = ["mlp_fusion"]

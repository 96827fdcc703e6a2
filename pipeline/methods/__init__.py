"""Compression methods; importing this package registers each one (explicitly, no auto-discovery)."""

from pipeline.methods import distill, gmp, mlp_fusion, smp

__all__ = ["distill", "gmp", "mlp_fusion", "smp"]

"""Compression methods; importing this package registers each one (explicitly, no auto-discovery)."""

from pipeline.methods import gmp, mlp_fusion, smp

__all__ = ["gmp", "mlp_fusion", "smp"]

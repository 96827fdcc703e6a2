"""Fake int8: training steps that see the rounding the int8 graph will do (quantisation-aware training).

ONNX Runtime's dynamic int8 (`export.onnx.quantize_int8`) rounds every MatMul with a constant weight: the weight per
output channel, symmetric, in 7 bits (|q| ≤ 64, `REDUCE_RANGE`), and its input per tensor, asymmetric, to uint8 at
the range of each call (DynamicQuantizeLinear). Inside `fake_int8(model)` every linear layer of the model does the
same rounding to its weight (a masked one: its masked weight) and to its input, with straight-through gradients (the
rounding's derivative taken as 1, so the fp32 weights keep learning), and the steps learn weights whose rounding
costs less. The embedding tables, which ORT also stores in int8 (its Gather quantisation), are left unrounded here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from export.int8 import REDUCE_RANGE

WEIGHT_QMAX = 64 if REDUCE_RANGE else 127  # ORT's symmetric range: q in [-QMAX, QMAX], scale max|w| / QMAX


def _straight_through(x: torch.Tensor, rounded: torch.Tensor) -> torch.Tensor:
    return x + (rounded - x).detach()


def fake_weight(w: torch.Tensor) -> torch.Tensor:
    """`w` rounded as ORT's symmetric per-channel int8 rounds it: scale max|w_row| / QMAX, zero point 0."""
    scale = (w.detach().abs().amax(dim=1, keepdim=True) / WEIGHT_QMAX).clamp_min(1e-12)
    return _straight_through(w, torch.clamp(torch.round(w / scale), -WEIGHT_QMAX, WEIGHT_QMAX) * scale)


def fake_activation(x: torch.Tensor) -> torch.Tensor:
    """`x` rounded as DynamicQuantizeLinear rounds it: uint8 over [min(0, min x), max(0, max x)], one scale."""
    lo, hi = x.detach().min().clamp_max(0), x.detach().max().clamp_min(0)
    scale = ((hi - lo) / 255).clamp_min(1e-12)
    zero = torch.clamp(torch.round(-lo / scale), 0, 255)
    return _straight_through(x, (torch.clamp(torch.round(x / scale) + zero, 0, 255) - zero) * scale)


def _forward(linear: nn.Module):
    def forward(x: torch.Tensor) -> torch.Tensor:
        weight = linear.masked_weight() if hasattr(linear, "masked_weight") else linear.weight
        return F.linear(fake_activation(x), fake_weight(weight), linear.bias)

    return forward


@contextlib.contextmanager
def fake_int8(model: nn.Module, enabled: bool = True) -> Iterator[None]:
    """Within the block, every plain `nn.Linear` of `model` (and every masked one, on its masked weight) with a
    non-empty weight computes on int8-rounded weights and inputs (an instance attribute over the class's forward,
    removed on the way out). MLP Fusion's `ScaledLinear` folds into its weight at export: not rounded here."""
    if not enabled:  # the loop asks at every step: most steps need nothing done
        yield
        return
    linears = [
        m for m in model.modules() if (type(m) is nn.Linear or hasattr(m, "masked_weight")) and m.weight.numel() > 0
    ]  # a masked linear (`pipeline.compress.masking.MaskedLinear`) says so by its `masked_weight`
    for m in linears:
        m.forward = _forward(m)
    try:
        yield
    finally:
        for m in linears:
            del m.forward

"""Which units stay: the cubic sparsity schedule, kept counts, and top-k masks with a straight-through gradient."""

from __future__ import annotations

import math

import torch


def cubic(x: float, start: float, end: float) -> float:
    """Zhu & Gupta's cubic ramp from `start` (x=0) to `end` (x≥1): end + (start − end)(1 − x)³."""
    x = min(max(x, 0.0), 1.0)
    return end + (start - end) * (1.0 - x) ** 3


def kept_count(n: int, keep: float) -> int:
    """Units kept out of `n` at kept fraction `keep` (floor, as the SMP code's `int(v·numel)`)."""
    return min(n, max(0, math.floor(keep * n + 1e-9)))


class _TopK(torch.autograd.Function):
    """Binary mask of the k largest scores; the backward pass is the identity (straight-through)."""

    @staticmethod
    def forward(ctx, scores: torch.Tensor, k: int) -> torch.Tensor:
        return topk_mask(scores, k)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


def topk_mask(scores: torch.Tensor, k: int) -> torch.Tensor:
    """{0, 1} mask (dtype of `scores`) with ones at the k largest entries; ties go to the lower index."""
    flat = scores.detach().flatten()
    n = flat.numel()
    if k >= n:
        return torch.ones_like(scores)
    if k <= 0:
        return torch.zeros_like(scores)
    # kthvalue is ~10x faster than a sort on million-entry matrices (SMP recomputes masks every step).
    threshold = torch.kthvalue(flat, n - k + 1).values
    mask = flat > threshold
    ties = (flat == threshold).nonzero().squeeze(1)
    mask[ties[: k - int(mask.sum())]] = True  # exactly k: the threshold's ties go to the lowest indices
    return mask.to(scores.dtype).view_as(scores)


def ste_topk(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Top-k mask whose gradient flows to `scores` unchanged (∂L/∂S := ∂L/∂M)."""
    return _TopK.apply(scores, k)

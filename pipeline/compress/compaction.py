"""Structural compaction: turn what a method made removable into smaller dense layers, exactly.

- MLP Fusion's constant scaling P is folded into W2 (`W2[:, j] *= P_j`): same forward pass, plain Linear.
- An FFN neuron whose W2 column is all zero contributes nothing and is removed.
- A neuron whose W1 row is all zero emits the constant act(b1_j) * W2[:, j]; that constant moves into b2
  and the neuron is removed.
- An attention head whose W_O columns are all zero contributes nothing and is removed.
- A head whose W_V rows are all zero has the same value vector b_V[h] at every key; its attention weights sum
  to 1, so it outputs b_V[h] whatever Q and K are. W_O[:, h] b_V[h] moves into b_O and the head is removed.
  A layer left with no head gets `HeadlessAttention` (LayerNorm(b_O + x)).
The result has real per-layer widths, which `pipeline.models.io.save_model` records and `load_model` rebuilds.

Cutting a model to a shape (a subset of its layers, each narrowed to its most important heads and neurons) goes
through the same removal path: `narrow_` empties the dropped units' outputs and compaction removes them. Distill's
students, the plan's latency probes and a planned width all use it.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from pipeline.models.layers import (
    HeadlessAttention,
    Intermediate,
    ScaledIntermediate,
    encoder_layers,
    ffn_widths,
    head_counts,
    new_linear,
)


@torch.no_grad()
def fold_scale_(layer: nn.Module) -> bool:
    """Fold a ScaledIntermediate's constant into the next linear layer; True if there was one."""
    inter = layer.intermediate
    if not isinstance(inter, ScaledIntermediate):
        return False
    layer.output.dense.weight.mul_(inter.scale.to(layer.output.dense.weight.dtype)[None, :])
    layer.intermediate = Intermediate(inter.dense, inter.intermediate_act_fn)
    return True


@torch.no_grad()
def drop_dead_neurons_(layer: nn.Module) -> int:
    """Remove FFN neurons with an all-zero W2 column or W1 row (folding the latter's constant into b2)."""
    fc1, fc2, act = layer.intermediate.dense, layer.output.dense, layer.intermediate.intermediate_act_fn
    silent = (fc2.weight == 0).all(dim=0)
    constant = (fc1.weight == 0).all(dim=1) & ~silent
    if constant.any():
        fc2.bias.add_(fc2.weight[:, constant] @ act(fc1.bias[constant]))
    keep = ~(silent | constant)
    if keep.all():
        return 0
    new_fc1 = new_linear(fc1.in_features, int(keep.sum()), fc1.weight.dtype)
    new_fc2 = new_linear(int(keep.sum()), fc2.out_features, fc2.weight.dtype)
    new_fc1.weight.copy_(fc1.weight[keep])
    new_fc1.bias.copy_(fc1.bias[keep])
    new_fc2.weight.copy_(fc2.weight[:, keep])
    new_fc2.bias.copy_(fc2.bias)
    layer.intermediate.dense, layer.output.dense = new_fc1, new_fc2
    return int((~keep).sum())


@torch.no_grad()
def drop_dead_heads_(layer: nn.Module) -> int:
    """Remove heads with all-zero W_O columns or all-zero W_V rows (folding the latter's W_O b_V into b_O).

    The fold is exact in eval mode without `head_mask` (attention weights then sum to 1 over the keys).
    Kept heads keep their size d, so the softmax scale 1/sqrt(d) is unchanged.
    """
    if isinstance(layer.attention, HeadlessAttention):
        return 0
    att, out = layer.attention.self, layer.attention.output.dense
    n, d = att.num_attention_heads, att.attention_head_size
    silent = (out.weight.reshape(out.out_features, n, d) == 0).all(dim=2).all(dim=0)
    constant = (att.value.weight.reshape(n, d, -1) == 0).all(dim=2).all(dim=1) & ~silent
    if constant.any():
        cols = constant.repeat_interleave(d)
        out.bias.add_(out.weight[:, cols] @ att.value.bias[cols])
    keep = ~(silent | constant)
    if keep.all():
        return 0
    if not keep.any():
        layer.attention = HeadlessAttention.replacing(layer.attention)
        return n
    rows = keep.repeat_interleave(d)
    for name in ("query", "key", "value"):
        setattr(att, name, _linear(getattr(att, name).weight[rows], getattr(att, name).bias[rows]))
    layer.attention.output.dense = _linear(out.weight[:, rows], out.bias)
    att.num_attention_heads = int(keep.sum())
    att.all_head_size = att.num_attention_heads * d
    return n - att.num_attention_heads


@torch.no_grad()
def _linear(weight: torch.Tensor, bias: torch.Tensor) -> nn.Linear:
    """A new nn.Linear holding copies of `weight` ([out, in]) and `bias`."""
    lin = new_linear(weight.shape[1], weight.shape[0], weight.dtype).to(weight.device)
    lin.weight.copy_(weight)
    lin.bias.copy_(bias)
    return lin


def compact_(model: nn.Module) -> dict:
    """Compact `model` in place and report what changed per layer."""
    before, heads_before = ffn_widths(model), head_counts(model)
    folded, removed, removed_heads = [], [], []
    for i, layer in enumerate(encoder_layers(model)):
        if fold_scale_(layer):
            folded.append(i)
        removed.append(drop_dead_neurons_(layer))
        removed_heads.append(drop_dead_heads_(layer))
    return {
        "folded_scale_layers": folded,
        "ffn_widths_before": before,
        "ffn_widths": ffn_widths(model),
        "removed_ffn_neurons": removed,
        "heads_before": heads_before,
        "heads": head_counts(model),
        "removed_heads": removed_heads,
        "remaining_zeros": remaining_zeros(model),
    }


def remaining_zeros(model: nn.Module) -> dict:
    """Zero weights still inside the encoder's (compacted) linear layers: work a dense runtime does for nothing.

    Unstructured masks leave most of their zeros here; the share of zeros is the share of encoder matmul
    multiply-adds (the FLOP-bound model's linear part) spent on them.
    """
    total = zeros = 0
    for layer in encoder_layers(model):
        for m in layer.modules():
            if isinstance(m, nn.Linear):
                total += m.weight.numel()
                zeros += int((m.weight == 0).sum())
    return {"encoder_linear_weights": total, "zero_weights": zeros, "zero_fraction": round(zeros / max(total, 1), 4)}


# --- cutting a model to a shape: a student's layers, a latency probe, a planned width ---------------------------


@torch.no_grad()
def narrow_(model: nn.Module, heads: int | None, ffn: int | None) -> dict:
    """Keep the `heads` / `ffn` most important units per layer (by the norm of their weights), exactly removed.

    A unit's importance is the product of the norms of what it reads and what it writes (Q/K/V rows and W_O
    columns for a head; the W1 row and W2 column for a neuron). The others lose their output weights, which
    makes them provably dead, and compaction removes them: one removal path for every method.
    """
    for layer in encoder_layers(model):
        att = layer.attention.self
        d, n_heads = att.attention_head_size, att.num_attention_heads
        out = layer.attention.output.dense.weight
        if heads is not None and heads < n_heads:
            reads = sum(
                getattr(att, m).weight.view(n_heads, d, -1).pow(2).sum((1, 2)) for m in ("query", "key", "value")
            )
            writes = out.view(out.shape[0], n_heads, d).pow(2).sum((0, 2))
            drop = (reads.sqrt() * writes.sqrt()).argsort()[: n_heads - heads]
            out.view(out.shape[0], n_heads, d)[:, drop] = 0
        w1, w2 = layer.intermediate.dense.weight, layer.output.dense.weight
        if ffn is not None and ffn < w1.shape[0]:
            drop = (w1.norm(dim=1) * w2.norm(dim=0)).argsort()[: w1.shape[0] - ffn]
            w2[:, drop] = 0
    return compact_(model)


def cut_from(teacher: nn.Module, keep: list[int], heads: int | None, ffn: int | None) -> tuple[nn.Module, dict | None]:
    """A copy of `teacher` with only the layers `keep`, each narrowed to `heads` heads and `ffn` neurons when given
    (by `narrow_`, compacted); returns it and the compaction report (None when nothing was narrowed)."""
    model = copy.deepcopy(teacher)
    model.base_model.encoder.layer = nn.ModuleList([encoder_layers(model)[i] for i in keep])
    model.config.num_hidden_layers = len(keep)
    report = narrow_(model, heads, ffn) if heads is not None or ffn is not None else None
    return model, report

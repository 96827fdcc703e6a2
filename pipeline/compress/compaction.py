"""Structural compaction: turn what a method made removable into smaller dense layers, exactly.

- MLP Fusion's constant scaling P is folded into W2 (`W2[:, j] *= P_j`): same forward pass, plain Linear.
- An FFN neuron whose W2 column is all zero contributes nothing and is removed.
- A neuron whose W1 row is all zero emits the constant act(b1_j) * W2[:, j] (gated: act(b_in_j) b_gate_j W2[:, j]);
  that constant moves into b2 and the neuron is removed.
- An attention head whose W_O columns are all zero contributes nothing and is removed.
- A head whose W_V rows are all zero has the same value vector b_V[h] at every key; its attention weights sum
  to 1, so it outputs b_V[h] whatever Q and K are. W_O[:, h] b_V[h] moves into b_O and the head is removed.
  A layer left with no head gets `HeadlessAttention` (LayerNorm(b_O + x), or b_O where the block adds the residual).
Every family goes through the same code: its adapter says where the units live (`pipeline.models.families`).
The result has real per-layer widths, which `pipeline.models.io.save_model` records and `load_model` rebuilds.

Cutting a model to a shape (a subset of its layers, each narrowed to its most important heads and neurons) goes
through the same removal path: `narrow_` empties the dropped units' outputs and compaction removes them. Distill's
students, the plan's latency probes and a planned width all use it.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from pipeline.models.families import Family, family_of
from pipeline.models.layers import (
    ScaledLinear,
    encoder_layers,
    ffn_widths,
    head_counts,
    head_readers,
    keep_heads_,
    keep_neurons_,
    neuron_constants,
)


@torch.no_grad()
def fold_scale_(family: Family, layer: nn.Module) -> bool:
    """Fold a ScaledLinear's constant into its weight (`W2[:, j] *= P_j`); True if there was one."""
    path = family.ffn_writer.path
    fc2 = layer.get_submodule(path)
    if not isinstance(fc2, ScaledLinear):
        return False
    layer.set_submodule(path, fc2.folded())
    return True


@torch.no_grad()
def drop_dead_neurons_(family: Family, layer: nn.Module) -> int:
    """Remove FFN neurons with an all-zero W2 column or all-zero input rows (folding the latter's constant into b2).

    A gated neuron's input rows are its up-projection and gate rows; its constant is act(b_in) * b_gate. Without
    an output bias a non-zero constant has nowhere to go, so such a neuron stays.
    """
    fc2 = layer.get_submodule(family.ffn_writer.path)
    silent = (fc2.weight == 0).all(dim=0)
    constant = ~silent
    for m in family.ffn_readers:
        w = layer.get_submodule(m.path).weight
        constant &= (w.view(m.segments, -1, w.shape[1]) == 0).all(dim=2).all(dim=0)
    if constant.any():
        values = neuron_constants(family, layer, constant)
        if fc2.bias is not None:
            fc2.bias.add_(fc2.weight[:, constant] @ values)
        elif (values != 0).any():
            constant[constant.clone()] = values == 0
    keep = ~(silent | constant)
    if keep.all():
        return 0
    keep_neurons_(family, layer, keep)
    return int((~keep).sum())


@torch.no_grad()
def drop_dead_heads_(family: Family, layer: nn.Module) -> int:
    """Remove heads with all-zero W_O columns or all-zero W_V rows (folding the latter's W_O b_V into b_O).

    The fold is exact in eval mode without `head_mask` (attention weights then sum to 1 over the keys).
    Kept heads keep their size d, so the softmax scale 1/sqrt(d) is unchanged.
    """
    n = family.heads(layer)
    if n == 0:
        return 0
    d = family.head_size(layer)
    out = layer.get_submodule(family.head_writer.path)
    matrix, segment = family.value
    value, segments = layer.get_submodule(matrix.path), matrix.segments
    silent = (out.weight.reshape(out.out_features, n, d) == 0).all(dim=2).all(dim=0)
    constant = (value.weight.view(segments, n, d, -1)[segment] == 0).all(dim=2).all(dim=1) & ~silent
    if constant.any():
        cols = constant.repeat_interleave(d)
        if value.bias is None:
            pass  # V = 0 and no bias: the head outputs zeros
        elif out.bias is not None:
            out.bias.add_(out.weight[:, cols] @ value.bias.view(segments, -1)[segment][cols])
        else:  # a bias to carry and no output bias to carry it: the head stays
            constant &= False
    keep = ~(silent | constant)
    keep_heads_(family, layer, keep)
    return n - family.heads(layer)


def compact_(model: nn.Module) -> dict:
    """Compact `model` in place and report what changed per layer."""
    family = family_of(model)
    before, heads_before = ffn_widths(model), head_counts(model)
    folded, removed, removed_heads = [], [], []
    for i, layer in enumerate(encoder_layers(model)):
        if fold_scale_(family, layer):
            folded.append(i)
        removed.append(drop_dead_neurons_(family, layer))
        removed_heads.append(drop_dead_heads_(family, layer))
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
    family = family_of(model)
    for layer in encoder_layers(model):
        n_heads = family.heads(layer)
        if heads is not None and heads < n_heads:
            d = family.head_size(layer)
            reads = sum(
                layer.get_submodule(m.path).weight.view(m.segments, n_heads, d, -1).pow(2).sum((0, 2, 3))
                for m in head_readers(family, layer)
            )
            out = layer.get_submodule(family.head_writer.path).weight
            writes = out.view(out.shape[0], n_heads, d).pow(2).sum((0, 2))
            drop = (reads.sqrt() * writes.sqrt()).argsort()[: n_heads - heads]
            out.view(out.shape[0], n_heads, d)[:, drop] = 0
        w2 = layer.get_submodule(family.ffn_writer.path).weight
        if ffn is not None and ffn < w2.shape[1]:
            (m,) = family.ffn_readers  # a gated neuron reads two rows: its norm is over both
            w1 = (
                layer.get_submodule(m.path)
                .weight.view(m.segments, w2.shape[1], -1)
                .transpose(0, 1)
                .reshape(w2.shape[1], -1)
            )
            drop = (w1.norm(dim=1) * w2.norm(dim=0)).argsort()[: w2.shape[1] - ffn]
            w2[:, drop] = 0
    return compact_(model)


def cut_from(teacher: nn.Module, keep: list[int], heads: int | None, ffn: int | None) -> tuple[nn.Module, dict | None]:
    """A copy of `teacher` with only the layers `keep`, each narrowed to `heads` heads and `ffn` neurons when given
    (by `narrow_`, compacted); returns it and the compaction report (None when nothing was narrowed)."""
    model = copy.deepcopy(teacher)
    family_of(model).set_layers_(model, [encoder_layers(model)[i] for i in keep])
    report = narrow_(model, heads, ffn) if heads is not None or ffn is not None else None
    return model, report

"""Structural compaction: turn what a method made removable into smaller dense layers, exactly.

- MLP Fusion's constant scaling P is folded into W2 (`W2[:, j] *= P_j`): same forward pass, plain Linear.
- An FFN neuron whose W2 column is all zero contributes nothing and is removed.
- A neuron whose W1 row is all zero emits the constant act(b1_j) * W2[:, j]; that constant moves into b2
  and the neuron is removed.
The result has real per-layer widths, which `pipeline.modeling.save_model` records and `load_model` rebuilds.
"""

from __future__ import annotations

import torch
from torch import nn

from pipeline.modeling import Intermediate, ScaledIntermediate, encoder_layers, ffn_widths, head_counts


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
    new_fc1 = nn.Linear(fc1.in_features, int(keep.sum()), dtype=fc1.weight.dtype)
    new_fc2 = nn.Linear(int(keep.sum()), fc2.out_features, dtype=fc2.weight.dtype)
    new_fc1.weight.copy_(fc1.weight[keep])
    new_fc1.bias.copy_(fc1.bias[keep])
    new_fc2.weight.copy_(fc2.weight[:, keep])
    new_fc2.bias.copy_(fc2.bias)
    layer.intermediate.dense, layer.output.dense = new_fc1, new_fc2
    return int((~keep).sum())


def compact_(model: nn.Module) -> dict:
    """Compact `model` in place and report what changed per layer."""
    before = ffn_widths(model)
    folded, removed = [], []
    for i, layer in enumerate(encoder_layers(model)):
        if fold_scale_(layer):
            folded.append(i)
        removed.append(drop_dead_neurons_(layer))
    return {
        "folded_scale_layers": folded,
        "ffn_widths_before": before,
        "ffn_widths": ffn_widths(model),
        "removed_ffn_neurons": removed,
        "heads": head_counts(model),
    }

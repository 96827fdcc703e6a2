"""MPNet: BERT-like post-norm blocks (`attention.attn.q/k/v/o`) plus one relative position bias table, shared by all
layers, with a column per head. A layer that loses heads must read only its own heads' columns: it gets
a self-attention subclass whose `kept_heads` buffer (saved with the weights) indexes the shared bias."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from pipeline.models.families.base import Family, Matrix

if TYPE_CHECKING:
    import torch
    from torch import nn


@functools.cache
def _selected_heads_attention() -> type:
    """MPNet self-attention over a subset of the heads it was built with, `kept_heads` (indices into the bias)."""
    import inspect

    from transformers.models.mpnet.modeling_mpnet import MPNetSelfAttention

    # 4.x takes (hidden_states, attention_mask, head_mask, position_bias, ...), 5.x drops head_mask: the bias is
    # found by name in whichever signature is installed
    signature = inspect.signature(MPNetSelfAttention.forward)

    class SelectedHeadsAttention(MPNetSelfAttention):
        kept_heads: torch.Tensor

        def forward(self, *args, **kwargs):
            bound = signature.bind(self, *args, **kwargs)
            bias = bound.arguments.get("position_bias")
            if bias is not None:
                bound.arguments["position_bias"] = bias.index_select(1, self.kept_heads)
            return super().forward(*bound.args[1:], **bound.kwargs)

    return SelectedHeadsAttention


def _select(att: nn.Module, kept: torch.Tensor) -> None:
    att.__class__ = _selected_heads_attention()
    if "kept_heads" in att._buffers:
        att.kept_heads = kept
    else:
        att.register_buffer("kept_heads", kept)


class MPNet(Family):
    name = "mpnet"
    model_types = ("mpnet",)
    titles = ("MPNet",)
    # the default fuses; the relative position bias's Add sits between attention's matmuls
    positions_after_pad = ("mpnet",)
    layers_path = "encoder.layer"
    attention = "attention"
    attention_norm = "LayerNorm"
    counts = "attention.attn"
    head_readers = (
        Matrix("attention.attn.q", "query"),
        Matrix("attention.attn.k", "key"),
        Matrix("attention.attn.v", "value"),
    )
    head_writer = Matrix("attention.attn.o", "attn_out")
    value = (head_readers[2], 0)
    ffn_readers = (Matrix("intermediate.dense", "ffn_in"),)
    ffn_writer = Matrix("output.dense", "ffn_out")
    activation = "intermediate.intermediate_act_fn"
    token_types = False
    narrows_from_teacher = False  # every layer reads one position-bias table, a column per head

    def config(self, model_type: str, layers: int, heads: int, hidden: int, ffn: int, **fields: Any) -> Any:
        return super().config(model_type, layers, heads, hidden, ffn, **{"pad_token_id": 0, **fields})

    def heads_kept_(self, block: nn.Module, keep: torch.Tensor) -> None:
        import torch

        att = block.attention.attn
        before = getattr(att, "kept_heads", None)
        index = torch.arange(keep.numel(), device=keep.device) if before is None else before
        _select(att, index[keep.to(index.device)].clone())

    def prepare_load_(self, block: nn.Module, prefix: str, state: dict[str, torch.Tensor]) -> None:
        kept = state.get(f"{prefix}.{self.counts}.kept_heads")
        if kept is not None:
            _select(block.attention.attn, kept.new_zeros(kept.shape))

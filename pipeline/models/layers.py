"""Encoder layers at per-layer shapes: FFNs with a constant output scale, attention without heads, resizing.

transformers builds every layer from one `intermediate_size` and one `num_attention_heads`; these pieces let a
layer differ. Parameter names stay those of transformers' BERT/RoBERTa modules, so state dicts stay
recognisable and load strictly. `prune_heads` is not used (transformers v5 removes it).
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from pipeline.errors import PipelineError


class Intermediate(nn.Module):
    """`act(x W1ᵀ + b1)`, with the same parameter names as transformers' BertIntermediate/RobertaIntermediate."""

    def __init__(self, dense: nn.Linear, act: nn.Module) -> None:
        super().__init__()
        self.dense = dense
        self.intermediate_act_fn = act

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.intermediate_act_fn(self.dense(hidden_states))


class ScaledIntermediate(Intermediate):
    """`act(x W1ᵀ + b1) * scale`: FFN neurons that carry a constant output multiplier (a buffer, not trained).

    MLP Fusion keeps its cluster sizes P here, apart from W2, so that training has the standalone-P
    dynamics; compaction later folds `scale` into the next linear layer.
    """

    def __init__(self, dense: nn.Linear, act: nn.Module, scale: torch.Tensor) -> None:
        super().__init__(dense, act)
        self.register_buffer("scale", scale.to(dense.weight.dtype))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return super().forward(hidden_states) * self.scale


class _Bias(nn.Module):
    """Only a `bias`: what is left of the attention output projection when there is no head to project."""

    def __init__(self, bias: torch.Tensor) -> None:
        super().__init__()
        self.bias = nn.Parameter(bias)


class _HeadlessOutput(nn.Module):
    def __init__(self, bias: torch.Tensor, layer_norm: nn.LayerNorm, dropout: nn.Module) -> None:
        super().__init__()
        self.dense = _Bias(bias)
        self.LayerNorm = layer_norm
        self.dropout = dropout


class HeadlessAttention(nn.Module):
    """The attention block of a layer with no head left: `LayerNorm(b_O + hidden_states)`, exactly.

    With 0 heads the context is empty, so the output projection emits only its bias; the residual and
    LayerNorm remain. Replaces a whole BertAttention/RobertaAttention and keeps its parameter names
    (`output.dense.bias`, `output.LayerNorm.*`), so state dicts stay recognisable.
    """

    num_attention_heads = 0

    def __init__(self, bias: torch.Tensor, layer_norm: nn.LayerNorm, dropout: nn.Module) -> None:
        super().__init__()
        self.output = _HeadlessOutput(bias, layer_norm, dropout)

    @classmethod
    def replacing(cls, attention: nn.Module) -> HeadlessAttention:
        """Built from a BertAttention/RobertaAttention whose output bias already holds all folded constants."""
        out = attention.output
        return cls(out.dense.bias.detach().clone(), out.LayerNorm, out.dropout)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        head_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        past_key_values=None,
        output_attentions: bool | None = False,
        cache_position: torch.Tensor | None = None,
        **kwargs,  # whatever else a transformers version passes to BertAttention: nothing here depends on it
    ) -> tuple[torch.Tensor] | tuple[torch.Tensor, None]:
        bias = self.output.dense.bias
        if self.training:  # drop each element independently, as BertSelfOutput's dropout does per token
            bias = self.output.dropout(bias.expand_as(hidden_states))
        out = self.output.LayerNorm(hidden_states + bias)  # in eval a plain broadcast Add: no Expand in ONNX
        return (out, None) if output_attentions else (out,)  # BertEncoder reads [1] only if attentions are asked


def new_linear(
    in_features: int, out_features: int, dtype: torch.dtype = torch.float32, bias: bool = True
) -> nn.Linear:
    """A zero-filled Linear whose weights are copied or loaded next (no random init; zero widths are legal)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Initializing zero-element tensors")
        lin = nn.utils.skip_init(nn.Linear, in_features, out_features, bias=bias, dtype=dtype)
    with torch.no_grad():
        for p in lin.parameters():
            p.zero_()  # never leave uninitialised memory behind, even where the caller copies only part
    return lin


def encoder_layers(model: nn.Module) -> nn.ModuleList:
    """The transformer blocks of a BERT/RoBERTa model (with or without a task head)."""
    base = getattr(model, "base_model", model)
    try:
        return base.encoder.layer
    except AttributeError:
        raise PipelineError(f"{type(model).__name__} is not a BERT/RoBERTa encoder") from None


def ffn_widths(model: nn.Module) -> list[int]:
    return [layer.intermediate.dense.out_features for layer in encoder_layers(model)]


def head_counts(model: nn.Module) -> list[int]:
    """Heads per layer (0 for a HeadlessAttention layer)."""
    return [layer_heads(layer) for layer in encoder_layers(model)]


def layer_heads(layer: nn.Module) -> int:
    att = layer.attention
    return 0 if isinstance(att, HeadlessAttention) else att.self.num_attention_heads


def resize_ffn_(layer: nn.Module, width: int) -> None:
    """Replace a block's FFN linears by uninitialised ones of `width` neurons (weights are loaded next)."""
    fc1, fc2 = layer.intermediate.dense, layer.output.dense
    layer.intermediate.dense = new_linear(fc1.in_features, width, fc1.weight.dtype)
    layer.output.dense = new_linear(width, fc2.out_features, fc2.weight.dtype)


def resize_heads_(layer: nn.Module, heads: int) -> None:
    """Replace a block's attention projections by ones for `heads` heads of the same head size.

    `heads=0` installs HeadlessAttention. Either way the parameters are placeholders: weights are loaded next.
    """
    if heads == 0:
        layer.attention = HeadlessAttention.replacing(layer.attention)
        return
    att = layer.attention.self
    hidden, head_size = att.query.in_features, att.attention_head_size
    for name in ("query", "key", "value"):
        setattr(att, name, new_linear(hidden, heads * head_size, att.query.weight.dtype))
    out = layer.attention.output.dense
    layer.attention.output.dense = new_linear(heads * head_size, out.out_features, out.weight.dtype)
    att.num_attention_heads, att.all_head_size = heads, heads * head_size

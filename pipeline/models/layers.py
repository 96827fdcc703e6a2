"""Encoder blocks at per-layer shapes, for every family: cutting heads and neurons, resizing, scaled and headless.

transformers builds every layer from one `intermediate_size` and one head count; these pieces let a layer differ.
Where a block keeps its units is the family adapter's business (`pipeline.models.families`); what is done to them
is written once here. Parameter names stay those of transformers' modules, so state dicts stay recognisable and
load strictly. transformers' `prune_heads` is not used (it knows no per-layer FFN, no fused QKV, and v5 removes it).
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

from export.releases import transformers_5
from pipeline.models.families import Family, family_of


class ScaledLinear(nn.Linear):
    """`(x * scale) Wᵀ + b`: an FFN output layer whose input neurons carry a constant multiplier (a buffer).

    MLP Fusion keeps its cluster sizes P here, apart from W2, so that training has the standalone-P dynamics;
    compaction later folds `scale` into W2 (`fold_scale_`).
    """

    def __init__(self, linear: nn.Linear, scale: torch.Tensor) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.register_buffer("scale", scale.to(linear.weight.dtype).to(linear.weight.device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x * self.scale, self.weight, self.bias)

    @torch.no_grad()
    def folded(self) -> nn.Linear:
        """The same map as a plain Linear: `W[:, j] *= scale_j`, in place (the same Parameters, no scale)."""
        self.weight.mul_(self.scale.to(self.weight.dtype)[None, :])
        plain = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        plain.weight, plain.bias = self.weight, self.bias
        return plain


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


def _place(root: nn.Module, path: str, module: nn.Module) -> None:
    """Put `module` at the dotted `path` below `root`, creating plain containers on the way."""
    *parents, leaf = path.split(".")
    for name in parents:
        if not hasattr(root, name):
            root.add_module(name, nn.Module())
        root = getattr(root, name)
    root.add_module(leaf, module)


class _Bias(nn.Module):
    """Only a `bias`: what is left of the attention output projection when there is no head to project."""

    def __init__(self, bias: torch.Tensor) -> None:
        super().__init__()
        self.bias = nn.Parameter(bias)


class HeadlessAttention(nn.Module):
    """The attention of a layer with no head left: its output projection's bias, and where the family's attention
    module adds the residual and normalises (BERT, DeBERTa, MPNet), `LayerNorm(b_O + hidden_states)`, exactly.

    With 0 heads the context is empty, so the output projection emits only its bias. The kept parameters keep
    their names (e.g. `output.dense.bias`, `output.LayerNorm.*`), so state dicts stay recognisable.
    """

    headless = True

    def __init__(self, family: Family, attention: nn.Module) -> None:
        super().__init__()
        prefix = family.attention + "."
        writer = attention.get_submodule(family.head_writer.path.removeprefix(prefix))
        hidden = writer.out_features
        self.always_pair = family.always_pair or transformers_5()  # 5.x's blocks unpack (output, weights)
        self.bias_path = family.head_writer.path.removeprefix(prefix)
        if writer.bias is not None:
            _place(self, self.bias_path, _Bias(writer.bias.detach().clone()))
        else:  # no biases (ModernBERT): the attention adds nothing
            self.register_buffer("zero", torch.zeros(hidden, dtype=writer.weight.dtype), persistent=False)
        self.norm_path = family.attention_norm
        self.dropout = None
        if self.norm_path:
            _place(self, self.norm_path, attention.get_submodule(self.norm_path))
            parent = attention.get_submodule(self.norm_path.rpartition(".")[0])  # "" is the module itself
            self.dropout = getattr(parent, "dropout", None)

    def forward(self, *args, **kwargs) -> tuple[torch.Tensor] | tuple[torch.Tensor, None]:
        # blocks pass their input positionally, as `hidden_states`, or (DistilBERT) as `query`
        hidden = args[0] if args else kwargs.get("hidden_states", kwargs.get("query"))
        bias = self.zero if hasattr(self, "zero") else self.get_submodule(self.bias_path).bias
        if self.norm_path:
            if self.training and self.dropout is not None:  # drop per element, as the self-output's dropout does
                bias = self.dropout(bias.expand_as(hidden))
            out = self.get_submodule(self.norm_path)(hidden + bias)  # in eval a plain broadcast Add: no Expand
        else:
            out = bias  # the block adds the residual itself
        return (out, None) if self.always_pair or kwargs.get("output_attentions") else (out,)


# --- per-layer shapes -----------------------------------------------------------------------------------------


def encoder_layers(model: nn.Module) -> nn.ModuleList:
    """The transformer blocks of a model of a supported family (with or without a task head)."""
    return family_of(model).layers(model)


def set_activation_(model: nn.Module, name: str) -> None:
    """Every encoder layer's FFN activation made `name` (a transformers activation, e.g. `relu`; a gated FFN keeps
    its gate: act(x W_in) * (x W_gate)), and written in the config, so the saved model reloads with it."""
    from transformers.activations import ACT2FN

    family = family_of(model)
    for block in encoder_layers(model):
        _place(block, family.activation, ACT2FN[name])
    setattr(model.config, family.activation_field, name)


def ffn_widths(model: nn.Module) -> list[int]:
    family = family_of(model)
    return [block.get_submodule(family.ffn_writer.path).in_features for block in family.layers(model)]


def head_counts(model: nn.Module) -> list[int]:
    """Heads per layer (0 for a HeadlessAttention layer)."""
    family = family_of(model)
    return [family.heads(block) for block in family.layers(model)]


def head_readers(family: Family, block: nn.Module):
    """The family's head-reading matrices this block has (DeBERTa's position projections are optional)."""
    names = {name for name, _ in block.named_modules()}
    return [m for m in family.head_readers if m.path in names]


@torch.no_grad()
def _cut(linear: nn.Linear, rows: torch.Tensor | None = None, cols: torch.Tensor | None = None) -> nn.Linear:
    """A new Linear holding copies of the kept `rows` (outputs) and `cols` (inputs) of `linear`."""
    w = linear.weight if rows is None else linear.weight[rows]
    w = w if cols is None else w[:, cols]
    out = new_linear(w.shape[1], w.shape[0], w.dtype, bias=linear.bias is not None).to(w.device)
    out.weight.copy_(w)
    if linear.bias is not None:
        out.bias.copy_(linear.bias if rows is None else linear.bias[rows])
    if isinstance(linear, ScaledLinear):
        out = ScaledLinear(out, linear.scale if cols is None else linear.scale[cols])
    return out


def keep_heads_(family: Family, block: nn.Module, keep: torch.Tensor) -> None:
    """Cut the block's attention to the heads `keep` (a bool per head); none kept installs HeadlessAttention."""
    if keep.all():
        return
    if not keep.any():
        block.set_submodule(family.attention, HeadlessAttention(family, block.get_submodule(family.attention)))
        return
    d = family.head_size(block)
    for m in head_readers(family, block):
        rows = keep.repeat_interleave(d).repeat(m.segments)
        block.set_submodule(m.path, _cut(block.get_submodule(m.path), rows=rows))
    writer = family.head_writer.path
    block.set_submodule(writer, _cut(block.get_submodule(writer), cols=keep.repeat_interleave(d)))
    family.heads_kept_(block, keep)
    family.set_heads_(block, int(keep.sum()))


def keep_neurons_(family: Family, block: nn.Module, keep: torch.Tensor) -> None:
    """Cut the block's FFN to the neurons `keep` (a bool per neuron; a gated FFN's pair of input rows each)."""
    if keep.all():
        return
    for m in family.ffn_readers:
        block.set_submodule(m.path, _cut(block.get_submodule(m.path), rows=keep.repeat(m.segments)))
    writer = family.ffn_writer.path
    block.set_submodule(writer, _cut(block.get_submodule(writer), cols=keep))


def resize_heads_(family: Family, block: nn.Module, heads: int) -> None:
    """Placeholder attention matrices for `heads` heads of the same size (weights are loaded next); 0 heads
    installs HeadlessAttention."""
    if heads == 0:
        block.set_submodule(family.attention, HeadlessAttention(family, block.get_submodule(family.attention)))
        return
    d = family.head_size(block)
    for m in head_readers(family, block):
        old = block.get_submodule(m.path)
        block.set_submodule(m.path, _resized(old, out_features=heads * d * m.segments))
    old = block.get_submodule(family.head_writer.path)
    block.set_submodule(family.head_writer.path, _resized(old, in_features=heads * d))
    family.set_heads_(block, heads)


def resize_ffn_(family: Family, block: nn.Module, width: int) -> None:
    """Placeholder FFN matrices of `width` neurons (weights are loaded next)."""
    for m in family.ffn_readers:
        block.set_submodule(m.path, _resized(block.get_submodule(m.path), out_features=width * m.segments))
    old = block.get_submodule(family.ffn_writer.path)
    block.set_submodule(family.ffn_writer.path, _resized(old, in_features=width))


def _resized(old: nn.Linear, in_features: int | None = None, out_features: int | None = None) -> nn.Linear:
    return new_linear(
        in_features if in_features is not None else old.in_features,
        out_features if out_features is not None else old.out_features,
        old.weight.dtype,
        bias=old.bias is not None,
    )


def neuron_constants(family: Family, block: nn.Module, which: torch.Tensor) -> torch.Tensor:
    """What the neurons `which` emit when their input rows are all zero: act(b1), or act(b_in) * b_gate gated."""
    (m,) = family.ffn_readers
    fc1 = block.get_submodule(m.path)
    bias = fc1.bias if fc1.bias is not None else fc1.weight.new_zeros(fc1.out_features)
    act = family.act(block)
    if family.gated:
        b_in, b_gate = bias.chunk(2)
        return act(b_in[which]) * b_gate[which]
    return act(bias[which])

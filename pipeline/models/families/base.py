"""What the pipeline knows about one model family: where a block keeps its heads and FFN neurons.

A head is a slice of rows of every matrix that reads it (Q, K, V, and DeBERTa's position projections) and a slice
of columns of the matrix that writes it (W_O); an FFN neuron is a row of each input matrix and a column of the
output matrix. Fused matrices repeat the units in row blocks (`segments`): ModernBERT's `Wqkv` holds Q, K and V,
its gated `Wi` the up-projection and the gate. With that written down once per family, masking, compaction,
cutting, MLP Fusion and the per-layer loader are the same code for every family (`pipeline.models.layers`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the adapters import no torch themselves: the CLI lists families without it
    import torch
    from torch import nn


@dataclass(frozen=True)
class Matrix:
    """An `nn.Linear` inside a block and how units sit in it."""

    path: str  # below the block, e.g. "attention.self.query"
    kind: str  # what per-type allocation pools it with: query, key, value, attn_out, ffn_in, ffn_out, ...
    segments: int = 1  # row blocks that each hold every unit once: 3 in a fused QKV, 2 in a gated FFN input


@dataclass(frozen=True)
class Arch:
    """A model's uniform shape, read from its `config.json` whatever the family calls the fields."""

    layers: int
    heads: int
    hidden: int
    ffn: int
    head_dim: int
    vocab: int
    gated: bool = False  # three FFN matrices (up, gate, down) instead of two


class Family:
    """One adapter per architecture; subclasses fill in the paths and override what differs."""

    name: str
    model_types: tuple[str, ...]
    layers_path: str  # the ModuleList of blocks, below `base_model`
    attention: str  # the module a layer with no head left replaces (`HeadlessAttention`)
    attention_norm: str | None = None  # inside `attention`: the residual LayerNorm, where the module applies it
    always_pair: bool = False  # on 4.x, the attention returns (output, weights) even when weights are not asked
    counts: str  # the module that holds the head count attributes
    head_readers: tuple[Matrix, ...]
    head_writer: Matrix
    value: tuple[Matrix, int]  # the reader and segment that hold V (a head with V = 0 outputs its bias)
    ffn_readers: tuple[Matrix, ...]
    ffn_writer: Matrix
    activation: str  # the FFN's activation module
    activation_field: str = "hidden_act"  # the config field the FFN's activation is built from
    gated: bool = False  # FFN output act(x W_in) * (x W_gate): segment 0 of the reader is W_in, 1 is W_gate
    token_types: bool = True  # the model's forward takes token_type_ids
    runs_without_layers: bool = True  # a copy with no layer left still runs (the latency table's fixed-cost probe)
    narrows_from_teacher: bool = True  # a student of fewer heads a layer can be cut from it at a narrower hidden size
    titles: tuple[str, ...]  # how people write each of `model_types` (help texts, the README's list)
    # What ONNX Runtime's transformer optimizer does with this family's graphs: `ort_fusion` is the optimizer's
    # model type whose fuser matches them (None: ORT's own graph optimisations only), `ort_fuses` the fused ops a
    # graph of every model type of the family gets (tests/test_families.py checks both ways: attention is fused
    # exactly where it is named). Measured by `benchmarks/families.py`.
    ort_fusion: str | None = "bert"
    ort_fuses: tuple[str, ...] = ("SkipLayerNormalization", "BiasGelu")
    byte_level: tuple[str, ...] = ()  # model types with a byte-level BPE tokenizer: a word needs its leading space
    # model types whose checkpoints have a masked-LM head, by layout: `bert` (`cls.predictions`, BERT's pooler slot
    # free for the verbalizer's transform) or `roberta` (`lm_head`, the transform in the `classifier` slot)
    mlm_heads: tuple[tuple[str, str], ...] = ()
    positions_after_pad: tuple[str, ...] = ()  # model types whose position ids start after the pad id
    layers_field: str = "num_hidden_layers"
    ffn_field: str = "intermediate_size"  # the uniform width in its config (the widest layer once compacted)
    heads_field: str = "num_attention_heads"
    hidden_field: str = "hidden_size"

    # -- shapes ------------------------------------------------------------------------------------------------

    def arch(self, config: dict[str, Any]) -> Arch:
        heads, hidden = config["num_attention_heads"], config["hidden_size"]
        return Arch(
            layers=config["num_hidden_layers"],
            heads=heads,
            hidden=hidden,
            ffn=config["intermediate_size"],
            head_dim=config.get("attention_head_size") or hidden // heads,
            vocab=config["vocab_size"],
            gated=self.gated,
        )

    def config(self, model_type: str, layers: int, heads: int, hidden: int, ffn: int, **fields: Any) -> Any:
        """A transformers config of this family at a shape (for random models: tests, speed probes)."""
        from transformers import AutoConfig

        shape = dict(num_hidden_layers=layers, num_attention_heads=heads, hidden_size=hidden, intermediate_size=ffn)
        return AutoConfig.for_model(model_type, **shape, **fields)

    def layers(self, model: nn.Module) -> nn.ModuleList:
        return getattr(model, "base_model", model).get_submodule(self.layers_path)

    def set_layers_(self, model: nn.Module, blocks: list[nn.Module]) -> None:
        from torch import nn

        getattr(model, "base_model", model).set_submodule(self.layers_path, nn.ModuleList(blocks))
        setattr(model.config, self.layers_field, len(blocks))

    def head_size(self, block: nn.Module) -> int:
        return block.get_submodule(self.counts).attention_head_size

    def heads(self, block: nn.Module) -> int:
        """The block's head count (0 once its attention is `HeadlessAttention`)."""
        att = block.get_submodule(self.attention)
        return 0 if getattr(att, "headless", False) else self._count(block.get_submodule(self.counts))

    def _count(self, counts: nn.Module) -> int:
        return counts.num_attention_heads

    def set_heads_(self, block: nn.Module, n: int) -> None:
        """The attributes that size the attention, once its matrices hold `n` heads."""
        counts = block.get_submodule(self.counts)
        counts.num_attention_heads = n
        counts.all_head_size = n * counts.attention_head_size

    def heads_kept_(self, block: nn.Module, keep: torch.Tensor) -> None:
        """What else follows when the heads `keep` (a bool per head) are all that stay (MPNet: its bias columns)."""

    def prepare_load_(self, block: nn.Module, prefix: str, state: dict[str, torch.Tensor]) -> None:
        """Make room for what a saved block holds beyond its matrices (MPNet: which shared bias heads it reads)."""

    # -- what a neuron does ------------------------------------------------------------------------------------

    def act(self, block: nn.Module) -> nn.Module:
        return block.get_submodule(self.activation)

    def qkv(self, block: nn.Module, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The block's Q, K and V for its input `hidden` ([batch, seq, heads × head size] each)."""
        q, k, v = (block.get_submodule(m.path)(hidden) for m in self.head_readers[:3])
        return q, k, v

    # -- what a saved model must record beyond widths and heads ------------------------------------------------

    def layer_record(self, model: nn.Module) -> dict[str, list]:
        """Per-layer facts a rebuilt model needs that its config cannot say (fields added to `config.json`)."""
        return {}

    def rebuild_(self, model: nn.Module) -> None:
        """Apply `layer_record`'s fields (in `model.config`) to a freshly built model."""

    def mlm_head(self, model_type: str) -> str | None:
        """The masked-LM head layout of `model_type`'s checkpoints (`bert`, `roberta`), None when it has none the
        verbalizer can start from."""
        return dict(self.mlm_heads).get(model_type)

    def usable_positions(self, config: dict[str, Any]) -> int | None:
        """Tokens the position embeddings of a model with this `config.json` cover (None: the config does not
        say): RoBERTa-style models and MPNet count their positions after the pad id."""
        n = config.get("max_position_embeddings")
        if n is not None and config.get("model_type") in self.positions_after_pad:
            n -= (config.get("pad_token_id") or 1) + 1
        return n

    def check(self, config: dict[str, Any]) -> str | None:
        """Why this family cannot take a model with this config (None: it can)."""
        return None

    def shape_problem(self, config: dict[str, Any]) -> str | None:
        """Why a `config.json`'s shape cannot build a model (None: it can): a count that is missing, not a positive
        integer (the FFN width may be 0), or heads that do not divide the hidden size (unless the config gives the
        head size). Transformers would build a 0-layer model, or fail in a reshape, long after a run started."""
        for key in (self.layers_field, self.heads_field, self.hidden_field, self.ffn_field):
            if key not in config:
                return f"config.json has no {key}"
            least = 0 if key == self.ffn_field else 1  # a compacted model's layers may all have lost their FFNs
            if type(config[key]) is not int or config[key] < least:
                wanted = "a positive integer" if least else "an integer, 0 or more"
                return f"config.json's {key} must be {wanted}, not {config[key]!r}"[:300]
        heads, hidden = config[self.heads_field], config[self.hidden_field]
        if not config.get("attention_head_size") and hidden % heads:
            return f"config.json's {self.heads_field} {heads} does not divide its {self.hidden_field} {hidden}"
        return None

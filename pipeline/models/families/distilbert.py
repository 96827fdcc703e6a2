"""DistilBERT: `q_lin`/`k_lin`/`v_lin`/`out_lin`, an `ffn` of `lin1`/`lin2`, and the residual LayerNorms in the
block; its config names the shape `n_layers`, `n_heads`, `dim`, `hidden_dim`, and it takes no token type ids."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline.models.families.base import Arch, Family, Matrix

if TYPE_CHECKING:
    from torch import nn


class DistilBert(Family):
    name = "distilbert"
    model_types = ("distilbert",)
    titles = ("DistilBERT",)
    ort_fuses = ("EmbedLayerNormalization", "Attention", "SkipLayerNormalization", "BiasGelu")
    layers_path = "transformer.layer"
    attention = "attention"
    counts = "attention"
    head_readers = (
        Matrix("attention.q_lin", "query"),
        Matrix("attention.k_lin", "key"),
        Matrix("attention.v_lin", "value"),
    )
    head_writer = Matrix("attention.out_lin", "attn_out")
    value = (head_readers[2], 0)
    ffn_readers = (Matrix("ffn.lin1", "ffn_in"),)
    ffn_writer = Matrix("ffn.lin2", "ffn_out")
    activation = "ffn.activation"
    activation_field = "activation"
    token_types = False
    layers_field = "n_layers"
    ffn_field = "hidden_dim"
    heads_field = "n_heads"
    hidden_field = "dim"

    def config(self, model_type: str, layers: int, heads: int, hidden: int, ffn: int, **fields: Any) -> Any:
        from transformers import DistilBertConfig

        return DistilBertConfig(n_layers=layers, n_heads=heads, dim=hidden, hidden_dim=ffn, **fields)

    def arch(self, config: dict[str, Any]) -> Arch:
        return Arch(
            layers=config["n_layers"],
            heads=config["n_heads"],
            hidden=config["dim"],
            ffn=config["hidden_dim"],
            head_dim=config["dim"] // config["n_heads"],
            vocab=config["vocab_size"],
        )

    def _count(self, counts: nn.Module) -> int:
        return counts.n_heads

    def set_heads_(self, block: nn.Module, n: int) -> None:
        att = block.attention
        att.n_heads = n
        att.dim = att.n_heads * att.attention_head_size  # its forward derives the head size as dim // n_heads

"""BERT, RoBERTa and XLM-RoBERTa: separate Q/K/V, post-norm blocks whose attention module adds the residual."""

from __future__ import annotations

from typing import Any

from pipeline.models.families.base import Family, Matrix


class Bert(Family):
    name = "bert"
    model_types = ("bert", "roberta", "xlm-roberta")
    titles = ("BERT", "RoBERTa", "XLM-RoBERTa")
    ort_fuses = ("Attention", "SkipLayerNormalization", "BiasGelu")
    byte_level = ("roberta", "xlm-roberta")
    mlm_heads = (("bert", "bert"), ("roberta", "roberta"), ("xlm-roberta", "roberta"))
    positions_after_pad = ("roberta", "xlm-roberta")
    layers_path = "encoder.layer"
    attention = "attention"
    attention_norm = "output.LayerNorm"
    counts = "attention.self"
    head_readers = (
        Matrix("attention.self.query", "query"),
        Matrix("attention.self.key", "key"),
        Matrix("attention.self.value", "value"),
    )
    head_writer = Matrix("attention.output.dense", "attn_out")
    value = (head_readers[2], 0)
    ffn_readers = (Matrix("intermediate.dense", "ffn_in"),)
    ffn_writer = Matrix("output.dense", "ffn_out")
    activation = "intermediate.intermediate_act_fn"

    def config(self, model_type: str, layers: int, heads: int, hidden: int, ffn: int, **fields: Any) -> Any:
        if model_type in ("roberta", "xlm-roberta"):  # position ids start after the padding id; one token type
            fields = {"pad_token_id": 1, "type_vocab_size": 1, **fields}
        return super().config(model_type, layers, heads, hidden, ffn, **fields)

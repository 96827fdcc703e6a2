"""BERT, RoBERTa and XLM-RoBERTa: separate Q/K/V, post-norm blocks whose attention module adds the residual."""

from __future__ import annotations

from pipeline.models.families.base import Family, Matrix


class Bert(Family):
    name = "bert"
    model_types = ("bert", "roberta", "xlm-roberta")
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
    value = ("attention.self.value", 0)
    ffn_readers = (Matrix("intermediate.dense", "ffn_in"),)
    ffn_writer = Matrix("output.dense", "ffn_out")
    activation = "intermediate.intermediate_act_fn"

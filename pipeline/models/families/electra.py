"""ELECTRA discriminators: BERT's blocks (its own embedding projection and classification head around them)."""

from __future__ import annotations

from pipeline.models.families.bert import Bert


class Electra(Bert):
    name = "electra"
    model_types = ("electra",)
    titles = ("ELECTRA",)
    ort_fuses = ("EmbedLayerNormalization", "Attention", "SkipLayerNormalization", "BiasGelu")
    byte_level = mlm_heads = positions_after_pad = ()  # a discriminator: WordPiece, no masked-LM head

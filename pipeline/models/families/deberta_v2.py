"""DeBERTa-v2 and v3: BERT's block layout with disentangled attention. A head also owns its rows of the position
projections (`pos_key_proj`/`pos_query_proj` where keys are not shared; with `share_att_key` the Q/K rows serve the
positions too), so cutting a head cuts them alike; the relative position embeddings are shared by all layers."""

from __future__ import annotations

from typing import Any

from pipeline.models.families.base import Matrix
from pipeline.models.families.bert import Bert


class DebertaV2(Bert):
    """BERT's block layout (paths, FFN, residual LayerNorm), its own Q/K/V names and position projections."""

    name = "deberta-v2"
    model_types = ("deberta-v2",)
    titles = ("DeBERTa-v2/v3",)
    ort_fuses = ("SkipLayerNormalization", "BiasGelu")  # the disentangled scores sit between attention's matmuls
    byte_level = mlm_heads = positions_after_pad = ()  # SentencePiece; relative positions
    always_pair = True
    runs_without_layers = False  # transformers' DeBERTa-v2 encoder fails on an empty layer list
    head_readers = (
        Matrix("attention.self.query_proj", "query"),
        Matrix("attention.self.key_proj", "key"),
        Matrix("attention.self.value_proj", "value"),
        Matrix("attention.self.pos_key_proj", "pos_key"),  # present only without share_att_key
        Matrix("attention.self.pos_query_proj", "pos_query"),
    )
    value = (head_readers[2], 0)

    def config(self, model_type: str, layers: int, heads: int, hidden: int, ffn: int, **fields: Any) -> Any:
        v3 = dict(relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=256, share_att_key=True)
        v3 |= dict(type_vocab_size=0, norm_rel_ebd="layer_norm", max_relative_positions=-1)  # DeBERTa-v3's layout
        return super().config(model_type, layers, heads, hidden, ffn, **{**v3, **fields})

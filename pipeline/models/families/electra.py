"""ELECTRA discriminators: BERT's blocks (its own embedding projection and classification head around them)."""

from __future__ import annotations

from pipeline.models.families.bert import Bert


class Electra(Bert):
    name = "electra"
    model_types = ("electra",)

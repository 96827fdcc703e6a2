"""What a sentence-embedding model returns (torch): the kind's rows are its `sentence_embedding`; kept apart from
the kind so that reading and scoring embedding data imports no torch."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.utils import ModelOutput


@dataclass
class EmbeddingOutput(ModelOutput):
    """`sentence_embedding` (B, D): pooled, normalised; `last_hidden_state` (B, T, D): every token, projected."""

    sentence_embedding: torch.Tensor | None = None
    last_hidden_state: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None

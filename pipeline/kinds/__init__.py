"""The task kinds the pipeline trains, one adapter each, looked up by the name a task and an artifact carry.

Adding a kind is one module beside these (a `Kind` subclass), a line in `KINDS`, and its server half
(`serving/kinds/`); `tests/test_kinds.py` then checks that every kind answers for every part of the adapter.
"""

from __future__ import annotations

from pipeline.errors import PipelineError
from pipeline.kinds.base import Encoded, Kind
from pipeline.kinds.embedding import SentenceEmbedding
from pipeline.kinds.question_answering import QuestionAnswering
from pipeline.kinds.sequence import SequenceClassification
from pipeline.kinds.token import TokenClassification

KINDS: tuple[Kind, ...] = (SequenceClassification(), TokenClassification(), QuestionAnswering(), SentenceEmbedding())
BY_NAME = {k.name: k for k in KINDS}
KIND_NAMES = tuple(BY_NAME)

__all__ = ["BY_NAME", "KINDS", "KIND_NAMES", "Encoded", "Kind", "kind_of"]


def kind_of(name: str) -> Kind:
    """The adapter of the kind called `name`, or a one-line refusal naming the known ones."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise PipelineError(f"unknown task kind {name!r}; known kinds: {', '.join(KIND_NAMES)}") from None

"""The task kinds the server answers, one adapter each, looked up by the name the artifact's task block carries.

A kind's pipeline half is `pipeline/kinds/`; this is its server half (request parsing, the v2 outputs, decoding).
The server imports nothing of the pipeline, so the two halves meet only in the artifact contract's names.
"""

from __future__ import annotations

from serving.artifact import ArtifactError
from serving.kinds.base import ServedKind
from serving.kinds.embedding import ServedEmbedding
from serving.kinds.question_answering import ServedQuestionAnswering
from serving.kinds.sequence import ServedSequence
from serving.kinds.token import ServedToken

SERVED: tuple[ServedKind, ...] = (ServedSequence(), ServedToken(), ServedQuestionAnswering(), ServedEmbedding())
BY_NAME = {k.name: k for k in SERVED}

__all__ = ["BY_NAME", "SERVED", "ServedKind", "served_kind"]


def served_kind(name: str) -> ServedKind:
    """The adapter of the kind an artifact names; an artifact of a kind this server does not know is refused."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise ArtifactError(f"task kind {name!r} is not served (known: {', '.join(BY_NAME)})") from None

"""Unlabelled sentences that train a sentence-embedding student: the task's own training texts and a user's
`--corpus` (`pipeline.data.corpus`) one after the other. Training distils the teacher's vectors, so no score or
label is needed; validation and dev stay the task's own scored splits."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from serving.artifact import EMBEDDING


@dataclass(frozen=True)
class SentenceSplit:
    """Texts only: one encoded feature each."""

    texts: list[str]
    kind: ClassVar[str] = EMBEDDING

    def __len__(self) -> int:
        return len(self.texts)

    def subset(self, idx: Sequence[int]) -> SentenceSplit:
        return SentenceSplit([self.texts[i] for i in idx])

    def head(self, n: int | None) -> SentenceSplit:
        return SentenceSplit(self.texts[:n])

    def digest(self, h) -> None:
        for text in self.texts:
            h.update(f"{text}\n".encode())
        h.update(b"\x1c")  # unlike a pair split's end mark: the same texts unpaired train alike but key apart

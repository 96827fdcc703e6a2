"""Scored sentence pairs for sentence embeddings (the STS benchmark): two texts and a similarity score per row, from
rows files (TSV as GLUE's STS-B ships, CSV, JSONL) or a Hugging Face split whose `label` is the score.

The score is any finite number (STS-B: 0-5); only its rank order is used (Spearman's correlation with the cosine
similarity of the two embeddings), so a user's pairs may be scored on any scale.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from pipeline.errors import PipelineError
from pipeline.kinds.base import Spec
from pipeline.kinds.records import ROW_FORMATS, describe, records
from serving.artifact import EMBEDDING


@dataclass(frozen=True)
class PairSplit:
    """Examples of one split: `pairs[i]` two texts, `scores[i]` how similar a person judged them."""

    pairs: list[tuple[str, str]]
    scores: list[float]
    kind: ClassVar[str] = EMBEDDING

    def __len__(self) -> int:
        return len(self.scores)

    def subset(self, idx: Sequence[int]) -> PairSplit:
        return PairSplit([self.pairs[i] for i in idx], [self.scores[i] for i in idx])

    def head(self, n: int | None) -> PairSplit:
        return PairSplit(self.pairs[:n], self.scores[:n])

    @property
    def texts(self) -> list[str]:
        """Every text in order, each pair's two side by side: what one encoded feature each is made of."""
        return [t for pair in self.pairs for t in pair]

    def digest(self, h) -> None:
        for (a, b), score in zip(self.pairs, self.scores, strict=True):
            h.update(f"{a}\x1f{b}\x1e{score!r}\n".encode())
        h.update(b"\x1d")


def score_of(raw, where: str) -> float:
    """A finite number from a file's or dataset's score field, else an error naming `where`."""
    value = None
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        value = float(raw)
    elif isinstance(raw, str):
        try:
            value = float(raw.strip())
        except ValueError:
            value = None
    if value is None or not math.isfinite(value):
        raise PipelineError(f"{where}: score is {describe(raw)}; expected a number")
    return value


def pair_rows(rows: Iterable[tuple[str, dict]], columns: tuple[str, str], score: str, source: object) -> PairSplit:
    """Pairs from (where, row) pairs whose rows hold the two text `columns` and the `score` field."""
    pairs, scores = [], []
    for where, row in rows:
        texts = []
        for c in columns:
            if not isinstance(row[c], str):
                raise PipelineError(f"{where}: column {c!r} is {describe(row[c])}; expected text")
            texts.append(row[c])
        pairs.append((texts[0], texts[1]))
        scores.append(score_of(row[score], where))
    if not pairs:
        raise PipelineError(f"{source}: no examples")
    return PairSplit(pairs, scores)


def read_pairs(spec: Spec, path: Path) -> PairSplit:
    """The scored pairs of one rows file (its format from its extension)."""
    fmt = ROW_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise PipelineError(f"{path}: unknown format {path.suffix!r}; scored-pair files are {', '.join(ROW_FORMATS)}")
    first, second = spec.text_columns
    rows = records(path, fmt, (first, second, spec.label_column))
    return pair_rows(((f"{path}:{n}", row) for n, row in rows), (first, second), spec.label_column, path)

"""JSONL data files: one JSON object per non-blank line, each checked for the fields the task reads."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.jsonfile import parse_json


def describe(value) -> str:
    """A value as an error names it: `missing (null)`, or its type and the start of its text."""
    return "missing (null)" if value is None else f"a {type(value).__name__} ({str(value)[:40]!r})"


def json_records(path: Path, lines: Iterable[str], fields: tuple[str, ...]) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line; a line that is not a JSON object, or lacks one of
    `fields`, is an error naming the file and the line."""
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        obj = parse_json(line, str(path), lineno)
        if not isinstance(obj, dict):
            raise PipelineError(f"{path}:{lineno}: expected a JSON object, got {describe(obj)}")
        missing = [c for c in fields if c not in obj]
        if missing:
            keys = ", ".join(list(obj)[:10])
            raise PipelineError(f"{path}:{lineno}: missing column(s) {', '.join(missing)}; the object has {keys}")
        yield lineno, obj

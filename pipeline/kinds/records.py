"""Data files of rows: TSV (GLUE: tabs, no quoting), CSV (quoted) and JSONL (one JSON object per non-blank line),
each row checked for the fields the task reads."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Iterator
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.jsonfile import parse_json
from pipeline.paths import read_utf8

ROW_FORMATS = {".tsv": "tsv", ".csv": "csv", ".jsonl": "jsonl"}  # a row file's format, from its extension


def describe(value) -> str:
    """A value as an error names it: `missing (null)`, or its type and the start of its text."""
    return "missing (null)" if value is None else f"a {type(value).__name__} ({str(value)[:40]!r})"


def nonblank_text(value, field: str) -> str:
    """A non-blank string, else an error naming `field` (the file and its place there)."""
    if not isinstance(value, str) or not value.strip():
        raise PipelineError(f"{field} is {'empty' if isinstance(value, str) else describe(value)}; expected text")
    return value


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


def records(path: Path, fmt: str, columns: tuple[str, ...]) -> Iterator[tuple[int, dict]]:
    """(line number, {column: value}) for each non-blank row; the columns are checked against the header (TSV,
    CSV) or each object (JSONL). utf-8-sig: GLUE ships MRPC with a byte-order mark, which would otherwise glue
    itself to the first column's name."""
    with io.StringIO(read_utf8(path, "data file"), newline="") as f:
        if fmt == "jsonl":
            yield from json_records(path, f, columns)
            return
        rows = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE) if fmt == "tsv" else csv.reader(f)
        header = next(rows, None)
        if header is None:
            raise PipelineError(f"{path}: file is empty")
        missing = [c for c in columns if c not in header]
        if missing:
            raise PipelineError(f"{path}: missing column(s) {', '.join(missing)}; header is {', '.join(header)}")
        cols = [header.index(c) for c in columns]
        sep = "tab-separated" if fmt == "tsv" else "comma-separated"
        for row in rows:
            if not row or row == [""]:
                continue
            if len(row) <= max(cols):
                raise PipelineError(f"{path}:{rows.line_num}: expected {len(header)} {sep} fields, got {len(row)}")
            yield rows.line_num, {c: row[i] for c, i in zip(columns, cols, strict=True)}

"""JSON from files a user gave (model configs, SQuAD files, JSONL lines): whatever the text, one line naming it.

`json.loads` raises more than `JSONDecodeError`: a RecursionError for arrays nested some thousands deep, and a
ValueError for an integer of more digits than Python converts. Each becomes a `PipelineError`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.errors import PipelineError


def parse_json(text: str, where: str, line: int | None = None) -> Any:
    """The JSON value of `text`, from the file `where` names (`line`: the line `text` is, for one-line records)."""
    if line is not None:
        where = f"{where}:{line}"
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        at = where if line is not None else f"{where}:{e.lineno}"
        raise PipelineError(f"{at}: not valid JSON ({e.msg})") from None
    except RecursionError:
        raise PipelineError(f"{where}: not valid JSON here (nested too deeply)") from None
    except ValueError as e:
        raise PipelineError(f"{where}: not valid JSON here ({str(e)[:200]})") from None


def read_json_object(path: Path) -> dict:
    """A file that must hold one JSON object."""
    where = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise PipelineError(f"{where}: not UTF-8 text (byte {e.start})") from None
    value = parse_json(text, where)
    if not isinstance(value, dict):
        kind = {list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean"}
        raise PipelineError(f"{where} must be a JSON object, not {kind.get(type(value), 'null')}")
    return value

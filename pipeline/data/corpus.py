"""Unlabelled text for general distillation: a folder of `.txt` files, one document or paragraph per line.

Read in file-name order, blank lines skipped, at most `max_lines` lines (the first ones: a corpus is not shuffled
here; training shuffles). Bad corpora fail in one line naming the problem: not a folder, no `.txt` file, a file
that is not UTF-8 (with its line), nothing but blank lines.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import PipelineError


@dataclass(frozen=True)
class Corpus:
    texts: list[str]
    files: list[str]
    fingerprint: str  # sha256 of the lines used: part of a general student's cache key

    def __len__(self) -> int:
        return len(self.texts)


def read_corpus(folder: str | Path, max_lines: int | None = None) -> Corpus:
    root = Path(folder)
    if not root.exists():
        raise PipelineError(f"corpus {root}: no such folder")
    if not root.is_dir():
        raise PipelineError(f"corpus {root}: a file, not a folder of .txt files (one paragraph per line)")
    files = sorted(p for p in root.rglob("*.txt") if p.is_file())
    if not files:
        raise PipelineError(f"corpus {root}: no .txt files in it")
    texts: list[str] = []
    digest = hashlib.sha256()
    for path in files:
        with path.open("rb") as f:
            for number, raw in enumerate(f, start=1):
                if max_lines is not None and len(texts) >= max_lines:
                    break
                try:
                    line = raw.decode("utf-8").strip()
                except UnicodeDecodeError:
                    raise PipelineError(f"corpus {path}, line {number}: not UTF-8 text") from None
                if line:
                    texts.append(line)
                    digest.update(line.encode() + b"\n")
    if not texts:
        raise PipelineError(f"corpus {root}: its .txt files hold no text (only blank lines)")
    return Corpus(texts, [str(p.relative_to(root)) for p in files], digest.hexdigest())

"""Unlabelled text for general distillation: a folder of `.txt` files, one document or paragraph per line.

Read in file-name order, blank lines skipped, at most `max_lines` lines (the first ones: a corpus is not shuffled
here; training shuffles). Bad corpora fail in one line naming the problem: not a folder, no `.txt` file, a file
that is not UTF-8 (with its line), nothing but blank lines.

Files are read in bounded pieces, never a whole line at once: a line over `MAX_LINE_CHARS` characters becomes
several texts of at most that many (cut at a space where one is near), so a corpus of one 50 MB line costs the
memory of 5,000 paragraphs, not of one 50 MB text in the tokenizer (which, at gigabytes, aborts the process).
Every line of the shipped Wikipedia corpus is shorter, so its texts (and fingerprint) are its lines.
"""

from __future__ import annotations

import codecs
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from pipeline.errors import PipelineError

# The longest text a corpus line becomes (about 2,000 tokens: far past any training length, which truncates it).
MAX_LINE_CHARS = 10_000
_READ_BYTES = 1 << 16  # bytes read at a time: a line longer than this is read in several pieces


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
            for number, piece in _pieces(f):
                if max_lines is not None and len(texts) >= max_lines:
                    break
                if piece is None:
                    raise PipelineError(f"corpus {path}, line {number}: not UTF-8 text")
                line = piece.strip()
                if line:
                    texts.append(line)
                    digest.update(line.encode() + b"\n")
    if not texts:
        raise PipelineError(f"corpus {root}: its .txt files hold no text (only blank lines)")
    return Corpus(texts, [str(p.relative_to(root)) for p in files], digest.hexdigest())


def _pieces(f: BinaryIO) -> Iterator[tuple[int, str | None]]:
    """(line number, text) for each line of `f`, a line over `MAX_LINE_CHARS` characters as several texts; None for
    the text of a line that is not UTF-8 (then nothing more)."""
    number, text = 1, ""
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        while raw := f.readline(_READ_BYTES):
            ends = raw.endswith(b"\n")
            text += decoder.decode(raw, final=ends)
            while len(text) > MAX_LINE_CHARS:
                cut = text.rfind(" ", MAX_LINE_CHARS // 2, MAX_LINE_CHARS)
                cut = cut if cut > 0 else MAX_LINE_CHARS
                yield number, text[:cut]
                text = text[cut:]
            if ends:
                yield number, text
                number, text = number + 1, ""
        text += decoder.decode(b"", final=True)  # a last line without a newline
    except UnicodeDecodeError:
        yield number, None
        return
    if text:
        yield number, text

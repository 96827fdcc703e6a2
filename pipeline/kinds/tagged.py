"""Token-classification data (NER): sentences of words with one tag each, read from CoNLL-format files or JSONL.

CoNLL: one word per line, whitespace-separated columns with the word first and the tag last (CoNLL-2003's
`word POS chunk NER`), a blank line after each sentence; `-DOCSTART-` lines mark documents, whose boundaries are
kept beside the sentences (a validation split carved by whole documents: `pipeline.data.loaders`). JSONL: one
sentence per line, a list of words and a list of tags (tag names, or ids into the task's tag list as Hugging Face
datasets store them). Tags are read in IOB1 or IOB2 and kept as IOB2: both schemes mean the same entities under the
CoNLL rules (an `I-X` that continues no X entity starts one), so an IOB1 file becomes exactly its IOB2 conversion.
Every bad line is one error naming the file, the line and the field.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from pipeline.errors import PipelineError
from pipeline.kinds.records import json_records
from pipeline.paths import read_utf8
from serving.artifact import TOKEN

DOCSTART = "-DOCSTART-"
OUTSIDE = "O"


def split_tag(tag: str) -> tuple[str, str]:
    """("B" | "I" | "O", entity type): `B-PER` → ("B", "PER"), `O` → ("O", "")."""
    if tag == OUTSIDE:
        return OUTSIDE, ""
    prefix, sep, kind = tag.partition("-")
    if not sep or prefix not in ("B", "I") or not kind:
        raise ValueError(f"tag {tag!r} is not O, B-TYPE or I-TYPE")
    return prefix, kind


@dataclass(frozen=True)
class TaggedSplit:
    """Sentences of one split: `words[i]` the words of sentence i, `tags[i]` their tag ids (IOB2) into `names`;
    `documents[i]` the document sentence i belongs to where the file marks documents (CoNLL's `-DOCSTART-`),
    else empty. Documents say where sentences came from, not what they are: the digest leaves them out."""

    words: list[tuple[str, ...]]
    tags: list[tuple[int, ...]]
    names: tuple[str, ...] = ()
    documents: tuple[int, ...] = ()
    kind: ClassVar[str] = TOKEN

    def __len__(self) -> int:
        return len(self.tags)

    def subset(self, idx: Sequence[int]) -> TaggedSplit:
        documents = tuple(self.documents[i] for i in idx) if self.documents else ()
        return TaggedSplit([self.words[i] for i in idx], [self.tags[i] for i in idx], self.names, documents)

    def head(self, n: int | None) -> TaggedSplit:
        return TaggedSplit(self.words[:n], self.tags[:n], self.names, self.documents[:n])

    def digest(self, h) -> None:
        for words, tags in zip(self.words, self.tags, strict=True):
            h.update("\x1f".join(words).encode() + b"\x1e" + ",".join(map(str, tags)).encode() + b"\n")
        h.update(b"\x1d")


def check_tag_set(tags: Sequence[str]) -> None:
    """A tag list the model can predict IOB2 with: `O`, and `B-X` with `I-X` for every entity type X.

    Raises:
        ValueError: naming the first problem.
    """
    if len(set(tags)) != len(tags):
        raise ValueError(f"each tag once, got {list(tags)}")
    if OUTSIDE not in tags:
        raise ValueError(f"the tags need {OUTSIDE!r} (outside any entity), got {list(tags)}")
    kinds = {split_tag(t)[1] for t in tags if t != OUTSIDE}  # ValueError for a tag that is not O/B-X/I-X
    missing = [f"{p}-{k}" for k in sorted(kinds) for p in ("B", "I") if f"{p}-{k}" not in tags]
    if missing:
        raise ValueError(f"the tags need both B- and I- of every entity type; missing {', '.join(missing)}")


def to_iob2(tags: Sequence[str]) -> list[str]:
    """IOB1 or IOB2 → IOB2: an `I-X` that continues no X entity becomes `B-X`; everything else is kept."""
    out, previous = [], OUTSIDE
    for tag in tags:
        prefix, kind = split_tag(tag)
        if prefix == "I" and split_tag(previous)[1] != kind:
            tag = f"B-{kind}"
        out.append(tag)
        previous = tag
    return out


def read_conll(path: Path, tag_names: Sequence[str]) -> TaggedSplit:
    """A CoNLL-format file: the word is the first column, the tag the last; each sentence's document is counted
    from the `-DOCSTART-` lines (sentences before the first are document 0), kept where the file has any."""
    ids = {t: i for i, t in enumerate(tag_names)}
    words, tags, documents, sentence = [], [], [], []
    document = 0

    def close() -> None:
        if sentence:
            ws, ts = zip(*sentence, strict=True)
            words.append(tuple(ws))
            tags.append(tuple(ids[t] for t in to_iob2(ts)))
            documents.append(document)
            sentence.clear()

    for lineno, line in enumerate(read_utf8(path, "data file").splitlines(), start=1):
        fields = line.split()
        if not fields:
            close()
            continue
        if fields[0] == DOCSTART:
            close()
            document += 1
            continue
        if len(fields) < 2:
            raise PipelineError(f"{path}:{lineno}: expected a word and its tag (whitespace-separated), got {line!r}")
        sentence.append((fields[0], _known_tag(fields[-1], ids, f"{path}:{lineno}")))
    close()
    if not tags:
        raise PipelineError(f"{path}: no sentences")
    return TaggedSplit(words, tags, tuple(tag_names), tuple(documents) if document else ())


def read_tagged_jsonl(path: Path, words_key: str, tags_key: str, tag_names: Sequence[str]) -> TaggedSplit:
    """A JSONL file: one object per sentence with a list of words and a list of as many tags (names or ids)."""
    records = json_records(path, read_utf8(path, "data file").splitlines(), (words_key, tags_key))
    return tagged_rows(((f"{path}:{lineno}", obj) for lineno, obj in records), words_key, tags_key, tag_names, path)


def tagged_rows(
    rows: Iterable[tuple[str, dict]], words_key: str, tags_key: str, tag_names: Sequence[str], source: object
) -> TaggedSplit:
    """Sentences from (where, row) pairs whose rows hold a list of words and a list of as many tags (names, or
    ids as Hugging Face datasets store them); `where` names a row in errors, `source` the whole."""
    ids = {t: i for i, t in enumerate(tag_names)}
    words, tags = [], []
    for where, obj in rows:
        ws, ts = obj[words_key], obj[tags_key]
        if not isinstance(ws, list) or not ws or not all(isinstance(w, str) and w.strip() for w in ws):
            raise PipelineError(f"{where}: {words_key!r} must be a non-empty list of non-blank words")
        if not isinstance(ts, list) or len(ts) != len(ws):
            got = f"{len(ts)} tags" if isinstance(ts, list) else f"a {type(ts).__name__}"
            raise PipelineError(f"{where}: {tags_key!r} must list one tag per word ({len(ws)}), got {got}")
        names = [_tag_name(t, tag_names) for t in ts]
        words.append(tuple(ws))
        tags.append(tuple(ids[t] for t in to_iob2([_known_tag(t, ids, where, tags_key) for t in names])))
    if not tags:
        raise PipelineError(f"{source}: no sentences")
    return TaggedSplit(words, tags, tuple(tag_names))


def _tag_name(tag, tag_names: Sequence[str]):
    """A tag id (as Hugging Face datasets store tags) is its name; anything else is checked by `_known_tag`."""
    if isinstance(tag, int) and not isinstance(tag, bool) and 0 <= tag < len(tag_names):
        return tag_names[tag]
    return tag


def _known_tag(tag, ids: dict[str, int], where: str, field: str = "tag") -> str:
    if not isinstance(tag, str) or tag not in ids:
        raise PipelineError(f"{where}: {field} {tag!r} is not in the task's tag set ({', '.join(ids)})")
    return tag

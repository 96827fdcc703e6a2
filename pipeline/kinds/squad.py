"""Extractive question-answering data: questions over contexts with gold answer spans, from SQuAD-format JSON
(`{"data": [{"title", "paragraphs": [{"context", "qas": [{"id", "question", "answers": [{"text",
"answer_start"}]}]}]}]}`, the official layout) or JSONL (one question per line: `id`, `question`, `context`,
`answers` as a list of `{"text", "answer_start"}` or as Hugging Face's `{"text": [...], "answer_start": [...]}`).

Every question needs at least one answer whose text occurs at its character offset in the context (SQuAD v1.1
has no unanswerable questions). A bad question is one error naming the file, where the question is (JSON: its
path in the file and its id; JSONL: the line) and the field. Training uses a question's first answer; the metric
takes the best over all of them, as the official script does.

A context may hold at most `MAX_CONTEXT_CHARS` characters: each is cut into windows for every pass over it, and a
200 KB one took gigabytes in validation; SQuAD v1.1's longest is 4,063.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from pipeline.errors import PipelineError
from pipeline.jsonfile import parse_json
from pipeline.kinds.records import describe, json_records, nonblank_text
from pipeline.paths import read_utf8
from serving.artifact import QA

MAX_CONTEXT_CHARS = 25_000  # about 25 windows of 384 tokens; twice what the server takes in one text by default


@dataclass(frozen=True)
class Question:
    """One question: `answers` holds (text, character offset in `context`) pairs, the first one trained on."""

    id: str
    question: str
    context: str
    answers: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class QASplit:
    """The questions of one split."""

    questions: list[Question]
    kind: ClassVar[str] = QA

    def __len__(self) -> int:
        return len(self.questions)

    def subset(self, idx: Sequence[int]) -> QASplit:
        return QASplit([self.questions[i] for i in idx])

    def head(self, n: int | None) -> QASplit:
        return QASplit(self.questions[:n])

    def digest(self, h) -> None:
        for q in self.questions:
            answers = "\x1f".join(f"{start}:{text}" for text, start in q.answers)
            h.update("\x1e".join((q.id, q.question, q.context, answers)).encode() + b"\n")
        h.update(b"\x1d")


def read_qa(path: Path) -> QASplit:
    """The questions of a SQuAD JSON (`.json`) or JSONL (`.jsonl`) file."""
    suffix = path.suffix.lower()
    if suffix not in (".json", ".jsonl"):
        raise PipelineError(f"{path}: unknown format {path.suffix!r}; question-answering files are .json or .jsonl")
    text = read_utf8(path, "data file")
    return _unique(_from_squad_json(path, text) if suffix == ".json" else _from_jsonl(path, text), path)


def question_rows(rows: Iterable[tuple[str, dict]], source: object) -> QASplit:
    """Questions from (where, row) pairs whose rows hold `id`, `question`, `context` and `answers` (a Hugging Face
    SQuAD split's rows); `where` names a row in errors, `source` the whole."""
    return _unique([_question(row, _context(row.get("context"), f"{where}: context"), where) for where, row in rows],
                   source)  # fmt: skip


def _unique(questions: list[Question], source: object) -> QASplit:
    if not questions:
        raise PipelineError(f"{source}: no questions")
    seen: set[str] = set()
    for q in questions:
        if q.id in seen:
            raise PipelineError(f"{source}: question id {q.id!r} appears twice")
        seen.add(q.id)
    return QASplit(questions)


def _from_squad_json(path: Path, text: str) -> list[Question]:
    doc = parse_json(text, str(path))
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise PipelineError(f"{path}: expected SQuAD JSON, an object whose 'data' is a list of articles")
    questions = []
    for a, article in enumerate(doc["data"]):
        paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
        if not isinstance(paragraphs, list):
            raise PipelineError(f"{path}: data[{a}].paragraphs must be a list of paragraphs")
        for p, paragraph in enumerate(paragraphs):
            where = f"{path}: data[{a}].paragraphs[{p}]"
            if not isinstance(paragraph, dict):
                raise PipelineError(f"{where} must be an object with 'context' and 'qas'")
            context = _context(paragraph.get("context"), f"{where}.context")
            qas = paragraph.get("qas")
            if not isinstance(qas, list):
                raise PipelineError(f"{where}.qas must be a list of questions")
            for i, qa in enumerate(qas):
                if not isinstance(qa, dict):
                    raise PipelineError(f"{where}.qas[{i}] must be an object")
                qid = qa.get("id")
                label = f"{where}.qas[{i}]" + (f" (id {qid})" if isinstance(qid, str) else "")
                questions.append(_question(qa, context, label))
    return questions


def _from_jsonl(path: Path, text: str) -> list[Question]:
    fields = ("id", "question", "context", "answers")
    return [
        _question(obj, _context(obj["context"], f"{path}:{n}: context"), f"{path}:{n}")
        for n, obj in json_records(path, text.splitlines(), fields)
    ]


def _question(qa: dict, context: str, where: str) -> Question:
    """One question; `where` names it in errors (the file and its place there)."""
    qid = qa.get("id")
    if not isinstance(qid, str | int) or isinstance(qid, bool) or str(qid) == "":
        raise PipelineError(f"{where}: id is {describe(qid)}; expected a non-empty string")
    question = nonblank_text(qa.get("question"), f"{where}: question")
    answers = tuple(_answers(qa.get("answers"), where))
    if not answers:
        raise PipelineError(f"{where}: no answers (every question needs one)")
    for text, start in answers:
        if context[start : start + len(text)] != text:
            found = context[start : start + len(text)]
            raise PipelineError(f"{where}: answer {text!r} is not at offset {start} of its context (there: {found!r})")
    return Question(str(qid), question, context, answers)


def _answers(raw, where: str):
    """(text, start) pairs from a list of {text, answer_start} or from {text: [...], answer_start: [...]}."""
    if isinstance(raw, dict) and isinstance(raw.get("text"), list) and isinstance(raw.get("answer_start"), list):
        if len(raw["text"]) != len(raw["answer_start"]):
            raise PipelineError(f"{where}: answers has {len(raw['text'])} texts and "
                                f"{len(raw['answer_start'])} offsets")  # fmt: skip
        raw = [{"text": t, "answer_start": s} for t, s in zip(raw["text"], raw["answer_start"], strict=True)]
    if not isinstance(raw, list):
        raise PipelineError(f"{where}: answers must be a list of {{text, answer_start}}, got {describe(raw)}")
    for k, answer in enumerate(raw):
        if not isinstance(answer, dict):
            raise PipelineError(f"{where}: answers[{k}] must be an object with text and answer_start")
        text = nonblank_text(answer.get("text"), f"{where}: answers[{k}].text")
        start = answer.get("answer_start")
        if not isinstance(start, int) or isinstance(start, bool) or start < 0:
            raise PipelineError(f"{where}: answers[{k}].answer_start is {start!r}; expected an "
                                "offset (an integer >= 0)")  # fmt: skip
        yield text, start


def _context(value, field: str) -> str:
    """A non-blank context of at most `MAX_CONTEXT_CHARS` characters."""
    context = nonblank_text(value, field)
    if len(context) > MAX_CONTEXT_CHARS:
        raise PipelineError(
            f"{field} has {len(context):,} characters; at most {MAX_CONTEXT_CHARS:,} (split the document into "
            "passages)"
        )
    return context

"""Question answering served: questions with their contexts in, answer spans out. A context is cut into windows
of the session's max tokens (with its question) overlapping by `window_stride`; each window's start and end rows
are decoded as transformers' question-answering pipeline decodes them (`serving.spans.best_answers`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from tokenizers import Encoding

from serving.artifact import QA, ArtifactError
from serving.kinds.base import ServedKind
from serving.spans import (
    MAX_ANSWER_LEN,
    MAX_TOP_K,
    Window,
    best_answers,
    question_encodings,
    window_of,
    window_stride,
)
from serving.spans import windowing as windowing_tokenizer
from serving.validation import (
    QUESTION_EXAMPLE,
    QUESTION_INPUTS,
    Limits,
    PredictRequest,
    Question,
    RequestError,
    nonblank,
    positive,
    question_items,
    unknown_keys,
)

NO_ANSWER = {"score": 0.0, "start": 0, "end": 0, "answer": ""}  # no span fits (a context of special tokens only)


@dataclass(frozen=True)
class QuestionWindow:
    """One window of a question-answering request's item: which of the request's questions it belongs to."""

    question: int
    window: Window


def check_windows(windows: int, limit: int | None, done: bool = True) -> None:
    """Refuse a request that cuts its contexts into more than `limit` windows (`done`: all of them counted)."""
    if limit is not None and windows > limit:
        counted = f"{windows}" if done else f"at least {windows}"
        raise RequestError(
            413, f"the contexts make {counted} windows of the model's max tokens; at most {limit} per request "
            "(shorter or fewer contexts)", "too_many_windows",
        )  # fmt: skip


class ServedQuestionAnswering(ServedKind):
    name = QA
    outputs: ClassVar[dict[str, str]] = {"answer": "BYTES", "score": "FP32", "start": "INT64", "end": "INT64"}

    def input_names(self, pair: bool) -> tuple[str, ...]:
        return QUESTION_INPUTS

    def wanted_inputs(self, pair: bool) -> str:
        return f"a question object {QUESTION_EXAMPLE} or a list of them"

    def predict_request(self, items: list, single: bool, params: dict, limits: Limits, pair: bool) -> PredictRequest:
        """Parameters `top_k` and `max_answer_len`."""
        unknown_keys(params, ("top_k", "max_answer_len"), "'parameters'")
        questions = question_items(items, "inputs", limits, single)
        max_answer_len = positive(params, "max_answer_len", MAX_ANSWER_LEN, nullable=False)
        top_k = positive(params, "top_k", 1, most=MAX_TOP_K)
        return PredictRequest(questions, single, top_k, "softmax", max_answer_len)

    def infer_items(self, columns: list[list[str]], pair: bool) -> list:
        return [Question(nonblank(q, "a question"), nonblank(c, "a context")) for q, c in zip(*columns, strict=True)]

    def warm_up(self, pair: bool) -> Question:
        return Question("warm-up?", "warm-up")

    def prepare(self, session: Any) -> None:
        session.stride = window_stride(session.max_length)
        session.windowing = windowing_tokenizer(session.tokenizer, session.max_length, session.stride)
        probe = session.tokenizer.encode("a", "b")  # the classification token, which stays an answer candidate
        session.cls_id = probe.ids[0] if probe.special_tokens_mask[:1] == [1] else None

    def encode(self, session: Any, items: list) -> list:
        """The `QuestionWindow`s of every question; a question that leaves its context no room in a window is a
        422, more windows than the session's `max_windows` a 413 (counted before any window is built)."""
        if not all(isinstance(q, Question) for q in items):
            raise ArtifactError(f"{session.path} answers questions: pass serving.validation.Question items")
        encodings: list[tuple[int, Encoding]] = []
        for i, q in enumerate(items):
            encodings += [(i, e) for e in self._encodings(session, q)]
            check_windows(len(encodings), session.max_windows, done=i + 1 == len(items))
        return [QuestionWindow(i, window_of(e, session.cls_id)) for i, e in encodings]

    @staticmethod
    def _encodings(session: Any, q: Question) -> list[Encoding]:
        try:
            return question_encodings(session.windowing, q.question, q.context)
        except Exception:  # the Rust tokenizer's truncation error: the question alone fills the window
            room = len(session.tokenizer.encode(q.question, "").ids)
            raise RequestError(
                422,
                f"the question takes {room} of the {session.max_length} tokens of a window, which leaves its "
                f"context no room beyond the {session.stride} tokens windows overlap by: shorten it",
                "question_too_long",
            ) from None

    def encoding(self, item: QuestionWindow) -> Encoding:
        return item.window.encoding

    def check_encoded(self, encoded: list, config: Any) -> None:
        check_windows(len(encoded), config.max_windows)

    def rows(self, outputs: list[np.ndarray], lengths: list[int]) -> np.ndarray:
        rows = np.empty(len(lengths), dtype=object)  # (start logits, end logits) over each window's tokens
        for i, n in enumerate(lengths):
            rows[i] = (outputs[0][i, :n], outputs[1][i, :n])
        return rows

    def answer(self, session: Any, items: list, encoded: list, rows: np.ndarray, top_k: int | None,
               max_answer_len: int) -> list:  # fmt: skip
        """The `top_k` answers to each question (spans of at most `max_answer_len` tokens)."""
        windows: list[list[int]] = [[] for _ in items]
        for n, item in enumerate(encoded):
            windows[item.question].append(n)
        answers = []
        for q, ns in zip(items, windows, strict=True):
            starts, ends = [rows[n][0] for n in ns], [rows[n][1] for n in ns]
            spans = [encoded[n].window for n in ns]
            answers.append(best_answers(spans, starts, ends, q.context, max_answer_len, top_k or 1))
        return answers

    def tensors(self, session: Any, items: list, encoded: list, rows: np.ndarray,
                wanted: tuple[str, ...]) -> dict[str, tuple[str, list[int], list]]:  # fmt: skip
        found = [a[0] if a else NO_ANSWER for a in session.answer(items, encoded, rows, 1, MAX_ANSWER_LEN)]
        return self.columns(found, wanted)

    def predict(self, session: Any, req: PredictRequest, encoded: list, rows: np.ndarray) -> list:
        """The pipeline's shapes: one answer as an object, top_k > 1 as a list."""
        result = session.answer(req.texts, encoded, rows, req.top_k, req.max_answer_len)
        return [(a or [NO_ANSWER])[0] if req.top_k == 1 else a for a in result]

"""Extractive question answering (SQuAD v1.1): an answer span in a context. SQuAD JSON or JSONL files
(`pipeline.kinds.squad`); the question and the context are encoded as a pair and the context is cut into windows
of `max_length` tokens overlapping by `window_stride` (the tokenizer's own overflow, as `serving.spans` cuts
them), a window labelled with the token positions of the question's first answer, or with position 0 (the first
token) when the answer is not inside it; SQuAD's exact match and F1 of the answers `serving.spans` decodes,
exactly as the server (and transformers' pipeline) would answer (`pipeline.kinds.squad_metric`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from pipeline.errors import PipelineError
from pipeline.kinds.base import Encoded, Kind, Spec, feature_keys, scored_by_f1, whole_groups
from pipeline.kinds.squad import QASplit, question_rows, read_qa
from pipeline.kinds.squad_metric import squad_scores, token_f1
from serving.artifact import QA
from serving.spans import MAX_ANSWER_LEN, best_answers, window_of, window_stride


def _answer_tokens(sequence_ids: list, offsets: list, start: int, end: int) -> tuple[int, int]:
    """The first and last context tokens of the answer's characters [start, end), or (0, 0) outside the window."""
    context = [i for i, s in enumerate(sequence_ids) if s == 1]
    first, last = context[0], context[-1]
    if not (offsets[first][0] <= start and offsets[last][1] >= end):
        return 0, 0
    s = next(i for i in context[::-1] if offsets[i][0] <= start)
    e = next(i for i in context if offsets[i][1] >= end)
    return s, e


class QuestionAnswering(Kind):
    name = QA
    rows = "qa"  # a start row and an end row per window over its tokens
    formats: ClassVar[dict[str, str]] = {".json": "squad", ".jsonl": "jsonl"}
    task_file_defaults: ClassVar[dict[str, Any]] = {
        "text_columns": ["question", "context"],
        "label_column": "answers",
        "metric": "f1",
    }
    hub_name = "Question Answering"
    example = 'classify(question="Who spoke?", context="Peter Blackburn spoke in Brussels.")'

    def check_task_file(self, task: Any) -> None:
        scored_by_f1(task)
        if task.labels:
            raise ValueError("labels: a question-answering task has none (answers are spans of the context)")

    def num_labels(self, spec: Spec) -> int:
        return 2  # start and end

    def inputs(self, spec: Spec) -> str:
        return "question and context"

    def predicts(self, spec: Spec) -> str:
        return "answer spans"

    def card_description(self, task: dict) -> str:
        return "extractive question-answering model"

    def read(self, spec: Spec, path: Path) -> QASplit:
        return read_qa(path)

    def hf_columns(self, spec: Spec) -> tuple[str, ...]:
        return ("id", *spec.hf_text_columns, "answers")

    def hf_split(self, spec: Spec, part: Any, where: str, part_name: str) -> QASplit:
        """SQuAD's rows (id, question, context, answers)."""
        split = f"{where}: split {part_name}"
        return question_rows(((f"{split}, row {i}", row) for i, row in enumerate(part)), split)

    def validation_draw(self, split: QASplit, n: int, seed: int) -> set[int]:
        """Questions with their whole context (all the questions of a drawn context, until there are n, at least
        one question left): a validation question whose paragraph was trained on would flatter every choice."""
        return whole_groups([q.context for q in split.questions], n, seed)

    def holds(self, out: Any) -> bool:
        return hasattr(out, "start_logits")

    def output_rows(self, out: Any, lengths: list[int]) -> list[np.ndarray]:
        import torch

        values = torch.stack([out.start_logits, out.end_logits], dim=1).float().cpu()  # (n, 2, tokens)
        return [values[j][:, :n].numpy().copy() for j, n in enumerate(lengths)]

    def assemble(self, rows: list[np.ndarray], width: int, device: Any) -> Any:
        import torch
        from transformers.modeling_outputs import QuestionAnsweringModelOutput

        both = torch.zeros(len(rows), 2, width)
        for i, r in enumerate(rows):
            both[i, :, : r.shape[1]] = torch.from_numpy(r)
        both = both.to(device)
        return QuestionAnsweringModelOutput(start_logits=both[:, 0], end_logits=both[:, 1])

    def encode(self, tokenizer: Any, split: QASplit, max_length: int, stride: int | None = None) -> Encoded:
        stride = window_stride(max_length) if stride is None else stride
        questions = split.questions
        alone = tokenizer([q.question for q in questions])["input_ids"]  # one batched call, not one per question
        for q, ids in zip(questions, alone, strict=True):  # the tokenizer panics when a question leaves no room
            room = max_length - len(ids) - 2
            if room <= stride:
                raise PipelineError(f"question {q.id} leaves {room} tokens of {max_length} for its context, not more "
                                    f"than the stride {stride}: shorten it, or raise max_length")  # fmt: skip
        enc = tokenizer([q.question for q in questions], [q.context for q in questions], truncation="only_second",
                        max_length=max_length, stride=stride, return_overflowing_tokens=True,
                        return_offsets_mapping=True)  # fmt: skip
        keys, features, labels = feature_keys(enc), [], []
        samples = list(enc["overflow_to_sample_mapping"])
        for i, sample in enumerate(samples):
            features.append({k: enc[k][i] for k in keys})
            text, start = questions[sample].answers[0]
            labels.append(_answer_tokens(enc.sequence_ids(i), enc["offset_mapping"][i], start, start + len(text)))
        windows = [window_of(e, tokenizer.cls_token_id) for e in enc.encodings]
        return Encoded(features, labels, tokenizer.pad_token_id or 0, QA, split, samples, windows)

    def join_rows(self, batches: list[np.ndarray], enc: Encoded) -> np.ndarray:
        """All start rows, then all end rows."""
        halves = [(b[: len(b) // 2], b[len(b) // 2 :]) for b in batches]
        return np.concatenate([h[0] for h in halves] + [h[1] for h in halves])

    def scores(self, rows: np.ndarray, enc: Encoded) -> dict[str, float]:
        return squad_scores(*self.answers(rows, enc))

    def example_scores(self, rows: np.ndarray, enc: Encoded) -> np.ndarray:
        """Each question's SQuAD F1."""
        predicted, gold = self.answers(rows, enc)
        return np.array([100 * max(token_f1(p, g) for g in gs) for p, gs in zip(predicted, gold, strict=True)])

    def answers(self, rows: np.ndarray, enc: Encoded) -> tuple[list[str], list[list[str]]]:
        """Each question's best answer over its windows, decoded as the server decodes it, and its gold answers."""
        n = len(enc.features)
        by_question: dict[int, list[int]] = {}
        for i, sample in enumerate(enc.samples):
            by_question.setdefault(sample, []).append(i)
        predictions, golds = [], []
        for sample, question in enumerate(enc.source.questions):
            windows = by_question.get(sample, [])
            size = {i: len(enc.features[i]["input_ids"]) for i in windows}
            starts, ends = [rows[i][: size[i]] for i in windows], [rows[n + i][: size[i]] for i in windows]
            answers = best_answers([enc.windows[i] for i in windows], starts, ends, question.context, MAX_ANSWER_LEN)
            predictions.append(answers[0]["answer"] if answers else "")
            golds.append([text for text, _ in question.answers])
        return predictions, golds

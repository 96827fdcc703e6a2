"""Task metrics and batched inference, for every task kind.

A model's outputs on an encoded split are kept as `losses.prediction_rows` shapes them, batch after batch: a row
of class logits per example (sequence classification), per real token (token classification), or a start row
and an end row per window over its tokens (question answering, padded to the longest window with -1e4). Torch
and ONNX outputs become the same rows, so parity compares them directly, and each kind scores them its way:
accuracy and F1 from the rows; entity F1 from the tag of each word's first sub-token; SQuAD's exact match and F1
from the answers `serving.spans` decodes, exactly as the server (and transformers' pipeline) would answer.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from pipeline import interrupts
from pipeline.data.encoding import IGNORED, Encoded, iter_batches
from pipeline.data.tagged import OUTSIDE
from pipeline.data.tasks import QA, TOKEN
from pipeline.train.entity_metric import entity_scores
from pipeline.train.losses import prediction_rows
from pipeline.train.squad_metric import squad_scores, token_f1
from serving.spans import MAX_ANSWER_LEN, best_answers


def output_rows(outputs, batch: Mapping[str, torch.Tensor], width: int) -> np.ndarray:
    """One batch's outputs (a model's output, or any object with its `logits`, or `start_logits` and `end_logits`)
    as prediction rows; question-answering rows are padded to `width` tokens so batches concatenate."""
    rows, _ = prediction_rows(outputs, batch)
    rows = rows.float().cpu().numpy()
    if hasattr(outputs, "start_logits") and rows.shape[1] < width:
        rows = np.pad(rows, ((0, 0), (0, width - rows.shape[1])), constant_values=-1e4)
    return rows


def join_rows(batches: list[np.ndarray], enc: Encoded) -> np.ndarray:
    """The rows of every batch in order (question answering: all start rows, then all end rows)."""
    if enc.kind != QA:
        return np.concatenate(batches)
    halves = [(b[: len(b) // 2], b[len(b) // 2 :]) for b in batches]
    return np.concatenate([h[0] for h in halves] + [h[1] for h in halves])


def longest(enc: Encoded) -> int:
    return max(len(f["input_ids"]) for f in enc.features)


@torch.no_grad()
def predict_logits(model: torch.nn.Module, enc: Encoded, batch_size: int = 64) -> np.ndarray:
    """The prediction rows of every feature, in order, on the model's current device."""
    model.eval()
    device = next(model.parameters()).device
    out, width = [], longest(enc)
    for batch in iter_batches(enc, batch_size):
        interrupts.check()  # a stop during a long validation ends it within a batch (training checks every step)
        batch.pop("labels")
        batch = {k: v.to(device) for k, v in batch.items()}  # the rows' masks too: QA's padding mask meets CUDA logits
        out.append(output_rows(model(**batch), batch, width))
    return join_rows(out, enc)


def scores(rows: np.ndarray, enc: Encoded) -> dict[str, float]:
    """The task's metrics in percent. Sequence classification: accuracy, F1 of class 1 (two classes) and
    macro-F1; token classification: entity precision, recall, F1; question answering: exact match and F1."""
    if enc.kind == TOKEN:
        return _entity_scores(rows, enc)
    if enc.kind == QA:
        return _answer_scores(rows, enc)
    preds = np.asarray(rows).argmax(-1)
    labels = np.asarray(enc.labels)
    result = {"accuracy": float((preds == labels).mean() * 100)}
    f1 = [_f1(preds, labels, c) for c in range(rows.shape[-1])]
    if rows.shape[-1] == 2:
        result["f1"] = f1[1]
    result["macro_f1"] = float(np.mean(f1))
    return result


def _f1(preds: np.ndarray, labels: np.ndarray, c: int) -> float:
    tp = int(((preds == c) & (labels == c)).sum())
    fp = int(((preds == c) & (labels != c)).sum())
    fn = int(((preds != c) & (labels == c)).sum())
    return float(200 * tp / (2 * tp + fp + fn)) if tp else 0.0


def _entity_scores(rows: np.ndarray, enc: Encoded) -> dict[str, float]:
    """Each word takes the tag of its first sub-token; words cut off by `max_length` are predicted outside."""
    split, names = enc.source, enc.source.names
    predicted, gold, start = [], [], 0
    for i, feature in enumerate(enc.features):
        token_rows = rows[start : start + sum(feature["attention_mask"])]
        start += len(token_rows)
        firsts = [n for n, label in enumerate(enc.labels[i]) if label != IGNORED]
        tags = [names[t] for t in token_rows[firsts].argmax(-1)]
        predicted.append(tags + [OUTSIDE] * (len(split.words[i]) - len(tags)))
        gold.append([names[t] for t in split.tags[i]])
    return entity_scores(predicted, gold)


def example_scores(rows: np.ndarray, enc: Encoded) -> np.ndarray | None:
    """Each example's share of a metric that is a mean over examples, in percent, so that two models can be compared
    example by example (a paired difference and its standard error): sequence classification, accuracy (0 or 100
    per example); question answering, SQuAD F1 (each question's). None for token classification: entity F1 counts
    the whole split."""
    if enc.kind == QA:
        return np.array([100 * max(token_f1(p, g) for g in gs) for p, gs in zip(*_answers(rows, enc), strict=True)])
    if enc.kind == TOKEN:
        return None
    return 100.0 * (np.asarray(rows).argmax(-1) == np.asarray(enc.labels))


def _answer_scores(rows: np.ndarray, enc: Encoded) -> dict[str, float]:
    return squad_scores(*_answers(rows, enc))


def _answers(rows: np.ndarray, enc: Encoded) -> tuple[list[str], list[list[str]]]:
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

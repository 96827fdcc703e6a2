"""Task metrics and batched inference, for every task kind.

A model's outputs on an encoded split are kept as `losses.prediction_rows` shapes them, batch after batch: a row
of class logits per example (sequence classification), per real token (token classification), or a start row
and an end row per window over its tokens (question answering, padded to the longest window with -1e4). Torch
and ONNX outputs become the same rows, so parity compares them directly, and each kind scores them its way
(`pipeline.kinds`): accuracy and F1 from the rows; entity F1 from the tag of each word's first sub-token; SQuAD's
exact match and F1 from the answers `serving.spans` decodes, exactly as the server (and transformers' pipeline)
would answer.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from pipeline import interrupts
from pipeline.data.encoding import iter_batches
from pipeline.kinds import kind_of
from pipeline.kinds.base import Encoded
from pipeline.train.losses import prediction_rows


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
    return kind_of(enc.kind).join_rows(batches, enc)


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
        batch.pop("labels", None)  # sentence embeddings have none
        batch = {k: v.to(device) for k, v in batch.items()}  # the rows' masks too: QA's padding mask meets CUDA logits
        out.append(output_rows(model(**batch), batch, width))
    return join_rows(out, enc)


def scores(rows: np.ndarray, enc: Encoded) -> dict[str, float]:
    """The task's metrics in percent, as the split's kind scores them (`pipeline.kinds`). Sequence
    classification: accuracy, F1 of class 1 (two classes) and macro-F1; token classification: entity precision,
    recall, F1; question answering: exact match and F1."""
    return kind_of(enc.kind).scores(rows, enc)


def example_scores(rows: np.ndarray, enc: Encoded) -> np.ndarray | None:
    """Each example's share of a metric that is a mean over examples, in percent, so that two models can be compared
    example by example (a paired difference and its standard error): sequence classification, accuracy (0 or 100
    per example); question answering, SQuAD F1 (each question's). None for token classification: entity F1 counts
    the whole split."""
    return kind_of(enc.kind).example_scores(rows, enc)

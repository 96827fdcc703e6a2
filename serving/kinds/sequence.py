"""Sequence classification served: texts or text pairs in, their labels with scores out."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from serving.artifact import SEQUENCE
from serving.kinds.base import ServedKind
from serving.validation import (
    FUNCTIONS,
    PAIR_EXAMPLE,
    Limits,
    PredictRequest,
    RequestError,
    check_items,
    pair_items,
    positive,
    unknown_keys,
)


def softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def scores(logits: np.ndarray, function: str) -> np.ndarray:
    """`function_to_apply` of transformers' text-classification pipeline."""
    if function == "softmax":
        return softmax(logits)
    if function == "sigmoid":
        return 1.0 / (1.0 + np.exp(-logits))
    return logits


def top_labels(scores: np.ndarray, labels: list[str], top_k: int | None = 1) -> list[list[dict]]:
    """Per row of `scores`, the `top_k` labels (None: all) with their scores, best first (ties: lower id)."""
    k = len(labels) if top_k is None else top_k
    return [
        [{"label": labels[j], "score": float(row[j])} for j in np.argsort(-row, kind="stable")[:k]] for row in scores
    ]


class ServedSequence(ServedKind):
    name = SEQUENCE
    outputs: ClassVar[dict[str, str]] = {"label": "BYTES", "probabilities": "FP32", "logits": "FP32"}
    decodes = False  # labels come straight from the rows

    def model_name(self, pair: bool) -> str:
        return "sentence-pair model" if pair else "single-text model"

    def wanted_inputs(self, pair: bool) -> str:
        return f"a pair object {PAIR_EXAMPLE} or a list of them" if pair else "a string or a list of strings"

    def predict_request(self, items: list, single: bool, params: dict, limits: Limits, pair: bool) -> PredictRequest:
        """Parameters `top_k` (int or null) and `function_to_apply`."""
        texts = check_items(pair_items(items, "inputs", pair, single), "inputs", limits)
        unknown_keys(params, ("top_k", "function_to_apply"), "'parameters'")
        top_k = positive(params, "top_k", 1)
        function = params.get("function_to_apply", "softmax")
        if function not in FUNCTIONS:
            raise RequestError(
                422,
                f"'parameters.function_to_apply' must be one of {', '.join(FUNCTIONS)}, not {function!r}"[:300],
                "bad_parameter",
            )
        return PredictRequest(texts, single, top_k, function)

    def infer_items(self, columns: list[list[str]], pair: bool) -> list:
        return list(zip(*columns, strict=True)) if pair else columns[0]

    def rows(self, outputs: list[np.ndarray], lengths: list[int]) -> np.ndarray:
        return outputs[0]  # class logits [n, labels]

    def answer(self, session: Any, items: list, encoded: list, rows: np.ndarray, top_k: int | None,
               max_answer_len: int) -> list:  # fmt: skip
        """The `top_k` labels (None: all) with softmax scores, best first."""
        return top_labels(softmax(rows), session.labels, top_k)

    def output_shapes(self, labels: list[str]) -> dict[str, tuple[str, list[int]]]:
        """Probabilities and logits have a column per label."""
        return {name: (d, [-1, len(labels)] if d == "FP32" else [-1]) for name, d in self.outputs.items()}

    def tensors(self, session: Any, items: list, encoded: list, rows: np.ndarray,
                wanted: tuple[str, ...]) -> dict[str, tuple[str, list[int], list]]:  # fmt: skip
        n, k = rows.shape
        values = {
            "label": lambda: [session.labels[i] for i in rows.argmax(-1)],
            "probabilities": lambda: softmax(rows).ravel().tolist(),
            "logits": lambda: rows.ravel().tolist(),
        }
        return {name: (self.outputs[name], [n] if name == "label" else [n, k], values[name]()) for name in wanted}

    def predict(self, session: Any, req: PredictRequest, encoded: list, rows: np.ndarray) -> list:
        return top_labels(scores(rows, req.function), session.labels, req.top_k)

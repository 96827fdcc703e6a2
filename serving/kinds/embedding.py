"""Sentence embeddings served: texts in, one pooled, normalised vector each out (the graph's `sentence_embedding`
output: pooling and normalisation run inside it)."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from serving.artifact import EMBEDDING, ArtifactError
from serving.kinds.base import ServedKind
from serving.validation import Limits, PredictRequest, check_items, pair_items, unknown_keys

EMBEDDING_OUTPUT = "sentence_embedding"  # the graph's pooled, normalised output (beside `last_hidden_state`)


class ServedEmbedding(ServedKind):
    name = EMBEDDING
    outputs: ClassVar[dict[str, str]] = {"embedding": "FP32"}
    decodes = False  # the vectors are the rows

    def wanted_inputs(self, pair: bool) -> str:
        return "a string or a list of strings"

    def predict_request(self, items: list, single: bool, params: dict, limits: Limits, pair: bool) -> PredictRequest:
        """No parameters (the vectors are normalised, as sentence-transformers' `normalize_embeddings` gives them)."""
        unknown_keys(params, (), "'parameters'")
        texts = check_items(pair_items(items, "inputs", False, single), "inputs", limits)
        return PredictRequest(texts, single, None, "none")

    def prepare(self, session: Any) -> None:
        """Only the pooled output is fetched: the per-token one would be copied out of the graph for nothing."""
        if EMBEDDING_OUTPUT not in session.outputs:
            raise ArtifactError(f"{session.path}: the graph has no {EMBEDDING_OUTPUT!r} output ({session.outputs})")
        session.outputs = [EMBEDDING_OUTPUT]

    def rows(self, outputs: list[np.ndarray], lengths: list[int]) -> np.ndarray:
        return outputs[0]  # [n, dimension]

    def answer(self, session: Any, items: list, encoded: list, rows: np.ndarray, top_k: int | None,
               max_answer_len: int) -> list:  # fmt: skip
        """Each text's vector, as a list of floats."""
        return [row.tolist() for row in rows.astype(np.float32)]

    def output_shapes(self, labels: list[str]) -> dict[str, tuple[str, list[int]]]:
        return {"embedding": ("FP32", [-1, -1])}

    def tensors(self, session: Any, items: list, encoded: list, rows: np.ndarray,
                wanted: tuple[str, ...]) -> dict[str, tuple[str, list[int], list]]:  # fmt: skip
        return {"embedding": ("FP32", list(rows.shape), rows.astype(np.float32).ravel().tolist())}

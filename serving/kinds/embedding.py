"""Sentence embeddings served: texts in, one pooled, normalised vector each out (the graph's `sentence_embedding`
output: pooling and normalisation run inside it), at `/predict` (as the Hugging Face inference API answers for a
sentence-transformers model), `/v2/.../infer` (an FP32 `embedding` output [N, D]) and `/embed`, in Text Embeddings
Inference's shape: `{"inputs": "..." or [...], "normalize": true, "truncate": ...}` answered by a list of vectors,
one per text, a single string included."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from serving.artifact import EMBEDDING, ArtifactError
from serving.kinds.base import ServedKind
from serving.validation import (
    Limits,
    PredictRequest,
    RequestError,
    as_object,
    check_items,
    pair_items,
    type_name,
    unknown_keys,
)

EMBEDDING_OUTPUT = "sentence_embedding"  # the graph's pooled, normalised output (beside `last_hidden_state`)
EMBED_FIELDS = ("inputs", "normalize", "truncate", "truncation_direction")  # what a TEI `/embed` body may say


def embed_request(payload: Any, limits: Limits) -> PredictRequest:
    """A Text Embeddings Inference `/embed` body: `inputs` a string or a list of strings; `normalize` true (the
    graph's vectors are normalised; false is refused, not answered with other vectors); `truncate` and
    `truncation_direction` ("Right") are taken as this server works: every text is cut at the model's length from
    the right, as at `/predict`."""
    body = as_object(payload, "request body")
    unknown_keys(body, EMBED_FIELDS, "request body")
    if "inputs" not in body:
        raise RequestError(422, "missing field 'inputs' (a string or a list of strings)", "missing_field")
    if body.get("normalize", True) is not True:
        raise RequestError(
            422, "'normalize' must be true: this model's graph gives normalised vectors", "bad_parameter"
        )
    if not isinstance(body.get("truncate", True), bool):
        raise RequestError(
            422, f"'truncate' must be true or false, not {type_name(body['truncate'])}", "bad_parameter"
        )
    if body.get("truncation_direction", "Right") not in ("Right", "right"):
        raise RequestError(
            422, "'truncation_direction' must be \"Right\": texts are cut from the right", "bad_parameter"
        )
    inputs = body["inputs"]
    if isinstance(inputs, str):
        inputs = [inputs]
    elif not isinstance(inputs, list):
        raise RequestError(
            422, f"'inputs' must be a string or a list of strings, not {type_name(inputs)}", "wrong_type"
        )
    texts = check_items(pair_items(inputs, "inputs", False), "inputs", limits)
    return PredictRequest(texts, False, None, "none")


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

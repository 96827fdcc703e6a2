"""Token classification served: texts in, their entities out, grouped as transformers' token-classification
pipeline groups them (aggregation "simple", `serving.spans.entity_groups`)."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from serving.artifact import TOKEN
from serving.kinds.base import ServedKind
from serving.spans import MAX_ANSWER_LEN, entity_groups
from serving.validation import Limits, PredictRequest, RequestError, check_items, pair_items, unknown_keys


class ServedToken(ServedKind):
    name = TOKEN
    # a text has any number of entities: the outputs list every entity of the request, and `text_index` says which
    # input text each came from
    outputs: ClassVar[dict[str, str]] = {"entity_group": "BYTES", "score": "FP32", "word": "BYTES", "start": "INT64",
                                         "end": "INT64", "text_index": "INT64"}  # fmt: skip

    def predict_request(self, items: list, single: bool, params: dict, limits: Limits, pair: bool) -> PredictRequest:
        """Parameter `aggregation_strategy` ("simple", the only one served)."""
        unknown_keys(params, ("aggregation_strategy",), "'parameters'")
        strategy = params.get("aggregation_strategy", "simple")
        if strategy != "simple":
            raise RequestError(
                422, f"'parameters.aggregation_strategy' must be 'simple' (the one served), not {strategy!r}"[:300],
                "bad_parameter",
            )  # fmt: skip
        texts = check_items(pair_items(items, "inputs", False, single), "inputs", limits)
        return PredictRequest(texts, single, None, "softmax")

    def rows(self, outputs: list[np.ndarray], lengths: list[int]) -> np.ndarray:
        rows = np.empty(len(lengths), dtype=object)  # logits [tokens, labels] per text
        for i, n in enumerate(lengths):
            rows[i] = outputs[0][i, :n]
        return rows

    def answer(self, session: Any, items: list, encoded: list, rows: np.ndarray, top_k: int | None,
               max_answer_len: int) -> list:  # fmt: skip
        return [
            entity_groups(session.tokenizer, text, enc, row, session.labels, session.unk_id)
            for text, enc, row in zip(items, encoded, rows, strict=True)
        ]

    def tensors(self, session: Any, items: list, encoded: list, rows: np.ndarray,
                wanted: tuple[str, ...]) -> dict[str, tuple[str, list[int], list]]:  # fmt: skip
        answers = session.answer(items, encoded, rows, 1, MAX_ANSWER_LEN)
        found = [{**e, "text_index": i} for i, entities in enumerate(answers) for e in entities]
        return self.columns(found, wanted)

"""What the server knows about one task kind: what a request of it carries, how its items are tokenised, which
rows of the graph's outputs it keeps, how those rows become answers, and the shapes of its responses.

One adapter per kind beside this module (`serving.kinds.kind_of`); the session (`serving.session`), the request
parsing (`serving.validation`) and the HTTP layer (`serving.app`) ask it instead of branching on the kind. The
session and the service are passed in (duck-typed): this package imports neither.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from tokenizers import Encoding

from serving.artifact import ArtifactError
from serving.validation import INPUT_NAME, PAIR_INPUT_NAME, Limits, PredictRequest


class ServedKind:
    """One task kind, as the server answers it; subclasses fill in what differs."""

    name: ClassVar[str]  # the contract's name (`serving.artifact`), as the artifact's task block says it
    outputs: ClassVar[dict[str, str]]  # the Open Inference Protocol outputs, with their datatypes
    decodes: ClassVar[bool] = True  # its answers are decoded from the rows (entities, spans): off the event loop

    # -- requests ------------------------------------------------------------------------------------------------

    def input_names(self, pair: bool) -> tuple[str, ...]:
        """The Open Inference Protocol BYTES inputs of a model of this kind."""
        return (INPUT_NAME, PAIR_INPUT_NAME) if pair else (INPUT_NAME,)

    def model_name(self, pair: bool) -> str:
        """How a refusal names the model."""
        return f"{self.name} model"

    def wanted_inputs(self, pair: bool) -> str:
        """What `/predict`'s `inputs` must be, in a refusal's words."""
        return "a string or a list of strings"

    def predict_request(self, items: list, single: bool, params: dict, limits: Limits, pair: bool) -> PredictRequest:
        """`/predict`'s items and parameters, checked (RequestError otherwise)."""
        raise NotImplementedError

    def infer_items(self, columns: list[list[str]], pair: bool) -> list:
        """The items of a v2 request from its input columns (in `input_names` order)."""
        return columns[0]

    def warm_up(self, pair: bool) -> Any:
        """An item to run once before the first request (the first ONNX Runtime run allocates)."""
        return ("warm-up", "warm-up") if pair else "warm-up"

    # -- the session -------------------------------------------------------------------------------------------

    def prepare(self, session: Any) -> None:
        """What the session needs beyond its tokenizer and graph (question answering: the windowing)."""

    def encode(self, session: Any, items: list) -> list:
        """What the model runs for `items`: one encoding per text or pair (truncated to the session's max length;
        only the part of a long text that can reach the model is tokenised, `serving.bounded`). ArtifactError for
        items of the wrong type (pairs for a single-text artifact, ...); RequestError for a request it refuses."""
        if any(isinstance(t, tuple) != session.pair for t in items):
            want = "(text, text_pair) tuples" if session.pair else "strings"
            reads = "sentence pairs" if session.pair else "single texts"
            raise ArtifactError(f"{session.path} reads {reads}: pass {want}")
        return session.encoder.encode_batch(items)

    def encoding(self, item: Any) -> Encoding:
        """The tokenizer's encoding of one encoded item (what the graph runs)."""
        return item

    def check_encoded(self, encoded: list, config: Any) -> None:
        """Refuse (RequestError) a request whose encoded items pass a limit of the server's `config`."""

    def rows(self, outputs: list[np.ndarray], lengths: list[int]) -> np.ndarray:
        """The graph's outputs, one row per encoded item of `lengths` tokens (padding dropped where rows run over
        tokens)."""
        raise NotImplementedError

    def answer(self, session: Any, items: list, encoded: list, rows: np.ndarray, top_k: int | None,
               max_answer_len: int) -> list:  # fmt: skip
        """Per item, what the artifact answers, as transformers' pipeline of the kind answers it."""
        raise NotImplementedError

    # -- responses ---------------------------------------------------------------------------------------------

    def output_shapes(self, labels: list[str]) -> dict[str, tuple[str, list[int]]]:
        """The v2 metadata's outputs: (datatype, shape) by name."""
        return {name: (datatype, [-1]) for name, datatype in self.outputs.items()}

    def tensors(self, session: Any, items: list, encoded: list, rows: np.ndarray,
                wanted: tuple[str, ...]) -> dict[str, tuple[str, list[int], list]]:  # fmt: skip
        """The `wanted` v2 outputs as (datatype, shape, flat values), computed only when asked."""
        raise NotImplementedError

    def columns(self, found: list[dict], wanted: tuple[str, ...]) -> dict[str, tuple[str, list[int], list]]:
        """v2 outputs of one element per answer or entity of `found`."""
        return {name: (self.outputs[name], [len(found)], [row[name] for row in found]) for name in wanted}

    def predict(self, session: Any, req: PredictRequest, encoded: list, rows: np.ndarray) -> list:
        """`/predict`'s answer per item, in the shapes of transformers' pipeline."""
        return session.answer(req.texts, encoded, rows, req.top_k, req.max_answer_len)

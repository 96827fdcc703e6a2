"""Load an artifact for inference: manifest check, Rust tokenizer, one ONNX Runtime session. No torch.

The HTTP server builds on this; it is also the reference for "what the artifact predicts", for every task kind:
labels of a text or text pair (sequence classification), the entities of a text (token classification), the
answer to a question in a context (question answering; the context cut into overlapping windows).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from serving.artifact import (
    CONFIG,
    GRAPHS,
    TASK_KEY,
    TOKENIZER,
    ArtifactError,
    graphs_in,
    max_positions,
    task_kind,
    trained_length,
)
from serving.artifact import verify as verify_artifact
from serving.bounded import BoundedTokenizer
from serving.kinds import served_kind
from serving.spans import MAX_ANSWER_LEN
from serving.validation import Text


class ArtifactSession:
    """Tokenise a request's items and run the artifact's fp32, int8 or fp16 graph over them. Items are texts, or text
    pairs for an artifact of a sentence-pair task, or `Question`s for a question-answering artifact.

    `predict` is `answer(items, encoded, run(encoded))` with `encoded = encode(items)`: the server calls the
    three apart, `encode` on its tokeniser threads and `run` on its model thread (over the encodings of several
    requests), so that tokenising a large request holds up no other request's model call.

    Args:
        artifact: the artifact folder.
        precision: "fp32", "int8" or "fp16" (for CUDA; artifacts made before fp16 graphs have none).
        device: "cpu", or "cuda" (ONNX Runtime's CUDA provider, which onnxruntime-gpu has; refused in one line
            where it is absent).
        io_binding: feed inputs and take outputs through ORT's IOBinding (None: on CUDA, where it saves the
            copies ORT would make per call).
        threads: ONNX Runtime intra-op threads (None: ORT's default, the physical cores).
        max_length: tokens per text; longer texts are truncated (keeping the start). A question-answering
            context is cut into windows of `max_length` tokens (with its question) overlapping by `window_stride`.
            None: the length the artifact was trained at (its task block's `max_length`), else 128.
        verify: check every file against manifest.json first (`serving.artifact.verify`).
        trust_key: with `verify`, also refuse the artifact unless its signature verifies with this public key.
        spinning: let idle intra-op threads busy-wait (ORT's default). A server turns it off: spinning
            threads would take the cores that its event loop needs between batches.
        max_windows: most question-answering windows one `encode` call may cut its contexts into (None: no
            limit); tokenising stops, with a 413 `RequestError`, as soon as a request passes it.
    """

    def __init__(
        self,
        artifact: str | Path,
        precision: str = "fp32",
        threads: int | None = None,
        max_length: int | None = None,
        verify: bool = True,
        spinning: bool = True,
        trust_key: str | Path | None = None,
        max_windows: int | None = None,
        device: str = "cpu",
        io_binding: bool | None = None,
    ) -> None:
        self.path = Path(artifact)
        self.max_windows = max_windows
        if precision not in GRAPHS:
            raise ArtifactError(f"precision must be one of {', '.join(GRAPHS)}")
        if precision not in graphs_in(self.path):
            raise ArtifactError(f"{self.path} has no {GRAPHS[precision]} (made before {precision} graphs): serve "
                                "fp32 or int8, or deploy it again")  # fmt: skip
        providers = _providers(device)
        if verify:
            verify_artifact(self.path, (CONFIG, TOKENIZER, GRAPHS[precision]), trust_key)
        config = json.loads((self.path / CONFIG).read_text())
        self.kind = task_kind(config.get(TASK_KEY))
        self.served = served_kind(self.kind)
        max_length = max_length or trained_length(config.get(TASK_KEY))
        positions = max_positions(config)
        if positions is not None and max_length > positions:
            raise ArtifactError(f"max_length {max_length} exceeds the model's {positions} positions")
        self.tokenizer = Tokenizer.from_file(str(self.path / TOKENIZER))
        self.tokenizer.enable_truncation(max_length)
        self.tokenizer.no_padding()  # `run` pads: the texts of several requests, to the longest of them
        self.pad_id = config.get("pad_token_id") or 0
        self.encoder = BoundedTokenizer(self.tokenizer)
        self.precision = precision
        self.max_length = max_length
        so = ort.SessionOptions()
        if threads:
            so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        if not spinning:
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(str(self.path / GRAPHS[precision]), so, providers=providers)
        self.device = device
        self.io_binding = device == "cuda" if io_binding is None else io_binding
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.labels = _labels(config, self.session)
        self.task = config.get(TASK_KEY) or {}  # artifacts from before pair support have none: single texts
        self.pair = bool(self.task.get("pair"))
        self.outputs = [o.name for o in self.session.get_outputs()]  # logits, or start_logits and end_logits
        unk = getattr(self.tokenizer.model, "unk_token", None)
        self.unk_id = self.tokenizer.token_to_id(unk) if unk else None
        self.served.prepare(self)

    def encode(self, items: list) -> list:
        """What the model runs for `items`: one encoding per text or pair (truncated to `max_length`; only the
        part of a long text that can reach the model is tokenised, `serving.bounded`, the ids being those of the
        whole text), or for question answering the `QuestionWindow`s of every question. Thread-safe.

        Raises:
            ArtifactError: items of the wrong type for the artifact (pairs for a single-text one, ...).
            RequestError: a question that leaves its context no room in a window (422); more windows than
                `max_windows` (413).
        """
        return self.served.encode(self, items)

    def tokens(self, item: Any) -> int:
        """An encoded item's length in tokens (what it costs a model call once padded)."""
        return len(self.served.encoding(item).ids)

    def run(self, encoded: list) -> np.ndarray:
        """The graph's outputs, one row per encoded item (of one or more `encode` calls), padded to the longest:
        class logits [n, labels] for sequence classification; for the other kinds an object array of each item's
        rows without the padding (token classification: logits [tokens, labels]; question answering: a
        (start logits, end logits) pair over the window's tokens)."""
        encodings = [self.served.encoding(e) for e in encoded]
        width = max(1, max((len(e.ids) for e in encodings), default=0))
        ids = np.full((len(encodings), width), self.pad_id, dtype=np.int64)
        mask, types = np.zeros_like(ids), np.zeros_like(ids)
        for i, e in enumerate(encodings):
            n = len(e.ids)
            ids[i, :n], mask[i, :n], types[i, :n] = e.ids, e.attention_mask, e.type_ids
            if not mask[i].any():  # no tokens (an empty text, a tokenizer without [CLS]/[SEP]): one [PAD]
                mask[i, 0] = 1  # is attended, whatever the batch, instead of a failed or batch-dependent run
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        feeds = {n: feeds[n] for n in self.input_names}
        outputs = self._bound(feeds) if self.io_binding else self.session.run(self.outputs, feeds)
        return self.served.rows(outputs, [len(e.ids) for e in encodings])

    def _bound(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """One call through IOBinding: inputs copied to the device once, outputs left there by ORT and copied back
        once, instead of the per-call staging `run` does."""
        binding = self.session.io_binding()
        for name, value in feeds.items():
            binding.bind_cpu_input(name, value)
        for name in self.outputs:
            binding.bind_output(name, self.device)
        self.session.run_with_iobinding(binding)
        return binding.copy_outputs_to_cpu()

    def logits(self, texts: list[Text]) -> np.ndarray:
        """`run(encode(texts))`: one row of class logits per text (sequence classification)."""
        return self.run(self.encode(texts))

    def answer(
        self, items: list, encoded: list, rows: np.ndarray, top_k: int | None = 1, max_answer_len: int = MAX_ANSWER_LEN
    ) -> list:
        """Per item, what the artifact answers, from `encode(items)` and `run` of it: the `top_k` labels (None:
        all) with softmax scores, best first; the entities of a text, as transformers' token-classification
        pipeline groups them (aggregation "simple"); or the `top_k` answers to a question (spans of at most
        `max_answer_len` tokens), as its question-answering pipeline decodes them."""
        return self.served.answer(self, items, encoded, rows, top_k, max_answer_len)

    def predict(self, items: list, top_k: int | None = 1, max_answer_len: int = MAX_ANSWER_LEN) -> list:
        """`answer` of `items`, tokenised and run here."""
        encoded = self.encode(items)
        return self.answer(items, encoded, self.run(encoded), top_k, max_answer_len)


def _providers(device: str) -> list[str]:
    """ONNX Runtime's providers for `device`, CPU last (ORT places on it what CUDA has no kernel for)."""
    if device == "cpu":
        return ["CPUExecutionProvider"]
    if device != "cuda":
        raise ArtifactError(f"device must be cpu or cuda, not {device!r}")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise ArtifactError("device cuda: this onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu "
                            "on a machine with CUDA)")  # fmt: skip
    return ["CUDAExecutionProvider", "CPUExecutionProvider"]


def _labels(config: dict, session: ort.InferenceSession) -> list[str]:
    """`id2label` from config.json; without it (transformers omits the default LABEL_i names), from the graph."""
    if config.get("id2label"):
        return [config["id2label"][str(i)] for i in range(len(config["id2label"]))]
    n = session.get_outputs()[0].shape[-1]
    return [f"LABEL_{i}" for i in range(n if isinstance(n, int) else config.get("num_labels", 2))]

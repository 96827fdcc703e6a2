"""Load an artifact for inference: manifest check, Rust tokenizer, one ONNX Runtime session. No torch.

The HTTP server builds on this; it is also the reference for "what the artifact predicts".
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tokenizers import Encoding, Tokenizer

from serving.artifact import CONFIG, GRAPHS, SEQUENCE, TASK_KEY, TOKENIZER, ArtifactError, max_positions, task_kind
from serving.artifact import verify as verify_artifact
from serving.bounded import BoundedTokenizer
from serving.validation import Text


class ArtifactSession:
    """Tokenise texts (or text pairs, for an artifact of a sentence-pair task) and run its fp32 or int8 graph.

    `logits` is `run(encode(texts))`: the server calls the two apart, `encode` on its tokeniser threads and `run`
    on its model thread, so that tokenising a large request holds up no other request's model call.

    Args:
        artifact: the artifact folder.
        precision: "fp32" or "int8".
        threads: ONNX Runtime intra-op threads (None: ORT's default, the physical cores).
        max_length: tokens per text; longer texts are truncated (keeping the start).
        verify: check every file against manifest.json first (`serving.artifact.verify`).
        trust_key: with `verify`, also refuse the artifact unless its signature verifies with this public key.
        spinning: let idle intra-op threads busy-wait (ORT's default). A server turns it off: spinning
            threads would take the cores that its event loop needs between batches.
    """

    def __init__(
        self,
        artifact: str | Path,
        precision: str = "fp32",
        threads: int | None = None,
        max_length: int = 128,
        verify: bool = True,
        spinning: bool = True,
        trust_key: str | Path | None = None,
    ) -> None:
        self.path = Path(artifact)
        if precision not in GRAPHS:
            raise ArtifactError(f"precision must be one of {', '.join(GRAPHS)}")
        if verify:
            verify_artifact(self.path, (CONFIG, TOKENIZER, GRAPHS[precision]), trust_key)
        config = json.loads((self.path / CONFIG).read_text())
        kind = task_kind(config.get(TASK_KEY))
        if kind != SEQUENCE:
            raise ArtifactError(
                f"{self.path} is a {kind} artifact: this server answers sequence-classification "
                "artifacts (load it with Optimum and transformers' pipeline: see its README.md)"
            )
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
        self.session = ort.InferenceSession(str(self.path / GRAPHS[precision]), so, providers=["CPUExecutionProvider"])
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.labels = _labels(config, self.session)
        self.task = config.get(TASK_KEY) or {}  # artifacts from before pair support have none: single texts
        self.pair = bool(self.task.get("pair"))

    def encode(self, texts: list[Text]) -> list[Encoding]:
        """One encoding per item: strings for a single-text artifact, (text, text_pair) tuples for a pair artifact
        (two segments, token type ids 0 and 1, truncated longest first as the pipeline tokenised them). Only the
        part of a long text that `max_length` tokens can use is tokenised (`serving.bounded`); the ids are those
        of the whole text. Safe to call from several threads at once."""
        if any(isinstance(t, tuple) != self.pair for t in texts):
            want = "(text, text_pair) tuples" if self.pair else "strings"
            raise ArtifactError(f"{self.path} reads {'sentence pairs' if self.pair else 'single texts'}: pass {want}")
        return self.encoder.encode_batch(texts)

    @staticmethod
    def tokens(encoded: Encoding) -> int:
        """An encoded item's length in tokens (what it costs a model call once padded)."""
        return len(encoded.ids)

    def run(self, encoded: list[Encoding]) -> np.ndarray:
        """Logits, one row per encoding: the encodings (of one or more `encode` calls) padded to the longest."""
        width = max(1, max((len(e.ids) for e in encoded), default=0))
        ids = np.full((len(encoded), width), self.pad_id, dtype=np.int64)
        mask, types = np.zeros_like(ids), np.zeros_like(ids)
        for i, e in enumerate(encoded):
            n = len(e.ids)
            ids[i, :n], mask[i, :n], types[i, :n] = e.ids, e.attention_mask, e.type_ids
            if not mask[i].any():  # no tokens (an empty text, a tokenizer without [CLS]/[SEP]): one [PAD]
                mask[i, 0] = 1  # is attended, whatever the batch, instead of a failed or batch-dependent run
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        return self.session.run(["logits"], {n: feeds[n] for n in self.input_names})[0]

    def logits(self, texts: list[Text]) -> np.ndarray:
        """`run(encode(texts))`: one row of logits per item."""
        return self.run(self.encode(texts))

    def predict(self, texts: list[Text], top_k: int | None = 1) -> list[list[dict]]:
        """Per text, the `top_k` labels (None: all) with softmax scores, best first."""
        return top_labels(softmax(self.logits(texts)), self.labels, top_k)


def _labels(config: dict, session: ort.InferenceSession) -> list[str]:
    """`id2label` from config.json; without it (transformers omits the default LABEL_i names), from the graph."""
    if config.get("id2label"):
        return [config["id2label"][str(i)] for i in range(len(config["id2label"]))]
    n = session.get_outputs()[0].shape[-1]
    return [f"LABEL_{i}" for i in range(n if isinstance(n, int) else config.get("num_labels", 2))]


def softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def top_labels(scores: np.ndarray, labels: list[str], top_k: int | None = 1) -> list[list[dict]]:
    """Per row of `scores`, the `top_k` labels (None: all) with their scores, best first (ties: lower id)."""
    k = len(labels) if top_k is None else top_k
    return [
        [{"label": labels[j], "score": float(row[j])} for j in np.argsort(-row, kind="stable")[:k]] for row in scores
    ]

"""Load an artifact for inference: manifest check, Rust tokenizer, one ONNX Runtime session. No torch.

The HTTP server builds on this; it is also the reference for "what the artifact predicts".
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from serving.validation import Text

GRAPHS = {"fp32": "model.onnx", "int8": "model.int8.onnx"}
# The task block in an artifact's config.json (labels, text columns, pair, metric). The pipeline writes it under
# the same key (pipeline.data.tasks.TASK_KEY; a test holds them equal): the server imports nothing of the pipeline.
TASK_KEY = "encoder_deploy_task"


class ArtifactError(Exception):
    """The artifact folder is incomplete or does not match its manifest."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_integrity(artifact: Path, required: tuple[str, ...] = ()) -> None:
    """Refuse an artifact whose files differ from the sha256 recorded in its manifest, or whose manifest does
    not list every file in `required` (the files about to be loaded)."""
    try:
        manifest = json.loads((artifact / "manifest.json").read_text())
        files = dict(manifest["files"])
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ArtifactError(f"{artifact}: unreadable manifest.json ({type(e).__name__}: {e})") from None
    unlisted = [n for n in required if n not in files]
    if unlisted:
        raise ArtifactError(f"{artifact}: manifest.json does not list {', '.join(unlisted)}")
    bad = [n for n, d in files.items() if not (artifact / n).is_file() or _sha256(artifact / n) != d]
    if bad:
        raise ArtifactError(f"{artifact}: files differ from manifest.json: {', '.join(sorted(bad))}")


class ArtifactSession:
    """Tokenise texts (or text pairs, for an artifact of a sentence-pair task) and run its fp32 or int8 graph.

    Args:
        artifact: the artifact folder.
        precision: "fp32" or "int8".
        threads: ONNX Runtime intra-op threads (None: ORT's default, the physical cores).
        max_length: tokens per text; longer texts are truncated (keeping the start).
        verify: check every file against manifest.json first.
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
    ) -> None:
        self.path = Path(artifact)
        if precision not in GRAPHS:
            raise ArtifactError(f"precision must be one of {', '.join(GRAPHS)}")
        if verify:
            check_integrity(self.path, required=("config.json", "tokenizer.json", GRAPHS[precision]))
        config = json.loads((self.path / "config.json").read_text())
        positions = _max_positions(config)
        if positions is not None and max_length > positions:
            raise ArtifactError(f"max_length {max_length} exceeds the model's {positions} positions")
        self.tokenizer = Tokenizer.from_file(str(self.path / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length)
        self.pad_id = config.get("pad_token_id") or 0
        self.tokenizer.enable_padding(pad_id=self.pad_id, pad_token=self.tokenizer.id_to_token(self.pad_id) or "[PAD]")
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

    def logits(self, texts: list[Text]) -> np.ndarray:
        """One row per item: strings for a single-text artifact, (text, text_pair) tuples for a pair artifact
        (two segments, token type ids 0 and 1, truncated longest first as the pipeline tokenised them)."""
        if any(isinstance(t, tuple) != self.pair for t in texts):
            want = "(text, text_pair) tuples" if self.pair else "strings"
            raise ArtifactError(f"{self.path} reads {'sentence pairs' if self.pair else 'single texts'}: pass {want}")
        enc = self.tokenizer.encode_batch(texts)
        width = max(1, len(enc[0].ids))
        ids = np.full((len(enc), width), self.pad_id, dtype=np.int64)
        mask, types = np.zeros_like(ids), np.zeros_like(ids)
        for i, e in enumerate(enc):
            if e.ids:
                ids[i], mask[i], types[i] = e.ids, e.attention_mask, e.type_ids
            if not mask[i].any():  # no tokens (an empty text, a tokenizer without [CLS]/[SEP]): one [PAD]
                mask[i, 0] = 1  # is attended, whatever the batch, instead of a failed or batch-dependent run
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        return self.session.run(["logits"], {n: feeds[n] for n in self.input_names})[0]

    def predict(self, texts: list[Text], top_k: int | None = 1) -> list[list[dict]]:
        """Per text, the `top_k` labels (None: all) with softmax scores, best first."""
        return top_labels(softmax(self.logits(texts)), self.labels, top_k)


def _max_positions(config: dict) -> int | None:
    """Tokens the position embeddings cover (RoBERTa-style models start counting after the pad id)."""
    n = config.get("max_position_embeddings")
    if n is None:
        return None
    if config.get("model_type") in ("roberta", "xlm-roberta", "camembert"):
        n -= (config.get("pad_token_id") or 1) + 1
    return n


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

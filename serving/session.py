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

GRAPHS = {"fp32": "model.onnx", "int8": "model.int8.onnx"}


class ArtifactError(Exception):
    """The artifact folder is incomplete or does not match its manifest."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_integrity(artifact: Path) -> None:
    """Refuse an artifact whose files differ from the sha256 recorded in its manifest."""
    try:
        manifest = json.loads((artifact / "manifest.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ArtifactError(f"{artifact}: unreadable manifest.json ({e})") from None
    bad = [n for n, d in manifest["files"].items() if not (artifact / n).is_file() or _sha256(artifact / n) != d]
    if bad:
        raise ArtifactError(f"{artifact}: files differ from manifest.json: {', '.join(sorted(bad))}")


class ArtifactSession:
    """Tokenise texts and run the artifact's fp32 or int8 graph.

    Args:
        artifact: the artifact folder.
        precision: "fp32" or "int8".
        threads: ONNX Runtime intra-op threads (None: ORT's default, the physical cores).
        max_length: tokens per text; longer texts are truncated (keeping the start).
        verify: check every file against manifest.json first.
    """

    def __init__(self, artifact: str | Path, precision: str = "fp32", threads: int | None = None,
                 max_length: int = 128, verify: bool = True) -> None:
        self.path = Path(artifact)
        if precision not in GRAPHS:
            raise ArtifactError(f"precision must be one of {', '.join(GRAPHS)}")
        if verify:
            check_integrity(self.path)
        config = json.loads((self.path / "config.json").read_text())
        self.labels = [config["id2label"][str(i)] for i in range(len(config["id2label"]))]
        self.tokenizer = Tokenizer.from_file(str(self.path / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length)
        pad_id = config.get("pad_token_id") or 0
        self.tokenizer.enable_padding(pad_id=pad_id, pad_token=self.tokenizer.id_to_token(pad_id) or "[PAD]")
        so = ort.SessionOptions()
        if threads:
            so.intra_op_num_threads = threads
        self.session = ort.InferenceSession(str(self.path / GRAPHS[precision]), so, providers=["CPUExecutionProvider"])
        self.input_names = [i.name for i in self.session.get_inputs()]

    def logits(self, texts: list[str]) -> np.ndarray:
        enc = self.tokenizer.encode_batch(texts)
        feeds = {
            "input_ids": np.array([e.ids for e in enc], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in enc], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in enc], dtype=np.int64),
        }
        return self.session.run(["logits"], {n: feeds[n] for n in self.input_names})[0]

    def predict(self, texts: list[str], top_k: int | None = 1) -> list[list[dict]]:
        """Per text, the `top_k` labels (None: all) with softmax scores, best first."""
        logits = self.logits(texts)
        z = np.exp(logits - logits.max(-1, keepdims=True))
        probs = z / z.sum(-1, keepdims=True)
        k = len(self.labels) if top_k is None else top_k
        return [
            [{"label": self.labels[j], "score": float(p[j])} for j in np.argsort(-p)[:k]]
            for p in probs
        ]

"""Run an ONNX graph over the same batches as torch, and compare its prediction rows. The one parity
implementation (validation's gates, `pipeline evaluate`, the benchmarks' accuracy columns)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from export.sessions import make_session
from pipeline import interrupts
from pipeline.data.encoding import iter_batches
from pipeline.kinds.base import Encoded
from pipeline.train.metrics import join_rows, longest, output_rows


def onnx_logits(path: str | Path, enc: Encoded, batch_size: int = 64) -> np.ndarray:
    """The ONNX graph's prediction rows for every feature (`pipeline.train.metrics`), batched and padded exactly
    as `predict_logits` does, from every output of the graph (logits; or start and end logits)."""
    session = make_session(path)
    names = [i.name for i in session.get_inputs()]
    outputs = [o.name for o in session.get_outputs()]
    out, width = [], longest(enc)
    for batch in iter_batches(enc, batch_size):
        interrupts.check()  # a stop during a long validation ends it within a batch
        values = session.run(outputs, {n: batch[n].numpy() for n in names})
        named = SimpleNamespace(**{k: torch.from_numpy(v) for k, v in zip(outputs, values, strict=True)})
        out.append(output_rows(named, batch, width))
    return join_rows(out, enc)


@dataclass(frozen=True)
class ParityReport:
    """Two models' prediction rows compared: the largest difference, and whether they predict alike: the same
    class for every row (argmax agreement), or for vectors (embeddings) each row's cosine similarity, the least
    at or above `cosine_limit`."""

    max_abs_diff: float
    argmax_agreement: float | None  # fraction of examples with the same predicted class; None for vectors
    examples: int
    atol: float | None
    min_cosine: float | None = None  # vectors: the least cosine similarity of a row to its reference
    cosine_limit: float | None = None

    @property
    def passed(self) -> bool:
        if self.atol is None or self.max_abs_diff > self.atol:
            return False
        if self.cosine_limit is not None:
            return self.min_cosine is not None and self.min_cosine >= self.cosine_limit
        return self.argmax_agreement == 1.0

    def as_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed}


def compare_logits(
    reference: np.ndarray, candidate: np.ndarray, atol: float | None = None, cosine_limit: float | None = None
) -> ParityReport:
    """Compare rows of logits by argmax, or, with `cosine_limit`, rows of vectors by each row's cosine."""
    if reference.shape != candidate.shape:
        raise ValueError(f"logit shapes differ: {reference.shape} vs {candidate.shape}")
    agreement, least = None, None
    if cosine_limit is None:
        agreement = float((reference.argmax(-1) == candidate.argmax(-1)).mean())
    else:
        ref, cand = reference.astype(np.float64), candidate.astype(np.float64)
        norms = np.linalg.norm(ref, axis=-1) * np.linalg.norm(cand, axis=-1)
        least = float(((ref * cand).sum(-1) / np.maximum(norms, 1e-12)).min())
    return ParityReport(
        max_abs_diff=float(np.abs(reference - candidate).max()),
        argmax_agreement=agreement,
        examples=int(reference.shape[0]),
        atol=atol,
        min_cosine=least,
        cosine_limit=cosine_limit,
    )

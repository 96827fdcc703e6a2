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
    max_abs_diff: float
    argmax_agreement: float  # fraction of examples with the same predicted class
    examples: int
    atol: float | None

    @property
    def passed(self) -> bool:
        return self.atol is not None and self.max_abs_diff <= self.atol and self.argmax_agreement == 1.0

    def as_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed}


def compare_logits(reference: np.ndarray, candidate: np.ndarray, atol: float | None = None) -> ParityReport:
    if reference.shape != candidate.shape:
        raise ValueError(f"logit shapes differ: {reference.shape} vs {candidate.shape}")
    return ParityReport(
        max_abs_diff=float(np.abs(reference - candidate).max()),
        argmax_agreement=float((reference.argmax(-1) == candidate.argmax(-1)).mean()),
        examples=int(reference.shape[0]),
        atol=atol,
    )

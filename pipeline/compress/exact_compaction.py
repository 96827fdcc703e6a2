"""Compaction of a saved model, proven: the compact stage's work, and what a chain does between two methods."""

from __future__ import annotations

from pipeline.compress.compaction import compact_
from pipeline.data.encoding import encode
from pipeline.data.loaders import DataRef
from pipeline.errors import GateError
from pipeline.models.folders import load_tokenizer
from pipeline.models.io import load_model, save_model
from pipeline.train.metrics import predict_logits


def compact_folder(
    compressed_dir: str, ref: DataRef, out_dir: str, atol: float, max_length: int, max_examples: int = 256
) -> dict:
    """Compact the compressed model into `out_dir` and prove it exact on validation inputs (GateError otherwise):
    logits within `atol` of the uncompacted model's, and the saved folder reloading bit-exactly."""
    tokenizer = load_tokenizer(compressed_dir)
    model = load_model(compressed_dir)
    split = ref.load().validation
    inputs = encode(tokenizer, split.head(max_examples), max_length)
    before = predict_logits(model, inputs)
    report = compact_(model)
    after = predict_logits(model, inputs)
    diff = float(abs(before - after).max())
    report.update(max_abs_diff=diff, atol=atol, examples=len(inputs), max_length=max_length)
    if not diff <= atol:
        raise GateError(f"compaction changed logits by {diff:.2e} (> {atol:.0e})")
    save_model(model, tokenizer, out_dir)
    reloaded = predict_logits(load_model(out_dir), inputs)
    if float(abs(reloaded - after).max()) != 0.0:
        raise GateError(f"compacted model does not reload exactly from {out_dir}")
    report["params"] = sum(p.numel() for p in model.parameters())
    return report

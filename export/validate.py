"""Validation gates over the whole dev set: compacted torch ≡ ONNX fp32, int8 within budget, task metrics.

A failed gate raises `GateError`; the flow then discards the staging folder, so nothing is published.
"""

from __future__ import annotations

import logging
from pathlib import Path

from export.parity import ParityReport, compare_logits, onnx_logits
from pipeline.config.schema import Gates
from pipeline.data.encoding import encode
from pipeline.data.loaders import DataRef
from pipeline.errors import GateError
from pipeline.models.folders import load_tokenizer
from pipeline.models.io import load_model
from pipeline.train.metrics import predict_logits, scores

log = logging.getLogger(__name__)


def gate_failures(
    parity: ParityReport,
    int8_drop: float,
    gates: Gates,
    metric: str,
    teacher: float,
    compressed: float,
) -> list[str]:
    """The failed gates, each as a sentence (empty: all passed). `teacher` and `compressed` are the task metric
    (`metric`) of the dense teacher and of the compressed ONNX fp32 graph on dev, in points."""
    failures = []
    if not parity.passed:
        failures.append(
            f"ONNX fp32 vs torch: max |Δ logits| {parity.max_abs_diff:.2e} (limit {gates.onnx_atol:.0e}), "
            f"argmax agreement {parity.argmax_agreement:.4f}"
        )
    if int8_drop > gates.int8_max_drop:
        failures.append(f"int8 accuracy {int8_drop:.2f} points below fp32 (limit {gates.int8_max_drop})")
    if teacher - compressed > gates.max_metric_drop:
        failures.append(
            f"compressed {metric} {compressed:.2f} is {teacher - compressed:.2f} points below the teacher's "
            f"{teacher:.2f} (gates.max_metric_drop {gates.max_metric_drop})"
        )
    return failures


def validate(
    staging: str, teacher_dir: str, ref: DataRef, gates: Gates, max_length: int, teacher_max_length: int
) -> dict:
    """Score teacher, compressed torch, ONNX fp32 and int8 on dev; check parity; raise on a failed gate.

    Each model sees dev tokenised as it was trained: `max_length` for the compressed model, `teacher_max_length`
    for the teacher.
    """
    staging_path = Path(staging)
    data = ref.load()
    tokenizer = load_tokenizer(staging_path / "pytorch")
    dev = encode(tokenizer, data.dev, max_length)
    teacher_dev = encode(load_tokenizer(teacher_dir), data.dev, teacher_max_length)

    logits = {
        "teacher": predict_logits(load_model(teacher_dir), teacher_dev),
        "teacher_onnx_fp32": onnx_logits(staging_path / ".work" / "dense.onnx", teacher_dev),
        "compressed_torch": predict_logits(load_model(staging_path / "pytorch"), dev),
        "onnx_fp32": onnx_logits(staging_path / "model.onnx", dev),
        "onnx_int8": onnx_logits(staging_path / "model.int8.onnx", dev),
    }
    metrics = {name: scores(v, dev.labels) for name, v in logits.items()}
    parity = compare_logits(logits["compressed_torch"], logits["onnx_fp32"], gates.onnx_atol)
    teacher_parity = compare_logits(logits["teacher"], logits["teacher_onnx_fp32"], gates.onnx_atol)
    int8_drop = metrics["onnx_fp32"]["accuracy"] - metrics["onnx_int8"]["accuracy"]
    report = {
        "dev_examples": len(dev),
        "metrics": metrics,
        "onnx_parity": parity.as_dict(),
        "teacher_onnx_parity": teacher_parity.as_dict(),
        "int8_accuracy_drop": round(int8_drop, 3),
        "gates": gates.model_dump(),
    }
    metric = data.task.metric
    teacher_score, compressed_score = metrics["teacher"][metric], metrics["onnx_fp32"][metric]
    report.update(metric=metric, metric_drop=round(teacher_score - compressed_score, 3), max_length=max_length)
    failures = gate_failures(parity, int8_drop, gates, metric, teacher_score, compressed_score)
    report["passed"] = not failures
    for name, m in metrics.items():
        log.info("dev %-18s %s", name, {k: round(v, 2) for k, v in m.items()})
    if failures:
        raise GateError("validation failed: " + "; ".join(failures))
    return report

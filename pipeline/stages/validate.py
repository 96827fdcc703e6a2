"""The validate stage: gates on the validation split carved from train (compacted torch ≡ ONNX fp32, int8 and fp16
within budget of fp32, task metric within budget of the teacher); dev, the test, scored alongside and only
reported.

A failed gate raises `GateError`; the flow then discards the staging folder, so nothing is published.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from pipeline.config.schema import Gates
from pipeline.data.encoding import encode
from pipeline.data.loaders import DataRef
from pipeline.errors import GateError
from pipeline.kinds import kind_of
from pipeline.models.folders import load_tokenizer
from pipeline.models.io import load_model
from pipeline.report import parity_words
from pipeline.staging import DENSE_GRAPHS, WORK
from pipeline.train.metrics import predict_logits, scores
from pipeline.train.parity import ParityReport, compare_logits, onnx_logits
from serving.artifact import GRAPHS, PYTORCH

log = logging.getLogger(__name__)


def gate_failures(
    parity: ParityReport,
    int8_drop: float,
    gates: Gates,
    metric: str,
    teacher: float,
    compressed: float,
    fp16: dict | None = None,
) -> list[str]:
    """The failed gates, each as a sentence (empty: all passed). `teacher` and `compressed` are the task metric
    (`metric`) of the dense teacher and of the compressed ONNX fp32 graph on the validation split, in points;
    `fp16`, the fp16 graph against ONNX fp32 (`fp16_check`)."""
    failures = []
    if fp16 is not None and not fp16["passed"]:
        failures.append(f"fp16 graph: {fp16['why']}")
    if not parity.passed:
        cosine = "" if parity.cosine_limit is None else f", least cosine {parity.cosine_limit}"
        failures.append(
            f"ONNX fp32 vs torch: {parity_words(parity.as_dict())} (limits: max |Δ| {gates.onnx_atol:.0e}{cosine})"
        )
    if int8_drop > gates.int8_max_drop:
        failures.append(f"int8 {metric} {int8_drop:.2f} points below fp32 (limit {gates.int8_max_drop})")
    if teacher - compressed > gates.max_metric_drop:
        failures.append(
            f"compressed {metric} {compressed:.2f} is {teacher - compressed:.2f} points below the teacher's "
            f"{teacher:.2f} on the validation split (gates.max_metric_drop {gates.max_metric_drop})"
        )
    return failures


def fp16_check(fp32: np.ndarray, fp16: np.ndarray, drop: float, gates: Gates, vectors: bool) -> dict:
    """The fp16 graph (CUDA's, run here on whichever provider there is) against ONNX fp32 on validation: the same
    class for nearly every row (`gates.fp16_min_agreement`; vectors: each row's cosine, `gates.fp16_min_cosine`)
    and the task metric within `gates.fp16_max_drop` points."""
    parity = compare_logits(fp32, fp16, None, gates.fp16_min_cosine if vectors else None)
    why = []
    if vectors and parity.min_cosine < gates.fp16_min_cosine:
        why.append(f"least cosine {parity.min_cosine:.6f} to fp32 (limit {gates.fp16_min_cosine})")
    if not vectors and parity.argmax_agreement < gates.fp16_min_agreement:
        why.append(f"argmax agreement {parity.argmax_agreement:.4f} with fp32 (limit {gates.fp16_min_agreement})")
    if drop > gates.fp16_max_drop:
        why.append(f"{drop:.2f} points below fp32 (limit {gates.fp16_max_drop})")
    return {"parity": parity.as_dict(), "metric_drop": round(drop, 3), "passed": not why, "why": "; ".join(why)}


def run(staging: str, teacher_dir: str, ref: DataRef, gates: Gates, max_length: int, teacher_max_length: int) -> dict:
    """Score teacher, compressed torch, ONNX fp32, int8 and fp16 on validation and dev; raise on a failed gate.

    The gates decide whether the artifact ships, so they look at the validation split carved from train; dev is
    the test and is only reported. Each model sees the text tokenised as it was trained: `max_length` for the
    compressed model, `teacher_max_length` for the teacher.
    """
    staging_path = Path(staging)
    data = ref.load()
    kind = kind_of(data.task.kind)
    tokenizer, teacher_tokenizer = load_tokenizer(staging_path / PYTORCH), load_tokenizer(teacher_dir)
    teacher, compressed = load_model(teacher_dir), load_model(staging_path / PYTORCH)
    splits, logits, metrics = {}, {}, {}
    for name, split in (("validation", data.validation), ("dev", data.dev)):
        enc, teacher_enc = encode(tokenizer, split, max_length), encode(teacher_tokenizer, split, teacher_max_length)
        logits[name] = {
            "teacher": predict_logits(teacher, teacher_enc),
            "teacher_onnx_fp32": onnx_logits(staging_path / WORK / DENSE_GRAPHS["fp32"], teacher_enc),
            "teacher_onnx_int8": onnx_logits(staging_path / WORK / DENSE_GRAPHS["int8"], teacher_enc),
            "compressed_torch": predict_logits(compressed, enc),
            "onnx_fp32": onnx_logits(staging_path / GRAPHS["fp32"], enc),
            "onnx_int8": onnx_logits(staging_path / GRAPHS["int8"], enc),
            "onnx_fp16": onnx_logits(staging_path / GRAPHS["fp16"], enc),
        }
        metrics[name] = {model: scores(v, teacher_enc if model.startswith("teacher") else enc)
                         for model, v in logits[name].items()}  # fmt: skip
        mixed = {model: kind.mixed_scores(logits[name][model], logits[name]["teacher"], enc)
                 for model in ("compressed_torch", "onnx_fp32", "onnx_int8")}  # fmt: skip
        if all(v is not None for v in mixed.values()):  # a student's queries against the teacher's index
            metrics[name].update({f"{model}_x_teacher": v for model, v in mixed.items()})
        splits[name] = len(split)  # examples (QA: questions, not their windows)
    val = logits["validation"]
    cosine = gates.onnx_min_cosine if kind.vectors else None
    parity = compare_logits(val["compressed_torch"], val["onnx_fp32"], gates.onnx_atol, cosine)
    teacher_parity = compare_logits(val["teacher"], val["teacher_onnx_fp32"], gates.onnx_atol, cosine)
    chosen = metrics["validation"]
    metric = data.task.metric
    int8_drop = chosen["onnx_fp32"][metric] - chosen["onnx_int8"][metric]
    teacher_score, compressed_score = chosen["teacher"][metric], chosen["onnx_fp32"][metric]
    fp16_drop = compressed_score - chosen["onnx_fp16"][metric]
    fp16 = fp16_check(val["onnx_fp32"], val["onnx_fp16"], fp16_drop, gates, bool(kind.vectors))
    report = {
        "examples": splits,
        "gated_on": "validation",
        "metrics": metrics,
        "onnx_parity": parity.as_dict(),
        "teacher_onnx_parity": teacher_parity.as_dict(),
        "int8_metric_drop": round(int8_drop, 3),
        "fp16": {k: v for k, v in fp16.items() if k != "why"},
        "gates": gates.model_dump(),
        "metric": metric,
        "metric_drop": round(teacher_score - compressed_score, 3),
        "dev_metric_drop": round(metrics["dev"]["teacher"][metric] - metrics["dev"]["onnx_fp32"][metric], 3),
        "max_length": max_length,
    }
    failures = gate_failures(parity, int8_drop, gates, metric, teacher_score, compressed_score, fp16)
    report["passed"] = not failures
    for split, per_model in metrics.items():
        for name, m in per_model.items():
            log.info("%-10s %-18s %s", split, name, {k: round(v, 2) for k, v in m.items()})
    if failures:
        raise GateError("validation failed: " + "; ".join(failures))
    return report

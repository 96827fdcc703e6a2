"""Validation gates on the validation split carved from train: compacted torch ≡ ONNX fp32, int8 within budget,
task metric within budget of the teacher; dev (the test) scored alongside and only reported.

A failed gate raises `GateError`; the flow then discards the staging folder, so nothing is published.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from export.parity import ParityReport, compare_logits, onnx_logits
from pipeline.config.schema import DataLimits, Gates
from pipeline.data.encoding import encode
from pipeline.data.loaders import DataRef, resolve_source
from pipeline.data.tasks import load_task_file, task_spec
from pipeline.errors import GateError, PipelineError
from pipeline.models.folders import load_tokenizer
from pipeline.models.io import load_model
from pipeline.train.metrics import predict_logits, scores
from serving.artifact import CONFIG, GRAPHS, MANIFEST, REPORT_JSON, TOKENIZER, ArtifactError, verify

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
    (`metric`) of the dense teacher and of the compressed ONNX fp32 graph on the validation split, in points."""
    failures = []
    if not parity.passed:
        failures.append(
            f"ONNX fp32 vs torch: max |Δ logits| {parity.max_abs_diff:.2e} (limit {gates.onnx_atol:.0e}), "
            f"argmax agreement {parity.argmax_agreement:.4f}"
        )
    if int8_drop > gates.int8_max_drop:
        failures.append(f"int8 {metric} {int8_drop:.2f} points below fp32 (limit {gates.int8_max_drop})")
    if teacher - compressed > gates.max_metric_drop:
        failures.append(
            f"compressed {metric} {compressed:.2f} is {teacher - compressed:.2f} points below the teacher's "
            f"{teacher:.2f} on the validation split (gates.max_metric_drop {gates.max_metric_drop})"
        )
    return failures


def validate(
    staging: str, teacher_dir: str, ref: DataRef, gates: Gates, max_length: int, teacher_max_length: int
) -> dict:
    """Score teacher, compressed torch, ONNX fp32 and int8 on validation and dev; raise on a failed gate.

    The gates decide whether the artifact ships, so they look at the validation split carved from train; dev is
    the test and is only reported. Each model sees the text tokenised as it was trained: `max_length` for the
    compressed model, `teacher_max_length` for the teacher.
    """
    staging_path = Path(staging)
    data = ref.load()
    tokenizer, teacher_tokenizer = load_tokenizer(staging_path / "pytorch"), load_tokenizer(teacher_dir)
    teacher, compressed = load_model(teacher_dir), load_model(staging_path / "pytorch")
    splits, logits, metrics = {}, {}, {}
    for name, split in (("validation", data.validation), ("dev", data.dev)):
        enc, teacher_enc = encode(tokenizer, split, max_length), encode(teacher_tokenizer, split, teacher_max_length)
        logits[name] = {
            "teacher": predict_logits(teacher, teacher_enc),
            "teacher_onnx_fp32": onnx_logits(staging_path / ".work" / "dense.onnx", teacher_enc),
            "teacher_onnx_int8": onnx_logits(staging_path / ".work" / "dense.int8.onnx", teacher_enc),
            "compressed_torch": predict_logits(compressed, enc),
            "onnx_fp32": onnx_logits(staging_path / "model.onnx", enc),
            "onnx_int8": onnx_logits(staging_path / "model.int8.onnx", enc),
        }
        metrics[name] = {model: scores(v, enc.labels) for model, v in logits[name].items()}
        splits[name] = len(enc)
    val = logits["validation"]
    parity = compare_logits(val["compressed_torch"], val["onnx_fp32"], gates.onnx_atol)
    teacher_parity = compare_logits(val["teacher"], val["teacher_onnx_fp32"], gates.onnx_atol)
    chosen = metrics["validation"]
    metric = data.task.metric
    int8_drop = chosen["onnx_fp32"][metric] - chosen["onnx_int8"][metric]
    teacher_score, compressed_score = chosen["teacher"][metric], chosen["onnx_fp32"][metric]
    report = {
        "examples": splits,
        "gated_on": "validation",
        "metrics": metrics,
        "onnx_parity": parity.as_dict(),
        "teacher_onnx_parity": teacher_parity.as_dict(),
        "int8_metric_drop": round(int8_drop, 3),
        "gates": gates.model_dump(),
        "metric": metric,
        "metric_drop": round(teacher_score - compressed_score, 3),
        "dev_metric_drop": round(metrics["dev"]["teacher"][metric] - metrics["dev"]["onnx_fp32"][metric], 3),
        "max_length": max_length,
    }
    failures = gate_failures(parity, int8_drop, gates, metric, teacher_score, compressed_score)
    report["passed"] = not failures
    for split, per_model in metrics.items():
        for name, m in per_model.items():
            log.info("%-10s %-18s %s", split, name, {k: round(v, 2) for k, v in m.items()})
    if failures:
        raise GateError("validation failed: " + "; ".join(failures))
    return report


def evaluate_artifact(
    artifact: Path,
    data_dir: str | None,
    split: str,
    max_examples: int | None = None,
    task_file: str | None = None,
    trust_key: str | None = None,
) -> dict:
    """The task metric of a published artifact's fp32 and int8 graphs on a labelled split of its task, tokenised
    as the artifact was validated (its report's max_length). The validation split is carved with the run's own
    data settings (the manifest's config), so `--split validation` is the split its gates saw. A user's task
    reads the files its definition names (the manifest's), or those of `task_file` (the same task, moved). The
    artifact is checked as the server checks it: its files against the manifest, its signature with `trust_key`."""
    artifact = Path(artifact)
    if not (artifact / REPORT_JSON).is_file() or not (artifact / MANIFEST).is_file():
        raise PipelineError(f"{artifact} is not an artifact folder (no {REPORT_JSON} and {MANIFEST})")
    try:
        verify(artifact, (REPORT_JSON, CONFIG, TOKENIZER, *GRAPHS.values()), trust_key)
    except ArtifactError as e:
        raise PipelineError(f"refusing to evaluate: {e}") from None
    if split not in ("train", "validation", "dev"):
        raise PipelineError(f"unknown split {split!r}: train, validation or dev")
    report = json.loads((artifact / REPORT_JSON).read_text())
    config = json.loads((artifact / MANIFEST).read_text())["config"]
    limits = DataLimits.model_validate(config["data"])
    custom = config.get("custom_task")
    if task_file is not None:
        custom = load_task_file(task_file)
        if custom.name != report["task"]:
            raise PipelineError(f"{task_file} defines task {custom.name!r}; the artifact is for {report['task']!r}")
    task = task_spec(report["task"], custom)
    source = resolve_source(task, data_dir, False)
    ref = DataRef(task, source, str(Path(data_dir).resolve()) if data_dir else None, validation=limits.validation)
    data = getattr(ref.load(), split).head(max_examples)
    enc = encode(load_tokenizer(artifact), data, report["validation"]["max_length"])
    metrics = {f"onnx_{p}": scores(onnx_logits(artifact / f, enc), enc.labels) for p, f in GRAPHS.items()}
    return {"artifact": str(artifact), "task": task.name, "split": split, "examples": len(enc),
            "metric": task.metric, "metrics": metrics}  # fmt: skip

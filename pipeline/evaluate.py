"""`pipeline evaluate`: score a published artifact's ONNX graphs on a labelled split of its task, after checking it
as the server does (its files against the manifest, and its signature with a trusted key)."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.config.schema import DataLimits
from pipeline.data.encoding import encode
from pipeline.data.loaders import DataRef, resolve_source
from pipeline.data.tasks import load_task_file, task_spec
from pipeline.errors import PipelineError
from pipeline.models.folders import load_tokenizer
from pipeline.train.metrics import scores
from pipeline.train.parity import onnx_logits
from serving.artifact import (
    CONFIG,
    EMBEDDING,
    MANIFEST,
    REPORT_JSON,
    TOKENIZER,
    ArtifactError,
    graphs_in,
    read_manifest,
    verify,
)


def evaluate_artifact(
    artifact: Path,
    data_dir: str | None,
    split: str,
    max_examples: int | None = None,
    task_file: str | None = None,
    trust_key: str | None = None,
    task_name: str | None = None,
) -> dict:
    """The task metric of a published artifact's graphs (fp32, int8, and fp16 where it has one) on a labelled split
    of its task, tokenised as the artifact was validated (its report's max_length). The validation split is carved
    with the run's own data settings (the manifest's config), so `--split validation` is the split its gates saw.
    A user's task reads the files its definition names (the manifest's), or those of `task_file` (the same task,
    moved). The artifact is checked as the server checks it: its files against the manifest, its signature with
    `trust_key`. `task_name`: another built-in task of the same kind, for embedders only (vectors answer any
    embedding task: an STS-B student scored on SQuAD retrieval)."""
    artifact = Path(artifact)
    if not (artifact / REPORT_JSON).is_file() or not (artifact / MANIFEST).is_file():
        raise PipelineError(f"{artifact} is not an artifact folder (no {REPORT_JSON} and {MANIFEST})")
    try:
        verify(artifact, (REPORT_JSON, CONFIG, TOKENIZER, *graphs_in(artifact).values()), trust_key)
    except ArtifactError as e:
        raise PipelineError(f"refusing to evaluate: {e}") from None
    if split not in ("train", "validation", "dev"):
        raise PipelineError(f"unknown split {split!r}: train, validation or dev")
    report = json.loads((artifact / REPORT_JSON).read_text())
    config = read_manifest(artifact)["config"]
    limits = DataLimits.model_validate(config["data"])
    custom = config.get("custom_task")
    if task_file is not None:
        custom = load_task_file(task_file)
        if custom.name != report["task"]:
            raise PipelineError(f"{task_file} defines task {custom.name!r}; the artifact is for {report['task']!r}")
    task = task_spec(report["task"], custom)
    if task_name is not None and task_name != task.name:
        other = task_spec(task_name, None)
        if not task.kind == other.kind == EMBEDDING:
            raise PipelineError(
                f"--task {task_name} is {other.kind}: an artifact is scored on another task only when both are "
                f"{EMBEDDING} tasks (this one: {task.kind}, {task.name})"
            )
        task, custom = other, None
    source = resolve_source(task, data_dir, False)
    ref = DataRef(task, source, str(Path(data_dir).resolve()) if data_dir else None, validation=limits.validation)
    data = getattr(ref.load(), split).head(max_examples)
    enc = encode(load_tokenizer(artifact), data, report["validation"]["max_length"])
    metrics = {f"onnx_{p}": scores(onnx_logits(artifact / f, enc), enc) for p, f in graphs_in(artifact).items()}
    return {"artifact": str(artifact), "task": task.name, "split": split, "examples": len(data),
            "metric": task.metric, "metrics": metrics}  # fmt: skip

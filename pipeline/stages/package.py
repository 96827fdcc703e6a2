"""The package stage: report, model card and manifest written into the staging folder (`pipeline.staging`), which
is then published by one rename after every gate.

Layout: model.onnx (fused fp32), model.int8.onnx, config.json (id2label, per-layer heads and FFN widths, the task
block: labels, text columns, pair or not, metric), tokenizer files, pytorch/ (compacted safetensors), report.json,
report.md, latency.png, README.md (the model card), manifest.json (sha256 of every file, versions, inputs, config,
the task, git revision), and with a signing key model.sig.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import shutil
import subprocess
import time
from pathlib import Path

from export.onnx import library_versions
from pipeline import interrupts
from pipeline.data.tasks import task_spec
from pipeline.errors import PipelineError
from pipeline.model_card import base_model_info, render_model_card
from pipeline.models.folders import installed_default_model_path
from pipeline.report import render_markdown
from pipeline.staging import WORK, published_name, release, task_block
from serving.artifact import (
    MANIFEST,
    MODEL_CARD,
    REPORT_JSON,
    REPORT_MD,
    ArtifactError,
    sha256,
    sign,
)

log = logging.getLogger(__name__)

VERSIONED = ("torch", "transformers", "optimum", "optimum-onnx", "onnx", "onnxruntime", "prefect", "encoder-deploy")


def versions() -> dict[str, str]:
    """The versions that made the artifact (ONNX Runtime's as the imported module says: `library_versions`)."""
    return {"python": platform.python_version(), **library_versions(VERSIONED)}


def git_revision() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=5
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _model_card(report: dict, task: dict | None, inputs: dict, config: dict) -> str:
    task = task or {"name": report["task"], "labels": [], "pair": False}
    spec = task_spec(config["task"], config.get("custom_task")) if "task" in config else None
    default = installed_default_model_path() if inputs.get("model") else None
    base = base_model_info(inputs.get("model"), default)
    return render_model_card(report, task, base, spec.hf_dataset if spec else None)


def run(staging: str | Path, report: dict, inputs: dict, config: dict, sign_key: str | None = None) -> Path:
    """Write report, model card and manifest (and, with `sign_key`, the signature over every file), drop the work
    files, and rename the staging folder into place."""
    staging = Path(staging)
    final = staging.parent / published_name(staging)
    if final.exists():
        raise PipelineError(f"artifact {final} already exists")
    shutil.rmtree(staging / WORK, ignore_errors=True)
    report = {**report, "versions": versions(), "artifact": final.name}
    (staging / REPORT_JSON).write_text(json.dumps(report, indent=2, default=str))
    (staging / REPORT_MD).write_text(render_markdown(report))
    task = task_block(staging)
    (staging / MODEL_CARD).write_text(_model_card(report, task, inputs, config))
    files = sorted(p for p in staging.rglob("*") if p.is_file())
    manifest = {
        "artifact": final.name,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "files": {str(p.relative_to(staging)): sha256(p) for p in files},
        "versions": report["versions"],
        "git_revision": git_revision(),
        "inputs": inputs,
        "config": config,
        "task": task,
    }
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str))
    if sign_key is not None:
        try:
            sign(staging, sign_key)
        except ArtifactError as e:
            raise PipelineError(str(e)) from None
    with interrupts.publishing(str(final)):
        os.replace(staging, final)
    release(staging)
    return final

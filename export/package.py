"""The artifact folder: staged under a hidden name, published by one rename after every gate passed.

Layout: model.onnx (fused fp32), model.int8.onnx, config.json (id2label, per-layer heads and FFN widths),
tokenizer files, pytorch/ (compacted safetensors), report.json, report.md, latency.png, manifest.json
(sha256 of every file, versions, inputs, config, git revision).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shutil
import subprocess
import time
from importlib import metadata
from pathlib import Path

from export.report import render_markdown
from pipeline.cache import file_digest
from pipeline.errors import PipelineError

STAGING_PREFIX = ".staging-"
VERSIONED = ("torch", "transformers", "optimum", "optimum-onnx", "onnx", "onnxruntime", "prefect", "encoder-deploy")


def check_output_dir(output_dir: str | Path) -> Path:
    """The folder that receives artifact folders; it may not exist yet, but must not be a file."""
    out = Path(output_dir)
    if out.exists() and not out.is_dir():
        raise PipelineError(f"output path {out} is a file, not a folder")
    return out


def artifact_name(task: str, method: str, salt: str) -> str:
    short = hashlib.sha256(f"{salt}{time.time_ns()}".encode()).hexdigest()[:8]
    return f"{task}-{method}-{short}"


def new_staging(output_dir: str | Path, name: str) -> Path:
    """Create the hidden staging folder for artifact `name` inside `output_dir`."""
    out = check_output_dir(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    staging = out / f"{STAGING_PREFIX}{name}"
    staging.mkdir()
    (staging / ".work").mkdir()
    return staging


def discard(staging: str | Path) -> None:
    """Remove a staging folder (after a failure): nothing half-written stays behind."""
    shutil.rmtree(staging, ignore_errors=True)


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for dist in VERSIONED:
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[dist] = metadata.version(dist)
    return found


def git_revision() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=5
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def published_name(staging: str | Path) -> str:
    """The artifact folder's name once the staging folder is published."""
    return Path(staging).name.removeprefix(STAGING_PREFIX)


def publish(staging: str | Path, report: dict, inputs: dict, config: dict) -> Path:
    """Write report and manifest, drop the work files, and rename the staging folder into place."""
    staging = Path(staging)
    final = staging.parent / published_name(staging)
    if final.exists():
        raise PipelineError(f"artifact {final} already exists")
    shutil.rmtree(staging / ".work", ignore_errors=True)
    report = {**report, "versions": versions(), "artifact": final.name}
    (staging / "report.json").write_text(json.dumps(report, indent=2, default=str))
    (staging / "report.md").write_text(render_markdown(report))
    files = sorted(p for p in staging.rglob("*") if p.is_file())
    manifest = {
        "artifact": final.name,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "files": {str(p.relative_to(staging)): file_digest(p) for p in files},
        "versions": report["versions"],
        "git_revision": git_revision(),
        "inputs": inputs,
        "config": config,
    }
    (staging / "manifest.json").write_text(json.dumps(manifest, indent=2, default=str))
    os.replace(staging, final)
    return final

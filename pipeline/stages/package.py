"""The package stage: the artifact folder, staged under a hidden name, published by one rename after every gate.

A staging folder is owned by the run that holds the exclusive lock on its `.lock` file beside it (taken before
the folder exists, released by the kernel when the process dies): a run that was killed (SIGKILL, power loss)
leaves a staging folder nobody holds, and the next run into the same output folder removes it. Live runs'
staging folders are never touched, so concurrent runs into one folder are safe.

Layout: model.onnx (fused fp32), model.int8.onnx, config.json (id2label, per-layer heads and FFN widths, the task
block: labels, text columns, pair or not, metric), tokenizer files, pytorch/ (compacted safetensors), report.json,
report.md, latency.png, README.md (the model card), manifest.json (sha256 of every file, versions, inputs, config,
the task, git revision), and with a signing key model.sig.
"""

from __future__ import annotations

import fcntl
import hashlib
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
from pipeline.paths import check_writable_dir
from pipeline.report import render_markdown
from serving.artifact import (
    CONFIG,
    MANIFEST,
    MODEL_CARD,
    PYTORCH,
    REPORT_JSON,
    REPORT_MD,
    TASK_KEY,
    ArtifactError,
    sha256,
    sign,
)

log = logging.getLogger(__name__)

STAGING_PREFIX = ".staging-"
WORK = ".work"  # inside a staging folder: what the run needs but does not publish (the dense graphs)
_held: dict[Path, int] = {}  # staging folder -> the descriptor holding its lock, for this process's live runs
VERSIONED = ("torch", "transformers", "optimum", "optimum-onnx", "onnx", "onnxruntime", "prefect", "encoder-deploy")


def artifact_name(task: str, method: str, salt: str) -> str:
    short = hashlib.sha256(f"{salt}{time.time_ns()}".encode()).hexdigest()[:8]
    return f"{task}-{method}-{short}"


def _lock_path(staging: Path) -> Path:
    return staging.with_name(staging.name + ".lock")


def remove_dead_stagings(output_dir: str | Path) -> list[Path]:
    """Remove the staging folders in `output_dir` whose run is gone (nobody holds their lock); return them."""
    removed = []
    for staging in sorted(Path(output_dir).glob(f"{STAGING_PREFIX}*")):
        if not staging.is_dir() or staging in _held:
            continue
        lock = _lock_path(staging)
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # a live run holds it
            os.close(fd)
            continue
        try:
            log.info("removing %s, left by a run that was killed", staging)
            shutil.rmtree(staging, ignore_errors=True)
            lock.unlink(missing_ok=True)
            removed.append(staging)
        finally:
            os.close(fd)
    return removed


def new_staging(output_dir: str | Path, name: str) -> Path:
    """Create and lock the hidden staging folder for artifact `name` inside `output_dir`, first removing the
    staging folders of killed runs."""
    out = check_writable_dir(output_dir, "output folder")
    out.mkdir(parents=True, exist_ok=True)
    remove_dead_stagings(out)
    staging = out / f"{STAGING_PREFIX}{name}"
    fd = os.open(_lock_path(staging), os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a fresh name: nobody else waits on it
    _held[staging] = fd
    interrupts.on_hard_exit(discard_held)  # a process that ends without unwinding leaves no staging folder
    staging.mkdir()
    (staging / WORK).mkdir()
    return staging


def _release(staging: Path) -> None:
    fd = _held.pop(staging, None)
    _lock_path(staging).unlink(missing_ok=True)
    if fd is not None:
        os.close(fd)


def discard(staging: str | Path) -> None:
    """Remove a staging folder (after a failure): nothing half-written stays behind."""
    staging = Path(staging)
    shutil.rmtree(staging, ignore_errors=True)
    _release(staging)


def discard_held() -> None:
    """Remove every staging folder this process holds (a stopped run ending without unwinding)."""
    for staging in list(_held):
        discard(staging)


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


def stamp_task(staging: str | Path, task: dict) -> None:
    """Write the task block into the artifact's config.json files (root: ONNX Runtime, Optimum, serving; pytorch/:
    transformers), so every consumer knows the labels and whether the model reads sentence pairs."""
    for path in (Path(staging) / CONFIG, Path(staging) / PYTORCH / CONFIG):
        if path.is_file():
            config = json.loads(path.read_text())
            path.write_text(json.dumps({**config, TASK_KEY: task}, indent=2, sort_keys=True) + "\n")


def _task_block(staging: Path) -> dict | None:
    path = staging / CONFIG
    return json.loads(path.read_text()).get(TASK_KEY) if path.is_file() else None


def _model_card(report: dict, task: dict | None, inputs: dict, config: dict) -> str:
    task = task or {"name": report["task"], "labels": [], "pair": False}
    spec = task_spec(config["task"], config.get("custom_task")) if "task" in config else None
    default = installed_default_model_path() if inputs.get("model") else None
    base = base_model_info(inputs.get("model"), default)
    return render_model_card(report, task, base, spec.hf_dataset if spec else None)


def published_name(staging: str | Path) -> str:
    """The artifact folder's name once the staging folder is published."""
    return Path(staging).name.removeprefix(STAGING_PREFIX)


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
    task = _task_block(staging)
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
    _release(staging)
    return final

"""The staging layout every deploy writes into: a hidden staging folder per artifact, its `.work/` part that is
never published (the dense teacher's graphs, for the benchmark), the task block stamped into its config files,
and the one rename that publishes it. The stages write into this layout and the run engine (`pipeline.run`)
creates, publishes and discards it; neither needs the other to know where things go.

A staging folder is owned by the run that holds the exclusive lock on its `.lock` file beside it (taken before
the folder exists, released by the kernel when the process dies): a run that was killed (SIGKILL, power loss)
leaves a staging folder nobody holds, and the next run into the same output folder removes it. Live runs'
staging folders are never touched, so concurrent runs into one folder are safe.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path

from pipeline import interrupts
from pipeline.paths import check_writable_dir
from serving.artifact import CONFIG, PYTORCH, TASK_KEY

log = logging.getLogger(__name__)

STAGING_PREFIX = ".staging-"
WORK = ".work"  # inside a staging folder: what the run needs but does not publish (the dense graphs)
DENSE_STEM = "dense"
DENSE_GRAPHS = {"fp32": f"{DENSE_STEM}.onnx", "int8": f"{DENSE_STEM}.int8.onnx"}  # in WORK, for the benchmark
DENSE_FP16 = f"{DENSE_STEM}.fp16.onnx"  # in WORK where the benchmark times CUDA: a GPU user's dense baseline
# in WORK where the kind has it: sentence-transformers' own int8 export of the dense model (embeddings' baseline)
ST_DENSE_INT8 = "st-dense.int8.onnx"
_held: dict[Path, int] = {}  # staging folder -> the descriptor holding its lock, for this process's live runs


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


def release(staging: Path) -> None:
    fd = _held.pop(staging, None)
    _lock_path(staging).unlink(missing_ok=True)
    if fd is not None:
        os.close(fd)


def discard(staging: str | Path) -> None:
    """Remove a staging folder (after a failure): nothing half-written stays behind."""
    staging = Path(staging)
    shutil.rmtree(staging, ignore_errors=True)
    release(staging)


def discard_held() -> None:
    """Remove every staging folder this process holds (a stopped run ending without unwinding)."""
    for staging in list(_held):
        discard(staging)


def published_name(staging: str | Path) -> str:
    """The artifact folder's name once the staging folder is published."""
    return Path(staging).name.removeprefix(STAGING_PREFIX)


def stamp_task(staging: str | Path, task: dict) -> None:
    """Write the task block into the artifact's config.json files (root: ONNX Runtime, Optimum, serving; pytorch/:
    transformers), so every consumer knows the labels and whether the model reads sentence pairs."""
    for path in (Path(staging) / CONFIG, Path(staging) / PYTORCH / CONFIG):
        if path.is_file():
            config = json.loads(path.read_text())
            path.write_text(json.dumps({**config, TASK_KEY: task}, indent=2, sort_keys=True) + "\n")


def task_block(staging: Path) -> dict | None:
    path = staging / CONFIG
    return json.loads(path.read_text()).get(TASK_KEY) if path.is_file() else None

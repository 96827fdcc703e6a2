"""A content-addressed cache of stage outputs (fine-tuned teachers, compressed models, the dense ONNX export).

A key is the sha256 of everything that determines the output (input model digest, data fingerprint, config,
method). An entry is built in a temporary folder and renamed into place only when complete, so an
interrupted run never leaves a half-written entry that a later run would trust. One builder per key at a time:
a second run asking for the same key waits on the key's lock and then reuses the finished entry, and the lock
holder removes what a crashed builder left behind (the kernel releases a dead process's lock). A build's training
checkpoints live beside the entry in `.KEY.resume` (`pipeline.checkpoints`): a crashed build's are kept, and
the next build of the key resumes from them; they go once the entry is complete.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pipeline import checkpoints, distributed
from serving.artifact import sha256

log = logging.getLogger(__name__)

DONE = ".complete"
REPORT = "stage.json"  # what the stage that built an entry reports of it, kept beside it


def default_cache_dir() -> Path:
    root = (
        os.environ.get("PIPELINE_CACHE_DIR")
        or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "encoder-deploy"
    )
    return Path(root)


def dir_digest(folder: Path) -> str:
    """sha256 over the relative names and contents of every file in `folder`."""
    folder = Path(folder)
    h = hashlib.sha256()
    for p in sorted(x for x in folder.rglob("*") if x.is_file() and x.name != DONE):
        h.update(str(p.relative_to(folder)).encode() + b"\0" + sha256(p).encode())
    return h.hexdigest()


def key_of(**parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:20]


@contextlib.contextmanager
def _locked(lock_file: Path) -> Iterator[None]:
    """An exclusive lock on `lock_file` (created if needed) for the duration of the block."""
    with lock_file.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def cached_build(
    root: Path, stage: str, key: str, build: Callable[[Path], None], trains: bool = False
) -> tuple[Path, bool]:
    """Return (entry folder, hit). On a miss, `build(tmp_folder)` fills a temporary folder first.

    Under torchrun rank 0 alone decides and writes; the other ranks follow its hit or miss and wait until its
    entry is in place. A build that `trains` runs on every rank (training is collective), the others' into a
    throwaway folder (transformers 5 writes models on rank 0 only)."""
    final = Path(root) / stage / key
    if not distributed.is_main():
        return _follow_main(final, key, build, trains)
    if (final / DONE).is_file():
        distributed.from_main(True)
        return final, True
    final.parent.mkdir(parents=True, exist_ok=True)
    with _locked(final.parent / f".{key}.lock"):
        if distributed.from_main((final / DONE).is_file()):  # another run built it while this one waited
            return final, True
        for leftover in [*final.parent.glob(f".{key}-*"), final]:  # a crashed builder's; nobody else holds the key
            if leftover.is_dir():
                log.info("cache: removing %s, left by an interrupted build", leftover)
                shutil.rmtree(leftover)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=final.parent))
        resume = final.parent / f".{key}.resume"
        try:
            with checkpoints.scope(resume):
                build(tmp)
            (tmp / DONE).write_text("")
            os.replace(tmp, final)
            distributed.barrier()  # the other ranks are done reading the checkpoints; the entry is theirs to read
            shutil.rmtree(resume, ignore_errors=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final, False


def _follow_main(final: Path, key: str, build: Callable[[Path], None], trains: bool) -> tuple[Path, bool]:
    """A rank other than 0: rank 0's hit, or its entry once built (a training build: the same build beside it,
    into a folder that is thrown away)."""
    if distributed.from_main(False):
        return final, True
    if not trains:
        distributed.barrier()
        return final, False
    resume = final.parent / f".{key}.resume"  # rank 0's checkpoints, read when resuming
    with tempfile.TemporaryDirectory(prefix=f"{key}-rank{distributed.rank()}-") as tmp, checkpoints.scope(resume):
        build(Path(tmp))
    distributed.barrier()
    return final, False


def cached_stage(
    cache_dir: str | Path,
    folder: str,
    key_parts: dict[str, Any],
    build: Callable[[Path], dict],
    trains: bool = False,
) -> tuple[Path, bool, dict]:
    """A stage's cached output: the entry keyed by `key_parts` (`key_of`) under `folder`, built on a miss by
    `build(entry)`, whose returned report is kept beside the entry (`trains`: the build trains, on every rank under
    torchrun). Returns (entry, hit, report): a hit reports what the build did."""

    def built(out: Path) -> None:
        write_report(out, build(out))

    path, hit = cached_build(Path(cache_dir), folder, key_of(**key_parts), built, trains)
    return path, hit, read_report(path)


def write_report(folder: Path, report: dict) -> None:
    """Keep a stage's report beside the entry it built (a cache hit then reports what the build did)."""
    (Path(folder) / REPORT).write_text(json.dumps(report, indent=2, default=str))


def read_report(folder: Path) -> dict:
    f = Path(folder) / REPORT
    return json.loads(f.read_text()) if f.is_file() else {}

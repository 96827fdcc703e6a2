"""Resumable training: a stage's training phases checkpoint every N steps, so a killed run resumes from its last
checkpoint instead of from zero (a 12-layer model's stage takes hours on a CPU; a machine can be lost mid-way).

A stage that builds a cache entry opens a `scope` on a folder keyed like the entry (the cache does it), so a
checkpoint is only ever resumed by a run that would build the very same entry; the folder goes once the entry is
complete. Phases are numbered in the order the stage starts them (distill's transfer, then its task phase; SMP's
mask training, then recovery). A finished phase keeps its final state, so a resumed stage replays the cheap work
between phases and skips the training it already did. Files are written under a temporary name and renamed, and
read back with `weights_only=True` (tensors and plain containers, nothing else unpickled).

`PIPELINE_CHECKPOINT_EVERY` sets the interval in steps (default 200; 0 turns checkpoints off).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import PipelineError

log = logging.getLogger(__name__)

ENV = "PIPELINE_CHECKPOINT_EVERY"
DEFAULT_EVERY = 200


def interval() -> int:
    raw = os.environ.get(ENV, str(DEFAULT_EVERY))
    try:
        every = int(raw)
    except ValueError:
        every = -1
    if every < 0:
        raise PipelineError(f"{ENV}={raw!r}: expected a number of steps (0 turns checkpoints off)")
    return every


@dataclass
class _Scope:
    folder: Path
    every: int
    started: int = 0  # phases started so far in this scope


_current: ContextVar[_Scope | None] = ContextVar("checkpoint_scope", default=None)


@contextlib.contextmanager
def scope(folder: Path) -> Iterator[None]:
    """Training phases started inside the block checkpoint into `folder` (and resume from what it holds)."""
    token = _current.set(_Scope(Path(folder), interval()))
    try:
        yield
    finally:
        _current.reset(token)


@dataclass(frozen=True)
class Phase:
    """One training phase's checkpoint file."""

    path: Path
    every: int
    desc: str

    def load(self) -> dict[str, Any] | None:
        if not self.path.is_file():
            return None
        import torch

        state = torch.load(self.path, map_location="cpu", weights_only=True)
        if state.get("desc") != self.desc:  # the stage's phases changed order: not this phase's state
            log.warning("checkpoint %s is of phase %r, not %r: ignored", self.path, state.get("desc"), self.desc)
            return None
        return state

    def save(self, state: dict[str, Any]) -> None:
        import torch

        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            torch.save({**state, "desc": self.desc}, tmp)
            os.replace(tmp, self.path)
        finally:
            tmp.unlink(missing_ok=True)


def next_phase(desc: str) -> Phase | None:
    """The checkpoint of the next training phase of the current scope; None outside a scope or when turned off."""
    current = _current.get()
    if current is None or current.every == 0:
        return None
    index, current.started = current.started, current.started + 1
    return Phase(current.folder / f"phase-{index:02d}.pt", current.every, desc)

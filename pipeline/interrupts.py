"""Stopping a run: the first SIGINT or SIGTERM stops it, whatever stage it is in, and nothing is published.

Python's default SIGINT handler raises KeyboardInterrupt wherever the main thread happens to be; when that is a
cleanup function (an asyncio transport's `__del__`, a weakref callback), Python prints "Exception ignored" and
drops it, and the run went on to publish. Prefect, during a flow run, turns SIGTERM into its own exception, which
its engine may handle as a crash and wait on. So the `pipeline` commands arm this module's handler: it records
the signal, which nothing can drop, and raises `Interrupted`; `check()` raises it again at every stage boundary,
every training step and just before publishing, so a dropped raise costs at most one step of work.

Exit codes follow the shell: 128 + the signal number (130 for SIGINT, 143 for SIGTERM). A second signal while
the run cleans up (removing its staging folder) is recorded and ignored; a third ends the process at once (a
staging folder it leaves is removed by the next run into the same output folder).

Publishing is one rename, made inside `publishing()`: a signal that arrived before it stops the run there; one that
arrives during or after it is recorded, not raised, and the artifact stands (`published()` names it), so no run
ever says "nothing was published" about an artifact it published.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_received: list[int] = []  # every stop signal since the process armed (disarm() clears), in order
_previous: dict[int, object] = {}
_published: list[str] = []  # what this process published since it armed (disarm() clears)
_holding = False  # inside `publishing()`: a signal is recorded, not raised


class Interrupted(BaseException):
    """The run was asked to stop. A BaseException, so no `except Exception` in a stage or a library keeps it."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"interrupted by {signal.Signals(signum).name}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def _handler(signum: int, frame: FrameType | None) -> None:
    _received.append(signum)
    if len(_received) >= 3:
        os._exit(128 + _received[0])
    if len(_received) == 1 and not _holding:
        raise Interrupted(signum)


def arm() -> None:
    """Install the handler for SIGINT and SIGTERM (main thread only; elsewhere a no-op). Arming again keeps what
    was received: `pipeline` arms as it starts, and each command again around its work."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in SIGNALS:
        previous = signal.signal(sig, _handler)
        _previous.setdefault(sig, previous)


def rearm() -> None:
    """Put the handler back where a library replaced it (Prefect's flow engine installs its own for SIGTERM), if
    this process armed it: inside a Prefect worker's flow-run process the library's own handling stays."""
    if _previous and threading.current_thread() is threading.main_thread():
        for sig in SIGNALS:
            signal.signal(sig, _handler)


def disarm() -> None:
    """Restore the handlers that were there before `arm()` (tests; a command that ends)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig, previous in _previous.items():
        signal.signal(sig, previous)
    _previous.clear()
    _received.clear()
    _published.clear()


def received() -> int | None:
    """The first stop signal received since the handler was first armed (after `disarm()`), if any."""
    return _received[0] if _received else None


def check() -> None:
    """Raise `Interrupted` if a stop signal arrived, even one whose first raise was dropped."""
    if _received:
        raise Interrupted(_received[0])


@contextlib.contextmanager
def publishing(what: str) -> Iterator[None]:
    """Around the rename that publishes `what`: stop here if a signal came first, else publish whatever comes."""
    global _holding
    check()  # the last moment a stop signal can keep the artifact from appearing
    _holding = True
    try:
        yield
        _published.append(what)
    finally:
        _holding = False


def published() -> list[str]:
    """What this process published since the handler was first armed (after `disarm()`)."""
    return list(_published)

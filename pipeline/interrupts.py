"""Stopping a run: the first SIGINT or SIGTERM stops it, whatever stage it is in, and nothing is published.

Python's default SIGINT handler raises KeyboardInterrupt wherever the main thread happens to be; when that is a
cleanup function (an asyncio transport's `__del__`, a weakref callback), Python prints "Exception ignored" and
drops it, and the run went on to publish. Prefect, during a flow run, turns SIGTERM into its own exception, which
its engine may handle as a crash and wait on. So the `pipeline` commands arm this module's handler: it records
the signal, which nothing can drop, and raises `Interrupted`; `check()` raises it again at every stage boundary,
every training step and just before publishing, so a dropped raise costs at most one step of work.

Exit codes follow the shell: 128 + the signal number (130 for SIGINT, 143 for SIGTERM). A second signal while
the run cleans up (removing its staging folder) is recorded and ignored; a third ends the process at once. So does
a deadline, `PIPELINE_STOP_GRACE_S` (60) seconds after the first signal: a library can hang while it unwinds
(Prefect's crash handling once waited past two minutes after a SIGINT landed in a task). Either way the process
first runs the cleanups registered with `on_hard_exit` (the package stage removes its staging folders) and says
the same one `error:` line as a run that unwound.

Publishing is one rename, made inside `publishing()`: a signal that arrived before it stops the run there; one that
arrives during or after it is recorded, not raised, and the artifact stands (`published()` names it), so no run
ever says "nothing was published" about an artifact it published.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType

from pipeline.errors import PipelineError

SIGNALS = (signal.SIGINT, signal.SIGTERM)
GRACE_ENV = "PIPELINE_STOP_GRACE_S"
DEFAULT_GRACE_S = 60.0
_received: list[int] = []  # every stop signal since the process armed (disarm() clears), in order
_previous: dict[int, object] = {}
_published: list[str] = []  # what this process published since it armed (disarm() clears)
_holding = False  # inside `publishing()`: a signal is recorded, not raised
_hard_exit_cleanups: list[Callable[[], None]] = []
_deadline: threading.Timer | None = None  # started by the first signal, cancelled by disarm()


class Interrupted(BaseException):
    """The run was asked to stop. A BaseException, so no `except Exception` in a stage or a library keeps it."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"interrupted by {signal.Signals(signum).name}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def grace_s() -> float:
    """Seconds a stopped run has to unwind before the process ends itself (`PIPELINE_STOP_GRACE_S`)."""
    raw = os.environ.get(GRACE_ENV, "")
    try:
        grace = float(raw) if raw else DEFAULT_GRACE_S
    except ValueError:
        grace = -1.0
    if not 0 < grace < float("inf"):
        raise PipelineError(f"{GRACE_ENV}={raw!r}: expected a number of seconds above 0")
    return grace


def on_hard_exit(cleanup: Callable[[], None]) -> None:
    """Run `cleanup` if the process has to end without unwinding (a third signal, the deadline)."""
    if cleanup not in _hard_exit_cleanups:
        _hard_exit_cleanups.append(cleanup)


def _hard_exit(why: str) -> None:
    if not _received:  # disarmed in the meantime: the command ended on its own
        return
    for cleanup in list(_hard_exit_cleanups):
        with contextlib.suppress(Exception):  # ending is the point: a failing cleanup must not keep the process
            cleanup()
    sys.stderr.write(f"note: {why}; ending the process\nerror: {stopped_line(_received[0])}\n")
    sys.stderr.flush()
    os._exit(128 + _received[0])


def _start_deadline() -> None:
    global _deadline
    try:
        grace = grace_s()
    except PipelineError:  # a command checks it as it starts; a signal handler is no place to refuse it
        grace = DEFAULT_GRACE_S
    _deadline = threading.Timer(grace, _hard_exit, args=(f"the run had not stopped {grace:g} s after the signal",))
    _deadline.daemon = True
    _deadline.start()


def _handler(signum: int, frame: FrameType | None) -> None:
    _received.append(signum)
    if len(_received) >= 3:
        _hard_exit("a third stop signal")
    if len(_received) == 1:
        _start_deadline()
        if not _holding:
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
    """Restore the handlers that were there before `arm()` (tests; a command that ends), and stop the deadline."""
    global _deadline
    if threading.current_thread() is not threading.main_thread():
        return
    if _deadline is not None:
        _deadline.cancel()
        _deadline = None
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


def stopped_line(signum: int) -> str:
    """What a stopped command says after `error: `: the signal and what it published before it, if anything."""
    before = f"; published before it: {', '.join(_published)}" if _published else ""
    return f"{Interrupted(signum)}; nothing{' more' if _published else ''} was published{before}"


def published() -> list[str]:
    """What this process published since the handler was first armed (after `disarm()`)."""
    return list(_published)

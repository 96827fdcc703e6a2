"""A watchdog that ends a run's helper processes when the run dies, however it dies.

`pipeline deploy` starts helpers it does not spawn itself: Prefect's ephemeral API server (a uvicorn process), a
sweep's Dask scheduler, nannies and workers. When the run is killed (SIGKILL, the OOM killer, a native crash)
they are re-parented to init and live on, a 220 MB server each time. Nothing inside a process can act after its
own SIGKILL, so `start()` launches this small process beside the run, in a session of its own (a terminal's
Ctrl-C does not reach it). It notes the run's descendants every `POLL_S` seconds; once the run is gone it ends
every one of them still alive (SIGTERM, then SIGKILL after `GRACE_S`), and then itself. When the run exits
normally it does the same to anything left behind, then exits.

Processes are identified by pid and start time, so a recycled pid is never killed.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

import psutil

POLL_S = 0.5
GRACE_S = 5.0


def start() -> subprocess.Popen | None:
    """Watch this process; returns the watchdog (None where it could not start: the run goes on without it)."""
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "pipeline.watchdog", str(os.getpid())],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
    except OSError:
        return None


def _key(p: psutil.Process) -> tuple[int, float] | None:
    try:
        return p.pid, p.create_time()
    except psutil.Error:
        return None


def _descendants(root: psutil.Process) -> dict[tuple[int, float], psutil.Process]:
    try:
        found = root.children(recursive=True)
    except psutil.Error:
        return {}
    return {k: p for p in found if (k := _key(p)) is not None}


def end_processes(procs: list[psutil.Process], grace_s: float = GRACE_S) -> None:
    """SIGTERM each process (and what it has started since), then SIGKILL whatever is left after `grace_s`."""
    everyone = {k: p for p in procs if (k := _key(p)) is not None}
    for p in list(everyone.values()):
        everyone.update(_descendants(p))
    me = os.getpid()
    alive = [p for p in everyone.values() if p.pid != me]
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, still = psutil.wait_procs(alive, timeout=grace_s)
    for p in still:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(still, timeout=grace_s)


def _alive(p: psutil.Process) -> bool:
    try:  # is_running() compares start times: a recycled pid is not the run
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def watch(pid: int) -> None:
    """Note `pid`'s descendants until it is gone, then end them."""
    try:
        run = psutil.Process(pid)
    except psutil.Error:
        return
    seen: dict[tuple[int, float], psutil.Process] = {}
    while _alive(run):
        seen.update(_descendants(run))
        seen = {k: p for k, p in seen.items() if _alive(p)}
        time.sleep(POLL_S)
    end_processes(list(seen.values()))


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not argv[0].isdigit():
        print("usage: python -m pipeline.watchdog PID", file=sys.stderr)
        return 2
    watch(int(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

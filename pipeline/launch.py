"""Training stages on several processes: `--nproc N` (or `PIPELINE_LAUNCHER`) runs each training stage (teacher,
KD teacher, compress, general distillation) under torchrun, from inside the stage's own call (the flow's task).

The task writes the stage's arguments to a spec file (JSON, each argument through its type hint: nothing is
pickled), starts the launcher, and waits. Every rank (`python -m pipeline.launch SPEC`) joins the process group
and calls the same stage function; `pipeline.distributed` makes its training data-parallel and lets rank 0 alone
write the cache and the checkpoints. Rank 0's report comes back to the task, so the flow, the cache and the
report are those of a single-process run. A rank that fails or is killed ends the launcher (torchrun stops the
others); the task then fails in one line naming the rank, and keeps the launcher's log for the details.

`PIPELINE_LAUNCHER` is the launcher command for more than one machine (docs/distributed.md), e.g.
`torchrun --nnodes 2 --node-rank 0 --nproc-per-node 8 --master-addr HEAD --master-port 29500`; a bare `torchrun`
means one machine, `--nproc` processes (or one per GPU). Across machines the spec goes to `PIPELINE_RANKS_DIR`, a
folder every machine sees (as it sees the cache), where `pipeline join` on each other machine picks it up and
starts that machine's ranks with its own launcher (`--node-rank 1`, ...).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import typing
from collections.abc import Callable, Iterator
from pathlib import Path

from pipeline import distributed, interrupts
from pipeline.errors import GateError, PipelineError

log = logging.getLogger(__name__)

NPROC_ENV = "PIPELINE_NPROC"
LAUNCHER_ENV = "PIPELINE_LAUNCHER"
RANKS_DIR_ENV = "PIPELINE_RANKS_DIR"  # where launches are written for the other machines' `pipeline join`
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]  # `torchrun`, from this interpreter's torch
REPORT, LAUNCHER_LOG = "report.json", "launcher.log"
STOP_WAIT_S = 30.0  # after a stop signal, how long the ranks have to unwind before they are killed
ERRORS = {"PipelineError": PipelineError, "GateError": GateError}  # what a rank's failure is re-raised as


TRAINING = ("teacher", "kd_teacher", "compress", "general")  # the stages that train: what a rank may be asked to run


def _stages() -> dict[str, Callable[..., dict]]:
    """Each training stage's plain function, by name."""
    from pipeline.stages import compress, general, kd_teacher, teacher

    return {"teacher": teacher.run, "kd_teacher": kd_teacher.run, "compress": compress.run, "general": general.run}


@contextlib.contextmanager
def processes(nproc: int) -> Iterator[None]:
    """Training stages called inside the block run on `nproc` processes (1: in this one, unless PIPELINE_NPROC
    or PIPELINE_LAUNCHER, as a work pool may set them, say otherwise)."""
    if nproc <= 1:
        yield
        return
    before = os.environ.get(NPROC_ENV)
    os.environ[NPROC_ENV] = str(nproc)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(NPROC_ENV, None)
        else:
            os.environ[NPROC_ENV] = before


def nproc() -> int:
    raw = os.environ.get(NPROC_ENV, "1")
    if not raw.isdigit() or int(raw) < 1:
        raise PipelineError(f"{NPROC_ENV}={raw!r}: expected a number of processes (1 or more)")
    return int(raw)


def launcher(raw: str | None = None) -> list[str] | None:
    """The launcher command a training stage runs under (`raw`, else PIPELINE_LAUNCHER, else --nproc's torchrun), or
    None to train in this process."""
    raw, n = (os.environ.get(LAUNCHER_ENV, "") if raw is None else raw).strip(), nproc()
    if not raw:
        return None if n == 1 else [*TORCHRUN, "--standalone", f"--nproc-per-node={n}"]
    words = shlex.split(raw)
    if words[0] == "torchrun":
        words = [*TORCHRUN, *words[1:]]
    elif words[1:3] != ["-m", "torch.distributed.run"]:
        raise PipelineError(f"{LAUNCHER_ENV}={raw!r}: expected a torchrun command (torchrun --nnodes ... )")
    if not any(w.startswith(("--nproc-per-node", "--nproc_per_node")) for w in words):
        words.append(f"--nproc-per-node={n if n > 1 else 'auto'}")  # auto: one per GPU, else one
    if not any(w.startswith(("--standalone", "--rdzv", "--nnodes", "--master")) for w in words):
        words.append("--standalone")
    return words


def ranked(name: str) -> Callable[..., dict]:
    """The training stage `name`'s function, launched on the configured processes when there are several."""
    fn = _stages()[name]

    @functools.wraps(fn)
    def call(*args, **kwargs) -> dict:
        command = launcher()
        if command is None or distributed.launched_rank():
            return fn(*args, **kwargs)
        return launch(name, fn, command, inspect.signature(fn).bind(*args, **kwargs).arguments)

    return call


def launch(name: str, fn: Callable[..., dict], command: list[str], arguments: dict) -> dict:
    """Run stage `name` with `arguments` on every rank of `command`; rank 0's report."""
    from pydantic import TypeAdapter

    hints = typing.get_type_hints(fn)
    args = {k: TypeAdapter(hints[k]).dump_python(v, mode="json") for k, v in arguments.items()}
    shared = os.environ.get(RANKS_DIR_ENV) or None
    if shared:
        Path(shared).mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=f"pipeline-{name}-ranks-", dir=shared))
    spec = folder / "spec.json"
    tmp = folder / ".spec.json.tmp"  # renamed into place: a joining machine never reads half a spec
    tmp.write_text(json.dumps({"stage": name, "args": args, "out": str(folder)}, indent=2))
    tmp.replace(spec)
    log.info("%s: training on %s", name, shlex.join(command))
    with (folder / LAUNCHER_LOG).open("wb") as err:  # the ranks' logs go to stderr as this process's do
        code = _run_ranks(command, spec, stdout=sys.stderr, stderr=err)
    if code == 0 and (folder / REPORT).is_file():
        report = json.loads((folder / REPORT).read_text())
        shutil.rmtree(folder, ignore_errors=True)
        return report
    raise _failure(folder, code)


def join(folder: Path, command: list[str], poll_s: float = 1.0) -> None:
    """`pipeline join`: run this machine's ranks of every launch written to `folder` (a head's PIPELINE_RANKS_DIR),
    oldest first, each once, with `command` (this machine's torchrun: its `--node-rank`), until stopped."""
    done: set[Path] = set()
    while True:
        interrupts.check()
        specs = [p for p in folder.glob("*/spec.json") if p not in done]
        for spec in sorted(specs, key=lambda p: p.stat().st_mtime):
            done.add(spec)
            log.info("join: %s", spec.parent.name)
            log.info("join: %s ended with %d", spec.parent.name, _run_ranks(command, spec))
        if not specs:
            time.sleep(poll_s)


def _run_ranks(command: list[str], spec: Path, **popen: object) -> int:
    """This machine's ranks of the launch `spec` under `command`, in a process group of their own; their exit code.
    A stop signal ends them (`_stop`) and is raised on."""
    proc = subprocess.Popen([*command, "-m", "pipeline.launch", str(spec)], start_new_session=True, **popen)
    try:
        while True:
            try:
                return proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                interrupts.check()
    except BaseException:
        _stop(proc)
        raise


def _stop(proc: subprocess.Popen) -> None:
    """End the launcher and its ranks: SIGTERM to the whole group (each rank unwinds), then SIGKILL."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _failure(folder: Path, code: int) -> Exception:
    """The one-line error of a failed launch, by what caused it: a rank's user error (the single process's own line),
    else a rank killed by a signal (the others then fail in their collectives: consequences, not the cause), else a
    rank's exception, else the rank torchrun saw fail first."""
    errors = [json.loads(p.read_text()) for p in folder.glob("error-rank*.json")]
    errors.sort(key=lambda e: e["rank"])
    for error in errors:
        if error["type"] in ERRORS:
            return ERRORS[error["type"]](error["message"])
    logged = (folder / LAUNCHER_LOG).read_text(errors="replace") if (folder / LAUNCHER_LOG).is_file() else ""
    cause = logged.rpartition("Root Cause")[2]
    rank, exit_code = re.search(r"rank\s*:\s*(\d+)", cause), re.search(r"exitcode\s*:\s*(-?\d+)", cause)
    killed = rank and exit_code and int(exit_code.group(1)) < 0
    if killed:
        name = signal.Signals(-int(exit_code.group(1))).name
        return PipelineError(
            f"training rank {rank.group(1)} was killed by {name}; the run stopped (launcher log: {folder})"
        )
    if errors:
        error = errors[0]
        first = error["message"].strip().splitlines()[0] if error["message"].strip() else ""
        return PipelineError(
            f"training rank {error['rank']} failed: {error['type']}: {first} (launcher log: {folder})"
        )
    if rank and exit_code:
        return PipelineError(f"training rank {rank.group(1)} exited with code {exit_code.group(1)}; the run stopped "
                             f"(launcher log: {folder})")  # fmt: skip
    return PipelineError(f"the training launcher exited with code {code} (launcher log: {folder})")


def _rank_main(spec_file: str) -> int:
    """One rank: join the group, run the stage, rank 0 writes the report; a failure is written for the task."""
    spec = json.loads(Path(spec_file).read_text())
    out, fn = Path(spec["out"]), _stages()[spec["stage"]]
    _rank_logging()
    interrupts.arm()
    try:
        from pydantic import TypeAdapter

        hints = typing.get_type_hints(fn)
        args = {k: TypeAdapter(hints[k]).validate_python(v) for k, v in spec["args"].items()}
        distributed.init()
        report = fn(**args)
        if distributed.is_main():
            tmp = out / f".{REPORT}.tmp"
            tmp.write_text(json.dumps(report, default=str))
            tmp.replace(out / REPORT)
        return 0
    except interrupts.Interrupted as e:  # torchrun stops the others when one rank fails
        return e.exit_code
    except Exception as e:
        rank = int(os.environ.get("RANK", 0))
        error = {"type": type(e).__name__, "message": str(e), "rank": rank}
        (out / f"error-rank{rank}.json").write_text(json.dumps(error))
        if not isinstance(e, PipelineError):
            raise  # a bug: the traceback goes to the launcher's log
        return 2
    finally:
        distributed.close()
        interrupts.disarm()


def _rank_logging() -> None:
    """Rank 0 logs as the single process does; the others only warnings, each line naming its rank."""
    rank = int(os.environ.get("RANK", 0))
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(f"%(asctime)s rank {rank} %(name)s: %(message)s", "%H:%M:%S"))
    for name in ("pipeline", "export"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.INFO if rank == 0 else logging.WARNING)
        logger.handlers, logger.propagate = [handler], False


if __name__ == "__main__":
    sys.exit(_rank_main(sys.argv[1]))

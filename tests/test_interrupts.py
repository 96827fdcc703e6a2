"""Stopping a run: the first SIGINT or SIGTERM stops it at any stage with exit 128 + N, nothing published and no
staging folder left (a signal during the publishing rename lets the artifact stand, and says so); a killed run's
helper processes (Prefect's server, Dask) do not outlive it."""

import gc
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from pipeline import interrupts
from pipeline import run as engine
from pipeline.request import prepare_request
from pipeline.stages import STAGES
from tests.helpers import LOOSE_GATES, quick_args, wait_until, write_tiny_model_dir

# every stage boundary of a deploy (the plan runs only for a speed target, the KD teacher only when one is named:
# its stop and resume are the teacher's, tests/test_kd_teacher.py)
BOUNDARIES = [name for name in STAGES if name not in ("plan", "kd_teacher")]
FAST = ("config.tune_steps=2", "config.train.max_steps=2", "teacher.max_steps=2", "data.max_train=64",
        "data.max_dev=16", "gates.int8_max_drop=100", "gates.max_metric_drop=100", "bench.batch_sizes=[1]",
        "bench.seq_lens=[16]", "bench.min_runs=1", "bench.max_runs=1", "bench.warmup=0")  # fmt: skip


class _SignalInCleanup:
    """Sends a signal from `__del__`, where Python drops whatever the handler raises ("Exception ignored in")."""

    def __init__(self, signum: int) -> None:
        self.signum = signum

    def __del__(self) -> None:
        signal.raise_signal(self.signum)


@pytest.fixture
def armed():
    interrupts.arm()
    yield
    interrupts.disarm()


# the raise that Python drops in __del__ is reported as a warning: here it is the point of the test
DROPPED = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


@DROPPED
def test_a_signal_whose_raise_is_dropped_still_stops_at_the_next_check(armed):
    _SignalInCleanup(signal.SIGINT)  # the raise inside __del__ is dropped: execution goes on here
    gc.collect()
    assert interrupts.received() == signal.SIGINT
    with pytest.raises(interrupts.Interrupted) as info:
        interrupts.check()
    assert info.value.exit_code == 130


def test_exit_codes_follow_the_shell():
    assert interrupts.Interrupted(signal.SIGINT).exit_code == 130
    assert interrupts.Interrupted(signal.SIGTERM).exit_code == 143


def test_a_bad_stop_grace_is_refused_in_one_line(monkeypatch):
    from pipeline.errors import PipelineError

    for bad in ("soon", "0", "-5", "inf"):
        monkeypatch.setenv(interrupts.GRACE_ENV, bad)
        with pytest.raises(PipelineError, match=f"PIPELINE_STOP_GRACE_S='{bad}': expected a number of seconds"):
            interrupts.grace_s()
    monkeypatch.setenv(interrupts.GRACE_ENV, "2.5")
    assert interrupts.grace_s() == 2.5


def test_a_command_that_ends_in_time_cancels_the_deadline(monkeypatch):
    """The deadline is for a run that does not stop; one that unwinds and ends (disarms) is never ended by it."""
    monkeypatch.setenv(interrupts.GRACE_ENV, "0.3")
    interrupts.arm()
    with pytest.raises(interrupts.Interrupted):
        signal.raise_signal(signal.SIGINT)
    interrupts.disarm()
    assert all(t.finished.is_set() for t in threading.enumerate() if isinstance(t, threading.Timer))  # cancelled
    time.sleep(0.6)  # a deadline left running would have ended this process (pytest's worker) by now
    assert interrupts.received() is None


def test_a_second_signal_during_cleanup_is_ignored(armed):
    with pytest.raises(interrupts.Interrupted):
        signal.raise_signal(signal.SIGTERM)
    signal.raise_signal(signal.SIGINT)  # recorded, not raised: the run is already cleaning up
    with pytest.raises(interrupts.Interrupted) as info:
        interrupts.check()
    assert info.value.signum == signal.SIGTERM


def test_a_signal_while_publishing_lets_the_artifact_stand_and_says_so(tmp_path, capsys):
    """A signal that lands in the rename (or after it) cannot unpublish: the command ends as a finished run,
    prints the artifact's path and one note, and never says "nothing was published" about it."""
    from pipeline.cli import _guarded

    final = tmp_path / "artifact"

    def body() -> str:
        with interrupts.publishing(str(final)):
            signal.raise_signal(signal.SIGINT)  # recorded, not raised: the rename below still happens
            (tmp_path / "staging").mkdir()
            os.replace(tmp_path / "staging", final)
        return str(final)

    assert _guarded(body, publishes_one=True) == str(final) and final.is_dir()
    assert (
        capsys.readouterr().err.strip() == f"note: interrupted by SIGINT came after {final} was published; it stands"
    )


def test_a_signal_before_publishing_stops_it(tmp_path, capsys):
    from typer import Exit

    from pipeline.cli import _guarded

    def body() -> str:
        signal.raise_signal(signal.SIGTERM)
        with interrupts.publishing(str(tmp_path / "artifact")):
            (tmp_path / "artifact").mkdir()
        return "unreachable"

    with pytest.raises(Exit) as info:
        _guarded(body, publishes_one=True)
    assert info.value.exit_code == 143 and not (tmp_path / "artifact").exists()
    assert capsys.readouterr().err.strip() == "error: interrupted by SIGTERM; nothing was published"


@DROPPED
def test_a_library_error_while_the_stop_unwinds_is_still_a_stop(capsys):
    """Prefect, interrupted while it creates a task run, raises its own error ("Task run is not set") in place of
    ours: the command still ends as stopped, in one line, with 130."""
    from typer import Exit

    from pipeline.cli import _guarded

    def body() -> str:
        _SignalInCleanup(signal.SIGINT)  # recorded; the raise is dropped
        gc.collect()
        raise ValueError("Task run is not set")

    with pytest.raises(Exit) as info:
        _guarded(body, publishes_one=True)
    assert info.value.exit_code == 130
    assert capsys.readouterr().err.strip() == "error: interrupted by SIGINT; nothing was published"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A tiny model and a cache shared by the module's runs (the teacher and compressed model are reused)."""
    root = tmp_path_factory.mktemp("interrupts")
    return write_tiny_model_dir(root / "tiny", "bert", classifier=False), root / "cache"


@DROPPED
@pytest.mark.parametrize("dropped", [False, True], ids=["raised", "dropped"])
@pytest.mark.parametrize("stage", BOUNDARIES)
def test_a_stop_signal_at_any_stage_boundary_publishes_nothing(stage, dropped, tiny_run, tmp_path, monkeypatch, armed):
    """The plain deploy (the same steps as the flow, without a Prefect server) gets SIGINT as `stage` starts;
    `dropped`: the signal lands in a cleanup function, so only the next boundary check can stop the run."""
    model, cache = tiny_run
    original = engine.PLAIN[stage]

    def signalled(*args, **kwargs):
        if dropped:
            _SignalInCleanup(signal.SIGINT)
            gc.collect()
        else:
            signal.raise_signal(signal.SIGINT)
        return original(*args, **kwargs)

    monkeypatch.setitem(engine.PLAIN, stage, signalled)
    out = tmp_path / "out"
    request = prepare_request("mlp_fusion", "sst2", model=str(model), output_dir=str(out), cache_dir=str(cache),
                              overrides=FAST)  # fmt: skip
    with pytest.raises(interrupts.Interrupted):
        run = engine.prepare(request)
        engine.compress(request, run)
        engine.finish(request, run)
    assert not out.exists() or list(out.iterdir()) == []  # no artifact, no staging folder, no lock file
    assert not [p for p in cache.rglob(".*-*") if p.is_dir()]  # no half-built cache entry


# --- the real command: signals from outside, SIGKILL and its helper processes -----------------------------------


def _start(args, env, log: Path, command: str = "deploy") -> subprocess.Popen:
    with log.open("w") as err:
        return subprocess.Popen([sys.executable, "-m", "pipeline.cli", command, *args], stdout=subprocess.PIPE,
                                stderr=err, env=env, text=True)  # fmt: skip


def _after(log: Path, proc: subprocess.Popen, marker: str, timeout: float = 300) -> None:
    wait_until(lambda: marker in log.read_text() or proc.poll() is not None, timeout=timeout)
    assert proc.poll() is None, f"finished before {marker!r}:\n" + log.read_text()[-3000:]


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("sig", "marker"),
    [(signal.SIGINT, "Task run 'export"), (signal.SIGTERM, "Task run 'teacher")],
    ids=["sigint-in-validate", "sigterm-in-compress"],
)
def test_the_command_stops_with_128_plus_the_signal_and_publishes_nothing(sig, marker, classifier_dirs, tmp_path):
    args, env = quick_args("mlp_fusion", classifier_dirs["bert"], tmp_path, *LOOSE_GATES, ephemeral=True)
    log = tmp_path / "run.log"
    proc = _start(args, env, log)
    _after(log, proc, marker)  # the stage before has finished: the signal lands in the next one
    proc.send_signal(sig)
    assert proc.wait(timeout=120) == 128 + sig, log.read_text()[-3000:]
    errors = [ln for ln in log.read_text().splitlines() if ln.startswith("error: ")]
    assert errors == [f"error: interrupted by {signal.Signals(sig).name}; nothing was published"]
    out = tmp_path / "out"
    assert not out.exists() or [p.name for p in out.iterdir()] == []


# a command whose unwinding hangs (as Prefect's crash handling once did): it holds a staging folder, then swallows
# the stop and sleeps on
_HANGS_WHILE_UNWINDING = """
import sys, time
from pipeline import interrupts
from pipeline.cli import _guarded
from pipeline import staging as layout

def body():
    staging = None
    while True:
        try:
            if staging is None:
                staging = layout.new_staging(sys.argv[1], "artifact")
                print(staging, flush=True)
            time.sleep(60)
        except interrupts.Interrupted:
            pass

interrupts.arm()
_guarded(body)
"""


@pytest.mark.e2e
@pytest.mark.parametrize(("grace", "signals"), [("2", 1), ("600", 3)], ids=["deadline", "third-signal"])
def test_a_run_that_hangs_while_it_stops_ends_anyway_and_leaves_no_staging_folder(grace, signals, tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, interrupts.GRACE_ENV: grace}
    proc = subprocess.Popen([sys.executable, "-c", _HANGS_WHILE_UNWINDING, str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, text=True)  # fmt: skip
    staging = Path(proc.stdout.readline().strip())
    assert staging.is_dir() and staging.parent == out, proc.stderr.read()
    started = time.monotonic()
    for _ in range(signals):
        proc.send_signal(signal.SIGINT)
        time.sleep(0.2)
    assert proc.wait(timeout=60) == 130, proc.stderr.read()
    waited = time.monotonic() - started
    err = proc.stderr.read().splitlines()
    assert [ln for ln in err if ln.startswith("error: ")] == ["error: interrupted by SIGINT; nothing was published"]
    if signals == 1:  # it waited out the grace, no less
        assert waited >= 2 and "note: the run had not stopped 2 s after the signal; ending the process" in err
    else:
        assert waited < 30 and "note: a third stop signal; ending the process" in err
    assert list(out.iterdir()) == []  # neither the staging folder nor its lock file


def _family(proc: subprocess.Popen) -> list[psutil.Process]:
    return psutil.Process(proc.pid).children(recursive=True)


def _gone_within(procs: list[psutil.Process], seconds: float) -> list[str]:
    deadline = time.monotonic() + seconds
    alive = procs
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        time.sleep(0.5)
    return [" ".join(p.cmdline()[:4]) for p in alive if p.is_running()]


@pytest.mark.e2e
def test_sigkill_of_a_deploy_leaves_no_process_behind(classifier_dirs, tmp_path):
    args, env = quick_args("mlp_fusion", classifier_dirs["bert"], tmp_path, *LOOSE_GATES, ephemeral=True)
    log = tmp_path / "run.log"
    proc = _start(args, env, log)
    _after(log, proc, "Task run 'data")  # Prefect's server is up: a flow run has started on it
    family = _family(proc)
    assert any("prefect" in " ".join(p.cmdline()) for p in family), [p.cmdline() for p in family]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert _gone_within(family, 30) == []


@pytest.mark.e2e
def test_sigkill_of_a_sweep_leaves_no_process_behind(classifier_dirs, tmp_path):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(
        f"task: sst2\nteacher: {classifier_dirs['bert']}\n"
        "set: {data.max_train: 64, data.max_dev: 16, config.train.max_steps: 500, config.train.epochs: 1000}\n"
        "runs:\n  - {method: mlp_fusion, set: {config.ratio: 0.5}}\n"
        "  - {method: mlp_fusion, set: {config.ratio: 0.25}}\n"
    )
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "PIPELINE_CACHE_DIR": str(tmp_path / "cache")}
    log = tmp_path / "sweep.log"
    proc = _start([str(sweep), "--output", str(tmp_path / "sweep"), "--workers", "2"], env, log, command="sweep")
    # Prefect's server, then the Dask cluster: two nannies and their two workers
    wait_until(lambda: len(_family(proc)) >= 5 or proc.poll() is not None, timeout=300)
    assert proc.poll() is None, log.read_text()[-3000:]
    time.sleep(2)  # the watchdog has seen the workers
    family = _family(proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert _gone_within(family, 30) == []


def _recorded(signum: int = signal.SIGTERM) -> None:
    """The flag as the handler leaves it when its raise lands in the main thread while another thread scores or
    times (Prefect runs a task in a worker thread): nothing raises there, so its loop must look."""
    interrupts._received.append(signum)


@pytest.mark.parametrize("loop", ["torch scoring", "onnx scoring", "benchmark cell", "real lengths"])
def test_a_stop_signal_ends_scoring_and_timing_loops_between_batches(armed, tmp_path, loop):
    """A stop during a long validation (a 200 KB QA context) or benchmark used to run it to the end: the grace
    deadline ended the process. Every batch of a scoring pass and every round of a timing loop checks the flag."""
    from export import benchmark
    from pipeline.config.schema import BenchSettings
    from pipeline.kinds.base import Encoded
    from pipeline.train.metrics import predict_logits
    from pipeline.train.parity import onnx_logits
    from tests.helpers import tiny_artifact, tiny_model

    features = [{"input_ids": [2, 5 + i % 7, 3], "attention_mask": [1, 1, 1]} for i in range(64 * 5)]
    enc = Encoded(features, [0] * len(features), 0)
    if loop == "torch scoring":
        model, calls = tiny_model("bert"), []
        model.register_forward_pre_hook(lambda *_: calls.append(1) or (len(calls) == 1 and _recorded()))
        with pytest.raises(interrupts.Interrupted):
            predict_logits(model, enc, batch_size=64)
        assert calls == [1]  # the first of five batches ran; the stop came before the second
        return
    graph = tiny_artifact(tmp_path) / "model.onnx"
    _recorded()
    with pytest.raises(interrupts.Interrupted):
        if loop == "onnx scoring":
            onnx_logits(graph, enc, batch_size=64)
        elif loop == "benchmark cell":
            cfg = BenchSettings(batch_sizes=[1], seq_lens=[8], warmup=0, min_runs=10, max_runs=10)
            benchmark.benchmark({"dense": graph}, 100, cfg, interrupts.check)
        else:
            batch = {n: np.full((2, 8), v, np.int64) for n, v in (("input_ids", 5), ("attention_mask", 1),
                                                                 ("token_type_ids", 0))}  # fmt: skip
            benchmark.real_lengths({"dense": graph}, [batch] * 4, rounds=3, check=interrupts.check)

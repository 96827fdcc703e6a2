"""Resume and idempotence: a run killed with SIGKILL mid-stage is resumed by the same command from its finished
stages and the killed stage's last training checkpoint, and the staging folder it left
behind is removed by the next run, never one a live run holds."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline import checkpoints
from pipeline.staging import STAGING_PREFIX, new_staging, remove_dead_stagings
from tests.helpers import LOOSE_GATES, quick_args, run_cli, wait_until, write_tiny_model_dir

CHAIN = (
    "--set", "config.distill.student.layers=2", "--set", "config.distill.relation_heads=4",
    "--set", "config.distill.transfer_steps=3", "--set", "config.distill.train.max_steps=3",
    "--set", "config.smp.train.max_steps=300", "--set", "config.smp.train.epochs=1000",
    "--set", "config.smp.recover_steps=2",
    "--set", "config.smp.mask.shape={heads: 2, ffn: 32}",
)  # fmt: skip


def start_cli(args, env, log: Path) -> subprocess.Popen:
    """`pipeline deploy` in its own process group (so SIGKILL takes the Prefect server it started too)."""
    with log.open("w") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "deploy", *args],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
            start_new_session=True,
        )


def sigkill(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


@pytest.mark.e2e
def test_a_chain_killed_mid_stage_resumes_from_its_finished_stages(tmp_path):
    model = write_tiny_model_dir(tmp_path / "tiny4", layers=4, heads=4)
    args, env = quick_args("distill+smp", model, tmp_path, *CHAIN, *LOOSE_GATES)
    env[checkpoints.ENV] = "30"
    log = tmp_path / "killed.log"
    proc = start_cli(args, env, log)
    # the first stage is finished and cached once the second one checkpoints
    wait_until(lambda: "smp mask training: checkpoint" in log.read_text() or proc.poll() is not None, timeout=300)
    assert proc.poll() is None, log.read_text()[-3000:]
    sigkill(proc)
    assert "compress (distill)" in log.read_text()

    again = run_cli(args, env)
    assert again.returncode == 0, again.stderr[-3000:]
    report = json.loads((Path(again.stdout.strip().splitlines()[-1]) / "report.json").read_text())
    ran = [name for name, cached in [("teacher", report["teacher"]["cached"]),
           *((s["method"], s["cached"]) for s in report["compress"]["stages"])] if not cached]  # fmt: skip
    assert ran == ["smp"]  # the teacher and the distilled student were reused; only the killed stage ran again
    assert "smp mask training: resuming from the checkpoint at step" in again.stderr  # and not from its first step
    assert report["compress"]["stages"][0]["compacted"]["cached"]  # and so was the compaction between them
    # the killed build's temporary folder is gone; every cache entry is complete
    for stage in ("teachers", "compressed", "compacted"):
        for entry in (tmp_path / "cache" / stage).iterdir():
            assert entry.name.endswith(".lock") or (entry / ".complete").is_file(), entry


@pytest.mark.e2e
def test_a_killed_runs_staging_folder_is_removed_by_the_next_run(classifier_dirs, tmp_path):
    slow_bench = (
        "--set",
        "bench.min_runs=2000",
        "--set",
        "bench.max_runs=2000",
        "--set",
        "bench.max_seconds_per_cell=60",
    )
    args, env = quick_args("mlp_fusion", classifier_dirs["bert"], tmp_path, "--steps", "2", *LOOSE_GATES)
    out = tmp_path / "out"
    proc = start_cli([*args, *slow_bench], env, tmp_path / "killed.log")
    wait_until(lambda: any(out.glob(f"{STAGING_PREFIX}*")) or proc.poll() is not None, timeout=300)
    assert proc.poll() is None, (tmp_path / "killed.log").read_text()[-3000:]
    time.sleep(1.0)
    sigkill(proc)
    [left] = [p for p in out.glob(f"{STAGING_PREFIX}*") if p.is_dir()]  # its .lock file sits beside it

    again = run_cli(args, env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert not left.exists() and not list(out.glob(".staging-*"))
    artifacts = list(out.iterdir())
    assert len(artifacts) == 1 and (artifacts[0] / "manifest.json").is_file()
    report = json.loads((artifacts[0] / "report.json").read_text())
    assert report["teacher"]["cached"] and report["compress"]["cached"]  # only the unfinished stages ran again


def test_a_live_runs_staging_folder_is_never_removed(tmp_path):
    out = tmp_path / "out"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pipeline.staging import new_staging; "
         "s = new_staging(sys.argv[1], 'live'); print(s, flush=True); time.sleep(600)", str(out)],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[1],
    )  # fmt: skip
    try:
        live = Path(holder.stdout.readline().strip())
        assert live.is_dir()
        mine = new_staging(out, "mine")  # another run starting beside it leaves it alone
        assert live.is_dir() and mine.is_dir()
        assert remove_dead_stagings(out) == []
    finally:
        holder.kill()
        holder.wait()
    assert remove_dead_stagings(out) == [live]  # its run is gone: the lock is free
    assert mine.is_dir()  # this process's own live staging stays

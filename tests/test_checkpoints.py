"""Resumable training: a stage killed mid-phase resumes from its last checkpoint and ends where an uninterrupted
run ends (weights, history), for every training method and phase layout; the checkpoints go with the finished
entry."""

import pytest
import torch

from pipeline import checkpoints
from pipeline.data.loaders import DataRef
from pipeline.errors import PipelineError
from pipeline.models.io import load_model
from pipeline.request import build_deploy_config
from pipeline.stages.compress import run as compress

DATA = DataRef("sst2", "sample", None, 64, 16)  # 64 sentences at batch 8: an epoch is 8 steps
STEPS = ["train.max_steps=12", "train.batch_size=8", "train.eval_every=4"]
# Each method's phases are 12 steps or fewer; the kill lands mid-epoch of the last phase, after a checkpoint.
# SMP averages its recovery's last 8 steps: the kill lands inside the average.
METHODS = {
    "distill": (
        ["student.layers=1", "relation_heads=4", "hidden=1.0", "transfer_steps=6", "train.group_by_length=true"],
        6 + 9,
    ),
    "smp": (["sparsity=0.5", "recover_steps=10", "prune_steps=6", "train.average_steps=8"], 12 + 7),
    "gmp": (["sparsity=0.5", "prune_every=2", "train.cycles=3", "dense_cycles=1"], 9),
    "mlp_fusion": (["layers=[1]", "tune_steps=6"], 6 + 11),
}


class Killed(Exception):
    """Stands in for SIGKILL: training stops between two steps, and nothing after it runs."""


def kill_after(monkeypatch, steps: int) -> dict:
    """Training steps from now on raise `Killed` after `steps` of them (until `limit` is lifted)."""
    from types import SimpleNamespace

    from pipeline.train import loop

    calls = {"n": 0, "limit": steps}

    def check() -> None:
        calls["n"] += 1
        if calls["n"] > calls["limit"]:
            raise Killed

    # the training loop's check, once a step: scoring passes (validation inside a stage) check for a stop too
    monkeypatch.setattr(loop, "interrupts", SimpleNamespace(check=check))
    return calls


def run(method: str, cache, dirs) -> dict:
    overrides, _ = METHODS[method]
    cfg = build_deploy_config(method, "sst2", overrides=[f"config.{o}" for o in [*STEPS, *overrides]])
    return compress(cfg, str(dirs["bert"]), DATA, str(cache))


@pytest.mark.parametrize("method", list(METHODS))
def test_a_stage_killed_mid_phase_resumes_where_it_stopped(method, classifier_dirs, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(checkpoints.ENV, "5")
    whole = run(method, tmp_path / "whole", classifier_dirs)

    kill = kill_after(monkeypatch, METHODS[method][1])
    with pytest.raises(Killed):
        run(method, tmp_path / "killed", classifier_dirs)
    resume = list((tmp_path / "killed" / "compressed").glob(".*.resume"))
    assert len(resume) == 1 and list(resume[0].glob("phase-*.pt"))
    assert not [p for p in (tmp_path / "killed" / "compressed").iterdir() if not p.name.startswith(".")]

    kill["limit"] = float("inf")
    with caplog.at_level("INFO"):
        again = run(method, tmp_path / "killed", classifier_dirs)
    assert "resuming from the checkpoint at step" in caplog.text
    whole_sd, again_sd = (load_model(r["path"]).state_dict() for r in (whole, again))
    for a, b in zip(whole_sd.items(), again_sd.items(), strict=True):
        assert a[0] == b[0] and torch.allclose(a[1], b[1], atol=1e-6), a[0]
    for phase in ("tuning", "training", "recovery"):
        assert _timeless(again.get(phase)) == _timeless(whole.get(phase)), phase
    assert not list((tmp_path / "killed" / "compressed").glob(".*.resume"))  # gone with the finished entry


def _timeless(report):
    """A phase's report without its wall times (a resumed run's are the sum of its two parts)."""
    if isinstance(report, dict):
        return {k: _timeless(v) for k, v in report.items() if k != "seconds"}
    return report


def test_checkpoints_off_leave_nothing_to_resume(classifier_dirs, tmp_path, monkeypatch):
    monkeypatch.setenv(checkpoints.ENV, "0")
    kill_after(monkeypatch, 8)
    with pytest.raises(Killed):
        run("gmp", tmp_path / "cache", classifier_dirs)
    assert not list((tmp_path / "cache" / "compressed").glob(".*.resume/*"))


def test_a_bad_interval_is_one_line(monkeypatch):
    monkeypatch.setenv(checkpoints.ENV, "often")
    with pytest.raises(PipelineError, match="PIPELINE_CHECKPOINT_EVERY='often'"):
        checkpoints.interval()

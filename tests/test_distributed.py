"""Data-parallel training under torchrun (gloo on this CPU): two ranks train what one process trains, a rank that dies
stops the run in one line and publishes nothing, and a resumed two-rank run continues from rank 0's checkpoint."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline import checkpoints, launch
from pipeline.errors import PipelineError
from tests.helpers import (
    LOOSE_GATES,
    _jsonl_task_file,
    assert_one_line_error,
    cli_deploy,
    quick_args,
    run_cli,
    sample_sentences,
    wait_until,
    write_tiny_model_dir,
)
from tests.test_resume import CHAIN, start_cli  # a tiny distill+smp budget; a later --set of a key wins

# a mask training that prunes: the cubic ramp from every unit kept to the shape, over 40 steps
SMP_STEPS = ("--set", "config.smp.train.max_steps=40")
# every example cut to the same 10 tokens: the losses averaged over tokens weigh each rank's rows as one process
# does (with padding, a rank's tokens weigh by its own count), so two ranks' steps are one process's to float noise
SAME_LENGTH = tuple(f"--set={key}.max_length=10" for key in ("teacher", "config.distill.train", "config.smp.train"))


def long_sentence_task(folder: Path) -> Path:
    """The keyword task on the sample's sentences of 12 words or more (all longer than 10 tokens)."""
    rows = {
        split: [{"text": t, "label": "yes" if "and" in t.split() else "no"} for t in sample_sentences(split)
                if len(t.split()) >= 12]
        for split in ("train", "dev")
    }  # fmt: skip
    spec = {"name": "has_and", "text_columns": ["text"], "label_column": "label", "labels": ["no", "yes"],
            "metric": "accuracy"}  # fmt: skip
    return _jsonl_task_file(folder, "long", rows, spec)


def test_the_launcher_is_torchrun_from_this_interpreter(monkeypatch):
    monkeypatch.delenv(launch.LAUNCHER_ENV, raising=False)
    monkeypatch.delenv(launch.NPROC_ENV, raising=False)
    assert launch.launcher() is None  # one process: the stage runs in the task's own
    with launch.processes(2):
        assert launch.launcher() == [*launch.TORCHRUN, "--standalone", "--nproc-per-node=2"]
    assert launch.launcher() is None
    monkeypatch.setenv(launch.LAUNCHER_ENV, "torchrun")
    assert launch.launcher() == [*launch.TORCHRUN, "--nproc-per-node=auto", "--standalone"]  # one per GPU
    two_nodes = "torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint head:29400"
    monkeypatch.setenv(launch.LAUNCHER_ENV, two_nodes)
    assert launch.launcher() == [*launch.TORCHRUN, *two_nodes.split()[1:]]  # as given: no --standalone
    monkeypatch.setenv(launch.LAUNCHER_ENV, "mpirun -n 2")
    with pytest.raises(PipelineError, match="expected a torchrun command"):
        launch.launcher()
    monkeypatch.delenv(launch.LAUNCHER_ENV)
    monkeypatch.setenv(launch.NPROC_ENV, "two")
    with pytest.raises(PipelineError, match="PIPELINE_NPROC='two'"):
        launch.launcher()


def test_a_bad_nproc_is_refused_in_one_line(classifier_dirs):
    result = cli_deploy("--method", "mlp_fusion", "--task", "sst2", "--teacher", str(classifier_dirs["bert"]),
                        "--nproc", "0")  # fmt: skip
    assert_one_line_error(result, "--nproc 0: expected 1 or more processes")


def test_a_deploy_started_under_torchrun_is_refused_in_one_line(classifier_dirs, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    result = cli_deploy("--method", "mlp_fusion", "--task", "sst2", "--teacher", str(classifier_dirs["bert"]))
    assert_one_line_error(result, "give --nproc N (or set PIPELINE_LAUNCHER) instead of starting it under torchrun")


def test_a_failed_rank_is_told_in_one_line(tmp_path):
    (tmp_path / "error-rank1.json").write_text(json.dumps({"type": "PipelineError", "message": "bad", "rank": 1}))
    assert str(launch._failure(tmp_path, 1)) == "bad"  # a user error: the single process's own line
    (tmp_path / "error-rank1.json").unlink()
    (tmp_path / "error-rank0.json").write_text(json.dumps({"type": "OSError", "message": "disk\nfull", "rank": 0}))
    assert str(launch._failure(tmp_path, 1)).startswith("training rank 0 failed: OSError: disk (launcher log:")
    (tmp_path / launch.LAUNCHER_LOG).write_text("Root Cause (first observed failure):\n[0]:\n  rank      : 1 "
                                                "(local_rank: 1)\n  exitcode  : -9 (pid: 5)\n")  # fmt: skip
    # rank 1 was killed; rank 0's collective failing after it (its error file) is a consequence, not the cause
    assert str(launch._failure(tmp_path, 1)).startswith("training rank 1 was killed by SIGKILL; the run stopped")


@pytest.mark.e2e
def test_a_teacher_trained_on_two_ranks_equals_one_trained_in_one_process(tmp_path):
    from pipeline.config.schema import TrainConfig
    from pipeline.data.loaders import DataRef
    from pipeline.data.tasks import get_task
    from pipeline.models.io import load_model
    from pipeline.run import PLAIN

    model = write_tiny_model_dir(tmp_path / "tiny", dropout=0.0)  # no dropout: ranks draw other masks than one
    ref = DataRef(get_task("sst2"), "sample", None, 64, 16)
    cfg = TrainConfig(max_steps=6, batch_size=8, eval_every=3)  # 64 rows: 8 batches, and a last partial one
    one = PLAIN["teacher"](str(model), None, ref, cfg, str(tmp_path / "one"))
    with launch.processes(2):
        two = PLAIN["teacher"](str(model), None, ref, cfg, str(tmp_path / "two"))
    assert Path(two["path"]).parent.parent == tmp_path / "two"  # rank 0 wrote the cache entry
    assert [h["loss"] for h in two["history"]] == pytest.approx([h["loss"] for h in one["history"]], abs=1e-5)
    assert two["validation"] == pytest.approx(one["validation"])
    a, b = load_model(one["path"]).state_dict(), load_model(two["path"]).state_dict()
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-4


def _losses(report: dict) -> dict[str, list[float]]:
    """Each training's per-step losses in a deploy report: the teacher's and every chained stage's."""
    found = {"teacher": [h["loss"] for h in report["teacher"]["history"]]}
    for i, stage in enumerate(report["compress"]["stages"]):
        training = stage["training"]
        runs = {"mask": training} if "history" in training else training  # distillation's: two named phases
        for name, run in runs.items():
            found[f"{i}.{name}"] = [h["loss"] for h in run["history"]]
    return found


@pytest.mark.e2e
def test_a_distill_smp_deploy_on_two_ranks_matches_the_single_process_one(tmp_path):
    model = write_tiny_model_dir(tmp_path / "tiny4", layers=4, heads=4, dropout=0.0)
    task = ("--task-file", str(long_sentence_task(tmp_path)))
    artifacts = {}
    for nproc in ("1", "2"):
        args, env = quick_args("distill+smp", model, tmp_path / nproc, *CHAIN, *SMP_STEPS, *SAME_LENGTH,
                               *LOOSE_GATES, "--nproc", nproc, task=task)  # fmt: skip
        result = run_cli(args, env)
        assert result.returncode == 0, result.stderr[-3000:]
        artifacts[nproc] = Path(result.stdout.strip().splitlines()[-1])
    assert "training on" in result.stderr and "torch.distributed.run --standalone --nproc-per-node=2" in result.stderr
    reports = {n: json.loads((a / "report.json").read_text()) for n, a in artifacts.items()}
    one, two = reports["1"], reports["2"]
    # every step of every training, the teacher's, distillation's two phases and SMP's mask training, is one
    # process's step to float noise. SMP recomputes its top-k mask at each step, so that noise can decide a
    # near-tie between two units at one step (a score whose gradient is noise moves a whole Adam step either
    # way), and the run goes on along another, equally valid path: the scores, and the units kept at the end,
    # are not bit-stable, only each step's loss is (measured: at most 4e-4 apart relatively where that happened)
    losses_one, losses_two = _losses(one), _losses(two)
    assert list(losses_two) == list(losses_one) == ["teacher", "0.transfer", "0.task", "1.mask"]
    for name, steps in losses_one.items():
        assert losses_two[name] == pytest.approx(steps, rel=2e-3), name
    assert two["compaction"]["heads"] == one["compaction"]["heads"]  # SMP kept as many heads and neurons
    assert two["compaction"]["ffn_widths"] == one["compaction"]["ffn_widths"]
    for split, graphs in one["validation"]["metrics"].items():
        for graph, metrics in graphs.items():
            assert two["validation"]["metrics"][split][graph] == pytest.approx(metrics, abs=0.5), (split, graph)


def _rank_pid(rank: int, tmp_path: Path) -> int | None:
    """The pid of training rank `rank` of the deploy this test started in `tmp_path` (by its cache folder: tests on
    the other worker run ranks too), if one runs."""
    wanted = {f"RANK={rank}".encode(), f"PIPELINE_CACHE_DIR={tmp_path / 'cache'}".encode()}
    for proc in Path("/proc").iterdir():
        try:
            if b"pipeline.launch" in (proc / "cmdline").read_bytes() and wanted <= set(
                (proc / "environ").read_bytes().split(b"\0")
            ):
                return int(proc.name)
        except (OSError, ValueError):
            continue
    return None


@pytest.mark.e2e
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the rank's process in /proc")
def test_killing_one_rank_stops_the_run_and_the_next_resumes_from_rank_0s_checkpoint(tmp_path):
    model = write_tiny_model_dir(tmp_path / "tiny4", layers=4, heads=4)
    long_smp = ("--set", "config.smp.train.max_steps=400")
    args, env = quick_args("distill+smp", model, tmp_path, *CHAIN, *long_smp, *LOOSE_GATES, "--nproc", "2")
    env[checkpoints.ENV] = "20"
    log = tmp_path / "killed.log"
    proc = start_cli(args, env, log)
    wait_until(lambda: "smp mask training: checkpoint" in log.read_text() or proc.poll() is not None, timeout=300)
    pid = _rank_pid(1, tmp_path)
    assert proc.poll() is None and pid is not None, log.read_text()[-3000:]
    os.kill(pid, signal.SIGKILL)
    assert proc.wait(timeout=120) != 0
    last = log.read_text().strip().splitlines()[-1]
    assert last.startswith("error: training rank 1 was killed by SIGKILL; the run stopped"), last
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())  # nothing published
    assert _rank_pid(0, tmp_path) is None  # and no rank left behind

    again = run_cli(args, env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "rank 0 pipeline.train.loop: smp mask training: resuming from the checkpoint at step" in again.stderr
    report = json.loads((Path(again.stdout.strip().splitlines()[-1]) / "report.json").read_text())
    assert report["teacher"]["cached"] and not report["compress"]["cached"]


@pytest.mark.e2e
def test_a_stopped_two_rank_run_ends_its_ranks_and_publishes_nothing(tmp_path):
    model = write_tiny_model_dir(tmp_path / "tiny4", layers=4, heads=4)
    long_smp = ("--set", "config.smp.train.max_steps=400")
    args, env = quick_args("distill+smp", model, tmp_path, *CHAIN, *long_smp, *LOOSE_GATES, "--nproc", "2")
    log = tmp_path / "stopped.log"
    proc = start_cli(args, env, log)
    wait_until(lambda: _rank_pid(1, tmp_path) is not None or proc.poll() is not None, timeout=300)
    assert proc.poll() is None, log.read_text()[-3000:]
    proc.send_signal(signal.SIGTERM)  # to the deploy alone, as a scheduler stops a run
    assert proc.wait(timeout=120) == 128 + signal.SIGTERM
    assert log.read_text().strip().splitlines()[-1] == "error: interrupted by SIGTERM; nothing was published"
    assert _rank_pid(0, tmp_path) is None and _rank_pid(1, tmp_path) is None
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.e2e
def test_the_throughput_benchmark_times_one_process_and_two_ranks(tmp_path, monkeypatch):
    from benchmarks.train_throughput import rank_throughput
    from pipeline.data.loaders import DataRef
    from pipeline.data.tasks import get_task

    monkeypatch.setenv(checkpoints.ENV, "0")  # what the benchmark sets, put back after the test
    model = write_tiny_model_dir(tmp_path / "tiny")
    rows = rank_throughput(str(model), DataRef(get_task("sst2"), "sample", None, 64, 16), 8, 3, [1, 2])
    assert [(r["ranks"], r["steps"]) for r in rows] == [(1, 3), (2, 3)]
    assert all(r["steps_per_s"] > 0 and r["examples_per_s"] == pytest.approx(8 * r["steps_per_s"]) for r in rows)
    assert rows[1]["vs_one_process"] == pytest.approx(rows[1]["steps_per_s"] / rows[0]["steps_per_s"])


@pytest.mark.e2e
def test_two_machines_train_as_one_process_does(tmp_path, monkeypatch):
    """A two-node launch on one machine: the head's torchrun is node 0, `pipeline join` starts node 1's rank from
    the launch the head writes into PIPELINE_RANKS_DIR (static rendezvous at the head's address)."""
    from pipeline.config.schema import TrainConfig
    from pipeline.data.loaders import DataRef
    from pipeline.data.tasks import get_task
    from pipeline.models.io import load_model
    from pipeline.run import PLAIN
    from tests.helpers import free_port

    model = write_tiny_model_dir(tmp_path / "tiny", dropout=0.0)
    ref = DataRef(get_task("sst2"), "sample", None, 64, 16)
    cfg = TrainConfig(max_steps=4, batch_size=8, eval_every=0)
    one = PLAIN["teacher"](str(model), None, ref, cfg, str(tmp_path / "one"))
    node = "torchrun --nnodes 2 --node-rank {} --nproc-per-node 1 --master-addr 127.0.0.1 --master-port " + str(
        free_port()
    )
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    joined = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "join", str(ranks), "--launcher", node.format(1)],
                              stderr=(tmp_path / "join.log").open("w"), start_new_session=True)  # fmt: skip
    try:
        monkeypatch.setenv(launch.LAUNCHER_ENV, node.format(0))
        monkeypatch.setenv(launch.RANKS_DIR_ENV, str(ranks))
        two = PLAIN["teacher"](str(model), None, ref, cfg, str(tmp_path / "two"))
    finally:
        joined.send_signal(signal.SIGTERM)
        code = joined.wait(timeout=60)
    assert code == 128 + signal.SIGTERM  # it ran until stopped
    assert "join: pipeline-teacher-ranks-" in (tmp_path / "join.log").read_text()
    a, b = load_model(one["path"]).state_dict(), load_model(two["path"]).state_dict()
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-4
    assert not any(ranks.iterdir())  # the head removed its finished launch


@pytest.mark.e2e
def test_general_distillation_on_two_ranks_matches_one_process(base_dirs, tmp_path):
    """The general stage as its flow calls it (`launch.ranked`): the student, its projections outside the model and
    the relation losses all train data-parallel."""
    from pipeline.data.tasks import get_task
    from pipeline.models.io import load_base_model
    from pipeline.stages import general
    from tests.test_general import corpus_dir, tiny_cfg

    cfg = tiny_cfg(hidden=1.0, direct=0.5)
    corpus = str(corpus_dir(tmp_path / "c"))
    one = general.run(str(base_dirs["bert"]), corpus, cfg, str(tmp_path / "one"))
    with launch.processes(2):
        two = launch.ranked("general")(str(base_dirs["bert"]), corpus, cfg, str(tmp_path / "two"))
    assert two["shape"] == one["shape"] and two["training"]["steps"] == one["training"]["steps"]
    losses = [[h["loss"] for h in r["training"]["history"]] for r in (one, two)]
    assert losses[1] == pytest.approx(losses[0], rel=0.05)  # dropout and token weights differ a little per rank
    a = load_base_model(one["path"], get_task("sst2")).base_model.state_dict()
    b = load_base_model(two["path"], get_task("sst2")).base_model.state_dict()
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 0.05

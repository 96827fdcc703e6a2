"""Sweeps: runs trained in parallel on a real local Dask cluster, the Pareto front and the pick checked against
the figures measured in the artifacts' own reports, and the refusals."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import pipeline
from pipeline.errors import PipelineError
from pipeline.pareto import mark_front, select
from pipeline.sweep import load_sweep
from tests.helpers import INTENTS, assert_one_line_error, intent_task_file, shared_prefect_api

SAMPLE = Path(pipeline.__file__).parent / "data" / "samples" / "sst2"  # the embedded sample, named explicitly
QUICK = {
    "teacher.max_steps": 20, "teacher.lr": 2e-3, "data.max_train": 200, "data.max_dev": 32,
    "gates.int8_max_drop": 100, "gates.max_metric_drop": 100,
    "bench.batch_sizes": [1, 4], "bench.seq_lens": [16], "bench.max_runs": 5, "bench.min_runs": 3, "bench.warmup": 1,
}  # fmt: skip


def write_sweep(path: Path, model: Path, **extra) -> Path:
    spec = {
        "task": "sst2",
        "data_dir": str(SAMPLE),
        "model": str(model),
        "set": QUICK,
        "runs": [{"method": "mlp_fusion", "set": {"config.ratio": 0.25, "config.train.max_steps": 4}}],
        "grid": {
            "method": ["smp"],
            "set": {"config.sparsity": [0.3, 0.7], "config.train.max_steps": [4], "config.prune_steps": [3]},
        },
        **extra,
    }
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def cli_sweep(*args, cwd=None):
    """`pipeline sweep ARGS`, its flow on this process's shared Prefect server (tests.helpers.shared_prefect_api)."""
    return subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "sweep", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env={**os.environ, "PREFECT_API_URL": shared_prefect_api()},
    )


@pytest.mark.e2e
def test_a_sweep_trains_on_dask_workers_and_selects_from_the_measured_front(base_dirs, tmp_path):
    sweep = write_sweep(tmp_path / "sweep.yaml", base_dirs["bert"])
    out = tmp_path / "out"
    proc = cli_sweep(sweep, "--output", out, "--max-metric-drop", 100, "--workers", 2)
    stdout, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, stderr[-4000:]
    result = json.loads((out / "pareto.json").read_text())
    assert result["failed"] == []
    points = result["points"]
    assert [p["run"] for p in points[:2]] == ["dense fp32 (teacher)", "dense int8"]
    runs = {p["run"]: p for p in points if p["artifact"]}
    assert set(runs) == {
        "mlp_fusion ratio=0.25 max_steps=4",
        *(f"smp sparsity={s} max_steps=4 prune_steps=3" for s in (0.3, 0.7)),
    }

    reports = {label: json.loads((Path(p["artifact"]) / "report.json").read_text()) for label, p in runs.items()}
    # the teacher was fine-tuned once and shared; training ran on the cluster's worker processes, not here
    assert sorted(r["teacher"]["cached"] for r in reports.values()) == [False, True, True]
    assert all(f"pid {proc.pid}" not in r["compress"]["ran_on"] for r in reports.values())
    # every point is its artifact's own measured figures
    for label, r in reports.items():
        p, metric = runs[label], r["validation"]["metric"]
        assert p["validation"] == r["validation"]["metrics"]["validation"]["onnx_int8"][metric]
        assert p["dev"] == r["validation"]["metrics"]["dev"]["onnx_int8"][metric]
        cell = [
            s for s in r["speed"]["speedups"] if s["model"] == "compressed-int8" and (s["batch"], s["seq"]) == (4, 16)
        ]
        assert p["speedup"] == cell[0]["speedup_p50"]
        assert p["size_mb"] == round((Path(p["artifact"]) / "model.int8.onnx").stat().st_size / 1e6, 2)
    # the front: exactly the points no other point beats on both axes
    for p in points:
        mine = (p["validation"], p["speedup"])
        beaten = any(q["validation"] >= mine[0] and q["speedup"] >= mine[1] and (q["validation"], q["speedup"]) != mine
                     for q in points)  # fmt: skip
        assert p["pareto"] == (not beaten), p["run"]
    # the pick: the fastest artifact within the budget (100 points: all of them), linked as `selected`
    fastest = max(runs.values(), key=lambda p: p["speedup"])
    assert result["selected"] == fastest["artifact"] and fastest["selected"]
    assert (out / "selected").resolve() == Path(fastest["artifact"]).resolve()
    assert stdout.strip().splitlines()[-1] == fastest["artifact"]
    assert (out / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(out.glob(".*"))  # no staging folder, lock or temporary file left


def test_the_pick_is_the_fastest_within_budget_or_nothing():
    def point(run, val, speed):
        return {"run": run, "artifact": run, "validation": val, "teacher_validation": 90.0, "speedup": speed}

    points = [point("a", 89.5, 2.0), point("b", 88.0, 4.0), point("c", 85.0, 6.0), point("d", 87.0, 3.0)]
    mark_front(points)
    assert [p["pareto"] for p in points] == [True, True, True, False]
    assert select(points, 2.0)["run"] == "b"
    assert select(points, 0.5)["run"] == "a"
    assert select(points, 0.1) is None
    assert select(points, None) is None


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"colour": "red"}, "colour: Extra inputs are not permitted"),
        (
            {"runs": [{"method": "smp", "set": {"config.sparsity": 2}}]},
            "run 'smp sparsity=2': invalid smp config: sparsity",
        ),
        ({"runs": [{"method": "smp", "sets": {}}]}, "runs.0.sets: Extra inputs are not permitted"),
        ({"runs": [{"method": "pruning"}]}, "unknown method 'pruning'"),
        ({"runs": [], "grid": None}, "a sweep needs `runs:` or `grid:`"),
        ({"runs": [{"method": "smp"}, {"method": "smp"}], "grid": None}, "run 'smp' is listed twice"),
    ],
)
def test_a_bad_sweep_file_is_one_line(base_dirs, tmp_path, extra, needle):
    sweep = write_sweep(tmp_path / "sweep.yaml", base_dirs["bert"], **extra)
    with pytest.raises(PipelineError, match="sweep file"):
        load_sweep(sweep, str(tmp_path / "out"))
    from typer.testing import CliRunner

    from pipeline.cli import app

    result = CliRunner().invoke(app, ["sweep", str(sweep), "--output", str(tmp_path / "out")])
    assert_one_line_error(result, needle)
    assert not (tmp_path / "out").exists()


@pytest.mark.e2e  # waits out the client's 10 s connection timeout
def test_an_unreachable_dask_scheduler_is_one_line(base_dirs, tmp_path):
    from typer.testing import CliRunner

    from pipeline.cli import app

    sweep = write_sweep(tmp_path / "sweep.yaml", base_dirs["bert"])
    args = ["sweep", str(sweep), "--output", str(tmp_path / "out"), "--dask-address", "tcp://127.0.0.1:9"]
    assert_one_line_error(CliRunner().invoke(app, args), "cannot reach the Dask scheduler at tcp://127.0.0.1:9")
    assert not (tmp_path / "out").exists()


def test_a_sweep_over_the_users_own_task(base_dirs, tmp_path):
    """`task_file:` (relative to the sweep file) gives every run the user's task, with its files and labels."""
    intent_task_file(tmp_path)
    sweep = write_sweep(tmp_path / "sweep.yaml", base_dirs["bert"], task=None, task_file="intents.yaml", data_dir=None)
    runs = load_sweep(sweep, str(tmp_path / "out"))
    assert len(runs) == 3
    for _, request in runs:
        assert request.config.task == "intents" and request.data_source == "files"
        assert request.data.load().task.labels == tuple(INTENTS)
    both = write_sweep(tmp_path / "both.yaml", base_dirs["bert"], task_file="intents.yaml")
    with pytest.raises(PipelineError, match="name one task: --task or --task-file"):
        load_sweep(both, str(tmp_path / "out"))


def test_a_sweep_over_token_and_span_tasks(base_dirs, tmp_path):
    """A NER or QA task file, or a built-in one, gives every run of a sweep its kind (and so its metric)."""
    (tmp_path / "ner.yaml").write_text("name: people\nkind: token-classification\ntrain: t.jsonl\ndev: t.jsonl\n"
                                       "labels: [O, B-PER, I-PER]\n")  # fmt: skip
    (tmp_path / "t.jsonl").write_text("\n".join(json.dumps({"tokens": ["Ann", "ran"], "tags": ["B-PER", "O"]})
                                               for _ in range(40)))  # fmt: skip
    sweep = write_sweep(tmp_path / "sweep.yaml", base_dirs["bert"], task=None, task_file="ner.yaml", data_dir=None)
    runs = load_sweep(sweep, str(tmp_path / "out"))
    assert len(runs) == 3
    for _, request in runs:
        data = request.data.load()
        assert data.task.kind == "token-classification" and data.task.metric == "f1"

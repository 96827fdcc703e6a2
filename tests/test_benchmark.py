"""Tests for export/benchmark.py on real tiny BERT ONNX exports (CPU only, no timing asserts)."""

import contextlib
import json
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import psutil
import pytest

import export.benchmark as bench_module
from export.benchmark import (
    JUDGED_CELL_S,
    LoadSample,
    allowed_cores,
    benchmark,
    encoder_flops,
    is_busy,
    machine_load,
    make_inputs,
    plot_latency,
    speedups,
    wait_until_quiet,
)
from export.sessions import make_session, physical_cores
from pipeline.config.schema import BenchSettings
from pipeline.report import render_markdown
from tests.helpers import wait_until

VOCAB = 128
CFG = BenchSettings(
    batch_sizes=(1, 2), seq_lens=(8,), warmup=1, min_runs=3, max_runs=5, max_seconds_per_cell=2.0, threads=1
)


def _export(path, intermediate_size):
    torch = pytest.importorskip("torch")
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    model = BertForSequenceClassification(
        BertConfig(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=intermediate_size,
            vocab_size=VOCAB,
        )
    ).eval()
    ids = torch.randint(0, VOCAB, (2, 8))
    dyn = {0: "batch", 1: "seq"}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings from transformers' mask helpers
        torch.onnx.export(
            model,
            (ids, torch.ones_like(ids), torch.zeros_like(ids)),
            str(path),
            dynamo=False,
            opset_version=17,
            input_names=["input_ids", "attention_mask", "token_type_ids"],
            output_names=["logits"],
            dynamic_axes={"input_ids": dyn, "attention_mask": dyn, "token_type_ids": dyn, "logits": {0: "batch"}},
        )
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("onnx")
    return {"dense": _export(d / "dense.onnx", 64), "compressed": _export(d / "small.onnx", 16)}


@pytest.fixture(scope="module")
def result(models):
    return benchmark(models, VOCAB, CFG)


def test_result_structure(result, models):
    json.dumps(result)  # must be JSON-serialisable
    dev = result["device"]
    assert dev["provider"] == "CPUExecutionProvider" and dev["spinning"] == "off"
    assert dev["threads"] == 1 and dev["ort_version"] and "cpu" in dev
    cpu_cells = [c for c in result["cells"] if c["provider"] == "CPUExecutionProvider"]
    keys = {(c["model"], c["batch"], c["seq"]) for c in cpu_cells}
    assert keys == {(m, b, 8) for m in models for b in (1, 2)}
    assert len(cpu_cells) == len(keys)
    for c in result["cells"]:
        assert CFG.min_runs <= c["runs"] <= CFG.max_runs
        assert 0 < c["p50_ms"] <= c["p90_ms"] <= c["p99_ms"]
        assert c["std_ms"] >= 0
        assert c["throughput_per_s"] == pytest.approx(c["batch"] * 1000.0 / c["mean_ms"])


def test_interleaving_gives_equal_run_counts(result):
    runs = {}
    for c in result["cells"]:
        runs.setdefault((c["provider"], c["batch"], c["seq"]), set()).add(c["runs"])
    assert all(len(v) == 1 for v in runs.values())


def test_speedups(result):
    sp = speedups(result)
    assert {(s["model"], s["batch"], s["seq"]) for s in sp if s["provider"] == "CPUExecutionProvider"} == {
        ("compressed", 1, 8),
        ("compressed", 2, 8),
    }
    by = {(c["model"], c["provider"], c["batch"]): c["p50_ms"] for c in result["cells"]}
    for s in sp:
        assert s["baseline"] == "dense"
        assert s["speedup_p50"] == pytest.approx(
            by[("dense", s["provider"], s["batch"])] / by[(s["model"], s["provider"], s["batch"])]
        )
    assert speedups(result, baseline="missing") == []


def test_a_repeated_cell_is_timed_in_passes_and_its_speedup_is_the_median_of_their_ratios(models):
    """The headline cell in three passes: each model's runs pooled over them, a p50 per pass, and the speedup the
    median of the passes' ratios (against dense fp32 and, by `speedups`' baseline, any other); the other cell is
    timed once, its speedup the ratio of p50s as before."""
    cfg = CFG.model_copy(update={"passes": 3})
    res = benchmark(models, VOCAB, cfg, repeat=(1, 8))
    json.dumps(res)
    cells = {(c["model"], c["batch"]): c for c in res["cells"]}
    for m in models:
        once, thrice = cells[(m, 2)], cells[(m, 1)]
        assert "pass_p50_ms" not in once and CFG.min_runs <= once["runs"] <= CFG.max_runs
        assert len(thrice["pass_p50_ms"]) == 3 and 3 * CFG.min_runs <= thrice["runs"] <= 3 * CFG.max_runs
    for baseline, model in (("dense", "compressed"), ("compressed", "dense")):
        rows = {r["batch"]: r for r in speedups(res, baseline)}
        ratios = [
            b / m for b, m in zip(cells[(baseline, 1)]["pass_p50_ms"], cells[(model, 1)]["pass_p50_ms"], strict=True)
        ]
        assert rows[1]["pass_speedups"] == pytest.approx(ratios, rel=1e-3)
        assert rows[1]["speedup_p50"] == pytest.approx(float(np.median(ratios)))
        assert "pass_speedups" not in rows[2]
        assert rows[2]["speedup_p50"] == pytest.approx(cells[(baseline, 2)]["p50_ms"] / cells[(model, 2)]["p50_ms"])
    md = render_markdown(_report({**res, "speedups": speedups(res)}))
    assert "1 × 8 was timed in 3 passes; its speedups are the median of the passes' ratios (one pass read: " in md


def test_the_median_of_pass_ratios_is_not_the_ratio_of_pooled_p50s():
    """A machine that slows every model in one pass (as a shared VM does for seconds at a time): the pooled p50s
    mix fast and slow passes unevenly, the passes' ratios do not."""
    cell = {"provider": "CPUExecutionProvider", "batch": 8, "seq": 128}
    result = {"cells": [
        {**cell, "model": "dense", "p50_ms": 120.0, "pass_p50_ms": [100.0, 104.0, 200.0]},
        {**cell, "model": "compressed-int8", "p50_ms": 12.0, "pass_p50_ms": [12.5, 13.0, 25.0]},
    ]}  # fmt: skip
    (row,) = speedups(result)
    assert row["pass_speedups"] == [8.0, 8.0, 8.0] and row["speedup_p50"] == 8.0  # pooled p50s would say 10x


def test_the_latency_script_times_the_headline_cell_in_passes(models, tmp_path):
    """`benchmarks/latency.py --passes N`: the 8 x 128 cell in N passes, its speedup the median of their ratios (the
    JSON carries each), the other cells once."""
    out = tmp_path / "lat.json"
    cmd = [sys.executable, "benchmarks/latency.py", f"dense={models['dense']}", f"small={models['compressed']}",
           "--vocab-size", str(VOCAB), "--batch", "1", "8", "--seq", "128", "--max-runs", "3", "--threads", "1",
           "--passes", "3", "--json", str(out)]  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1], timeout=300)
    assert run.returncode == 0, run.stderr
    rows = {r["batch"]: r for r in json.loads(out.read_text())["speedups"]}
    passes = rows[8]["pass_speedups"]
    assert len(passes) == 3 and rows[8]["speedup_p50"] == pytest.approx(np.median(passes), rel=1e-3)
    assert "pass_speedups" not in rows[1] and "(median of 3 passes" in run.stdout


def test_make_inputs(models):
    sess = make_session(models["dense"], threads=1)
    names = [i.name for i in sess.get_inputs()]
    feeds = make_inputs(["input_ids", "attention_mask"], 3, 7, VOCAB, seed=1)
    assert set(feeds) == {"input_ids", "attention_mask"}
    assert all(v.shape == (3, 7) and v.dtype == np.int64 for v in feeds.values())
    assert feeds["input_ids"].min() >= 0 and feeds["input_ids"].max() < VOCAB
    assert (feeds["attention_mask"] == 1).all()
    big = make_inputs(["input_ids", "token_type_ids"], 4, 64, 30522)["input_ids"]
    assert big.min() >= 1000 and big.max() < 30522
    assert (make_inputs(["token_type_ids"], 1, 4, VOCAB)["token_type_ids"] == 0).all()
    np.testing.assert_array_equal(
        make_inputs(names, 2, 5, VOCAB)["input_ids"], make_inputs(names, 2, 5, VOCAB)["input_ids"]
    )  # same seed, same ids
    assert sess.run(None, make_inputs(names, 2, 5, VOCAB))[0].shape == (2, 2)
    with pytest.raises(ValueError):
        make_inputs(["pixel_values"], 1, 4, VOCAB)


def test_encoder_flops_hand_computed():
    # hidden=8, 2 layers x 2 heads of dim 4 (attn width 8), ffn 16, seq 4, 2 labels. MACs per token/layer:
    #   QKV 3*8*8 = 192; scores+context 2*4*8 = 64; out proj 8*8 = 64; FFN 2*8*16 = 256 -> 576
    # per layer 4*576 = 2304; two layers 4608; pooler 8*8 = 64; classifier 8*2 = 16 -> 4688 MACs
    assert encoder_flops(8, [2, 2], 4, [16, 16], seq=4, num_labels=2) == 2 * 4688
    # Pruning one layer to 1 head and FFN 8: QKV 96, attn 32, out 32, FFN 128 -> 288/token, 1152/layer
    assert encoder_flops(8, [2, 1], 4, [16, 8], seq=4) == 2 * (2304 + 1152 + 64 + 16)


def test_smaller_ffn_gives_fewer_flops():
    uniform = encoder_flops(768, [12] * 12, 64, [3072] * 12, seq=128)
    assert encoder_flops(768, [12] * 12, 64, [1536] * 12, seq=128) < uniform
    assert encoder_flops(768, [12] * 12, 64, [3072] * 11 + [0], seq=128) < uniform
    with pytest.raises(ValueError):
        encoder_flops(768, [12] * 12, 64, [3072] * 11, seq=128)


def test_plot_latency(result, tmp_path):
    out = plot_latency(result, tmp_path / "sub" / "lat.png", title="tiny")
    assert out.exists() and out.stat().st_size > 1000
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    no_base = {**result, "cells": [c for c in result["cells"] if c["model"] != "dense"]}
    assert plot_latency(no_base, tmp_path / "nobase.png").stat().st_size > 0


@pytest.mark.filterwarnings("ignore:Specified provider")
def test_cuda_pass_skips_int8_and_unusable_provider(models, monkeypatch):
    # No GPU here: pretend CUDA is listed so the second pass runs; ORT then falls back (or fails)
    # for the float model, and the int8 model must be skipped by name before any session is made.
    import onnxruntime

    monkeypatch.setattr(
        onnxruntime, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"]
    )
    cfg = BenchSettings(batch_sizes=(1,), seq_lens=(8,), warmup=0, min_runs=1, max_runs=1, threads=1)
    res = benchmark({"dense": models["dense"], "dense_int8": models["compressed"]}, VOCAB, cfg)
    assert {c["provider"] for c in res["cells"]} == {"CPUExecutionProvider"}
    skipped = {(s["model"], s["provider"]): s["reason"] for s in res["skipped"]}
    assert "CPU-oriented" in skipped[("dense_int8", "CUDAExecutionProvider")]
    assert ("dense", "CUDAExecutionProvider") in skipped
    explicit = benchmark(
        {"dense": models["dense"]}, VOCAB, BenchSettings(batch_sizes=(1,), seq_lens=(8,), providers=("NopeProvider",))
    )
    assert explicit["cells"] == [] and explicit["skipped"][0]["reason"] == "provider not available"


# --- a busy machine: the load while timing, its verdict, and what report.md says -------------------------------


def test_cells_record_their_spread_and_the_run_the_machines_load(result):
    for c in result["cells"]:
        assert c["p90_over_p50"] == pytest.approx(c["p90_ms"] / c["p50_ms"]) and c["p90_over_p50"] >= 1
        assert c["iqr_rel"] >= 0 and c["others_cores"] >= 0
    m = result["machine"]
    assert (m["threads"], m["busy_cores"], m["cores"]) == (CFG.threads, CFG.busy_cores, physical_cores())
    assert m["allowed_cores"] == allowed_cores(CFG.threads, CFG.busy_cores)
    assert m["timed_s"] > 0 and m["others_cores"] >= 0 and m["own_cores"] >= 0  # 10 ms ticks: a short run may show 0
    assert m["loadavg_before"] >= 0 and m["loadavg_after"] >= 0
    worst = m["others_cores_worst_cell"] or 0.0
    assert m["busy"] == any(is_busy(o, CFG.threads, CFG.busy_cores) for o in (m["others_cores"], worst))


@pytest.mark.parametrize(
    ("others", "threads", "cores", "busy"),
    [
        (0.05, 2, 2, False),  # background noise
        (0.3, 2, 2, True),  # more than a quarter core taken from the cores the benchmark times on
        (1.8, 2, 2, True),  # a training on both cores
        (0.9, 1, 2, False),  # others on the core a one-thread benchmark leaves idle
        (1.3, 1, 2, True),  # ... and beyond it
    ],
)
def test_the_busy_verdict_counts_others_beyond_the_cores_the_benchmark_leaves_idle(others, threads, cores, busy):
    assert is_busy(others, threads, 0.25, cores) is busy


def _span(start: float, wall: float, others: float, own: float, load: float = 0.5) -> tuple[LoadSample, LoadSample]:
    """Two samples `wall` seconds apart during which others held `others` cores and this process `own`."""
    return (
        LoadSample(start, 1000.0, 10.0, load),
        LoadSample(start + wall, 1000.0 + (others + own) * wall, 10.0 + own * wall, load + 1),
    )


def test_machine_load_averages_others_over_the_cells_and_judges_long_cells_alone(monkeypatch):
    monkeypatch.setattr(bench_module, "physical_cores", lambda: 2)
    long, short = 3 * JUDGED_CELL_S, JUDGED_CELL_S / 5
    quiet = machine_load([_span(0, long, 0.05, 2.0), _span(long, long, 0.1, 2.0)], threads=2, busy_cores=0.25)
    assert not quiet["busy"] and quiet["others_cores"] == pytest.approx(0.075, abs=1e-3)
    assert quiet["own_cores"] == pytest.approx(2.0) and quiet["timed_s"] == pytest.approx(2 * long)
    assert (quiet["loadavg_before"], quiet["loadavg_after"]) == (0.5, 1.5)
    busy = machine_load([_span(0, long, 1.6, 1.0)], threads=2, busy_cores=0.25)
    assert busy["busy"] and busy["others_cores"] == pytest.approx(1.6)
    # a burst during one cell spoils that cell even where the average over the run stays under the threshold
    burst = machine_load([_span(0, 10 * long, 0.0, 2.0), _span(10 * long, long, 1.5, 2.0)], 2, 0.25)
    assert burst["others_cores"] < 0.25 < burst["others_cores_worst_cell"] and burst["busy"]
    # a cell too short to judge alone only counts in the average
    blip = machine_load([_span(0, 10 * long, 0.0, 2.0), _span(10 * long, short, 1.5, 2.0)], 2, 0.25)
    assert not blip["busy"] and blip["others_cores_worst_cell"] == 0.0


def _report(speed: dict, **extra) -> dict:
    """A report.json with only what render_markdown needs around the speed section."""
    base = {"task": "sst2", "method": "smp", "data": {"source": "sample"}, "teacher": {}}
    return {**base, **extra, "speed": {"params": {"dense": 1, "compressed": 1}, "speedups": [], "plot": "x", **speed}}


def test_report_md_says_a_quiet_run_was_quiet_with_its_figures(result, monkeypatch):
    monkeypatch.setattr(bench_module, "physical_cores", lambda: 2)
    machine = machine_load([_span(0, 2 * JUDGED_CELL_S, 0.04, 2.0, load=0.3)], threads=2, busy_cores=0.25)
    md = render_markdown(_report({**result, "machine": machine}))
    assert "Quiet machine: other processes held 0.04 cores on average" in md
    assert "0.25 allowed beside 2 timing threads; load average 0.30 before, 1.30 after" in md
    assert "not clean" not in md and "| p90/p50 | others' cores |" in md


def test_report_md_flags_a_busy_run_and_a_busy_plan_table(result, monkeypatch):
    monkeypatch.setattr(bench_module, "physical_cores", lambda: 2)
    machine = machine_load([_span(0, 2 * JUDGED_CELL_S, 1.7, 1.0, load=2.2)], threads=2, busy_cores=0.25)
    plan = {"table": {"machine": {**machine, "others_cores": 1.9}}}
    md = render_markdown(_report({**result, "machine": machine}, plan=plan))
    latency = md[md.index("## Latency") :]
    assert latency.index("Busy machine: other processes held 1.70 cores") < latency.index("| model |")
    assert "not clean" in latency and "load average 2.20 before, 3.20 after" in latency
    assert "plan's latency table was measured on a busy machine (other processes held 1.90 cores" in latency


@contextlib.contextmanager
def _burners(n: int):
    """`n` processes spinning on the CPU until the block ends."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        for p in procs:  # each one really on a core before the timing starts
            wait_until(lambda p=p: sum(psutil.Process(p.pid).cpu_times()[:2]) > 0.05)
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_benchmark_while_other_processes_spin_on_every_core_is_reported_busy(models):
    cfg = BenchSettings(
        batch_sizes=(1,), seq_lens=(8,), warmup=1, min_runs=3, max_runs=10**6, max_seconds_per_cell=2 * JUDGED_CELL_S
    )
    with _burners(psutil.cpu_count()):
        res = benchmark(models, VOCAB, cfg)
    m = res["machine"]
    assert m["busy"] and m["others_cores"] > m["allowed_cores"] and m["threads"] == physical_cores()
    assert all(c["others_cores"] > m["allowed_cores"] for c in res["cells"])
    md = render_markdown(_report(res))
    assert f"Busy machine: other processes held {m['others_cores']:.2f} cores" in md and "not clean" in md


def test_waiting_for_quiet_samples_the_machine_and_reports_what_others_still_hold():
    assert wait_until_quiet(0, physical_cores(), 0.25) == 0.0  # no time to sample: nothing measured
    with _burners(psutil.cpu_count()):
        others = wait_until_quiet(2 * JUDGED_CELL_S, physical_cores(), 0.25, window_s=JUDGED_CELL_S / 2)
    assert is_busy(others, physical_cores(), 0.25)  # still busy when the wait ran out


# --- the structure line: the teacher's widths against the artifact's ---------------------------------------------


def test_report_md_shows_the_teachers_widths_for_a_model_compressed_narrow(classifier_dirs, tmp_path):
    """MLP Fusion narrows FFNs while compressing, so compaction's widths in and out are equal; report.md must
    still say what the run did: the teacher's widths against the artifact's."""
    from export.onnx import export_optimized
    from pipeline.compress.compaction import compact_
    from pipeline.compress.methods.mlp_fusion.config import MlpFusionConfig
    from pipeline.compress.methods.mlp_fusion.stage import fuse_
    from pipeline.models.dense_graphs import dense_graphs
    from pipeline.models.io import load_model, save_model
    from pipeline.stages.bench import run as measure_speed

    teacher = str(classifier_dirs["bert"])  # 2 layers, 2 heads, FFN 64
    model = load_model(teacher)
    fuse_(model, MlpFusionConfig(ratio=0.25, layers=[1]))
    compaction = {**compact_(model), "max_abs_diff": 0.0}
    assert compaction["ffn_widths_before"] == compaction["ffn_widths"] == [64, 16]
    staging = tmp_path / "staging"
    save_model(model, None, staging / "pytorch")
    export_optimized(model, None, staging)
    (staging / ".work").mkdir()
    for name in ("dense.onnx", "dense.int8.onnx"):
        shutil.copy2(dense_graphs(teacher, str(tmp_path / "cache"))[0] / name, staging / ".work" / name)
    settings = BenchSettings(batch_sizes=(1,), seq_lens=(8,), warmup=0, min_runs=1, max_runs=2, threads=1)
    speed = measure_speed(str(staging), teacher, settings, headline=(1, 8))  # the cell a report leads with
    assert {(r["batch"], r["seq"]) for r in speed["headline"].values()} == {(1, 8)}
    assert set(speed["headline"]) == {"dense-int8", "compressed", "compressed-int8"}  # each against dense fp32
    md = render_markdown(_report(speed, compaction=compaction))
    assert "FFN widths 64×2 (teacher) → 64, 16 (artifact); heads 2×2 → 2×2" in md
    assert speed["shapes"]["dense"]["ffn"] == [64, 64] and speed["shapes"]["compressed"]["ffn"] == [64, 16]
    assert ("Quiet machine" in md) != ("Busy machine" in md)  # a real run says which it was


def test_real_lengths_run_every_batch_through_every_model_at_its_own_padding(models):
    rng = np.random.default_rng(0)
    batches = []
    for width in (5, 9, 3):  # each batch padded to its own longest, as the server pads
        ids = rng.integers(5, VOCAB, size=(2, width))
        mask = np.ones_like(ids)
        mask[1, width - 2 :] = 0
        batches.append({"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})
    out = bench_module.real_lengths(models, batches, rounds=2, threads=1)
    assert out["examples"] == 6 and out["batches"] == 3 and out["rounds"] == 2
    assert out["mean_padded_tokens_per_batch"] == round((10 + 18 + 6) / 3, 1)
    assert set(out["models"]) == set(models)
    for r in out["models"].values():
        assert r["seconds"] > 0 and r["examples_per_s"] == pytest.approx(6 / r["seconds"], rel=0.01)


@pytest.mark.e2e
def test_recipe_scores_compresses_compacts_and_scores_each_variant_in_torch_and_onnx(classifier_dirs, tmp_path):
    """`benchmarks/recipe_scores.py` runs each variant through the real compress and compact stages and scores it in
    torch and ONNX Runtime; the fp32 graph answers as torch does; a bad override is one line before any work."""
    script = [sys.executable, str(Path(__file__).parents[1] / "benchmarks" / "recipe_scores.py")]
    common = ["--teacher", str(classifier_dirs["bert"]), "--task", "sst2", "--cache-dir", str(tmp_path / "cache")]
    variants = ["--variant", "s=smp:config.train.max_steps=4,config.recover_steps=2,data.max_train=64,"
                "config.train.eval_every=2",
                "--variant", "d=distill@default:config.student.layers=1,config.transfer_steps=2,"
                "config.relation_heads=4,config.train.max_steps=2"]  # fmt: skip
    out = tmp_path / "rows.jsonl"
    done = subprocess.run([*script, *common, *variants, "--json", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {r["name"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert list(rows) == ["teacher", "s", "d"]
    assert (rows["s"]["recipe"], rows["d"]["recipe"]) == (None, "default")  # the task's default; one named
    assert rows["d"]["shape"]["num_hidden_layers"] == 1 and rows["s"]["shape"]["num_hidden_layers"] == 2
    steps = {name: [[step for step, _ in points] for points in rows[name]["curves"].values()] for name in "sd"}
    assert steps == {"s": [[2, 4], [2]], "d": [[2]]}  # masks at eval_every and at the end; recovery; distill
    for row in (rows["s"], rows["d"]):
        for split in ("validation", "dev"):
            assert row[f"onnx_fp32_{split}"] == row[f"torch_{split}"] and "accuracy" in row[f"onnx_int8_{split}"]
    bad = subprocess.run([*script, *common, "--variant", "x=smp:config.bogus=1"], capture_output=True, text=True)
    errors = [line for line in bad.stderr.splitlines() if line.startswith("error: ")]
    assert bad.returncode == 2 and errors == ["error: invalid smp config: bogus: Extra inputs are not permitted"]
    assert "teacher" not in bad.stdout  # refused before the teacher was scored
    bad = subprocess.run([*script, *common, "--variant", "x=smp@nosuch"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1] == "error: recipe not found: nosuch"


@pytest.mark.e2e
def test_int8_sensitivity_ranks_every_quantised_node_and_keeps_the_worst_in_fp32(classifier_dirs, tmp_path):
    """`benchmarks/int8_sensitivity.py` leaves each node int8 quantises in fp32 in turn, ranks them by the
    validation KL each removes, and keeps the top-ranked ones in fp32: the keep-1 graph is the ranking's first."""
    import onnx

    from export.onnx import export_onnx, optimize_onnx
    from pipeline.models.io import load_model

    script = [sys.executable, str(Path(__file__).parents[1] / "benchmarks" / "int8_sensitivity.py")]
    model, out = classifier_dirs["bert"], tmp_path / "sens.json"
    args = [str(model), "--keep", "1", "2", "--dense", str(model), "--max-runs", "3", "--json", str(out)]
    done = subprocess.run([*script, *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    fp32 = tmp_path / "fp32.onnx"
    optimize_onnx(export_onnx(load_model(model), None, tmp_path / "raw"), fp32)
    ops = {n.name: n.op_type for n in onnx.load(str(fp32)).graph.node}
    ranked = [r["node"] for r in result["ranking"]]
    whole = ("Attention", "EmbedLayerNormalization", "Gemm")
    assert sorted(ranked) == sorted(n for n, op in ops.items() if op in whole or (op == "MatMul" and "/dense/" in n))
    removed = [r["kl_removed"] for r in result["ranking"]]
    assert removed == sorted(removed, reverse=True) and result["kl_all_int8"] > 0
    variants = result["variants"]
    assert list(variants) == ["fp32", "int8", "int8-keep1", "int8-keep2"]
    assert variants["fp32"]["validation_kl"] == 0 and variants["int8"]["validation_kl"] == result["kl_all_int8"]
    assert variants["int8-keep1"]["validation_kl"] == pytest.approx(result["ranking"][0]["kl"], rel=1e-9)
    assert {c["model"] for c in result["latency"]} == {"dense", "dense-int8", *variants}
    bad = subprocess.run([*script, str(model), "--keep", "0"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.strip() == "error: --keep counts must be at least 1"


def test_int8_modes_variants_keep_the_nodes_they_name_in_fp32():
    from benchmarks.int8_modes import kept_fp32

    nodes = {
        "EmbedLayerNormalization_0": "embeddings",
        "Attention_0": "attention",
        "/bert/encoder/layer.0/attention/output/dense/MatMul": "linear",
        "/bert/encoder/layer.0/intermediate/dense/MatMul": "linear",
        "/bert/encoder/layer.0/output/dense/MatMul": "linear",
        "/classifier/Gemm": "linear",
    }
    assert kept_fp32("int8-dynamic", nodes) == []
    assert kept_fp32("int8-head-fp32", nodes) == ["/classifier/Gemm"]
    assert kept_fp32("int8-embed-fp32", nodes) == ["EmbedLayerNormalization_0"]
    assert kept_fp32("int8-ffn-out-fp32", nodes) == ["/bert/encoder/layer.0/output/dense/MatMul"]

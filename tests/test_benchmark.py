"""Tests for export/benchmark.py on real tiny BERT ONNX exports (CPU only, no timing asserts)."""

import json
import warnings

import numpy as np
import pytest

from export.benchmark import benchmark, encoder_flops, make_inputs, plot_latency, speedups
from export.sessions import make_session
from pipeline.config.schema import BenchSettings

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

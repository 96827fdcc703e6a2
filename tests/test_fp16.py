"""fp16 graphs for CUDA: made for every family, gated against fp32 on whichever provider there is (the CPU's here),
served with `--precision fp16` (IOBinding on CUDA, exercised here on the CPU), skipped by the CPU benchmark, and
artifacts made before them still read."""

import json
import re
import shutil
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from export.onnx import export_optimized
from pipeline.config.schema import Gates
from pipeline.models.families import family_of
from pipeline.stages.validate import fp16_check, gate_failures
from pipeline.train.parity import compare_logits
from serving.artifact import GRAPHS, ArtifactError, graphs_in
from serving.session import ArtifactSession
from tests.helpers import FAMILY_TYPES, sample_inputs, tiny_artifact, tiny_family_model

each_family = pytest.mark.parametrize("family", FAMILY_TYPES)


@each_family
def test_every_familys_fp16_graph_holds_fp16_weights_and_answers_as_fp32(family, tmp_path):
    model = tiny_family_model(family)
    report = export_optimized(model, None, tmp_path, fusion=family_of(model).ort_fusion, fp16=True)
    graph = onnx.load(str(tmp_path / GRAPHS["fp16"]))
    kinds = {i.data_type for i in graph.graph.initializer if len(i.dims) == 2}  # the weight matrices
    assert kinds == {onnx.TensorProto.FLOAT16} and report["fp16_casts"] > 0
    assert all(o.type.tensor_type.elem_type == onnx.TensorProto.FLOAT for o in graph.graph.output)  # fp32 out
    ids, mask = sample_inputs()
    feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": np.zeros_like(ids.numpy())}
    out = {}
    for precision in ("fp32", "fp16"):
        session = ort.InferenceSession(str(tmp_path / GRAPHS[precision]), providers=["CPUExecutionProvider"])
        out[precision] = session.run(["logits"], {i.name: feeds[i.name] for i in session.get_inputs()})[0]
    assert out["fp16"].dtype == np.float32
    np.testing.assert_allclose(out["fp16"], out["fp32"], atol=2e-2)


def test_export_without_fp16_writes_no_fp16_graph(tmp_path):
    export_optimized(tiny_family_model("bert"), None, tmp_path)
    assert not (tmp_path / GRAPHS["fp16"]).exists()


def _logits(n=400, seed=0):
    return np.random.default_rng(seed).normal(size=(n, 2)).astype(np.float32)


def test_the_fp16_gate_passes_near_fp32_and_names_what_failed():
    gates = Gates()
    fp32 = _logits()
    assert fp16_check(fp32, fp32 + 1e-4, 0.0, gates, vectors=False)["passed"]
    flipped = fp32.copy()
    flipped[:8] = flipped[:8, ::-1]  # 2% of the rows change class
    failed = fp16_check(fp32, flipped, 0.1, gates, vectors=False)
    assert not failed["passed"] and "argmax agreement 0.9800 with fp32 (limit 0.99)" in failed["why"]
    dropped = fp16_check(fp32, fp32, 0.75, gates, vectors=False)
    assert not dropped["passed"] and dropped["why"] == "0.75 points below fp32 (limit 0.5)"
    parity = compare_logits(fp32, fp32, 1e-4)
    assert gate_failures(parity, 0.0, gates, "accuracy", 90.0, 90.0, dropped) == [
        "fp16 graph: 0.75 points below fp32 (limit 0.5)"
    ]


def test_the_fp16_gate_on_vectors_is_each_texts_cosine():
    gates = Gates()
    vectors = _logits(50, 1).repeat(8, axis=1)
    assert fp16_check(vectors, vectors * 1.001, 0.0, gates, vectors=True)["passed"]
    turned = vectors.copy()
    turned[0] = -turned[0]
    failed = fp16_check(vectors, turned, 0.0, gates, vectors=True)
    assert not failed["passed"] and failed["why"].startswith("least cosine -1.000000 to fp32 (limit 0.999)")


def test_the_new_gates_leave_the_serialised_config_as_it_was():
    assert "fp16_max_drop" not in Gates().model_dump()
    assert Gates(fp16_max_drop=0.2).model_dump()["fp16_max_drop"] == 0.2


@pytest.mark.parametrize("task", ["sst2", "conll2003", "squad"])
def test_the_fp16_graph_serves_and_answers_as_fp32(task, tmp_path_factory):
    artifact = tiny_artifact(tmp_path_factory.mktemp(task), task)
    items = {"sst2": ["a fine film", "dull and long"], "conll2003": ["John lives in Paris"]}.get(task)
    if items is None:
        from serving.validation import Question

        items = [Question("who lives in Paris ?", "John lives in Paris and works in Lyon .")]
    fp32, fp16 = (ArtifactSession(artifact, p, spinning=False) for p in ("fp32", "fp16"))
    a, b = fp32.run(fp32.encode(items)), fp16.run(fp16.encode(items))
    for x, y in zip(np.asarray(a, dtype=object).ravel(), np.asarray(b, dtype=object).ravel(), strict=True):
        np.testing.assert_allclose(np.asarray(y, dtype=np.float32), np.asarray(x, dtype=np.float32), atol=2e-2)


def test_io_binding_answers_as_a_plain_run(tmp_path_factory):
    """The CUDA path's IOBinding, run on the CPU provider: the same rows, bit for bit."""
    artifact = tiny_artifact(tmp_path_factory.mktemp("bound"))
    texts = ["a fine film", "dull and long, and then some more words"]
    plain = ArtifactSession(artifact, "fp16", spinning=False)
    bound = ArtifactSession(artifact, "fp16", spinning=False, io_binding=True)
    assert bound.io_binding and not plain.io_binding
    np.testing.assert_array_equal(bound.logits(texts), plain.logits(texts))
    assert bound.predict(texts) == plain.predict(texts)


def test_an_artifact_made_before_fp16_graphs_reads_and_refuses_fp16_in_one_line(tmp_path_factory, tmp_path):
    old = shutil.copytree(tiny_artifact(tmp_path_factory.mktemp("old")), tmp_path / "old")
    (old / GRAPHS["fp16"]).unlink()
    manifest = json.loads((old / "manifest.json").read_text())
    del manifest["files"][GRAPHS["fp16"]]
    (old / "manifest.json").write_text(json.dumps(manifest))
    assert set(graphs_in(old)) == {"fp32", "int8"}
    assert ArtifactSession(old, "int8").predict(["fine"])
    with pytest.raises(ArtifactError, match=re.escape("has no model.fp16.onnx (made before fp16 graphs)")):
        ArtifactSession(old, "fp16")


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="this machine has CUDA")
def test_serving_on_cuda_without_it_is_one_line(tmp_path_factory):
    artifact = tiny_artifact(tmp_path_factory.mktemp("nocuda"))
    with pytest.raises(ArtifactError, match="no CUDAExecutionProvider"):
        ArtifactSession(artifact, "fp16", device="cuda")
    out = subprocess.run(
        [sys.executable, "-m", "serving", str(artifact), "--port", "0", "--precision", "fp16", "--device", "cuda"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2 and len(lines) == 1 and "no CUDAExecutionProvider" in lines[0], out


def test_the_cpu_benchmark_skips_fp16_graphs_and_says_why(tmp_path_factory):
    from export.benchmark import benchmark
    from pipeline.config.schema import BenchSettings

    artifact = tiny_artifact(tmp_path_factory.mktemp("bench"))
    models = {"compressed": artifact / GRAPHS["fp32"], "compressed-fp16": artifact / GRAPHS["fp16"]}
    grid = BenchSettings(batch_sizes=(1,), seq_lens=(8,), warmup=1, min_runs=2, max_runs=2,
                         providers=("CPUExecutionProvider",))  # fmt: skip
    result = benchmark(models, 100, grid)
    assert {c["model"] for c in result["cells"]} == {"compressed"}
    assert result["skipped"] == [{"model": "compressed-fp16", "provider": "CPUExecutionProvider",
                                  "reason": "fp16 graph is for CUDA (no faster than fp32 on a CPU)"}]  # fmt: skip


def test_the_torch_latency_script_times_each_model_against_the_first(tmp_path):
    """benchmarks/torch_latency.py, the GPU figure where only torch has CUDA, run here on the CPU in fp32."""
    from benchmarks.torch_latency import main
    from tests.helpers import write_tiny_family_dir

    dense = write_tiny_family_dir(tmp_path / "dense", "bert", layers=3, ffn=40)
    small = write_tiny_family_dir(tmp_path / "small", "bert", layers=1, ffn=8)
    out = tmp_path / "t.json"
    args = [f"dense={dense}", f"small={small}", "--device", "cpu", "--batch", "1", "2", "--seq", "8", "--runs", "3"]
    assert main([*args, "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["dtype"] == "torch.float32" and len(record["cells"]) == 4
    assert [(r["model"], r["batch"]) for r in record["speedups"]] == [("small", 1), ("small", 2)]
    assert all(c["p50_ms"] > 0 for c in record["cells"])
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit) as refused:
            main([f"dense={dense}", "--device", "cuda"])
        assert refused.value.code == 2

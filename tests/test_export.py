"""ONNX export parity for non-uniform models, int8 quantisation, and the validation gates."""

import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from export.onnx import export_optimized, op_counts
from pipeline.compress.compaction import compact_
from pipeline.compress.methods.mlp_fusion.config import MlpFusionConfig
from pipeline.compress.methods.mlp_fusion.stage import fuse_
from pipeline.config.schema import Gates
from pipeline.data.encoding import encode
from pipeline.data.loaders import load_task_data
from pipeline.stages.validate import gate_failures
from pipeline.train.metrics import predict_logits
from pipeline.train.parity import compare_logits, onnx_logits
from tests.helpers import tiny_model, tiny_tokenizer


@pytest.fixture(scope="module")
def dev_texts():
    return load_task_data("sst2", source="sample", max_dev=96).dev


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_compacted_non_uniform_model_exports_with_parity(family, dev_texts, tmp_path):
    model = tiny_model(family, layers=3)
    fuse_(model, MlpFusionConfig(ratio=0.25, layers=[1]))
    compact_(model)
    tokenizer = tiny_tokenizer(family)
    report = export_optimized(model, tokenizer, tmp_path)
    assert report["fused_ops"].get("Attention") == 3
    enc = encode(tokenizer, dev_texts, 64)
    ref = predict_logits(model, enc)
    parity = compare_logits(ref, onnx_logits(tmp_path / "model.onnx", enc), atol=1e-4)
    assert parity.passed, parity
    assert (tmp_path / "config.json").is_file() and (tmp_path / "tokenizer.json").is_file()
    # int8: weights quantised, attention fused and quantised, predictions mostly unchanged
    ops = op_counts(tmp_path / "model.int8.onnx")
    assert ops.get("MatMulInteger", 0) > 0
    assert ops.get("QAttention") == 3  # one per layer, int8, in the int8 graph itself
    int8 = compare_logits(ref, onnx_logits(tmp_path / "model.int8.onnx", enc))
    assert int8.argmax_agreement > 0.8
    assert (tmp_path / "model.int8.onnx").stat().st_size < (tmp_path / "model.onnx").stat().st_size


def test_exported_graph_has_dynamic_batch_and_sequence(tmp_path):
    import onnx

    export_optimized(tiny_model("bert"), tiny_tokenizer("bert"), tmp_path)
    graph = onnx.load(tmp_path / "model.onnx").graph
    for inp in graph.input:
        dims = inp.type.tensor_type.shape.dim
        assert [d.dim_param for d in dims] == ["batch_size", "sequence_length"]


def test_name_heads_writes_each_projections_head_count_where_the_graph_says_minus_one(tmp_path):
    """transformers 5 traces the Q/K/V reshapes as (batch, tokens, -1, head size), which ORT's attention fuser cannot
    count: `name_heads` writes each projection's own count (its width over the head size: 3 heads, and 1 where a
    layer kept one), and the graph computes the same values."""
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    from export.attention_graph import name_heads

    class Projections(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.full, self.pruned = torch.nn.Linear(32, 48), torch.nn.Linear(32, 16)

        def forward(self, x):
            b, t = x.shape[:2]
            return tuple(p(x).view(b, t, -1, 16).transpose(1, 2) for p in (self.full, self.pruned))

    path = tmp_path / "heads.onnx"
    x = torch.randn(2, 5, 32)
    axes = {"x": {0: "b", 1: "t"}}
    torch.onnx.export(Projections().eval(), (x,), str(path), input_names=["x"], dynamic_axes=axes, dynamo=False)
    feed = {"x": torch.randn(3, 7, 32).numpy()}
    before = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feed)
    assert name_heads(path) == 2 and name_heads(path) == 0  # the second pass finds nothing left to name
    graph = onnx.load(str(path)).graph
    counts = sorted(int(numpy_helper.to_array(t)[0]) for t in graph.initializer if t.name.endswith("/heads"))
    assert counts == [1, 3]
    after = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feed)
    for a, b in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, b)
    assert [a.shape[1] for a in after] == [3, 1]


def test_an_artifact_is_made_without_optimum_installed(tmp_path):
    """Export, fusion and int8 import nothing from optimum: a process where it cannot be imported makes both
    graphs (Optimum is a reader of the artifact, not a maker of it)."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['optimum'] = None\n"
        "from export.onnx import export_optimized\n"
        "from tests.helpers import tiny_model, tiny_tokenizer\n"
        "print(export_optimized(tiny_model('bert'), tiny_tokenizer('bert'), sys.argv[1])['fused_ops']['Attention'])"
    )
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[1])  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "2" and (tmp_path / "model.int8.onnx").is_file()


def test_compare_logits():
    a = np.array([[0.0, 1.0], [2.0, 0.0]], dtype=np.float32)
    report = compare_logits(a, a + 5e-5, atol=1e-4)
    assert report.passed and report.max_abs_diff == pytest.approx(5e-5, rel=1e-2)
    flipped = compare_logits(a, a[:, ::-1].copy(), atol=10.0)
    assert flipped.argmax_agreement == 0.0 and not flipped.passed  # within atol but different argmax
    with pytest.raises(ValueError, match="shapes differ"):
        compare_logits(a, a[:1])


def test_gate_failures():
    gates = Gates()
    a = np.zeros((4, 2), dtype=np.float32)
    good = compare_logits(a, a + 1e-6, gates.onnx_atol)
    bad = compare_logits(a, a + 1e-3, gates.onnx_atol)
    on_par = ("accuracy", 90.0, 90.0)  # the compressed model matches its teacher
    assert gate_failures(good, 0.5, gates, *on_par) == []
    assert (
        len(gate_failures(bad, 0.5, gates, *on_par)) == 1 and "ONNX fp32" in gate_failures(bad, 0.5, gates, *on_par)[0]
    )
    assert "int8" in gate_failures(good, 1.5, gates, *on_par)[0]
    assert len(gate_failures(bad, 3.0, gates, *on_par)) == 2
    assert gate_failures(good, 0.0, gates, "f1", teacher=90.0, compressed=87.0) == []  # exactly the budget
    (line,) = gate_failures(good, 0.0, gates, "f1", teacher=90.0, compressed=86.5)
    assert line == (
        "compressed f1 86.50 is 3.50 points below the teacher's 90.00 on the validation split "
        "(gates.max_metric_drop 3.0)"
    )
    assert len(gate_failures(bad, 3.0, gates, "accuracy", 90.0, 80.0)) == 3


def test_ort_runs_the_same_batches_as_torch(dev_texts, tmp_path):
    """Padding differs per batch; parity must compare example by example in the same order."""
    model, tokenizer = tiny_model("bert"), tiny_tokenizer("bert")
    export_optimized(model, tokenizer, tmp_path)
    enc = encode(tokenizer, dev_texts, 64)
    single = np.stack(
        [
            onnx_logits(tmp_path / "model.onnx", encode(tokenizer, type(dev_texts)([t], [y]), 64))[0]
            for t, y in zip(dev_texts.texts[:5], dev_texts.labels[:5], strict=True)
        ]
    )
    batched = onnx_logits(tmp_path / "model.onnx", enc, batch_size=32)[:5]
    assert np.abs(single - batched).max() < 1e-4
    torch_single = predict_logits(
        model, encode(tokenizer, type(dev_texts)(dev_texts.texts[:5], dev_texts.labels[:5]), 64)
    )
    assert np.abs(torch_single - batched).max() < 1e-4


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_model_with_headless_and_zero_width_layers_exports_with_parity(family, dev_texts, tmp_path, caplog):
    """Heads [0, 3, 1] and FFN widths [64, 0, 64]: ORT runs it, fuses attention where heads remain (without warning
    that the pruned layers' Q/K/V width differs from the hidden size), quantises it."""
    from pipeline.models.layers import encoder_layers

    model = tiny_model(family, layers=3, heads=4)
    layers = encoder_layers(model)
    with torch.no_grad():
        for i, dead in ((0, (0, 1, 2, 3)), (1, (2,)), (2, (0, 1, 3))):
            att = layers[i].attention
            for h in dead:  # odd heads: zero W_O columns; even heads: zero W_V rows, nonzero b_V (folded into b_O)
                if h % 2:
                    att.output.dense.weight[:, h * 8 : (h + 1) * 8] = 0
                else:
                    att.self.value.weight[h * 8 : (h + 1) * 8] = 0
                    att.self.value.bias[h * 8 : (h + 1) * 8].normal_()
        layers[1].output.dense.weight.zero_()
    report = compact_(model)
    assert report["heads"] == [0, 3, 1] and report["ffn_widths"] == [64, 0, 64]
    tokenizer = tiny_tokenizer(family)
    exported = export_optimized(model, tokenizer, tmp_path)
    assert exported["fused_ops"].get("Attention") == 2  # one per layer that still has heads
    assert not [r for r in caplog.records if r.name == "fusion_attention" and r.levelno >= logging.WARNING]
    enc = encode(tokenizer, dev_texts, 64)
    ref = predict_logits(model, enc)
    parity = compare_logits(ref, onnx_logits(tmp_path / "model.onnx", enc), atol=1e-4)
    assert parity.passed, parity
    ops = op_counts(tmp_path / "model.int8.onnx")
    assert ops.get("MatMulInteger", 0) > 0 and ops.get("MatMul") == 2  # the zero-width FFN's, kept fp32
    int8 = compare_logits(ref, onnx_logits(tmp_path / "model.int8.onnx", enc))
    assert int8.argmax_agreement > 0.8 and int8.max_abs_diff < 0.5  # MatMulInteger with K=0 gave garbage here


def test_static_int8_is_close_to_fp32_and_batch_invariant(dev_texts, tmp_path):
    """Static QDQ int8 (scales calibrated on train sentences) keeps fp32's labels and gives a sentence the same
    scores whatever it is batched with; dynamic int8 recomputes activation scales per call, so it may not."""
    model, tokenizer = tiny_model("bert", layers=2), tiny_tokenizer("bert")
    train = load_task_data("sst2", source="sample", max_train=64).train
    calibration = encode(tokenizer, train, 64).features
    report = export_optimized(model, tokenizer, tmp_path / "static", calibration=calibration)
    assert report["int8"] == "static" and report["int8_ops"].get("QuantizeLinear", 0) > 0
    assert "MatMulInteger" not in op_counts(tmp_path / "static" / "model.int8.onnx")
    enc = encode(tokenizer, dev_texts, 64)
    fp32 = onnx_logits(tmp_path / "static" / "model.onnx", enc)
    int8 = tmp_path / "static" / "model.int8.onnx"
    alone, batched = (
        onnx_logits(int8, enc, batch_size=1),
        onnx_logits(int8, enc, batch_size=8),
    )  # padded to the longest
    assert (alone.argmax(1) == fp32.argmax(1)).mean() >= 0.9
    assert np.abs(alone - batched).max() < 1e-4  # batch-invariant


def _int8_weights(path) -> list[np.ndarray]:
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(path)).graph
    return [numpy_helper.to_array(t) for t in graph.initializer if t.data_type == onnx.TensorProto.INT8]


def test_int8_weights_take_seven_bits_so_cpus_without_vnni_do_not_saturate(tmp_path):
    """VPMADDUBSW (AVX2, AVX-512 without VNNI) adds two u8 x s8 products into a saturating int16: weights in
    [-64, 64] keep every such sum in range, so the int8 graph is right on any x86 CPU it is served on."""
    model, tokenizer = tiny_model("bert", layers=2), tiny_tokenizer("bert")
    export_optimized(model, tokenizer, tmp_path / "dynamic")
    train = load_task_data("sst2", source="sample", max_train=16).train
    export_optimized(model, tokenizer, tmp_path / "static", calibration=encode(tokenizer, train, 64).features)
    for mode in ("dynamic", "static"):
        weights = _int8_weights(tmp_path / mode / "model.int8.onnx")
        assert weights, mode
        assert max(int(np.abs(w.astype(np.int32)).max()) for w in weights) <= 64, mode
        assert min(int(w.min()) for w in weights) < -32, mode  # the 7 bits are used, not a narrower range


def test_a_linear_kept_in_fp32_stays_fp32_whether_matmul_or_gemm(tmp_path):
    """`quantize_int8(keep_fp32=...)` names nodes as the fp32 graph does. A sequence classifier's head and pooler
    are Gemm nodes, which dynamic quantisation renames (`<name>_MatMul`) before it reads the exclusions: kept by
    their fp32 names, they stay fp32 all the same."""
    import onnx

    from export.onnx import export_onnx, optimize_onnx, quantize_int8

    fp32 = tmp_path / "fp32.onnx"
    optimize_onnx(export_onnx(tiny_model("bert", layers=2), None, tmp_path / "raw"), fp32)
    nodes = {n.name: n.op_type for n in onnx.load(str(fp32)).graph.node}
    gemm = next(name for name, op in nodes.items() if op == "Gemm")
    matmul = next(name for name, op in nodes.items() if op == "MatMul" and "/output/dense/" in name)
    full = quantize_int8(fp32, tmp_path / "all.onnx")
    assert "MatMul" not in full
    for kept in (gemm, matmul):
        counts = quantize_int8(fp32, tmp_path / "kept.onnx", [kept])
        assert counts["MatMulInteger"] == full["MatMulInteger"] - 1, kept
        assert counts["MatMul"] == 1, kept  # the kept linear, in float


def test_the_graph_structure_sees_the_work_not_the_weights_names_or_float_attributes(tmp_path):
    """The latency table's key: two exports that do the same work share a table, whatever made them."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from export.onnx import graph_structure

    def graph(name: str, op: str = "Add", weight: float = 1.0, fill: float | None = None, width: int = 4) -> Path:
        attrs = {} if fill is None else {"alpha": fill}
        node = helper.make_node("LeakyRelu" if fill is not None else op, ["x"] + ([] if fill is not None else ["w"]),
                                ["y"], name=f"{name}-node", **attrs)  # fmt: skip
        w = numpy_helper.from_array(np.full((width,), weight, dtype=np.float32), name=f"{name}-w")
        g = helper.make_graph([node], name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, width])],
                              initializer=[] if fill is not None else [w])  # fmt: skip
        path = tmp_path / f"{name}.onnx"
        onnx.save(helper.make_model(g), str(path))
        return path

    same = graph_structure(graph("a"))
    assert graph_structure(graph("b", weight=2.0)) == same  # other weights and names
    assert graph_structure(graph("c", op="Mul")) != same  # another operator
    assert graph_structure(graph("d", width=8)) != same  # other shapes
    assert graph_structure(graph("e", fill=0.1)) == graph_structure(graph("f", fill=0.2))  # a float attribute

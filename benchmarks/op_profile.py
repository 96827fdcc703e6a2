"""Where an ONNX graph's time goes, by operator type: ONNX Runtime's own profiler over timed runs.

    python benchmarks/op_profile.py NAME=PATH.onnx [NAME=PATH.onnx ...] [--teacher DIR --shape LxHxF[:relu] ...]
                                    [--batch 8] [--seq 128] [--runs 10] [--threads N] [--json out.json]
                                    [--keep DIR]

Each graph (or each `--shape` cut from `--teacher` and exported as an artifact is, int8) runs `--runs` times at
batch x seq after two warm-up runs, with ORT's profiling on; the node events are summed per operator type and
grouped: integer matmuls (what int8 speeds up), float matmuls, quantising activations (DynamicQuantizeLinear and
its kin, the price of dynamic int8), normalisation and elementwise float work (LayerNorm, GELU, Softmax, Add, ...:
what int8 cannot speed up), and the rest. The share left in float ops bounds what int8 can still give.
A shape ending in `:relu` has its FFN activations swapped for ReLU (a distill student's `activation: relu`);
`--keep DIR` keeps the cut graphs (DIR/SHAPE/model.int8.onnx) for `benchmarks/latency.py` to time end to end.
Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere without installing

import numpy as np
import onnxruntime as ort

from export.sessions import physical_cores

GROUPS = {
    "integer matmul": {"MatMulInteger", "QAttention", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QGemm"},
    "float matmul": {"MatMul", "Gemm", "FusedMatMul", "Attention", "MultiHeadAttention"},
    "quantise activations": {"DynamicQuantizeLinear", "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLSTM"},
    "normalise, activate": {
        "LayerNormalization",
        "SkipLayerNormalization",
        "EmbedLayerNormalization",
        "SimplifiedLayerNormalization",
        "Gelu",
        "FastGelu",
        "BiasGelu",
        "Relu",
        "Softmax",
        "Erf",
        "Tanh",
    },
    "elementwise": {"Add", "Mul", "Sub", "Div", "Cast", "Where", "Sqrt", "Pow", "BiasAdd"},
}


def group_of(op: str) -> str:
    return next((g for g, ops in GROUPS.items() if op in ops), "other (shape, gather, ...)")


def profile(path: Path, batch: int, seq: int, runs: int, threads: int, vocab: int) -> dict[str, float]:
    """Milliseconds per run by operator type."""
    opts = ort.SessionOptions()
    opts.enable_profiling = True
    opts.intra_op_num_threads = threads
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    with tempfile.TemporaryDirectory() as tmp:
        opts.profile_file_prefix = str(Path(tmp) / "profile")
        sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(0)
        feeds = {}
        for i in sess.get_inputs():
            dtype = np.int64 if "int64" in i.type else np.int32
            if i.name == "input_ids":
                feeds[i.name] = rng.integers(5, vocab, (batch, seq)).astype(dtype)
            elif i.name == "attention_mask":
                feeds[i.name] = np.ones((batch, seq), dtype=dtype)
            else:
                feeds[i.name] = np.zeros((batch, seq), dtype=dtype)
        for _ in range(2):
            sess.run(None, feeds)
        sess.end_profiling()  # drop the warm-up runs' events
        opts.enable_profiling = True
        sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        for _ in range(runs):
            sess.run(None, feeds)
        events = json.loads(Path(sess.end_profiling()).read_text())
    per_op: dict[str, float] = defaultdict(float)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            per_op[e["args"]["op_name"]] += e["dur"] / 1000 / runs
    return dict(per_op)


def cut_graphs(teacher: str, shapes: list[str], out: Path) -> dict[str, Path]:
    from export.onnx import export_optimized
    from pipeline.compress.compaction import cut_from
    from pipeline.models.io import load_model
    from pipeline.models.layers import set_activation_
    from serving.artifact import GRAPHS

    model, graphs = load_model(teacher), {}
    for text in shapes:
        shape, _, activation = text.partition(":")
        layers, heads, ffn = (int(x) for x in shape.split("x"))
        cut = cut_from(model, list(range(layers)), heads, ffn)[0]
        if activation:
            set_activation_(cut, activation)
        name = text.replace(":", "-")
        export_optimized(cut, None, out / name)
        graphs[text] = out / name / GRAPHS["int8"]
    return graphs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("graphs", nargs="*", metavar="NAME=PATH.onnx")
    parser.add_argument("--teacher")
    parser.add_argument("--shape", action="append", default=[], help="LxHxF[:relu] cut from --teacher")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--threads", type=int, default=physical_cores())
    parser.add_argument("--vocab-size", type=int, default=30000)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--keep", type=Path, help="keep the cut graphs in this folder")
    args = parser.parse_args()
    if args.shape and not args.teacher:
        sys.exit("error: --shape needs --teacher")
    graphs = {}
    for item in args.graphs:
        name, sep, path = item.partition("=")
        if not sep or not Path(path).is_file():
            sys.exit(f"error: {item!r} is not NAME=PATH to an ONNX file")
        graphs[name] = Path(path)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        graphs.update(cut_graphs(args.teacher, args.shape, args.keep or Path(tmp)) if args.shape else {})
        if not graphs:
            sys.exit("error: no graph to profile")
        for name, path in graphs.items():
            results[name] = profile(path, args.batch, args.seq, args.runs, args.threads, args.vocab_size)
    print(f"# ms per run at {args.batch} x {args.seq}, {args.threads} threads, ORT {ort.__version__} profiler")
    for name, per_op in results.items():
        total = sum(per_op.values())
        groups: dict[str, float] = defaultdict(float)
        for op, ms in per_op.items():
            groups[group_of(op)] += ms
        print(f"\n{name}: {total:.2f} ms in kernels")
        for group, ms in sorted(groups.items(), key=lambda kv: -kv[1]):
            ops = sorted(((op, t) for op, t in per_op.items() if group_of(op) == group), key=lambda kv: -kv[1])
            detail = ", ".join(f"{op} {t:.2f}" for op, t in ops[:4])
            print(f"  {group:<28} {ms:8.2f} ms {100 * ms / total:5.1f}%   {detail}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

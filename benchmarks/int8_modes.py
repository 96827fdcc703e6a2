"""int8 and fusion choices measured on one model: accuracy, speed and batch invariance, in one process.

Variants, all from the same compacted (or dense) PyTorch folder:
  fp32               the artifact's fused graph (EmbedLayerNormalization fused, exact GELU)
  fp32-no-embed-ln   without the EmbedLayerNormalization fusion (what Optimum's optimizer does)
  fp32-gelu-approx   with ORT's tanh GELU approximation
  int8-dynamic       the artifact's int8 graph (dynamic activations, per-channel weights)
  int8-static        static QDQ (MatMul/Gemm, per-channel, MatMulConstBOnly), calibrated on train sentences

Accuracy on the validation split carved from train and on dev; batch invariance: every dev sentence scored
alone and inside batches of `--batch` (padded to the longest), max |Δ logits| and labels that differ; latency
p50 at each `--batch` x `--seq` cell, interleaved, against the dense fp32 graph when `--dense` is given.

Usage:
    python benchmarks/int8_modes.py MODEL_DIR --data-dir ../shared/data/sst2 [--task sst2] [--dense TEACHER_DIR]
        [--calibration 256] [--batch 8] [--bench-batch 1 8] [--seq 128] [--max-length 128] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere without installing

from export.benchmark import benchmark, speedups
from export.onnx import export_onnx, optimize_onnx, quantize_int8, quantize_static_int8
from export.parity import onnx_logits
from pipeline.config.schema import BenchSettings
from pipeline.data.encoding import encode
from pipeline.data.loaders import DataRef, Split
from pipeline.errors import PipelineError
from pipeline.models.folders import load_tokenizer
from pipeline.models.io import load_model
from pipeline.train.metrics import scores


def build_variants(model_dir: Path, out: Path) -> dict[str, Path]:
    """Every variant but the static one (it needs calibration feeds named after the fp32 graph's inputs)."""
    raw = export_onnx(load_model(model_dir), None, out / "raw")
    paths = {
        "fp32": out / "fp32.onnx",
        "fp32-no-embed-ln": out / "fp32-no-embed-ln.onnx",
        "fp32-gelu-approx": out / "fp32-gelu-approx.onnx",
        "int8-dynamic": out / "int8-dynamic.onnx",
    }
    optimize_onnx(raw, paths["fp32"])
    optimize_onnx(raw, paths["fp32-no-embed-ln"], embed_layer_norm=False)
    optimize_onnx(raw, paths["fp32-gelu-approx"], gelu_approximation=True)
    quantize_int8(paths["fp32"], paths["int8-dynamic"])
    return paths


def batch_invariance(path: Path, enc, batch: int) -> dict:
    """Each example scored alone vs inside consecutive batches of `batch` (padded to their longest)."""
    alone, batched = onnx_logits(path, enc, batch_size=1), onnx_logits(path, enc, batch_size=batch)
    return {
        "max_abs_diff": float(np.abs(alone - batched).max()),
        "labels_changed": int((alone.argmax(1) != batched.argmax(1)).sum()),
        "examples": len(enc),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path, help="a classifier folder (an artifact's pytorch/, or a teacher)")
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--task", default="sst2")
    ap.add_argument("--dense", type=Path, help="the dense teacher folder, timed as the fp32 baseline")
    ap.add_argument("--calibration", type=int, default=256, help="train sentences for static calibration")
    ap.add_argument("--batch", type=int, default=8, help="batch size of the invariance check")
    ap.add_argument("--bench-batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--seq", type=int, nargs="+", default=[128])
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--max-runs", type=int, default=100)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    try:
        data = DataRef(args.task, "tsv", args.data_dir).load()
        tokenizer = load_tokenizer(args.model)
    except PipelineError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    train = data.train
    calib_split = Split(train.texts[: args.calibration], train.labels[: args.calibration])
    calib_enc = encode(tokenizer, calib_split, args.max_length)
    splits = {"validation": encode(tokenizer, data.validation, args.max_length)}
    splits["dev"] = encode(tokenizer, data.dev, args.max_length)
    with tempfile.TemporaryDirectory() as tmp:
        paths = build_variants(args.model, Path(tmp))
        paths["int8-static"] = Path(tmp) / "int8-static.onnx"
        quantize_static_int8(paths["fp32"], paths["int8-static"], calib_enc.features)
        result: dict = {"model": str(args.model), "calibration_sentences": len(calib_enc), "variants": {}}
        for name, path in paths.items():
            entry = {split: scores(onnx_logits(path, enc), enc)["accuracy"] for split, enc in splits.items()}
            entry["batch_invariance"] = batch_invariance(path, splits["dev"], args.batch)
            result["variants"][name] = entry
        timed = dict(paths)
        if args.dense:
            dense_dir = Path(tmp) / "dense"
            raw = export_onnx(load_model(args.dense), None, dense_dir)
            optimize_onnx(raw, dense_dir / "dense.onnx")
            timed = {"dense": dense_dir / "dense.onnx", **timed}
        settings = BenchSettings(
            batch_sizes=tuple(args.bench_batch), seq_lens=tuple(args.seq), max_runs=args.max_runs,
            providers=("CPUExecutionProvider",),
        )  # fmt: skip
        bench = benchmark(timed, len(tokenizer), settings)
        result["device"] = bench["device"]
        result["latency"] = [{k: c[k] for k in ("model", "batch", "seq", "p50_ms")} for c in bench["cells"]]
        result["speedups"] = speedups(bench, "dense" if args.dense else "fp32")
    print(f"{'variant':<18} {'validation':>10} {'dev':>7} {'alone≠batched':>14} {'max|Δ|':>9}")
    for name, v in result["variants"].items():
        inv = v["batch_invariance"]
        print(
            f"{name:<18} {v['validation']:>10.2f} {v['dev']:>7.2f} "
            f"{inv['labels_changed']:>6}/{inv['examples']:<7} {inv['max_abs_diff']:>9.2e}"
        )
    base = "dense" if args.dense else "fp32"
    print(f"\n{'variant':<18} {'batch':>5} {'seq':>4} {'p50 ms':>8} {'vs ' + base:>10}")
    ratio = {(r["model"], r["batch"], r["seq"]): r["speedup_p50"] for r in result["speedups"]}
    for c in result["latency"]:
        r = ratio.get((c["model"], c["batch"], c["seq"]))
        print(f"{c['model']:<18} {c['batch']:>5} {c['seq']:>4} {c['p50_ms']:>8.2f} {f'{r:.2f}x' if r else '':>10}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""int8 and fusion choices measured on one model of any task kind: accuracy, speed, batch invariance, in one process.

Variants, all from the same compacted (or dense) PyTorch folder:
  fp32               the artifact's fused graph (EmbedLayerNormalization fused, exact GELU)
  fp32-no-embed-ln   without the EmbedLayerNormalization fusion (what Optimum's optimizer does)
  fp32-gelu-approx   with ORT's tanh GELU approximation
  int8-dynamic       the artifact's int8 graph (dynamic activations, per-channel weights)
  int8-head-fp32     the same with the task head (the graph's last MatMul/Gemm) left in fp32
  int8-embed-fp32    the same with the embedding tables left in fp32 (int8 stores them in 8 bits)
  int8-ffn-out-fp32  the same with every FFN output linear (`.../output/dense/MatMul`) left in fp32
  int8-static        static QDQ (MatMul/Gemm, per-channel, MatMulConstBOnly), calibrated on train examples

The task's headline metric on the validation split carved from train and on dev; for every variant, its
difference from fp32 example by example where the metric is a mean over examples (accuracy, SQuAD F1): mean,
paired standard error and examples whose score changed, so that a difference can be told from noise. Batch
invariance: dev scored alone and inside batches of `--batch` (padded to the longest), max |Δ| of the output rows
and rows whose argmax differs. Latency p50 at each `--batch` x `--seq` cell, interleaved, against the dense fp32
graph when `--dense` is given.

Usage:
    python benchmarks/int8_modes.py MODEL_DIR --data-dir ../shared/data/sst2 [--task sst2] [--dense TEACHER_DIR]
        [--validation-size N --validation-unit example|sentence (as the model's deploy carved it)]
        [--variants fp32 int8-dynamic ...] [--calibration 256] [--batch 8] [--no-invariance] [--no-bench]
        [--bench-batch 1 8] [--seq 128] [--max-length N] [--json out.json]
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
from pipeline.config.schema import BenchSettings, DataLimits
from pipeline.data.encoding import encode
from pipeline.data.loaders import load_task_data
from pipeline.data.tasks import get_task
from pipeline.errors import PipelineError
from pipeline.models.folders import load_tokenizer
from pipeline.models.io import load_model
from pipeline.request import build_deploy_config
from pipeline.train.metrics import example_scores, scores
from pipeline.train.parity import onnx_logits

VARIANTS = (
    "fp32", "fp32-no-embed-ln", "fp32-gelu-approx", "int8-dynamic", "int8-head-fp32", "int8-embed-fp32",
    "int8-ffn-out-fp32",
    "int8-static",
)  # fmt: skip


def add_validation_args(ap: argparse.ArgumentParser) -> None:
    """The validation carve's size and unit: a model must be scored on the split its own deploy carved
    (`data.validation_size`, `data.validation_unit`), or its "validation" may hold sentences it trained on."""
    ap.add_argument("--validation-size", type=int, default=DataLimits().validation_size)
    ap.add_argument("--validation-unit", choices=["example", "sentence"], default=DataLimits().validation_unit)


def validation_carve(args: argparse.Namespace) -> tuple[int, float, int, str]:
    return DataLimits(validation_size=args.validation_size, validation_unit=args.validation_unit).validation


def quantised_nodes(path: Path) -> dict[str, str]:
    """Every node dynamic int8 rewrites, in graph order, with its kind: `attention` (the fused Attention's Q/K/V
    projection), `embeddings` (the fused embedding LayerNorm's tables, or a Gather of one) or `linear` (a MatMul or
    Gemm with a constant weight; empty weights stay fp32 anyway)."""
    import onnx

    graph = onnx.load(str(path)).graph
    weights = {t.name for t in graph.initializer if 0 not in t.dims}
    kinds = {}
    for n in graph.node:
        if n.op_type == "Attention":
            kinds[n.name] = "attention"
        elif n.op_type == "EmbedLayerNormalization" or (n.op_type == "Gather" and n.input[0] in weights):
            kinds[n.name] = "embeddings"
        elif n.op_type in ("MatMul", "Gemm") and n.input[1] in weights:
            kinds[n.name] = "linear"
    return kinds


def kept_fp32(variant: str, nodes: dict[str, str]) -> list[str]:
    """The nodes a dynamic-int8 variant leaves in fp32, of the fp32 graph's `quantised_nodes`."""
    names = [n for n, kind in nodes.items() if kind == "linear"]
    if variant == "int8-head-fp32":
        return names[-1:]
    if variant == "int8-embed-fp32":
        return [n for n, kind in nodes.items() if kind == "embeddings"]
    if variant == "int8-ffn-out-fp32":
        kept = [n for n in names if "/output/dense/" in n and "/attention/" not in n]
        if not kept:
            raise PipelineError(f"{variant}: no FFN output linear (a node named '.../output/dense/...') in the graph")
        return kept
    return []


def build_variants(model_dir: Path, out: Path, wanted: list[str], calibration) -> tuple[dict[str, Path], dict]:
    """The wanted variants' graphs under `out` (the fp32 graph is always built: every other one starts from it),
    and how many linears each leaves in fp32 beyond the artifact's int8."""
    raw = export_onnx(load_model(model_dir), None, out / "raw")
    fp32 = out / "fp32.onnx"
    optimize_onnx(raw, fp32)
    nodes = quantised_nodes(fp32)
    paths, kept = {"fp32": fp32}, {"fp32": 0}
    for name in wanted:
        path = out / f"{name}.onnx"
        keep = kept_fp32(name, nodes)
        if name == "fp32-no-embed-ln":
            optimize_onnx(raw, path, embed_layer_norm=False)
        elif name == "fp32-gelu-approx":
            optimize_onnx(raw, path, gelu_approximation=True)
        elif name == "int8-static":
            quantize_static_int8(fp32, path, calibration.features)
        elif name.startswith("int8-"):
            quantize_int8(fp32, path, keep)
        else:
            continue
        paths[name], kept[name] = path, len(keep)
    return paths, kept


def paired(a: np.ndarray | None, base: np.ndarray | None) -> dict | None:
    """Per-example scores minus fp32's (`example_scores`): mean, paired standard error, examples changed."""
    if a is None:
        return None
    d = a - base
    return {"mean": float(d.mean()), "se": float(d.std(ddof=1) / np.sqrt(len(d))), "changed": int((d != 0).sum())}


def batch_invariance(path: Path, enc, batch: int) -> dict:
    """Each example scored alone vs inside consecutive batches of `batch` (padded to their longest)."""
    alone, batched = onnx_logits(path, enc, batch_size=1), onnx_logits(path, enc, batch_size=batch)
    return {
        "max_abs_diff": float(np.abs(alone - batched).max()),
        "rows_changed": int((alone.argmax(-1) != batched.argmax(-1)).sum()),
        "rows": len(alone),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path, help="a task model folder (an artifact's pytorch/, or a teacher)")
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--task", default="sst2")
    add_validation_args(ap)
    ap.add_argument("--dense", type=Path, help="the dense teacher folder, timed as the fp32 baseline")
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS), help="fp32 always runs")
    ap.add_argument("--calibration", type=int, default=256, help="train examples for static calibration")
    ap.add_argument("--batch", type=int, default=8, help="batch size of the invariance check")
    ap.add_argument("--no-invariance", action="store_true", help="skip the batch invariance check")
    ap.add_argument("--no-bench", action="store_true", help="skip the latency run")
    ap.add_argument("--bench-batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--seq", type=int, nargs="+", default=[128])
    ap.add_argument("--max-length", type=int, help="tokens per example (default: the task kind's, QA 384, else 128)")
    ap.add_argument("--max-runs", type=int, default=100)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    try:
        result = measure(args)
    except PipelineError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    report(result, base="dense" if args.dense else "fp32")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


def task_splits(args: argparse.Namespace, max_length: int | None = None):
    """The task, its data (validation carved as `args` say), the model's tokenizer, the length examples are cut
    at (the teacher's unless `max_length`) and the validation and dev splits encoded."""
    spec = get_task(args.task)
    data = load_task_data(spec, args.data_dir, validation=validation_carve(args))
    tokenizer = load_tokenizer(args.model)
    length = max_length or build_deploy_config("none", spec.name).teacher.max_length  # as the teacher trained
    splits = {name: encode(tokenizer, getattr(data, name), length) for name in ("validation", "dev")}
    return spec, data, tokenizer, length, splits


def measure(args: argparse.Namespace) -> dict:
    spec, data, tokenizer, length, splits = task_splits(args, args.max_length)
    calibration = encode(tokenizer, data.train.head(args.calibration), length)
    result: dict = {"model": str(args.model), "task": spec.name, "metric": spec.metric, "max_length": length}
    result["calibration_examples"] = len(calibration)
    with tempfile.TemporaryDirectory() as tmp:
        paths, kept = build_variants(args.model, Path(tmp), args.variants, calibration)
        rows = {name: {split: onnx_logits(path, enc) for split, enc in splits.items()} for name, path in paths.items()}
        each = {name: {s: example_scores(r, splits[s]) for s, r in by.items()} for name, by in rows.items()}
        result["variants"] = {}
        for name, path in paths.items():
            entry: dict = {"kept_fp32": kept[name]}
            for split, enc in splits.items():
                entry[split] = scores(rows[name][split], enc)
                entry[f"{split}_vs_fp32"] = paired(each[name][split], each["fp32"][split])
            if not args.no_invariance:
                entry["batch_invariance"] = batch_invariance(path, splits["dev"], args.batch)
            result["variants"][name] = entry
        if not args.no_bench:
            result.update(time_graphs(paths, len(tokenizer), Path(tmp), args.dense, args.bench_batch, args.seq,
                                      args.max_runs))  # fmt: skip
    return result


def time_graphs(
    graphs: dict[str, Path], vocab_size: int, work: Path, dense: Path | None, batches, seqs, max_runs: int,
    dense_int8: bool = False,
) -> dict:  # fmt: skip
    """`graphs` timed in one interleaved run (`export.benchmark`), with the dense teacher's fused fp32 graph (and its
    int8 one, `dense_int8`) beside them when `dense` is given: the result's device, latency and speedup fields,
    speedups against the dense fp32 graph, else against `graphs["fp32"]`."""
    timed = dict(graphs)
    if dense:
        fp32 = work / "dense" / "dense.onnx"
        optimize_onnx(export_onnx(load_model(dense), None, work / "dense"), fp32)
        baseline = {"dense": fp32}
        if dense_int8:
            quantize_int8(fp32, work / "dense" / "dense.int8.onnx")
            baseline["dense-int8"] = work / "dense" / "dense.int8.onnx"
        timed = {**baseline, **timed}
    settings = BenchSettings(
        batch_sizes=tuple(batches), seq_lens=tuple(seqs), max_runs=max_runs, providers=("CPUExecutionProvider",)
    )
    bench = benchmark(timed, vocab_size, settings)
    return {
        "device": bench["device"],
        "latency": [{k: c[k] for k in ("model", "batch", "seq", "p50_ms")} for c in bench["cells"]],
        "speedups": speedups(bench, "dense" if dense else "fp32"),
    }


def report(result: dict, base: str) -> None:
    metric = result["metric"]
    print(f"{result['task']}: {metric} at {result['max_length']} tokens; Δ = variant - fp32 per example (± paired SE)")
    d = "Δ ± SE (changed)"
    print(f"{'variant':<18} {'validation':>10} {d:>22} {'dev':>10} {d:>22} {'alone≠batched':>14} {'max|Δ|':>9}")
    for name, v in result["variants"].items():
        line = f"{name:<18}"
        for split in ("validation", "dev"):
            d = v[f"{split}_vs_fp32"]
            diff = f"{d['mean']:+.2f} ± {d['se']:.2f} ({d['changed']})" if d and name != "fp32" else ""
            line += f" {v[split][metric]:>10.2f} {diff:>22}"
        inv = v.get("batch_invariance")
        if inv:
            line += f" {inv['rows_changed']:>6}/{inv['rows']:<7} {inv['max_abs_diff']:>9.2e}"
        print(line)
    if "latency" not in result:
        return
    print(f"\n{'variant':<18} {'batch':>5} {'seq':>4} {'p50 ms':>8} {'vs ' + base:>10}")
    ratio = {(r["model"], r["batch"], r["seq"]): r["speedup_p50"] for r in result["speedups"]}
    for c in result["latency"]:
        r = ratio.get((c["model"], c["batch"], c["seq"]))
        print(f"{c['model']:<18} {c['batch']:>5} {c['seq']:>4} {c['p50_ms']:>8.2f} {f'{r:.2f}x' if r else '':>10}")


if __name__ == "__main__":
    sys.exit(main())

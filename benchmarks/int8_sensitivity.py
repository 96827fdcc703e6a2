"""Which nodes does int8 hurt? Leave each one in fp32 in turn, rank them on validation, keep the worst in fp32.

Dynamic int8 (the artifact's: per-channel 7-bit weights, activations per call) costs a compressed model part of a
point where the dense teacher loses a tenth. This finds whether that loss sits in a few nodes. For every node of
the fused fp32 graph that int8 quantises (the fused `Attention`, whose Q/K/V projection becomes `QAttention`, the
embeddings, and every MatMul/Gemm with a constant weight), an int8 graph that leaves only that node in fp32 is
scored on the validation split carved from train: the mean KL divergence of its class distribution from fp32's
(a continuous measure of int8's error, where accuracy moves by a few examples). Nodes are ranked by how much of the
all-int8 graph's KL leaving them out removes, on validation only; graphs keeping the top 1, 2, ... of that ranking
in fp32 are then scored on validation and dev (reported only) and timed in one interleaved run against the dense
fp32 graph and its int8 (`--dense`), so that each fp32 node's accuracy is set against its speed.

Usage:
    python benchmarks/int8_sensitivity.py MODEL_DIR [--data-dir ../shared/data/sst2] [--task sst2]
        [--validation-size 1000 --validation-unit sentence] [--dense TEACHER_DIR] [--keep 1 2 3]
        [--batch 8] [--seq 128] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere without installing

from benchmarks.int8_modes import add_validation_args, quantised_nodes, task_splits, time_graphs
from export.onnx import export_onnx, optimize_onnx, quantize_int8
from pipeline.errors import PipelineError
from pipeline.models.io import load_model
from pipeline.train.metrics import scores
from pipeline.train.parity import onnx_logits


def kl_from(reference: np.ndarray, rows: np.ndarray) -> float:
    """Mean KL(softmax(reference) || softmax(rows)) over examples (token tasks: over every row scored)."""
    ref, other = (r.reshape(-1, r.shape[-1]).astype(np.float64) for r in (reference, rows))
    log_p = ref - np.logaddexp.reduce(ref, axis=-1, keepdims=True)
    log_q = other - np.logaddexp.reduce(other, axis=-1, keepdims=True)
    return float((np.exp(log_p) * (log_p - log_q)).sum(-1).mean())


def rank(fp32: Path, base: np.ndarray, nodes: list[str], enc, work: Path) -> tuple[float, list[dict]]:
    """The all-int8 graph's validation KL from fp32 (whose validation rows are `base`), and every node with the KL
    of the graph that leaves only it in fp32, most harmful first."""
    full = work / "int8.onnx"
    quantize_int8(fp32, full)
    kl_all = kl_from(base, onnx_logits(full, enc))
    rows = []
    for i, name in enumerate(nodes):
        path = work / f"without-{i}.onnx"
        quantize_int8(fp32, path, [name])
        rows.append({"node": name, "kl": kl_from(base, onnx_logits(path, enc))})
        path.unlink()
    for r in rows:
        r["kl_removed"] = kl_all - r["kl"]
    return kl_all, sorted(rows, key=lambda r: -r["kl_removed"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path, help="a task model folder (an artifact's pytorch/, or a teacher)")
    ap.add_argument("--data-dir", help="the task's data folder; default: the shipped sample")
    ap.add_argument("--task", default="sst2")
    add_validation_args(ap)
    ap.add_argument("--dense", type=Path, help="the dense teacher folder: its fp32 and int8 graphs are timed too")
    ap.add_argument("--keep", type=int, nargs="+", default=[1, 2, 3], help="how many top-ranked nodes stay fp32")
    ap.add_argument("--batch", type=int, nargs="+", default=[8])
    ap.add_argument("--seq", type=int, nargs="+", default=[128])
    ap.add_argument("--max-runs", type=int, default=100)
    ap.add_argument("--no-bench", action="store_true", help="skip the latency run")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if any(k < 1 for k in args.keep):
        print("error: --keep counts must be at least 1", file=sys.stderr)
        return 2
    try:
        result = measure(args)
    except PipelineError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    report(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


def measure(args: argparse.Namespace) -> dict:
    spec, _, tokenizer, _, splits = task_splits(args)
    result: dict = {"model": str(args.model), "task": spec.name, "metric": spec.metric}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        fp32 = work / "fp32.onnx"
        optimize_onnx(export_onnx(load_model(args.model), None, work / "raw"), fp32)
        nodes = list(quantised_nodes(fp32))
        if not nodes:
            raise PipelineError(f"{args.model}: the fused graph has no node that int8 quantises")
        base = {s: onnx_logits(fp32, enc) for s, enc in splits.items()}
        result["kl_all_int8"], result["ranking"] = rank(fp32, base["validation"], nodes, splits["validation"], work)
        graphs = {"fp32": fp32, "int8": work / "int8.onnx"}
        for k in sorted(set(args.keep)):
            if k < len(nodes):
                graphs[f"int8-keep{k}"] = work / f"keep{k}.onnx"
                quantize_int8(fp32, graphs[f"int8-keep{k}"], [r["node"] for r in result["ranking"][:k]])
        result["variants"] = {}
        for name, path in graphs.items():
            entry = {}
            for split, enc in splits.items():
                rows = onnx_logits(path, enc)
                entry[split] = scores(rows, enc)[spec.metric]
                entry[f"{split}_kl"] = kl_from(base[split], rows)
            result["variants"][name] = entry
        if not args.no_bench:
            result.update(time_graphs(graphs, len(tokenizer), work, args.dense, args.batch, args.seq, args.max_runs,
                                      dense_int8=True))  # fmt: skip
    return result


def report(result: dict) -> None:
    metric = result["metric"]
    print(f"{result['task']}: all-int8 validation KL from fp32 {result['kl_all_int8']:.2e}; each node left in fp32:")
    for r in result["ranking"]:
        share = r["kl_removed"] / result["kl_all_int8"] if result["kl_all_int8"] else 0.0
        print(f"  {r['node']:<60} KL {r['kl']:.2e}  removes {share:+.0%}")
    print(f"\n{'variant':<14} {'validation':>10} {'val KL':>9} {'dev':>8} {'dev KL':>9}")
    for name, v in result["variants"].items():
        vk, dk = v["validation_kl"], v["dev_kl"]
        print(f"{name:<14} {v['validation']:>10.2f} {vk:>9.2e} {v['dev']:>8.2f} {dk:>9.2e}  ({metric})")
    if "latency" not in result:
        return
    ratio = {(r["model"], r["batch"], r["seq"]): r["speedup_p50"] for r in result["speedups"]}
    print(f"\n{'graph':<14} {'batch':>5} {'seq':>4} {'p50 ms':>8} {'speedup':>8}")
    for c in result["latency"]:
        r = ratio.get((c["model"], c["batch"], c["seq"]))
        print(f"{c['model']:<14} {c['batch']:>5} {c['seq']:>4} {c['p50_ms']:>8.2f} {f'{r:.2f}x' if r else '':>8}")


if __name__ == "__main__":
    sys.exit(main())

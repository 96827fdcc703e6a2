"""Interleaved ONNX Runtime latency benchmark of several exported models.

Usage:
    python benchmarks/latency.py dense=dense.onnx pruned=pruned.onnx --vocab-size 30522 \
        [--batch 1 8 32] [--seq 32 128] [--max-runs 100] [--passes 8] [--plot out.png] [--json out.json]

`--passes N` times the 8 x 128 cell (the deploys' headline) in N passes and gives its speedups as the median of the
passes' ratios, as the bench stage does (one pass's ratio moves by several percent on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere without installing

from export.benchmark import HEADLINE, benchmark, plot_latency, speedups
from pipeline.config.schema import BenchSettings


def _fail(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def _parse_models(specs: list[str]) -> dict[str, Path]:
    models: dict[str, Path] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            _fail(f"malformed model spec {spec!r}; expected NAME=PATH.onnx")
        if name in models:
            _fail(f"duplicate model name {name!r}")
        if not Path(path).is_file():
            _fail(f"model file not found: {path}")
        models[name] = Path(path)
    return models


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", metavar="NAME=PATH.onnx")
    ap.add_argument("--vocab-size", type=int, required=True)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--seq", type=int, nargs="+", default=[32, 128])
    ap.add_argument("--max-runs", type=int, default=100)
    ap.add_argument("--threads", type=int, default=None, help="default: physical cores")
    ap.add_argument("--passes", type=int, default=1, help="passes of the 8 x 128 cell (median of their ratios)")
    ap.add_argument("--busy-cores", type=float, default=BenchSettings().busy_cores, help="others' cores tolerated")
    ap.add_argument("--plot", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    models = _parse_models(args.models)

    cfg = BenchSettings(
        batch_sizes=tuple(args.batch),
        seq_lens=tuple(args.seq),
        max_runs=args.max_runs,
        min_runs=min(10, args.max_runs),
        threads=args.threads,
        busy_cores=args.busy_cores,
        passes=args.passes,
    )
    result = benchmark(models, args.vocab_size, cfg, repeat=HEADLINE)

    d = result["device"]
    print(
        f"# {d['cpu']} | ORT {d['ort_version']} | providers {d['providers']} | "
        f"threads {d['threads']} | spinning {d['spinning']} | interleaved"
    )
    w = max(len("model"), *(len(n) for n in models))
    print(
        f"{'model':<{w}}  {'provider':<10} {'batch':>5} {'seq':>5} {'runs':>5} "
        f"{'p50 ms':>9} {'p90 ms':>9} {'p99 ms':>9} {'seq/s':>10} {'p90/p50':>8} {'others':>7}"
    )
    for c in result["cells"]:
        print(
            f"{c['model']:<{w}}  {c['provider'].replace('ExecutionProvider', ''):<10} "
            f"{c['batch']:>5} {c['seq']:>5} {c['runs']:>5} {c['p50_ms']:>9.3f} "
            f"{c['p90_ms']:>9.3f} {c['p99_ms']:>9.3f} {c['throughput_per_s']:>10.1f} "
            f"{c['p90_over_p50']:>8.2f} {c['others_cores']:>7.2f}"
        )
    m = result["machine"]
    print(
        f"{'BUSY' if m['busy'] else 'quiet'}: other processes held {m['others_cores']:.2f} cores on average "
        f"({m['allowed_cores']:.2f} allowed), load average {m['loadavg_before']} before, {m['loadavg_after']} after"
        + ("; these figures are not clean" if m["busy"] else "")
    )
    for s in result["skipped"]:
        print(f"skipped {s['model']} on {s['provider']}: {s['reason']}")

    sp = speedups(result, "dense")
    if sp:
        print("\np50 speedup vs dense")
        print(f"{'model':<{w}}  {'provider':<10} {'batch':>5} {'seq':>5} {'speedup':>8}")
        for s in sp:
            print(
                f"{s['model']:<{w}}  {s['provider'].replace('ExecutionProvider', ''):<10} "
                f"{s['batch']:>5} {s['seq']:>5} {s['speedup_p50']:>7.2f}x"
                + (
                    f"  (median of {len(s['pass_speedups'])} passes, {min(s['pass_speedups']):.2f}-"
                    f"{max(s['pass_speedups']):.2f}x)"
                    if s.get("pass_speedups")
                    else ""
                )
            )
    elif "dense" not in models:
        print("\n(no model named 'dense'; speedup table skipped)")

    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({**result, "speedups": sp}, indent=2))
        print(f"wrote {args.json}")
    if args.plot:
        print(f"wrote {plot_latency(result, args.plot, title=', '.join(models))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

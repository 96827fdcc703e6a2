"""How close the latency table's predictions come to measured speed: the plan's error, shape by shape.

    python benchmarks/plan_accuracy.py --teacher DIR --shape 11x2x1952 [--shape LxHxF ...]
                                       [--artifact NAME=model.int8.onnx ...] [--runs 30] [--json out.json]

1. The latency table for the teacher, as `--target-speedup` plans on it (from the cache when one was measured on a
   quiet machine with these libraries, else measured now).
2. For each `--shape` L x H x F, a model of that shape cut from the teacher (its first L layers narrowed to H heads
   and F FFN neurons, compacted; which layers does not change the cost), exported as an artifact is: int8.
3. One interleaved ONNX Runtime run at the table's batch x sequence of the dense fp32 teacher, every cut shape and
   every `--artifact` (an int8 graph of a real deploy, with its shape as NAME: e.g. 11x2x1952=ART/model.int8.onnx),
   printing each one's predicted and measured speedup over the dense fp32 teacher and the prediction's error.

Run it on a quiet machine: nothing else may train or time beside it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere without installing

from export.benchmark import benchmark
from export.onnx import export_optimized
from pipeline.cache import default_cache_dir
from pipeline.compress.compaction import cut_from
from pipeline.config.schema import BenchSettings, TargetConfig
from pipeline.models.dense_graphs import dense_graphs
from pipeline.models.io import load_model
from pipeline.stages.plan import measure_table
from pipeline.staging import DENSE_GRAPHS
from serving.artifact import GRAPHS

SHAPE = re.compile(r"^(\d+)x(\d+)x(\d+)$")


def shape_of(text: str) -> tuple[int, int, int]:
    match = SHAPE.match(text)
    if not match:
        sys.exit(f"error: shape {text!r} is not LAYERSxHEADSxFFN (e.g. 11x2x1952)")
    return int(match[1]), int(match[2]), int(match[3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher", required=True)
    parser.add_argument("--shape", action="append", default=[])
    parser.add_argument("--artifact", action="append", default=[], help="LxHxF=path/to/model.int8.onnx")
    parser.add_argument("--runs", type=int, default=30, help="timed runs per model (at least)")
    parser.add_argument("--cache-dir", default=str(default_cache_dir()))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    target = TargetConfig()
    table = measure_table(args.teacher, target, BenchSettings(), args.cache_dir)
    at = f"{table.batch}x{table.seq}"
    print(f"table: fixed {table.fixed_ms:.2f} ms, dense fp32 {table.dense_fp32_ms:.1f} ms at {at}")
    teacher = load_model(args.teacher)
    shapes, models = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for text in args.shape:
            layers, heads, ffn = shapes[text] = shape_of(text)
            export_optimized(cut_from(teacher, list(range(layers)), heads, ffn)[0], None, Path(tmp) / text)
            models[text] = Path(tmp) / text / GRAPHS["int8"]
        for spec in args.artifact:
            name, _, path = spec.partition("=")
            shapes[f"{name} (artifact)"] = shape_of(name)
            models[f"{name} (artifact)"] = Path(path)
        models["dense"] = dense_graphs(args.teacher, args.cache_dir)[0] / DENSE_GRAPHS["fp32"]
        settings = BenchSettings(
            batch_sizes=(table.batch,),
            seq_lens=(table.seq,),
            providers=("CPUExecutionProvider",),
            min_runs=args.runs,
            max_runs=args.runs,
            max_seconds_per_cell=1e9,
        )
        result = benchmark(models, int(teacher.config.vocab_size), settings)
    p50 = {c["model"]: c["p50_ms"] for c in result["cells"]}
    rows = []
    for name, (layers, heads, ffn) in shapes.items():
        predicted = table.dense_fp32_ms / table.predict_ms(layers, heads, ffn)
        measured = p50["dense"] / p50[name]
        rows.append(
            {
                "model": name,
                "predicted_speedup": round(predicted, 3),
                "measured_speedup": round(measured, 3),
                "measured_ms": round(p50[name], 2),
                "error": round(predicted / measured - 1, 4),
            }
        )
        print(f"{name:>22}: predicted {predicted:6.2f}x, measured {measured:6.2f}x ({predicted / measured - 1:+.1%})")
    print(f"dense fp32 now {p50['dense']:.1f} ms; machine busy: {result['machine']['busy']}")
    if args.json:
        report = {"rows": rows, "table": asdict(table), "machine": result["machine"]}
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

"""Which general-student shapes meet a speed target on this machine, before any GPU time is spent distilling them.

Each shape LxHxF is the student `pipeline distill-general --layers L --hidden H --ffn F` would build from TEACHER (its
family, hidden / head size heads of the teacher's head size, the task head), with random weights (they time alike),
exported as an artifact is (ONNX, ORT fusion, dynamic int8) and timed interleaved with the teacher's dense fp32 and
int8 graphs (the cached ones deploy benchmarks) at one input shape. Prints p50 and the speedups against both;
`--json` keeps the benchmark's cells.

Usage:
    python benchmarks/student_shapes.py TEACHER_DIR 3x256x768 3x224x448 4x192x192 [--batch 8] [--seq 128] \
        [--max-runs 60] [--cache-dir DIR] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere without installing

from export.benchmark import benchmark, speedups
from export.onnx import export_optimized
from pipeline.cache import default_cache_dir
from pipeline.compress.methods.distill.config import StudentShape
from pipeline.config.schema import BenchSettings
from pipeline.errors import PipelineError
from pipeline.models.families import arch_of
from pipeline.models.folders import check_model_dir
from serving.artifact import GRAPHS

SHAPE = re.compile(r"^(\d+)x(\d+)x(\d+)$")


def _fail(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def parse_shapes(specs: list[str], teacher: dict) -> dict[str, dict[str, int]]:
    """{spec: {layers, hidden, heads, ffn}}, as distill-general resolves them against the teacher's `config.json`;
    raises ValueError naming the first bad spec."""
    arch, shapes = arch_of(teacher), {}
    head_dim, hidden = arch.head_dim, arch.hidden
    for spec in specs:
        m = SHAPE.match(spec)
        if not m or 0 in (layers := int(m[1]), width := int(m[2]), ffn := int(m[3])):
            raise ValueError(f"shape {spec!r}: expected LAYERSxHIDDENxFFN of positive integers, e.g. 3x256x768")
        if width % head_dim or width > hidden:
            raise ValueError(
                f"shape {spec!r}: hidden {width} must be a multiple of the teacher's head size {head_dim} "
                f"up to its {hidden}"
            )
        shapes[spec] = StudentShape(layers=layers, hidden=width, ffn=ffn).resolved(teacher)
    return shapes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("teacher", type=Path, help="the fine-tuned task teacher's folder (the speed baseline)")
    ap.add_argument("shapes", nargs="+", metavar="LxHxF")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--max-runs", type=int, default=60)
    ap.add_argument("--threads", type=int, default=None, help="default: physical cores")
    ap.add_argument("--cache-dir", type=Path, default=None, help="where the dense graphs are cached")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    try:
        config = check_model_dir(args.teacher)
        arch, shapes = arch_of(config), parse_shapes(args.shapes, config)
    except (PipelineError, ValueError) as e:
        _fail(str(e))

    from pipeline.compress.methods.distill.general_student import build_general_student
    from pipeline.models.dense_graphs import dense_graphs
    from pipeline.models.io import load_model
    from pipeline.staging import DENSE_GRAPHS

    teacher = load_model(str(args.teacher))
    dense = dense_graphs(str(args.teacher), str(args.cache_dir or default_cache_dir()))[0]
    models = {"dense": dense / DENSE_GRAPHS["fp32"], "dense-int8": dense / DENSE_GRAPHS["int8"]}
    with tempfile.TemporaryDirectory() as tmp:
        for spec, shape in shapes.items():
            student = build_general_student(teacher, shape, "random", 0)[0].eval()
            export_optimized(student, None, Path(tmp, spec))
            models[spec] = Path(tmp, spec, GRAPHS["int8"])
        cfg = BenchSettings(batch_sizes=(args.batch,), seq_lens=(args.seq,), max_runs=args.max_runs,
                            min_runs=min(10, args.max_runs), threads=args.threads)  # fmt: skip
        result = benchmark(models, arch.vocab, cfg)
    p50 = {c["model"]: c["p50_ms"] for c in result["cells"]}
    print(f"{'shape':<14} {'heads':>5} {'p50 ms':>8} {'vs fp32':>8} {'vs int8':>8}")
    for name in models:
        heads = shapes[name]["heads"] if name in shapes else arch.heads
        print(f"{name:<14} {heads:>5} {p50[name]:>8.2f} {p50['dense'] / p50[name]:>7.2f}x "
              f"{p50['dense-int8'] / p50[name]:>7.2f}x")  # fmt: skip
    print(f"machine: other processes held {result['machine']['others_cores']:.2f} cores"
          + (" (busy: do not trust these figures)" if result["machine"]["busy"] else ""))  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"shapes": shapes, "speedups": speedups(result), **result}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

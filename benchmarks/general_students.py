"""General students against task-specific distillation, on one task, same machine, same budgets, same teacher.

    python benchmarks/general_students.py --task sst2 --data-dir ../shared/data/sst2 --work runs/general \
        [--shape 3x384 --shape 4x256] [--variant general ...] [--corpus ../shared/data/corpus] \
        [--general-recipe default] [--set KEY=VALUE ...] [--json out.json]

Per student shape (layers x hidden), up to four ways to a task model, all deployed with `pipeline deploy --method
distill` against the same fine-tuned task teacher (the embedded MiniLM's, shared through the stage cache), so every
speedup is against that dense fp32 teacher at batch 8 x 128:

  (a) general: the general student (`pipeline distill-general`, made once per shape on the corpus, never on the
      task's data) fine-tuned on the task with output KD from the task teacher only (`config.student.path`,
      `config.transfer_steps=0`, `config.relation=0`);
  (a') general-joint: the same student, one phase of output KD and MiniLMv2 relations together
      (`config.transfer_steps=0`, relations on);
  (b) task: today's task-specific `distill`, a student cut from the task teacher's layers and, for a narrower shape,
      its most important heads, FFN neurons and hidden dimensions (`config.student.layers`, `.hidden`, `.ffn`);
  (c) general+task: the general student, then task-specific relation transfer from the task teacher and output KD.

A general student is made only for shapes with a general variant. The runs go one after another (each deploy's
benchmark runs on a machine with nothing else of ours going); a variant whose artifact is already in `--work` is
read, not rerun. `--set` goes to every deploy (e.g. loosened gates, so that a weak student is still timed). Prints a
Markdown table: validation (chose nothing here; reported) and dev (the test) of the teacher and of the int8
artifact, the dev difference, and the int8 graph's speedups against the dense fp32 teacher and dense int8.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

VARIANTS = ["general", "general-joint", "task", "general+task"]


def run(cmd: list[str]) -> str:
    print("$", " ".join(cmd), file=sys.stderr, flush=True)
    done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if done.returncode:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(cmd)}")
    return done.stdout.strip().splitlines()[-1]


def general_student(work: Path, shape: tuple[int, int], corpus: str, recipe: str) -> Path:
    folder = work / f"general-{shape[0]}x{shape[1]}-{recipe}"
    if not folder.is_dir():
        layers, hidden = shape
        run(["pipeline", "distill-general", "--output", str(folder), "--corpus", corpus, "--layers", str(layers),
             "--hidden", str(hidden), "--recipe", recipe])  # fmt: skip
    return folder


def deploy(args, variant: str, shape: tuple[int, int], student: Path | None) -> Path:
    out = args.work / "artifacts" / f"{args.task}-{variant}-{shape[0]}x{shape[1]}"
    done = next(out.glob("*/report.json"), None) if out.is_dir() else None
    if done is not None:
        return done.parent
    sets = list(args.set)  # relation heads: derived from both widths (384 and 256: 32)
    if student is not None:
        sets.append(f"config.student.path={student}")  # the student folder's own shape
    else:
        # the general student's shape: distill-general scales the FFN with the width (4 x hidden on BERT-family
        # bases), where a narrower distill student would keep the teacher's whole FFN unless told
        sets += [
            f"config.student.{k}={v}" for k, v in (("layers", shape[0]), ("hidden", shape[1]), ("ffn", 4 * shape[1]))
        ]
    if variant in ("general", "general-joint"):
        sets.append("config.transfer_steps=0")  # one phase: the task with output KD (and relations when joint)
    if variant == "general":
        sets.append("config.relation=0")
    cmd = ["pipeline", "deploy", "--method", "distill", "--task", args.task, "--data-dir", args.data_dir,
           "--output", str(out), *(x for s in sets for x in ("--set", s))]  # fmt: skip
    return Path(run(cmd))


def row(variant: str, shape: tuple[int, int], artifact: Path) -> dict:
    report = json.loads((artifact / "report.json").read_text())
    metrics = report["validation"]["metrics"]
    name = report["validation"].get("metric", "accuracy")  # the headline metric, which the gates use
    head = report["speed"]["headline"]["compressed-int8"]
    return {
        "variant": variant,
        "shape": f"{report['speed']['shapes']['compressed']['hidden']} hidden, "
        f"{len(report['speed']['shapes']['compressed']['heads'])} layers",
        "asked": f"{shape[0]}x{shape[1]}",
        "metric": name,
        **{
            f"{split}_{who}": round(metrics[split][key][name], 2)
            for split in ("validation", "dev")
            for who, key in (("teacher", "teacher"), ("int8", "onnx_int8"))
        },
        "speedup": round(head["speedup_p50"], 2),
        "vs_dense_int8": round(head["speedup_vs_dense_int8"], 2),
        "artifact": str(artifact),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", required=True)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--shape", action="append", help="LAYERSxHIDDEN (default: 3x384 and 4x256)")
    parser.add_argument("--corpus", default="../shared/data/corpus")
    parser.add_argument("--general-recipe", default="default")
    parser.add_argument("--variant", action="append", choices=VARIANTS, help="default: all four")
    parser.add_argument("--set", action="append", default=[], help="KEY=VALUE for every deploy")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    shapes = [tuple(int(x) for x in s.lower().split("x")) for s in (args.shape or ["3x384", "4x256"])]
    rows = []
    for shape in shapes:
        variants = args.variant or VARIANTS
        needs_general = any(v != "task" for v in variants)
        student = general_student(args.work, shape, args.corpus, args.general_recipe) if needs_general else None
        for variant in variants:
            source = None if variant == "task" else student
            rows.append(row(variant, shape, deploy(args, variant, shape, source)))
    print("| variant | shape asked | student | validation teacher / int8 | dev teacher / int8 | dev Δ | "
          "int8 vs dense fp32 | vs dense int8 |\n|---|---|---|---|---|---|---|---|")  # fmt: skip
    for r in rows:
        print(f"| {r['variant']} | {r['asked']} | {r['shape']} | {r['validation_teacher']} / {r['validation_int8']} | "
              f"{r['dev_teacher']} / {r['dev_int8']} | {r['dev_int8'] - r['dev_teacher']:+.2f} | {r['speedup']}x | "
              f"{r['vs_dense_int8']}x |")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()

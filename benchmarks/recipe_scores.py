"""Score several recipes of one method or more on one task: compress, compact, export, and each model's headline
metric in torch and ONNX Runtime (fp32 and dynamic int8) on the validation split carved from train and on dev.

Each variant runs the pipeline's own stages in-process (`pipeline.stages.compress.run`, then `compact.run`, as
`pipeline compress` and `pipeline compact` do) from a given fine-tuned teacher, without Prefect, so it also runs on
a machine that has only torch, transformers, optimum and ONNX Runtime (a lent GPU machine). Training uses
`--device`; ONNX Runtime scores on the CPU with all its cores. Choose between recipes on validation; dev is
reported. Speed is not measured here (the latency table, `benchmarks/latency.py`, or `pipeline bench` do that on
the machine that serves).

Usage:
    python benchmarks/recipe_scores.py --teacher DIR --task squad --data-dir ../shared/data/squad \
        --variant smp-r2000=smp:config.recover_steps=2000 \
        --variant distill4=distill:config.student.layers=4,config.train.max_steps=3000 \
        --variant long5=distill+smp@long:config.distill.student.layers=5 \
        [--set data.validation_unit=sentence ...] [--device cuda] [--budget-s 600] [--cache-dir DIR] [--work DIR] \
        [--json out.jsonl]

A variant is NAME=METHOD[@RECIPE][:OVERRIDE,OVERRIDE...]: the recipe as `--recipe` names it (default: the task's
default recipe for METHOD), overrides as `--set` takes them. Every model is scored on the same splits, the task's
data as its default recipe reads it with the `--set` overrides (they apply to the teacher's request and every
variant alike: the validation split the teacher was fine-tuned against); a variant's own `data.*` overrides change
what it trains on, not what it is scored on.
The teacher is scored first. `--budget-s` starts no variant after that many seconds (each one that did not start
is listed as skipped); results are appended to `--json` as each variant finishes, with the validation curve of
every training phase where `eval_every` is set (e.g. `config.train.eval_every=250`: how many steps a recipe needs).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere without installing

from export.onnx import export_optimized
from pipeline.cache import default_cache_dir
from pipeline.config.recipes import stage_keys
from pipeline.data.encoding import encode
from pipeline.devices import resolve_device
from pipeline.errors import PipelineError
from pipeline.models.folders import load_tokenizer
from pipeline.models.io import load_model
from pipeline.request import prepare_request
from pipeline.stages import compact, compress
from pipeline.train.metrics import predict_logits, scores
from pipeline.train.parity import onnx_logits
from serving.artifact import GRAPHS


def parse_variant(text: str) -> tuple[str, str, str | None, list[str]]:
    """NAME=METHOD[@RECIPE][:OVERRIDE,...] as (name, method, recipe or None, overrides)."""
    name, sep, rest = text.partition("=")
    spec, _, overrides = rest.partition(":")
    method, at, recipe = spec.partition("@")
    if not sep or not name or not method or (at and not recipe):
        raise SystemExit(f"error: --variant {text!r} is not NAME=METHOD[@RECIPE][:OVERRIDE,...]")
    return name, method, recipe or None, [o for o in overrides.split(",") if o]


def curves(report: object, metric: str, where: str = "") -> dict[str, list[tuple[int, float]]]:
    """Every training phase's validation curve in a compress stage's report: (step, metric) wherever the history
    holds an evaluation (`config.train.eval_every`), keyed by the phase's place in the report."""
    found: dict[str, list[tuple[int, float]]] = {}
    if isinstance(report, dict):
        history = report.get("history")
        if isinstance(history, list):
            points = [(h["step"], round(h[metric], 2)) for h in history if isinstance(h, dict) and metric in h]
            if points:
                found[where or "training"] = points
        for key, value in report.items():
            if key != "history":
                found.update(curves(value, metric, f"{where}.{key}" if where else key))
    return found


def score(folder: Path, data, max_length: int, device: str, onnx_dir: Path | None) -> dict:
    """The headline metrics of the model in `folder`: torch on `device`, and ONNX fp32/int8 when `onnx_dir`."""
    model, tokenizer = load_model(folder), load_tokenizer(folder)
    encs = {
        name: encode(tokenizer, split, max_length)
        for name, split in (("validation", data.validation), ("dev", data.dev))
    }
    model.to(device)
    out = {f"torch_{name}": scores(predict_logits(model, enc), enc) for name, enc in encs.items()}
    model.to("cpu")
    if onnx_dir is not None:
        export_optimized(model, tokenizer, onnx_dir)
        for kind in ("fp32", "int8"):
            for name, enc in encs.items():
                out[f"onnx_{kind}_{name}"] = scores(onnx_logits(onnx_dir / GRAPHS[kind], enc), enc)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher", required=True)
    parser.add_argument("--task", required=True)
    parser.add_argument("--data-dir", help="the task's data folder; default: the shipped sample, where there is one")
    parser.add_argument("--variant", action="append", required=True, type=parse_variant)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        dest="common",
        metavar="KEY=VALUE",
        help="an override for the teacher's request and every variant (e.g. the validation split)",
    )
    parser.add_argument("--device", default="auto", help="training and torch scoring: auto, cpu or cuda")
    parser.add_argument("--budget-s", type=float, default=float("inf"), help="start no variant after this")
    parser.add_argument("--cache-dir", default=str(default_cache_dir()))
    parser.add_argument("--work", type=Path, help="keep each variant's compacted model and graphs here")
    parser.add_argument("--json", type=Path, help="append one JSON line per result")
    args = parser.parse_args()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s", "%H:%M:%S"))
    logging.getLogger("pipeline").addHandler(handler)
    logging.getLogger("pipeline").setLevel(logging.INFO)
    start = time.perf_counter()

    def request(method: str, overrides: list[str], recipe: str | None = None):  # only the variants train
        return prepare_request(method, args.task, teacher=args.teacher, data_dir=args.data_dir,
                               cache_dir=args.cache_dir, output_dir=tempfile.gettempdir(), recipe=recipe,
                               overrides=[*args.common, *overrides])  # fmt: skip

    def emit(row: dict) -> None:
        print(json.dumps(row), flush=True)
        if args.json:
            with args.json.open("a") as f:
                f.write(json.dumps(row) + "\n")

    teacher_request = request("none", [])
    requests = {  # all checked first, the device among them
        name: request(
            method, [*overrides, *(f"{k}={args.device}" for k in stage_keys(method, "train.device"))], recipe
        )
        for name, method, recipe, overrides in args.variant
    }
    if len(requests) < len(args.variant):
        raise PipelineError("two --variant options share a name")
    planned = [name for name, req in requests.items() if req.config.target.speedup is not None]
    if planned:  # the plan is timed on the serving machine's latency table: give its shape as overrides instead
        raise PipelineError(f"variant {planned[0]} sets target.speedup; this script runs no plan: pass the planned "
                            "shape (config.*.student.layers, config.*.mask.shape) as overrides")  # fmt: skip
    data = teacher_request.data.load()
    device = str(resolve_device(args.device))
    t = time.perf_counter()
    teacher_length = teacher_request.config.teacher.max_length
    emit({"name": "teacher", **score(Path(args.teacher), data, teacher_length, device, None),
          "seconds": round(time.perf_counter() - t, 1)})  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        for name, method, recipe, overrides in args.variant:
            if time.perf_counter() - start > args.budget_s:
                emit({"name": name, "skipped": f"past --budget-s {args.budget_s:g}"})
                continue
            t = time.perf_counter()
            req = requests[name]
            result = compress.run(req.config, req.teacher, req.data, req.cache_dir, req.model)
            trained = round(time.perf_counter() - t, 1)
            length = req.config.model_max_length
            folder = work / name / "pytorch"
            report = compact.run(result["path"], req.data, str(folder), req.config.gates.compaction_atol, length)
            shape = {
                "num_hidden_layers": len(report["heads"]),
                "layer_heads": report["heads"],
                "intermediate_sizes": report["ffn_widths"],
            }  # what compaction left, as config.json records it
            emit({"name": name, "method": method, "recipe": recipe, "overrides": overrides,
                  "compress_seconds": trained,
                  "shape": shape, "params": report.get("params"),
                  **score(folder, data, length, device, work / name / "onnx"),
                  "curves": curves(result, data.task.metric),  # the last stage's report, as the cache holds it
                  "seconds": round(time.perf_counter() - t, 1)})  # fmt: skip


if __name__ == "__main__":
    try:
        main()
    except PipelineError as e:  # a bad task, teacher, data folder or override: one line, as the CLI says it
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)

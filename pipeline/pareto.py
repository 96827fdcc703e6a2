"""A sweep's Pareto report: every artifact's accuracy against its measured speed and size, the dense baselines
beside them, the front marked, and the pick within an accuracy budget.

Points come from the artifacts' own reports, never re-measured: accuracy is the shipped int8 graph's task metric
on the validation split carved from train (what the pick may look at) and on dev (reported only); speed is the
int8 graph's p50 at the benchmark's headline cell, as a ratio to the dense fp32 teacher timed in the same run
(ratios are comparable across artifacts where raw milliseconds drift between runs on a shared machine).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from statistics import mean

from serving.artifact import GRAPHS, REPORT_JSON

SELECTED_LINK = "selected"
SHIPPED = "compressed-int8"  # the graph a point stands for


def _cell(speed: dict) -> tuple[str, int, int]:
    """(provider, batch, seq) of the comparison: the benchmark's headline, else its largest CPU cell measured."""
    head = speed["headline"].get(SHIPPED)
    if head:
        return head["provider"], head["batch"], head["seq"]
    r = max((r for r in speed["speedups"] if r["provider"].startswith("CPU")), key=lambda r: r["batch"] * r["seq"])
    return r["provider"], r["batch"], r["seq"]


def _ratio(speed: dict, model: str, cell: tuple[str, int, int]) -> dict:
    return next(r for r in speed["speedups"] if r["model"] == model and (r["provider"], r["batch"], r["seq"]) == cell)


def _ms(speed: dict, model: str, cell: tuple[str, int, int]) -> float:
    return next(
        c["p50_ms"] for c in speed["cells"] if c["model"] == model and (c["provider"], c["batch"], c["seq"]) == cell
    )


def artifact_point(artifact: Path, label: str, report: dict) -> dict:
    """The Pareto point of one published artifact, from its report (report.json)."""
    val = report["validation"]
    metric = val["metric"]
    speed = report["speed"]
    cell = _cell(speed)
    head = _ratio(speed, SHIPPED, cell)
    return {
        "artifact": str(artifact),
        "run": label,
        "method": report["method"],
        "metric": metric,
        "validation": val["metrics"]["validation"]["onnx_int8"][metric],
        "dev": val["metrics"]["dev"]["onnx_int8"][metric] if "dev" in val["metrics"] else None,
        "teacher_validation": val["metrics"]["validation"]["teacher"][metric],
        "latency_ms": _ms(speed, SHIPPED, cell),
        "speedup": head["speedup_p50"],
        "speedup_vs_dense_int8": head["speedup_vs_dense_int8"],
        "size_mb": round((artifact / GRAPHS["int8"]).stat().st_size / 1e6, 2),
        "cell": {"provider": cell[0], "batch": cell[1], "seq": cell[2]},
    }


def dense_points(reports: list[dict]) -> list[dict]:
    """The dense fp32 teacher and its int8 graph, as every artifact's benchmark measured them (averaged)."""
    metric = reports[0]["validation"]["metric"]

    def metric_of(split: str, graph: str) -> float | None:
        values = [
            r["validation"]["metrics"][split][graph][metric] for r in reports if split in r["validation"]["metrics"]
        ]
        return round(mean(values), 4) if values else None

    cells = [_cell(r["speed"]) for r in reports]

    def ms_of(model: str) -> float:
        return mean(_ms(r["speed"], model, cell) for r, cell in zip(reports, cells, strict=True))

    int8_ratio = mean(
        _ratio(r["speed"], "dense-int8", cell)["speedup_p50"] for r, cell in zip(reports, cells, strict=True)
    )
    common = {"metric": metric, "teacher_validation": metric_of("validation", "teacher"), "size_mb": None}
    return [
        {**common, "artifact": None, "run": "dense fp32 (teacher)", "method": "dense",
         "validation": metric_of("validation", "teacher_onnx_fp32"), "dev": metric_of("dev", "teacher_onnx_fp32"),
         "latency_ms": ms_of("dense"), "speedup": 1.0, "speedup_vs_dense_int8": 1 / int8_ratio},
        {**common, "artifact": None, "run": "dense int8", "method": "dense-int8",
         "validation": metric_of("validation", "teacher_onnx_int8"), "dev": metric_of("dev", "teacher_onnx_int8"),
         "latency_ms": ms_of("dense-int8"), "speedup": int8_ratio, "speedup_vs_dense_int8": 1.0},
    ]  # fmt: skip


def mark_front(points: list[dict]) -> None:
    """`pareto`: no other point is at least as accurate (validation) and as fast, and better in one of them."""
    for p in points:
        p["pareto"] = not any(
            q is not p
            and q["validation"] >= p["validation"]
            and q["speedup"] >= p["speedup"]
            and (q["validation"] > p["validation"] or q["speedup"] > p["speedup"])
            for q in points
        )


def select(points: list[dict], max_metric_drop: float | None) -> dict | None:
    """The fastest artifact whose validation metric is within `max_metric_drop` absolute points of its teacher's
    (the drop is measured on validation, never on dev); None when none is."""
    if max_metric_drop is None:
        return None
    within = [
        p
        for p in points
        if p["artifact"] is not None and p["teacher_validation"] - p["validation"] <= max_metric_drop + 1e-9
    ]
    return max(within, key=lambda p: p["speedup"], default=None)


def pareto_report(artifacts: list[tuple[str, Path]], failed: list[dict], max_metric_drop: float | None) -> dict:
    """The `pareto.json` content for (label, artifact folder) pairs and the runs that failed."""
    reports = [json.loads((path / REPORT_JSON).read_text()) for _, path in artifacts]
    points = [artifact_point(path, label, r) for (label, path), r in zip(artifacts, reports, strict=True)]
    everything = [*dense_points(reports), *points] if points else []
    mark_front(everything)
    chosen = select(points, max_metric_drop)
    for p in everything:
        p["selected"] = p is chosen
    return {
        "metric": everything[0]["metric"] if everything else None,
        "budget": None
        if max_metric_drop is None
        else {"max_metric_drop": max_metric_drop, "against": "teacher", "split": "validation", "unit": "points"},
        "points": everything,
        "failed": failed,
        "selected": chosen["artifact"] if chosen else None,
    }


def write_pareto(output: Path, result: dict) -> None:
    """pareto.json, pareto.png and the `selected` link, each replaced in one rename (the link removed when
    nothing is selected)."""
    output = Path(output)
    tmp = output / ".pareto.json.tmp"
    tmp.write_text(json.dumps(result, indent=2))
    os.replace(tmp, output / "pareto.json")
    if result["points"]:
        plot_pareto(result, output / ".pareto.png.tmp")
        os.replace(output / ".pareto.png.tmp", output / "pareto.png")
    link = output / SELECTED_LINK
    if result["selected"]:
        tmp_link = output / f".{SELECTED_LINK}.tmp"
        tmp_link.unlink(missing_ok=True)
        tmp_link.symlink_to(Path(result["selected"]).name)  # relative: the folder may move as a whole
        os.replace(tmp_link, link)
    elif link.is_symlink():
        link.unlink()


def plot_pareto(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = result["points"]
    fig, ax = plt.subplots(figsize=(7.5, 5))
    front = sorted((p for p in points if p["pareto"]), key=lambda p: p["speedup"])
    ax.plot([p["speedup"] for p in front], [p["validation"] for p in front], "-", color="0.6", label="Pareto front")
    for p in points:
        dense = p["artifact"] is None
        ax.scatter(p["speedup"], p["validation"], marker="s" if dense else "o", color="k" if dense else "C0", zorder=3)
        if p["selected"]:
            ax.scatter(p["speedup"], p["validation"], marker="*", s=300, color="C3", zorder=4, label="selected")
        ax.annotate(p["run"], (p["speedup"], p["validation"]), fontsize=7, xytext=(4, 3), textcoords="offset points")
    budget = result["budget"]
    if budget and points:
        line = points[0]["teacher_validation"] - budget["max_metric_drop"]
        ax.axhline(line, ls="--", color="C3", lw=0.8, label=f"budget: teacher - {budget['max_metric_drop']} points")
    cell = next((p["cell"] for p in points if p.get("cell")), {})
    ax.set_xlabel(f"speedup vs dense fp32 (int8 graph, p50, batch {cell.get('batch')} x seq {cell.get('seq')})")
    ax.set_ylabel(f"validation {result['metric']} (split carved from train)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=120)
    plt.close(fig)


def pareto_rows(result: dict) -> list[dict]:
    """One flat row per point, for a table (Prefect artifact, CLI)."""
    return [
        {
            "run": p["run"],
            "validation": round(p["validation"], 2),
            "dev": None if p["dev"] is None else round(p["dev"], 2),
            "speedup": round(p["speedup"], 2),
            "vs_dense_int8": round(p["speedup_vs_dense_int8"], 2),
            "latency_ms": round(p["latency_ms"], 2),
            "size_mb": p["size_mb"],
            "pareto": p["pareto"],
            "selected": p["selected"],
            "artifact": Path(p["artifact"]).name if p["artifact"] else "",
        }
        for p in result["points"]
    ]

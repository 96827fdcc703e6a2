"""Render the run report (report.json's content) as Markdown for people and for Prefect's UI."""

from __future__ import annotations


def _fmt(x, digits: int = 2) -> str:
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def latency_rows(speed: dict) -> list[dict]:
    """One flat row per (model, provider, batch, seq) cell: the table artifact and the Markdown table."""
    keep = ("model", "provider", "batch", "seq", "runs", "p50_ms", "p90_ms", "p99_ms", "throughput_per_s")
    return [{k: (round(c[k], 3) if isinstance(c[k], float) else c[k]) for k in keep} for c in speed.get("cells", [])]


def _mask_lines(mask: dict | None, compaction: dict) -> list[str]:
    """What a pruning mask kept, what compaction could remove, and the zeros a dense runtime still multiplies."""
    if not mask:
        return []
    kept = ", ".join(f"{k} {v['kept']}/{v['units']}" for k, v in mask["kinds"].items())
    z = compaction.get("remaining_zeros", {})
    removed_heads, removed_neurons = (
        sum(compaction.get("removed_heads", [])),
        sum(compaction.get("removed_ffn_neurons", [])),
    )
    return [
        f"Mask: kept {kept} ({100 * mask['kept_fraction']:.1f}% of the masked weights). Compaction removed "
        f"{removed_heads} heads and {removed_neurons} FFN neurons that became empty. "
        f"{100 * z.get('zero_fraction', 0):.1f}% of the remaining encoder linear weights are zeros that a dense "
        "runtime still multiplies (unstructured sparsity gives it no speed).",
        "",
    ]


def render_markdown(report: dict) -> str:
    lines = [f"# {report.get('artifact', 'deploy report')}", ""]
    lines += [f"- task: **{report['task']}**, method: **{report['method']}**", f"- data: {report['data']['source']}"]
    lines += [f"- teacher: {report['teacher'].get('source')} ({report['teacher'].get('path')})", ""]
    v = report.get("validation", {})
    if v:
        splits = list(v["metrics"])  # validation (carved from train, gates) and dev (the test, reported only)
        names = list(next(iter(v["metrics"][splits[0]].values())))
        columns = [(split, k) for split in splits for k in names]
        lines += [
            "## Metrics",
            "",
            f"Headline metric: **{v.get('metric', 'accuracy')}** (the gates use it). Gates look at "
            f"`{v.get('gated_on', splits[0])}`; dev is never used to choose.",
            "",
        ]
        lines += ["| model | " + " | ".join(f"{split} {k}" for split, k in columns) + " |"]
        lines += ["|---|" + "---|" * len(columns)]
        for name in v["metrics"][splits[0]]:
            lines.append(f"| {name} | " + " | ".join(_fmt(v["metrics"][sp][name][k]) for sp, k in columns) + " |")
        p = v["onnx_parity"]
        lines += [
            "",
            f"ONNX fp32 vs compacted torch: max |Δ logits| = {p['max_abs_diff']:.2e}, argmax agreement "
            f"{p['argmax_agreement']:.4f} over {p['examples']} examples; "
            f"int8 loses {v['int8_metric_drop']:.2f} points of {v.get('metric', 'accuracy')} against fp32.",
            "",
        ]
    c = report.get("compaction", {})
    if c:
        lines += [
            "## Structure",
            "",
            f"FFN widths {c['ffn_widths_before']} → {c['ffn_widths']}; heads {c['heads']}; "
            f"scaling folded in layers {c['folded_scale_layers']}; compaction max |Δ logits| {c['max_abs_diff']:.1e}.",
            "",
        ]
        lines += _mask_lines(report.get("compress", {}).get("mask"), c)
    s = report.get("speed", {})
    if s:
        dev = s["device"]
        lines += [
            "## Latency (ONNX Runtime)",
            "",
            f"{dev.get('cpu')}, ORT {dev.get('ort_version')}, {dev.get('threads')} intra-op threads, spinning "
            f"{dev.get('spinning')}, models interleaved in one process on the same inputs.",
            "",
            f"Parameters: dense {s['params']['dense']:,}, compressed {s['params']['compressed']:,}.",
            "",
            "| model | provider | batch | seq | runs | p50 ms | p90 ms | p99 ms | seq/s |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in latency_rows(s):
            lines.append("| " + " | ".join(_fmt(x) for x in r.values()) + " |")
        lines += [
            "",
            "| model | batch | seq | speedup vs dense fp32 (p50) | vs dense int8 | FLOP bound | measured / bound |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in s["speedups"]:
            if r["provider"].startswith("CPU"):
                bound = r.get("flop_bound")
                frac = r.get("fraction_of_bound")
                lines.append(
                    f"| {r['model']} | {r['batch']} | {r['seq']} | {r['speedup_p50']:.2f}× | "
                    f"{_fmt(r.get('speedup_vs_dense_int8')) + '×' if r.get('speedup_vs_dense_int8') else ''} | "
                    f"{_fmt(bound) + '×' if bound else ''} | {_fmt(frac) if frac else ''} |"
                )
        lines += ["", f"![latency]({s['plot']})", ""]
    t = report.get("timings", {})
    if t:
        lines += ["## Timings (s)", "", ", ".join(f"{k} {_fmt(x, 1)}" for k, x in t.items()), ""]
    return "\n".join(lines)

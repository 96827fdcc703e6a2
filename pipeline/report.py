"""Render the run report (report.json's content) as Markdown for people and for Prefect's UI."""

from __future__ import annotations


def _fmt(x, digits: int = 2) -> str:
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


# Per-cell spread and contention, as their Markdown headers; absent from reports made before they were measured.
SPREAD_HEADERS = {"p90_over_p50": "p90/p50", "others_cores": "others' cores"}


def parity_words(p: dict) -> str:
    """A parity report (`ParityReport.as_dict`) in words: max |Δ|, and the argmax agreement or, for vectors, the
    least cosine (each where the report has it)."""
    words = [f"max |Δ| {p['max_abs_diff']:.2e}"]
    if p.get("min_cosine") is not None:
        words.append(f"least cosine {p['min_cosine']:.6f}")
    elif p.get("argmax_agreement") is not None:
        words.append(f"argmax agreement {p['argmax_agreement']:.4f}")
    return ", ".join(words)


def latency_rows(speed: dict) -> list[dict]:
    """One flat row per (model, provider, batch, seq) cell: the table artifact and the Markdown table."""
    keep = ("model", "provider", "batch", "seq", "runs", "p50_ms", "p90_ms", "p99_ms", "throughput_per_s")
    return [
        {k: (round(c[k], 3) if isinstance(c[k], float) else c[k]) for k in (*keep, *SPREAD_HEADERS) if k in c}
        for c in speed.get("cells", [])
    ]


def _machine_line(machine: dict | None) -> list[str]:
    """Whether other processes competed for the cores while timing: busy figures are not clean figures."""
    if not machine:
        return []
    load = f"load average {_fmt(machine['loadavg_before'])} before, {_fmt(machine['loadavg_after'])} after"
    worst = machine.get("others_cores_worst_cell")
    worst = f" ({worst:.2f} in the worst cell)" if worst is not None else ""
    held = f"other processes held {machine['others_cores']:.2f} cores on average{worst}"
    allowed = f"{machine['allowed_cores']:.2f} allowed beside {machine['threads']} timing threads"
    if machine["busy"]:
        return [
            f"**Busy machine: {held} while these figures were taken ({allowed}; {load}). They are not clean: "
            "contention inflates latencies and distorts speedups; measure again on a quiet machine.**",
            "",
        ]
    return [f"Quiet machine: {held} while timing ({allowed}; {load}).", ""]


def _plan_table_line(plan: dict | None) -> list[str]:
    machine = ((plan or {}).get("table") or {}).get("machine") or {}
    if not machine.get("busy"):
        return []
    return [
        f"**The plan's latency table was measured on a busy machine (other processes held "
        f"{machine['others_cores']:.2f} cores; accepted with `target.accept_busy`, not cached): its predicted "
        "speedup is not clean either.**",
        "",
    ]


def _runs(values: list) -> str:
    """A per-layer list as runs: [1536, 1536, 384, 384] -> "1536×2, 384×2"."""
    runs: list[list] = []
    for v in values:
        if runs and runs[-1][0] == v:
            runs[-1][1] += 1
        else:
            runs.append([v, 1])
    return ", ".join(f"{v}×{n}" if n > 1 else str(v) for v, n in runs) or "none"


def _structure_line(c: dict, teacher: dict | None) -> str:
    """The teacher's shape against the artifact's.

    Compaction's own input is often narrow already (MLP Fusion and distill's narrowing shrink the FFNs while
    compressing), so its widths before and after can be equal; the teacher's (from the speed stage) show what
    the whole run did. Reports without them fall back to compaction's input.
    """
    if teacher:
        ffn, heads, side = teacher["ffn"], teacher["heads"], "teacher"
    else:
        ffn, heads, side = c["ffn_widths_before"], c.get("heads_before", c["heads"]), "compaction input"
    return (
        f"FFN widths {_runs(ffn)} ({side}) → {_runs(c['ffn_widths'])} (artifact); heads {_runs(heads)} → "
        f"{_runs(c['heads'])}; scaling folded in layers {c['folded_scale_layers']}; compaction max |Δ logits| "
        f"{c['max_abs_diff']:.1e}."
    )


def _mask_lines(compress: dict, compaction: dict) -> list[str]:
    """What a pruning mask kept, what compaction could remove (SMP compacts once already, before its recovery),
    and the zeros a dense runtime still multiplies."""
    mask = compress.get("mask")
    if not mask:
        return []
    kept = ", ".join(f"{k} {v['kept']}/{v['units']}" for k, v in mask["kinds"].items())
    z = compaction.get("remaining_zeros", {})
    early = compress.get("compacted_before_recovery") or {}
    removed_heads, removed_neurons = (
        sum(compaction.get("removed_heads", [])) + sum(early.get("removed_heads", [])),
        sum(compaction.get("removed_ffn_neurons", [])) + sum(early.get("removed_ffn_neurons", [])),
    )
    return [
        f"Mask: kept {kept} ({100 * mask['kept_fraction']:.1f}% of the masked weights). Compaction removed "
        f"{removed_heads} heads and {removed_neurons} FFN neurons that became empty. "
        f"{100 * z.get('zero_fraction', 0):.1f}% of the remaining encoder linear weights are zeros that a dense "
        "runtime still multiplies (unstructured sparsity gives it no speed).",
        "",
    ]


def kd_teacher_line(kd: dict) -> str:
    """Which classifier output KD distilled, and both teachers' scores on validation (gated on) and dev."""
    m = kd["metric"]
    figures = (f"validation {m} {kd['validation']['kd_teacher']:.2f} (teacher {kd['validation']['teacher']:.2f}), "
               f"dev {kd['dev']['kd_teacher']:.2f} (teacher {kd['dev']['teacher']:.2f})")  # fmt: skip
    use = "output KD distilled its logits" if kd["used"] else "not above the teacher: output KD used the teacher's"
    return f"KD teacher: {kd['source']} ({kd['path']}); {figures}; {use}"


def render_markdown(report: dict) -> str:
    lines = [f"# {report.get('artifact', 'deploy report')}", ""]
    lines += [f"- task: **{report['task']}**, method: **{report['method']}**", f"- data: {report['data']['source']}"]
    lines += [f"- teacher: {report['teacher'].get('source')} ({report['teacher'].get('path')})"]
    lines += [f"- {kd_teacher_line(report['kd_teacher'])}"] if report.get("kd_teacher") else []
    lines += [""]
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
            f"ONNX fp32 vs compacted torch: {parity_words(p)} over {p['examples']} examples; "
            f"int8 loses {v['int8_metric_drop']:.2f} points of {v.get('metric', 'accuracy')} against fp32"
            + _fp16_words(v.get("fp16")),
            "",
        ]
    c = report.get("compaction", {})
    if c:
        teacher = report.get("speed", {}).get("shapes", {}).get("dense")
        lines += ["## Structure", "", _structure_line(c, teacher), ""]
        lines += _mask_lines(report.get("compress", {}), c)
    s = report.get("speed", {})
    if s:
        dev = s["device"]
        lines += [
            "## Latency (ONNX Runtime)",
            "",
            f"{dev.get('cpu')}, ORT {dev.get('ort_version')}, {dev.get('threads')} intra-op threads, spinning "
            f"{dev.get('spinning')}, models interleaved in one process on the same inputs.",
            "",
            *_machine_line(s.get("machine")),
            *_plan_table_line(report.get("plan")),
            f"Parameters: dense {s['params']['dense']:,}, compressed {s['params']['compressed']:,}.",
            "",
        ]
        rows = latency_rows(s)
        extra = [h for k, h in SPREAD_HEADERS.items() if rows and k in rows[0]]
        header = ["model", "provider", "batch", "seq", "runs", "p50 ms", "p90 ms", "p99 ms", "seq/s", *extra]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for r in rows:
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
        lines += _passes_lines(s["speedups"])
        lines += _gpu_lines(s["speedups"])
        lines += ["", f"![latency]({s['plot']})", ""]
        lines += _real_length_lines(s.get("real_lengths"))
    t = report.get("timings", {})
    if t:
        lines += ["## Timings (s)", "", ", ".join(f"{k} {_fmt(x, 1)}" for k, x in t.items()), ""]
    return "\n".join(lines)


def _fp16_words(fp16: dict | None) -> str:
    if not fp16:  # reports from before fp16 graphs
        return "."
    return f"; fp16 (for CUDA) {fp16['metric_drop']:.2f}, {parity_words(fp16['parity'])}."


def _passes_lines(speedups: list[dict]) -> list[str]:
    """The cell timed in passes (the headline): its speedups are the median of the passes' ratios, whose range
    says how far one pass alone could have read."""
    rows = [r for r in speedups if r.get("pass_speedups") and r["provider"].startswith("CPU")]
    if not rows:
        return []
    r0 = rows[0]
    ranges = ", ".join(f"{r['model']} {min(r['pass_speedups']):.2f}-{max(r['pass_speedups']):.2f}×" for r in rows)
    return ["", f"{r0['batch']} × {r0['seq']} was timed in {len(r0['pass_speedups'])} passes; its speedups are the "
            f"median of the passes' ratios (one pass read: {ranges})."]  # fmt: skip


def _gpu_lines(speedups: list[dict]) -> list[str]:
    """On CUDA the baseline a GPU user weighs the artifact against is the dense graph in fp16."""
    rows = [r for r in speedups if r["provider"].startswith("CUDA")]
    if not rows:
        return []
    lines = ["", "| model (CUDA) | batch | seq | speedup vs dense fp32 (p50) | vs dense fp16 |"]
    lines.append("|---|---|---|---|---|")
    for r in rows:
        fp16 = r.get("speedup_vs_dense_fp16")
        lines.append(f"| {r['model']} | {r['batch']} | {r['seq']} | {r['speedup_p50']:.2f}× | "
                     f"{_fmt(fp16) + '×' if fp16 else ''} |")  # fmt: skip
    return lines


def _real_length_lines(real: dict | None) -> list[str]:
    """The dev set's real inputs, padded per batch as the server pads: the second headline, beside 8 x 128."""
    if not real:
        return []
    lines = [
        "### Real lengths",
        "",
        f"The first {real['examples']} dev inputs in order, {real['batch']} at a time, each batch padded to its "
        f"longest (mean {real['mean_padded_tokens_per_batch']} padded tokens per batch, at most "
        f"{real['max_length']} per input); the median of {real['rounds']} interleaved passes."
        + (" **The machine was busy while timing.**" if real.get("busy") else ""),
        "",
        "| model | examples/s | vs dense fp32 | vs dense int8 |",
        "|---|---|---|---|",
    ]
    for name, r in real["models"].items():
        lines.append(
            f"| {name} | {_fmt(r['examples_per_s'], 1)} | {_fmt(r['speedup'])}× | "
            f"{_fmt(r['speedup_vs_dense_int8'])}× |"
        )
    return [*lines, ""]


def derived_line(derived: dict) -> str:
    """`relation heads 64 (paper), teacher layer 21 (paper)`: a distillation's resolved shape settings, each with
    where it came from (`set`, the `paper`'s rule, or `derived`)."""
    return ", ".join(f"{name.replace('_', ' ')} {d['value']} ({d['from']})" for name, d in derived.items())

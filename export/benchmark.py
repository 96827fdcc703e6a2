"""Latency benchmark for exported ONNX classifiers, plus analytic encoder FLOPs.

All models are timed in one process with identical inputs and thread settings,
interleaved run by run inside each (batch, seq) cell so machine drift hits every
model equally. Interleaving cannot undo contention, though: other processes' CPU time
is measured around every cell, and the result says whether the machine was busy.
"""

from __future__ import annotations

import gc
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import onnxruntime as ort
import psutil

from export.sessions import CPU, CUDA, make_session, physical_cores

HEADLINE = (8, 128)  # batch x sequence the quality bars are stated at (the speed target's shape, by default)


class Grid(Protocol):
    """What the benchmark reads of its settings (the pipeline's `BenchSettings` has these fields and more)."""

    batch_sizes: tuple[int, ...]
    seq_lens: tuple[int, ...]
    warmup: int
    min_runs: int
    max_runs: int
    max_seconds_per_cell: float
    threads: int | None
    providers: tuple[str, ...] | None
    busy_cores: float
    passes: int


def no_stop() -> None:
    """The default `check` between timing rounds: nothing can stop a run but the usual KeyboardInterrupt."""


def cpu_name() -> str:
    name = platform.processor()
    if name in ("", "x86_64", "aarch64", "unknown"):  # Linux usually gives only the arch
        try:
            text = Path("/proc/cpuinfo").read_text()
            name = next(ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.lower().startswith("model name"))
        except (OSError, StopIteration):
            name = name or platform.machine()
    return name


def make_inputs(
    session_input_names: list[str], batch: int, seq: int, vocab_size: int, seed: int = 0
) -> dict[str, np.ndarray]:
    """Random int64 BERT inputs for exactly the requested names.

    Token ids avoid the low (special-token) range when the vocabulary allows it.

    Raises:
        ValueError: For an input name this benchmark does not know how to fill.
    """
    rng = np.random.default_rng(seed)
    low = 1000 if vocab_size > 1000 else 0
    shape = (batch, seq)
    makers = {
        "input_ids": lambda: rng.integers(low, vocab_size, size=shape, dtype=np.int64),
        "attention_mask": lambda: np.ones(shape, dtype=np.int64),
        "token_type_ids": lambda: np.zeros(shape, dtype=np.int64),
        "position_ids": lambda: np.broadcast_to(np.arange(seq, dtype=np.int64), shape).copy(),
    }
    unknown = [n for n in session_input_names if n not in makers]
    if unknown:
        raise ValueError(f"unsupported model inputs: {unknown}")
    return {n: makers[n]() for n in session_input_names}


def _feeds(sess: ort.InferenceSession, b: int, s: int, vocab_size: int) -> dict[str, np.ndarray]:
    # Same seed for every model, so shared inputs are identical.
    return _typed(sess, make_inputs([i.name for i in sess.get_inputs()], b, s, vocab_size))


def _stats(times_ms: list[float], b: int) -> dict:
    t = np.asarray(times_ms)
    p25, p50, p75, p90, p99 = np.percentile(t, [25, 50, 75, 90, 99])
    mean = float(t.mean())
    return {
        "runs": len(t),
        "p50_ms": float(p50),
        "p90_ms": float(p90),
        "p99_ms": float(p99),
        "mean_ms": mean,
        "std_ms": float(t.std()),
        "throughput_per_s": b * 1000.0 / mean,
        "p90_over_p50": float(p90 / p50),  # spread: a cell whose runs were interrupted has a long tail
        "iqr_rel": float((p75 - p25) / p50),
    }


# System-wide busy time: iowait and idle are not. On Linux `user` and `nice` already include guest time.
BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq", "steal")
JUDGED_CELL_S = 1.0  # a cell timed for less is too few clock ticks (10 ms) to be judged on its own


@dataclass(frozen=True)
class LoadSample:
    """CPU seconds used so far by the whole machine and by this process, at one instant."""

    wall_s: float
    machine_cpu_s: float  # busy time summed over every logical CPU
    own_cpu_s: float  # every thread of this process, ONNX Runtime's intra-op threads included
    loadavg_1m: float


def load_sample() -> LoadSample:
    # Children are other processes as far as contention goes (and their time only counts once reaped).
    machine, own = psutil.cpu_times(), psutil.Process().cpu_times()
    return LoadSample(
        wall_s=time.perf_counter(),
        machine_cpu_s=sum(getattr(machine, f, 0.0) for f in BUSY_FIELDS),
        own_cpu_s=own.user + own.system,
        loadavg_1m=os.getloadavg()[0],
    )


def others_cores(before: LoadSample, after: LoadSample) -> float:
    """Cores other processes held on average between two samples: machine busy time minus this process's."""
    wall = after.wall_s - before.wall_s
    if wall <= 0:
        return 0.0
    others = (after.machine_cpu_s - before.machine_cpu_s) - (after.own_cpu_s - before.own_cpu_s)
    return max(0.0, others / wall)


def allowed_cores(threads: int, busy_cores: float, cores: int | None = None) -> float:
    """Others' average cores a timing tolerates: `busy_cores`, plus the physical cores it leaves idle."""
    return busy_cores + max(0, (cores or physical_cores()) - threads)


def is_busy(others: float, threads: int, busy_cores: float, cores: int | None = None) -> bool:
    return others > allowed_cores(threads, busy_cores, cores)


def wait_until_quiet(max_wait_s: float, threads: int, busy_cores: float, window_s: float = 1.0) -> float:
    """Sample the machine in `window_s` windows until others leave it quiet or `max_wait_s` is spent.

    Returns the cores others held in the last window (0.0 when there was no time to sample).
    """
    others, deadline = 0.0, time.perf_counter() + max_wait_s
    while time.perf_counter() + window_s <= deadline:
        before = load_sample()
        time.sleep(window_s)
        others = others_cores(before, load_sample())
        if not is_busy(others, threads, busy_cores):
            break
    return others


def machine_load(spans: list[tuple[LoadSample, LoadSample]], threads: int, busy_cores: float) -> dict:
    """The machine's load over the timed sections (`spans`, one per cell) and the verdict on it.

    Busy when others held more than the allowance on average over all cells, or in any cell timed long enough
    to judge alone (a burst during one cell spoils that cell even when the average hides it).
    """
    cores = physical_cores()
    walls = [b.wall_s - a.wall_s for a, b in spans]
    timed = sum(walls)
    others = [others_cores(a, b) for a, b in spans]
    average = sum(o * w for o, w in zip(others, walls, strict=True)) / timed if timed > 0 else 0.0
    judged = [o for o, w in zip(others, walls, strict=True) if w >= JUDGED_CELL_S]
    own = sum(b.own_cpu_s - a.own_cpu_s for a, b in spans)
    return {
        "others_cores": round(average, 3),
        "others_cores_worst_cell": round(max(judged), 3) if judged else None,
        "own_cores": round(own / timed, 3) if timed > 0 else 0.0,
        "timed_s": round(timed, 2),
        "loadavg_before": round(spans[0][0].loadavg_1m, 2) if spans else None,
        "loadavg_after": round(spans[-1][1].loadavg_1m, 2) if spans else None,
        "cores": cores,
        "logical_cpus": psutil.cpu_count() or cores,
        "threads": threads,
        "busy_cores": busy_cores,
        "allowed_cores": allowed_cores(threads, busy_cores, cores),
        "busy": any(is_busy(o, threads, busy_cores, cores) for o in [average, *judged]),
    }


def _time_cell(
    sessions: dict, feeds: dict, cfg: Grid, check: Callable[[], None], warm: bool = True
) -> dict[str, list[float]]:
    names = list(sessions)
    for name in names:
        for _ in range(cfg.warmup if warm else 0):  # a later pass of the same cell is warm already
            sessions[name].run(None, feeds[name])
    times: dict[str, list[float]] = {n: [] for n in names}
    gc.collect()
    gc.disable()  # a collection inside one model's run would bias that model only
    try:
        start, it = time.perf_counter(), 0
        while it < cfg.max_runs and not (
            it >= cfg.min_runs and time.perf_counter() - start > cfg.max_seconds_per_cell
        ):
            check()  # between rounds: a stop signal ends a long cell within one round
            # Round-robin, rotating the start so no model always follows the same one.
            for k in range(len(names)):
                name = names[(it + k) % len(names)]
                t0 = time.perf_counter()
                sessions[name].run(None, feeds[name])
                times[name].append((time.perf_counter() - t0) * 1000.0)
            it += 1
    finally:
        gc.enable()
    return times


def _time_passes(
    sessions: dict, feeds: dict, cfg: Grid, check: Callable[[], None], passes: int
) -> tuple[dict[str, list[float]], dict[str, list[float]] | None]:
    """One cell timed in `passes` passes, one after another (warm-up once): every run pooled, and each model's p50
    per pass (None for one pass). A shared VM's speed drifts by several percent from one few-second stretch to
    the next, and not equally for every model (a 2-layer int8 student against its 6-layer fp32 teacher read 7.97x
    to 8.89x over sixteen 6-second passes, docs/results.md): the median of the passes' ratios is the steadier
    speedup."""
    runs = [_time_cell(sessions, feeds, cfg, check, warm=i == 0) for i in range(passes)]
    pooled = {n: [t for r in runs for t in r[n]] for n in sessions}
    per_pass = {n: [float(np.median(r[n])) for r in runs] for n in sessions} if passes > 1 else None
    return pooled, per_pass


def _open_sessions(models: dict, prov: str, threads: int, skipped: list) -> dict:
    sessions = {}
    for name, path in models.items():
        if prov == CUDA and "int8" in name.lower():
            skipped.append({"model": name, "provider": prov, "reason": "dynamic int8 quantised graph is CPU-oriented"})
            continue
        if prov == CPU and "fp16" in name.lower():
            skipped.append({"model": name, "provider": prov, "reason": "fp16 graph is for CUDA (no faster than fp32 "
                            "on a CPU)"})  # fmt: skip
            continue
        try:
            sess = make_session(path, prov, threads)
        except Exception as e:  # e.g. CUDA listed but its libraries fail to load
            if prov == CPU:
                raise
            skipped.append({"model": name, "provider": prov, "reason": f"session failed: {e}"})
            continue
        if sess.get_providers()[0] != prov:  # ORT silently falls back to CPU
            skipped.append({"model": name, "provider": prov, "reason": "provider fell back"})
            continue
        sessions[name] = sess
    return sessions


def benchmark(
    models: dict[str, str | Path],
    vocab_size: int,
    cfg: Grid,
    check: Callable[[], None] = no_stop,
    repeat: tuple[int, int] | None = None,
) -> dict:
    """Time every model on every (batch, seq) cell for each provider; `check` runs between timing rounds (the
    pipeline's stop-signal check). The cell `repeat` (batch, seq), where the grid has it, is timed in `cfg.passes`
    passes (`_time_passes`): its cells carry "pass_p50_ms", and `speedups` reads the median of the passes' ratios.

    Returns:
        JSON-serialisable dict with "device", "cells" (each with the cores other processes held while it
        was timed), "skipped" (model/provider pairs not run, with the reason; int8 models are skipped on
        CUDA, fp16 ones on the CPU) and "machine" (`machine_load`: the load while timing and whether the
        machine was busy).
    """
    threads = cfg.threads or physical_cores()
    available = ort.get_available_providers()
    providers = list(cfg.providers or [CPU] + ([CUDA] if CUDA in available else []))
    cells, skipped, ran, spans = [], [], [], []
    for prov in providers:
        if prov not in available:
            skipped += [{"model": m, "provider": prov, "reason": "provider not available"} for m in models]
            continue
        sessions = _open_sessions(models, prov, threads, skipped)
        if not sessions:
            continue
        ran.append(prov)
        for b in cfg.batch_sizes:
            for s in cfg.seq_lens:
                feeds = {n: _feeds(sess, b, s, vocab_size) for n, sess in sessions.items()}
                before = load_sample()
                passes = cfg.passes if (b, s) == repeat else 1
                times, per_pass = _time_passes(sessions, feeds, cfg, check, passes)
                spans.append((before, load_sample()))
                others = round(others_cores(*spans[-1]), 3)
                for name, t in times.items():
                    cells.append(
                        {"model": name, "provider": prov, "batch": b, "seq": s, **_stats(t, b), "others_cores": others}
                        | ({"pass_p50_ms": per_pass[name]} if per_pass else {})
                    )
        del sessions  # free device memory before the next pass
    device = {
        "provider": ran[0] if ran else None,
        "providers": ran,
        "threads": threads,
        "spinning": "off",
        "execution_mode": "ORT_SEQUENTIAL",
        "graph_optimization": "ORT_ENABLE_ALL",
        "interleaved": True,
        "cpu": cpu_name(),
        "ort_version": ort.__version__,
    }
    machine = machine_load(spans, threads, cfg.busy_cores)
    return {"device": device, "cells": cells, "skipped": skipped, "machine": machine}


def real_lengths(
    models: dict[str, str | Path],
    batches: list[dict[str, np.ndarray]],
    rounds: int,
    threads: int | None = None,
    busy_cores: float = 0.25,
    check: Callable[[], None] = no_stop,
) -> dict:
    """Throughput on real inputs: every batch (already padded to its own longest, as the server pads) through
    every model on the CPU, interleaved batch by batch with a rotating start, `rounds` times; per model the median
    round's wall time over the whole set, its examples per second and padded tokens per batch on average."""
    threads = threads or physical_cores()
    sessions = _open_sessions(models, CPU, threads, [])
    names = list(sessions)
    feeds = [{n: _typed(sessions[n], batch) for n in names} for batch in batches]
    for n in names:  # warm-up: one pass over a few batches
        for f in feeds[:3]:
            sessions[n].run(None, f[n])
    totals: dict[str, list[float]] = {n: [] for n in names}
    before = load_sample()
    gc.collect()
    gc.disable()
    try:
        for _ in range(rounds):
            spent = dict.fromkeys(names, 0.0)
            for i, f in enumerate(feeds):
                check()
                for k in range(len(names)):
                    name = names[(i + k) % len(names)]
                    t0 = time.perf_counter()
                    sessions[name].run(None, f[name])
                    spent[name] += time.perf_counter() - t0
            for n in names:
                totals[n].append(spent[n])
    finally:
        gc.enable()
    others = others_cores(before, load_sample())
    examples = sum(len(b["input_ids"]) for b in batches)
    tokens = sum(b["input_ids"].size for b in batches) / max(1, len(batches))
    out = {}
    for n in names:
        seconds = float(np.median(totals[n]))
        out[n] = {"seconds": round(seconds, 6), "examples_per_s": round(examples / seconds, 1)}
    return {
        "examples": examples,
        "batches": len(batches),
        "mean_padded_tokens_per_batch": round(tokens, 1),
        "rounds": rounds,
        "threads": threads,
        "others_cores": round(others, 3),
        "busy": is_busy(others, threads, busy_cores),
        "models": out,
    }


def _typed(sess: ort.InferenceSession, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The batch's arrays the session reads, in the integer type it declares."""
    feeds = {}
    for i in sess.get_inputs():
        a = batch[i.name]
        feeds[i.name] = a.astype(np.int32) if i.type == "tensor(int32)" else a.astype(np.int64)
    return feeds


def speedups(result: dict, baseline: str = "dense") -> list[dict]:
    """p50 speedup (baseline p50 / model p50) per (provider, batch, seq) and model; for a cell timed in passes, the
    median of the passes' ratios, with every pass's ratio ("pass_speedups")."""
    base = {(c["provider"], c["batch"], c["seq"]): c for c in result["cells"] if c["model"] == baseline}
    out = []
    for c in result["cells"]:
        if c["model"] == baseline or (key := (c["provider"], c["batch"], c["seq"])) not in base:
            continue
        row = {k: c[k] for k in ("provider", "batch", "seq", "model")} | {"baseline": baseline}
        passes = zip(base[key].get("pass_p50_ms") or (), c.get("pass_p50_ms") or (), strict=True)
        ratios = [b / m for b, m in passes]
        if ratios:
            row |= {"speedup_p50": float(np.median(ratios)), "pass_speedups": [round(r, 4) for r in ratios]}
        else:
            row["speedup_p50"] = base[key]["p50_ms"] / c["p50_ms"]
        out.append(row)
    return out


def encoder_flops(
    hidden: int,
    heads_per_layer: list[int],
    head_dim: int,
    ffn_per_layer: list[int],
    seq: int,
    num_labels: int = 2,
    ffn_matrices: int = 2,
) -> int:
    """FLOPs (2 x multiply-accumulates) of one sequence through the encoder's matmuls.

    Per layer and token: Q, K, V (3*hidden*heads*head_dim), attention scores and
    context (2*seq*heads*head_dim), output projection (heads*head_dim*hidden) and
    FFN (2*hidden*ffn, 3*hidden*ffn when gated: `ffn_matrices`); plus pooler (hidden*hidden) and classifier
    (hidden*num_labels) once per sequence. Embedding lookups, biases, softmax,
    layernorm and GELU are not counted.
    """
    if len(heads_per_layer) != len(ffn_per_layer):
        raise ValueError("heads_per_layer and ffn_per_layer must have one entry per layer")
    macs = 0
    for heads, ffn in zip(heads_per_layer, ffn_per_layer, strict=True):
        attn = heads * head_dim
        macs += seq * (3 * hidden * attn + 2 * seq * attn + attn * hidden + ffn_matrices * hidden * ffn)
    macs += hidden * hidden + hidden * num_labels
    return 2 * macs


def _grouped_bars(ax, series: dict[str, list[float]], lo=None, hi=None) -> None:
    # One group per cell, one bar per model; NaN (missing cell) draws nothing.
    w = 0.8 / max(len(series), 1)
    for i, (name, vals) in enumerate(series.items()):
        err = None if hi is None else [np.zeros(len(vals)), np.subtract(hi[name], lo[name])]
        ax.bar(np.arange(len(vals)) + (i - (len(series) - 1) / 2) * w, vals, w, label=name, yerr=err, capsize=2)


def plot_latency(result: dict, path: str | Path, title: str = "") -> Path:
    """Grouped p50 bars (log y, p90 whiskers) and speedup vs "dense"; one row per provider."""
    import matplotlib

    matplotlib.use("Agg")  # headless; imported here so importing this module stays cheap
    import matplotlib.pyplot as plt

    provs = list(dict.fromkeys(c["provider"] for c in result["cells"])) or [CPU]
    fig, axes = plt.subplots(len(provs), 2, figsize=(13, 4 * len(provs)), squeeze=False)
    for (ax_l, ax_s), prov in zip(axes, provs, strict=True):
        pc = [c for c in result["cells"] if c["provider"] == prov]
        keys = list(dict.fromkeys((c["batch"], c["seq"]) for c in pc))
        by = {(c["model"], c["batch"], c["seq"]): c for c in pc}
        names = list(dict.fromkeys(c["model"] for c in pc))
        col = {
            q: {n: [by[(n, *k)][q] if (n, *k) in by else np.nan for k in keys] for n in names}
            for q in ("p50_ms", "p90_ms")
        }
        _grouped_bars(ax_l, col["p50_ms"], col["p50_ms"], col["p90_ms"])
        ax_l.set(yscale="log", ylabel="p50 latency (ms), whisker = p90", title=f"{prov}: latency")
        sp = {(s["model"], s["batch"], s["seq"]): s["speedup_p50"] for s in speedups(result) if s["provider"] == prov}
        if sp:
            _grouped_bars(ax_s, {n: [sp.get((n, *k), np.nan) for k in keys] for n in names if n != "dense"})
            ax_s.axhline(1.0, color="k", lw=0.8)
        else:
            ax_s.text(0.5, 0.5, "no 'dense' baseline", ha="center", transform=ax_s.transAxes)
        ax_s.set(ylabel="p50 speedup vs dense (x)", title=f"{prov}: speedup")
        for ax in (ax_l, ax_s):
            ax.set_xticks(np.arange(len(keys)), [f"b{b}×s{s}" for b, s in keys])
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

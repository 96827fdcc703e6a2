"""The plan stage (`--target-speedup`): measure the latency table a speed target is planned on, and plan the shape.

Every probe is a real model cut from the teacher (its first layer, narrowed to h heads and f FFN neurons by
weight norm, compacted; or no layer at all, for the fixed cost) and exported exactly as an artifact is (ONNX, ORT
fusion, dynamic int8), then timed in ONNX Runtime with the benchmark's settings, all probes interleaved in one
process with the dense fp32 teacher. The fixed cost is timed directly: estimated as the difference of a two-layer
and a one-layer probe it was off by 4x on the 12 x 768 teacher, and the error counts once per layer. (A family whose
model cannot run without layers, DeBERTa-v2, keeps that estimate.)
The table is cached by the teacher's shape, the grid, the input shape, the thread count, the CPU and the
library versions: it describes this machine, not the teacher's weights. So only a table measured on a quiet
machine is cached: a busy one is measured again (`target.busy_attempts`, waiting up to `target.busy_wait_s`
for quiet in between), then refused, or with `target.accept_busy` used by this run alone and marked busy.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from export.benchmark import benchmark, cpu_name, speedups, wait_until_quiet
from export.onnx import export_optimized, graph_structure, library_versions
from export.sessions import physical_cores
from pipeline import interrupts
from pipeline.cache import cached_build, key_of
from pipeline.compress.compaction import cut_from
from pipeline.compress.deploy_config import DeployConfig
from pipeline.compress.shapes import (
    LatencyTable,
    Shape,
    apply_shape,
    calibrate,
    check_hidden_options,
    check_target_chain,
    layer_options,
    search_widths,
    shape_of,
)
from pipeline.config.schema import BenchSettings, TargetConfig
from pipeline.errors import PipelineError
from pipeline.models.dense_graphs import dense_graphs
from pipeline.models.families import Arch, arch_of
from pipeline.staging import DENSE_GRAPHS
from serving.artifact import CONFIG, GRAPHS

if TYPE_CHECKING:
    from torch import nn

log = logging.getLogger(__name__)

TABLE_VERSION = "3"  # 3: the fixed cost measured on a model with no layer; 2: tables carry the machine's load
FIXED_PROBE = "fixed"  # the teacher with no layer left: embeddings and head alone, the cost every shape pays
TABLE_FILE = "table.json"


class _Uncached(Exception):
    """Raised out of the cache's build step to hand back an accepted busy table without caching it."""

    def __init__(self, record: dict) -> None:
        super().__init__("busy latency table: not cached")
        self.record = record


def grid(arch: Arch, target: TargetConfig) -> tuple[list[int], list[int]]:
    """The probes' head counts and FFN widths: the grid's fractions of the teacher's."""
    h = sorted({max(1, round(f * arch.heads)) for f in target.heads_grid})
    f = sorted({max(1, round(x * arch.ffn)) for x in target.ffn_grid})
    return h, f


def measure_table(*args: Any, **kwargs: Any) -> LatencyTable:
    """`table_record`'s latency table (its arguments): for the teacher's architecture, a student folder's or a
    narrower width, on this machine, against the dense fp32 teacher (cached when measured quiet)."""
    return LatencyTable.from_dict(table_record(*args, **kwargs))


def _machine(
    cfg: dict, arch: Arch, baseline: Arch, target: TargetConfig, bench: BenchSettings, teacher_dir: str, cache_dir: str
) -> dict:
    """What a timing describes: the architecture timed, the baseline, the input shape, threads, CPU, the runtime
    and the graphs. Not the exporting libraries' versions: an upgrade that exports the same dense graph (its
    `graph_structure`) times the same, and re-measuring would only move the plan by the timing noise (a
    transformers upgrade measured its own table and planned a shape 10% slower: docs/results.md)."""
    return dict(
        family=cfg["model_type"],
        arch=dataclasses.asdict(arch),
        baseline=dataclasses.asdict(baseline) if baseline != arch else None,
        shape=(target.batch, target.seq),
        threads=bench.threads or physical_cores(),
        cpu=cpu_name(),
        runtime=library_versions(("onnxruntime",)),
        graph=_dense_structure(teacher_dir, cache_dir),
    )


@functools.lru_cache(maxsize=8)
def _dense_structure(teacher_dir: str, cache_dir: str) -> str:
    """The dense teacher graph's `graph_structure`, once per teacher in a process: a plan asks for it with the table
    and every shape check, and each ask would hash the teacher's files and parse its graph again."""
    return graph_structure(dense_graphs(teacher_dir, cache_dir)[0] / DENSE_GRAPHS["fp32"])


def _settings(target: TargetConfig, bench: BenchSettings) -> BenchSettings:
    """The benchmark's settings at the target's one input shape, on the CPU provider."""
    return bench.model_copy(
        update={
            "batch_sizes": (target.batch,),
            "seq_lens": (target.seq,),
            "threads": bench.threads or physical_cores(),
            "providers": ("CPUExecutionProvider",),
        }
    )


def _architectures(teacher_dir: str, planned_on: str, hidden: int | None) -> tuple[dict, Arch, Arch]:
    """(`planned_on`'s config, its architecture at `hidden`, the teacher's architecture)."""
    cfg = json.loads((Path(planned_on) / CONFIG).read_text())
    arch = arch_of(cfg)
    if hidden is not None and hidden != arch.hidden:
        arch = dataclasses.replace(arch, hidden=hidden, heads=hidden // arch.head_dim)
    return cfg, arch, arch_of(json.loads((Path(teacher_dir) / CONFIG).read_text()))


def table_record(
    teacher_dir: str,
    target: TargetConfig,
    bench: BenchSettings,
    cache_dir: str,
    planned_on: str | None = None,
    hidden: int | None = None,
) -> dict:
    """The table's fields plus "device", "machine" (the load it was measured under) and "cache" (what the cache
    did: "hit", "stored", or "not stored: busy"). The probes are cut from `planned_on` (a student folder of its
    own shape, e.g. a narrower general student; default: the teacher), narrowed to `hidden` when given (heads of
    the teacher's size, hidden / head size of them), the baseline is the dense fp32 teacher.

    Raises:
        PipelineError: every attempt found the machine busy and `target.accept_busy` is off (nothing cached).
    """
    planned_on = planned_on or teacher_dir
    cfg, arch, baseline = _architectures(teacher_dir, planned_on, hidden)
    heads, ffn = grid(arch, target)
    machine = _machine(cfg, arch, baseline, target, bench, teacher_dir, cache_dir)
    key = key_of(stage="latency-table", v=TABLE_VERSION, **machine, heads=heads, ffn=ffn)
    settings = _settings(target, bench)

    def timing(tmp: Path) -> Callable[[], dict]:
        models, direct = _export_probes(teacher_dir, planned_on, arch, heads, ffn, tmp, cache_dir)
        return lambda: _time_probes(models, direct, arch, heads, ffn, settings)

    return _quiet_timing(cache_dir, key, TABLE_FILE, timing, target, settings, "latency table")


def _quiet_timing(
    cache_dir: str,
    key: str,
    file: str,
    timing: Callable[[Path], Callable[[], dict]],
    target: TargetConfig,
    settings: BenchSettings,
    what: str,
) -> dict:
    """A timing's record, cached under `key` only when measured on a quiet machine, plus "cache" ("hit", "stored",
    or "not stored: busy"). `timing(tmp)` exports what it times into `tmp` and returns the measurement, which
    runs until quiet (`_measure_until_quiet`) under the key's lock: two runs never time against each other."""

    def build(out: Path) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            record = _measure_until_quiet(timing(Path(tmp)), target, settings)
        if record["machine"]["busy"]:
            raise _Uncached(record)
        (out / file).write_text(json.dumps(record, indent=2))

    try:
        entry, hit = cached_build(Path(cache_dir), "latency", key, build)
    except _Uncached as busy:
        log.warning("%s: measured on a busy machine, used by this run only (target.accept_busy)", what)
        return {**busy.record, "cache": "not stored: busy"}
    log.info("%s: %s (%s)", what, entry, "cached" if hit else "measured now")
    return {**json.loads((entry / file).read_text()), "cache": "hit" if hit else "stored"}


def _probe_source(teacher_dir: str, planned_on: str, arch: Arch) -> nn.Module:
    """`planned_on` with a head of the teacher's kind (a general student is a bare encoder, and which labels its
    new head has costs nothing measurable), at `arch`'s hidden size (random weights: they time alike)."""
    from pipeline.compress.methods.distill.general_student import build_general_student
    from pipeline.data.tasks import TASKS
    from pipeline.models.folders import head_kind
    from pipeline.models.io import load_base_model, load_model, model_kind

    if head_kind(json.loads((Path(planned_on) / CONFIG).read_text())):
        model = load_model(planned_on)
    else:
        kind = model_kind(json.loads((Path(teacher_dir) / CONFIG).read_text()))  # a head's, or embeddings
        model = load_base_model(planned_on, next(t for t in TASKS.values() if t.kind == kind))
    if arch.hidden != model.config.hidden_size:
        shape = {"layers": arch.layers, "hidden": arch.hidden, "heads": arch.heads, "ffn": arch.ffn}
        model = build_general_student(model, shape, "random", 0)[0].eval()
    return model


def _export_probes(
    teacher_dir: str, planned_on: str, arch: Arch, heads: list[int], ffn: list[int], tmp: Path, cache_dir: str
) -> tuple[dict, bool]:
    """Every probe's int8 graph (cut from `planned_on` at `arch`'s width), and the dense fp32 teacher's (the graph
    deploy benchmarks), by probe name; and whether the fixed-cost probe has no layer (True) or is the two-layer
    fallback."""
    from pipeline.models.families import family_of

    model = _probe_source(teacher_dir, planned_on, arch)
    probes: dict[str, tuple[int, int | None, int | None]] = {f"{h}x{f}": (1, h, f) for h in heads for f in ffn}
    family = family_of(model)
    direct = family.runs_without_layers
    probes[FIXED_PROBE] = (0, None, None) if direct else (2, heads[0], ffn[0])
    models = {}
    for name, (n, h, f) in probes.items():
        export_optimized(cut_from(model, list(range(n)), h, f)[0], None, tmp / name, fusion=family.ort_fusion)
        models[name] = tmp / name / GRAPHS["int8"]
    models["dense"] = dense_graphs(teacher_dir, cache_dir)[0] / DENSE_GRAPHS["fp32"]
    return models, direct


def _time_probes(
    models: dict, direct: bool, arch: Arch, heads: list[int], ffn: list[int], settings: BenchSettings
) -> dict:
    """One timing of every probe: the table's fields, the device and the machine's load."""
    log.info("latency table: timing %d probes at %dx%d", len(models), settings.batch_sizes[0], settings.seq_lens[0])
    result = benchmark(models, arch.vocab, settings, interrupts.check)
    p50 = {c["model"]: c["p50_ms"] for c in result["cells"]}
    smallest = p50[f"{heads[0]}x{ffn[0]}"]
    table = LatencyTable(
        heads=heads,
        ffn=ffn,
        layer_ms=[[p50[f"{h}x{f}"] for f in ffn] for h in heads],
        fixed_ms=p50[FIXED_PROBE] if direct else max(0.0, 2 * smallest - p50[FIXED_PROBE]),
        dense_fp32_ms=p50["dense"],
        teacher={k: getattr(arch, k) for k in ("layers", "heads", "ffn", "hidden", "head_dim")},
        batch=settings.batch_sizes[0],
        seq=settings.seq_lens[0],
    )
    measured = {"fixed_probe": "no layers" if direct else "two layers", "device": result["device"]}
    return {**dataclasses.asdict(table), **measured, "machine": result["machine"]}


CHECK_VERSION = "4"  # 4: the bench's four graphs, in passes; 3: passes; 2: timed four times as long
CHECK_FILE = "check.json"


def check_record(
    teacher_dir: str, target: TargetConfig, bench: BenchSettings, cache_dir: str, planned_on: str | None, shape: Shape
) -> dict:
    """The planned shape timed as the bench stage will time the trained artifact's headline: its fp32 and int8
    graphs (cut from `planned_on`, default the teacher, at the shape's hidden size, compacted, exported as an
    artifact is) interleaved with the dense teacher's fp32 and int8 graphs, in `bench.passes` passes; "speedup"
    (int8 against dense fp32, the median of the passes' ratios), "ms", "dense_ms" (p50s over every pass) and
    "machine". Cached per shape, passes and machine when measured quiet, as the table is.

    The same four graphs as the bench because the company matters: timed beside the dense fp32 graph alone, a
    2-layer int8 student read 7.97x to 8.93x from one process to the next (its p50 14.5 or 16.9 ms), beside all
    four 8.85x to 8.86x, as its bench did (docs/results.md, "Speed that lands where planned")."""
    planned_on = planned_on or teacher_dir
    cfg, arch, baseline = _architectures(teacher_dir, planned_on, shape.hidden)
    arch = dataclasses.replace(arch, layers=shape.layers)
    layers = {"layers": shape.layers, "heads": shape.heads, "ffn": shape.ffn, "hidden": shape.hidden}
    machine = _machine(cfg, arch, baseline, target, bench, teacher_dir, cache_dir)
    settings = _settings(target, bench)
    key = key_of(stage="shape-check", v=CHECK_VERSION, **machine, planned=layers, passes=settings.passes)

    def timing(tmp: Path) -> Callable[[], dict]:
        from pipeline.models.families import family_of

        model = _probe_source(teacher_dir, planned_on, arch)
        cut = cut_from(model, list(range(shape.layers)), shape.heads, shape.ffn)[0]
        export_optimized(cut, None, tmp / "planned", fusion=family_of(model).ort_fusion)
        dense, planned = dense_graphs(teacher_dir, cache_dir)[0], tmp / "planned"
        models = {"dense": dense / DENSE_GRAPHS["fp32"], "dense-int8": dense / DENSE_GRAPHS["int8"],
                  "compressed": planned / GRAPHS["fp32"], "compressed-int8": planned / GRAPHS["int8"]}  # fmt: skip
        return lambda: _time_check(models, arch.vocab, settings)

    return _quiet_timing(cache_dir, key, CHECK_FILE, timing, target, settings, "shape check")


def _time_check(models: dict, vocab: int, settings: BenchSettings) -> dict:
    cell = (settings.batch_sizes[0], settings.seq_lens[0])
    result = benchmark(models, vocab, settings, interrupts.check, repeat=cell)
    p50 = {c["model"]: c["p50_ms"] for c in result["cells"]}
    speedup = next(r for r in speedups(result, "dense") if r["model"] == "compressed-int8")
    return {"speedup": speedup["speedup_p50"], "pass_speedups": speedup.get("pass_speedups"),
            "ms": p50["compressed-int8"], "dense_ms": p50["dense"], "machine": result["machine"]}  # fmt: skip


def _measure_until_quiet(measure: Callable[[], dict], target: TargetConfig, settings: BenchSettings) -> dict:
    """`measure()` until the machine was quiet through a measurement, at most `target.busy_attempts` times.

    Returns the first quiet record, or the last busy one when `target.accept_busy` allows it.

    Raises:
        PipelineError: every attempt was busy and busy tables are not accepted.
    """
    for attempt in range(1, target.busy_attempts + 1):
        if attempt > 1:
            wait_until_quiet(target.busy_wait_s, settings.threads, settings.busy_cores)
        record = measure()
        machine = record["machine"]
        if not machine["busy"]:
            return record
        log.warning(
            "latency table: attempt %d/%d on a busy machine (other processes held %.2f cores, %.2f allowed)",
            attempt,
            target.busy_attempts,
            machine["others_cores"],
            machine["allowed_cores"],
        )
    if target.accept_busy:
        return record
    raise PipelineError(
        f"latency table not measured: the machine was busy in all {target.busy_attempts} attempts (other "
        f"processes held {_worst(machine):.2f} cores while timing, {machine['allowed_cores']:.2f} allowed); nothing "
        "was cached. Run on a quiet machine, or set target.accept_busy=true to plan on a busy table once"
    )


def _worst(machine: dict) -> float:
    return max(machine["others_cores"], machine["others_cores_worst_cell"] or 0.0)


def run(config: DeployConfig, teacher_dir: str, cache_dir: str) -> tuple[dict, DeployConfig]:
    """The shape that meets `config.target.speedup` (the plan's record, for the report), and the configuration that
    prunes to it."""
    check_target_chain(config)
    target, folder = config.target, config.student_folder
    check_hidden_options(config, json.loads((Path(teacher_dir) / CONFIG).read_text()))
    records = [table_record(teacher_dir, target, config.bench, cache_dir, folder)]
    own = records[0]["teacher"]["hidden"]
    for hidden in sorted(set(target.hidden or ()) - {own}, reverse=True):  # a table per narrower width
        records.append(table_record(teacher_dir, target, config.bench, cache_dir, None, hidden))
    tables = [LatencyTable.from_dict(r) for r in records]
    by_hidden = {t.teacher["hidden"]: (t, r) for t, r in zip(tables, records, strict=True)}
    depth = tables[0].teacher["layers"]
    options = layer_options(config, depth)
    half = target.headroom / 2  # the middle of the window [target, target x (1 + headroom)]

    def search(factor: float) -> Shape:
        return search_widths(tables, target.speedup * factor, options, half, target.min_heads, target.objective)[0]

    try:
        first = search(1.0)
    except PipelineError as e:
        if not config.cuts_student or min(options) == 1:
            raise
        raise PipelineError(  # name the depth floor: the user can lower it
            f"{e}; shallower students are out: target.min_depth {target.min_depth:g} and target.layers keep at "
            f"least {min(options)} of the teacher's {depth} layers (a recipe such as `layerwise` sets it)"
        ) from None
    timed: list[dict] = []

    def measure(shape: Shape) -> tuple[float, float]:
        timed.append(check_record(teacher_dir, target, config.bench, cache_dir, folder, shape))
        log.info("speed target %.2fx: %d x %d x %d at hidden %d predicted %.2fx, checked %.2fx", target.speedup,
                 shape.layers, shape.heads, shape.ffn, shape.hidden, shape.predicted_speedup,
                 timed[-1]["speedup"])  # fmt: skip
        return timed[-1]["ms"], timed[-1]["speedup"]

    shape, checks = calibrate(first, search, measure, target.speedup, target.headroom, target.checks)
    for check, record in zip(checks, timed, strict=True):
        check["machine_busy"], check["cache"] = record["machine"]["busy"], record["cache"]
        check["pass_speedups"] = record["pass_speedups"]  # how far one pass alone could have read
    table, measured = by_hidden[shape.hidden]
    aim = target.speedup * (1 + half)
    planned = apply_shape(config, shape, table.teacher, shape.hidden if shape.hidden != own else None)
    log.info(
        "target %.2fx (planned at %.2fx): %d layers x (%d heads, %d FFN neurons) at hidden %d, predicted %.2fx "
        "(%.2f ms vs dense fp32 %.2f ms)%s",
        config.target.speedup,
        aim,
        shape.layers,
        shape.heads,
        shape.ffn,
        shape.hidden,
        shape.predicted_speedup,
        shape.predicted_ms,
        table.dense_fp32_ms,
        "".join(f", checked {c['measured_speedup']:.2f}x" for c in checks if shape_of(c) == shape),
    )
    plan = {
        "target_speedup": config.target.speedup,
        **({"recipe": config.chosen_recipe} if config.chosen_recipe else {}),  # chosen by the target (its kind's)
        "planned_at": round(aim, 4),
        "shape": shape.as_dict(),
        "checks": checks,  # each shape timed before training: predicted beside checked
        "method": planned.method,
        "config": planned.config,
        "table": {
            "dense_fp32_ms": table.dense_fp32_ms,
            "fixed_ms": table.fixed_ms,
            "batch": table.batch,
            "seq": table.seq,
            "machine": measured["machine"],  # the load it was measured under; busy only with target.accept_busy
            "cache": measured["cache"],
        },
    }
    return plan, planned

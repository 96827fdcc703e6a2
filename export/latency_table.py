"""Measure the latency table a speed target is planned on, and plan the shape (`--target-speedup`).

Every probe is a real model cut from the teacher (its first layers, narrowed to h heads and f FFN neurons by
weight norm, compacted) and exported exactly as an artifact is (ONNX, ORT fusion, dynamic int8), then timed in
ONNX Runtime with the benchmark's settings, all probes interleaved in one process with the dense fp32 teacher.
The table is cached by the teacher's shape, the grid, the input shape, the thread count, the CPU and the
library versions: it describes this machine, not the teacher's weights.
"""

from __future__ import annotations

import json
import logging
import tempfile
from importlib import metadata
from pathlib import Path

from export.benchmark import benchmark, cpu_name
from export.onnx import EXPORT_LIBRARIES, dense_graphs, export_optimized
from export.sessions import physical_cores
from pipeline.cache import cached_build, key_of
from pipeline.compress.methods.distill.students import cut_from
from pipeline.compress.shapes import LatencyTable, apply_shape, check_target_chain, layer_options, search_shape
from pipeline.config.schema import BenchSettings, DeployConfig, TargetConfig

log = logging.getLogger(__name__)

TABLE_VERSION = "1"
FIXED_PROBE = "fixed"  # two layers of the smallest shape: with the one-layer probe it gives the fixed cost


def grid(teacher_cfg: dict, target: TargetConfig) -> tuple[list[int], list[int]]:
    heads, ffn = teacher_cfg["num_attention_heads"], teacher_cfg["intermediate_size"]
    h = sorted({max(1, round(f * heads)) for f in target.heads_grid})
    f = sorted({max(1, round(x * ffn)) for x in target.ffn_grid})
    return h, f


def measure_table(teacher_dir: str, target: TargetConfig, bench: BenchSettings, cache_dir: str) -> LatencyTable:
    """The latency table for the teacher's architecture on this machine (cached)."""
    from pipeline.models.io import load_model

    cfg = json.loads((Path(teacher_dir) / "config.json").read_text())
    heads, ffn = grid(cfg, target)
    threads = bench.threads or physical_cores()
    arch = {k: cfg[k] for k in ("hidden_size", "num_attention_heads", "intermediate_size", "num_hidden_layers")}
    key = key_of(
        stage="latency-table",
        v=TABLE_VERSION,
        arch=arch,
        vocab=cfg["vocab_size"],
        heads=heads,
        ffn=ffn,
        shape=(target.batch, target.seq),
        threads=threads,
        cpu=cpu_name(),
        versions={d: metadata.version(d) for d in EXPORT_LIBRARIES},
    )

    def build(out: Path) -> None:
        teacher = load_model(teacher_dir)
        probes = {f"{h}x{f}": (1, h, f) for h in heads for f in ffn}
        probes[FIXED_PROBE] = (2, heads[0], ffn[0])
        models = {}
        with tempfile.TemporaryDirectory() as tmp:
            for name, (n, h, f) in probes.items():
                export_optimized(cut_from(teacher, list(range(n)), h, f)[0], None, Path(tmp) / name)
                models[name] = Path(tmp) / name / "model.int8.onnx"
            models["dense"] = dense_graphs(teacher_dir, cache_dir)[0] / "dense.onnx"  # the one deploy benchmarks
            settings = bench.model_copy(
                update={
                    "batch_sizes": (target.batch,),
                    "seq_lens": (target.seq,),
                    "threads": threads,
                    "providers": ("CPUExecutionProvider",),
                }
            )
            log.info("latency table: timing %d probes at %dx%d", len(models), target.batch, target.seq)
            result = benchmark(models, cfg["vocab_size"], settings)
        p50 = {c["model"]: c["p50_ms"] for c in result["cells"]}
        smallest = p50[f"{heads[0]}x{ffn[0]}"]
        table = LatencyTable(
            heads=heads,
            ffn=ffn,
            layer_ms=[[p50[f"{h}x{f}"] for f in ffn] for h in heads],
            fixed_ms=max(0.0, 2 * smallest - p50[FIXED_PROBE]),  # one layer minus its own cost
            dense_fp32_ms=p50["dense"],
            teacher={
                "layers": cfg["num_hidden_layers"],
                "heads": cfg["num_attention_heads"],
                "ffn": cfg["intermediate_size"],
                "hidden": cfg["hidden_size"],
                "head_dim": cfg["hidden_size"] // cfg["num_attention_heads"],
            },
            batch=target.batch,
            seq=target.seq,
        )
        (out / "table.json").write_text(json.dumps({**table.__dict__, "device": result["device"]}, indent=2))

    entry, hit = cached_build(Path(cache_dir), "latency", key, build)
    log.info("latency table: %s (%s)", entry, "cached" if hit else "measured now")
    return LatencyTable.from_dict(json.loads((entry / "table.json").read_text()))


def plan_target(config: DeployConfig, teacher_dir: str, cache_dir: str) -> dict:
    """The shape that meets `config.target.speedup`, and the configuration that prunes to it."""
    check_target_chain(config.method)
    table = measure_table(teacher_dir, config.target, config.bench, cache_dir)
    target = config.target
    shape = search_shape(table, target.speedup, layer_options(config, table.teacher["layers"]), target.headroom)
    aim = target.speedup * (1 + target.headroom)
    planned = apply_shape(config, shape, table.teacher)
    log.info(
        "target %.2fx (planned at %.2fx): %d layers x (%d heads, %d FFN neurons), predicted %.2fx "
        "(%.2f ms vs dense fp32 %.2f ms)",
        config.target.speedup,
        aim,
        shape.layers,
        shape.heads,
        shape.ffn,
        shape.predicted_speedup,
        shape.predicted_ms,
        table.dense_fp32_ms,
    )
    return {
        "target_speedup": config.target.speedup,
        "planned_at": round(aim, 4),
        "shape": shape.as_dict(),
        "method": planned.method,
        "config": planned.config,
        "table": {
            "dense_fp32_ms": table.dense_fp32_ms,
            "fixed_ms": table.fixed_ms,
            "batch": table.batch,
            "seq": table.seq,
        },
    }

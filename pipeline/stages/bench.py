"""The bench stage: latency of dense vs compressed (fp32 and int8) in one ORT process, next to the FLOP bound."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from export.benchmark import benchmark, encoder_flops, plot_latency, speedups
from pipeline.config.schema import BenchSettings
from pipeline.models.families import arch_of
from pipeline.models.folders import param_count
from pipeline.stages.export import DENSE_GRAPHS
from pipeline.stages.package import WORK
from serving.artifact import CONFIG, GRAPHS, LATENCY_PLOT, PYTORCH

log = logging.getLogger(__name__)

HEADLINE = (8, 128)  # batch x sequence the quality bars are stated at (the speed target's shape, by default)


def model_shapes(model_dir: str | Path) -> dict:
    """Per-layer heads and FFN widths (from our per-layer config fields, else the uniform ones)."""
    cfg = json.loads((Path(model_dir) / CONFIG).read_text())
    arch = arch_of(cfg)
    return {
        "hidden": arch.hidden,
        "head_dim": arch.head_dim,
        "heads": cfg.get("layer_heads") or [arch.heads] * arch.layers,
        "ffn": cfg.get("intermediate_sizes") or [arch.ffn] * arch.layers,
        "num_labels": len(cfg.get("id2label") or {0: 0, 1: 1}),
        "vocab_size": arch.vocab,
        "ffn_matrices": 3 if arch.gated else 2,
    }


def flops(shapes: dict, seq: int) -> int:
    return encoder_flops(
        shapes["hidden"],
        shapes["heads"],
        shapes["head_dim"],
        shapes["ffn"],
        seq,
        shapes["num_labels"],
        shapes["ffn_matrices"],
    )


def run(staging: str, teacher_dir: str, settings: BenchSettings, headline: tuple[int, int] = HEADLINE) -> dict:
    """Benchmark dense and compressed graphs, compute FLOP bounds, and plot `latency.png` into `staging`.
    `headline`: the (batch, sequence) cell the report leads with (the deploy's speed-target shape)."""
    staging_path = Path(staging)
    dense, comp = model_shapes(teacher_dir), model_shapes(staging_path / PYTORCH)
    models = {
        "dense": staging_path / WORK / DENSE_GRAPHS["fp32"],
        "dense-int8": staging_path / WORK / DENSE_GRAPHS["int8"],
        "compressed": staging_path / GRAPHS["fp32"],
        "compressed-int8": staging_path / GRAPHS["int8"],
    }
    result = benchmark(models, comp["vocab_size"], settings)
    ratios = speedups(result, "dense")
    bounds = {s: flops(dense, s) / flops(comp, s) for s in settings.seq_lens}
    for r in ratios:
        if r["model"].startswith("compressed") and not r["model"].endswith("int8"):
            r["flop_bound"] = bounds[r["seq"]]
            r["fraction_of_bound"] = r["speedup_p50"] / bounds[r["seq"]]
    plot = plot_latency(result, staging_path / LATENCY_PLOT, title="ONNX Runtime latency: dense vs compressed")
    vs_int8 = {
        (r["provider"], r["batch"], r["seq"], r["model"]): r["speedup_p50"] for r in speedups(result, "dense-int8")
    }
    for r in ratios:  # dense int8 is the one-command alternative a user weighs the artifact against
        r["speedup_vs_dense_int8"] = vs_int8.get((r["provider"], r["batch"], r["seq"], r["model"]))
    headline = {
        r["model"]: r for r in ratios if (r["batch"], r["seq"]) == tuple(headline) and r["provider"].startswith("CPU")
    }
    return {
        **result,
        "speedups": ratios,
        "headline": headline,
        "flops_per_sequence": {s: {"dense": flops(dense, s), "compressed": flops(comp, s)} for s in settings.seq_lens},
        "flop_bound": bounds,
        "params": {"dense": param_count(teacher_dir), "compressed": param_count(staging_path / PYTORCH)},
        "shapes": {"dense": dense, "compressed": comp},  # per-layer heads and FFN widths, the FLOPs' inputs
        "plot": plot.name,
    }

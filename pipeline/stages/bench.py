"""The bench stage: latency of dense vs compressed (fp32 and int8) in one ORT process, next to the FLOP bound."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import onnxruntime as ort

from export.benchmark import HEADLINE, benchmark, encoder_flops, plot_latency, real_lengths, speedups
from export.onnx import convert_fp16
from export.sessions import CUDA
from pipeline import interrupts
from pipeline.config.schema import BenchSettings
from pipeline.data.encoding import collate, encode
from pipeline.data.loaders import DataRef
from pipeline.models.families import arch_of
from pipeline.models.folders import load_tokenizer, param_count
from pipeline.staging import DENSE_FP16, DENSE_GRAPHS, ST_DENSE_INT8, WORK
from serving.artifact import CONFIG, GRAPHS, LATENCY_PLOT, PYTORCH, TASK_KEY, trained_length

log = logging.getLogger(__name__)


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


def run(
    staging: str,
    teacher_dir: str,
    settings: BenchSettings,
    headline: tuple[int, int] = HEADLINE,
    ref: DataRef | None = None,
) -> dict:
    """Benchmark dense and compressed graphs, compute FLOP bounds, and plot `latency.png` into `staging`.
    `headline`: the (batch, sequence) cell the report leads with (the deploy's speed-target shape), timed in
    `settings.passes` passes as a speed target's checks are, so the two estimate the same figure; `ref`: the
    task's data, whose dev inputs are also timed at their real lengths (`real_lengths`)."""
    staging_path = Path(staging)
    dense, comp = model_shapes(teacher_dir), model_shapes(staging_path / PYTORCH)
    models = {
        "dense": staging_path / WORK / DENSE_GRAPHS["fp32"],
        "dense-int8": staging_path / WORK / DENSE_GRAPHS["int8"],
        "compressed": staging_path / GRAPHS["fp32"],
        "compressed-int8": staging_path / GRAPHS["int8"],
    }
    if (staging_path / WORK / ST_DENSE_INT8).is_file():  # sentence-transformers' own int8 of the dense model
        models["dense-int8-st"] = staging_path / WORK / ST_DENSE_INT8
    timed = {**models, **_fp16_graphs(staging_path, settings)}  # CUDA's: the CPU passes skip them
    result = benchmark(timed, comp["vocab_size"], settings, interrupts.check, repeat=tuple(headline))
    ratios = speedups(result, "dense")
    bounds = {s: flops(dense, s) / flops(comp, s) for s in settings.seq_lens}
    for r in ratios:
        if r["model"].startswith("compressed") and not r["model"].endswith("int8"):
            r["flop_bound"] = bounds[r["seq"]]
            r["fraction_of_bound"] = r["speedup_p50"] / bounds[r["seq"]]
    plot = plot_latency(result, staging_path / LATENCY_PLOT, title="ONNX Runtime latency: dense vs compressed")
    vs_int8, vs_fp16 = _by_cell(result, "dense-int8"), _by_cell(result, "dense-fp16")
    for r in ratios:  # dense int8 is the one-command alternative a user weighs the artifact against; on a GPU, fp16
        r["speedup_vs_dense_int8"] = vs_int8.get((r["provider"], r["batch"], r["seq"], r["model"]))
        if (fp16 := vs_fp16.get((r["provider"], r["batch"], r["seq"], r["model"]))) is not None:
            r["speedup_vs_dense_fp16"] = fp16
    lead = {
        r["model"]: r for r in ratios if (r["batch"], r["seq"]) == tuple(headline) and r["provider"].startswith("CPU")
    }
    gpu = {  # the GPU's headline: the artifact's fp16 graph against the dense fp16 graph a GPU user would deploy
        r["model"]: r for r in ratios if (r["batch"], r["seq"]) == tuple(headline) and r["provider"] == CUDA
    }
    return {
        **result,
        "speedups": ratios,
        "headline": lead,
        **({"gpu_headline": gpu} if gpu else {}),
        "flops_per_sequence": {s: {"dense": flops(dense, s), "compressed": flops(comp, s)} for s in settings.seq_lens},
        "flop_bound": bounds,
        "params": {"dense": param_count(teacher_dir), "compressed": param_count(staging_path / PYTORCH)},
        "shapes": {"dense": dense, "compressed": comp},  # per-layer heads and FFN widths, the FLOPs' inputs
        "plot": plot.name,
        "real_lengths": real_length_speed(models, staging_path, settings, headline[0], ref),
    }


def _by_cell(result: dict, baseline: str) -> dict:
    """Each model's p50 speedup against `baseline`, by (provider, batch, seq, model)."""
    return {(r["provider"], r["batch"], r["seq"], r["model"]): r["speedup_p50"] for r in speedups(result, baseline)}


def _fp16_graphs(staging: Path, settings: BenchSettings) -> dict:
    """Where CUDA will be timed: the artifact's fp16 graph and the dense teacher's (converted here, into the work
    folder: a CPU-only run neither needs nor writes it)."""
    if CUDA not in ort.get_available_providers() or CUDA not in (settings.providers or (CUDA,)):
        return {}
    dense = staging / WORK / DENSE_FP16
    if not dense.is_file():
        convert_fp16(staging / WORK / DENSE_GRAPHS["fp32"], dense)
    return {"dense-fp16": dense, "compressed-fp16": staging / GRAPHS["fp16"]}


def real_length_speed(
    models: dict, staging: Path, settings: BenchSettings, batch: int, ref: DataRef | None
) -> dict | None:
    """The dev set's first inputs as the server would run them (in order, `batch` at a time, each batch padded to
    its longest, at the artifact's trained length), through all four graphs: examples per second and the speedups
    against dense fp32 and dense int8. None without data or with `real_length_rounds` 0."""
    if ref is None or not settings.real_length_rounds:
        return None
    data = ref.load()
    tokenizer = load_tokenizer(staging)
    length = trained_length(json.loads((staging / CONFIG).read_text()).get(TASK_KEY, {}))
    enc = encode(tokenizer, data.dev, length)
    n = min(len(enc), settings.real_length_examples)
    batches = []
    for start in range(0, n, batch):
        tensors = collate(enc, list(range(start, min(n, start + batch))))
        batches.append({k: v.numpy() for k, v in tensors.items() if k != "labels"})
    result = real_lengths(
        models, batches, settings.real_length_rounds, settings.threads, settings.busy_cores, interrupts.check
    )
    speeds = {m: r["examples_per_s"] for m, r in result["models"].items()}
    for m, r in result["models"].items():
        r["speedup"] = round(speeds[m] / speeds["dense"], 3)
        r["speedup_vs_dense_int8"] = round(speeds[m] / speeds["dense-int8"], 3)
    return {"batch": batch, "max_length": length, **result}

"""Latency of the dense and the compacted torch models on the same inputs, interleaved: the GPU figure where only
torch has CUDA (a machine with the CPU build of onnxruntime), in fp16 against the dense model in fp16.

    python benchmarks/torch_latency.py dense=TEACHER_DIR compressed=ARTIFACT/pytorch [--device cuda]
        [--dtype fp16] [--batch 1 8 32] [--seq 128] [--runs 50] [--json out.json]

Each NAME=DIR is a model folder `pipeline.models.io.load_model` reads (a teacher, an artifact's `pytorch/`, at its
per-layer shapes). Every (batch, seq) cell runs each model `--runs` times, rotating which goes first, after warm-up
calls; on CUDA each call is timed with CUDA events (the kernels' time, not the launch's), elsewhere with the wall
clock around a synchronous call. p50s and the speedup of each model against the first one are printed, and with
`--json` written. On a CPU it runs too (fp32 or bf16), which is how the test exercises it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere without installing

from pipeline.models.io import load_model

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def _timer(device: torch.device):
    """A function that runs `call` once and returns its milliseconds on `device`."""
    if device.type == "cuda":

        def cuda_ms(call) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            torch.cuda.synchronize(device)
            return start.elapsed_time(end)

        return cuda_ms

    def wall_ms(call) -> float:
        t0 = time.perf_counter()
        call()
        return (time.perf_counter() - t0) * 1000.0

    return wall_ms


def time_models(models: dict, batches: list[int], seqs: list[int], runs: int, device, warmup: int = 3) -> list[dict]:
    """p50 milliseconds of each model on random ids of each (batch, seq), interleaved with a rotating start."""
    timer, cells = _timer(device), []
    names = list(models)
    vocab = min(m.config.vocab_size for m in models.values())
    for b in batches:
        for s in seqs:
            ids = torch.randint(5, vocab, (b, s), generator=torch.Generator().manual_seed(b * 1000 + s)).to(device)
            mask = torch.ones_like(ids)
            times = {n: [] for n in names}
            with torch.inference_mode():
                for n in names:
                    for _ in range(warmup):
                        models[n](input_ids=ids, attention_mask=mask)
                for r in range(runs):
                    for k in range(len(names)):
                        n = names[(r + k) % len(names)]
                        call = partial(models[n], input_ids=ids, attention_mask=mask)
                        times[n].append(timer(call))
            for n in names:
                cells.append({"model": n, "batch": b, "seq": s, "runs": runs, "p50_ms": statistics.median(times[n])})
    return cells


def speedups(cells: list[dict], baseline: str) -> list[dict]:
    base = {(c["batch"], c["seq"]): c["p50_ms"] for c in cells if c["model"] == baseline}
    return [
        {
            "model": c["model"],
            "batch": c["batch"],
            "seq": c["seq"],
            "speedup": base[c["batch"], c["seq"]] / c["p50_ms"],
        }
        for c in cells
        if c["model"] != baseline
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="+", metavar="NAME=DIR")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=DTYPES, default=None, help="default: fp16 on CUDA, fp32 elsewhere")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--seq", type=int, nargs="+", default=[128])
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--json")
    args = p.parse_args(argv)
    pairs = [m.split("=", 1) for m in args.models]
    if any(len(pair) != 2 for pair in pairs):
        p.error("each model is NAME=DIR")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: this torch has no CUDA device")
    dtype = DTYPES[args.dtype or ("fp16" if device.type == "cuda" else "fp32")]
    models = {name: load_model(folder).to(device=device, dtype=dtype).eval() for name, folder in pairs}
    cells = time_models(models, args.batch, args.seq, args.runs, device)
    ratios = speedups(cells, pairs[0][0])
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"# torch {torch.__version__} | {where} | {str(dtype).removeprefix('torch.')} | interleaved")
    for c in cells:
        print(f"{c['model']:<16} {c['batch']:>5} x {c['seq']:<5} p50 {c['p50_ms']:9.3f} ms")
    for r in ratios:
        print(f"{r['model']:<16} {r['batch']:>5} x {r['seq']:<5} {r['speedup']:.2f}x {pairs[0][0]}")
    if args.json:
        record = {"device": where, "dtype": str(dtype), "torch": torch.__version__, "cells": cells, "speedups": ratios}
        Path(args.json).write_text(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

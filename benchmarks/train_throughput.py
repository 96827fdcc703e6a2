"""What bf16 mixed precision, length-grouped batches and data-parallel ranks give training on this machine.

    python benchmarks/train_throughput.py --model DIR --data-dir ../shared/data/sst2 [--task sst2] [--steps 3]
                                          [--batch 32] [--corpus DIR [--corpus-lines 20000]]
                                          [--ranks 1 2] [--rank-steps 20] [--json out.json]

1. Padding: one seeded epoch of the task's train split at `--batch`, shuffled as training shuffles it, with and
   without `group_by_length`: real and padded tokens (no timing; the same on any machine); with `--corpus`, the same
   for the corpus's first `--corpus-lines` paragraphs as general distillation reads them.
2. Step time: `--steps` timed AdamW steps of the model as a sequence classifier on real batches of the train split,
   fp32 and bf16 autocast, each way on plain shuffled batches and on grouped ones, interleaved after one untimed
   step each (`--steps 0`: none). Run it on a quiet machine: nothing else may train or time beside it.
3. Ranks: the teacher stage's own training (`pipeline.stages.teacher`, the recipe's batch `--batch` shared out
   over the ranks) for `--rank-steps` steps on 1 process and under torchrun on each count of `--ranks` (default:
   1 and 2 on a CPU, every count up to the GPUs on CUDA; `--ranks` alone: none), each in a cache of its own with
   checkpoints off: steps/s from the stage's training time (the launch and model load left out), and the ratio to
   one process. On a CPU one process uses every core and torchrun gives each rank one thread, so the figure says
   what two ranks buy on the same cores, not on two machines.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere without installing

from pipeline.data.corpus import read_corpus
from pipeline.data.encoding import encode, encode_corpus, iter_batches
from pipeline.data.loaders import DataRef, resolve_source
from pipeline.data.tasks import get_task
from pipeline.models.folders import load_tokenizer
from pipeline.models.io import load_base_model


def padding(enc, batch: int) -> dict:
    out = {}
    for group in (False, True):
        g = torch.Generator().manual_seed(0)
        padded = real = 0
        for b in iter_batches(enc, batch, shuffle=True, generator=g, group_by_length=group):
            padded += b["input_ids"].numel()
            real += int(b["attention_mask"].sum())
        out["grouped" if group else "shuffled"] = padded
        out["real"] = real
    return out


def step_times(model, enc, batch: int, steps: int) -> dict:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    model.train()
    batches = {
        group: list(
            iter_batches(enc, batch, shuffle=True, generator=torch.Generator().manual_seed(0), group_by_length=group)
        )[: steps + 1]
        for group in (False, True)
    }

    def step(b, bf16: bool) -> float:
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(**b).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    ways = [(p, g) for p in ("fp32", "bf16") for g in (False, True)]
    for p, g in ways:
        step(batches[g][0], p == "bf16")  # untimed
    times: dict[str, list[float]] = {f"{p}{'+grouped' if g else ''}": [] for p, g in ways}
    for i in range(1, steps + 1):
        for p, g in ways:
            times[f"{p}{'+grouped' if g else ''}"].append(step(batches[g][i], p == "bf16"))
    return {k: round(sum(v) / len(v), 3) for k, v in times.items()}


def rank_throughput(model: str, ref: DataRef, batch: int, steps: int, ranks: list[int]) -> list[dict]:
    """Steps per second of the teacher stage's training at each rank count (see the module's docstring)."""
    import os
    import tempfile

    from pipeline import checkpoints, launch
    from pipeline.config.schema import TrainConfig
    from pipeline.run import PLAIN

    cfg = TrainConfig(max_steps=steps, batch_size=batch, eval_every=0)
    os.environ[checkpoints.ENV] = "0"
    rows = []
    for n in ranks:
        with tempfile.TemporaryDirectory() as cache, launch.processes(n):
            report = PLAIN["teacher"](model, None, ref, cfg, cache)
        per_s = report["steps"] / report["seconds"]
        base = rows[0]["steps_per_s"] if rows else per_s
        rows.append({"ranks": n, "steps": report["steps"], "seconds": report["seconds"], "steps_per_s": per_s,
                     "examples_per_s": per_s * batch, "vs_one_process": per_s / base})  # fmt: skip
        print(f"{n} rank(s): {per_s:.3f} steps/s, {per_s * batch:.1f} examples/s at batch {batch} "
              f"({rows[-1]['vs_one_process']:.2f}x {rows[0]['ranks']} rank(s))")  # fmt: skip
    return rows


def default_ranks() -> list[int]:
    return list(range(1, torch.cuda.device_count() + 1)) if torch.cuda.is_available() else [1, 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--task", default="sst2")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--corpus", type=Path)
    parser.add_argument("--corpus-lines", type=int, default=20000)
    parser.add_argument("--ranks", type=int, nargs="*", default=None)
    parser.add_argument("--rank-steps", type=int, default=20)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    task = get_task(args.task)
    data = DataRef(task, resolve_source(task, args.data_dir), args.data_dir).load()
    tokenizer = load_tokenizer(args.model)
    enc = encode(tokenizer, data.train, 128)
    report: dict = {"padding": padding(enc, args.batch)}
    if args.corpus:
        corpus = encode_corpus(tokenizer, read_corpus(args.corpus, args.corpus_lines), 128)
        report["corpus_padding"] = padding(corpus, args.batch)
    for name, pad in (("train split", report["padding"]), ("corpus", report.get("corpus_padding"))):
        if pad:
            real, shuffled, grouped = pad["real"], pad["shuffled"], pad["grouped"]
            print(f"{name}: padded tokens per epoch at batch {args.batch}: real {real:,}; shuffled {shuffled:,} "
                  f"({shuffled / real:.2f}x real); grouped {grouped:,} ({grouped / real:.2f}x)")  # fmt: skip
    if args.steps:
        times = step_times(load_base_model(args.model, task), enc, args.batch, args.steps)
        report["seconds_per_step"] = times
        for k, v in times.items():
            print(f"{k:>14}: {v:.3f} s per step ({times['fp32'] / v:.2f}x fp32)")
    ranks = default_ranks() if args.ranks is None else args.ranks
    if ranks:
        ref = DataRef(task, resolve_source(task, args.data_dir), args.data_dir, validation=(64, 0.1, 0, "example"))
        report["ranks"] = rank_throughput(str(Path(args.model).resolve()), ref, args.batch, args.rank_steps, ranks)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

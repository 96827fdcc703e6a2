"""Every family through a structured prune at 50%, compaction, ONNX export, ORT fusion and int8, timed against its
dense graphs.

    python benchmarks/families.py [--layers 4] [--hidden 256] [--heads 4] [--ffn 1024] [--batch 8] [--seq 128]
                                  [--families bert mpnet ...] [--json out.json]

Per family: a random classifier of that shape (speed and exactness do not depend on trained weights) gets head and
neuron masks keeping half of each per layer (the mechanism of structured SMP and GMP, scores at random); the masks
are baked in and the model compacted, checked against the masked model (max |Δ logits|). The dense and the
compacted model are exported as an artifact is (ONNX, ORT transformer fusion, dynamic int8); the fp32 graph is
checked against torch, int8 against fp32 (argmax agreement on random token ids), and the four graphs are timed in one
interleaved ONNX Runtime run at batch × seq. Prints one Markdown row per family. Run it on a quiet machine: the
benchmark says when another process held the cores.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere without installing

from export.benchmark import benchmark, speedups
from export.onnx import export_optimized
from pipeline.compress.compaction import compact_
from pipeline.compress.masking import Masker
from pipeline.config.schema import BenchSettings
from pipeline.models.families import SUPPORTED_MODEL_TYPES, random_model

VOCAB = 8000
FUSED = ("Attention", "MultiHeadAttention", "EmbedLayerNormalization", "SkipLayerNormalization", "BiasGelu", "Gelu")


def _inputs(batch: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, VOCAB, (batch, seq), dtype=np.int64)
    mask = np.ones_like(ids)
    mask[1::2, seq // 2 :] = 0  # every other row half padded
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def _run(path: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(["logits"], {i.name: feeds[i.name] for i in session.get_inputs()})[0]


def measure(kind: str, args: argparse.Namespace, tmp: Path) -> dict:
    dense = random_model(
        kind, args.layers, args.heads, args.hidden, args.ffn, vocab=VOCAB, max_position_embeddings=512
    )
    pruned = random_model(
        kind, args.layers, args.heads, args.hidden, args.ffn, vocab=VOCAB, max_position_embeddings=512
    )
    masker = Masker.attach(pruned, "neuron", "head")
    torch.manual_seed(1)
    for g in masker.groups:
        g.scores.data.normal_()
    masker.allocate(0.5, "local")
    masker.refresh("local")
    masker.detach_(pruned)
    feeds = _inputs(args.batch, args.seq)
    torch_feeds = {k: torch.from_numpy(v) for k, v in feeds.items() if k != "token_type_ids"}
    with torch.no_grad():
        masked = pruned(**torch_feeds).logits
        report = compact_(pruned)
        compacted = pruned(**torch_feeds).logits
    graphs, ops = {}, {}
    for name, model in (("dense", dense), ("pruned", pruned)):
        info = export_optimized(model, None, tmp / kind / name)
        graphs[name], graphs[f"{name}-int8"] = tmp / kind / name / "model.onnx", tmp / kind / name / "model.int8.onnx"
        ops[name] = {k: v for k, v in info["fused_ops"].items() if k in FUSED}
    fp32, int8 = _run(graphs["pruned"], feeds), _run(graphs["pruned-int8"], feeds)
    timing = benchmark(
        graphs,
        VOCAB,
        BenchSettings(batch_sizes=(args.batch,), seq_lens=(args.seq,), max_runs=args.runs, min_runs=10),
    )
    p50 = {c["model"]: c["p50_ms"] for c in timing["cells"]}
    vs_int8 = {r["model"]: r["speedup_p50"] for r in speedups(timing, "dense-int8")}
    return {
        "family": kind,
        "heads": report["heads"],
        "ffn_widths": report["ffn_widths"],
        "compaction_max_abs_diff": float((compacted - masked).abs().max()),
        "onnx_fp32_max_abs_diff": float(np.abs(fp32 - compacted.numpy()).max()),
        "int8_argmax_agreement": float((int8.argmax(1) == fp32.argmax(1)).mean()),
        "fused_ops": ops["pruned"],
        "p50_ms": p50,
        "speedup_vs_dense_fp32": p50["dense"] / p50["pruned"],
        "int8_speedup_vs_dense_fp32": p50["dense"] / p50["pruned-int8"],
        "int8_speedup_vs_dense_int8": vs_int8["pruned-int8"],
        "machine": timing["machine"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--families", nargs="+", default=list(SUPPORTED_MODEL_TYPES), choices=SUPPORTED_MODEL_TYPES)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    rows = []
    print(
        f"{args.layers} layers x {args.hidden} hidden x {args.heads} heads x FFN {args.ffn}, half the heads and "
        f"neurons of every layer pruned; ONNX Runtime CPU at {args.batch} x {args.seq}\n"
    )
    print(
        "| family | compaction max abs diff | ONNX fp32 vs torch | ORT fusion (pruned graph) | int8 = fp32 argmax "
        "| pruned fp32 vs dense fp32 | pruned int8 vs dense fp32 | pruned int8 vs dense int8 | busy |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.families:
            r = measure(kind, args, Path(tmp))
            rows.append(r)
            fused = ", ".join(f"{k} {v}" for k, v in r["fused_ops"].items()) or "none"
            print(
                f"| {kind} | {r['compaction_max_abs_diff']:.1e} | {r['onnx_fp32_max_abs_diff']:.1e} | {fused} "
                f"| {r['int8_argmax_agreement']:.0%} | {r['speedup_vs_dense_fp32']:.2f}x "
                f"| {r['int8_speedup_vs_dense_fp32']:.2f}x | {r['int8_speedup_vs_dense_int8']:.2f}x "
                f"| {'yes' if r['machine']['busy'] else 'no'} |",
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

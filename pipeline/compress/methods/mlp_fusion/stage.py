"""MLP Fusion: fuse the chosen FFNs, optionally tune them layer-wise, then train on the task."""

from __future__ import annotations

import logging
import time

import torch
from torch import nn

from pipeline.compress.context import StageContext
from pipeline.compress.methods.mlp_fusion.config import MlpFusionConfig
from pipeline.compress.methods.mlp_fusion.kmeans import KMeansResult, kmeans_batched
from pipeline.errors import PipelineError
from pipeline.models.families import Family, family_of
from pipeline.models.layers import ScaledLinear, encoder_layers
from pipeline.train.loop import train
from pipeline.train.losses import LossFn, layer_hidden_mse
from pipeline.train.metrics import predict_logits, scores

log = logging.getLogger(__name__)


def fused_layers(cfg: MlpFusionConfig, num_layers: int) -> list[int]:
    """The layers to fuse: as configured, else the top two thirds (rounded up)."""
    if cfg.layers is None:
        return list(range(num_layers - (2 * num_layers + 2) // 3, num_layers))
    bad = [i for i in cfg.layers if not 0 <= i < num_layers]
    if bad or len(set(cfg.layers)) != len(cfg.layers):
        raise PipelineError(f"mlp_fusion layers {cfg.layers} must be distinct indices in [0, {num_layers})")
    return sorted(cfg.layers)


def _ffn(family: Family, layer: nn.Module) -> tuple[int, nn.Linear, nn.Linear]:
    (m,) = family.ffn_readers
    return m.segments, layer.get_submodule(m.path), layer.get_submodule(family.ffn_writer.path)


def neuron_features(family: Family, layer: nn.Module) -> torch.Tensor:
    """One row per FFN neuron: its input row and bias, then its W2 column (no normalisation, as in the paper's
    code). A gated neuron's row holds both of its input rows (up-projection and gate), so a cluster is a mean of
    (up, gate, down) triples."""
    segments, fc1, fc2 = _ffn(family, layer)
    width = fc2.in_features
    parts = []
    for s, rows in enumerate(fc1.weight.view(segments, width, -1)):
        parts.append(rows)
        if fc1.bias is not None:
            parts.append(fc1.bias.view(segments, width)[s][:, None])
    return torch.cat([*parts, fc2.weight.T], dim=1).detach().float()


def fuse_layer_(family: Family, layer: nn.Module, clusters: KMeansResult) -> None:
    """Replace a block's FFN by the cluster means, with the cluster sizes as the constant scaling P."""
    segments, fc1, fc2 = _ffn(family, layer)
    hidden, k = fc1.in_features, clusters.centers.shape[0]
    centers = clusters.centers.to(fc1.weight.dtype)
    bias = fc1.bias is not None
    new_fc1, new_fc2 = (
        nn.Linear(hidden, k * segments, bias=bias, dtype=fc1.weight.dtype),
        nn.Linear(k, fc2.out_features, bias=fc2.bias is not None, dtype=fc2.weight.dtype),
    )
    step = hidden + bias
    with torch.no_grad():
        for s in range(segments):
            part = centers[:, s * step : (s + 1) * step]
            new_fc1.weight[s * k : (s + 1) * k].copy_(part[:, :hidden])
            if bias:
                new_fc1.bias[s * k : (s + 1) * k].copy_(part[:, hidden])
        new_fc2.weight.copy_(centers[:, segments * step :].T)
        if fc2.bias is not None:
            new_fc2.bias.copy_(fc2.bias)  # b2 is not clustered
    (m,) = family.ffn_readers
    for path, module in ((m.path, new_fc1), (family.ffn_writer.path, ScaledLinear(new_fc2, clusters.counts.float()))):
        layer.set_submodule(path, module.to(fc1.weight.device))


def fuse_(model: nn.Module, cfg: MlpFusionConfig) -> dict:
    """Cluster and fuse the configured layers in place; returns the k-means figures."""
    family = family_of(model)
    blocks = encoder_layers(model)
    idx = fused_layers(cfg, len(blocks))
    feats = [neuron_features(family, blocks[i]) for i in idx]
    groups: dict[torch.Size, list[int]] = {}
    for j, f in enumerate(feats):  # one batched k-means call per distinct layer shape
        groups.setdefault(f.shape, []).append(j)
    start = time.perf_counter()
    clusters: dict[int, KMeansResult] = {}
    for shape, members in groups.items():
        k = max(1, round(cfg.ratio * shape[0]))
        batch = torch.stack([feats[j] for j in members])
        found = kmeans_batched(batch, k, n_init=cfg.n_init, max_iter=cfg.max_iter, seed=cfg.seed)
        clusters.update(zip(members, found, strict=True))
    seconds = time.perf_counter() - start
    for j, i in enumerate(idx):
        fuse_layer_(family, blocks[i], clusters[j])
    return {
        "layers": idx,
        "widths": {i: int(clusters[j].counts.numel()) for j, i in enumerate(idx)},
        "kmeans_seconds": round(seconds, 3),
        "kmeans_inertia": {i: clusters[j].inertia for j, i in enumerate(idx)},
        "kmeans_iterations": {i: clusters[j].n_iter for j, i in enumerate(idx)},
    }


def layerwise_mse(teacher: nn.Module) -> LossFn:
    """Mean over layers of the per-token squared error of block outputs vs the teacher (pads masked out).

    That is the shared per-layer hidden MSE (a mean over real tokens and the width, summed over layers) times
    width / layers: the paper's code sums over the width, and the scale matters under gradient clipping.
    """

    def loss_fn(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        with torch.no_grad():
            target = teacher(**inputs, output_hidden_states=True).hidden_states
        hidden = model(**inputs, output_hidden_states=True).hidden_states
        scale = hidden[0].shape[-1] / (len(hidden) - 1)
        return scale * layer_hidden_mse(hidden, target, inputs["attention_mask"])

    return loss_fn


def apply(model: nn.Module, cfg: MlpFusionConfig, ctx: StageContext) -> nn.Module:
    """Fuse `model` (a copy of the fine-tuned teacher) in place, tune, train, and return it."""
    report = ctx.report
    report["fusion"] = fuse_(model, cfg)
    report["validation_after_fusion"] = scores(predict_logits(model, ctx.validation), ctx.validation)
    log.info(
        "fused layers %s: validation right after fusion %s",
        report["fusion"]["layers"],
        report["validation_after_fusion"],
    )
    if cfg.tune_steps:
        fused, family = set(report["fusion"]["layers"]), family_of(model)
        params = [
            (n, p)
            for i, block in enumerate(encoder_layers(model))
            if i in fused
            for m in (*family.ffn_readers, family.ffn_writer)
            for n, p in block.get_submodule(m.path).named_parameters()
        ]
        tune_cfg = cfg.train.phase(cfg.tune_steps, cfg.tune_lr)  # all `tune_steps`, however small the data
        tuned = train(
            model,
            ctx.train,
            None,
            tune_cfg,
            teacher=ctx.teacher,  # train() moves it to the training device beside the model
            loss_fn=layerwise_mse(ctx.teacher),
            params=params,
            desc="layer-wise tuning",
        )
        report["tuning"] = tuned.report()
    result = train(model, ctx.train, ctx.validation, cfg.train, teacher=ctx.kd_teacher, desc="task training")
    report["training"] = result.report()
    return model

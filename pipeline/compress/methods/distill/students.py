"""Students: a subset of the teacher's layers, optionally narrower by importance, or a folder of their own."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from pipeline.compress.compaction import compact_
from pipeline.compress.methods.distill.config import StudentConfig
from pipeline.data.tasks import TaskSpec
from pipeline.errors import PipelineError
from pipeline.models.folders import check_model_dir, is_classifier
from pipeline.models.io import load_base_model, load_model
from pipeline.models.layers import encoder_layers


def pick_layers(n_teacher: int, cfg: StudentConfig) -> list[int]:
    """0-based teacher layers the student keeps, bottom to top."""
    if isinstance(cfg.layers, list):
        return sorted(cfg.layers)
    n = cfg.layers
    if not 1 <= n <= n_teacher:
        raise PipelineError(f"student layers {n} must be between 1 and the teacher's {n_teacher}")
    if cfg.pick == "first":
        return list(range(n))
    if cfg.pick == "last":
        return list(range(n_teacher - n, n_teacher))
    return [round((i + 1) * n_teacher / n) - 1 for i in range(n)]  # every k-th, ending with the top layer


@torch.no_grad()
def narrow_(model: nn.Module, heads: int | None, ffn: int | None) -> dict:
    """Keep the `heads` / `ffn` most important units per layer (by the norm of their weights), exactly removed.

    A unit's importance is the product of the norms of what it reads and what it writes (Q/K/V rows and W_O
    columns for a head; the W1 row and W2 column for a neuron). The others lose their output weights, which
    makes them provably dead, and compaction removes them: one removal path for every method.
    """
    for layer in encoder_layers(model):
        att = layer.attention.self
        d, n_heads = att.attention_head_size, att.num_attention_heads
        out = layer.attention.output.dense.weight
        if heads is not None and heads < n_heads:
            reads = sum(
                getattr(att, m).weight.view(n_heads, d, -1).pow(2).sum((1, 2)) for m in ("query", "key", "value")
            )
            writes = out.view(out.shape[0], n_heads, d).pow(2).sum((0, 2))
            drop = (reads.sqrt() * writes.sqrt()).argsort()[: n_heads - heads]
            out.view(out.shape[0], n_heads, d)[:, drop] = 0
        w1, w2 = layer.intermediate.dense.weight, layer.output.dense.weight
        if ffn is not None and ffn < w1.shape[0]:
            drop = (w1.norm(dim=1) * w2.norm(dim=0)).argsort()[: w1.shape[0] - ffn]
            w2[:, drop] = 0
    return compact_(model)


def cut_from(teacher: nn.Module, keep: list[int], heads: int | None, ffn: int | None) -> tuple[nn.Module, dict | None]:
    """A copy of `teacher` with only the layers `keep`, each narrowed to `heads` heads and `ffn` neurons when given
    (by `narrow_`, compacted); returns it and the compaction report (None when nothing was narrowed)."""
    model = copy.deepcopy(teacher)
    model.base_model.encoder.layer = nn.ModuleList([encoder_layers(model)[i] for i in keep])
    model.config.num_hidden_layers = len(keep)
    report = narrow_(model, heads, ffn) if heads is not None or ffn is not None else None
    return model, report


def build_student(teacher: nn.Module, cfg: StudentConfig, task: TaskSpec) -> tuple[nn.Module, dict]:
    """A trainable student and a description of how it was made."""
    if cfg.path is not None:
        config = check_model_dir(cfg.path)
        student = load_model(cfg.path) if is_classifier(config) else load_base_model(cfg.path, task)
        if student.config.num_labels != task.num_labels:
            raise PipelineError(
                f"student {cfg.path} has {student.config.num_labels} labels, task {task.name} has {task.num_labels}"
            )
        return student.requires_grad_(True), {"source": str(cfg.path), "layers": len(encoder_layers(student))}
    keep = pick_layers(len(encoder_layers(teacher)), cfg)
    student, report = cut_from(teacher, keep, cfg.heads, cfg.ffn)
    info: dict[str, Any] = {"source": "teacher layers", "teacher_layers": keep}
    if report is not None:
        info.update(heads=report["heads"], ffn_widths=report["ffn_widths"])
    return student.requires_grad_(True), info

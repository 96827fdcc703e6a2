"""Distillation: build the student, transfer relations / hidden states, then fine-tune with output KD."""

from __future__ import annotations

import logging

import torch
from torch import nn

from pipeline.compress.context import StageContext
from pipeline.compress.methods.distill import derived as rules
from pipeline.compress.methods.distill.config import DistillConfig, GeneralConfig
from pipeline.compress.methods.distill.losses import DirectProjections, direct_loss, layer_mapping, relation_loss
from pipeline.compress.methods.distill.students import build_student
from pipeline.devices import resolve_device
from pipeline.models.families import arch_of, family_of
from pipeline.models.layers import encoder_layers, head_counts
from pipeline.report import derived_line
from pipeline.train.loop import train
from pipeline.train.losses import (
    HiddenProjections,
    LossFn,
    hidden_loss,
    layer_hidden_mse,
    prediction_rows,
    task_loss,
)

log = logging.getLogger(__name__)


def _qkv(model: nn.Module, layer: int, hidden_in: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """All heads' queries, keys and values of block `layer` (the concatenations MiniLMv2 re-splits)."""
    return family_of(model).qkv(encoder_layers(model)[layer], hidden_in)


def distill_loss(
    cfg: DistillConfig | GeneralConfig,
    teacher: nn.Module,
    projections: HiddenProjections | None,
    *,
    task: bool,
    direct: DirectProjections | None = None,
    outputs: nn.Module | None = None,
) -> LossFn:
    """relation · L_rel + hidden · L_hid (+ `cfg.direct` · L_direct with `direct`'s maps, + when `task` the task
    loss with output KD and `train.layer_kd` × every student layer's hidden-state MSE to its teacher layer), from
    one forward each. `outputs` (the teacher's stored rows) answers the teacher's logits when the loss needs nothing
    else of it."""
    n_teacher = len(encoder_layers(teacher))
    t_layer = cfg.teacher_layer or n_teacher
    needs_qkv = bool(cfg.relation or direct is not None)
    layer_kd = cfg.train.layer_kd if task else 0.0
    insides = bool(needs_qkv or cfg.hidden or layer_kd)
    # else plain fine-tuning; an embedding student (no labels) always learns the teacher's vectors
    needs_logits = bool(task and cfg.train.kd_alpha > 0)
    # the stored rows answer the logits; with insides they pass the teacher's hidden states through, and put the
    # KD teacher's logits in (`--kd-teacher`)
    t_model = outputs if outputs is not None else teacher

    def loss_fn(student: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        mask = inputs["attention_mask"]
        t_out = t_qkv = None
        if insides or needs_logits or (task and "labels" not in batch):
            with torch.no_grad():
                t_out = t_model(**inputs, output_hidden_states=True) if insides else t_model(**inputs)
                t_qkv = _qkv(teacher, t_layer - 1, t_out.hidden_states[t_layer - 1]) if needs_qkv else None
        s_out = student(**inputs, output_hidden_states=True)
        total = s_out.hidden_states[-1].new_zeros(())
        s_qkv = _qkv(student, -1, s_out.hidden_states[-2]) if needs_qkv else None  # the student's last layer
        if cfg.relation:
            total = total + cfg.relation * relation_loss(
                t_qkv, s_qkv, mask, cfg.relation_heads, tuple(cfg.relation_pairs)
            )
        if direct is not None:
            total = total + cfg.direct * direct_loss(t_qkv, s_qkv, mask, direct)
        if cfg.hidden:
            total = total + cfg.hidden * hidden_loss(
                s_out.hidden_states, t_out.hidden_states, projections.mapping, projections, mask
            )
        if task:
            rows, labels = prediction_rows(s_out, batch)
            t_rows = prediction_rows(t_out, batch)[0] if t_out else None
            total = total + task_loss(rows, labels, t_rows, cfg.train)
        if layer_kd:
            total = total + layer_kd * layer_hidden_mse(s_out.hidden_states, t_out.hidden_states, mask)
        return total

    return loss_fn


def derived_shapes(cfg: DistillConfig, teacher: nn.Module, student: nn.Module) -> dict[str, rules.Resolved]:
    """What the run derived from the shapes, or took as set (`derived`): the student's depth and width, the
    teacher layer and, with relations on, the relation heads over the two models' Q/K/V widths."""
    t_config, s_config = teacher.config.to_dict(), student.config.to_dict()
    t_arch, s_arch = arch_of(t_config), arch_of(s_config)
    n_teacher = len(encoder_layers(teacher))
    chosen = cfg.student.path is not None or cfg.student.layers is not None
    out = {
        "student_layers": rules.Resolved(len(encoder_layers(student)), "set" if chosen else "derived"),
        "student_hidden": rules.Resolved(
            s_arch.hidden, "set" if cfg.student.path or cfg.student.hidden else "derived"
        ),
        "teacher_layer": rules.teacher_layer(cfg.teacher_layer, n_teacher, t_config["model_type"]),
    }
    if cfg.relation:
        t_width = head_counts(teacher)[out["teacher_layer"].value - 1] * t_arch.head_dim
        s_width = head_counts(student)[-1] * s_arch.head_dim
        out["relation_heads"] = rules.relation_heads(cfg.relation_heads, t_width, s_width)
    return out


def apply(model: nn.Module, cfg: DistillConfig, ctx: StageContext) -> nn.Module:
    """`model` is a copy of the fine-tuned teacher; returns the trained student."""
    teacher = ctx.teacher
    student, info = build_student(model, cfg.student, ctx.task, cfg.train.seed)
    ctx.report["student"] = info
    shapes = derived_shapes(cfg, teacher, student)
    ctx.report["derived"] = rules.as_report(shapes)
    log.info("distill: %s", derived_line(ctx.report["derived"]))
    cfg = cfg.model_copy(update={k: shapes[k].value for k in ("teacher_layer", "relation_heads") if k in shapes})
    projections = None
    if cfg.hidden:
        mapping = layer_mapping(cfg.hidden_mapping, len(encoder_layers(teacher)), len(encoder_layers(student)))
        projections = HiddenProjections(mapping, student.config.hidden_size, teacher.config.hidden_size)
        projections.to(resolve_device(cfg.train.device))
        ctx.report["hidden_mapping"] = {str(k): v for k, v in mapping.items()}
    # the projections are training-only: they learn alongside the student and are dropped afterwards
    params = [*student.named_parameters(), *(projections.named_parameters(prefix="proj") if projections else [])]
    phases = {}
    if cfg.transfer_steps:  # phase 1: relations / hidden states only; phase 2: the task with output KD
        transfer = cfg.train.phase(cfg.transfer_steps, cfg.transfer_lr)
        result = train(
            student,
            ctx.train,
            None,
            transfer,
            teacher=teacher,
            params=params,
            desc="distill: transfer",
            loss_fn=distill_loss(cfg, teacher, projections, task=False),
        )
        phases["transfer"] = result.report()
        output_only = cfg.model_copy(update={"relation": 0.0, "hidden": 0.0})
        loss = distill_loss(output_only, teacher, None, task=True, outputs=ctx.kd_teacher)
        params = list(student.named_parameters())
    else:
        loss = distill_loss(cfg, teacher, projections, task=True, outputs=ctx.kd_teacher)
    result = train(
        student,
        ctx.train,
        ctx.validation,
        cfg.train,
        teacher=ctx.kd_teacher,  # train() moves it, and the teacher inside it, to the training device
        params=params,
        loss_fn=loss,
        desc="distill: task",
    )
    phases["task"] = result.report()
    ctx.report["training"] = phases
    return student

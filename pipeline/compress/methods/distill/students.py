"""Students: a subset of the teacher's layers, optionally narrower by importance, or a folder of their own."""

from __future__ import annotations

from typing import Any

from torch import nn

from pipeline.compress.compaction import cut_from
from pipeline.compress.methods.distill.config import StudentConfig, pick_layers
from pipeline.compress.methods.distill.general_student import build_general_student
from pipeline.data.tasks import TaskSpec
from pipeline.errors import PipelineError
from pipeline.models.folders import check_model_dir, head_kind
from pipeline.models.io import load_base_model, load_model
from pipeline.models.layers import encoder_layers, set_activation_


def build_student(teacher: nn.Module, cfg: StudentConfig, task: TaskSpec, seed: int = 0) -> tuple[nn.Module, dict]:
    """A trainable student and a description of how it was made (`seed`: a base model's new head)."""
    student, info = _student(teacher, cfg, task, seed)
    if cfg.activation is not None:
        set_activation_(student, cfg.activation)
        info["activation"] = cfg.activation
    return student, info


def _student(teacher: nn.Module, cfg: StudentConfig, task: TaskSpec, seed: int) -> tuple[nn.Module, dict]:
    if cfg.path is not None:
        config = check_model_dir(cfg.path)
        student = load_model(cfg.path) if head_kind(config) == task.kind else load_base_model(cfg.path, task, seed)
        if student.config.num_labels != task.num_labels:
            raise PipelineError(
                f"student {cfg.path} has {student.config.num_labels} labels, task {task.name} has {task.num_labels}"
            )
        return student.requires_grad_(True), {"source": str(cfg.path), "layers": len(encoder_layers(student))}
    keep = pick_layers(len(encoder_layers(teacher)), cfg)
    if cfg.hidden is not None and cfg.hidden != teacher.config.hidden_size:
        return _narrower(teacher, cfg, keep)
    student, report = cut_from(teacher, keep, cfg.heads, cfg.ffn)
    info: dict[str, Any] = {"source": "teacher layers", "teacher_layers": keep}
    if report is not None:
        info.update(heads=report["heads"], ffn_widths=report["ffn_widths"])
    return student.requires_grad_(True), info


def _narrower(teacher: nn.Module, cfg: StudentConfig, keep: list[int]) -> tuple[nn.Module, dict]:
    """The picked layers at a narrower hidden size: the most important heads (hidden / head size) and hidden
    dimensions of every tensor, the task head's included, as a general student is cut (`general_student`)."""
    from pipeline.models.families import arch_of

    arch = arch_of(teacher.config.to_dict())
    shape = {
        "layers": len(keep),
        "hidden": cfg.hidden,
        "heads": cfg.hidden // arch.head_dim,
        "ffn": cfg.ffn or arch.ffn,
    }
    student, made = build_general_student(teacher, shape, "teacher", 0, keep=keep)
    info = {"source": "teacher layers", "teacher_layers": keep, "hidden": cfg.hidden, "heads": shape["heads"]}
    return student.requires_grad_(True), {**info, "random": made["random"], "dropped": made["dropped"]}

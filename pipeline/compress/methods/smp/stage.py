"""SMP: freeze the model, attach score-driven masks, train only the scores, bake the final mask in."""

from __future__ import annotations

import logging

import torch
from torch import nn

from pipeline.compress.compaction import compact_
from pipeline.compress.context import StageContext
from pipeline.compress.masking import Masker, PruningRun
from pipeline.compress.methods.smp.config import SmpConfig
from pipeline.compress.methods.smp.heads import resolve_head
from pipeline.compress.methods.smp.verbalizer import build_verbalizer_classifier
from pipeline.compress.selection import cubic
from pipeline.data.encoding import collate
from pipeline.devices import resolve_device
from pipeline.errors import PipelineError
from pipeline.models.folders import check_model_dir
from pipeline.train.loop import train
from pipeline.train.losses import classification_loss, prediction_rows

log = logging.getLogger(__name__)


def prune_steps(cfg: SmpConfig, steps: int) -> int:
    """N of the cubic schedule; it must fit in the steps the data and budget actually give."""
    n = cfg.prune_steps if cfg.prune_steps is not None else max(1, round(0.7 * steps))
    if n > steps:
        raise PipelineError(f"smp prune_steps {n} is longer than the {steps} training steps this data gives")
    return n


def starting_model(model: nn.Module, cfg: SmpConfig, ctx: StageContext) -> tuple[nn.Module, str]:
    """The teacher copy (classifier head) or the pre-trained base with the verbalizer head."""
    if ctx.base_model is None:
        return model, "classifier"
    kind, words = resolve_head(cfg, ctx.base_model, check_model_dir(ctx.base_model), ctx.task)
    if kind == "classifier":
        return model, kind
    return build_verbalizer_classifier(ctx.base_model, ctx.task, words), kind


def apply(model: nn.Module, cfg: SmpConfig, ctx: StageContext) -> nn.Module:
    model, head = starting_model(model, cfg, ctx)
    for p in model.parameters():
        p.requires_grad_(False)  # SMP: every pre-trained weight, and the head, stay as they are
    run = PruningRun.start(model, cfg, len(ctx.train))
    masker, final_keep, alloc = run.masker, run.final_keep, run.allocation
    n = prune_steps(cfg, run.steps)
    masker.to_(resolve_device(cfg.train.device))
    state = {"lambda": 0.0}

    def before_step(step: int) -> None:
        masker.allocate_towards(1.0 - cubic(step / n, 1.0, 0.0), final_keep, cfg.mask)  # the cubic ramp
        keep = cubic(step / n, 1.0, final_keep)
        state["lambda"] = cfg.reg_lambda * (1.0 - keep) / (1.0 - final_keep) if final_keep < 1 else 0.0

    task_loss = classification_loss(ctx.kd_teacher, cfg.train)

    def loss_fn(m: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        masker.refresh(alloc, ste=True)  # the mask is a function of the scores at every step
        return task_loss(m, batch) + state["lambda"] * masker.regulariser()

    result = train(
        model,
        ctx.train,
        ctx.validation,
        cfg.train.before_last_phase() if cfg.recover_steps else cfg.train,  # recovery's
        teacher=ctx.kd_teacher,
        loss_fn=loss_fn,
        params=masker.named_scores(),
        before_step=before_step,
        state=masker,
        desc="smp mask training",
    )
    masker.to_("cpu")
    with torch.no_grad():
        masker.allocate_towards(1.0, final_keep, cfg.mask)
        masker.refresh(alloc)
    ctx.report["head"] = head
    run.report_into(ctx.report, prune_steps=n, final_keep=final_keep)
    ctx.report["layer_keep"] = {g.name: round(g.keep, 4) for g in masker.groups} if alloc == "soft" else None
    ctx.report["shape"] = cfg.mask.shape.model_dump() if cfg.mask.shape else None
    ctx.report["training"] = result.report()
    for p in model.parameters():
        p.requires_grad_(True)
    if cfg.recover_steps:  # the mask stays fixed, so pruned weights get no gradient
        ctx.report["validation_before_recovery"] = result.validation
        recover = cfg.train.phase(
            cfg.recover_steps,
            cfg.recover_lr,
            last=True,
            warmup_ratio=0.1,
            weight_decay=0.01,
        )
        if cfg.mask.structured:  # whole heads and neurons: recover the compacted model, at its real cost per step
            ctx.report["compacted_before_recovery"] = compact_exactly_(model, masker, ctx)
        masker.to_(resolve_device(recover.device))
        rec = train(
            model, ctx.train, ctx.validation, recover, teacher=ctx.kd_teacher, desc="smp: recovery at the fixed mask"
        )
        masker.to_("cpu")
        ctx.report["recovery"] = rec.report()
    masker.detach_(model)
    return model


COMPACTION_CHECK_ATOL = 1e-4  # a guard on recovery's starting point; the compact stage's gate proves the result


def compact_exactly_(model: nn.Module, masker: Masker, ctx: StageContext, examples: int = 64) -> dict:
    """Bake the masks in and remove the pruned heads and neurons, checking on validation inputs that the model
    computes what the masked one did: the recovered weights are then those of a recovery under the fixed mask
    (a removed unit's weights get no gradient either way), at a fraction of the cost per step.

    Raises:
        PipelineError: the compacted model's outputs moved more than `COMPACTION_CHECK_ATOL`.
    """
    batch = collate(ctx.validation, list(range(min(examples, len(ctx.validation)))))
    batch.pop("labels", None)
    model.eval()
    with torch.no_grad():
        before = prediction_rows(model(**batch), batch)[0]
        masker.detach_(model)
        report = compact_(model)
        after = prediction_rows(model(**batch), batch)[0]
    diff = float((before - after).abs().max())
    if not diff <= COMPACTION_CHECK_ATOL:
        raise PipelineError(f"smp: compacting before recovery changed the outputs by {diff:.2e}")
    keys = ("heads", "ffn_widths", "removed_heads", "removed_ffn_neurons")
    return {**{k: report[k] for k in keys}, "max_abs_diff": diff}

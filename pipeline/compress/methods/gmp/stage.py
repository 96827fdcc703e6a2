"""GMP*: train the weights with KD while magnitude masks tighten on a cubic schedule, then at a fixed mask."""

from __future__ import annotations

import logging

from torch import nn

from pipeline.compress.context import StageContext
from pipeline.compress.masking import PruningRun
from pipeline.compress.methods.gmp.config import GmpConfig
from pipeline.compress.selection import cubic
from pipeline.errors import PipelineError
from pipeline.train.loop import cycle_bounds, train

log = logging.getLogger(__name__)


def prune_schedule(cfg: GmpConfig, steps: int) -> dict[int, float]:
    """Sparsity at each mask-update step: the first `dense_cycles` are dense, the last at a fixed mask.

    Updates run every `prune_every` steps from the end of the dense learning-rate cycles (the jump to
    `initial_sparsity`) to the start of the last one (the target), following the cubic ramp in between.
    """
    bounds = cycle_bounds(steps, cfg.train.cycles)
    t0, t1 = bounds[cfg.dense_cycles], bounds[-2]
    if t1 - t0 < cfg.prune_every:
        raise PipelineError(
            f"gmp: the pruning window ({t1 - t0} of {steps} steps) is shorter than prune_every {cfg.prune_every}"
        )
    points = [*range(t0, t1, cfg.prune_every), t1]
    return {t: cubic((t - t0) / (t1 - t0), cfg.initial_sparsity, cfg.sparsity) for t in points}


def apply(model: nn.Module, cfg: GmpConfig, ctx: StageContext) -> nn.Module:
    run = PruningRun.start(model, cfg, len(ctx.train))
    masker, final_keep, alloc = run.masker, run.final_keep, run.allocation
    schedule = prune_schedule(cfg, run.steps)

    def before_step(step: int) -> None:
        if step in schedule:
            done = schedule[step] / cfg.sparsity if cfg.sparsity else 1.0  # of the way to the final budget
            masker.allocate_towards(done, final_keep, cfg.mask)
            masker.refresh(alloc, scores={g.name: g.magnitude() for g in masker.groups})

    result = train(
        model,
        ctx.train,
        ctx.validation,
        cfg.train,
        teacher=ctx.kd_teacher,
        before_step=before_step,
        state=masker,  # the masks of the last update, which a resumed run starts from
        desc="gmp pruning",
    )
    run.report_into(ctx.report, updates={str(k): round(v, 4) for k, v in schedule.items()})
    masker.detach_(model)
    ctx.report["training"] = result.report()
    return model

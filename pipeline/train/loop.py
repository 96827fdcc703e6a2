"""The one training loop every method reuses: AdamW, linear warm-up and decay, optional KD, evaluation on the
validation split carved from train (never on dev, which is the reported test).

Methods customise it through `loss_fn` (e.g. MLP Fusion's layer-wise MSE) and `params` (which parameters
move), not by copying it; a sub-phase (distill's transfer, SMP's recovery) is `cfg.phase(...)` of its budget.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import nn
from tqdm.auto import tqdm

from pipeline import checkpoints, devices, distributed, interrupts
from pipeline.config.schema import TrainConfig
from pipeline.data.encoding import iter_batches
from pipeline.errors import PipelineError
from pipeline.kinds.base import Encoded
from pipeline.train.fake_quant import fake_int8
from pipeline.train.losses import LossFn, classification_loss
from pipeline.train.metrics import predict_logits, scores
from pipeline.train.teacher_outputs import TeacherOutputs

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    steps: int
    seconds: float
    history: list[dict] = field(default_factory=list)  # {"step", "loss", and validation scores when evaluated}
    validation: dict[str, float] = field(default_factory=dict)

    def report(self) -> dict:
        """What a stage records of one training phase: budget, time, final loss, validation scores, the history."""
        final = self.history[-1]["loss"] if self.history else None
        return {
            "steps": self.steps,
            "seconds": round(self.seconds, 3),  # milliseconds: the throughput benchmark divides by it
            "final_loss": final,
            "validation": self.validation,
            "history": self.history,
        }


def check_precision(cfg: TrainConfig, device: torch.device) -> None:
    """bf16 only where it is fast: a GPU, or a CPU with native bfloat16.

    Raises:
        PipelineError: bf16 on a CPU that would emulate it.
    """
    if cfg.precision == "bf16" and device.type == "cpu" and not devices.native_bf16_cpu():
        raise PipelineError(
            "train.precision=bf16 needs a GPU or a CPU with native bfloat16 (AVX-512 BF16 or AMX); this CPU would "
            "emulate it, many times slower than fp32: use fp32 (the default)"
        )


def num_steps(cfg: TrainConfig, n_examples: int) -> int:
    return min(cfg.max_steps, math.ceil(cfg.epochs * n_examples / cfg.batch_size))


def lr_factor(step: int, steps: int, warmup_ratio: float, cycles: int = 1) -> float:
    """Multiplier of the peak learning rate: linear warm-up then linear decay to 0, repeated `cycles` times."""
    bounds = cycle_bounds(steps, cycles)
    start, end = next((a, b) for a, b in itertools.pairwise(bounds) if step < b or b == steps)
    pos, n = step - start, end - start
    warmup = int(warmup_ratio * n)
    return (pos + 1) / max(1, warmup) if pos < warmup else max(0.0, (n - pos) / max(1, n - warmup))


def cycle_bounds(steps: int, cycles: int) -> list[int]:
    """First step of each learning-rate cycle, then `steps`: cycles split the run as evenly as possible."""
    return [round(c * steps / cycles) for c in range(cycles + 1)]


def _param_groups(params: Iterable[tuple[str, nn.Parameter]], weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    for name, p in params:
        if p.requires_grad:
            (no_decay if p.ndim < 2 or "LayerNorm" in name or "layer_norm" in name else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def train(
    model: nn.Module,
    train_enc: Encoded,
    val_enc: Encoded | None,
    cfg: TrainConfig,
    *,
    teacher: nn.Module | None = None,
    loss_fn: LossFn | None = None,
    params: Iterable[tuple[str, nn.Parameter]] | None = None,
    before_step: Callable[[int], None] | None = None,
    state: Stateful | None = None,
    desc: str = "train",
) -> TrainResult:
    """Train `model` in place for the configured budget and return the loss/metric history.

    Inside a checkpoint scope (`pipeline.checkpoints`, opened by the stage cache) the phase checkpoints
    every N steps and resumes from its checkpoint: weights, optimiser, schedule, random state and position in
    the data, so a resumed run takes the steps an uninterrupted one would have.

    Args:
        model: the model to train; it is returned to the CPU in eval mode.
        train_enc, val_enc: tokenised train and validation splits (validation may be None to skip evaluation).
        cfg: budget, optimiser and KD settings.
        teacher: frozen model for KD (and for custom losses that close over it).
        loss_fn: replaces the default classification(+KD) loss.
        params: named parameters to optimise (default: all of `model`'s trainable ones).
        before_step: called with the step index (0-based) before each step (pruning schedules hook in here).
        state: what else the phase changes outside `model` and `params` (e.g. a pruning schedule's masks),
            checkpointed with them.
        desc: label of the progress bar.
    """
    device = devices.resolve_device(cfg.device)
    check_precision(cfg, device)
    torch.manual_seed(cfg.seed + RANK_SEED_STRIDE * distributed.rank())  # dropout: each rank its own masks
    gen = torch.Generator().manual_seed(cfg.seed)  # the batches: one order, which the ranks share out
    model.to(device).train()
    if teacher is not None:
        teacher.to(device).eval()
    loss_fn = loss_fn or classification_loss(teacher, cfg)
    steps = num_steps(cfg, len(train_enc))
    result = TrainResult(steps=steps, seconds=0.0)
    if steps == 0:
        return _finish(model, teacher, result)
    named = list(params if params is not None else model.named_parameters())
    groups = _param_groups(named, cfg.weight_decay)
    opt = adamw(groups, cfg.lr, device)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, steps, cfg.warmup_ratio, cfg.cycles))
    average = TailAverage([p for _, p in named if p.requires_grad], steps - min(cfg.average_steps, steps))
    saver = _Saver(checkpoints.next_phase(desc), model, named, state, opt, sched, gen, average)
    step_loss = distributed.replicated(model, [p for _, p in _outside(model, named)], loss_fn, device)
    resumed = saver.restore(result)
    if resumed is not None and resumed.step >= steps:
        log.info("%s: finished before, restored from %s", desc, saver.phase.path)
        return _finish(model, teacher, result)
    step, running, skip = (resumed.step, resumed.running, resumed.position) if resumed else (0, None, 0)
    bf16 = cfg.precision == "bf16"  # mixed precision: the forward and the losses under autocast, the step in fp32
    start = time.perf_counter() - result.seconds
    bar = tqdm(
        total=steps, initial=step, desc=desc, unit="step", dynamic_ncols=True, mininterval=1.0, disable=None
    )  # off without a TTY
    while step < steps:
        epoch_state = gen.get_state()  # the shuffle's seed state: a checkpoint resumes inside this epoch
        batches = iter_batches(
            train_enc, cfg.batch_size, shuffle=True, generator=gen, group_by_length=cfg.group_by_length
        )
        for position, batch in enumerate(itertools.islice(batches, skip, None), start=skip + 1):
            interrupts.check()  # a stop signal whose raise was dropped ends training within a step
            batch, weight = distributed.shard(batch)  # under torchrun, this rank's rows of the batch
            batch = {k: v.to(device) for k, v in batch.items()}
            if before_step is not None:
                before_step(step)
            late = step >= steps - cfg.fake_quant_steps  # the last steps see the int8 graph's rounding
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16), fake_int8(model, late):
                loss = step_loss(batch) * weight
            loss.backward()
            torch.nn.utils.clip_grad_norm_([p for g in groups for p in g["params"]], 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            average.update(step)
            value = distributed.mean(loss).item()  # the whole batch's loss, on every rank
            running = value if running is None else 0.9 * running + 0.1 * value
            entry = {"step": step, "loss": round(running, 5)}
            if val_enc is not None and cfg.eval_every and step % cfg.eval_every == 0 and step < steps:
                validation = scores(predict_logits(model, val_enc), val_enc)
                entry.update(validation)
                model.train()
                log.info("%s: step %d/%d, validation %s", desc, step, steps, _rounded(validation))
            result.history.append(entry)
            bar.update(1)
            bar.set_postfix(loss=f"{running:.4f}")
            if bar.disable and step % max(1, steps // 10) == 0:  # no TTY: a log line every 10% instead
                log.info("%s: step %d/%d, loss %.4f, %.1fs", desc, step, steps, running, time.perf_counter() - start)
            if step >= steps:
                break
            if saver.due(step):
                result.seconds = time.perf_counter() - start
                if isinstance(teacher, TeacherOutputs):  # a resumed run reads the rows this one has read so far
                    teacher.save()
                saver.save(result, _Position(step, running, position, epoch_state))
        skip = 0
    bar.close()
    del step_loss  # a DDP wrapper's gradient hooks go with it, before the next phase wraps the model again
    average.apply()
    if val_enc is not None:
        result.validation = scores(predict_logits(model, val_enc), val_enc)
        result.history[-1].update(result.validation)
    result.seconds = time.perf_counter() - start
    log.info("%s: %d steps in %.1fs, validation %s", desc, steps, result.seconds, result.validation)
    saver.save(result, None)  # finished: a resumed stage skips this phase
    return _finish(model, teacher, result)


RANK_SEED_STRIDE = 1_000_003  # rank r's dropout seed is seed + r * this: rank 0's is the single process's


def adamw(groups: list[dict], lr: float, device: torch.device) -> torch.optim.AdamW:
    """AdamW, fused where torch has the kernel (CPU, CUDA): one pass over the weights instead of a dozen, the same
    arithmetic; on a 2-core CPU the unfused update was a third of a 12 x 768 model's bf16 training step."""
    # None, not False, elsewhere: torch reads fused=False as "no foreach either" and loops over tensors one by one
    return torch.optim.AdamW(groups, lr=lr, fused=device.type in ("cpu", "cuda") or None)


class TailAverage:
    """The running mean of `params` after each step past `start` (the last steps of a phase), put in their place by
    `apply`; checkpointed with the phase, so a resumed phase ends on the average an uninterrupted one does."""

    def __init__(self, params: list[nn.Parameter], start: int):
        self.params, self.start, self.count = params, start, 0
        self.mean: list[torch.Tensor] = []

    def update(self, step: int) -> None:
        """Add the weights after `step` steps, if it is one of the averaged ones."""
        if step <= self.start:
            return
        self.count += 1
        with torch.no_grad():
            if not self.mean:
                self.mean = [p.detach().clone() for p in self.params]
            else:
                for m, p in zip(self.mean, self.params, strict=True):
                    m.add_(p.detach() - m, alpha=1.0 / self.count)

    def apply(self) -> None:
        if not self.count:
            return
        with torch.no_grad():
            for m, p in zip(self.mean, self.params, strict=True):
                p.copy_(m)

    def state_dict(self) -> dict:
        return {"count": self.count, "mean": [m.cpu() for m in self.mean]}

    def load_state_dict(self, state: dict) -> None:
        self.count = state["count"]
        self.mean = [m.to(p.device) for m, p in zip(state["mean"], self.params, strict=True)] if self.count else []


class Stateful(Protocol):
    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


@dataclass
class _Position:
    """Where a phase stands: `position` batches of the epoch whose shuffle starts from `epoch_state` are done."""

    step: int
    running: float | None
    position: int
    epoch_state: torch.Tensor


@dataclass
class _Saver:
    """Writes and restores one phase's checkpoint (a no-op without one)."""

    phase: checkpoints.Phase | None
    model: nn.Module
    named: list[tuple[str, nn.Parameter]]
    state: Stateful | None
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LRScheduler
    gen: torch.Generator
    average: TailAverage

    def due(self, step: int) -> bool:
        return self.phase is not None and step % self.phase.every == 0

    def save(self, result: TrainResult, at: _Position | None) -> None:
        """Write the checkpoint (rank 0 does; every rank takes part, for the ranks' random states)."""
        if self.phase is None:
            return
        rng = _rng_state()
        if not distributed.is_main():
            return
        snapshot = {
            "model": {k: v.detach().cpu() for k, v in self.model.state_dict().items()},
            "params": {n: p.detach().cpu() for n, p in _outside(self.model, self.named)},
            "state": self.state.state_dict() if self.state is not None else None,
            "rng": rng,
            "result": {"seconds": result.seconds, "history": result.history, "validation": result.validation},
        }
        if at is None:
            snapshot["position"] = {"done": True}
        else:
            snapshot["optimizer"], snapshot["scheduler"] = self.opt.state_dict(), self.sched.state_dict()
            snapshot["average"] = self.average.state_dict()
            snapshot["position"] = {"done": False, "step": at.step, "running": at.running, "position": at.position}
            snapshot["epoch_state"] = at.epoch_state
        self.phase.save(snapshot)
        if at is not None:
            log.info("%s: checkpoint at step %d (%s)", self.phase.desc, at.step, self.phase.path)

    def restore(self, result: TrainResult) -> _Position | None:
        saved = self.phase.load() if self.phase is not None else None
        if saved is None:
            return None
        self.model.load_state_dict(saved["model"])
        with torch.no_grad():
            for n, p in _outside(self.model, self.named):
                p.copy_(saved["params"][n])
        if self.state is not None:
            self.state.load_state_dict(saved["state"])
        _set_rng_state(saved["rng"])
        result.seconds = saved["result"]["seconds"]
        result.history, result.validation = saved["result"]["history"], saved["result"]["validation"]
        at = saved["position"]
        if at["done"]:
            return _Position(result.steps, None, 0, self.gen.get_state())  # finished: no step left
        self.opt.load_state_dict(saved["optimizer"])
        self.sched.load_state_dict(saved["scheduler"])
        if "average" in saved:  # checkpoints written before tail averaging have none (and averaged nothing)
            self.average.load_state_dict(saved["average"])
        self.gen.set_state(saved["epoch_state"])
        log.info("%s: resuming from the checkpoint at step %d (%s)", self.phase.desc, at["step"], self.phase.path)
        return _Position(at["step"], at["running"], at["position"], saved["epoch_state"])


def _outside(model: nn.Module, named: list[tuple[str, nn.Parameter]]) -> list[tuple[str, nn.Parameter]]:
    """Trained parameters that are not the model's own (distillation's projections, SMP's mask scores)."""
    own = {id(p) for p in model.parameters()}
    return [(n, p) for n, p in named if id(p) not in own]


def _rng_state() -> dict:
    """The global generators dropout draws from; under torchrun, every rank's (a collective: all ranks call it)."""
    state = {"cpu": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}
    if distributed.active():
        state["ranks_cpu"] = distributed.gathered(state["cpu"])
        if torch.cuda.is_available():  # each rank's own GPU
            state["ranks_cuda"] = distributed.gathered(torch.cuda.get_rng_state())
    return state


def _set_rng_state(state: dict) -> None:
    """Restore the generators; a rank restores its own where the checkpoint holds as many ranks as run now (from
    another world size, rank 0's state, moved on per rank like a fresh start's seeds)."""
    r, ranks = distributed.rank(), distributed.world_size()
    if ranks == 1 or len(state.get("ranks_cpu", ())) != ranks:
        torch.set_rng_state(state["cpu"])
        if state["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])
        if r:
            torch.manual_seed(int(torch.randint(2**62, (1,))) + RANK_SEED_STRIDE * r)
        return
    torch.set_rng_state(state["ranks_cpu"][r])
    if "ranks_cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["ranks_cuda"][r])


def _rounded(metrics: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 2) for k, v in metrics.items()}


def _finish(model: nn.Module, teacher: nn.Module | None, result: TrainResult) -> TrainResult:
    model.to("cpu").eval()
    if teacher is not None:
        teacher.to("cpu")
    return result

"""The one training loop every method reuses: AdamW, linear warm-up and decay, optional KD, dev evaluation.

Methods customise it through `loss_fn` (e.g. MLP Fusion's layer-wise MSE) and `params` (which parameters
move), not by copying it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from pipeline.config import TrainConfig
from pipeline.encoding import Encoded, iter_batches
from pipeline.errors import PipelineError
from pipeline.evaluation import predict_logits, scores
from pipeline.kd import hidden_loss, output_kd_loss

log = logging.getLogger(__name__)

LossFn = Callable[[nn.Module, dict[str, torch.Tensor]], torch.Tensor]


@dataclass
class TrainResult:
    steps: int
    seconds: float
    history: list[dict] = field(default_factory=list)  # {"step", "loss", and dev scores when evaluated}
    dev: dict[str, float] = field(default_factory=dict)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' requested but CUDA is not available")
    return torch.device(name)


def num_steps(cfg: TrainConfig, n_examples: int) -> int:
    return min(cfg.max_steps, math.ceil(cfg.epochs * n_examples / cfg.batch_size))


def lr_factor(step: int, steps: int, warmup_ratio: float, cycles: int = 1) -> float:
    """Multiplier of the peak learning rate: linear warm-up then linear decay to 0, repeated `cycles` times."""
    bounds = cycle_bounds(steps, cycles)
    start, end = next((a, b) for a, b in zip(bounds, bounds[1:], strict=False) if step < b or b == steps)
    pos, n = step - start, end - start
    warmup = int(warmup_ratio * n)
    return (pos + 1) / max(1, warmup) if pos < warmup else max(0.0, (n - pos) / max(1, n - warmup))


def cycle_bounds(steps: int, cycles: int) -> list[int]:
    """First step of each learning-rate cycle, then `steps`: cycles split the run as evenly as possible."""
    return [round(c * steps / cycles) for c in range(cycles + 1)]


def classification_loss(teacher: nn.Module | None, cfg: TrainConfig) -> LossFn:
    """Cross-entropy on labels, mixed with T²-scaled KL to the teacher's logits when `kd_alpha` > 0, plus
    `layer_kd` × the hidden-state MSE of every layer to the teacher's same layer when `layer_kd` > 0."""
    use_kd = teacher is not None and (cfg.kd_alpha > 0 or cfg.layer_kd > 0)

    def loss_fn(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        hidden = use_kd and cfg.layer_kd > 0
        out = model(**inputs, output_hidden_states=hidden)
        if not use_kd:
            return F.cross_entropy(out.logits, batch["labels"])
        with torch.no_grad():
            t_out = teacher(**inputs, output_hidden_states=hidden)
        loss = task_loss(out.logits, batch["labels"], t_out.logits, cfg)
        if hidden:
            if len(out.hidden_states) != len(t_out.hidden_states):
                raise PipelineError(
                    f"layer_kd needs the teacher's depth: student {len(out.hidden_states) - 1} layers, "
                    f"teacher {len(t_out.hidden_states) - 1}"
                )
            layers = {i: [i] for i in range(1, len(out.hidden_states))}
            loss = loss + cfg.layer_kd * hidden_loss(
                out.hidden_states, t_out.hidden_states, layers, None, inputs["attention_mask"]
            )
        return loss

    return loss_fn


def task_loss(logits: torch.Tensor, labels: torch.Tensor, t_logits: torch.Tensor | None, cfg: TrainConfig) -> torch.Tensor:
    """(1 − α)·CE + α·T²·KL(teacher ‖ student) at temperature T (α = `kd_alpha`; CE only without teacher logits)."""
    ce = F.cross_entropy(logits, labels)
    alpha, t = cfg.kd_alpha, cfg.kd_temperature
    if t_logits is None or alpha == 0:
        return ce
    return (1 - alpha) * ce + alpha * output_kd_loss(logits, t_logits, t)


def _param_groups(params: Iterable[tuple[str, nn.Parameter]], weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    for name, p in params:
        if p.requires_grad:
            (no_decay if p.ndim < 2 or "LayerNorm" in name or "layer_norm" in name else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def train(
    model: nn.Module,
    train_enc: Encoded,
    dev_enc: Encoded | None,
    cfg: TrainConfig,
    *,
    teacher: nn.Module | None = None,
    loss_fn: LossFn | None = None,
    params: Iterable[tuple[str, nn.Parameter]] | None = None,
    before_step: Callable[[int], None] | None = None,
    desc: str = "train",
) -> TrainResult:
    """Train `model` in place for the configured budget and return the loss/metric history.

    Args:
        model: the model to train; it is returned to the CPU in eval mode.
        train_enc, dev_enc: tokenised splits (dev may be None to skip evaluation).
        cfg: budget, optimiser and KD settings.
        teacher: frozen model for KD (and for custom losses that close over it).
        loss_fn: replaces the default classification(+KD) loss.
        params: named parameters to optimise (default: all of `model`'s trainable ones).
        before_step: called with the step index (0-based) before each step (pruning schedules hook in here).
        desc: label of the progress bar.
    """
    device = resolve_device(cfg.device)
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    model.to(device).train()
    if teacher is not None:
        teacher.to(device).eval()
    loss_fn = loss_fn or classification_loss(teacher, cfg)
    steps = num_steps(cfg, len(train_enc))
    result = TrainResult(steps=steps, seconds=0.0)
    if steps == 0:
        return _finish(model, teacher, result)
    groups = _param_groups(params if params is not None else model.named_parameters(), cfg.weight_decay)
    opt = torch.optim.AdamW(groups, lr=cfg.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, steps, cfg.warmup_ratio, cfg.cycles))
    start, step, running = time.perf_counter(), 0, None
    bar = tqdm(total=steps, desc=desc, unit="step", dynamic_ncols=True, mininterval=1.0, disable=None)  # off without a TTY
    while step < steps:
        for batch in iter_batches(train_enc, cfg.batch_size, shuffle=True, generator=gen):
            batch = {k: v.to(device) for k, v in batch.items()}
            if before_step is not None:
                before_step(step)
            loss = loss_fn(model, batch)
            loss.backward()
            torch.nn.utils.clip_grad_norm_([p for g in groups for p in g["params"]], 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            running = loss.item() if running is None else 0.9 * running + 0.1 * loss.item()
            entry = {"step": step, "loss": round(running, 5)}
            if dev_enc is not None and cfg.eval_every and step % cfg.eval_every == 0 and step < steps:
                entry.update(scores(predict_logits(model, dev_enc), dev_enc.labels))
                model.train()
                log.info("%s: step %d/%d, dev accuracy %.2f", desc, step, steps, entry["accuracy"])
            result.history.append(entry)
            bar.update(1)
            bar.set_postfix(loss=f"{running:.4f}")
            if bar.disable and step % max(1, steps // 10) == 0:  # no TTY: a log line every 10% instead
                log.info("%s: step %d/%d, loss %.4f, %.1fs", desc, step, steps, running, time.perf_counter() - start)
            if step >= steps:
                break
    bar.close()
    if dev_enc is not None:
        result.dev = scores(predict_logits(model, dev_enc), dev_enc.labels)
        result.history[-1].update(result.dev)
    result.seconds = time.perf_counter() - start
    log.info("%s: %d steps in %.1fs, dev %s", desc, steps, result.seconds, result.dev)
    return _finish(model, teacher, result)


def _finish(model: nn.Module, teacher: nn.Module | None, result: TrainResult) -> TrainResult:
    model.to("cpu").eval()
    if teacher is not None:
        teacher.to("cpu")
    return result

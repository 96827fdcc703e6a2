"""A speed target turned into a model shape: predict latency from a measured table, search the shape, apply it.

The table (the plan stage, `pipeline.stages.plan`, measures it in ONNX Runtime on this machine) holds the int8
latency of a one-layer model at a grid of (heads kept, FFN neurons kept), the fixed cost of everything outside the
encoder layers, and the dense fp32 teacher's latency, all at one batch x sequence. A model of L layers of shape
(h, f) is predicted at `fixed + L * layer(h, f)` (ZipLM's per-module latency table, with our runtime and our
units), where `layer(h, f) = a + b*h + c*f` is fitted by least squares to the grid's one-layer times less the fixed
cost: a layer's matmuls grow linearly in heads and in FFN neurons, and one plane through 36 probes is not thrown by
the one probe that a busy moment slowed (reading single cells was: it planned the flagship at 10.56x, measured
5.39x). Of the shapes that meet the target the search keeps the most balanced one (`rank`): keeping the most
weights instead drops heads to one a layer on tight budgets, which cost 3.6 points on SST-2 at 8x (docs/decisions.md).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import cached_property
from typing import Any

import numpy as np

from pipeline.compress.deploy_config import DeployConfig
from pipeline.compress.methods.distill.derived import relation_heads
from pipeline.compress.methods.none.config import NoneConfig
from pipeline.compress.registry import methods
from pipeline.config.recipes import CHAIN_SEP
from pipeline.errors import PipelineError

log = logging.getLogger(__name__)

FFN_STEP = 32  # FFN widths are searched in steps of this many neurons


@dataclass(frozen=True)
class LatencyTable:
    """Measured latencies (ms, p50) of int8 graphs, and the dense fp32 teacher they are compared with."""

    heads: list[int]  # grid of heads kept per layer, increasing
    ffn: list[int]  # grid of FFN neurons kept per layer, increasing
    layer_ms: list[list[float]]  # one-layer int8 model at heads[i] x ffn[j] (fixed cost included)
    fixed_ms: float  # embeddings, pooler and classifier (int8 graph): what a model with no layer costs
    dense_fp32_ms: float  # the whole dense teacher, fp32
    teacher: dict[str, int]  # layers, heads, ffn, hidden, head_dim of the teacher
    batch: int
    seq: int

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LatencyTable:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})

    @cached_property
    def _plane(self) -> tuple[float, float, float]:
        """(a, b, c) of the least-squares fit `one_layer(h, f) - fixed = a + b*h + c*f` over the grid."""
        if len(self.ffn) < 2 or (len(self.heads) < 2 and self.teacher["heads"] > 1):
            raise PipelineError("a latency table needs at least two grid points per axis")  # one head: one point
        rows = [(1.0, h, f) for h in self.heads for f in self.ffn]
        costs = [self.layer_ms[i][j] - self.fixed_ms for i in range(len(self.heads)) for j in range(len(self.ffn))]
        a, b, c = np.linalg.lstsq(np.array(rows), np.array(costs), rcond=None)[0]
        return float(a), float(b), float(c)

    def layer_cost(self, heads: float, ffn: float) -> float:
        """One layer's own cost at (heads, ffn), from the plane fitted to the grid."""
        a, b, c = self._plane
        return max(0.0, a + b * heads + c * ffn)

    def predict_ms(self, layers: int, heads: float, ffn: float) -> float:
        return self.fixed_ms + layers * self.layer_cost(heads, ffn)


@dataclass(frozen=True)
class Shape:
    """A uniform per-layer shape and what the table predicts for it."""

    layers: int
    heads: int
    ffn: int
    predicted_ms: float
    predicted_speedup: float
    params: int  # encoder linear weights kept (the search's objective)
    hidden: int = 0  # the hidden size of the table it was planned on

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def kept_weights(table: LatencyTable, layers: int, heads: int, ffn: int) -> int:
    hidden, head_dim = table.teacher["hidden"], table.teacher["head_dim"]
    return layers * (4 * hidden * head_dim * heads + 2 * hidden * ffn)


def width_kept(shape: Shape, table: LatencyTable, widest: int) -> float:
    """The smallest fraction the shape keeps of the teacher's heads, FFN neurons and hidden size (`widest`: the
    teacher's): the bottleneck the `widths` objective widens first."""
    t = table.teacher  # rounded: equal fractions of different units compare equal
    return round(min(shape.heads / t["heads"], shape.ffn / t["ffn"], t["hidden"] / widest), 6)


def balance(shape: Shape, table: LatencyTable, widest: int) -> float:
    """`width_kept`, or the fraction of the teacher's layers kept where that is smaller: the bottleneck the
    `balanced` objective widens first."""
    return min(width_kept(shape, table, widest), round(shape.layers / table.teacher["layers"], 6))


def rank(shape: Shape, table: LatencyTable, widest: int, objective: str) -> tuple:
    """The search's order (larger is better): `weights` keeps the most encoder weights (more layers, then the
    wider, on a tie); `balanced` keeps the largest smallest fraction (`balance`), then the most layers, then the
    most weights; `widths` the largest `width_kept`, then the most layers: it sheds layers (down to
    `target.min_depth`) before it masks."""
    if objective == "balanced":
        return balance(shape, table, widest), shape.layers, shape.params
    if objective == "widths":
        return width_kept(shape, table, widest), shape.layers, shape.params
    return shape.params, shape.hidden, shape.layers


def search_widths(
    tables: list[LatencyTable],
    target: float,
    layer_options: list[int],
    headroom: float = 0.0,
    min_heads: int = 1,
    objective: str = "balanced",
) -> tuple[Shape, LatencyTable]:
    """`search_shape` on the table of each hidden size; the best shape by `objective` (`rank`), with its table.

    Raises:
        PipelineError: no table has a shape that meets the target (the error of the narrowest table's search).
    """
    found: list[tuple[Shape, LatencyTable]] = []
    error: PipelineError | None = None
    widest = max(t.teacher["hidden"] for t in tables) if tables else 0
    for table in sorted(tables, key=lambda t: -t.teacher["hidden"]):
        try:
            shape = search_shape(table, target, layer_options, headroom, min_heads, objective, widest)
            found.append((shape, table))
        except PipelineError as e:
            error = e
    if not found:
        raise error or PipelineError("no latency table to plan on")
    return max(found, key=lambda st: rank(st[0], st[1], widest, objective))


def search_shape(
    table: LatencyTable,
    target: float,
    layer_options: list[int],
    headroom: float = 0.0,
    min_heads: int = 1,
    objective: str = "balanced",
    widest: int | None = None,
) -> Shape:
    """The shape (L layers of h heads and f FFN neurons each) whose predicted speedup over the dense fp32 teacher
    is at least `target` × (1 + `headroom`), with at least `min_heads` heads a layer, best by `objective`
    (`rank`; `widest`: the teacher's hidden size when this table is narrower).

    Raises:
        PipelineError: no shape with at least `min_heads` heads and one FFN step per layer meets the target.
    """
    budget = table.dense_fp32_ms / (target * (1 + headroom))
    widest = widest or table.teacher["hidden"]
    best: Shape | None = None
    best_rank: tuple = ()  # below every shape's rank
    min_heads = min(min_heads, table.teacher["heads"])
    for layers in sorted(set(layer_options)):
        for heads in range(min_heads, table.teacher["heads"] + 1):
            for ffn in range(FFN_STEP, table.teacher["ffn"] + 1, FFN_STEP):
                ms = table.predict_ms(layers, heads, ffn)
                if ms > budget:
                    break  # wider FFNs only cost more
                params = kept_weights(table, layers, heads, ffn)
                shape = Shape(layers, heads, ffn, round(ms, 4), round(table.dense_fp32_ms / ms, 3), params,
                              table.teacher["hidden"])  # fmt: skip
                if (order := rank(shape, table, widest, objective)) > best_rank:
                    best, best_rank = shape, order
    if best is None:
        fastest = table.predict_ms(min(layer_options), min_heads, FFN_STEP)
        raise PipelineError(
            f"--target-speedup {target} (planned {headroom:.0%} above it): even {min(layer_options)} layer(s) of "
            f"{min_heads} head(s) and {FFN_STEP} FFN neurons are predicted at {table.dense_fp32_ms / fastest:.2f}x "
            "on this machine"
        )
    return best


def calibrate(
    first: Shape,
    search: Callable[[float], Shape],
    measure: Callable[[Shape], tuple[float, float]],
    target: float,
    headroom: float,
    steps: int,
) -> tuple[Shape, list[dict[str, Any]]]:
    """The searched shape `first`, checked by timing it, and moved until a check lands in the middle of the window
    [target, target x (1 + headroom)]: returns the shape and the checks (each: the shape, its predicted and
    measured speedups).

    `search(factor)` is the search with the table's predictions read `factor` times too fast (the target times
    `factor`); `measure(shape)` times the shape's int8 graph and the dense fp32 teacher in one run: (ms, speedup).
    A check outside the window's middle half re-plans with the error it measured at that shape (its predicted over
    its measured speedup), at most `steps` checks, a shape checked once not checked again: the artifact is timed
    again after training, and a check that only just reached the target misses it there with noise of a few percent
    (a 6x check read 6.08x; the trained artifact of that shape 5.76-6.03x, docs/results.md). The next shape always
    lies between what the checks bracket: predicted faster than every shape measured slower than the aim, slower
    than every shape measured faster. Timing noise can give two neighbouring shapes errors of opposite sign, and
    the last error alone then jumps past a shape already measured on the other side; such a move is replaced by the
    search aimed at the middle of the bracket. Of the checks inside the window, one in its middle half wins (the
    nearest the middle); if none, one above the middle half: the trained artifact's bench lands a percent or a few
    from its check either way (the check times what the bench times, `pipeline.stages.plan.check_record`), and
    falling below the target (the line's speed bar) is the worse miss than rising above the window (a student a
    little larger than needed). Then the rest inside, nearest the middle; if none inside,
    the slowest that reached the target; if none reached it, the fastest measured, with a warning."""
    shape, checks = first, []
    top, aim = target * (1 + headroom), target * (1 + headroom / 2)
    band = (target * (1 + headroom / 4), target * (1 + 3 * headroom / 4))  # the window's middle half
    for _ in range(steps):
        ms, speed = measure(shape)
        checks.append({**shape.as_dict(), "measured_ms": round(ms, 4), "measured_speedup": round(speed, 3)})
        if band[0] <= speed <= band[1]:
            break
        slow = max((c["predicted_speedup"] for c in checks if c["measured_speedup"] < aim), default=0.0)
        fast = min((c["predicted_speedup"] for c in checks if c["measured_speedup"] > aim), default=math.inf)
        try:
            moved = search(shape.predicted_speedup / speed)
            if not slow < moved.predicted_speedup < fast and 0 < slow < fast < math.inf:
                moved = search((slow + fast) / 2 / aim)
        except PipelineError:  # the error puts every shape out of reach: keep what was checked
            break
        if any(shape_of(c) == moved for c in checks) or not slow < moved.predicted_speedup < fast:
            break
        shape = moved
    if not checks:
        return shape, checks
    inside = [c for c in checks if target <= c["measured_speedup"] <= top]
    met = [c for c in checks if c["measured_speedup"] >= target]
    if inside:
        upper = [c for c in inside if c["measured_speedup"] >= band[0]]  # the middle half, or above it
        best = min(upper or inside, key=lambda c: abs(c["measured_speedup"] - aim))
    elif met:
        best = min(met, key=lambda c: c["measured_speedup"])
    else:
        best = max(checks, key=lambda c: c["measured_speedup"])
        log.warning("speed target %.2fx: no checked shape reached it; the fastest, %.2fx, is kept", target,
                    best["measured_speedup"])  # fmt: skip
    return shape_of(best), checks


def shape_of(record: dict[str, Any]) -> Shape:
    """The Shape a record (a check, a plan's shape) holds."""
    return Shape(**{k: record[k] for k in Shape.__dataclass_fields__})


def layer_options(config: DeployConfig, layers: int) -> list[int]:
    """Depths the search may pick: from `target.min_depth` of `layers` (the teacher's) up to all of them when the
    chain starts by cutting a student from the teacher (distill), else `layers` (the teacher's, or a student
    folder's own).

    Raises:
        PipelineError: `target.layers` holds no depth that deep.
    """
    if not config.cuts_student:
        return [layers]
    least = max(1, math.ceil(config.target.min_depth * layers - 1e-9))  # 0.28 x 25 is 7.000000000000001
    options = [n for n in (config.target.layers or range(1, layers + 1)) if least <= n <= layers]
    if not options:  # only a given target.layers can miss: least <= layers always
        raise PipelineError(
            f"target.layers {list(config.target.layers)} holds no depth from {least} (target.min_depth "
            f"{config.target.min_depth:g} of the teacher's {layers} layers) to {layers}"
        )
    return options


def check_depth_options(config: DeployConfig, teacher: dict[str, Any]) -> None:
    """A speed target's depths (`target.layers`, `target.min_depth`) leave the search at least one, checked before
    the teacher trains (`teacher`: its `config.json`)."""
    from pipeline.models.families import arch_of

    if config.target.speedup is not None:
        layer_options(config, arch_of(teacher).layers)


def check_hidden_options(config: DeployConfig, teacher: dict[str, Any]) -> None:
    """`target.hidden` needs a student cut from the teacher (distill first, no student folder), of a family that
    can be narrowed, at multiples of its head size up to its width (`teacher`: its `config.json`)."""
    from pipeline.models.families import arch_of, family_for

    if not config.target.hidden:
        return
    if not config.cuts_student:
        raise PipelineError(
            "target.hidden narrows a student cut from the teacher: the chain must start with distill, without "
            "config.student.path"
        )
    arch, distill = arch_of(teacher), config.chain[0]
    for hidden in config.target.hidden:
        if hidden > arch.hidden or hidden % arch.head_dim:
            raise PipelineError(
                f"target.hidden {hidden} must be a multiple of the teacher's head size {arch.head_dim} up to its "
                f"{arch.hidden}"
            )
        if getattr(distill, "relation", 0):  # set relation heads must fit every planned width; derived ones do
            try:
                relation_heads(distill.relation_heads, arch.heads * arch.head_dim, hidden)
            except PipelineError as e:
                raise PipelineError(f"target.hidden {hidden}: {e}") from None
    if not family_for(teacher["model_type"]).narrows_from_teacher:
        raise PipelineError(
            f"target.hidden: a {teacher['model_type']} student cannot be cut from its teacher at a narrower hidden "
            "size (its layers share one position-bias table over all heads)"
        )


def check_target_chain(config: DeployConfig) -> None:
    """A speed target needs a method that prunes to a shape as the chain's last."""
    if not config.chain_configs[-1][0].shapes:
        shapers = " or ".join(m.name for m in methods() if m.shapes)
        raise PipelineError(
            f"--target-speedup needs a chain that ends in {shapers} (they prune heads and FFN neurons to the "
            f"planned shape), e.g. distill{CHAIN_SEP}smp; got {config.method!r}"
        )


def apply_shape(
    config: DeployConfig, shape: Shape, teacher: dict[str, int], narrower: int | None = None
) -> DeployConfig:
    """The configuration with the planned shape, each stage's config as its method plans it (`planned`): the
    student's depth (and `narrower` hidden size), the pruner's per-layer heads and FFN neurons (of `teacher`, the
    table's shape). A stage left with nothing to do is dropped (distill when every layer and the width stay, the
    pruner when every unit does); when none is left, `none`."""
    kept = [
        planned
        for cfg in config.chain
        if (planned := cfg.planned(shape.layers, shape.heads, shape.ffn, teacher, narrower)) is not None
    ]
    return config.with_chain(kept or [NoneConfig()])

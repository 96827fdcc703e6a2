"""One mask mechanism for the encoder's linear layers, shared by the pruning methods (smp, gmp).

A `MaskedLinear` is made from an `nn.Linear` (it takes over the weight and bias, no copy) and `Masker.detach_`
turns it back into a plain `nn.Linear` holding `W ⊙ M`, so nothing leaves a stage with a wrapper attached.

One score covers one unit, at one of four granularities:
- `unstructured`: one weight of one matrix;
- `block` (r, c): an r × c tile of one matrix;
- `neuron`: an FFN neuron, i.e. row j of W1 and column j of W2 (one score gates both matrices);
- `head`: an attention head, i.e. its rows of W_Q, W_K, W_V and its columns of W_O.
Neurons and heads are what compaction removes; unstructured and block zeros stay in dense matrices.
Biases are never masked (as in both papers); compaction folds the constants they leave behind.

A `MaskGroup` is one score tensor (one matrix, or one layer's neurons or heads). Masks keep the top-k units of
each group ("local"), of all groups of one kind pooled ("type"), or of all groups pooled ("global"); "soft" is
SMP-S, which splits the budget across the layers of each kind by the soft count of kept scores.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.compress.selection import kept_count, ste_topk, topk_mask
from pipeline.config.schema import Allocation, AttentionGranularity, FfnGranularity, MaskConfig, UnitCounts
from pipeline.errors import PipelineError
from pipeline.models.families import family_of
from pipeline.models.layers import ScaledLinear, encoder_layers, head_readers, new_linear
from pipeline.train.loop import num_steps

if TYPE_CHECKING:
    from pipeline.compress.pruning_config import PruningConfig


@dataclass(frozen=True)
class Layout:
    """How a group's unit mask maps onto one matrix (out × in) and back."""

    kind: Literal["full", "rows", "cols", "blocks"]
    size: int = 1  # rows (or cols) per unit
    block: tuple[int, int] = (1, 1)
    segments: int = 1  # row blocks that each hold every unit (a fused QKV: 3; a gated FFN input: 2)

    def expand(self, m: torch.Tensor) -> torch.Tensor:
        if self.kind == "rows":
            return m.repeat_interleave(self.size).repeat(self.segments)[:, None]
        if self.kind == "cols":
            return m.repeat_interleave(self.size)[None, :]
        if self.kind == "blocks":
            return m.repeat_interleave(self.block[0], 0).repeat_interleave(self.block[1], 1)
        return m

    def unit_abs_sum(self, w: torch.Tensor) -> torch.Tensor:
        """Sum of |w| per unit (for magnitude scores), in the shape of the group's scores."""
        a = w.detach().abs()
        if self.kind == "rows":
            return a.view(self.segments, -1, self.size, a.shape[1]).sum((0, 2, 3))
        if self.kind == "cols":
            return a.view(a.shape[0], -1, self.size).sum((0, 2))
        if self.kind == "blocks":
            r, c = self.block
            return a.view(a.shape[0] // r, r, a.shape[1] // c, c).sum((1, 3))
        return a


class MaskedLinear(nn.Module):
    """`x (W ⊙ M)ᵀ + b`, with M from the mask group(s) this matrix belongs to."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        if isinstance(linear, ScaledLinear):
            raise PipelineError("cannot mask a scaled FFN layer: compact the model first (folds the scale)")
        self.weight = linear.weight
        self.bias = linear.bias
        self.gates: list[tuple[MaskGroup, Layout]] = []

    def mask(self) -> torch.Tensor | None:
        full = None
        for group, layout in self.gates:
            if group.mask is not None:
                m = layout.expand(group.mask)
                full = m if full is None else full * m
        return full

    def masked_weight(self) -> torch.Tensor:
        m = self.mask()
        return self.weight if m is None else self.weight * m

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.masked_weight(), self.bias)

    @torch.no_grad()
    def bake(self) -> nn.Linear:
        """A plain Linear holding `W ⊙ M` (the same Parameter objects, so optimiser state stays attached)."""
        out = new_linear(self.weight.shape[1], self.weight.shape[0], self.weight.dtype, bias=self.bias is not None)
        m = self.mask()
        if m is not None:
            self.weight.mul_(m.to(self.weight.dtype))
        out.weight, out.bias = self.weight, self.bias
        return out


@dataclass(eq=False)
class MaskGroup:
    """One score tensor and the matrices it gates.

    Attributes:
        name: e.g. "2.ffn" (layer 2's neurons), "2.heads", "2.query" (a whole matrix).
        kind: what it is pooled with under "type" allocation and SMP-S: "neuron", "head", or a matrix kind.
        layer: encoder layer index.
        scores: one value per unit (trained by SMP; recomputed from magnitudes by GMP).
        members: (matrix, layout) pairs this group gates.
        keep: kept fraction currently allocated to this group.
        mask: current {0, 1} mask in the shape of `scores`; None until the first refresh (everything kept).
    """

    name: str
    kind: str
    layer: int
    scores: nn.Parameter
    members: list[tuple[MaskedLinear, Layout]] = field(default_factory=list)
    keep: float = 1.0
    mask: torch.Tensor | None = None

    @property
    def units(self) -> int:
        return self.scores.numel()

    def weights_per_unit(self) -> int:
        return sum(lin.weight.numel() for lin, _ in self.members) // self.units

    def magnitude(self) -> torch.Tensor:
        """Mean |w| of each unit's weights, after the current mask (pruned weights count as 0)."""
        total = sum(
            layout.unit_abs_sum(lin.weight if lin.mask() is None else lin.weight * lin.mask())
            for lin, layout in self.members
        )
        return total / self.weights_per_unit()


class Masker:
    """The mask groups of one model: attach wrappers, allocate budgets, compute masks, bake them in."""

    def __init__(self, groups: list[MaskGroup], wrappers: dict[str, MaskedLinear]) -> None:
        self.groups = groups
        self.wrappers = wrappers  # module path -> wrapper, for detach

    # -- building --------------------------------------------------------------------------------------------

    @classmethod
    def from_config(cls, model: nn.Module, cfg: MaskConfig) -> Masker:
        return cls.attach(model, cfg.ffn, cfg.attention, cfg.block)

    @classmethod
    def attach(
        cls,
        model: nn.Module,
        ffn: FfnGranularity = "neuron",
        attention: AttentionGranularity = "head",
        block: tuple[int, int] = (32, 32),
    ) -> Masker:
        """Wrap the encoder's linear matrices per layer (those with a granularity) and create the scores.

        Scores start at 0 (the SMP code's constant init); methods overwrite them (GMP: magnitudes).
        """
        groups: list[MaskGroup] = []
        wrappers: dict[str, MaskedLinear] = {}
        family = family_of(model)
        for i, layer in enumerate(encoder_layers(model)):

            def wrap(path: str, layer: nn.Module = layer, i: int = i) -> MaskedLinear:
                lin = layer.get_submodule(path)
                if isinstance(lin, MaskedLinear):
                    return lin
                masked = MaskedLinear(lin)
                layer.set_submodule(path, masked)
                wrappers[f"{i}.{path}"] = masked
                return masked

            def new_group(name: str, kind: str, shape: tuple[int, ...], members, i: int = i) -> None:
                scores = nn.Parameter(torch.zeros(shape, dtype=torch.float32))
                group = MaskGroup(f"{i}.{name}", kind, i, scores, list(members))
                for lin, layout in group.members:
                    lin.gates.append((group, layout))
                groups.append(group)

            readers, writer = head_readers(family, layer), family.head_writer
            if family.heads(layer) == 0:
                pass  # a compacted layer without heads (HeadlessAttention): no attention matrices to mask
            elif attention == "head":
                d, heads = family.head_size(layer), family.heads(layer)
                members = [(wrap(m.path), Layout("rows", d, segments=m.segments)) for m in readers]
                members.append((wrap(writer.path), Layout("cols", d)))
                new_group("heads", "head", (heads,), members)
            elif attention != "none":
                for m in [*readers, writer]:
                    lin = wrap(m.path)
                    new_group(m.kind, m.kind, *_matrix_grid(lin, attention, block, f"layer {i} {m.path}"))
            if ffn == "neuron":
                (m,) = family.ffn_readers
                fc1, fc2 = wrap(m.path), wrap(family.ffn_writer.path)
                width = fc2.weight.shape[1]
                members = [(fc1, Layout("rows", segments=m.segments)), (fc2, Layout("cols"))]
                new_group("ffn", "neuron", (width,), members)
            elif ffn != "none":
                for m in [*family.ffn_readers, family.ffn_writer]:
                    lin = wrap(m.path)
                    new_group(m.kind, m.kind, *_matrix_grid(lin, ffn, block, f"layer {i} {m.path}"))
        if not groups:
            raise PipelineError("nothing to mask: both ffn and attention granularities are 'none'")
        return cls(groups, wrappers)

    def to_(self, device: torch.device | str) -> None:
        """Move scores (in place, same Parameter objects) and masks; the wrapped weights move with the model."""
        for g in self.groups:
            g.scores.data = g.scores.data.to(device)
            if g.mask is not None:
                g.mask = g.mask.to(device)

    def state_dict(self) -> dict:
        """Each group's budget and mask (a training checkpoint keeps them; the scores are parameters)."""
        masks = [None if g.mask is None else g.mask.detach().cpu() for g in self.groups]
        return {"keep": [g.keep for g in self.groups], "mask": masks}

    def load_state_dict(self, state: dict) -> None:
        for g, keep, mask in zip(self.groups, state["keep"], state["mask"], strict=True):
            g.keep, g.mask = keep, None if mask is None else mask.to(g.scores.device)

    def named_scores(self) -> list[tuple[str, nn.Parameter]]:
        return [(f"mask_scores.{g.name}", g.scores) for g in self.groups]

    # -- budgets ---------------------------------------------------------------------------------------------

    def allocate(self, keep: float, allocation: Allocation, soft_temperature: float = 1.0) -> None:
        """Set each group's kept fraction for an overall kept fraction `keep` (no masks computed yet).

        "soft" (SMP-S, Eq. 4): within each kind, layer l keeps keep · L · R_l / Σ R, R = mean σ(S/p) — a
        layer's share follows its soft count of kept scores. Shares above 1 keep everything (the surplus is not
        redistributed, as in the authors' code); a kind whose R sums to 0 falls back to `keep`.
        """
        for g in self.groups:
            g.keep = keep
        if allocation != "soft":
            return
        with torch.no_grad():
            for members in self.by_kind().values():
                r = torch.stack([torch.sigmoid(g.scores / soft_temperature).mean() for g in members])
                if float(r.sum()) <= 0:
                    continue
                shares = keep * len(members) * r / r.sum()
                for g, share in zip(members, shares.tolist(), strict=True):
                    g.keep = min(1.0, share)

    def allocate_towards(self, done: float, final_keep: float, cfg: MaskConfig) -> None:
        """The budget `done` (0..1) of the way from everything kept to the final one: the kept fraction
        `final_keep` split by `cfg.allocation`, or with `cfg.shape` each layer's own head and neuron counts."""
        if cfg.shape is None:
            self.allocate(1.0 - done * (1.0 - final_keep), cfg.allocation, cfg.soft_temperature)
            return
        for g in self.groups:
            g.keep = 1.0 - done * (1.0 - _shape_keep(g, cfg.shape))

    def final_keep(self, cfg: MaskConfig, sparsity: float) -> float:
        """The kept fraction of all masked units at the end: 1 - `sparsity`, or what `cfg.shape` keeps."""
        if cfg.shape is None:
            return 1.0 - sparsity
        return sum(_shape_keep(g, cfg.shape) * g.units for g in self.groups) / sum(g.units for g in self.groups)

    def by_kind(self) -> dict[str, list[MaskGroup]]:
        kinds: dict[str, list[MaskGroup]] = {}
        for g in self.groups:
            kinds.setdefault(g.kind, []).append(g)
        return kinds

    # -- masks -----------------------------------------------------------------------------------------------

    def refresh(
        self, allocation: Allocation, scores: dict[str, torch.Tensor] | None = None, ste: bool = False
    ) -> None:
        """Recompute every group's mask from its scores (or the `scores` given per group name).

        Local and soft allocation keep the top `keep` of each group; "type" pools the groups of one kind and
        "global" pools all groups, each keeping the top `keep` of the pool (all groups share one `keep`).
        With `ste`, masks stay in the autograd graph with a straight-through gradient to the scores.
        """

        def score(g: MaskGroup) -> torch.Tensor:
            return g.scores if scores is None else scores[g.name]

        if allocation in ("local", "soft"):
            pools = [[g] for g in self.groups]
        elif allocation == "type":
            pools = list(self.by_kind().values())
        else:
            pools = [self.groups]
        for pool in pools:
            flat = torch.cat([score(g).flatten() for g in pool])
            k = kept_count(flat.numel(), pool[0].keep)
            mask = ste_topk(flat, k) if ste else topk_mask(flat, k)
            for g, part in zip(pool, mask.split([g.units for g in pool]), strict=True):
                g.mask = part.view_as(g.scores)

    def regulariser(self) -> torch.Tensor:
        """SMP's R: the mean over groups of mean σ(S) (the authors' normalisation, which λ=400 assumes)."""
        return torch.stack([torch.sigmoid(g.scores).mean() for g in self.groups]).mean()

    # -- leaving ---------------------------------------------------------------------------------------------

    def detach_(self, model: nn.Module) -> None:
        """Bake every mask into its weights and put plain `nn.Linear`s back; the model is wrapper-free after."""
        layers = encoder_layers(model)
        for key, wrapper in self.wrappers.items():
            i, _, path = key.partition(".")
            layers[int(i)].set_submodule(path, wrapper.bake())
        self.wrappers = {}

    def summary(self) -> dict:
        """Kept units and kept weights per kind, and over all masked weights."""
        kinds = {}
        kept_w = total_w = 0
        for kind, members in self.by_kind().items():
            units = sum(g.units for g in members)
            kept = sum(int(g.mask.sum()) if g.mask is not None else g.units for g in members)
            per_unit = members[0].weights_per_unit()
            kinds[kind] = {"units": units, "kept": kept, "kept_fraction": round(kept / units, 4)}
            kept_w += kept * per_unit
            total_w += units * per_unit
        return {
            "kinds": kinds,
            "masked_weights": total_w,
            "kept_weights": kept_w,
            "kept_fraction": round(kept_w / max(total_w, 1), 4),
        }


def _shape_keep(group: MaskGroup, shape: UnitCounts) -> float:
    """The fraction of a layer's heads or neurons a planned shape keeps."""
    return min(1.0, (shape.heads if group.kind == "head" else shape.ffn) / group.units)


def _matrix_grid(lin: MaskedLinear, granularity: str, block: tuple[int, int], where: str):
    """Score shape and layout of a whole-matrix group (unstructured or block)."""
    out, inp = lin.weight.shape
    if granularity == "unstructured":
        return (out, inp), [(lin, Layout("full"))]
    r, c = block
    if out % r or inp % c:
        raise PipelineError(f"block {r}x{c} does not divide {where} ({out}x{inp})")
    return (out // r, inp // c), [(lin, Layout("blocks", block=(r, c)))]


@dataclass
class PruningRun:
    """What both pruning methods (smp, gmp) start from: the masks on the model, the training steps this data
    gives, the fraction of units kept at the end and the allocation that shares it out."""

    masker: Masker
    steps: int
    final_keep: float
    allocation: Allocation

    @classmethod
    def start(cls, model: nn.Module, cfg: PruningConfig, examples: int) -> PruningRun:
        masker = Masker.from_config(model, cfg.mask)
        final_keep = masker.final_keep(cfg.mask, cfg.sparsity)
        return cls(masker, num_steps(cfg.train, examples), final_keep, cfg.mask.allocation_used)

    def report_into(self, report: dict, **schedule: object) -> None:
        """The masks back on the CPU (they were computed next to the weights), and the schedule and masks kept."""
        self.masker.to_("cpu")
        report["schedule"] = {"steps": self.steps, **schedule}
        report["mask"] = self.masker.summary()

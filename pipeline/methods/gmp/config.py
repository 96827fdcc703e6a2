"""Configuration of GMP*."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, model_validator

from pipeline.config import MaskConfig, MethodConfig, TrainConfig


class GmpConfig(MethodConfig):
    """GMP*: gradual magnitude pruning, cubic schedule with an initial jump, KD, learning-rate re-warming.

    Paper: "GMP*: Well-Tuned Gradual Magnitude Pruning Can Outperform Most BERT-Pruning Methods",
    arXiv 2210.06384. Training runs `train.cycles` back-to-back learning-rate cycles (warm-up + linear decay,
    the paper's repeated 2-epoch schedule): the first cycle is dense, pruning happens between the end of the
    first and the start of the last cycle, and the last cycle trains at a fixed mask. At the first pruning
    step sparsity jumps to `initial_sparsity`, then follows the cubic ramp to `sparsity`, updated every
    `prune_every` steps. Units are ranked by magnitude (mean |w| of the unit's weights after the mask, so a
    pruned weight stays pruned); `local` allocation is the paper's uniform per-matrix sparsity.

    Attributes:
        sparsity: final fraction of units removed (heads and neurons, or weights).
        initial_sparsity: the jump at the first pruning step (the authors used 0.7 for 80-97% targets).
        prune_every: steps between mask updates (the paper: ten per epoch).
        mask: granularities and allocation.
        train: weights' optimiser; KD hardness 1 (`kd_alpha`) at temperature 5.5, as in the paper.
    """

    name: ClassVar[str] = "gmp"

    sparsity: float = Field(0.5, ge=0, lt=1)
    initial_sparsity: float = Field(0.3, ge=0, lt=1)
    prune_every: int = Field(20, ge=1)
    mask: MaskConfig = MaskConfig(allocation="local")
    train: TrainConfig = TrainConfig(
        max_steps=1000, epochs=10, lr=5e-5, warmup_ratio=0.1, cycles=5, kd_alpha=1.0, kd_temperature=5.5
    )

    @model_validator(mode="after")
    def _schedule_fits(self) -> GmpConfig:
        if self.initial_sparsity > self.sparsity:
            raise ValueError(f"initial_sparsity {self.initial_sparsity} is above the target sparsity {self.sparsity}")
        if self.train.cycles < 3:
            raise ValueError("train.cycles must be at least 3: a dense cycle, pruning, and a fixed-mask cycle")
        window = self.train.max_steps - 2 * round(self.train.max_steps / self.train.cycles)
        if self.prune_every > window:
            raise ValueError(
                f"prune_every {self.prune_every} is longer than the pruning window ({window} of train.max_steps "
                f"{self.train.max_steps})"
            )
        return self

    def preflight(self, model_dir: Path, teacher_dir: Path | None, model_config: dict[str, Any], task: str) -> None:
        self.mask.check_shapes(model_config)

"""Configuration of GMP*."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, model_validator

from pipeline.compress.pruning_config import PruningConfig
from pipeline.config.schema import MaskConfig, TrainConfig


class GmpConfig(PruningConfig):
    """GMP*: gradual magnitude pruning, cubic schedule with an initial jump, KD, learning-rate re-warming.

    Paper: "GMP*: Well-Tuned Gradual Magnitude Pruning Can Outperform Most BERT-Pruning Methods",
    arXiv 2210.06384. Training runs `train.cycles` back-to-back learning-rate cycles (warm-up + linear decay,
    the paper's repeated 2-epoch schedule): the first `dense_cycles` are dense, pruning happens from there to
    the start of the last cycle, and the last cycle trains at a fixed mask. At the first pruning
    step sparsity jumps to `initial_sparsity`, then follows the cubic ramp to `sparsity`, updated every
    `prune_every` steps. Units are ranked by magnitude (mean |w| of the unit's weights after the mask, so a
    pruned weight stays pruned); `local` allocation is the paper's uniform per-matrix sparsity.

    Attributes:
        sparsity: final fraction of units removed (heads and neurons, or weights).
        initial_sparsity: the jump at the first pruning step (the authors used 0.7 for 80-97% targets on
            12-layer BERT, 0.3 on 3- and 6-layer models).
        dense_cycles: learning-rate cycles trained before the first pruning step. The paper's dense phase is
            its fine-tuning from the pre-trained model; a student that starts as the fine-tuned teacher can
            set 0 and spend the whole budget pruning and recovering.
        prune_every: steps between mask updates (the paper: ten per epoch).
        mask: granularities and allocation.
        train: weights' optimiser; KD hardness 1 (`kd_alpha`) at temperature 5.5, as in the paper.
    """

    name: ClassVar[str] = "gmp"

    sparsity: float = Field(0.5, ge=0, lt=1)
    initial_sparsity: float = Field(0.3, ge=0, lt=1)
    dense_cycles: int = Field(1, ge=0)
    prune_every: int = Field(20, ge=1)
    mask: MaskConfig = MaskConfig(allocation="local")
    train: TrainConfig = TrainConfig(
        max_steps=1000, epochs=10, lr=5e-5, warmup_ratio=0.1, cycles=5, kd_alpha=1.0, kd_temperature=5.5
    )

    @model_validator(mode="after")
    def _schedule_fits(self) -> GmpConfig:
        if self.initial_sparsity > self.sparsity:
            raise ValueError(f"initial_sparsity {self.initial_sparsity} is above the target sparsity {self.sparsity}")
        if self.train.cycles < self.dense_cycles + 2:
            raise ValueError(
                f"train.cycles must be at least dense_cycles + 2 = {self.dense_cycles + 2}: "
                "the dense cycles, at least one of pruning, and a fixed-mask cycle"
            )
        window = self.train.max_steps - (self.dense_cycles + 1) * round(self.train.max_steps / self.train.cycles)
        if self.prune_every > window:
            raise ValueError(
                f"prune_every {self.prune_every} is longer than the pruning window ({window} of train.max_steps "
                f"{self.train.max_steps})"
            )
        return self

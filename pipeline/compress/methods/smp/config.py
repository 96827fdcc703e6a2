"""Configuration of Static Model Pruning."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from pipeline.compress.pruning_config import PruningConfig
from pipeline.config.schema import MaskConfig, TrainConfig
from pipeline.data.tasks import TaskSpec


class SmpConfig(PruningConfig):
    """SMP: frozen weights; only mask scores train, through a straight-through top-v mask (SMP-L / SMP-S).

    Paper: "Pruning Pre-trained Language Models Without Fine-Tuning", arXiv 2210.06210. The kept fraction
    follows the cubic schedule from 1 to 1 - `sparsity` over `prune_steps` steps (no warm-up), then holds; the
    loss adds λ_t · R(S), R = mean over score tensors of mean σ(S) (the authors' normalisation, which λ = 400
    assumes), with λ_t = λ · s_t / s_f ramping along the sparsity schedule (the paper's Eq. 6).

    Attributes:
        sparsity: fraction of units removed: heads and FFN neurons (structured) or weights (unstructured).
        mask: granularities and allocation; `soft` is SMP-S, `local` is SMP-L.
        prune_steps: steps of the cubic ramp (N); None: 70% of the training steps, the rest at fixed sparsity.
        reg_lambda: λ of the score regulariser (the paper's 400).
        head: `verbalizer` (label words through the base model's MLM head, frozen; SMP then starts from the
            pre-trained weights, as in the paper), `classifier` (start from the fine-tuned teacher, its
            classifier frozen), or `auto` (verbalizer when the base model ships an MLM head).
        label_words: one word per label for the verbalizer; None: the task's defaults.
        recover_steps: after the mask is final, train the surviving weights this many steps at the fixed mask
            (with the same KD); not part of SMP, which never touches the weights (0: pure SMP). Structured masks
            remove whole heads and neurons, which frozen weights cannot compensate for; the authors name this
            limit of SMP themselves.
        recover_lr: learning rate of that recovery (10% warm-up, linear decay, weight decay 0.01).
        train: the score optimiser (the authors': lr 2e-2, linear decay, no warm-up, no weight decay) and KD
            (0.5 · T²·KL(teacher ‖ student) at T = 2 + 0.5 · CE, as in their code).
    """

    name: ClassVar[str] = "smp"
    PHASE_STEPS: ClassVar[tuple[str, ...]] = ("recover_steps",)

    sparsity: float = Field(0.5, ge=0, lt=1)
    mask: MaskConfig = MaskConfig(allocation="soft")
    prune_steps: int | None = Field(None, ge=1)
    reg_lambda: float = Field(400.0, ge=0)
    head: Literal["auto", "classifier", "verbalizer"] = "auto"
    label_words: list[str] | None = None
    recover_steps: int = Field(0, ge=0)
    recover_lr: float = Field(5e-5, gt=0)
    train: TrainConfig = TrainConfig(
        max_steps=600, epochs=3, lr=2e-2, warmup_ratio=0.0, weight_decay=0.0, kd_alpha=0.5, kd_temperature=2.0
    )

    @model_validator(mode="after")
    def _schedule_fits(self) -> SmpConfig:
        if self.prune_steps is not None and self.prune_steps > self.train.max_steps:
            raise ValueError(
                f"prune_steps {self.prune_steps} is longer than the training budget "
                f"(train.max_steps {self.train.max_steps})"
            )
        return self

    def preflight(
        self, model_dir: Path, teacher_dir: Path | None, model_config: dict[str, Any], task: TaskSpec
    ) -> None:
        super().preflight(model_dir, teacher_dir, model_config, task)
        from pipeline.compress.methods.smp.heads import resolve_head

        resolve_head(self, model_dir, model_config, task)  # the verbalizer's words must be single tokens

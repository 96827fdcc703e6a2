"""Configuration of MLP Fusion."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from pipeline.config.schema import MethodConfig, TrainConfig


class MlpFusionConfig(MethodConfig):
    """MLP Fusion: k-means over FFN neurons, cluster means, and a constant per-cluster scaling P.

    Paper: "MLP Fusion: Towards Efficient Fine-tuning of Dense and Mixture-of-Experts Language Models",
    arXiv 2307.08941. Each neuron i is the point [W1 row i, b1_i, W2 column i]; the c cluster means replace
    the neurons, and P = diag(cluster sizes) multiplies the activations as a non-trainable constant, so Adam
    trains the fused MLP exactly like the full-width MLP of replicated centroids. Compaction folds P into W2.

    Attributes:
        ratio: fused width / original width, in (0, 1]; 0.25 is the paper's 3072 -> 768.
        layers: indices of the layers to fuse; None fuses the top two thirds (the paper: last 8 of 12).
        n_init: k-means restarts (best objective kept); the paper's code uses 30.
        max_iter: Lloyd iterations per restart.
        seed: k-means seed.
        tune_steps: layer-wise task-specific tuning steps before task training: MSE between every layer's
            output and the teacher's on unlabeled training inputs, updating only the fused MLPs (0: skip).
        tune_lr: learning rate of that tuning (the paper's code uses the fine-tuning rate).
        train: task training of the whole fused model (P stays constant), with KD from the teacher.
    """

    name: ClassVar[str] = "mlp_fusion"
    PHASE_STEPS: ClassVar[tuple[str, ...]] = ("tune_steps",)

    ratio: float = Field(0.25, gt=0, le=1)
    layers: list[int] | None = None
    n_init: int = Field(3, ge=1)
    max_iter: int = Field(100, ge=1)
    seed: int = 0
    tune_steps: int = Field(60, ge=0)
    tune_lr: float = Field(5e-5, gt=0)
    train: TrainConfig = TrainConfig(max_steps=300, epochs=3, lr=5e-5, kd_alpha=0.5, kd_temperature=2.0)

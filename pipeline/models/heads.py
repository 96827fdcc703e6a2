"""The verbalizer task head's modules: label-word logits through a pre-trained MLM transform, as a classifier.

SMP builds this head (`pipeline.compress.methods.smp.verbalizer`); any saved model whose config says
`classifier_head = "verbalizer"` needs these modules installed before its strict load (`pipeline.models.io`).
BERT: the pooler slot holds the MLM transform and `classifier` the label-word rows; RoBERTa: `classifier`
becomes transform + `out_proj`. The modules differ from the stock head (a LayerNorm, no tanh), so plain
`from_pretrained` would drop the LayerNorm keys with a warning and silently use the stock head.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from pipeline.errors import PipelineError
from pipeline.models.families import mlm_layout, mlm_model_types

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

HEAD_NAME = "verbalizer"


def _activation(config: PretrainedConfig) -> nn.Module:
    """The MLM transform's activation: BERT uses `hidden_act`, RoBERTa's LM head hard-codes (erf) GELU.

    Activations carry no weights, so building and reloading must pick the same one from the config alone.
    """
    from transformers.activations import ACT2FN

    return ACT2FN[config.hidden_act if mlm_layout(config.model_type) == "bert" else "gelu"]


class VerbalizerPooler(nn.Module):
    """The MLM transform at the first token: `LayerNorm(act(dense(h[:, 0])))` (BERT's pooler slot)."""

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = _activation(config)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.act(self.dense(hidden_states[:, 0])))


class VerbalizerClassificationHead(VerbalizerPooler):
    """RoBERTa's `classifier` slot (it receives the whole sequence): the transform, then the label-word rows."""

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__(config)
        self.out_proj = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, features: torch.Tensor, **kwargs) -> torch.Tensor:
        return self.out_proj(super().forward(features))


def _check_type(config: PretrainedConfig) -> None:
    if mlm_layout(config.model_type) is None:
        supported = ", ".join(mlm_model_types())
        raise PipelineError(f"the verbalizer head supports {supported}, not {config.model_type!r}")


def install_verbalizer_(model: PreTrainedModel) -> None:
    """Swap the verbalizer modules (uninitialised) into a freshly built classifier, so a saved one loads strictly.

    Returns:
        None; the head modules that `build_verbalizer_classifier` fills are now in place, at the same shapes.
    """
    config = model.config
    _check_type(config)
    dtype = next(model.parameters()).dtype
    if mlm_layout(config.model_type) == "bert":
        model.base_model.pooler = VerbalizerPooler(config).to(dtype)  # `classifier` is already hidden → labels
    else:
        model.classifier = VerbalizerClassificationHead(config).to(dtype)


def head_modules(model: PreTrainedModel) -> tuple[VerbalizerPooler, nn.Linear]:
    """The installed transform and its label-word Linear."""
    if mlm_layout(model.config.model_type) == "bert":
        return model.base_model.pooler, model.classifier
    return model.classifier, model.classifier.out_proj

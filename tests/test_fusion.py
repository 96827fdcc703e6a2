"""MLP Fusion invariants: k = width is the identity; standalone P trains exactly like replicated neurons."""

import copy

import pytest
import torch
from torch import nn

from pipeline.compress.methods.mlp_fusion.config import MlpFusionConfig
from pipeline.compress.methods.mlp_fusion.stage import fuse_, fused_layers, layerwise_mse
from pipeline.errors import PipelineError
from pipeline.models.layers import ScaledLinear, encoder_layers, ffn_widths
from tests.helpers import tiny_model


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 300, (3, 10), generator=g)
    mask = torch.ones_like(ids)
    mask[0, 6:] = 0
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_full_width_fusion_is_identity(family):
    model = tiny_model(family)
    before = model(**_inputs()).logits
    report = fuse_(model, MlpFusionConfig(ratio=1.0))
    after = model(**_inputs()).logits
    assert report["widths"] == {0: 64, 1: 64}
    for layer in encoder_layers(model):
        assert torch.equal(layer.output.dense.scale, torch.ones(64))  # every cluster is one neuron
    assert torch.allclose(before, after, atol=1e-5)


def test_fusion_shrinks_only_chosen_layers():
    model = tiny_model("bert", layers=3)
    report = fuse_(model, MlpFusionConfig(ratio=0.25, layers=[1]))
    assert ffn_widths(model) == [64, 16, 64]
    assert isinstance(encoder_layers(model)[1].output.dense, ScaledLinear)
    assert int(encoder_layers(model)[1].output.dense.scale.sum()) == 64  # cluster sizes add up to the old width
    assert report["layers"] == [1]


def test_default_layers_are_top_two_thirds():
    assert fused_layers(MlpFusionConfig(), 6) == [2, 3, 4, 5]
    assert fused_layers(MlpFusionConfig(), 12) == list(range(4, 12))
    with pytest.raises(PipelineError, match="distinct indices"):
        fused_layers(MlpFusionConfig(layers=[0, 6]), 6)


def test_standalone_p_trains_like_replicated_full_width_mlp():
    """Adam is invariant to a per-coordinate gradient scale, so the fused MLP with constant P follows the same
    function-space trajectory as the full-width MLP whose neurons are copies of their cluster's centroid."""
    torch.manual_seed(0)
    d, width, k = 6, 12, 4
    labels = torch.arange(width) % k
    labels[:3] = 0  # uneven cluster sizes: 4, 2, 3, 3
    counts = torch.bincount(labels, minlength=k).double()
    w1, b1, w2 = (
        torch.randn(k, d, dtype=torch.float64),
        torch.randn(k, dtype=torch.float64),
        torch.randn(d, k, dtype=torch.float64),
    )
    b2 = torch.randn(d, dtype=torch.float64)

    fc1, fc2 = nn.Linear(d, k).double(), nn.Linear(k, d).double()
    with torch.no_grad():
        fc1.weight.copy_(w1), fc1.bias.copy_(b1), fc2.weight.copy_(w2), fc2.bias.copy_(b2)
    fused = nn.Sequential(fc1, nn.GELU(), ScaledLinear(fc2, counts))

    rep1, rep2 = nn.Linear(d, width).double(), nn.Linear(width, d).double()
    with torch.no_grad():  # replicate every centroid to each member neuron (untied copies)
        (
            rep1.weight.copy_(w1[labels]),
            rep1.bias.copy_(b1[labels]),
            rep2.weight.copy_(w2[:, labels]),
            rep2.bias.copy_(b2),
        )
    replicated = nn.Sequential(rep1, nn.GELU(), rep2)

    fc1b, fc2b = copy.deepcopy(fc1), copy.deepcopy(fc2)
    with torch.no_grad():  # the "clustering" variant: P folded into W2 before training
        fc2b.weight.mul_(counts)
    folded = nn.Sequential(fc1b, nn.GELU(), fc2b)

    x, target = torch.randn(32, d, dtype=torch.float64), torch.randn(32, d, dtype=torch.float64)
    models = (fused, replicated, folded)
    assert torch.allclose(fused(x), replicated(x), atol=1e-12)
    assert torch.allclose(folded(x), replicated(x), atol=1e-12)  # same forward pass...
    opts = [torch.optim.Adam(m.parameters(), lr=1e-2, eps=1e-30) for m in models]
    for _ in range(100):
        for m, opt in zip(models, opts, strict=True):
            opt.zero_grad()
            ((m(x) - target) ** 2).mean().backward()
            opt.step()
    assert torch.allclose(fused(x), replicated(x), atol=1e-8)
    assert (folded(x) - replicated(x)).abs().max() > 1e-2  # ...but different training dynamics


def test_layerwise_mse_is_zero_against_itself_and_positive_after_fusion():
    teacher = tiny_model("bert")
    student = copy.deepcopy(teacher)
    loss_fn = layerwise_mse(teacher)
    batch = _inputs()
    assert loss_fn(student, batch).item() == pytest.approx(0.0, abs=1e-10)
    fuse_(student, MlpFusionConfig(ratio=0.25))
    assert loss_fn(student, batch).item() > 0

"""Compaction is exact and reloads at real per-layer widths without silent re-initialisation."""

import json

import pytest
import torch

from pipeline.compaction import compact_
from pipeline.errors import PipelineError
from pipeline.methods.mlp_fusion.config import MlpFusionConfig
from pipeline.methods.mlp_fusion.stage import fuse_
from pipeline.modeling import encoder_layers, ffn_widths, load_model, save_model
from pipeline.testing import tiny_model

ATOL = 1e-5  # the design's compaction bar


def _logits(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 300, (4, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits


@pytest.mark.parametrize("kind", ["bert", "roberta"])
@pytest.mark.parametrize("ratio", [0.25, 0.5])
def test_fold_scale_is_exact_and_reloads(kind, ratio, tmp_path):
    model = tiny_model(kind, layers=3)
    fuse_(model, MlpFusionConfig(ratio=ratio, layers=[0, 2]))
    before = _logits(model)
    report = compact_(model)
    assert report["folded_scale_layers"] == [0, 2]
    assert (before - _logits(model)).abs().max() <= ATOL
    save_model(model, None, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    width = round(64 * ratio)
    assert cfg["intermediate_sizes"] == [width, 64, width] and cfg["layer_heads"] == [2, 2, 2]
    reloaded = load_model(tmp_path)
    assert ffn_widths(reloaded) == [width, 64, width]
    assert torch.equal(_logits(reloaded), _logits(model))


def test_uncompacted_fused_model_round_trips_with_its_scale(tmp_path):
    model = tiny_model("bert")
    fuse_(model, MlpFusionConfig(ratio=0.25))
    save_model(model, None, tmp_path)
    reloaded = load_model(tmp_path)
    assert torch.equal(encoder_layers(reloaded)[0].intermediate.scale, encoder_layers(model)[0].intermediate.scale)
    assert torch.equal(_logits(reloaded), _logits(model))


@pytest.mark.parametrize("kind", ["bert", "roberta"])
def test_dead_neurons_are_removed_exactly(kind):
    model = tiny_model(kind, layers=3)
    layers = encoder_layers(model)
    with torch.no_grad():
        layers[0].output.dense.weight[:, :10] = 0  # silent neurons: no output weight
        layers[0].intermediate.dense.weight[10:20] = 0  # constant neurons: act(b1) * W2 column goes into b2
        layers[1].output.dense.weight.zero_()  # a layer with every FFN neuron removed
    before = _logits(model)
    report = compact_(model)
    assert report["removed_ffn_neurons"] == [20, 64, 0]
    assert ffn_widths(model) == [44, 0, 64]
    assert (before - _logits(model)).abs().max() <= ATOL


def test_zero_width_layer_saves_and_reloads(tmp_path):
    model = tiny_model("bert")
    with torch.no_grad():
        encoder_layers(model)[1].output.dense.weight.zero_()
    compact_(model)
    save_model(model, None, tmp_path)
    reloaded = load_model(tmp_path)
    assert ffn_widths(reloaded) == [64, 0]
    assert torch.equal(_logits(reloaded), _logits(model))


def test_plain_transformers_refuses_compacted_folder_loudly(tmp_path):
    """Without our loader, transformers fails on the shrunk layers instead of loading something wrong."""
    from transformers import AutoModelForSequenceClassification

    model = tiny_model("bert")
    fuse_(model, MlpFusionConfig(ratio=0.25, layers=[0]))  # widths [16, 64]: no single intermediate_size fits
    compact_(model)
    save_model(model, None, tmp_path)
    with pytest.raises(RuntimeError, match="size mismatch"):
        AutoModelForSequenceClassification.from_pretrained(tmp_path)


def test_declared_widths_that_disagree_with_weights_fail(tmp_path):
    model = tiny_model("bert")
    save_model(model, None, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["intermediate_sizes"] = [32, 64]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(PipelineError, match="disagrees with the weights"):
        load_model(tmp_path)


def test_fewer_heads_reload_at_their_size(tmp_path):
    """Per-layer head counts (for the pruning methods) reload without prune_heads."""
    from pipeline.modeling import head_counts, resize_heads_

    model = tiny_model("bert")
    layer = encoder_layers(model)[0]
    old_q = layer.attention.self.query.weight.detach().clone()
    resize_heads_(layer, 1)
    torch.manual_seed(1)
    for lin in (layer.attention.self.query, layer.attention.self.key, layer.attention.self.value, layer.attention.output.dense):
        torch.nn.init.normal_(lin.weight, std=0.2)
    assert old_q.shape[0] == 32 and layer.attention.self.query.weight.shape[0] == 16
    save_model(model, None, tmp_path)
    reloaded = load_model(tmp_path)
    assert head_counts(reloaded) == [1, 2]
    assert torch.equal(_logits(reloaded), _logits(model))

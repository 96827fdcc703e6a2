"""Compaction is exact and reloads at real per-layer widths without silent re-initialisation."""

import json

import pytest
import torch

from export.attention_graph import eager_attention
from export.releases import transformers_5
from pipeline.compress.compaction import compact_
from pipeline.compress.methods.mlp_fusion.config import MlpFusionConfig
from pipeline.compress.methods.mlp_fusion.stage import fuse_
from pipeline.errors import PipelineError
from pipeline.models.io import load_model, save_model
from pipeline.models.layers import HeadlessAttention, encoder_layers, ffn_widths, head_counts
from tests.helpers import sample_logits, tiny_model

ATOL = 1e-5  # the design's compaction bar


@pytest.mark.parametrize("family", ["bert", "roberta"])
@pytest.mark.parametrize("ratio", [0.25, 0.5])
def test_fold_scale_is_exact_and_reloads(family, ratio, tmp_path):
    model = tiny_model(family, layers=3)
    fuse_(model, MlpFusionConfig(ratio=ratio, layers=[0, 2]))
    before = sample_logits(model)
    report = compact_(model)
    assert report["folded_scale_layers"] == [0, 2]
    assert (before - sample_logits(model)).abs().max() <= ATOL
    save_model(model, None, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    width = round(64 * ratio)
    assert cfg["intermediate_sizes"] == [width, 64, width] and cfg["layer_heads"] == [2, 2, 2]
    reloaded = load_model(tmp_path)
    assert ffn_widths(reloaded) == [width, 64, width]
    assert torch.equal(sample_logits(reloaded), sample_logits(model))


def test_uncompacted_fused_model_round_trips_with_its_scale(tmp_path):
    model = tiny_model("bert")
    fuse_(model, MlpFusionConfig(ratio=0.25))
    save_model(model, None, tmp_path)
    reloaded = load_model(tmp_path)
    assert torch.equal(encoder_layers(reloaded)[0].output.dense.scale, encoder_layers(model)[0].output.dense.scale)
    assert torch.equal(sample_logits(reloaded), sample_logits(model))


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_dead_neurons_are_removed_exactly(family):
    model = tiny_model(family, layers=3)
    layers = encoder_layers(model)
    with torch.no_grad():
        layers[0].output.dense.weight[:, :10] = 0  # silent neurons: no output weight
        layers[0].intermediate.dense.weight[10:20] = 0  # constant neurons: act(b1) * W2 column goes into b2
        layers[1].output.dense.weight.zero_()  # a layer with every FFN neuron removed
    before = sample_logits(model)
    report = compact_(model)
    assert report["removed_ffn_neurons"] == [20, 64, 0]
    assert ffn_widths(model) == [44, 0, 64]
    assert (before - sample_logits(model)).abs().max() <= ATOL


def test_zero_width_layer_saves_and_reloads(tmp_path):
    model = tiny_model("bert")
    with torch.no_grad():
        encoder_layers(model)[1].output.dense.weight.zero_()
    compact_(model)
    save_model(model, None, tmp_path)
    reloaded = load_model(tmp_path)
    assert ffn_widths(reloaded) == [64, 0]
    assert torch.equal(sample_logits(reloaded), sample_logits(model))


def test_plain_transformers_refuses_compacted_folder_loudly(tmp_path):
    """Without our loader, transformers fails on the shrunk layers instead of loading something wrong."""
    from transformers import AutoModelForSequenceClassification

    model = tiny_model("bert")
    fuse_(model, MlpFusionConfig(ratio=0.25, layers=[0]))  # widths [16, 64]: no single intermediate_size fits
    compact_(model)
    save_model(model, None, tmp_path)
    with pytest.raises(RuntimeError, match=r"size mismatch|ignore_mismatched_sizes"):  # 4.x | 5.x's words
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
    from pipeline.models.families import family_of
    from pipeline.models.layers import resize_heads_

    model = tiny_model("bert")
    layer = encoder_layers(model)[0]
    old_q = layer.attention.self.query.weight.detach().clone()
    resize_heads_(family_of(model), layer, 1)
    torch.manual_seed(1)
    att = layer.attention
    for lin in (att.self.query, att.self.key, att.self.value, att.output.dense):
        torch.nn.init.normal_(lin.weight, std=0.2)
    assert old_q.shape[0] == 32 and layer.attention.self.query.weight.shape[0] == 16
    save_model(model, None, tmp_path)
    reloaded = load_model(tmp_path)
    assert head_counts(reloaded) == [1, 2]
    assert torch.equal(sample_logits(reloaded), sample_logits(model))


# Attention heads. tiny_model(heads=4): head h is rows h*8..(h+1)*8 of W_Q/W_K/W_V and those columns of W_O.
D = 8


def _rows(h: int) -> slice:
    return slice(h * D, (h + 1) * D)


def _silence(layer, *heads):
    """Zero the heads' W_O columns: they contribute nothing."""
    for h in heads:
        layer.attention.output.dense.weight[:, _rows(h)] = 0


def _constant(layer, *heads, seed=0):
    """Zero the heads' W_V rows and give them a clearly nonzero b_V: each then outputs exactly b_V[h]."""
    g = torch.Generator().manual_seed(seed)
    value = layer.attention.self.value
    for h in heads:
        value.weight[_rows(h)] = 0
        value.bias[_rows(h)] = torch.randn(D, generator=g)


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_silent_heads_are_removed_exactly(family, tmp_path):
    model = tiny_model(family, layers=3, heads=4)
    layers = encoder_layers(model)
    kept_q = torch.cat([layers[0].attention.self.query.weight[_rows(h)] for h in (0, 2)]).clone()
    with torch.no_grad():
        _silence(layers[0], 1, 3)
        _silence(layers[2], 0)
    before = sample_logits(model)
    report = compact_(model)
    assert report["heads_before"] == [4, 4, 4]
    assert report["heads"] == head_counts(model) == [2, 4, 3] and report["removed_heads"] == [2, 0, 1]
    assert torch.equal(layers[0].attention.self.query.weight, kept_q)  # the right heads survive, in order
    assert layers[0].attention.self.all_head_size == 16 and layers[0].attention.output.dense.in_features == 16
    assert (before - sample_logits(model)).abs().max() <= ATOL
    save_model(model, None, tmp_path)
    reloaded = load_model(tmp_path)
    assert head_counts(reloaded) == [2, 4, 3]
    assert torch.equal(sample_logits(reloaded), sample_logits(model))


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_constant_value_heads_fold_into_output_bias(family):
    """Zero W_V rows with nonzero b_V: removable only with W_O b_V folded into b_O (inputs are padded)."""
    model = tiny_model(family, layers=3, heads=4)
    layers = encoder_layers(model)
    with torch.no_grad():
        _constant(layers[0], 0, 2)
        _constant(layers[1], 3, seed=1)
    bias = layers[0].attention.output.dense.bias.clone()
    before = sample_logits(model)
    report = compact_(model)
    assert report["heads"] == [2, 3, 4] and report["removed_heads"] == [2, 1, 0]
    assert (layers[0].attention.output.dense.bias - bias).abs().max() > 0.1  # a real fold, not a no-op
    assert (before - sample_logits(model)).abs().max() <= ATOL


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_headless_and_zero_width_layers_save_and_reload_exactly(family, tmp_path):
    model = tiny_model(family, layers=3, heads=4)
    layers = encoder_layers(model)
    with torch.no_grad():
        _silence(layers[0], 0, 1)
        _constant(layers[0], 2, 3)  # layer 0: no head left; its output is LayerNorm(b_O + folded b_V + x)
        layers[1].output.dense.weight.zero_()  # layer 1: no FFN neuron left
        _constant(layers[2], 1)
    before = sample_logits(model)
    report = compact_(model)
    assert report["heads"] == [0, 4, 3] and report["removed_heads"] == [4, 0, 1]
    assert report["ffn_widths"] == [64, 0, 64]
    assert isinstance(layers[0].attention, HeadlessAttention)
    assert (before - sample_logits(model)).abs().max() <= ATOL

    save_model(model, None, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["layer_heads"] == [0, 4, 3] and cfg["intermediate_sizes"] == [64, 0, 64]
    reloaded = load_model(tmp_path)
    assert isinstance(encoder_layers(reloaded)[0].attention, HeadlessAttention)
    assert head_counts(reloaded) == [0, 4, 3] and ffn_widths(reloaded) == [64, 0, 64]
    assert torch.equal(sample_logits(reloaded), sample_logits(model))
    prefix = f"{model.base_model_prefix}.encoder.layer.0.attention"
    assert {k for k in reloaded.state_dict() if k.startswith(prefix)} == {
        f"{prefix}.output.dense.bias",
        f"{prefix}.output.LayerNorm.weight",
        f"{prefix}.output.LayerNorm.bias",
    }

    # the config must agree with the weights about the headless layer too
    cfg["layer_heads"] = [4, 4, 3]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(PipelineError, match="disagrees with the weights"):
        load_model(tmp_path)


def test_headless_layer_answers_like_bert_attention():
    """output_attentions yields None for the headless layer (transformers 5 records attentions only where an
    attention module computes them, so it leaves the layer out); in training, gradients reach its bias."""
    model = tiny_model("bert", heads=4)
    with torch.no_grad():
        _silence(encoder_layers(model)[1], 0, 1, 2, 3)
    compact_(model)
    ids = torch.randint(5, 300, (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), eager_attention(model):  # 5.x's default SDPA attention returns no weights
        out = model(input_ids=ids, output_attentions=True)
    assert out.attentions[0].shape == (2, 4, 6, 6) and out.attentions[1:] == (() if transformers_5() else (None,))
    model.train()
    model(input_ids=ids, labels=torch.tensor([0, 1])).loss.backward()
    assert encoder_layers(model)[1].attention.output.dense.bias.grad.abs().sum() > 0


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_head_with_only_empty_query_is_kept(family):
    """Zero W_Q rows with nonzero b_Q still give key-dependent attention: the head is not constant."""
    model = tiny_model(family, layers=3, heads=4)
    q = encoder_layers(model)[0].attention.self.query
    with torch.no_grad():
        q.weight[_rows(1)] = 0
        q.bias[_rows(1)] = torch.randn(D, generator=torch.Generator().manual_seed(0))
    before = sample_logits(model)
    report = compact_(model)
    assert report["heads"] == [4, 4, 4] and report["removed_heads"] == [0, 0, 0]
    assert torch.equal(before, sample_logits(model))


def test_saving_a_model_draws_no_progress_bar(tmp_path, capfd):
    """transformers 5 draws a bar for every save_pretrained; the pipeline's saves keep the stages' logs clean."""
    model = tiny_model("bert")
    capfd.readouterr()
    save_model(model, None, tmp_path / "m")
    assert "Writing model shards" not in capfd.readouterr().err

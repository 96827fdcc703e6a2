"""The mask mechanism, the schedules and the budget splits, against hand-computed values."""

import math

import pytest
import torch
from torch import nn

from pipeline.compress.masking import MaskedLinear, Masker
from pipeline.compress.methods.gmp.config import GmpConfig
from pipeline.compress.methods.gmp.stage import prune_schedule
from pipeline.compress.methods.smp.config import SmpConfig
from pipeline.compress.selection import cubic, kept_count, ste_topk, topk_mask
from pipeline.config.schema import MaskConfig, TrainConfig
from pipeline.errors import PipelineError
from pipeline.models.layers import encoder_layers
from pipeline.train.loop import lr_factor
from tests.helpers import tiny_model


def test_cubic_schedule_hand_values():
    # SMP: kept fraction 1 -> 0.1 over N steps: k_t = k_f + (1 - k_f)(1 - t/N)^3.
    assert cubic(0.0, 1.0, 0.1) == 1.0
    assert cubic(0.5, 1.0, 0.1) == pytest.approx(0.1 + 0.9 * 0.125)  # 0.2125
    assert cubic(1.0, 1.0, 0.1) == 0.1 and cubic(3.0, 1.0, 0.1) == 0.1  # holds after N
    # GMP*: 100 steps in 5 cycles -> dense [0, 20), pruning at 20, 40, 60, 80, fixed after 80.
    cfg = GmpConfig(sparsity=0.9, initial_sparsity=0.7, prune_every=20, train=TrainConfig(max_steps=100, cycles=5))
    sched = prune_schedule(cfg, 100)
    assert list(sched) == [20, 40, 60, 80]
    assert [round(v, 5) for v in sched.values()] == [
        0.7,
        round(0.9 - 0.2 * (2 / 3) ** 3, 5),
        round(0.9 - 0.2 / 27, 5),
        0.9,
    ]
    # Starting from the fine-tuned teacher, no dense cycle: 100 steps in 2 cycles -> pruning at 0, 20, 40, 50
    # (cubic 0.9 - 0.6 (1 - t/50)^3: 0.3, 0.9 - 0.6 * 0.216, 0.9 - 0.6 * 0.008, 0.9), fixed after 50.
    cfg = GmpConfig(sparsity=0.9, initial_sparsity=0.3, dense_cycles=0, train=TrainConfig(max_steps=100, cycles=2))
    sched = prune_schedule(cfg, 100)
    assert list(sched) == [0, 20, 40, 50]
    assert [round(v, 5) for v in sched.values()] == [0.3, 0.7704, 0.8952, 0.9]


def test_learning_rate_rewarms_every_cycle():
    # 20 steps, 2 cycles, no warm-up: linear decay 1.0 -> 0.1 twice.
    assert [round(lr_factor(s, 20, 0.0, 2), 3) for s in range(20)] == [round(1 - i / 10, 3) for i in range(10)] * 2
    # one cycle with warm-up is the usual schedule
    assert (
        lr_factor(0, 20, 0.1, 1) == 0.5
        and lr_factor(1, 20, 0.1, 1) == 1.0
        and lr_factor(19, 20, 0.1, 1) == pytest.approx(1 / 18)
    )


def test_topk_mask_is_exact_with_ties_and_straight_through():
    assert topk_mask(torch.tensor([3.0, 1.0, 2.0, 2.0, 0.0]), 3).tolist() == [1, 0, 1, 1, 0]
    assert topk_mask(torch.zeros(4), 2).tolist() == [1, 1, 0, 0]  # ties: lowest indices, exactly k
    assert kept_count(12, 0.5) == 6 and kept_count(10, 0.3) == 3 and kept_count(10, 0.0) == 0
    s = torch.tensor([0.5, -1.0, 2.0], requires_grad=True)
    w = torch.tensor([10.0, 20.0, 30.0])
    m = ste_topk(s, 2)
    assert m.tolist() == [1, 0, 1]
    (m * w).sum().backward()
    assert s.grad.tolist() == [10.0, 20.0, 30.0]  # ∂L/∂S := ∂L/∂M, pruned entries included


def test_smp_s_budget_split_hand_values():
    model = tiny_model("bert", layers=3)
    masker = Masker.attach(model, ffn="neuron", attention="none")
    with torch.no_grad():  # σ(0) = 0.5, σ(ln 3) = 0.75, σ(-ln 3) = 0.25  ->  R sums to 1.5
        for g, v in zip(masker.groups, [0.0, math.log(3), -math.log(3)], strict=True):
            g.scores.fill_(v)
    masker.allocate(0.5, "soft")  # k_l = 0.5 * 3 * R_l / 1.5
    assert [round(g.keep, 6) for g in masker.groups] == [0.5, 0.75, 0.25]
    masker.allocate(0.8, "soft")  # 0.8 * 3 * 0.75 / 1.5 = 1.2 keeps everything; no redistribution
    assert [round(g.keep, 6) for g in masker.groups] == [0.8, 1.0, 0.4]
    masker.allocate(0.5, "local")
    assert [g.keep for g in masker.groups] == [0.5, 0.5, 0.5]


def test_gmp_uniform_sparsity_per_matrix_by_magnitude():
    model = tiny_model("bert", layers=2)
    masker = Masker.attach(model, ffn="unstructured", attention="unstructured")
    q = encoder_layers(model)[0].attention.self.query
    with torch.no_grad():
        q.weight.copy_(torch.arange(q.weight.numel(), dtype=torch.float32).view_as(q.weight) - 500)
    masker.allocate(0.25, "local")
    masker.refresh("local", scores={g.name: g.magnitude() for g in masker.groups})
    masker.detach_(model)
    for layer in encoder_layers(model):
        for lin in (
            layer.attention.self.query,
            layer.attention.self.key,
            layer.attention.self.value,
            layer.attention.output.dense,
            layer.intermediate.dense,
            layer.output.dense,
        ):
            assert type(lin) is nn.Linear
            assert int((lin.weight != 0).sum()) == math.floor(0.25 * lin.weight.numel())  # same sparsity everywhere
    # w_i = i - 500 over 1024 entries: 255 entries have |w| >= 385 (i <= 115 or i >= 885); the 256th slot goes
    # to the lower-index of the two |w| = 384 ties, i = 116.
    flat = encoder_layers(model)[0].attention.self.query.weight.flatten()
    kept = set(torch.nonzero(flat).squeeze(1).tolist())
    assert kept == set(range(0, 117)) | set(range(885, 1024))


def test_structured_masks_gate_rows_columns_and_blocks():
    model = tiny_model("bert", layers=1)
    masker = Masker.attach(model, ffn="neuron", attention="head")
    heads, ffn = masker.groups
    heads.mask = torch.tensor([1.0, 0.0])
    ffn.mask = (torch.arange(64) % 2).float()
    layer = encoder_layers(model)[0]
    assert isinstance(layer.attention.self.value, MaskedLinear)
    masker.detach_(model)
    att, d = layer.attention.self, 16
    for lin in (att.query, att.key, att.value):
        assert lin.weight[d:].abs().sum() == 0 and (lin.weight[:d] != 0).all()
    assert layer.attention.output.dense.weight[:, d:].abs().sum() == 0
    assert (
        layer.intermediate.dense.weight[0::2].abs().sum() == 0 and layer.output.dense.weight[:, 0::2].abs().sum() == 0
    )
    assert not any(isinstance(m, MaskedLinear) for m in model.modules())

    model = tiny_model("bert", layers=1)
    masker = Masker.attach(model, ffn="block", attention="none", block=(16, 8))
    assert [tuple(g.scores.shape) for g in masker.groups] == [(4, 4), (2, 8)]  # 64x32 and 32x64 in 16x8 tiles
    with pytest.raises(PipelineError, match="block 16x24 does not divide"):
        Masker.attach(tiny_model("bert", layers=1), ffn="block", attention="none", block=(16, 24))


def test_type_and_global_allocation_pool_layers():
    model = tiny_model("bert", layers=2)
    masker = Masker.attach(model, ffn="neuron", attention="head")
    with torch.no_grad():
        for g in masker.groups:
            g.scores.copy_(torch.arange(g.units, dtype=torch.float32) + (100 if g.layer == 1 else 0))
    masker.allocate(0.5, "type")
    masker.refresh("type")
    by = {g.name: int(g.mask.sum()) for g in masker.groups}
    assert by == {"0.heads": 0, "1.heads": 2, "0.ffn": 0, "1.ffn": 64}  # layer 1 outranks layer 0 in each kind


def test_config_bad_inputs_are_one_line():
    from pipeline.config.schema import parse

    with pytest.raises(PipelineError, match="sparsity: Input should be less than 1"):
        parse(SmpConfig, {"sparsity": 1.0}, "smp config")
    with pytest.raises(PipelineError, match="sparsity: Input should be greater than or equal to 0"):
        parse(GmpConfig, {"sparsity": -0.1}, "gmp config")
    with pytest.raises(PipelineError, match="prune_steps 900 is longer than the training budget"):
        parse(SmpConfig, {"prune_steps": 900, "train": {"max_steps": 600}}, "smp config")
    with pytest.raises(PipelineError, match=r"mask\.ffn: Input should be"):
        parse(SmpConfig, {"mask": {"ffn": "head"}}, "smp config")  # a granularity FFNs cannot be compacted at
    with pytest.raises(PipelineError, match=r"initial_sparsity 0\.7 is above the target"):
        parse(GmpConfig, {"sparsity": 0.5, "initial_sparsity": 0.7}, "gmp config")
    with pytest.raises(PipelineError, match="block 32x32 does not divide the FFN"):
        MaskConfig(ffn="block", attention="none").check_shapes(64, 48)

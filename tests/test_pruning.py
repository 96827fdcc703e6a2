"""SMP and GMP* on tiny models: what trains, what the masks keep, and exact compaction at every granularity."""

import copy
import math

import pytest
import torch

from pipeline.compress.compaction import compact_
from pipeline.compress.context import StageContext
from pipeline.compress.masking import MaskedLinear, Masker
from pipeline.compress.methods.gmp.config import GmpConfig
from pipeline.compress.methods.gmp.stage import apply as gmp_apply
from pipeline.compress.methods.smp.config import SmpConfig
from pipeline.compress.methods.smp.stage import apply as smp_apply
from pipeline.config.schema import MaskConfig, TrainConfig
from pipeline.data.encoding import encode_task, iter_batches
from pipeline.data.loaders import load_task_data
from pipeline.data.tasks import get_task
from pipeline.errors import PipelineError
from pipeline.models.io import load_model, save_model
from pipeline.models.layers import encoder_layers, ffn_widths, head_counts
from pipeline.train.losses import classification_loss
from tests.helpers import sample_logits, tiny_family_model, tiny_model, tiny_tokenizer

ATOL = 1e-5
LINEARS = (
    "attention.self.query",
    "attention.self.key",
    "attention.self.value",
    "attention.output.dense",
    "intermediate.dense",
    "output.dense",
)


def _context(family="bert", teacher=None):
    data = load_task_data("sst2", source="sample", max_train=96, max_dev=32)
    train_enc, dev_enc = encode_task(tiny_tokenizer(family), data, 32)
    teacher = teacher or tiny_model(family, layers=2)
    for p in teacher.parameters():
        p.requires_grad_(False)
    return StageContext(teacher=teacher, train=train_enc, validation=dev_enc, task=get_task("sst2"))


def _weights(model):
    return {
        f"{i}.{name}": layer.get_submodule(name).weight.detach().clone()
        for i, layer in enumerate(encoder_layers(model))
        for name in LINEARS
    }


@pytest.mark.parametrize(
    "mask",
    [MaskConfig(allocation="soft"), MaskConfig(ffn="unstructured", attention="unstructured", allocation="local")],
)
def test_smp_trains_only_the_mask(mask):
    ctx = _context()
    cfg = SmpConfig(
        sparsity=0.5, mask=mask, prune_steps=4, train=TrainConfig(max_steps=6, batch_size=16, lr=2e-2, warmup_ratio=0)
    )
    before = _weights(ctx.teacher)
    model = smp_apply(copy.deepcopy(ctx.teacher), cfg, ctx)
    assert not any(isinstance(m, MaskedLinear) for m in model.modules())
    for key, w in _weights(model).items():
        kept = w != 0
        assert torch.equal(w[kept], before[key][kept])  # frozen: surviving weights are the teacher's, bit for bit
    summary = ctx.report["mask"]
    assert summary["kept_fraction"] <= 0.5 and ctx.report["schedule"]["prune_steps"] == 4
    if mask.allocation == "local":
        for key, w in _weights(model).items():
            assert int((w != 0).sum()) == math.floor(0.5 * w.numel()), key


def test_smp_schedule_longer_than_the_data_fails():
    ctx = _context()
    cfg = SmpConfig(prune_steps=50, train=TrainConfig(max_steps=60, batch_size=32, epochs=1))  # 96 examples: 3 steps
    with pytest.raises(Exception, match="prune_steps 50 is longer than the 3 training steps"):
        smp_apply(copy.deepcopy(ctx.teacher), cfg, ctx)


def test_smp_verbalizer_head_from_an_mlm_base(tmp_path):
    base = tiny_model("bert", layers=2, masked_lm=True)
    base.save_pretrained(tmp_path / "base")
    tiny_tokenizer("bert").save_pretrained(tmp_path / "base")
    ctx = _context()
    ctx.base_model = str(tmp_path / "base")
    cfg = SmpConfig(
        sparsity=0.5, prune_steps=2, label_words=["story", "film"], train=TrainConfig(max_steps=3, batch_size=16)
    )
    model = smp_apply(copy.deepcopy(ctx.teacher), cfg, ctx)
    assert ctx.report["head"] == "verbalizer" and model.config.classifier_head == "verbalizer"
    compact_(model)
    save_model(model, None, tmp_path / "out")
    assert torch.equal(sample_logits(load_model(tmp_path / "out")), sample_logits(model))


def test_gmp_reaches_uniform_target_sparsity_and_trains_weights():
    ctx = _context()
    cfg = GmpConfig(
        sparsity=0.8,
        initial_sparsity=0.5,
        prune_every=1,
        mask=MaskConfig(ffn="unstructured", attention="unstructured"),
        train=TrainConfig(max_steps=6, batch_size=16, cycles=3, kd_alpha=1.0, kd_temperature=5.5),
    )
    before = _weights(ctx.teacher)
    model = gmp_apply(copy.deepcopy(ctx.teacher).requires_grad_(True), cfg, ctx)
    # 6 steps in 3 cycles: dense [0, 2), updates at 2 (the jump), 3 (cubic: 0.8 - 0.3 / 8), 4 (target), fixed after
    assert ctx.report["schedule"]["updates"] == {"2": 0.5, "3": 0.7625, "4": 0.8}
    after = _weights(model)
    for key, w in after.items():  # uniform: every matrix keeps exactly floor(0.2 n) weights
        assert int((w != 0).sum()) == math.floor(0.2 * w.numel()), key
    assert any(not torch.equal(after[k][after[k] != 0], before[k][after[k] != 0]) for k in after)  # weights moved


@pytest.mark.parametrize("method", ["smp", "gmp"])
def test_a_planned_shape_prunes_every_layer_to_its_head_and_neuron_counts(method, tmp_path):
    """`mask.shape` (what `--target-speedup` sets) replaces sparsity: each layer keeps exactly that many units."""
    ctx = _context()
    mask = MaskConfig(ffn="neuron", attention="head", allocation="soft", shape={"heads": 1, "ffn": 24})
    train = TrainConfig(max_steps=6, batch_size=16, cycles=3)
    if method == "smp":
        cfg, apply = SmpConfig(mask=mask, head="classifier", train=train), smp_apply
    else:
        cfg, apply = GmpConfig(sparsity=0.5, prune_every=1, mask=mask, train=train), gmp_apply
    model = apply(copy.deepcopy(ctx.teacher).requires_grad_(True), cfg, ctx)
    compact_(model)
    assert head_counts(model) == [1, 1] and ffn_widths(model) == [24, 24]


def test_layer_kd_adds_the_per_layer_hidden_mse_to_the_teacher():
    ctx = _context()
    batch = next(iter_batches(ctx.train, 8, shuffle=False))
    student = copy.deepcopy(ctx.teacher)
    with torch.no_grad():
        encoder_layers(student)[1].output.dense.weight.mul_(0.5)  # only the last layer's output moves
    plain = classification_loss(ctx.teacher, TrainConfig(kd_alpha=0.5))(student, batch)
    layered = classification_loss(ctx.teacher, TrainConfig(kd_alpha=0.5, layer_kd=2.0))(student, batch)
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    h_s = student(**inputs, output_hidden_states=True).hidden_states[2]
    h_t = ctx.teacher(**inputs, output_hidden_states=True).hidden_states[2]
    real = batch["attention_mask"].bool()
    mse = (h_s - h_t)[real].square().mean()  # layer 1 is untouched, so its term is exactly 0
    assert mse > 0 and layered.item() == pytest.approx(plain.item() + 2.0 * mse.item(), rel=1e-5)
    assert classification_loss(ctx.teacher, TrainConfig(layer_kd=2.0))(ctx.teacher, batch).item() == pytest.approx(
        classification_loss(ctx.teacher, TrainConfig())(ctx.teacher, batch).item(), rel=1e-6
    )  # the teacher: no term
    shallow = copy.deepcopy(student)  # a 1-layer student of the same width: its layer against the teacher's last
    del encoder_layers(shallow)[0]
    shallow.config.num_hidden_layers = 1
    h_1 = shallow(**inputs, output_hidden_states=True).hidden_states[1]
    mse = (h_1 - h_t)[real].square().mean()
    plain = classification_loss(ctx.teacher, TrainConfig(kd_alpha=0.5))(shallow, batch)
    layered = classification_loss(ctx.teacher, TrainConfig(kd_alpha=0.5, layer_kd=2.0))(shallow, batch)
    assert layered.item() == pytest.approx(plain.item() + 2.0 * mse.item(), rel=1e-5)
    narrow = tiny_family_model("bert", layers=1, heads=2, hidden=16)
    with pytest.raises(PipelineError, match="the student's width 16 is not the teacher's"):
        classification_loss(ctx.teacher, TrainConfig(layer_kd=1.0))(narrow, batch)


@pytest.mark.parametrize("family", ["bert", "roberta"])
@pytest.mark.parametrize(
    "granularity",
    [
        ("neuron", "head", None),
        ("unstructured", "unstructured", None),
        ("block", "block", (8, 8)),
        ("neuron", "none", None),
    ],
)
def test_compaction_is_exact_for_every_granularity(family, granularity, tmp_path):
    """Masks at each granularity, with scores rigged so layer 0 loses every head and layer 1 every FFN neuron."""
    ffn, attention, block = granularity
    model = tiny_model(family, layers=3)
    masker = Masker.attach(model, ffn=ffn, attention=attention, block=block or (32, 32))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for group in masker.groups:
            scores = torch.rand(group.scores.shape, generator=g)
            if (group.layer == 0 and group.kind in ("head", "query", "key", "value", "attn_out")) or (
                group.layer == 1 and group.kind in ("neuron", "ffn_in", "ffn_out")
            ):
                scores -= 10  # these lose everything under pooled ("type") allocation
            group.scores.copy_(scores)
    masker.allocate(0.5, "type")
    masker.refresh("type")
    masker.detach_(model)
    before = sample_logits(model)
    report = compact_(model)
    assert (before - sample_logits(model)).abs().max() <= ATOL
    if attention in ("head", "unstructured", "block"):
        assert head_counts(model)[0] == 0  # every Q/K/V/O weight of layer 0 is zero: all heads go
    if ffn != "none":
        assert ffn_widths(model)[1] == 0
    save_model(model, None, tmp_path)
    assert torch.equal(sample_logits(load_model(tmp_path)), sample_logits(model))
    assert report["removed_heads"][0] == (2 if attention != "none" else 0)


def test_smp_recovery_trains_surviving_weights_at_the_fixed_mask():
    """Structured masks: the pruned heads and neurons are removed before recovery (outputs unchanged), recovery
    moves the survivors, and nothing pruned comes back."""

    ctx = _context()  # one context: its tokenizer is trained anew each time, not always to the same ids

    def smp(recover_steps: int):
        ctx.report = {}
        cfg = SmpConfig(
            sparsity=0.5,
            prune_steps=2,
            recover_steps=recover_steps,
            train=TrainConfig(max_steps=3, batch_size=16, lr=2e-2, warmup_ratio=0),
        )
        return smp_apply(copy.deepcopy(ctx.teacher), cfg, ctx), ctx.report

    masked, _ = smp(0)  # the same seeded mask training, no recovery: the masks baked in
    compact_(masked)
    model, report = smp(3)
    kept = report["mask"]["kinds"]
    assert report["recovery"]["steps"] == 3
    compacted = report["compacted_before_recovery"]
    assert compacted["max_abs_diff"] <= 1e-4
    assert sum(compacted["heads"]) == kept["head"]["kept"] and sum(compacted["ffn_widths"]) == kept["neuron"]["kept"]
    assert head_counts(model) == head_counts(masked) and ffn_widths(model) == ffn_widths(masked)
    before, after = masked.state_dict(), model.state_dict()
    assert before.keys() == after.keys() and all(before[k].shape == after[k].shape for k in after)
    assert any(not torch.equal(after[k], before[k]) for k in after if "encoder" in k)  # recovery moved survivors
    removed = compact_(model)
    assert sum(removed["removed_heads"]) == 0 and sum(removed["removed_ffn_neurons"]) == 0

"""Distillation losses against independent numpy references (explicit loops), the papers' mapping tables,
and a real BERT's attention probabilities."""

import copy
import math

import numpy as np
import pytest
import torch

from pipeline.compress.methods.distill.losses import (
    STRATEGIES,
    layer_mapping,
    relation_log_probs,
    relation_loss,
    relation_vectors,
)
from pipeline.errors import PipelineError
from pipeline.models.layers import encoder_layers
from pipeline.train.losses import HiddenProjections, hidden_loss, output_kd_loss
from tests.helpers import tiny_model

ALL_PAIRS = [a + b for a in "QKV" for b in "QKV"]
MASK = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0]])  # a padded batch: lengths 5, 3, 2


def raises_one_line(fn, *args, match: str, **kwargs) -> str:
    with pytest.raises(PipelineError, match=match) as info:
        fn(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message and message.strip() == message
    return message


def qkv(seed: int, width: int, batch: int = 3, tokens: int = 5, grad: bool = False) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, tokens, width, generator=gen).requires_grad_(grad) for _ in range(3)]


# --- layer mappings --------------------------------------------------------------------------------------------

# distill_compare.md §2.2, "Concrete mappings for a 12-layer teacher", plus our MiniLM 6 -> 3 case (k = 2).
TABLE = {
    (12, 6): {
        "single": {6: [12]},
        "last": {1: [7], 2: [8], 3: [9], 4: [10], 5: [11], 6: [12]},
        "uniform": {1: [2], 2: [4], 3: [6], 4: [8], 5: [10], 6: [12]},
        "uniform_cons": {1: [1, 2], 2: [3, 4], 3: [5, 6], 4: [7, 8], 5: [9, 10], 6: [11, 12]},
        "uniform_last": {1: [2, 7], 2: [4, 8], 3: [6, 9], 4: [8, 10], 5: [10, 11], 6: [12]},
    },
    (12, 4): {
        "single": {4: [12]},
        "last": {1: [9], 2: [10], 3: [11], 4: [12]},
        "uniform": {1: [3], 2: [6], 3: [9], 4: [12]},
        "uniform_cons": {1: [1, 2, 3], 2: [4, 5, 6], 3: [7, 8, 9], 4: [10, 11, 12]},
        "uniform_last": {1: [3, 9], 2: [6, 10], 3: [9, 11], 4: [12]},
    },
    (12, 3): {
        "single": {3: [12]},
        "last": {1: [10], 2: [11], 3: [12]},
        "uniform": {1: [4], 2: [8], 3: [12]},
        "uniform_cons": {1: [1, 2, 3, 4], 2: [5, 6, 7, 8], 3: [9, 10, 11, 12]},
        "uniform_last": {1: [4, 10], 2: [8, 11], 3: [12]},
    },
    (6, 3): {
        "single": {3: [6]},
        "last": {1: [4], 2: [5], 3: [6]},
        "uniform": {1: [2], 2: [4], 3: [6]},
        "uniform_cons": {1: [1, 2], 2: [3, 4], 3: [5, 6]},
        "uniform_last": {1: [2, 4], 2: [4, 5], 3: [6]},
    },
}


@pytest.mark.parametrize("depths", list(TABLE))
def test_layer_mapping_reproduces_the_digest_table(depths):
    n_teacher, n_student = depths
    for strategy, expected in TABLE[depths].items():
        assert layer_mapping(strategy, n_teacher, n_student) == expected, strategy
    assert set(TABLE[depths]) == set(STRATEGIES)


def test_layer_mapping_edge_cases():
    # equal depths: every strategy but "single" is the identity; a student deeper than the teacher is fine for "single"
    for strategy in ("last", "uniform", "uniform_cons", "uniform_last"):
        assert layer_mapping(strategy, 4, 4) == {i: [i] for i in range(1, 5)}
    assert layer_mapping("single", 3, 6) == {6: [3]}
    assert layer_mapping("last", 12, 5) == {1: [8], 2: [9], 3: [10], 4: [11], 5: [12]}  # no k, no overrun
    assert layer_mapping("uniform", 12, 1) == {1: [12]} and layer_mapping("uniform_cons", 3, 1) == {1: [1, 2, 3]}


def test_layer_mapping_rejects_overruns_and_bad_input():
    # L_T = 12, L_S = 5: k = 3, student layer 5 -> teacher 15 (uniform_cons: 4 -> {10, 11, 12} fits, 5 -> {13..15})
    msg = raises_one_line(layer_mapping, "uniform", 12, 5, match="'uniform'.*student layer 5.*teacher layer 15")
    assert "past the teacher's 12 layers" in msg
    raises_one_line(layer_mapping, "uniform_cons", 12, 5, match="'uniform_cons'.*student layer 5.*teacher layer 15")
    raises_one_line(layer_mapping, "uniform_last", 12, 5, match="'uniform_last'.*student layer 5.*teacher layer 15")
    raises_one_line(layer_mapping, "uniform", 10, 4, match="student layer 4 to teacher layer 12")  # k=3: 3->9 ok
    for strategy in ("last", "uniform", "uniform_cons", "uniform_last"):
        raises_one_line(layer_mapping, strategy, 3, 6, match=f"{strategy!r} needs a student no deeper.*6 > 3")
    msg = raises_one_line(layer_mapping, "skip", 12, 6, match="unknown layer mapping 'skip'")
    assert all(s in msg for s in STRATEGIES)
    raises_one_line(layer_mapping, "last", 0, 3, match="positive teacher layer count")
    raises_one_line(layer_mapping, "last", 12, -1, match="positive student layer count")
    raises_one_line(layer_mapping, "single", 12, 2.0, match="positive student layer count")


# --- relation vectors and the MiniLMv2 loss --------------------------------------------------------------------


def np_relation_loss(t_qkv, s_qkv, mask, relation_heads, pairs) -> float:
    """Eqs. 5-8, one (batch, relation head, query row) at a time, over the real keys only, in float64."""
    t_qkv = [x.detach().double().numpy() for x in t_qkv]
    s_qkv = [x.detach().double().numpy() for x in s_qkv]
    mask = mask.numpy().astype(bool)
    total = 0.0
    for pair in pairs:
        i, j = "QKV".index(pair[0]), "QKV".index(pair[1])
        kl_sum, rows = 0.0, 0
        for b in range(mask.shape[0]):
            keys = np.flatnonzero(mask[b])
            for t in keys:  # real query rows
                rows += 1
                for a in range(relation_heads):
                    dists = []
                    for vecs in (t_qkv, s_qkv):
                        d_r = vecs[0].shape[-1] // relation_heads
                        cols = slice(a * d_r, (a + 1) * d_r)
                        x = vecs[i][b, t, cols]
                        logits = np.array([x @ vecs[j][b, u, cols] for u in keys]) / math.sqrt(d_r)
                        p = np.exp(logits - logits.max())
                        dists.append(p / p.sum())
                    p_t, p_s = dists
                    kl_sum += float(np.sum(p_t * (np.log(p_t) - np.log(p_s))))
        total += kl_sum / (rows * relation_heads)
    return total


def test_relation_vectors_split_the_concatenated_heads():
    q, k, v = qkv(0, 32)
    qs, ks, vs = relation_vectors(q, k, v, 8)
    assert qs.shape == ks.shape == vs.shape == (3, 8, 5, 4)
    for a in range(8):  # relation head a is columns [4a, 4a + 4) of the concatenation
        assert torch.equal(qs[:, a], q[..., 4 * a : 4 * a + 4]) and torch.equal(vs[:, a], v[..., 4 * a : 4 * a + 4])


@pytest.mark.parametrize("relation_heads", [4, 8])
def test_relation_loss_matches_numpy_for_every_pair(relation_heads):
    # teacher 32 wide, student 16 wide: d_r = 8 / 4 (A_r = 4) or 4 / 2 (A_r = 8); neither is a head count
    t, s = qkv(1, 32), qkv(2, 16)
    for pair in ALL_PAIRS:
        got = relation_loss(t, s, MASK, relation_heads, pairs=(pair,)).item()
        assert got == pytest.approx(np_relation_loss(t, s, MASK, relation_heads, [pair]), rel=1e-5, abs=1e-7), pair
        assert got > 0
    default = relation_loss(t, s, MASK, relation_heads)
    singles = [relation_loss(t, s, MASK, relation_heads, pairs=(p,)).item() for p in ("QQ", "KK", "VV")]
    assert default.item() == pytest.approx(sum(singles), rel=1e-6)  # λ = 1 each: summed, not averaged
    assert default.item() == pytest.approx(np_relation_loss(t, s, MASK, relation_heads, ["QQ", "KK", "VV"]), rel=1e-5)
    everything = relation_loss(t, s, MASK, relation_heads, pairs=ALL_PAIRS).item()
    assert everything == pytest.approx(np_relation_loss(t, s, MASK, relation_heads, ALL_PAIRS), rel=1e-5)


def test_relation_loss_ignores_padding_and_is_zero_for_a_perfect_student():
    t = qkv(3, 32)
    assert relation_loss(t, [x.clone() for x in t], MASK, 4, pairs=ALL_PAIRS).item() == pytest.approx(0.0, abs=1e-6)
    # whatever sits at padded positions changes nothing
    s = qkv(4, 16)
    noisy = [torch.where(MASK[..., None].bool(), x, 1e3 * torch.randn_like(x)) for x in s]
    assert relation_loss(t, noisy, MASK, 4, pairs=ALL_PAIRS).item() == pytest.approx(
        relation_loss(t, s, MASK, 4, pairs=ALL_PAIRS).item(), rel=1e-6
    )


def test_relation_loss_trains_the_student_only():
    t, s = qkv(5, 32, grad=True), qkv(6, 16, grad=True)
    loss = relation_loss(t, s, MASK, 4)
    loss.backward()
    assert all(x.grad is None for x in t)
    pad = ~MASK.bool()
    for x in s:
        assert x.grad is not None and x.grad[MASK.bool()].abs().sum() > 0
        assert torch.all(x.grad[pad] == 0)  # padded rows and keys get no gradient
    # works under no_grad on the teacher side too (the usual call pattern)
    with torch.no_grad():
        t2 = [x * 1.0 for x in t]
    assert relation_loss(t2, s, MASK, 4).requires_grad


def eager(model):
    """The same weights with transformers' eager attention, which returns attention probabilities."""
    from transformers.models.bert.modeling_bert import BertSelfAttention

    cfg = copy.deepcopy(model.config)
    cfg._attn_implementation = "eager"
    out = type(model)(cfg).eval()
    out.load_state_dict(model.state_dict())
    assert all(type(layer.attention.self) is BertSelfAttention for layer in encoder_layers(out))
    return out


def layer_qkv(model, hidden, layer):
    """Q, K, V of 1-indexed `layer`: the layer's own Linears on its input, hidden_states[layer - 1]."""
    att = encoder_layers(model)[layer - 1].attention.self
    return [proj(hidden[layer - 1]) for proj in (att.query, att.key, att.value)]


def test_qk_relation_with_one_relation_head_per_attention_head_is_attention():
    teacher = eager(tiny_model("bert", layers=3, heads=4, seed=0))
    student = eager(tiny_model("bert", layers=2, heads=4, seed=1))
    ids = torch.randint(5, 400, (3, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        t_out = teacher(input_ids=ids, attention_mask=MASK, output_attentions=True, output_hidden_states=True)
        s_out = student(input_ids=ids, attention_mask=MASK, output_attentions=True, output_hidden_states=True)
        t_qkv, s_qkv = layer_qkv(teacher, t_out.hidden_states, 2), layer_qkv(student, s_out.hidden_states, 2)
        q, k, _ = relation_vectors(*t_qkv, 4)
        probs = relation_log_probs(q, k, MASK).exp()
    # HF masks padded keys additively with finfo.min: the same distribution, every row (padded queries included)
    torch.testing.assert_close(probs, t_out.attentions[1], rtol=1e-5, atol=1e-6)
    # and the "QK" loss is the KL between the two models' real attention maps, over real query rows
    attn_t, attn_s = t_out.attentions[1].double(), s_out.attentions[1].double()
    kl = (attn_t * (attn_t.clamp_min(1e-300).log() - attn_s.clamp_min(1e-300).log())).sum(-1)  # (B, heads, T)
    rows = MASK[:, None, :].double()
    expected = ((kl * rows).sum() / (rows.sum() * 4)).item()
    assert relation_loss(t_qkv, s_qkv, MASK, 4, pairs=("QK",)).item() == pytest.approx(expected, rel=1e-5)


def test_relation_bad_inputs_raise_one_line():
    t, s = qkv(7, 32), qkv(8, 16)
    raises_one_line(relation_vectors, *t, 5, match=r"^relation heads 5 do not divide the Q/K/V width 32$")
    raises_one_line(relation_loss, t, s, MASK, 32, match="relation heads 32 do not divide the Q/K/V width 16")
    raises_one_line(relation_vectors, *t, 0, match="positive integer")
    raises_one_line(relation_vectors, t[0], t[1], t[2][..., :16], 4, match="share one")
    raises_one_line(relation_vectors, t[0][0], t[1][0], t[2][0], 4, match="share one")
    raises_one_line(relation_loss, t, s, MASK, 4, pairs=("QX",), match="each two of Q, K, V")
    raises_one_line(relation_loss, t, s, MASK, 4, pairs=(), match="non-empty")
    raises_one_line(relation_loss, t, s, MASK, 4, pairs=("QQ", "qq"), match="repeat")
    raises_one_line(relation_loss, t[:2], s, MASK, 4, match="teacher Q/K/V must be 3 tensors")
    raises_one_line(relation_loss, t, qkv(8, 16, tokens=4), MASK, 4, match="different")
    raises_one_line(relation_loss, t, s, MASK[:2], 4, match="attention_mask has shape")
    raises_one_line(relation_loss, t, s, torch.zeros_like(MASK), 4, match="no real token")
    lower = relation_loss(t, s, MASK, 4, pairs="qk").item()  # one pair as a string, any case
    assert lower == pytest.approx(relation_loss(t, s, MASK, 4, ("QK",)).item())


# --- hidden-state loss ----------------------------------------------------------------------------------------


def hidden_tuple(seed: int, layers: int, width: int, grad: bool = False) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(3, 5, width, generator=gen).requires_grad_(grad) for _ in range(layers + 1))


def np_hidden_loss(student, teacher, mapping, projections, mask) -> float:
    total = 0.0
    for i, targets in mapping.items():
        for j in targets:
            linear = projections.get(i, j)
            w, bias = linear.weight.detach().double().numpy(), linear.bias.detach().double().numpy()
            h_s, h_t = student[i].detach().double().numpy(), teacher[j].detach().double().numpy()
            sq, count = 0.0, 0
            for b in range(mask.shape[0]):
                for t in range(mask.shape[1]):
                    if mask[b, t]:
                        sq += float(np.sum((w @ h_s[b, t] + bias - h_t[b, t]) ** 2))
                        count += h_t.shape[-1]
            total += sq / count
    return total


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_hidden_loss_matches_numpy_for_each_mapping(strategy):
    mapping = layer_mapping(strategy, 6, 3)
    student, teacher = hidden_tuple(10, 3, 16, grad=True), hidden_tuple(11, 6, 32, grad=True)
    projections = HiddenProjections(mapping, 16, 32)
    assert len(projections) == sum(map(len, mapping.values()))
    loss = hidden_loss(student, teacher, mapping, projections, MASK)
    assert loss.item() == pytest.approx(np_hidden_loss(student, teacher, mapping, projections, MASK.numpy()), rel=1e-5)
    loss.backward()
    assert all(x.grad is None for x in teacher)
    assert all(p.grad is not None for p in projections.parameters())
    for i in range(4):  # only mapped student layers learn, and never at padded tokens
        grad = student[i].grad
        assert (grad is not None and grad.abs().sum() > 0) == (i in mapping)
        if grad is not None:
            assert torch.all(grad[~MASK.bool()] == 0)


def test_hidden_projections_start_as_identity_at_equal_widths():
    mapping = layer_mapping("uniform_last", 12, 6)
    projections = HiddenProjections(mapping, 32, 32)
    assert len(projections) == 11 and "6_12" in projections.proj and "3_6" in projections.proj
    assert projections.mapping == mapping and HiddenProjections({1: [], 2: [4]}, 8, 8).mapping == {2: [4]}
    student, teacher = hidden_tuple(12, 6, 32), hidden_tuple(13, 12, 32)
    plain = 0.0
    for i, targets in mapping.items():  # plain masked MSE, no projection at all
        for j in targets:
            diff = (student[i] - teacher[j])[MASK.bool()]
            plain += diff.square().mean().item()
    assert hidden_loss(student, teacher, mapping, projections, MASK).item() == pytest.approx(plain, rel=1e-6)
    assert hidden_loss(student, teacher, mapping, None, MASK).item() == pytest.approx(
        plain, rel=1e-6
    )  # no projections
    raises_one_line(hidden_loss, hidden_tuple(12, 6, 16), teacher, mapping, None, MASK, match="do not match")
    same = {i: [i] for i in range(1, 7)}  # a student that is the teacher's first 6 layers: exactly 0
    assert hidden_loss(teacher[:7], teacher, same, HiddenProjections(same, 32, 32), MASK).item() == 0.0


def test_hidden_bad_inputs_raise_one_line():
    mapping = layer_mapping("last", 6, 3)
    student, teacher = hidden_tuple(14, 3, 16), hidden_tuple(15, 6, 32)
    projections = HiddenProjections(mapping, 16, 32)
    raises_one_line(
        hidden_loss,
        student,
        teacher,
        {4: [6]},
        HiddenProjections({4: [6]}, 16, 32),
        MASK,
        match="student layer 4 is out of range .the student has 3 layers",
    )
    raises_one_line(
        hidden_loss,
        student,
        teacher,
        {3: [7]},
        HiddenProjections({3: [7]}, 16, 32),
        MASK,
        match="teacher layer 7 is out of range",
    )
    raises_one_line(hidden_loss, student, teacher, {1: [2]}, projections, MASK, match="no hidden-state projection")
    raises_one_line(
        hidden_loss,
        student,
        teacher,
        mapping,
        HiddenProjections(mapping, 32, 32),
        MASK,
        match="do not match the projections",
    )
    raises_one_line(hidden_loss, student, teacher, {}, projections, MASK, match="mapping is empty")
    raises_one_line(hidden_loss, student, teacher, mapping, projections, MASK[:, :4], match="attention_mask has shape")
    raises_one_line(hidden_loss, student, teacher, mapping, projections, torch.zeros_like(MASK), match="no real token")
    raises_one_line(hidden_loss, [x[0] for x in student], teacher, mapping, projections, MASK, match="batch, tokens")


# --- output KD ------------------------------------------------------------------------------------------------


def np_output_kd(s, t, temperature) -> float:
    s, t = s.detach().double().numpy().reshape(-1, s.shape[-1]), t.detach().double().numpy().reshape(-1, t.shape[-1])
    total = 0.0
    for row_s, row_t in zip(s, t, strict=True):
        p_s = np.exp(row_s / temperature - np.max(row_s / temperature))
        p_t = np.exp(row_t / temperature - np.max(row_t / temperature))
        p_s, p_t = p_s / p_s.sum(), p_t / p_t.sum()
        total += float(np.sum(p_t * (np.log(p_t) - np.log(p_s))))
    return temperature**2 * total / len(s)


@pytest.mark.parametrize("temperature", [1.0, 2.0, 4])
def test_output_kd_matches_numpy(temperature):
    gen = torch.Generator().manual_seed(20)
    s = (3 * torch.randn(4, 3, generator=gen)).requires_grad_()
    t = (3 * torch.randn(4, 3, generator=gen)).requires_grad_()
    loss = output_kd_loss(s, t, temperature)
    assert loss.item() == pytest.approx(np_output_kd(s, t, temperature), rel=1e-5)
    # CE(teacher, student) is this KL plus the teacher's entropy: a constant for the student
    p_t = torch.softmax(t.detach() / temperature, -1)
    ce = -(p_t * torch.log_softmax(s.detach() / temperature, -1)).sum(-1).mean() * temperature**2
    entropy = -(p_t * p_t.log()).sum(-1).mean() * temperature**2
    assert loss.item() == pytest.approx((ce - entropy).item(), rel=1e-5)
    loss.backward()
    assert t.grad is None and s.grad.abs().sum() > 0
    assert output_kd_loss(t, t, temperature).item() == pytest.approx(0.0, abs=1e-6)
    # token logits (B, T, V): averaged per row, not summed over tokens
    s3, t3 = torch.randn(2, 5, 7, generator=gen), torch.randn(2, 5, 7, generator=gen)
    assert output_kd_loss(s3, t3, temperature).item() == pytest.approx(np_output_kd(s3, t3, temperature), rel=1e-5)


def test_output_kd_bad_inputs_raise_one_line():
    s, t = torch.randn(4, 3), torch.randn(4, 3)
    for bad in (0, -1.0, float("nan"), True, "2"):
        raises_one_line(output_kd_loss, s, t, bad, match="KD temperature must be a positive number")
    raises_one_line(output_kd_loss, s, t[:, :2], 1.0, match="share one")
    raises_one_line(output_kd_loss, s[0], t[0], 1.0, match="share one")

"""Distillation losses: layer mappings, MiniLMv2 self-attention relations and DirectMiniLM (hidden-state MSE and
output KD live in `pipeline.train.losses`, shared with the pruning methods).

Follows the method digests in `shared/methods/minilmv2.md` (§1) and `shared/methods/distill_compare.md` (§2).
Layer indices are 1-indexed as in the papers, which is also how Hugging Face's `hidden_states` tuples index
(0 = embeddings, l = output of layer l). Every teacher tensor is detached here, so callers cannot leak
gradients into a frozen teacher by forgetting `torch.no_grad()`. Softmaxes, KLs and MSEs run in float32 so the
losses stay stable under mixed precision.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.errors import PipelineError
from pipeline.train.losses import valid_tokens

STRATEGIES = ("single", "last", "uniform", "uniform_cons", "uniform_last")
QKV = "QKV"
DEFAULT_PAIRS = ("QQ", "KK", "VV")  # MiniLMv2's final choice: λ = 1 for these three, 0 for the other six
_MASKED = -1e9  # added to padded key logits: exp underflows to exactly 0 in float32, with no inf/nan anywhere


# --- layer mappings (comparison paper §2.2) -------------------------------------------------------------------


def layer_mapping(strategy: str, n_teacher: int, n_student: int) -> dict[int, list[int]]:
    """Student layer -> sorted teacher layers it must predict (1-indexed; teacher layer 0 is never a target).

    k = ceil(L_T / L_S). "single": L_S -> L_T; "last": i -> L_T - L_S + i; "uniform": i -> k·i;
    "uniform_cons": {k(i-1)+1, …, k·i} (the digest's reading of the paper's [k(i-1), ki], which would
    include the embeddings and overlap); "uniform_last": {k·i} ∪ {L_T - L_S + i} as a set. Student layers
    with no target are left out. Mappings that run past the teacher's last layer (L_T=12, L_S=5, "uniform":
    5 -> 15) are rejected rather than clamped, since clamping silently changes the strategy.
    """
    if strategy not in STRATEGIES:
        raise PipelineError(f"unknown layer mapping {strategy!r} (known: {', '.join(STRATEGIES)})")
    for name, n in (("teacher", n_teacher), ("student", n_student)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise PipelineError(f"layer mapping needs a positive {name} layer count, got {n!r}")
    if strategy == "single":
        return {n_student: [n_teacher]}
    if n_student > n_teacher:
        raise PipelineError(
            f"layer mapping {strategy!r} needs a student no deeper than the teacher ({n_student} > {n_teacher} layers)"
        )
    k = math.ceil(n_teacher / n_student)
    students = range(1, n_student + 1)
    if strategy == "last":
        mapping = {i: {n_teacher - n_student + i} for i in students}
    elif strategy == "uniform":
        mapping = {i: {k * i} for i in students}
    elif strategy == "uniform_cons":
        mapping = {i: set(range(k * (i - 1) + 1, k * i + 1)) for i in students}
    else:  # uniform_last
        mapping = {i: {k * i, n_teacher - n_student + i} for i in students}
    for i, targets in mapping.items():
        if max(targets) > n_teacher:
            raise PipelineError(
                f"layer mapping {strategy!r} (k=ceil({n_teacher}/{n_student})={k}) sends student layer {i} "
                f"to teacher layer {max(targets)}, past the teacher's {n_teacher} layers"
            )
    return {i: sorted(targets) for i, targets in mapping.items()}


# --- MiniLMv2 relations (MiniLMv2 eqs. 5-8) -------------------------------------------------------------------


def relation_vectors(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, relation_heads: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Re-split one layer's concatenated Q, K, V (B, T, d) into `relation_heads` heads: (B, A_r, T, d/A_r) each.

    The inputs are the outputs of the layer's own query/key/value Linears (biases included) on the layer's
    input. A_r is independent of the attention head count, which is what lets teacher and student differ in
    heads and width; it only has to divide d.
    """
    if isinstance(relation_heads, bool) or not isinstance(relation_heads, int) or relation_heads < 1:
        raise PipelineError(f"relation heads must be a positive integer, got {relation_heads!r}")
    shapes = {tuple(x.shape) for x in (q, k, v)}
    if len(shapes) != 1 or q.dim() != 3:
        got = [tuple(x.shape) for x in (q, k, v)]
        raise PipelineError(f"Q, K, V must share one (batch, tokens, width) shape, got {got}")
    width = q.shape[-1]
    if width % relation_heads:
        raise PipelineError(f"relation heads {relation_heads} do not divide the Q/K/V width {width}")
    split = (relation_heads, width // relation_heads)
    qs, ks, vs = (x.unflatten(-1, split).transpose(1, 2) for x in (q, k, v))
    return qs, ks, vs


def relation_log_probs(x: torch.Tensor, y: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
    """Row-wise log-softmax of x yᵀ / sqrt(d_r) over the real (unpadded) keys, in float32: (B, A_r, T, T).

    x, y: (B, A_r, T, d_r) relation vectors; key_mask: (B, T), nonzero = real token. Padded key columns get
    probability exactly 0. With x = Q, y = K and A_r = the attention heads this is the model's own attention.
    """
    with torch.autocast(x.device.type, enabled=False):  # autocast would run the matmul in half precision
        x, y = x.float(), y.float()
        logits = x @ y.transpose(-1, -2) / math.sqrt(x.shape[-1])
        pad_keys = ~key_mask.bool()[:, None, None, :]
        return F.log_softmax(logits.masked_fill(pad_keys, _MASKED), dim=-1)


def relation_loss(
    teacher_qkv: Sequence[torch.Tensor],
    student_qkv: Sequence[torch.Tensor],
    attention_mask: torch.Tensor,
    relation_heads: int,
    pairs: Sequence[str] = DEFAULT_PAIRS,
) -> torch.Tensor:
    """MiniLMv2 loss: Σ over `pairs` of KL(teacher relation ‖ student relation), per row, averaged.

    teacher_qkv / student_qkv: each model's (Q, K, V), (B, T, d) with its own width d. Each model scales by
    its own d_r = d / A_r (eqs. 7-8). A pair "XY" relates X to Y, e.g. "QK" is attention. Each pair's KL is
    averaged over relation heads and real query rows of the whole batch (token-averaged, eq. 6); padded keys
    are masked before the softmax. Pair losses are summed, not averaged (λ = 1, eq. 5), matching the paper's
    learning-rate scale. Only the student receives gradients.
    """
    pairs = _check_pairs(pairs)
    for name, qkv in (("teacher", teacher_qkv), ("student", student_qkv)):
        if len(qkv) != 3:
            raise PipelineError(f"{name} Q/K/V must be 3 tensors, got {len(qkv)}")
    t_vecs = relation_vectors(*(x.detach() for x in teacher_qkv), relation_heads)
    s_vecs = relation_vectors(*student_qkv, relation_heads)
    (b_t, _, n_t, _), (b_s, _, n_s, _) = t_vecs[0].shape, s_vecs[0].shape
    if (b_t, n_t) != (b_s, n_s):
        raise PipelineError(f"teacher and student Q/K/V cover different (batch, tokens): {(b_t, n_t)} vs {(b_s, n_s)}")
    valid = valid_tokens(attention_mask, b_s, n_s)
    rows = valid[:, None, :].float()  # (B, 1, T): real query rows
    denom = rows.sum() * relation_heads
    total = torch.zeros((), device=s_vecs[0].device)
    for pair in pairs:
        i, j = QKV.index(pair[0]), QKV.index(pair[1])
        log_t = relation_log_probs(t_vecs[i], t_vecs[j], valid)
        log_s = relation_log_probs(s_vecs[i], s_vecs[j], valid)
        terms = (log_t.exp() * (log_t - log_s)).masked_fill(~valid[:, None, None, :], 0.0)
        total = total + (terms.sum(-1) * rows).sum() / denom
    return total


def _check_pairs(pairs: Sequence[str]) -> list[str]:
    if isinstance(pairs, str):
        pairs = [pairs]
    out = [str(p).upper() for p in pairs]
    bad = [p for p in out if len(p) != 2 or any(c not in QKV for c in p)]
    if not out or bad:
        raise PipelineError(f"relation pairs must be non-empty and each two of Q, K, V (like 'QK'), got {list(pairs)}")
    if len(set(out)) != len(out):
        raise PipelineError(f"relation pairs repeat: {list(pairs)}")
    return out


# --- DirectMiniLM (comparison paper §2.4, eq. 10) -------------------------------------------------------------


class DirectProjections(nn.Module):
    """W_{α,a}: one trainable (d_S/A_r × d_T/A_r) map per relation type α ∈ Q, K, V and relation head a;
    training-only. Identity-initialised when the widths match (step 0 is plain MSE), else Xavier."""

    def __init__(self, relation_heads: int, d_student: int, d_teacher: int) -> None:
        super().__init__()
        if d_student % relation_heads or d_teacher % relation_heads:
            raise PipelineError(f"relation heads {relation_heads} must divide both widths {d_student}, {d_teacher}")
        ds, dt = d_student // relation_heads, d_teacher // relation_heads
        weight = torch.empty(len(QKV), relation_heads, ds, dt)
        if ds == dt:
            weight.copy_(torch.eye(ds).expand_as(weight))
        else:
            for head in weight.view(-1, ds, dt):  # each (ds × dt) map on its own fan
                nn.init.xavier_uniform_(head)
        self.weight = nn.Parameter(weight)
        self.relation_heads = relation_heads


def direct_loss(
    teacher_qkv: Sequence[torch.Tensor],
    student_qkv: Sequence[torch.Tensor],
    attention_mask: torch.Tensor,
    maps: DirectProjections,
) -> torch.Tensor:
    """Σ over Q, K, V of the MSE between the student's relation-head vectors mapped by W_{α,a} and the teacher's
    (eq. 10), averaged over relation heads, real tokens and the teacher's dimensions."""
    t_vecs = relation_vectors(*(x.detach() for x in teacher_qkv), maps.relation_heads)
    s_vecs = relation_vectors(*student_qkv, maps.relation_heads)
    valid = valid_tokens(attention_mask, s_vecs[0].shape[0], s_vecs[0].shape[2])
    rows = valid[:, None, :, None].float()  # (B, 1, T, 1)
    total = torch.zeros((), device=s_vecs[0].device)
    for alpha, (t, s) in enumerate(zip(t_vecs, s_vecs, strict=True)):
        with torch.autocast(s.device.type, enabled=False):
            mapped = torch.einsum("bats,ase->bate", s.float(), maps.weight[alpha].float())
            err = (mapped - t.float()).pow(2) * rows
        total = total + err.sum() / (rows.sum() * maps.relation_heads * t.shape[-1])
    return total

"""Training losses shared by every method: the task loss, output KD and hidden-state MSE, for every task kind
(`prediction_rows`).

Layer indices are 1-indexed as in the papers, which is also how Hugging Face's `hidden_states` tuples index
(0 = embeddings, l = output of layer l). Every teacher tensor is detached here, so callers cannot leak
gradients into a frozen teacher by forgetting `torch.no_grad()`. Softmaxes, KLs and MSEs run in float32 so the
losses stay stable under mixed precision.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.config.schema import TrainConfig
from pipeline.errors import PipelineError
from pipeline.kinds.base import IGNORED

LossFn = Callable[[nn.Module, dict[str, torch.Tensor]], torch.Tensor]


def output_kd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Hinton KD: T² · KL(softmax(t/T) ‖ softmax(s/T)), averaged over rows (all dims but the last).

    The paper writes CE(teacher, student); that differs from this KL by the teacher's entropy, a constant for
    the student, so the gradients are identical and KL just reads 0 at a perfect match. T² keeps the gradient
    scale independent of T. Token logits (B, T, V) are averaged per token, not summed over tokens.
    """
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
        raise PipelineError(f"KD temperature must be a positive number, got {temperature!r}")
    if student_logits.shape != teacher_logits.shape or student_logits.dim() < 2:
        raise PipelineError(
            f"student and teacher logits must share one (..., classes) shape, got {tuple(student_logits.shape)} "
            f"and {tuple(teacher_logits.shape)}"
        )
    n = student_logits.shape[-1]
    log_s = F.log_softmax(student_logits.float().reshape(-1, n) / temperature, dim=-1)
    log_t = F.log_softmax(teacher_logits.detach().float().reshape(-1, n) / temperature, dim=-1)
    kl = F.kl_div(log_s, log_t, log_target=True, reduction="batchmean")
    return temperature * temperature * kl


def valid_tokens(attention_mask: torch.Tensor, batch: int, tokens: int) -> torch.Tensor:
    """The (B, T) bool mask of real tokens; rejects a wrong shape or a batch with no real token."""
    if tuple(attention_mask.shape) != (batch, tokens):
        raise PipelineError(f"attention_mask has shape {tuple(attention_mask.shape)}, expected {(batch, tokens)}")
    valid = attention_mask.bool()
    if not valid.any():
        raise PipelineError("attention_mask marks no real token: nothing to distil")
    return valid


class HiddenProjections(nn.Module):
    """One trainable Linear(d_S, d_T) per mapped (student, teacher) pair, keyed "i_j"; training-only.

    `mapping` keeps the pairs (student layers without targets dropped), so it can be handed to `hidden_loss`.

    Identity-initialised (zero bias) when the widths match, so step 0 is plain MSE rather than MSE against a
    random rotation. Drop this module before export: the student never calls it.
    """

    def __init__(self, mapping: Mapping[int, Sequence[int]], d_student: int, d_teacher: int) -> None:
        super().__init__()
        self.d_student, self.d_teacher = d_student, d_teacher
        self.mapping = {i: sorted(targets) for i, targets in mapping.items() if targets}
        self.proj = nn.ModuleDict()
        for i, targets in mapping.items():
            for j in targets:
                linear = nn.Linear(d_student, d_teacher)
                if d_student == d_teacher:
                    with torch.no_grad():
                        linear.weight.copy_(torch.eye(d_teacher))
                        linear.bias.zero_()
                self.proj[self.key(i, j)] = linear

    @staticmethod
    def key(student_layer: int, teacher_layer: int) -> str:
        return f"{student_layer}_{teacher_layer}"

    def __len__(self) -> int:
        return len(self.proj)

    def get(self, student_layer: int, teacher_layer: int) -> nn.Linear:
        key = self.key(student_layer, teacher_layer)
        if key not in self.proj:
            raise PipelineError(f"no hidden-state projection for student layer {student_layer} -> {teacher_layer}")
        return self.proj[key]


def hidden_loss(
    student_hidden: Sequence[torch.Tensor],
    teacher_hidden: Sequence[torch.Tensor],
    mapping: Mapping[int, Sequence[int]],
    projections: HiddenProjections | None,
    attention_mask: torch.Tensor,
) -> torch.Tensor:
    """Σ over mapped pairs (i, j) of MSE(proj_i^j(H^S_i), H^T_j), each averaged over real tokens and d_T.

    student_hidden / teacher_hidden: Hugging Face `hidden_states` tuples (index 0 = embeddings, l = layer l).
    Padded tokens are excluded so the loss does not depend on how much a batch is padded. Without projections
    the pairs are compared directly (a pruned or fused student keeps the teacher's width).
    """
    pairs = [(i, j) for i, targets in mapping.items() for j in targets]
    if not pairs:
        raise PipelineError("hidden-state mapping is empty: nothing to distil")
    ref = student_hidden[0]
    if ref.dim() != 3:
        raise PipelineError(f"hidden states must be (batch, tokens, width), got shape {tuple(ref.shape)}")
    valid = valid_tokens(attention_mask, ref.shape[0], ref.shape[1])
    weights = valid[..., None].float()
    width = teacher_hidden[0].shape[-1]  # without projections both sides must have the teacher's width
    d_student, d_teacher = (width, width) if projections is None else (projections.d_student, projections.d_teacher)
    denom = weights.sum() * d_teacher
    total = torch.zeros((), device=ref.device)
    n_student, n_teacher = len(student_hidden) - 1, len(teacher_hidden) - 1
    for i, j in pairs:
        if not 1 <= i <= n_student:
            raise PipelineError(f"student layer {i} is out of range (the student has {n_student} layers)")
        if not 1 <= j <= n_teacher:
            raise PipelineError(f"teacher layer {j} is out of range (the teacher has {n_teacher} layers)")
        h_s, h_t = student_hidden[i], teacher_hidden[j].detach()
        expected_s, expected_t = (*ref.shape[:2], d_student), (*ref.shape[:2], d_teacher)
        if tuple(h_s.shape) != expected_s or tuple(h_t.shape) != expected_t:
            raise PipelineError(
                f"pair {i}_{j}: hidden shapes {tuple(h_s.shape)} -> {tuple(h_t.shape)} do not match the projections "
                f"{expected_s} -> {expected_t}"
            )
        projected = projections.get(i, j)(h_s) if projections is not None else h_s
        diff = projected.float() - h_t.float()
        total = total + (diff.square() * weights).sum() / denom
    return total


def layer_hidden_mse(
    student_hidden: Sequence[torch.Tensor], teacher_hidden: Sequence[torch.Tensor], attention_mask: torch.Tensor
) -> torch.Tensor:
    """`hidden_loss` of every student layer against a teacher layer of the same width, no projection: the
    teacher's same layer, or for a shallower student (distill's, pruned after) the uniform mapping that distill's
    default student is cut by (student layer i of S against teacher layer round(i·T/S), the last to the last)."""
    n_student, n_teacher = len(student_hidden) - 1, len(teacher_hidden) - 1
    if student_hidden[-1].shape[-1] != teacher_hidden[-1].shape[-1]:
        raise PipelineError(
            f"layer_kd compares hidden states directly: the student's width {student_hidden[-1].shape[-1]} is not "
            f"the teacher's {teacher_hidden[-1].shape[-1]}"
        )
    layers = {i: [round(i * n_teacher / n_student)] for i in range(1, n_student + 1)}
    return hidden_loss(student_hidden, teacher_hidden, layers, None, attention_mask)


def prediction_rows(out, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """A model's output as rows of logits over classes with each row's label (-100, `encoding.IGNORED`: not
    scored), for every task kind, so the task loss and output KD are one formula (cross-entropy, KL row by row):

    - sequence classification, logits (B, C): one row per example;
    - token classification, logits (B, T, C): one row per real token (pads dropped, so KD sees real tokens only;
      labels IGNORED on special tokens and on every sub-token after a word's first);
    - question answering, start and end logits (B, T): a row per example for the start and one for the end,
      over the window's tokens, pads pushed out of the softmax; labels (B, 2) hold the start and end positions;
    - sentence embeddings (B, D): one pooled, normalised vector per text (not logits: the embedding losses compare
      them with the teacher's, `embedding_loss`).
    """
    labels = batch.get("labels")
    if hasattr(out, "sentence_embedding"):  # one pooled, normalised vector per text, no labels
        return out.sentence_embedding, labels
    if hasattr(out, "start_logits"):
        pad = ~batch["attention_mask"].bool()
        rows = torch.cat([out.start_logits, out.end_logits]).masked_fill(pad.repeat(2, 1), -1e4)
        return rows, None if labels is None else torch.cat([labels[:, 0], labels[:, 1]])
    if out.logits.dim() == 3:
        real = batch["attention_mask"].bool()
        return out.logits[real], None if labels is None else labels[real]
    return out.logits, labels


def embedding_loss(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """Embedding KD on pooled vectors (B, D), both normalised: the mean cosine distance of each student vector to
    its teacher's, plus the MSE between the two in-batch cosine-similarity matrices (B, B), the relations a search
    ranks by.

    An MSE between two normalised vectors is their cosine distance times 2/D, so it is not a second term. The
    student's vectors must be in the teacher's space and width (a narrower student's projection puts them there).
    """
    if student.dim() != 2 or student.shape != teacher.shape:
        raise PipelineError(
            f"student and teacher embeddings must share one (batch, width) shape, got {tuple(student.shape)} and "
            f"{tuple(teacher.shape)}"
        )
    s = F.normalize(student.float(), dim=-1)
    t = F.normalize(teacher.detach().float(), dim=-1)
    distance = (1 - (s * t).sum(dim=-1)).mean()
    return distance + F.mse_loss(s @ s.T, t @ t.T)


def classification_loss(teacher: nn.Module | None, cfg: TrainConfig) -> LossFn:
    """Cross-entropy on labels, mixed with T²-scaled KL to the teacher's logits when `kd_alpha` > 0, plus
    `layer_kd` × the hidden-state MSE of every layer to its teacher layer (`layer_hidden_mse`) when `layer_kd` > 0.
    A sentence-embedding model (no labels) learns its teacher's embeddings (`embedding_loss`) whatever `kd_alpha`."""

    def loss_fn(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        embeds = "labels" not in batch
        use_kd = teacher is not None and (embeds or cfg.kd_alpha > 0 or cfg.layer_kd > 0)
        hidden = use_kd and cfg.layer_kd > 0
        out = model(**inputs, output_hidden_states=hidden)
        rows, labels = prediction_rows(out, batch)
        if not use_kd:  # task_loss refuses an embedding batch without a teacher's vectors
            return task_loss(rows, None, None, cfg) if embeds else F.cross_entropy(rows, labels)
        with torch.no_grad():
            t_out = teacher(**inputs, output_hidden_states=hidden)
        loss = task_loss(rows, labels, prediction_rows(t_out, batch)[0], cfg)
        if hidden:
            loss = loss + cfg.layer_kd * layer_hidden_mse(
                out.hidden_states, t_out.hidden_states, inputs["attention_mask"]
            )
        return loss

    return loss_fn


def task_loss(
    logits: torch.Tensor, labels: torch.Tensor, t_logits: torch.Tensor | None, cfg: TrainConfig
) -> torch.Tensor:
    """(1 − α)·CE + α·T²·KL(teacher ‖ student) at temperature T (α = `kd_alpha`; CE only without teacher logits),
    over `prediction_rows`. CE averages over the labelled rows; a batch of unlabelled rows only (augmented
    sentences, `train.augment`) has none, and KD alone. Embeddings (no labels at all) take `embedding_loss`."""
    if labels is None:
        if t_logits is None:
            raise PipelineError("a sentence-embedding model has no labels: it learns from a teacher")
        return embedding_loss(logits, t_logits)
    labelled = labels != IGNORED
    ce = F.cross_entropy(logits[labelled], labels[labelled]) if bool(labelled.any()) else logits.sum() * 0.0
    alpha, t = cfg.kd_alpha, cfg.kd_temperature
    if t_logits is None or alpha == 0:
        return ce
    return (1 - alpha) * ce + alpha * output_kd_loss(logits, t_logits, t)

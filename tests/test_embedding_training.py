"""What the methods learn from on sentence embeddings: the embedding loss, the refusal of an embedding model with no
teacher, and a narrower student whose projection starts it in its teacher's space."""

import pytest
import torch

from pipeline.compress.methods.distill.config import StudentConfig
from pipeline.compress.methods.distill.students import build_student
from pipeline.config.schema import TrainConfig
from pipeline.data.tasks import get_task
from pipeline.errors import PipelineError
from pipeline.models.embedding import SentenceEmbedder
from pipeline.train.losses import classification_loss, embedding_loss
from tests.helpers import sample_inputs, tiny_model


def _embedder(seed: int = 0) -> SentenceEmbedder:
    torch.manual_seed(seed)
    return SentenceEmbedder.from_config(tiny_model("bert", layers=2, heads=4).config).eval()


def test_the_embedding_loss_is_zero_on_the_teachers_vectors_and_grows_with_the_angle():
    t = torch.nn.functional.normalize(torch.randn(6, 16), dim=-1)
    assert embedding_loss(t, t).item() == pytest.approx(0.0, abs=1e-6)
    assert embedding_loss(t * 3.0, t).item() == pytest.approx(0.0, abs=1e-6)  # it compares directions
    near = torch.nn.functional.normalize(t + 0.1 * torch.randn(6, 16), dim=-1)
    far = torch.nn.functional.normalize(torch.randn(6, 16), dim=-1)
    assert 0 < embedding_loss(near, t).item() < embedding_loss(far, t).item()
    with pytest.raises(PipelineError, match="share one \\(batch, width\\) shape"):
        embedding_loss(torch.randn(6, 8), t)


def test_an_embedding_batch_without_a_teacher_is_refused_in_one_line():
    ids, mask = sample_inputs()
    loss = classification_loss(None, TrainConfig())
    with pytest.raises(PipelineError, match="no labels: it learns from a teacher"):
        loss(_embedder(), {"input_ids": ids, "attention_mask": mask})


def test_the_loss_trains_a_student_towards_the_teachers_vectors():
    teacher, student = _embedder(0), _embedder(1).train()
    ids, mask = sample_inputs()
    batch = {"input_ids": ids, "attention_mask": mask}
    loss_fn = classification_loss(teacher, TrainConfig(kd_alpha=0.0))  # no labels: the vectors whatever kd_alpha
    opt = torch.optim.AdamW(student.parameters(), lr=1e-2)
    first = loss_fn(student, batch).item()
    for _ in range(30):
        opt.zero_grad()
        loss_fn(student, batch).backward()
        opt.step()
    assert loss_fn(student, batch).item() < first / 2


def test_a_narrower_student_is_projected_into_the_teachers_space_starting_at_its_kept_dimensions():
    teacher = _embedder()
    student, info = build_student(teacher, StudentConfig(layers=2, hidden=16), get_task("stsb"))
    assert student.config.hidden_size == 16 and student.width == teacher.width == 32
    assert student.config.sentence_projection == 32 and info["random"] == []
    weight = student.projection.weight.detach()
    assert weight.sum().item() == 16 and (weight.sum(0) == 1).all()  # each kept dimension placed once
    rows = weight.nonzero()[:, 0]
    assert rows.tolist() == sorted(rows.tolist()) and student.projection.bias.abs().sum().item() == 0
    ids, mask = sample_inputs()
    with torch.no_grad():
        out = student.eval()(input_ids=ids, attention_mask=mask)
    assert out.sentence_embedding.shape == (4, 32) and out.last_hidden_state.shape == (4, 12, 32)

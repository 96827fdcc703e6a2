"""Offline output KD: the teacher's outputs computed once per distinct input, read back in any batch and padding,
stored per teacher between runs."""

import logging

import numpy as np
import pytest
import torch

from pipeline.train.teacher_outputs import TeacherOutputs, read_rows
from tests.helpers import compress_sample, tiny_model


def _teacher(head: str):
    from transformers import BertForQuestionAnswering, BertForTokenClassification

    model = tiny_model("bert", num_labels=2 if head == "qa" else 3)  # a QA head scores start and end
    if head == "sequence":
        return model
    cls = BertForTokenClassification if head == "token" else BertForQuestionAnswering
    torch.manual_seed(1)
    return cls(model.config).eval()


def _batch(rows: list[list[int]]) -> dict[str, torch.Tensor]:
    """Right-padded ids (pad 0) and mask, with token types, for rows of token ids."""
    width = max(map(len, rows))
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


ROWS = [[2, 17, 45, 3], [2, 99, 8, 121, 60, 7, 3], [2, 5, 3], [2, 250, 31, 32, 3]]


def _real(out, mask: torch.Tensor, head: str) -> list[torch.Tensor]:
    """Each row's output over its real tokens (what the losses read)."""
    if head == "sequence":
        return list(out.logits)
    if head == "token":
        return [out.logits[i][mask[i].bool()] for i in range(len(mask))]
    both = torch.stack([out.start_logits, out.end_logits], 1)
    return [both[i][:, mask[i].bool()] for i in range(len(mask))]


@pytest.mark.parametrize("head", ["sequence", "token", "qa"])
def test_rows_match_the_teacher_in_any_batch_and_padding(head):
    teacher = _teacher(head)
    outputs = TeacherOutputs(teacher)
    first = _batch(ROWS[:3])
    with torch.no_grad():
        direct = _real(teacher(**first), first["attention_mask"], head)
    got = _real(outputs(**first), first["attention_mask"], head)
    assert (outputs.hits, outputs.misses) == (0, 3)
    for a, b in zip(got, direct, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    # the same rows in another order and padding, beside a new one: one teacher row computed, three read back
    second = _batch([ROWS[2], ROWS[3], ROWS[0], ROWS[1]])
    with torch.no_grad():
        direct = _real(teacher(**second), second["attention_mask"], head)
    got = _real(outputs(**second), second["attention_mask"], head)
    assert (outputs.hits, outputs.misses) == (3, 4)
    for a, b in zip(got, direct, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_token_types_are_part_of_an_input_and_hidden_states_go_to_the_teacher():
    teacher = _teacher("sequence")
    outputs = TeacherOutputs(teacher)
    batch = _batch(ROWS[:2])
    outputs(**batch)
    other = {**batch, "token_type_ids": batch["attention_mask"].clone()}  # same tokens, other segments
    outputs(**other)
    assert outputs.misses == 4
    out = outputs(**batch, output_hidden_states=True)
    assert len(out.hidden_states) == teacher.config.num_hidden_layers + 1
    assert outputs.hits == 0  # not a stored-row call


def test_rows_are_stored_merged_and_read_back_by_the_next_run(tmp_path, caplog):
    teacher = _teacher("token")
    store = tmp_path / "outputs" / "teacher.npz"
    first = TeacherOutputs(teacher, store)
    first(**_batch(ROWS[:2]))
    other = TeacherOutputs(teacher, store)  # a concurrent run: started before `first` saved
    other(**_batch(ROWS[2:]))
    first.save()
    other.save()  # merges what `first` stored
    kind, rows = read_rows(store)
    assert kind == "token" and len(rows) == 4
    assert all(v.dtype == np.float32 for v in rows.values())
    later = TeacherOutputs(teacher, store)
    batch = _batch(ROWS)
    with torch.no_grad():
        direct = _real(teacher(**batch), batch["attention_mask"], "token")
    got = _real(later(**batch), batch["attention_mask"], "token")
    assert (later.hits, later.misses) == (4, 0)
    for a, b in zip(got, direct, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    store.write_bytes(b"not an npz")  # damaged: ignored with a warning, and rebuilt
    with caplog.at_level(logging.WARNING):
        fresh = TeacherOutputs(teacher, store)
    assert not fresh.rows and "ignoring unreadable" in caplog.text
    fresh(**_batch(ROWS[:1]))
    fresh.save()
    assert len(read_rows(store)[1]) == 1
    assert [p.name for p in store.parent.iterdir()] == ["teacher.npz"]  # no temporary file left


def test_a_chain_reads_back_what_its_first_stage_stored(classifier_dirs, tmp_path):
    """distill's task phase stores the teacher's rows; SMP's phases draw the same seeded batches and read them."""
    from pipeline.stages.compress import OUTPUTS_DIR

    steps = ["train.max_steps=6", "train.batch_size=8"]
    overrides = [
        "config.distill.student.layers=1",
        "config.distill.transfer_steps=0",
        "config.distill.relation=0",
        *(f"config.distill.{s}" for s in steps),
        *(f"config.smp.{s}" for s in steps),
        "config.smp.recover_steps=4",
    ]
    result = compress_sample("distill+smp", overrides, classifier_dirs["bert"], tmp_path)
    distill, smp = result["stages"]
    assert distill["teacher_outputs"] == {"read_back": 0, "computed": 48}  # 6 steps of 8
    assert smp["teacher_outputs"] == {"read_back": 80, "computed": 0}  # 6 mask + 4 recovery steps, same batches
    (store,) = (tmp_path / OUTPUTS_DIR).iterdir()
    kind, rows = read_rows(store)
    assert kind == "sequence" and 0 < len(rows) <= 48  # one row per distinct sentence

"""`--kd-teacher`: output KD from another classifier of the task (any vocabulary), while hidden states, relations,
the compressed model and the speed baseline stay the teacher's."""

import pytest
import torch

from pipeline.train.kd_teacher import Retokenized, load_kd_teacher
from pipeline.train.teacher_outputs import TeacherOutputs, read_rows
from tests.helpers import (
    assert_one_line_error,
    cli_deploy,
    sample_sentences,
    tiny_model,
    tiny_tokenizer,
    write_tiny_model_dir,
)


@pytest.fixture(scope="module")
def tokenizers():
    return tiny_tokenizer("bert"), tiny_tokenizer("roberta")


def test_a_model_of_another_vocabulary_reads_the_students_text(tokenizers):
    bert_tok, roberta_tok = tokenizers
    other = tiny_model("roberta", seed=3)
    kd = Retokenized(other, roberta_tok, reads=bert_tok)
    texts = sample_sentences("dev")[:5]
    enc = bert_tok(texts, padding=True, return_tensors="pt")
    # what the student's tokens say, as text: WordPiece lower-cases, so that is what the other model reads
    said = [bert_tok.decode(ids, skip_special_tokens=True) for ids in bert_tok(texts)["input_ids"]]
    assert said[1] == texts[1].lower() and said[4] == texts[4].lower()  # the words themselves, not ids
    with torch.no_grad():
        got = kd(**enc).logits
        want = other(**roberta_tok(said, padding=True, return_tensors="pt")).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    # a pair comes back as its two segments
    pair = bert_tok("a man plays the guitar .", "someone is playing music .")["input_ids"]
    assert kd.segments(pair) == ["a man plays the guitar.", "someone is playing music."]


def test_a_model_of_the_same_vocabulary_reads_the_ids_as_they_are(tmp_path, tokenizers):
    from pipeline.models.folders import load_tokenizer

    folder = write_tiny_model_dir(tmp_path / "kd", "bert", seed=5)  # a tokenizer trained again: its own vocabulary
    kd = load_kd_teacher(str(folder), load_tokenizer(folder))
    assert not isinstance(kd, Retokenized) and not any(p.requires_grad for p in kd.parameters())
    assert isinstance(load_kd_teacher(str(folder), tokenizers[1]), Retokenized)


def test_rows_come_from_the_kd_teacher_and_hidden_states_from_the_teacher(tokenizers):
    teacher, other = tiny_model("bert", seed=0), tiny_model("bert", seed=7)
    outputs = TeacherOutputs(teacher, source=other)
    batch = tokenizers[0](sample_sentences("dev")[:4], padding=True, return_tensors="pt")
    with torch.no_grad():
        own, theirs = teacher(**batch, output_hidden_states=True), other(**batch)
    assert not torch.allclose(own.logits, theirs.logits, atol=1e-3)
    torch.testing.assert_close(outputs(**batch).logits, theirs.logits, atol=1e-5, rtol=0)
    mixed = outputs(**batch, output_hidden_states=True)  # layer KD's call: the teacher's insides, their logits
    torch.testing.assert_close(mixed.logits, theirs.logits, atol=1e-5, rtol=0)
    for a, b in zip(mixed.hidden_states, own.hidden_states, strict=True):
        torch.testing.assert_close(a, b)


def test_a_distilled_student_learns_from_the_kd_teachers_rows(classifier_dirs, tmp_path):
    """distill's task phase and SMP's recovery read the other model's rows (stored apart from the teacher's); the
    relations and layer KD still use the teacher; the cache tells a run with a KD teacher from one without."""
    from pipeline.data.loaders import DataRef
    from pipeline.request import build_deploy_config
    from pipeline.stages.compress import OUTPUTS_DIR
    from pipeline.stages.compress import run as compress

    kd = write_tiny_model_dir(tmp_path / "kd", "roberta", seed=9)
    steps = ["train.max_steps=4", "train.batch_size=8"]
    overrides = [
        "config.distill.student.layers=1",
        "config.distill.transfer_steps=2",
        "config.distill.relation_heads=4",
        *(f"config.distill.{s}" for s in steps),
        *(f"config.smp.{s}" for s in steps),
        "config.smp.recover_steps=2",
        "config.smp.train.layer_kd=1.0",
    ]
    config = build_deploy_config("distill+smp", "sst2", overrides=overrides)
    ref = DataRef("sst2", "sample", None, 32, 16)
    teacher = str(classifier_dirs["bert"])
    with_kd = compress(config, teacher, ref, str(tmp_path / "cache"), kd_teacher=str(kd))
    distill, smp = with_kd["stages"]
    assert distill["kd_teacher"]["path"] == str(kd) and distill["teacher_outputs"]["computed"] > 0
    assert smp["teacher_outputs"]["computed"] == 0  # the same seeded batches: every row read back
    (store,) = (tmp_path / "cache" / OUTPUTS_DIR).iterdir()
    assert "-for-" in store.name and read_rows(store)[0] == "sequence"
    without = compress(config, teacher, ref, str(tmp_path / "cache"))
    assert without["path"] != with_kd["path"] and "kd_teacher" not in without["stages"][0]


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("bare", "is not a fine-tuned sequence-classification model"),
        ("three_labels", "has labels ['LABEL_0', 'LABEL_1', 'LABEL_2']; task sst2 has"),
        ("token_task", "--kd-teacher distils sentence labels; task conll2003 is token-classification"),
        ("no_kd", "no stage of this chain distils outputs"),
    ],
)
def test_a_kd_teacher_that_cannot_serve_is_one_line(case, needle, tmp_path, base_dirs, classifier_dirs):
    kd = {
        "bare": base_dirs["bert"],
        "three_labels": write_tiny_model_dir(tmp_path / "three", "bert", num_labels=3),
    }.get(case, classifier_dirs["roberta"])
    task = ["--task", "conll2003"] if case == "token_task" else ["--task", "sst2"]
    extra = ["--set", "config.train.kd_alpha=0"] if case == "no_kd" else []
    result = cli_deploy("--method", "distill", *task, "--kd-teacher", str(kd), "--output", str(tmp_path), *extra)
    assert_one_line_error(result, needle)


def test_a_sweep_file_names_a_kd_teacher_beside_it(tmp_path, classifier_dirs):
    import shutil

    from pipeline.sweep import load_sweep

    shutil.copytree(classifier_dirs["roberta"], tmp_path / "big")
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("task: sst2\nkd_teacher: big\nruns: [{method: distill}]\n")
    ((_, request),) = load_sweep(sweep, str(tmp_path / "out"), str(tmp_path / "cache"))
    assert request.kd_teacher == str((tmp_path / "big").resolve())

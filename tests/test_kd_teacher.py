"""`--kd-teacher`: output KD from another classifier of the task (any vocabulary), while hidden states, relations,
the compressed model and the speed baseline stay the teacher's."""

import dataclasses
import json
from pathlib import Path

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


# --- `--kd-model`: the KD teacher made by the pipeline --------------------------------------------------------------

KD_DATA_ROWS = (64, 16)  # 64 training sentences at batch 8: an epoch is 8 steps


def _kd_stage(kd_model, teacher_dir, cache, steps=6, given=None):
    from pipeline.config.schema import TrainConfig
    from pipeline.data.loaders import DataRef
    from pipeline.stages.kd_teacher import run

    cfg = TrainConfig(max_steps=steps, batch_size=8, eval_every=3)
    torch.manual_seed(0)  # the new head's initialisation draws from the process's generator, as in a fresh process
    ref = DataRef("sst2", "sample", None, *KD_DATA_ROWS)
    return run(kd_model and str(kd_model), given and str(given), {"path": str(teacher_dir)}, ref, cfg, str(cache))


def test_a_kd_model_is_fine_tuned_cached_and_scored_beside_the_teacher(base_dirs, classifier_dirs, tmp_path):
    """Another family's base model, fine-tuned by the teacher stage's build on the same split with length-grouped
    batches; a second run reads it back; the record holds both teachers' validation and dev scores and says
    whether output KD uses it (only when it scores above the teacher on validation)."""
    from pipeline.models.folders import head_kind

    record = _kd_stage(base_dirs["roberta"], classifier_dirs["bert"], tmp_path / "cache")
    assert record["cached"] is False and record["steps"] == 6 and record["source"].startswith("fine-tuned from")
    assert head_kind(json.loads((Path(record["path"]) / "config.json").read_text())) == "sequence-classification"
    assert set(record["validation"]) == set(record["dev"]) == {"kd_teacher", "teacher"}
    assert record["used"] == (record["validation"]["kd_teacher"] > record["validation"]["teacher"])
    again = _kd_stage(base_dirs["roberta"], classifier_dirs["bert"], tmp_path / "cache")
    assert again["cached"] is True and {**again, "cached": False} == record


def test_a_kd_model_no_better_than_the_teacher_is_not_used_and_a_given_one_always_is(classifier_dirs, tmp_path):
    """The teacher itself as the KD model, fine-tuned for 0 steps: the same scores, so not above the teacher, and
    output KD keeps the teacher's own logits; as `--kd-teacher` the user's choice stands."""
    teacher = classifier_dirs["bert"]
    made = _kd_stage(teacher, teacher, tmp_path / "cache", steps=0)
    assert made["validation"]["kd_teacher"] == made["validation"]["teacher"] and made["used"] is False
    given = _kd_stage(None, teacher, tmp_path / "cache", given=teacher)
    assert given["used"] is True and given["source"] == "given (--kd-teacher)" and given["path"] == str(teacher)


def test_a_kd_model_stopped_mid_training_resumes_from_its_checkpoint(base_dirs, classifier_dirs, tmp_path, monkeypatch,
                                                                     caplog):  # fmt: skip
    from pipeline import checkpoints
    from pipeline.models.io import load_model
    from tests.test_checkpoints import Killed, kill_after

    monkeypatch.setenv(checkpoints.ENV, "2")
    whole = _kd_stage(base_dirs["roberta"], classifier_dirs["bert"], tmp_path / "whole")
    kill = kill_after(monkeypatch, 5)
    with pytest.raises(Killed):
        _kd_stage(base_dirs["roberta"], classifier_dirs["bert"], tmp_path / "killed")
    assert list((tmp_path / "killed" / "teachers").glob(".*.resume/phase-*.pt"))
    kill["limit"] = float("inf")
    with caplog.at_level("INFO"):
        again = _kd_stage(base_dirs["roberta"], classifier_dirs["bert"], tmp_path / "killed")
    assert "resuming from the checkpoint at step" in caplog.text
    for (name, a), (_, b) in zip(load_model(whole["path"]).state_dict().items(),
                                 load_model(again["path"]).state_dict().items(), strict=True):  # fmt: skip
        assert torch.allclose(a, b, atol=1e-6), name
    assert again["validation"] == whole["validation"]


def test_a_deploy_with_a_kd_model_distils_from_the_model_it_made(base_dirs, classifier_dirs, tmp_path):
    """The run engine: the kd_teacher stage between teacher and compress, and compress handed its folder only
    when it is used."""
    from pipeline.request import prepare_request
    from pipeline.run import compress_args, kd_folder, prepare

    overrides = ["teacher.max_steps=4", "teacher.batch_size=8", "config.train.max_steps=2", "config.student.layers=1",
                 "config.transfer_steps=1", "config.relation_heads=4", "data.max_train=32"]  # fmt: skip
    folders = dict(output_dir=str(tmp_path / "out"), cache_dir=str(tmp_path / "cache"))
    request = prepare_request("distill", "sst2", model=str(base_dirs["bert"]), kd_model=str(base_dirs["roberta"]),
                              overrides=overrides, **folders)  # fmt: skip
    run = prepare(request)
    assert run.kd_teacher["source"] == f"fine-tuned from {request.kd_model}"
    assert compress_args(request, run)[-1] == (run.kd_teacher["path"] if run.kd_teacher["used"] else None)
    refused = dataclasses.replace(run, kd_teacher={**run.kd_teacher, "used": False})  # not above the teacher
    used = dataclasses.replace(run, kd_teacher={**run.kd_teacher, "used": True})
    assert kd_folder(refused) is None and compress_args(request, used)[-1] == run.kd_teacher["path"]


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("three_labels", "--kd-model {kd} has labels ['LABEL_0', 'LABEL_1', 'LABEL_2']; task sst2 has"),
        ("token_head", "--kd-model {kd} is a fine-tuned token-classification model; give a base model"),
        ("token_task", "--kd-model distils sentence labels; task conll2003 is token-classification"),
        ("no_kd", "--kd-model: no stage of this chain distils outputs"),
        ("both", "name one KD teacher: --kd-teacher (fine-tuned) or --kd-model (to fine-tune), not both"),
        ("missing", "{kd}"),
    ],
)
def test_a_kd_model_that_cannot_serve_is_one_line(case, needle, tmp_path, base_dirs, classifier_dirs):
    from transformers import AutoModelForTokenClassification

    kd = {
        "three_labels": lambda: write_tiny_model_dir(tmp_path / "three", "bert", num_labels=3),
        "missing": lambda: tmp_path / "nowhere",
    }.get(case, lambda: base_dirs["roberta"])()
    if case == "token_head":
        kd = tmp_path / "tagger"
        AutoModelForTokenClassification.from_config(tiny_model("bert").config).save_pretrained(kd)
        tiny_tokenizer("bert").save_pretrained(kd)
    task = ["--task", "conll2003"] if case == "token_task" else ["--task", "sst2"]
    extra = {"no_kd": ["--set", "config.train.kd_alpha=0"], "both": ["--kd-teacher", str(classifier_dirs["bert"])]}
    result = cli_deploy("--method", "distill", *task, "--kd-model", str(kd), "--output", str(tmp_path),
                        *extra.get(case, []))  # fmt: skip
    assert_one_line_error(result, needle.format(kd=kd))


def test_a_sweep_file_names_a_kd_model_beside_it(tmp_path, base_dirs):
    import shutil

    from pipeline.sweep import load_sweep

    shutil.copytree(base_dirs["roberta"], tmp_path / "base")
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("task: sst2\nkd_model: base\nruns: [{method: distill}]\n")
    ((_, request),) = load_sweep(sweep, str(tmp_path / "out"), str(tmp_path / "cache"))
    assert request.kd_model == str((tmp_path / "base").resolve()) and request.kd_teacher is None

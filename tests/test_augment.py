"""Augmented sentences for output KD (TinyBERT's word replacement with the teacher's embeddings): neighbours,
replacement, the unlabelled rows in the loss, and a stage that distils on them."""

import numpy as np
import pytest
import torch

from pipeline.config.schema import AugmentConfig, TrainConfig
from pipeline.data.encoding import encode
from pipeline.data.loaders import Split, load_task_data
from pipeline.kinds.base import IGNORED
from pipeline.train.augment import FREQUENT_KEPT, augmented_split, neighbours, replace_words, with_augmented
from pipeline.train.losses import output_kd_loss, task_loss
from tests.helpers import compress_sample, tiny_model, tiny_tokenizer


def test_neighbours_are_the_nearest_other_words_by_cosine():
    words = {"good": 0, "great": 1, "bad": 2, "awful": 3}
    embeddings = torch.tensor([[1.0, 0.1], [0.9, 0.2], [-1.0, 0.1], [-0.8, -0.3]])
    near = neighbours(words, embeddings * torch.tensor([[3.0], [1.0], [0.5], [2.0]]), 2)  # cosine: norms ignored
    assert near["good"] == ["great", "awful"]  # cosines 0.99 (great), -0.97 (awful), -0.98 (bad)
    assert near["bad"][0] == "awful" and near["awful"][0] == "bad"
    assert all(w not in near[w] for w in near)  # never itself


def test_replacement_draws_neighbours_with_probability_p_and_is_seeded():
    near = {"good": ["great", "fine"], "movie": ["film"]}
    rng = np.random.default_rng(0)
    assert replace_words("a good movie , really", near, 1.0, rng).split(" ")[1:3] in (
        ["great", "film"],
        ["fine", "film"],
    )
    kept = replace_words("a good movie", near, 1e-9, np.random.default_rng(0))
    assert kept == "a good movie"
    split = Split([("a good movie",), ("good good good",)], [1, 0])
    cfg = AugmentConfig(copies=3, p=0.5, seed=7)
    once, again = augmented_split(split, near, cfg), augmented_split(split, near, cfg)
    assert once.texts == again.texts and len(once) == 6 and once.labels == [IGNORED] * 6
    assert augmented_split(split, near, cfg.model_copy(update={"seed": 8})).texts != once.texts


def test_the_training_split_grows_by_unlabelled_copies_and_frequent_words_stay():
    tokenizer, model = tiny_tokenizer("bert"), tiny_model("bert")
    data = load_task_data("sst2", source="sample", max_train=200, max_dev=8)
    train = encode(tokenizer, data.train, 64)
    joined, report = with_augmented(train, data.train, tokenizer, model, AugmentConfig(copies=2, p=0.5), 64)
    assert len(joined) == 3 * len(train) and report["examples"] == 2 * len(train)
    assert joined.labels[: len(train)] == train.labels and set(joined.labels[len(train) :]) == {IGNORED}
    assert 0 < report["changed"] <= 2 * len(train)
    assert joined.features[: len(train)] == train.features
    from collections import Counter

    counts = Counter(w for (t,) in data.train.texts for w in t.split() if w.isalpha())
    frequent = [w for w, _ in counts.most_common(FREQUENT_KEPT)]
    augmented = Counter(w for f in joined.features[len(train) :] for w in tokenizer.decode(f["input_ids"]).split())
    assert augmented[frequent[0]] >= counts[frequent[0]]  # the most frequent word is never replaced


def test_a_batch_of_unlabelled_rows_is_distilled_from_the_teacher_alone():
    cfg = TrainConfig(kd_alpha=0.5, kd_temperature=2.0)
    logits, teacher = torch.randn(4, 3, requires_grad=True), torch.randn(4, 3)
    none_labelled = torch.full((4,), IGNORED)
    loss = task_loss(logits, none_labelled, teacher, cfg)
    assert torch.isfinite(loss)
    torch.testing.assert_close(loss, 0.5 * output_kd_loss(logits, teacher, 2.0))
    some = torch.tensor([1, IGNORED, 0, IGNORED])
    ce = torch.nn.functional.cross_entropy(logits[[0, 2]], some[[0, 2]])
    torch.testing.assert_close(
        task_loss(logits, some, teacher, cfg), 0.5 * ce + 0.5 * output_kd_loss(logits, teacher, 2.0)
    )


def test_augment_is_refused_without_kd_and_for_tasks_that_are_not_sentence_labels(classifier_dirs, tmp_path):
    from pipeline.errors import PipelineError
    from pipeline.request import build_deploy_config, prepare_request

    with pytest.raises(Exception, match="needs kd_alpha above 0"):
        TrainConfig(augment=AugmentConfig())
    with pytest.raises(PipelineError, match=r"config.train.augment replaces words .* task conll2003 is token"):
        prepare_request(
            "distill",
            "conll2003",
            model=str(classifier_dirs["bert"]),
            overrides=["config.train.augment.copies=1", "config.student.layers=1"],
            output_dir=str(tmp_path / "out"),
        )
    assert (
        build_deploy_config(
            "distill", "sst2", overrides=["config.train.augment.copies=2"]
        ).method_config.train.augment.copies
        == 2
    )


def test_a_distill_stage_learns_from_the_augmented_sentences(classifier_dirs, tmp_path):
    overrides = [
        "config.student.layers=1",
        "config.transfer_steps=0",
        "config.relation=0",
        "config.train.max_steps=4",
        "config.train.batch_size=8",
        "config.train.augment.copies=1",
    ]
    result = compress_sample("distill", overrides, classifier_dirs["bert"], tmp_path, max_train=32)
    (stage,) = result["stages"]
    assert stage["augmented"]["examples"] == 32 and stage["augmented"]["changed"] > 0
    rows = stage["teacher_outputs"]  # 4 batches of 8 from the 64 sentences, half of them unlabelled copies
    assert rows["computed"] + rows["read_back"] == 32 and rows["computed"] > 16  # a copy left unchanged is read back

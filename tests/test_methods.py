"""Every registered method, in-process on a tiny model (BERT, with a sequence, token-classification and
question-answering head, and as a sentence-embedding model; every other family under `e2e`, for time): it
applies, leaves no training wrapper behind, returns the model on the CPU, compacts exactly and reloads exactly at
its per-layer shapes. The same matrix runs on CUDA where
there is a GPU (`gpu` marker): a method whose loss closes over the teacher must still see it on the training
device."""

import copy
import functools

import pytest
import torch

from pipeline.compress.compaction import compact_
from pipeline.compress.context import StageContext
from pipeline.compress.masking import MaskedLinear
from pipeline.compress.registry import methods
from pipeline.data.encoding import encode, encode_task
from pipeline.data.loaders import load_task_data
from pipeline.data.tasks import TOKEN, get_task
from pipeline.kinds.squad import QASplit, Question
from pipeline.kinds.tagged import TaggedSplit
from pipeline.models.io import auto_class, load_model, save_model
from tests.helpers import (
    FAMILY_TYPES,
    SHARED_DATA,
    sample_logits,
    sample_sentences,
    tiny_family_model,
    tiny_family_tokenizer,
    tiny_model,
)

TINY_TRAIN = {"max_steps": 4, "batch_size": 16, "epochs": 10}
# the smallest budget of each method that still runs every one of its phases
MATRIX = {
    "distill": {"student": {"layers": 1}, "relation_heads": 4, "hidden": 1.0, "transfer_steps": 2},
    "gmp": {"sparsity": 0.5, "prune_every": 1, "train": {**TINY_TRAIN, "max_steps": 6, "cycles": 3}},
    "mlp_fusion": {"ratio": 0.5, "n_init": 1, "tune_steps": 2},
    "none": {},
    "smp": {"sparsity": 0.5, "prune_steps": 2, "recover_steps": 2, "train": {**TINY_TRAIN, "lr": 2e-2}},
}
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def test_every_registered_method_is_in_the_matrix():
    assert sorted(MATRIX) == sorted(m.name for m in methods())


def test_a_method_name_registered_twice_is_an_error():
    from pipeline.compress.methods.smp.config import SmpConfig
    from pipeline.compress.registry import method, registry

    with pytest.raises(ValueError, match="method name\\(s\\) registered twice: smp"):
        registry(method(SmpConfig, None), method(SmpConfig, None))


@functools.cache
def _encoded(family: str):
    """The sample, tokenised for `family`'s tokenizer (read, trained and encoded once per family)."""
    data = load_task_data("sst2", source="sample", max_train=96, max_dev=32)
    return encode_task(tiny_family_tokenizer(family), data, 32)


def _context(family: str):
    train_enc, val_enc = _encoded(family)
    teacher = tiny_model("bert", layers=2) if family == "bert" else tiny_family_model(family, layers=2)
    teacher.requires_grad_(False)
    return StageContext(teacher=teacher, train=train_enc, validation=val_enc, task=get_task("sst2"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(MATRIX))
def test_method_applies_compacts_and_reloads_exactly(name, device, tmp_path):
    _check_method(name, device, "bert", tmp_path)


@functools.cache
def _span_encoded(task: str):
    """The shipped sample's sentences as NER sentences (a person first, a place last) or as questions answered by
    their first word, tokenised once per task: (train, validation)."""
    spec, tok = get_task(task), tiny_family_tokenizer("bert")
    sentences = [s for s in sample_sentences("train") if len(s.split()) >= 3][:120]
    if spec.kind == TOKEN:
        words = [tuple(s.split()) for s in sentences]
        split = TaggedSplit(words, [(1, 2, *[0] * (len(w) - 3), 5) for w in words], spec.labels)
    else:
        split = QASplit(
            [Question(str(i), "what is said first?", s, ((s.split()[0], 0),)) for i, s in enumerate(sentences)]
        )
    return encode(tok, split.head(96), 32), encode(tok, split.subset(range(96, 120)), 32)


def _span_context(task: str) -> StageContext:
    """A fresh tiny BERT teacher with the task's head, over the task's encoded sample."""
    spec = get_task(task)
    config = tiny_model("bert", layers=2).config
    config.num_labels = spec.num_labels
    torch.manual_seed(0)
    teacher = auto_class(spec.kind).from_config(config).eval().requires_grad_(False)
    train, validation = _span_encoded(task)
    return StageContext(teacher=teacher, train=train, validation=validation, task=spec)


@pytest.mark.parametrize("name", sorted(set(MATRIX) - {"none"}))
@pytest.mark.parametrize("task", ["conll2003", "squad"])
def test_method_on_token_classification_and_question_answering(name, task, tmp_path):
    _check_method(name, "cpu", "bert", tmp_path, _span_context(task))


def _embedding_context() -> StageContext:
    """A tiny BERT sentence embedder (mean pooling) as its own teacher, over STS-B's first training sentences."""
    from pipeline.models.embedding import SentenceEmbedder

    spec, tok = get_task("stsb"), tiny_family_tokenizer("bert")
    torch.manual_seed(0)
    teacher = SentenceEmbedder.from_config(tiny_model("bert", layers=2).config).eval().requires_grad_(False)
    split = load_task_data("stsb", data_dir=SHARED_DATA / "stsb", max_train=60, max_dev=8).train
    return StageContext(teacher=teacher, train=encode(tok, split.head(48), 32),
                        validation=encode(tok, split.subset(range(48, 60)), 32), task=spec)  # fmt: skip


@pytest.mark.parametrize("name", sorted(set(MATRIX) - {"none"}))
def test_method_on_sentence_embeddings(name, tmp_path):
    """Every method learns the teacher's vectors (no labels), and its student compacts and reloads exactly."""
    _check_method(name, "cpu", "bert", tmp_path, _embedding_context())


@pytest.mark.e2e
@pytest.mark.parametrize("name", sorted(set(MATRIX) - {"none"}))
@pytest.mark.parametrize("family", [k for k in FAMILY_TYPES if k != "bert"])
def test_method_on_every_family(name, family, tmp_path):
    _check_method(name, "cpu", family, tmp_path)


def _check_method(name: str, device: str, family: str, tmp_path, ctx: StageContext | None = None) -> None:
    method = next(m for m in methods() if m.name == name)
    settings = copy.deepcopy(MATRIX[name])
    settings["train"] = {**TINY_TRAIN, **settings.get("train", {}), "device": device}
    cfg = method.config_cls.model_validate(settings)
    ctx = ctx or _context(family)
    model = copy.deepcopy(ctx.teacher).requires_grad_(True)  # a trainable copy, as the compress stage loads it
    model = method.apply(model, cfg, ctx)
    assert not any(isinstance(m, MaskedLinear) for m in model.modules())
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert all(p.device.type == "cpu" for p in ctx.teacher.parameters())
    before = sample_logits(model)
    compact_(model)
    after = sample_logits(model)
    assert torch.allclose(after, before, atol=1e-5)
    save_model(model, None, tmp_path / "saved")  # the reload is about the weights: no tokenizer needed
    assert torch.equal(sample_logits(load_model(tmp_path / "saved")), after)

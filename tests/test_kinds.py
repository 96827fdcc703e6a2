"""The task kinds' matrix: every kind has its pipeline half (`pipeline/kinds/`) and its server half
(`serving/kinds/`), each answering for every part of its adapter, and each reads, encodes, runs and scores its
built-in task's real data through the generic code that asks it."""

import numpy as np
import pytest

from pipeline.kinds import KIND_NAMES, KINDS, Kind, kind_of
from serving.artifact import EMBEDDING, HEAD_SUFFIXES
from serving.kinds import SERVED, ServedKind, served_kind
from tests.helpers import SHARED_DATA

TASK_OF_KIND = {
    "sequence-classification": "sst2",
    "token-classification": "conll2003",
    "question-answering": "squad",
    "sentence-embedding": "stsb",
}


def missing_parts(adapter: object, base: type) -> list[str]:
    """The methods of `base` that only raise NotImplementedError and that `adapter`'s class does not override,
    and the class attributes `base` declares that it leaves unset."""
    import inspect

    missing = []
    for name, member in vars(base).items():
        abstract = inspect.isfunction(member) and "raise NotImplementedError" in inspect.getsource(member)
        if abstract and getattr(type(adapter), name) is member:
            missing.append(name)
    missing += [n for n in base.__annotations__ if not hasattr(adapter, n)]
    return missing


def test_every_kind_has_both_halves_and_every_part():
    assert set(KIND_NAMES) == {k.name for k in SERVED} == {*HEAD_SUFFIXES, EMBEDDING} == set(TASK_OF_KIND)
    for kind in KINDS:
        assert missing_parts(kind, Kind) == [], kind.name
        assert missing_parts(served_kind(kind.name), ServedKind) == [], kind.name
    assert len({k.rows for k in KINDS}) == len(KINDS)  # the teacher-output store tells them apart


def test_a_kind_without_a_part_is_seen():
    class Half(type(kind_of("sequence-classification"))):
        scores = Kind.scores  # back to the base's NotImplementedError

    assert missing_parts(Half(), Kind) == ["scores"]
    with pytest.raises(Exception, match="unknown task kind 'regression'"):
        kind_of("regression")


@pytest.mark.parametrize("name", KIND_NAMES)
def test_each_kind_reads_encodes_runs_and_scores_its_task(name, tmp_path):
    """Through the generic code only (loaders, encode, predict_logits, scores): the built-in task of the kind on its
    real data (the shipped SST-2 sample, CoNLL-2003 and SQuAD from the shared data), a tiny random model of the
    kind's head."""
    import torch

    from pipeline.data.encoding import encode
    from pipeline.data.loaders import load_task_data
    from pipeline.data.tasks import get_task
    from pipeline.models.io import auto_class
    from pipeline.train.metrics import example_scores, predict_logits, scores
    from tests.helpers import tiny_model, tiny_tokenizer

    spec = get_task(TASK_OF_KIND[name])
    data_dir = None if spec.has_sample else SHARED_DATA / spec.name
    data = load_task_data(spec, data_dir, max_train=64, max_dev=16)
    assert data.train.kind == name and len(data.dev) == 16
    enc = encode(tiny_tokenizer("bert"), data.dev, 128)
    assert enc.kind == name and len(enc) >= 16
    config = tiny_model("bert", num_labels=max(2, spec.num_labels)).config
    torch.manual_seed(0)
    model = auto_class(name).from_config(config).eval()
    rows = predict_logits(model, enc)
    metrics = scores(rows, enc)
    low = -100 if name == "sentence-embedding" else 0  # correlations (Spearman, Pearson x 100) may be negative
    assert spec.metric in metrics and all(low <= v <= 100 for v in metrics.values())
    per_example = example_scores(rows, enc)
    assert per_example is None or (len(per_example) == len(data.dev) and np.isfinite(per_example).all())

"""The artifact in its users' environment: Optimum's `ORTModelFor*` classes and sentence-transformers' ONNX backend
load it as it is and answer what the project's serving session answers.

Both import optimum-onnx, whose releases so far require transformers < 4.58, while the project runs on transformers
5 and makes its artifacts without optimum. So these tests run in a second, small virtualenv (`requirements/
consumer.txt`: the loaders and pytest, not this project), on artifacts made beforehand in the project's own
environment: `python -m tests.consumer.make_artifacts DIR`, then `CONSUMER_ARTIFACTS=DIR pytest --confcutdir
tests/consumer tests/consumer`. `.ci/run` does both; elsewhere they skip, saying why.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("optimum.onnxruntime", reason="needs optimum-onnx (transformers < 4.58): the consumer virtualenv")
ARTIFACTS = os.environ.get("CONSUMER_ARTIFACTS")
if not ARTIFACTS:
    pytest.skip("CONSUMER_ARTIFACTS names no folder of `tests.consumer.make_artifacts`", allow_module_level=True)
ROOT = Path(ARTIFACTS)
EXPECTED = json.loads((ROOT / "expected.json").read_text())


def _of(kind: str) -> list[str]:
    return sorted(name for name, entry in EXPECTED.items() if entry["kind"] == kind)


@pytest.mark.parametrize("name", _of("family"))
@pytest.mark.parametrize("graph", ["model.onnx", "model.int8.onnx"])
def test_optimum_runs_every_familys_graph_as_the_project_does(name, graph):
    import torch
    from optimum.onnxruntime import ORTModelForSequenceClassification

    entry = EXPECTED[name]
    model = ORTModelForSequenceClassification.from_pretrained(ROOT / name, file_name=graph)
    logits = model(**{k: torch.tensor(v) for k, v in entry["inputs"].items()}).logits.numpy()
    np.testing.assert_allclose(logits, np.array(entry[graph]), atol=1e-4)


def _pipeline(name: str, graph: str):
    from optimum.onnxruntime import (
        ORTModelForQuestionAnswering,
        ORTModelForSequenceClassification,
        ORTModelForTokenClassification,
    )
    from transformers import AutoTokenizer, pipeline

    kind = EXPECTED[name]["kind"]
    classes = {"sequence-classification": ("text-classification", ORTModelForSequenceClassification),
               "token-classification": ("token-classification", ORTModelForTokenClassification),
               "question-answering": ("question-answering", ORTModelForQuestionAnswering)}  # fmt: skip
    task, ort_class = classes[kind]
    options = {"aggregation_strategy": "simple"} if kind == "token-classification" else {}
    model = ort_class.from_pretrained(ROOT / name, file_name=graph)
    return pipeline(task, model=model, tokenizer=AutoTokenizer.from_pretrained(ROOT / name), **options)


def _same(got: list[dict], want: list[dict], keys: tuple[str, ...]) -> None:
    assert [tuple(g[k] for k in keys) for g in got] == [tuple(w[k] for k in keys) for w in want]
    assert [g["score"] for g in got] == pytest.approx([w["score"] for w in want], abs=1e-4)


TASKS = [*_of("sequence-classification"), *_of("token-classification"), *_of("question-answering")]


@pytest.mark.parametrize("name", TASKS)
def test_transformers_pipelines_over_optimum_answer_as_the_server(name):
    entry = EXPECTED[name]
    run = _pipeline(name, "model.onnx")
    for item, want in zip(entry["inputs"], entry["model.onnx"], strict=True):
        if entry["kind"] == "sequence-classification":
            text = {"text": item[0], "text_pair": item[1]} if isinstance(item, list) else item
            _same(run([text]), want[:1], ("label",))
        elif entry["kind"] == "token-classification":
            _same(run(item), want, ("entity_group", "word", "start", "end"))
        else:
            windows = {k: entry[k] for k in ("max_answer_len", "max_seq_len", "doc_stride")}
            _same([run(**item, **windows)], want[:1], ("answer", "start", "end"))


@pytest.mark.parametrize("name", TASKS)
@pytest.mark.parametrize("graph", ["model.int8.onnx", "model.fp16.onnx"])
def test_optimum_runs_each_kinds_int8_and_fp16_graphs_as_onnx_runtime_does(name, graph):
    import torch

    entry = EXPECTED[name]
    model = _pipeline(name, graph).model
    out = model(**{k: torch.tensor(v) for k, v in entry[graph]["inputs"].items()})
    for output, want in entry[graph]["outputs"].items():
        np.testing.assert_allclose(getattr(out, output).numpy(), np.array(want), atol=1e-4)


@pytest.mark.parametrize("name", _of("sentence-embedding"))
@pytest.mark.parametrize("graph", ["onnx/model.onnx", "onnx/model_qint8_avx512_vnni.onnx", "onnx/model_O4.onnx"])
def test_sentence_transformers_onnx_backend_gives_the_servers_vectors(name, graph):
    from sentence_transformers import SentenceTransformer

    entry = EXPECTED[name]
    model = SentenceTransformer(str(ROOT / name), backend="onnx", model_kwargs={"file_name": graph}, device="cpu")
    theirs, ours = model.encode(entry["inputs"]), np.array(entry[graph])
    cosines = (theirs * ours).sum(1) / np.linalg.norm(theirs, axis=1) / np.linalg.norm(ours, axis=1)
    assert cosines.min() >= 0.9999
    np.testing.assert_allclose(np.linalg.norm(theirs, axis=1), 1.0, atol=1e-5)

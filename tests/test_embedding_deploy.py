"""A sentence-embedding model compressed end to end on real STS-B pairs (a tiny BERT base folder in
sentence-transformers' layout, CLS pooling): the teacher is the base model itself, `distill+smp` learns its vectors,
the graph has both outputs with the pooling inside it and sentence-transformers' layout (its ONNX backend loads
such an artifact as it is: tests/consumer/), and the server answers the same vectors at `/embed` (Text Embeddings
Inference's shape), `/predict` and `/v2/.../infer`."""

import json

import httpx
import numpy as np
import pytest

from export.sentence_transformers import st_onnx_missing
from pipeline.errors import PipelineError
from tests.helpers import SHARED_DATA, ThreadServer, json_error, quick_deploy, write_tiny_model_dir
from tests.test_chains import CHAIN_BUDGET

pytestmark = pytest.mark.e2e

TEXTS = ["A man is playing a guitar.", "Someone plays an instrument.", "The cat sleeps on the mat."]


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("embedding")
    base = write_tiny_model_dir(tmp / "base", classifier=False, layers=4, heads=4)
    (base / "1_Pooling").mkdir()
    (base / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    corpus = tmp / "corpus"  # unlabelled sentences beside the task's own texts: the first 40 Wikipedia paragraphs
    corpus.mkdir()
    with (SHARED_DATA / "corpus" / "wiki_en.txt").open() as f:
        (corpus / "wiki.txt").write_text("".join(next(f) for _ in range(60)))
    task = ("--task", "stsb", "--data-dir", str(SHARED_DATA / "stsb"), "--corpus", str(corpus))
    _, out = quick_deploy("distill+smp", base, tmp, *CHAIN_BUDGET, "--set", "data.corpus_lines=40", task=task)
    return out


@pytest.fixture(scope="module")
def server(artifact):
    from serving.app import build_app
    from serving.config import ServerConfig
    from serving.session import ArtifactSession

    session = ArtifactSession(artifact, spinning=False)
    config = ServerConfig(artifact=artifact, max_items=8, max_text_chars=300, max_wait_ms=1)
    with ThreadServer(build_app(config, session, "stsb-tiny")) as running:
        yield running.url


def _vectors(url: str, texts: list[str]) -> np.ndarray:
    response = httpx.post(f"{url}/embed", json={"inputs": texts, "normalize": True}, timeout=60)
    assert response.status_code == 200, response.text
    return np.array(response.json())


def test_the_artifact_has_both_outputs_pooling_inside_and_the_embedders_layout(artifact):
    import onnx

    for graph in ("model.onnx", "model.int8.onnx", "onnx/model.onnx", "onnx/model_qint8_avx512_vnni.onnx"):
        outputs = [o.name for o in onnx.load(str(artifact / graph), load_external_data=False).graph.output]
        assert outputs == ["last_hidden_state", "sentence_embedding"], graph
    config = json.loads((artifact / "config.json").read_text())
    assert config["architectures"] == ["BertModel"]  # an embedder to Text Embeddings Inference, not a classifier
    assert config["sentence_pooling"] == "cls"
    assert json.loads((artifact / "1_Pooling" / "config.json").read_text())["pooling_mode_cls_token"] is True
    modules = json.loads((artifact / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[1] for m in modules] == ["Transformer", "Pooling", "Normalize"]
    manifest = json.loads((artifact / "manifest.json").read_text())["files"]
    assert {"modules.json", "onnx/model.onnx", "onnx/model_qint8_avx512_vnni.onnx"} <= set(manifest)
    report = json.loads((artifact / "report.json").read_text())
    data = report["data"]
    assert data["corpus"]["lines"] == 40 and data["corpus"]["files"] == 1  # --corpus, cut at data.corpus_lines
    assert report["teacher"]["steps"] == 0  # the base model is its own teacher, scored, not fine-tuned
    parity = report["validation"]["onnx_parity"]
    assert parity["argmax_agreement"] is None and parity["min_cosine"] >= 0.9999
    # sentence-transformers' own int8 export of the dense model is timed in the same run, a baseline beside dense int8
    # (it exports through optimum-onnx, which requires transformers < 4.58: elsewhere the report says so)
    st_int8 = report["export"]["baselines"]["dense-int8-st"]
    timed = "dense-int8-st" in {r["model"] for r in report["speed"]["speedups"]}
    if st_onnx_missing():
        assert st_int8 == {"skipped": st_onnx_missing()} and not timed
    else:
        assert st_int8["library"] == "sentence-transformers" and st_int8["cached"] is False  # made once per teacher
        assert timed
    card = (artifact / "README.md").read_text()
    assert "pipeline_tag: sentence-similarity" in card and 'backend="onnx"' in card


def test_a_corpus_adds_unlabelled_sentences_to_training_and_only_embedding_tasks_take_one(tmp_path):
    """`--corpus`: the task's own texts, then the corpus lines (what the student distils the teacher's vectors on);
    validation and dev stay the scored pairs. A classification task refuses it in one line."""
    from pipeline.data.loaders import DataRef
    from pipeline.data.tasks import get_task

    (tmp_path / "a.txt").write_text("First sentence.\n\nSecond sentence.\n")
    plain = DataRef(get_task("stsb"), "tsv", str(SHARED_DATA / "stsb"), max_train=100).load()
    data = DataRef(get_task("stsb"), "tsv", str(SHARED_DATA / "stsb"), max_train=100, corpus=str(tmp_path)).load()
    assert data.train.texts == [*plain.train.texts, "First sentence.", "Second sentence."]
    assert data.validation == plain.validation and data.dev == plain.dev
    assert data.fingerprint != plain.fingerprint and data.describe()["corpus"]["lines"] == 2
    with pytest.raises(PipelineError, match="--corpus gives unlabelled sentences to sentence-embedding tasks; task "
                       "sst2 is sequence-classification"):  # fmt: skip
        DataRef(get_task("sst2"), "sample", corpus=str(tmp_path)).load()


def test_an_embedder_is_scored_on_another_embedding_task_and_only_on_one(artifact):
    """`pipeline evaluate --task squad-retrieval` on an STS-B artifact: its vectors rank SQuAD paragraphs; a
    classification task is refused in one line."""
    from pipeline.evaluate import evaluate_artifact

    squad = str(SHARED_DATA / "squad")
    result = evaluate_artifact(artifact, squad, "dev", 20, task_name="squad-retrieval")
    assert result["task"] == "squad-retrieval" and result["examples"] == 20
    assert {"ndcg_at_10", "recall_at_1", "recall_at_10"} <= set(result["metrics"]["onnx_int8"])
    with pytest.raises(PipelineError, match="--task sst2 is sequence-classification: an artifact is scored on"):
        evaluate_artifact(artifact, None, "dev", 20, task_name="sst2")


def test_the_graphs_vectors_are_its_cls_token_pooled_and_normalised(artifact):
    """The `sentence_embedding` output is `last_hidden_state`'s first token over its norm: the pooling the base
    folder named, inside the graph."""
    import onnxruntime as ort
    from transformers import AutoTokenizer

    session = ort.InferenceSession(str(artifact / "model.onnx"), providers=["CPUExecutionProvider"])
    enc = AutoTokenizer.from_pretrained(str(artifact))(TEXTS, padding=True, return_tensors="np")
    names = [i.name for i in session.get_inputs()]
    tokens, vectors = session.run(None, {n: enc[n].astype(np.int64) for n in names})
    first = tokens[:, 0]
    np.testing.assert_allclose(vectors, first / np.linalg.norm(first, axis=1, keepdims=True), atol=1e-5)


def test_embed_predict_and_infer_answer_the_same_vectors(server):
    vectors = _vectors(server, TEXTS)
    assert vectors.shape == (3, 32)
    single = httpx.post(f"{server}/embed", json={"inputs": TEXTS[0]}, timeout=60).json()
    np.testing.assert_allclose(np.array(single), vectors[:1], atol=1e-6)  # a list of one vector, as TEI answers
    predicted = httpx.post(f"{server}/predict", json={"inputs": TEXTS}, timeout=60).json()
    np.testing.assert_allclose(np.array(predicted), vectors, atol=1e-6)
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [3], "data": TEXTS}]}
    out = httpx.post(f"{server}/v2/models/stsb-tiny/infer", json=body, timeout=60).json()["outputs"]
    assert [(o["name"], o["datatype"], o["shape"]) for o in out] == [("embedding", "FP32", [3, 32])]
    np.testing.assert_allclose(np.array(out[0]["data"]).reshape(3, 32), vectors, atol=1e-6)


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"inputs": TEXTS, "normalize": False}, 422, "'normalize' must be true"),
        ({"inputs": 3}, 422, "'inputs' must be a string or a list of strings"),
        ({"inputs": ["a", 4]}, 422, "inputs[1]"),
        ({"texts": TEXTS}, 422, "unknown field(s) in request body: 'texts'"),
        ({"inputs": []}, 422, "empty list"),
        ({"inputs": ["a"] * 9}, 413, "at most 8 per request"),
        ({"inputs": TEXTS, "truncation_direction": "Left"}, 422, "truncation_direction"),
    ],
)
def test_embed_refuses_a_bad_request_in_one_line(server, body, status, needle):
    json_error(httpx.post(f"{server}/embed", json=body, timeout=60), status, needle)

"""Serving token-classification and question-answering artifacts (tiny random BERTs with CoNLL-2003's tags and
SQuAD's heads) over a real server on loopback: the Hugging Face formats and the Open Inference Protocol answer
what transformers' pipelines answer on the same artifact, long contexts are windowed, and a request shaped for
another kind is refused naming what the artifact expects. The binary tensor data extension is spoken by
`tritonclient` itself, for every kind."""

from __future__ import annotations

import json
import struct

import httpx
import numpy as np
import pytest

from tests.helpers import QA_PIPELINE, ThreadServer, json_error, needs_qa_pipeline, sample_sentences, tiny_artifact

KINDS = {"token-classification": "conll2003", "question-answering": "squad", "sequence-classification": "sst2"}
QUESTION = "what comes first?"


def _contexts(n: int, sentences: int = 12) -> list[str]:
    """Contexts of `sentences` dev sentences: over 128 tokens, so each is cut into several windows."""
    texts = sample_sentences("dev")
    return [" ".join(texts[i * 3 : i * 3 + sentences]) for i in range(n)]


def _name(task: str) -> str:
    return f"{task}-tiny-serving"


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """An in-process server per kind over the real session (uvicorn on a loopback port), and its session."""
    from serving.app import build_app
    from serving.config import ServerConfig
    from serving.session import ArtifactSession

    base = tmp_path_factory.mktemp("spans")
    running, out = [], {}
    try:
        for kind, task in KINDS.items():
            artifact = tiny_artifact(base, task)
            session = ArtifactSession(artifact, spinning=False)
            config = ServerConfig(artifact=artifact, max_items=8, max_text_chars=3000, max_wait_ms=1)
            server = ThreadServer(build_app(config, session, _name(task))).__enter__()
            running.append(server)
            out[kind] = (server.url, session, artifact)
        yield out
    finally:
        for server in running:
            server.__exit__()


@pytest.fixture(scope="module")
def client():
    with httpx.Client(timeout=60) as c:
        yield c


def _pipeline(kind, artifact):
    """transformers' own pipeline on the artifact's torch model: the reference the server answers as (Optimum's
    ORTModelFor* classes on the graph answer as this too: tests/consumer/)."""
    from transformers import AutoTokenizer, pipeline

    from pipeline.models.io import load_model
    from serving.artifact import PYTORCH

    tok = AutoTokenizer.from_pretrained(artifact)
    options = {"aggregation_strategy": "simple"} if kind == "token-classification" else {}
    return pipeline(kind, model=load_model(artifact / PYTORCH), tokenizer=tok, **options)


def _same(got: list[dict], want: list[dict], keys: tuple[str, ...]):
    assert [tuple(g[k] for k in keys) for g in got] == [tuple(w[k] for k in keys) for w in want]
    assert [g["score"] for g in got] == pytest.approx([w["score"] for w in want], abs=1e-5)


ENTITY_KEYS = ("entity_group", "word", "start", "end")
ANSWER_KEYS = ("answer", "start", "end")


def test_served_entities_equal_the_token_classification_pipeline(servers, client):
    url, _, artifact = servers["token-classification"]
    texts = sample_sentences("dev")[:6]
    reference = _pipeline("token-classification", artifact)
    one = client.post(f"{url}/predict", json={"inputs": texts[0]})
    assert one.status_code == 200, one.text
    _same(one.json(), reference(texts[0]), ENTITY_KEYS)
    many = client.post(f"{url}/predict", json={"inputs": texts, "parameters": {"aggregation_strategy": "simple"}})
    assert many.status_code == 200, many.text
    assert len(many.json()) == len(texts) and any(many.json())
    for got, text in zip(many.json(), texts, strict=True):
        _same(got, reference(text), ENTITY_KEYS)

    body = {"inputs": [{"name": "text", "shape": [len(texts)], "datatype": "BYTES", "data": texts}]}
    v2 = client.post(f"{url}/v2/models/{_name('conll2003')}/infer", json=body)
    assert v2.status_code == 200, v2.text
    out = {o["name"]: o for o in v2.json()["outputs"]}
    flat = [(i, e) for i, entities in enumerate(many.json()) for e in entities]
    assert out["text_index"]["data"] == [i for i, _ in flat] and out["start"]["datatype"] == "INT64"
    for key in ENTITY_KEYS:
        assert out[key]["data"] == [e[key] for _, e in flat] and out[key]["shape"] == [len(flat)]
    assert out["score"]["data"] == pytest.approx([e["score"] for _, e in flat], abs=1e-6)


@needs_qa_pipeline
def test_served_answers_equal_the_question_answering_pipeline_over_windows(servers, client):
    url, session, artifact = servers["question-answering"]
    contexts = _contexts(4)
    assert all(len(session.encode([_question(c)])) >= 2 for c in contexts)  # windowed
    reference = _pipeline("question-answering", artifact)
    one = client.post(f"{url}/predict", json={"inputs": {"question": QUESTION, "context": contexts[0]}})
    assert one.status_code == 200, one.text
    _same([one.json()], [reference(question=QUESTION, context=contexts[0], max_answer_len=30)], ANSWER_KEYS)
    items = [{"question": QUESTION, "context": c} for c in contexts]
    top = client.post(f"{url}/predict", json={"inputs": items, "parameters": {"top_k": 3, "max_answer_len": 8}})
    assert top.status_code == 200, top.text
    for got, context in zip(top.json(), contexts, strict=True):
        _same(got, reference(question=QUESTION, context=context, top_k=3, max_answer_len=8), ANSWER_KEYS)

    body = {"inputs": [{"name": n, "shape": [len(items)], "datatype": "BYTES", "data": [i[n] for i in items]}
                       for n in ("question", "context")]}  # fmt: skip
    v2 = client.post(f"{url}/v2/models/{_name('squad')}/infer", json=body)
    assert v2.status_code == 200, v2.text
    out = {o["name"]: o["data"] for o in v2.json()["outputs"]}
    best = [reference(question=QUESTION, context=c, max_answer_len=30) for c in contexts]
    assert out["answer"] == [b["answer"] for b in best] and out["start"] == [b["start"] for b in best]
    assert out["score"] == pytest.approx([b["score"] for b in best], abs=1e-5)


def _question(context):
    from serving.validation import Question

    return Question(QUESTION, context)


def test_model_metadata_names_each_kinds_tensors(servers, client):
    for kind, task in KINDS.items():
        meta = client.get(f"{servers[kind][0]}/v2/models/{_name(task)}").json()
        inputs, outputs = [i["name"] for i in meta["inputs"]], [o["name"] for o in meta["outputs"]]
        assert meta["parameters"]["kind"] == kind
        assert (inputs, outputs[:2]) == {
            "token-classification": (["text"], ["entity_group", "score"]),
            "question-answering": (["question", "context"], ["answer", "score"]),
            "sequence-classification": (["text"], ["label", "probabilities"]),
        }[kind]
    assert "binary_tensor_data" in client.get(f"{servers['question-answering'][0]}/v2").json()["extensions"]


def _infer(task):
    return f"/v2/models/{_name(task)}/infer"


def _bytes(name, data):
    return {"name": name, "shape": [len(data)], "datatype": "BYTES", "data": data}


LONG_QUESTION = "why " * 130
WRONG_SHAPES = [
    ("question-answering", "/predict", {"inputs": "a bare text"}, "inputs is a string, but this model answers"),
    ("question-answering", "/predict", {"inputs": [{"question": "q"}]}, "inputs[0] has no 'context'"),
    ("question-answering", "/predict", {"inputs": {"question": "q", "context": "  "}}, "inputs.context is empty"),
    ("question-answering", "/predict", {"inputs": {"question": "q", "context": "c", "text": "t"}},
     "unknown field(s) in inputs: 'text'"),
    ("question-answering", "/predict", {"inputs": {"question": "q", "context": "c"},
                                        "parameters": {"max_answer_len": 0}}, "'parameters.max_answer_len' must be"),
    ("question-answering", "/predict", {"inputs": {"question": LONG_QUESTION, "context": "a short context"}},
     "the question takes"),
    ("question-answering", "/predict", {"inputs": 5}, "'inputs' must be a question object"),
    ("question-answering", _infer("squad"), {"inputs": [_bytes("text", ["a"])]},
     "a list of 2 BYTES tensor(s) named 'question' and 'context' for this question-answering model"),
    ("question-answering", _infer("squad"), {"inputs": [_bytes("question", ["q"]), _bytes("context", ["a", "b"])]},
     "'question' has 1 elements but 'context' has 2 elements"),
    ("question-answering", _infer("squad"), {"inputs": [_bytes("question", ["q"]), _bytes("context", ["a"])],
                                              "outputs": [{"name": "label"}]}, "unknown output 'label'"),
    ("token-classification", "/predict", {"inputs": {"question": "q", "context": "c"}},
     "unknown field(s) in inputs: 'context', 'question'"),
    ("token-classification", "/predict", {"inputs": {"text": "a", "text_pair": "b"}},
     "inputs is a text pair, but this model classifies single texts"),
    ("token-classification", "/predict", {"inputs": "a", "parameters": {"aggregation_strategy": "first"}},
     "'parameters.aggregation_strategy' must be 'simple'"),
    ("token-classification", "/predict", {"inputs": "a", "parameters": {"top_k": 2}},
     "unknown field(s) in 'parameters': 'top_k'; allowed: aggregation_strategy"),
    ("token-classification", _infer("conll2003"), {"inputs": [_bytes("question", ["q"]), _bytes("context", ["c"])]},
     "a list of 1 BYTES tensor(s) named 'text' for this token-classification model, not 2 inputs"),
    ("sequence-classification", "/predict", {"inputs": {"question": "q", "context": "c"}},
     "unknown field(s) in inputs: 'context', 'question'"),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "path", "body", "needle"), WRONG_SHAPES)
def test_a_request_shaped_for_another_kind_is_a_422_naming_what_the_artifact_expects(
    servers, client, kind, path, body, needle
):
    json_error(client.post(f"{servers[kind][0]}{path}", json=body), 422, needle)


# --- the binary tensor data extension ---------------------------------------------------------------------------


def _items(kind):
    texts = sample_sentences("dev")[:5]
    if kind == "question-answering":
        return {"question": [QUESTION] * 3, "context": _contexts(3)}
    return {"text": texts}


@pytest.mark.parametrize("kind", list(KINDS))
def test_tritonclient_binary_tensors_equal_the_json_answers(servers, client, kind):
    import tritonclient.http as triton

    url, _, _ = servers[kind]
    name = _name(KINDS[kind])
    columns = _items(kind)
    json_body = {"inputs": [_bytes(n, d) for n, d in columns.items()]}
    plain = {o["name"]: o for o in client.post(f"{url}{_infer(KINDS[kind])}", json=json_body).json()["outputs"]}

    tc = triton.InferenceServerClient(url.removeprefix("http://"))
    try:
        assert tc.is_server_live() and tc.is_model_ready(name)
        inputs = []
        for n, data in columns.items():
            tensor = triton.InferInput(n, [len(data)], "BYTES")
            tensor.set_data_from_numpy(np.array([d.encode() for d in data], dtype=object), binary_data=True)
            inputs.append(tensor)
        every = tc.infer(name, inputs)  # no outputs named: tritonclient asks for all of them in binary
        some = tc.infer(name, inputs, outputs=[triton.InferRequestedOutput(n, binary_data=(n != "score"))
                                               for n in list(plain)[:2]])  # fmt: skip
    finally:
        tc.close()
    for out, o in plain.items():
        got = every.as_numpy(out)
        assert list(got.shape) == o["shape"]
        if o["datatype"] == "BYTES":
            assert [g.decode() for g in got.ravel()] == o["data"]
        else:
            assert got.ravel().tolist() == pytest.approx(o["data"], abs=1e-6)
    assert {o["name"] for o in some.get_response()["outputs"]} == set(list(plain)[:2])
    sent_plain = [o for o in some.get_response()["outputs"] if "data" in o]
    assert [o["name"] for o in sent_plain] == (["score"] if "score" in list(plain)[:2] else [])


def _binary_request(header: dict, payload: bytes, length: int | None = None) -> tuple[bytes, dict]:
    raw = json.dumps(header).encode()
    return raw + payload, {"Inference-Header-Content-Length": str(len(raw) if length is None else length)}


def _serialised(*texts: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(t)) + t for t in texts)


def _binary_input(size, **extra):
    return {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": size},
                        **extra}]}  # fmt: skip


BAD_BINARY = [
    (_binary_input(9), _serialised(b"hello"), 9999, 400, "Inference-Header-Content-Length must be the byte length"),
    (_binary_input(12), _serialised(b"hello"), None, 422, "binary_data_size 12 does not fit the 9 bytes left"),
    (_binary_input(6), _serialised(b"\xff\xfe"), None, 422, "element 0 is not valid UTF-8"),
    (_binary_input(9), _serialised(b"hello") + b"xx", None, 422, "the binary data is 11 bytes but"),
    (_binary_input(9, data=["hello"]), _serialised(b"hello"), None, 422, "has both 'data' and binary_data_size"),
    (_binary_input(5), b"\x09\x00\x00\x00h", None, 422, "element 0 says 9 bytes, but 1 are left"),
    ({"inputs": [{**_bytes("text", ["a"]), "parameters": {"shared_memory_region": "r"}}]},
     b"", None, 422, "unknown field(s) in inputs[0].parameters: 'shared_memory_region'"),
    ({"inputs": [_bytes("text", ["a"])], "parameters": {"binary_data_output": "yes"}}, b"", None, 422,
     "'parameters.binary_data_output' must be a boolean"),
    ({"inputs": [_bytes("text", ["a"])], "outputs": [{"name": "label", "parameters": {"classification": 2}}]}, b"",
     None, 422, "unknown field(s) in outputs[0].parameters: 'classification'"),
]  # fmt: skip


@pytest.mark.parametrize(("header", "payload", "length", "status", "needle"), BAD_BINARY)
def test_bad_binary_tensor_data_is_refused_naming_the_problem(servers, client, header, payload, length, status,
                                                              needle):  # fmt: skip
    url = servers["sequence-classification"][0]
    body, headers = _binary_request(header, payload, length)
    json_error(client.post(f"{url}{_infer('sst2')}", content=body, headers=headers), status, needle)
    without = client.post(f"{url}{_infer('sst2')}", content=json.dumps(_binary_input(9)).encode())
    json_error(without, 422, "the request has no Inference-Header-Content-Length header")


@pytest.mark.e2e
@pytest.mark.parametrize("kind", ["token-classification", "question-answering"])
def test_the_load_test_serves_each_kind_and_answers_as_the_pipeline(servers, kind, tmp_path):
    """`benchmarks/load_test.py` reads a CoNLL file (sentences) or a SQuAD file (questions with their contexts),
    and every served answer equals the bare session's and, on the first items, transformers' pipeline's."""
    import subprocess
    import sys
    from pathlib import Path

    _, _, artifact = servers[kind]
    sentences = sample_sentences("dev")[:12]
    if kind == "token-classification":
        data = tmp_path / "dev.txt"
        data.write_text("\n\n".join("\n".join(f"{w} O" for w in s.split()) for s in sentences) + "\n")
    else:
        data = tmp_path / "dev.json"
        paragraphs = [{"context": c, "qas": [{"id": f"q{i}", "question": QUESTION,
                                              "answers": [{"text": c.split()[0], "answer_start": 0}]}]}
                      for i, c in enumerate(_contexts(6, sentences=4))]  # fmt: skip
        data.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]}))
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "load_test.py"
    out = tmp_path / "load.json"
    args = [str(artifact), "--texts", str(data), "--requests", "24", "--concurrency", "4", "--pipeline", "6",
            "--json", str(out)]  # fmt: skip
    if kind == "question-answering" and not QA_PIPELINE:  # refused in one line; the rest runs without it
        refused = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=300)
        assert refused.returncode == 2 and "no question-answering pipeline" in refused.stderr.splitlines()[-1]
        args[args.index("--pipeline") + 1] = "0"
    result = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    figures = json.loads(out.read_text())
    assert figures["server"]["errors"] == 0 and figures["labels_equal"] == figures["labels_compared"] == 24
    if kind == "token-classification" or QA_PIPELINE:
        assert figures["pipeline_equal"] == figures["pipeline_compared"] == 6


def test_the_session_windows_at_the_length_the_artifact_was_trained_at(servers, tmp_path):
    """The task block's `max_length` (what export stamps: the training length, QA's 384) is the default; an
    explicit `max_length` (`--max-length`) wins; a block from before it says nothing means 128."""
    import shutil

    from serving.session import ArtifactSession

    artifact = servers["question-answering"][2]
    copy = tmp_path / "artifact"
    shutil.copytree(artifact, copy)
    config = json.loads((copy / "config.json").read_text())
    config["encoder_deploy_task"]["max_length"] = 64
    (copy / "config.json").write_text(json.dumps(config))
    trained = ArtifactSession(copy, verify=False)
    windows = trained.encode([_question(_contexts(1)[0])])
    assert (trained.max_length, trained.stride) == (64, 32) and max(trained.tokens(w) for w in windows) == 64
    assert ArtifactSession(copy, verify=False, max_length=96).max_length == 96
    assert "max_length" not in json.loads((artifact / "config.json").read_text())["encoder_deploy_task"]
    assert ArtifactSession(artifact).max_length == 128

"""Sentence-pair serving over a real tiny pair artifact (RTE's labels and task block): both protocols, the
refusals both ways, micro-batching, and tokenisation identical to the pipeline's.

The single-text refusals of pairs are in `test_serving.py`'s table, against its single-text artifact.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from tests.helpers import (
    SERVING_LIMITS,
    GatedModel,
    ServerProcess,
    ThreadServer,
    gated_app,
    json_error,
    metric_samples,
    tiny_artifact,
    wait_until,
)

NAME = "rte-tiny-serving"
INFER = f"/v2/models/{NAME}/infer"
PAIRS = [
    ("A man plays the guitar on stage.", "Someone is playing music."),
    ("The cat sleeps.", "A dog barks loudly at the mailman."),
    ("a " * 140, "a short hypothesis that must survive truncation"),  # 280 characters, over 128 tokens together
]


def _pair(a, b):
    return {"text": a, "text_pair": b}


def _tensors(first, second=None, **kw):
    inputs = [{"name": "text", "shape": [len(first)], "datatype": "BYTES", "data": first, **kw}]
    if second is not None:
        inputs.append({"name": "text_pair", "shape": [len(second)], "datatype": "BYTES", "data": second})
    return {"inputs": inputs}


@pytest.fixture(scope="module")
def pair_artifact(tmp_path_factory):
    return tiny_artifact(tmp_path_factory.mktemp("pairs"), task="rte")


@pytest.fixture(scope="module")
def pair_session(pair_artifact):
    from serving.session import ArtifactSession

    return ArtifactSession(pair_artifact)


@pytest.fixture(scope="module")
def pair_server(pair_artifact, tmp_path_factory):
    with ServerProcess(pair_artifact, *SERVING_LIMITS, log=tmp_path_factory.mktemp("srv") / "server.log") as proc:
        yield proc.url


def test_the_session_tokenises_pairs_as_the_pipeline(pair_artifact, pair_session):
    """Two segments (token type ids 0 then 1), truncated longest-first at 128 tokens: what training saw."""
    from pipeline.data.encoding import encode
    from pipeline.data.loaders import Split
    from pipeline.models.folders import load_tokenizer
    from serving.artifact import ArtifactError

    assert pair_session.pair and pair_session.labels == ["entailment", "not_entailment"]
    reference = encode(load_tokenizer(pair_artifact), Split(PAIRS, [0] * len(PAIRS)), 128).features
    for ours, theirs in zip(pair_session.tokenizer.encode_batch(PAIRS), reference, strict=True):
        n = sum(ours.attention_mask)
        assert ours.ids[:n] == theirs["input_ids"] and ours.type_ids[:n] == theirs["token_type_ids"]
        assert 1 in theirs["token_type_ids"]
    assert len(reference[2]["input_ids"]) == 128
    with pytest.raises(ArtifactError, match="reads sentence pairs"):
        pair_session.logits(["a single text"])


def test_pairs_on_predict_and_the_inference_protocol(pair_server, pair_session, client):
    expected = pair_session.predict(PAIRS, top_k=None)
    one = client.post(f"{pair_server}/predict", json={"inputs": _pair(*PAIRS[0])})
    assert one.status_code == 200, one.text
    assert [x["label"] for x in one.json()] == [expected[0][0]["label"]]
    many = client.post(
        f"{pair_server}/predict", json={"inputs": [_pair(*p) for p in PAIRS], "parameters": {"top_k": None}}
    )
    assert many.status_code == 200, many.text
    for got, want in zip(many.json(), expected, strict=True):
        assert [g["label"] for g in got] == [w["label"] for w in want]
        assert [g["score"] for g in got] == pytest.approx([w["score"] for w in want], abs=1e-5)

    body = _tensors([a for a, _ in PAIRS], [b for _, b in PAIRS])
    v2 = client.post(f"{pair_server}{INFER}", json={"id": "r1", **body})
    assert v2.status_code == 200, v2.text
    out = {o["name"]: o for o in v2.json()["outputs"]}
    assert out["label"]["data"] == [e[0]["label"] for e in expected] and v2.json()["id"] == "r1"
    logits = np.array(out["logits"]["data"]).reshape(out["logits"]["shape"])
    assert abs(logits - pair_session.logits(PAIRS)).max() < 1e-5

    meta = client.get(f"{pair_server}/v2/models/{NAME}").json()
    assert [i["name"] for i in meta["inputs"]] == ["text", "text_pair"]
    assert meta["parameters"]["pair"] is True and meta["parameters"]["task"] == "rte"


PAIR_BAD = [
    (
        "/predict",
        {"inputs": "just one text"},
        422,
        "inputs is a single text, but this model classifies sentence pairs",
    ),
    ("/predict", {"inputs": [_pair("a", "b"), "c"]}, 422, "inputs[1] is a single text"),
    ("/predict", {"inputs": {"text_pair": "b"}}, 422, "inputs has no 'text'"),
    ("/predict", {"inputs": {"text": "a", "text_pair": "b", "label": 1}}, 422, "unknown field(s) in inputs: 'label'"),
    ("/predict", {"inputs": _pair("a", 3)}, 422, "inputs[0][1] is an integer; expected a string"),
    ("/predict", {"inputs": [_pair("a", "b" * 301)]}, 413, "inputs[0][1] has 301 characters; at most 300"),
    ("/predict", {"inputs": [_pair("a", "b")] * 9}, 413, "inputs has 9 texts; at most 8"),
    ("/predict", {"inputs": 7}, 422, "'inputs' must be a pair object"),
    (INFER, _tensors(["a"]), 422, "a list of 2 BYTES tensor(s) named 'text' and 'text_pair' for this sentence-pair"),
    (INFER, _tensors(["a", "b"], ["c"]), 422, "'text' has 2 elements but 'text_pair' has 1"),
    (INFER, {"inputs": _tensors(["a"])["inputs"] * 2}, 422, "input 'text' is given twice"),
    (INFER, _tensors(["a"], [3]), 422, "inputs[1].data[0] is an integer"),
]


@pytest.mark.parametrize(
    ("path", "body", "status", "needle"), PAIR_BAD, ids=[f"{i}-{b[3][:30]}" for i, b in enumerate(PAIR_BAD)]
)
def test_a_pair_model_refuses_single_texts_and_bad_pairs(pair_server, client, path, body, status, needle):
    json_error(client.post(f"{pair_server}{path}", content=json.dumps(body).encode()), status, needle)
    assert client.post(f"{pair_server}/predict", json={"inputs": _pair("still", "serving")}).status_code == 200


def test_refusals_are_counted_by_reason(pair_server, client):
    client.post(f"{pair_server}/predict", json={"inputs": "one text"})
    m = metric_samples(client, pair_server)
    assert m[("serving_errors_total", ("endpoint", "predict"), ("reason", "not_pair"))] >= 1


def test_micro_batching_gathers_concurrent_pairs(pair_artifact, pair_session):
    model = GatedModel(pair_session)
    app = gated_app(pair_artifact, model, max_batch=8, max_wait_ms=0)

    def post(p):
        return httpx.post(f"{srv.url}/predict", json={"inputs": _pair(*p)}, timeout=60)

    with ThreadServer(app) as srv, ThreadPoolExecutor(4) as pool:
        first = pool.submit(post, PAIRS[0])
        assert model.entered.wait(30)
        rest = [pool.submit(post, p) for p in PAIRS[1:]]
        wait_until(lambda: app.state.service.batcher.queued == 2)
        model.gate.set()
        responses = [f.result() for f in (first, *rest)]
    assert [r.status_code for r in responses] == [200] * 3
    assert model.calls == [1, 2]  # the two that queued while the first ran went in one call
    expected = pair_session.predict(PAIRS)
    assert [r.json()[0]["label"] for r in responses] == [e[0]["label"] for e in expected]


def test_the_load_test_sends_pairs(pair_artifact, tmp_path):
    """`benchmarks/load_test.py` on a pair artifact: the TSV's two text columns (named by the artifact's task
    block) go out as pair objects, and every served label equals the bare session's."""
    import subprocess
    import sys
    from pathlib import Path

    tsv = tmp_path / "dev.tsv"
    rows = [f"{i}\t{a}\t{b}\tentailment" for i, (a, b) in enumerate(PAIRS)]
    tsv.write_text("\n".join(["index\tsentence1\tsentence2\tlabel", *rows]) + "\n")
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "load_test.py"
    out = tmp_path / "load.json"
    args = [str(pair_artifact), "--texts", str(tsv), "--requests", "60", "--concurrency", "4", "--json", str(out)]
    result = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    figures = json.loads(out.read_text())
    assert figures["server"]["errors"] == 0 and figures["labels_equal"] == figures["labels_compared"] == 60

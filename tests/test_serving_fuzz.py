"""Property-based fuzzing of request handling: no body, however shaped, gets a 5xx or stops the server.

Two levels: the parsers alone (many examples, fast) raise nothing but `RequestError` with a 4xx; and the real
app on a loopback port answers random JSON shapes, strings and raw bytes with a 200 or a 4xx JSON error.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir

from serving.artifact import QA, SEQUENCE, TOKEN
from serving.kinds import served_kind
from serving.validation import Limits, Question, RequestError, decode_json, parse_infer, parse_predict
from tests.helpers import ThreadServer

# Hypothesis keeps caches in ./.hypothesis; not in the checkout.
set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "hypothesis-encoder-deploy")
LIMITS = Limits(max_items=8, max_text_chars=200)
FUZZ = settings(deadline=None, database=None, suppress_health_check=list(HealthCheck))

texts = st.one_of(st.text(max_size=40), st.text(max_size=250), st.sampled_from(["\ud800", "a\udfffb", "\x00", ""]))
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), texts)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
parameters = st.one_of(
    st.none(),
    json_values,
    st.fixed_dictionaries(
        {},
        optional={
            "top_k": st.one_of(st.integers(-2, 4), st.none(), json_values),
            "function_to_apply": st.one_of(st.sampled_from(["softmax", "sigmoid", "none", "tanh"]), json_values),
        },
    ),
)
inputs = st.one_of(texts, st.lists(texts, max_size=10), json_values)
predict_bodies = st.one_of(
    st.fixed_dictionaries({"inputs": inputs}, optional={"parameters": parameters}),  # mostly well-formed
    st.fixed_dictionaries({}, optional={"inputs": inputs, "parameters": parameters, "options": json_values}),
    json_values,
)
text_data = st.lists(texts, max_size=10)
tensors = st.one_of(
    text_data.map(lambda d: {"name": "text", "datatype": "BYTES", "shape": [len(d)], "data": d}),
    text_data.map(lambda d: {"name": "text", "datatype": "BYTES", "shape": [len(d), 1], "data": [[t] for t in d]}),
    st.fixed_dictionaries(
        {},
        optional={
            "name": st.one_of(st.just("text"), json_values),
            "shape": st.one_of(st.lists(st.integers(-1, 10), max_size=3), json_values),
            "datatype": st.one_of(st.sampled_from(["BYTES", "FP32", "INT64"]), json_values),
            "data": st.one_of(st.lists(st.one_of(texts, st.lists(texts, max_size=2)), max_size=10), json_values),
            "parameters": json_values,
        },
    ),
)
output_names = st.sampled_from(["label", "probabilities", "logits", "x"])
infer_bodies = st.one_of(
    st.fixed_dictionaries(
        {"inputs": st.lists(tensors, min_size=1, max_size=1)},
        optional={
            "id": st.one_of(st.text(max_size=10), st.none()),
            "outputs": st.lists(st.fixed_dictionaries({"name": output_names}), max_size=3),
        },
    ),
    st.fixed_dictionaries(
        {},
        optional={
            "id": json_values,
            "inputs": st.one_of(st.lists(tensors, max_size=2), json_values),
            "outputs": json_values,
            "parameters": json_values,
        },
    ),
    json_values,
)


def _encode(value) -> bytes:
    return json.dumps(value).encode()  # ensure_ascii: lone surrogates travel as \ud800 escapes


raw_bodies = st.one_of(
    st.binary(max_size=300),
    st.builds(lambda v, cut: _encode(v)[:cut], predict_bodies, st.integers(0, 60)),  # truncated JSON
    st.builds(lambda v, junk: _encode(v) + junk, predict_bodies, st.binary(min_size=1, max_size=4)),
)


def _parse(parser, body: bytes):
    try:
        return parser(decode_json(body), LIMITS)
    except RequestError as e:
        assert 400 <= e.status < 500 and e.message and e.reason
        return None


@FUZZ
@given(st.one_of(predict_bodies.map(_encode), raw_bodies))
def test_predict_parser_raises_only_request_errors(body):
    req = _parse(lambda payload, limits: parse_predict(payload, limits, False, served_kind(SEQUENCE)), body)
    if req is not None:
        assert 1 <= len(req.texts) <= LIMITS.max_items and all(isinstance(t, str) for t in req.texts)


@FUZZ
@given(st.one_of(infer_bodies.map(_encode), raw_bodies))
def test_infer_parser_raises_only_request_errors(body):
    req = _parse(lambda payload, limits: parse_infer(payload, limits, False, served_kind(SEQUENCE)), body)
    if req is not None:
        assert 1 <= len(req.texts) <= LIMITS.max_items and req.outputs


# Every kind of artifact: (pair, kind) as the server passes them to the parsers.
KIND_ARGS = [(False, served_kind(SEQUENCE)), (True, served_kind(SEQUENCE)), (False, served_kind(TOKEN)),
             (False, served_kind(QA))]  # fmt: skip
questions = st.fixed_dictionaries({}, optional={"question": texts, "context": texts, "text": texts})
span_parameters = st.fixed_dictionaries(
    {},
    optional={
        "top_k": st.one_of(st.integers(-1, 3), json_values),
        "max_answer_len": st.one_of(st.integers(-1, 40), json_values),
        "aggregation_strategy": st.one_of(st.sampled_from(["simple", "first"]), json_values),
    },
)
span_predict_bodies = st.fixed_dictionaries(
    {"inputs": st.one_of(questions, st.lists(questions, max_size=10), inputs)},
    optional={"parameters": st.one_of(span_parameters, parameters)},
)
binary_tensors = st.builds(
    lambda name, n, size: {"name": name, "datatype": "BYTES", "shape": [n], "parameters": {"binary_data_size": size}},
    st.sampled_from(["text", "text_pair", "question", "context"]),
    st.integers(0, 3),
    st.one_of(st.integers(-1, 40), json_values),
)
kind_infer_bodies = st.fixed_dictionaries(
    {"inputs": st.lists(st.one_of(binary_tensors, tensors), min_size=1, max_size=2)},
    optional={
        "outputs": st.lists(
            st.fixed_dictionaries(
                {"name": st.sampled_from(["answer", "word", "label", "x"])}, optional={"parameters": json_values}
            ),
            max_size=3,
        ),
        "parameters": st.one_of(json_values, st.fixed_dictionaries({"binary_data_output": json_values})),
    },
)
# a serialised BYTES tensor, or bytes that only look like one
serialised = st.lists(st.binary(max_size=12), max_size=3).map(
    lambda parts: b"".join(len(p).to_bytes(4, "little") + p for p in parts)
)
binary_parts = st.one_of(serialised, st.binary(max_size=40))


@FUZZ
@given(
    st.sampled_from(KIND_ARGS), st.one_of(span_predict_bodies.map(_encode), predict_bodies.map(_encode), raw_bodies)
)
def test_every_kinds_predict_parser_raises_only_request_errors(kind_args, body):
    req = _parse(lambda payload, limits: parse_predict(payload, limits, *kind_args), body)
    if req is not None:
        want = Question if kind_args[1].name == QA else tuple if kind_args[0] else str
        assert 1 <= len(req.texts) <= LIMITS.max_items and all(isinstance(t, want) for t in req.texts)


@FUZZ
@given(st.sampled_from(KIND_ARGS), kind_infer_bodies.map(_encode), st.one_of(st.none(), binary_parts))
def test_every_kinds_infer_parser_takes_binary_data_raising_only_request_errors(kind_args, body, binary):
    req = _parse(lambda payload, limits: parse_infer(payload, limits, *kind_args, binary=binary), body)
    if req is not None:
        assert 1 <= len(req.texts) <= LIMITS.max_items and req.outputs and req.binary <= set(req.outputs)


@pytest.fixture(scope="module")
def server_url(artifact, session):
    from serving.app import build_app
    from serving.config import ServerConfig

    config = ServerConfig(
        artifact=artifact,
        max_items=LIMITS.max_items,
        max_text_chars=LIMITS.max_text_chars,
        max_body_bytes=4096,
        max_wait_ms=0,
    )
    with ThreadServer(build_app(config, session, "tiny")) as srv:
        yield srv.url


@pytest.fixture(scope="module")
def http(server_url):
    with httpx.Client(base_url=server_url, timeout=60) as c:
        yield c


def _check(response: httpx.Response) -> None:
    assert response.status_code < 500, response.text
    if response.status_code != 200:
        assert response.status_code in (400, 404, 413, 422), response.status_code
        assert isinstance(response.json()["error"], str)


@settings(FUZZ, max_examples=120)
@given(st.one_of(predict_bodies.map(_encode), raw_bodies))
def test_http_predict_never_fails_on_the_server(http, body):
    response = http.post("/predict", content=body)
    _check(response)
    if response.status_code == 200:
        assert isinstance(response.json(), list)


@settings(FUZZ, max_examples=120)
@given(
    st.one_of(infer_bodies.map(_encode), raw_bodies),
    st.sampled_from(["tiny", "tiny/versions/1", "other", "tiny/versions/x"]),
)
def test_http_infer_never_fails_on_the_server(http, body, model):
    response = http.post(f"/v2/models/{model}/infer", content=body)
    _check(response)
    if response.status_code == 200:
        assert response.json()["model_name"] == "tiny"


def test_server_still_ready_after_fuzzing(http):
    assert http.get("/v2/health/ready").json() == {"ready": True}
    assert http.post("/predict", json={"inputs": "fine"}).status_code == 200

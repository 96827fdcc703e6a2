"""The HTTP server over a real tiny artifact: every endpoint, every bad input, batching, back-pressure, shutdown.

One artifact per session (built with the project's export and packaging functions). The main server is the
real entry point, `python -m serving`, in a subprocess on a loopback port; variants that need a model held
still (batching, a full queue, shutdown with requests in flight) run the same app in-process with a gate in
front of the real session, so they are deterministic rather than timing-dependent.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.helpers import (
    SERVING_LIMITS,
    GatedModel,
    ServerProcess,
    ThreadServer,
    gated_app,
    json_error,
    metric_samples,
    sample_sentences,
    wait_until,
)


@pytest.fixture(scope="module")
def server(artifact, tmp_path_factory):
    with ServerProcess(
        artifact, *SERVING_LIMITS, "--max-wait-ms", "2", log=tmp_path_factory.mktemp("srv") / "server.log"
    ) as p:
        yield p.url


# -- what the server answers ---------------------------------------------------------------------------------
def test_predictions_equal_the_artifact_session_on_sst2_dev(server, client, session):
    texts = sample_sentences()
    expected = session.predict(texts, top_k=None)

    def post(i):
        with httpx.Client(timeout=60) as c:
            r = c.post(f"{server}/predict", json={"inputs": texts[i : i + 8], "parameters": {"top_k": None}})
        return r.raise_for_status().json()

    with ThreadPoolExecutor(8) as pool:  # concurrent, so batches mix requests and pad to different lengths
        served = [row for rows in pool.map(post, range(0, len(texts), 8)) for row in rows]
    assert [[d["label"] for d in row] for row in served] == [[d["label"] for d in row] for row in expected]
    for got, want in zip(served, expected, strict=True):
        assert [d["score"] for d in got] == pytest.approx([d["score"] for d in want], abs=1e-5)


def test_predict_shapes_and_parameters(server, client, session):
    [best] = session.predict(["a warm , funny film"])
    single = client.post(f"{server}/predict", json={"inputs": "a warm , funny film"}).json()
    assert [d["label"] for d in single] == [best[0]["label"]] and single[0]["score"] == pytest.approx(best[0]["score"])
    as_object = client.post(f"{server}/predict", json={"inputs": {"text": "a warm , funny film"}}).json()
    assert as_object == single  # the Hugging Face object form without a text_pair is the text itself
    batch = client.post(f"{server}/predict", json={"inputs": ["good", "bad"], "parameters": {"top_k": 2}}).json()
    assert len(batch) == 2 and all(len(row) == 2 and row[0]["score"] >= row[1]["score"] for row in batch)
    clamped = client.post(f"{server}/predict", json={"inputs": "x", "parameters": {"top_k": 99}}).json()
    assert len(clamped) == 2
    logits = session.logits(["x"])[0]
    raw = client.post(
        f"{server}/predict", json={"inputs": "x", "parameters": {"function_to_apply": "none", "top_k": None}}
    ).json()
    assert sorted(d["score"] for d in raw) == pytest.approx(sorted(logits.tolist()), abs=1e-5)
    sig = client.post(f"{server}/predict", json={"inputs": "x", "parameters": {"function_to_apply": "sigmoid"}}).json()
    assert 0 < sig[0]["score"] < 1
    long_text = "word " * 55  # 275 characters: inside the limit, more tokens than max_length, truncated
    assert client.post(f"{server}/predict", json={"inputs": long_text}).status_code == 200


def test_open_inference_protocol(server, client, session):
    name = "sst2-tiny-serving"
    assert client.get(f"{server}/v2/health/live").json() == {"live": True}
    assert client.get(f"{server}/v2/health/ready").json() == {"ready": True}
    assert client.get(f"{server}/health/ready").status_code == 200
    assert client.get(f"{server}/v2").json()["name"] == "encoder-deploy-serving"
    meta = client.get(f"{server}/v2/models/{name}").json()
    assert meta["name"] == name and meta["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    assert meta["parameters"]["labels"] == ["negative", "positive"]
    assert client.get(f"{server}/v2/models/{name}/versions/1").json() == meta
    assert client.get(f"{server}/v2/models/{name}/ready").json() == {"name": name, "ready": True}

    texts = sample_sentences()[:5]
    request = {"id": "req-1", "inputs": [{"name": "text", "shape": [5], "datatype": "BYTES", "data": texts}]}
    out = client.post(f"{server}/v2/models/{name}/infer", json=request).raise_for_status().json()
    assert out["model_name"] == name and out["id"] == "req-1"
    tensors = {o["name"]: o for o in out["outputs"]}
    expected = session.predict(texts, top_k=None)
    assert tensors["label"]["data"] == [row[0]["label"] for row in expected] and tensors["label"]["shape"] == [5]
    assert tensors["probabilities"]["shape"] == [5, 2] and tensors["probabilities"]["datatype"] == "FP32"
    assert tensors["logits"]["data"] == pytest.approx(session.logits(texts).ravel().tolist(), abs=1e-5)
    column = {
        "inputs": [{"name": "text", "shape": [2, 1], "datatype": "BYTES", "data": [["a"], ["b"]]}],
        "outputs": [{"name": "label"}],
    }
    out = client.post(f"{server}/v2/models/{name}/versions/1/infer", json=column).raise_for_status().json()
    assert [o["name"] for o in out["outputs"]] == ["label"] and "id" not in out


def test_metrics(server, client):
    client.post(f"{server}/predict", json={"inputs": "fine"})
    client.post(f"{server}/predict", content=b"{")
    m = metric_samples(client, server)
    assert m[("serving_requests_total", ("code", "200"), ("endpoint", "predict"))] >= 1
    assert m[("serving_errors_total", ("endpoint", "predict"), ("reason", "bad_json"))] >= 1
    assert m[("serving_request_duration_seconds_count", ("endpoint", "predict"))] >= 2
    assert m[("serving_batch_size_count",)] >= 1 and m[("serving_inference_duration_seconds_count",)] >= 1
    assert m[("serving_tokenization_duration_seconds_count",)] >= 1
    assert ("serving_queue_depth",) in m
    assert m[("serving_model_info", ("model", "sst2-tiny-serving"), ("precision", "fp32"))] == 1


# -- bad input: a 4xx naming the problem, and the server goes on ------------------------------------------------
INFER = "/v2/models/sst2-tiny-serving/infer"


def _tensor(**kw):
    return json.dumps({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["x"], **kw}]})


BAD = [
    ("/predict", b'{"inputs": ["a",', 400, "malformed JSON"),
    ("/predict", b"", 400, "empty request body"),
    ("/predict", b"\xff\xfe{}", 400, "not valid UTF-8"),
    ("/predict", b'{"inputs": "caf\xe9"}', 400, "not valid UTF-8 (byte 0xe9"),
    ("/predict", b'{"inputs": NaN}', 400, "malformed JSON"),
    ("/predict", b"[" * 100_00, 400, "malformed JSON"),
    ("/predict", b'["a"]', 422, "request body must be a JSON object, not an array"),
    ("/predict", b'{"text": "a"}', 422, "unknown field(s) in request body: 'text'"),
    ("/predict", b'{"parameters": {}}', 422, "missing field 'inputs'"),
    ("/predict", b'{"inputs": 5}', 422, "'inputs' must be a string or a list of strings, not an integer"),
    ("/predict", b'{"inputs": ["a", null]}', 422, "inputs[1] is null; expected a string"),
    ("/predict", b'{"inputs": []}', 422, "inputs is an empty list"),
    ("/predict", json.dumps({"inputs": ["a"] * 9}).encode(), 413, "inputs has 9 texts; at most 8"),
    ("/predict", json.dumps({"inputs": ["a", "b" * 301]}).encode(), 413, "inputs[1] has 301 characters; at most 300"),
    ("/predict", b'{"inputs": "\\ud800"}', 422, "lone surrogate"),
    (
        "/v2/models/sst2-tiny-serving/infer",
        b'{"id": "\\ud800", "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}]}',
        422,
        "'id' is not valid Unicode",
    ),
    ("/predict", b'{"inputs": "a", "parameters": {"top_k": "2"}}', 422, "top_k' must be a positive integer"),
    ("/predict", b'{"inputs": "a", "parameters": {"top_k": 0}}', 422, "top_k' must be a positive integer"),
    ("/predict", b'{"inputs": "a", "parameters": {"top_k": true}}', 422, "top_k' must be a positive integer"),
    ("/predict", b'{"inputs": "a", "parameters": {"function_to_apply": "tanh"}}', 422, "function_to_apply"),
    ("/predict", b'{"inputs": "a", "parameters": [1]}', 422, "'parameters' must be a JSON object"),
    ("/predict", b'{"inputs": "a", "parameters": {"temperature": 1}}', 422, "unknown field(s) in 'parameters'"),
    ("/predict", json.dumps({"inputs": "a" * 20_001}).encode(), 413, "request body is 20015 bytes; at most 20000"),
    (INFER, b'{"inputs": "x"}', 422, "'inputs' must be a list of 1 BYTES tensor(s) named 'text'"),
    (INFER, b'{"inputs": []}', 422, "not 0 inputs"),
    (
        "/predict",
        b'{"inputs": {"text": "a", "text_pair": "b"}}',
        422,
        "inputs is a text pair, but this model classifies",
    ),
    ("/predict", b'{"inputs": ["a", {"text": "a", "text_pair": "b"}]}', 422, "inputs[1] is a text pair"),
    (
        INFER,
        json.dumps(
            {"inputs": [*json.loads(_tensor())["inputs"], {**json.loads(_tensor())["inputs"][0], "name": "text_pair"}]}
        ).encode(),
        422,
        "a list of 1 BYTES tensor(s) named 'text' for this single-text model, not 2 inputs",
    ),
    (
        INFER,
        _tensor(name="text_pair").encode(),
        422,
        "unknown input 'text_pair'; this model takes BYTES input(s) 'text'",
    ),
    (INFER, _tensor(name="sentence").encode(), 422, "unknown input 'sentence'"),
    (INFER, _tensor(datatype="FP32").encode(), 422, "datatype 'BYTES'"),
    (INFER, _tensor(shape=[2]).encode(), 422, "has 1 elements but shape [2] needs 2"),
    (INFER, _tensor(shape=[1, 2], data=["a", "b"]).encode(), 422, "shape [N] or [N, 1]"),
    (INFER, _tensor(shape=[0], data=[]).encode(), 422, "empty list"),
    (INFER, _tensor(data=[3]).encode(), 422, "inputs[0].data[0] is an integer"),
    (INFER, _tensor(shape=[9], data=["a"] * 9).encode(), 413, "at most 8"),
    (INFER, json.dumps({"id": 3, "inputs": []}).encode(), 422, "'id' must be a string"),
    (
        INFER,
        json.dumps({"inputs": json.loads(_tensor())["inputs"], "outputs": [{"name": "embedding"}]}).encode(),
        422,
        "unknown output 'embedding'",
    ),
    ("/v2/models/bert/infer", _tensor().encode(), 404, "unknown model 'bert'; this server serves 'sst2-tiny-serving'"),
    ("/v2/models/sst2-tiny-serving/versions/2/infer", _tensor().encode(), 404, "unknown version '2'"),
]


@pytest.mark.parametrize(
    ("path", "body", "status", "needle"), BAD, ids=[f"{i}-{b[3][:30]}" for i, b in enumerate(BAD)]
)
def test_bad_input_is_refused_with_a_json_error(server, client, path, body, status, needle):
    json_error(client.post(f"{server}{path}", content=body), status, needle)
    assert client.post(f"{server}/predict", json={"inputs": "still serving"}).status_code == 200


def test_bad_routes_and_oversized_streams(server, client):
    json_error(client.get(f"{server}/v2/models/nope"), 404, "unknown model 'nope'")
    json_error(client.get(f"{server}/v2/models/nope/ready"), 404, "unknown model")
    json_error(client.get(f"{server}/predict/now"), 404, "no such endpoint: GET /predict/now")
    json_error(client.get(f"{server}/predict"), 405, "method GET is not allowed on /predict")

    def chunks():  # no Content-Length: refused while streaming, once the running total passes the limit
        for _ in range(64):
            yield b" " * 1000

    json_error(client.post(f"{server}/predict", content=chunks()), 413, "request body exceeds 20000 bytes")
    # a declared size over the limit is refused before the body is read
    json_error(client.post(f"{server}/predict", content=b"x" * 200_000), 413, "request body is 200000 bytes")
    assert client.get(f"{server}/v2/health/ready").status_code == 200


# -- the same app in-process, with a gate in front of the model ------------------------------------------------
def _post_later(pool, url, text, **headers):
    return pool.submit(lambda: httpx.post(f"{url}/predict", json={"inputs": text}, headers=headers, timeout=60))


def test_micro_batching_gathers_concurrent_requests(artifact, session, client):
    model = GatedModel(session)
    app = gated_app(artifact, model, max_batch=8, max_wait_ms=0)
    with ThreadServer(app) as srv, ThreadPoolExecutor(8) as pool:
        first = _post_later(pool, srv.url, "first")
        assert model.entered.wait(30)
        rest = [_post_later(pool, srv.url, t) for t in ("a", "bb", "a much longer third sentence", "d")]
        wait_until(lambda: app.state.service.batcher.queued == 4)
        model.gate.set()
        responses = [f.result() for f in (first, *rest)]
        assert [r.status_code for r in responses] == [200] * 5
        assert model.calls == [1, 4]  # one call for the four that queued while the first ran
        m = metric_samples(client, srv.url)
    assert m[("serving_batch_size_count",)] == 2 and m[("serving_batch_size_sum",)] == 5
    assert m[("serving_batch_size_bucket", ("le", "2.0"))] == 1  # so one batch held more than two texts
    assert m[("serving_batch_requests_sum",)] == 5
    served = [r.json()[0] for r in responses]
    expected = [p[0] for p in session.predict(["first", "a", "bb", "a much longer third sentence", "d"])]
    assert [s["label"] for s in served] == [e["label"] for e in expected]
    assert [s["score"] for s in served] == pytest.approx([e["score"] for e in expected], abs=1e-5)


def test_full_queue_answers_503(artifact, session):
    model = GatedModel(session)
    app = gated_app(artifact, model, max_batch=1, max_queue=1, max_wait_ms=0)
    with ThreadServer(app) as srv, ThreadPoolExecutor(4) as pool:
        running = _post_later(pool, srv.url, "running")
        assert model.entered.wait(30)
        queued = _post_later(pool, srv.url, "queued")
        wait_until(lambda: app.state.service.batcher.queued == 1)
        refused = httpx.post(f"{srv.url}/predict", json={"inputs": "one too many"}, timeout=60)
        json_error(refused, 503, "the request queue is full (1 requests waiting)")
        assert refused.headers["retry-after"] == "1"
        model.gate.set()
        assert running.result().status_code == queued.result().status_code == 200
        assert httpx.post(f"{srv.url}/predict", json={"inputs": "later"}, timeout=60).status_code == 200


def test_a_failing_request_does_not_fail_its_batch(artifact, session):
    model = GatedModel(session)
    app = gated_app(artifact, model, max_batch=8, max_wait_ms=0)
    with ThreadServer(app) as srv, ThreadPoolExecutor(4) as pool:
        first = _post_later(pool, srv.url, "first")
        assert model.entered.wait(30)
        batch = [_post_later(pool, srv.url, t) for t in ("fine", "boom", "also fine")]
        wait_until(lambda: app.state.service.batcher.queued == 3)
        model.gate.set()
        assert first.result().status_code == 200
        fine, boom, also_fine = (f.result() for f in batch)
        json_error(boom, 500, "internal error: RuntimeError")
        assert fine.status_code == also_fine.status_code == 200
        assert sorted(model.calls) == [1, 1, 1, 1, 3]  # the batch of three failed, then one by one
        assert httpx.post(f"{srv.url}/predict", json={"inputs": "after"}, timeout=60).status_code == 200


def test_graceful_shutdown_finishes_in_flight_requests(artifact, session):
    model = GatedModel(session)
    app = gated_app(artifact, model, max_batch=1, max_wait_ms=0)
    srv = ThreadServer(app).__enter__()
    with ThreadPoolExecutor(4) as pool:
        running = _post_later(pool, srv.url, "running")
        assert model.entered.wait(30)
        queued = _post_later(pool, srv.url, "queued")
        wait_until(lambda: app.state.service.batcher.queued == 1)
        srv.stop()  # what SIGTERM does
        wait_until(lambda: not _accepts(srv.url))  # new connections are refused at once
        model.gate.set()
        assert running.result().status_code == 200 and queued.result().status_code == 200
    srv.thread.join(60)
    assert not srv.thread.is_alive() and model.calls == [1, 1] and not app.state.service.batcher.running


def _accepts(url):
    try:
        httpx.get(f"{url}/v2/health/live", timeout=5)
    except httpx.TransportError:
        return False
    return True


def test_api_key(artifact, session, client):
    with ThreadServer(gated_app(artifact, session, api_key="s3cret")) as srv:
        url = srv.url
        json_error(client.post(f"{url}/predict", json={"inputs": "a"}), 401, "missing or wrong API key")
        json_error(client.post(f"{url}/predict", json={"inputs": "a"}, headers={"X-API-Key": "wrong"}), 401, "API key")
        json_error(client.get(f"{url}/metrics"), 401, "API key")
        json_error(client.get(f"{url}/v2/models/tiny"), 401, "API key")
        assert client.post(f"{url}/predict", json={"inputs": "a"}, headers={"X-API-Key": "s3cret"}).status_code == 200
        bearer = {"Authorization": "Bearer s3cret"}
        assert (
            client.post(
                f"{url}{INFER.replace('sst2-tiny-serving', 'tiny')}", content=_tensor(), headers=bearer
            ).status_code
            == 200
        )
        assert client.get(f"{url}/metrics", headers=bearer).status_code == 200
        assert client.get(f"{url}/v2/health/ready").status_code == 200  # probes need no key
        assert client.get(f"{url}/v2/health/live").status_code == 200
        basic = {"Authorization": "Basic s3cret"}
        assert client.post(f"{url}/predict", json={"inputs": "a"}, headers=basic).status_code == 401


# -- start-up and shutdown of the real entry point ------------------------------------------------------------
def test_sigterm_stops_cleanly(artifact, tmp_path):
    proc = ServerProcess(artifact, log=tmp_path / "server.log", env={"SERVING_API_KEY": "k"})
    try:
        url = proc.wait_started()
        assert httpx.post(f"{url}/predict", json={"inputs": "a"}, timeout=60).status_code == 401  # key from the env
        proc.proc.terminate()
        assert proc.wait_exit() == 0
    finally:
        proc.stop()
    assert proc.log.read_text().rstrip().endswith("serving: stopped")


def test_tampered_or_missing_artifact_is_refused(artifact, tmp_path):
    tampered = shutil.copytree(artifact, tmp_path / "tampered")
    data = bytearray((tampered / "model.onnx").read_bytes())
    data[len(data) // 2] ^= 1
    (tampered / "model.onnx").write_bytes(bytes(data))
    unlisted = shutil.copytree(artifact, tmp_path / "unlisted")
    manifest = json.loads((unlisted / "manifest.json").read_text())
    del manifest["files"]["model.onnx"]  # an edited manifest no longer covers the graph
    (unlisted / "manifest.json").write_text(json.dumps(manifest))
    for folder, needle in (
        (tampered, "files differ from manifest.json: model.onnx"),
        (unlisted, "manifest.json does not list model.onnx"),
        (tmp_path / "missing", "artifact folder not found"),
    ):
        out = subprocess.run(
            [sys.executable, "-m", "serving", str(folder), "--port", "0"], capture_output=True, text=True, timeout=120
        )
        lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
        assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], out


def test_pipeline_serve_command_refuses_a_bad_setting_in_one_line(artifact):
    from typer.testing import CliRunner

    from pipeline.cli import app

    result = CliRunner().invoke(app, ["serve", str(artifact), "--max-batch", "0"])
    assert result.exit_code == 2 and result.stderr.strip() == "error: max-batch must be at least 1, not 0"
    result = CliRunner().invoke(app, ["serve", str(artifact), "--max-length", "4096"])
    assert result.exit_code == 2 and "max_length 4096 exceeds the model's 160 positions" in result.stderr


def test_pipeline_serve_and_python_m_serving_share_one_set_of_options():
    """One definition (serving/cli.py): both commands offer the same options with the same defaults."""
    import re

    from serving.cli import parser

    def options(prog):
        text = parser(prog).format_help()
        return sorted(set(re.findall(r"--[a-z-]+", text))), re.findall(r"\(default:? [^)]*\)|\(\d[^)]*\)", text)

    result = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "serve", "--help"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and result.stdout.startswith("usage: pipeline serve"), result.stderr
    assert sorted(set(re.findall(r"--[a-z-]+", result.stdout))) == options("python -m serving")[0]
    assert "--max-batch" in result.stdout and "--graceful-timeout" in result.stdout


def test_every_server_setting_has_one_option_and_round_trips(monkeypatch):
    """The options table (serving/cli.py) names every ServerConfig field once; parsed, each lands in its field."""
    import dataclasses

    monkeypatch.delenv("SERVING_API_KEY", raising=False)
    from serving.cli import OPTIONS, config_from_args, parser
    from serving.config import ServerConfig

    fields = [f.name for f in dataclasses.fields(ServerConfig) if f.name != "artifact"]
    assert sorted(field for field, _, _ in OPTIONS) == sorted(fields)
    config = config_from_args(parser().parse_args([".", "--max-windows", "7", "--graceful-timeout", "2.5",
                                                   "--access-log", "--port", "0"]))  # fmt: skip
    assert (config.max_windows, config.graceful_timeout_s, config.access_log, config.port) == (7, 2.5, True, 0)
    assert config_from_args(parser().parse_args(["."])) == ServerConfig(artifact=".")


def test_serving_imports_no_training_dependencies():
    code = (
        "import sys, serving.cli, serving.server, serving.app; "
        "bad = [m for m in ('torch', 'transformers', 'prefect', 'typer', 'pipeline') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.slow
def test_clean_venv_install_serves(artifact, tmp_path):
    """The serving image's install step, without Docker: a fresh venv, `pip install --no-deps -r
    serving/requirements.txt` and `pip check` as in the Dockerfile, only the serving/ folder copied, then the
    server answers /v2/health/ready and /predict, and torch is not even installed."""
    root = Path(__file__).resolve().parents[1]
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    pip = [
        str(py),
        "-m",
        "pip",
        "install",
        "-q",
        "--disable-pip-version-check",
        "--no-deps",
        "-r",
        str(root / "serving" / "requirements.txt"),
    ]
    subprocess.run(pip, check=True, timeout=900)
    subprocess.run([str(py), "-m", "pip", "check"], check=True, timeout=120)
    app = tmp_path / "app"
    shutil.copytree(root / "serving", app / "serving", ignore=shutil.ignore_patterns("__pycache__"))
    for missing in ("torch", "transformers", "prefect", "fastapi"):
        probe = subprocess.run([str(py), "-c", f"import {missing}"], capture_output=True, cwd=app)
        assert probe.returncode != 0, f"{missing} is installed in the serving venv"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    _serve_in(py, app, artifact, tmp_path / "server.log", env)
    # a signed artifact serves with its trusted key there too; the wrong key is refused in one line
    from serving.artifact import sign
    from tests.helpers import write_keys

    signed = shutil.copytree(artifact, tmp_path / "signed")
    private, public = write_keys(tmp_path, "mine")
    sign(signed, private)
    _serve_in(py, app, signed, tmp_path / "signed.log", env, "--trust-key", str(public))
    _, other = write_keys(tmp_path, "other")
    refused = subprocess.run([str(py), "-m", "serving", str(signed), "--port", "0", "--trust-key", str(other)],
                             cwd=app, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert refused.returncode == 2 and refused.stderr.startswith("error: refusing to serve"), refused.stderr


def _serve_in(py: Path, app: Path, artifact: Path, log: Path, env: dict, *extra: str) -> None:
    """`python -m serving` from `py`'s venv: it answers ready and /predict, then stops cleanly on SIGTERM."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(py), "-m", "serving", str(artifact), "--port", "0", *extra],
            cwd=app,
            stderr=out,
            stdout=subprocess.DEVNULL,
            env=env,
        )
        try:
            wait_until(lambda: "on http://" in log.read_text() or proc.poll() is not None, timeout=120)
            url = re.search(r"on (http://127\.0\.0\.1:\d+)", log.read_text())
            assert url, log.read_text()
            assert httpx.get(f"{url.group(1)}/v2/health/ready", timeout=30).json() == {"ready": True}
            assert httpx.post(f"{url.group(1)}/predict", json={"inputs": "fine"}, timeout=30).status_code == 200
        finally:
            proc.terminate()
            assert proc.wait(60) == 0

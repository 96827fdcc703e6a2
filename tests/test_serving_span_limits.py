"""Question answering and token classification cannot freeze the server: `top_k` is bounded and its merge linear,
decoding runs off the event loop (health and metrics answer while a large request is decoded), a request's windows
are capped (413) and counted by the queue (503), and a one-question or one-text request is answered while a large
one is tokenised, decoded or run (functional checks with gates, through a real server on loopback;
`benchmarks/stall_test.py` measures the latencies)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from tests.helpers import ThreadServer, json_error, sample_sentences, tiny_artifact, wait_until

KINDS = {"question-answering": "squad", "token-classification": "conll2003"}
PROSE = " ".join(sample_sentences("dev"))
QUESTION = "what comes first?"


def _contexts(n: int, chars: int) -> list[str]:
    return [(PROSE * 8)[i * 997 : i * 997 + chars] for i in range(n)]


@pytest.fixture(scope="module")
def sessions(tmp_path_factory):
    from serving.session import ArtifactSession

    base = tmp_path_factory.mktemp("span-limits")
    return {kind: ArtifactSession(tiny_artifact(base, task), spinning=False) for kind, task in KINDS.items()}


def _small(kind: str):
    return {"question": QUESTION, "context": "the first comes first ."} if kind == "question-answering" else "a text"


def _large(kind: str, n: int = 8, chars: int = 2000):
    contexts = _contexts(n, chars)
    return [{"question": QUESTION, "context": c} for c in contexts] if kind == "question-answering" else contexts


class Gated:
    """The real session, with one stage (`encode`, `run` or `answer`) held at a gate for requests that hold a
    marked item (the large ones), so a test decides when that stage may finish."""

    def __init__(self, session, stage: str) -> None:
        self.session, self.stage = session, stage
        self.labels, self.pair, self.kind = session.labels, session.pair, session.kind
        self.max_length = session.max_length
        self.entered, self.gate = threading.Event(), threading.Event()
        self.calls: list[int] = []

    def _hold(self, stage: str, large: bool) -> None:
        if stage == self.stage and large:
            self.entered.set()
            assert self.gate.wait(60)

    def encode(self, items):
        self._hold("encode", len(items) > 1)
        return self.session.encode(items)

    def tokens(self, item) -> int:
        return self.session.tokens(item)

    def run(self, encoded):
        self.calls.append(len(encoded))
        self._hold("run", len(encoded) > 1)
        return self.session.run(encoded)

    def answer(self, items, encoded, rows, top_k, max_answer_len):
        self._hold("answer", len(items) > 1)
        return self.session.answer(items, encoded, rows, top_k, max_answer_len)


def _app(model, **kw):
    from serving.app import build_app
    from serving.config import ServerConfig

    return build_app(ServerConfig(artifact=model.session.path, max_wait_ms=0, **kw), model, "tiny")


def _expected(session, kind, inputs):
    """What /predict answers for `inputs` (one item or a list), from the session itself."""
    items = inputs if isinstance(inputs, list) else [inputs]
    found = session.predict([_item(kind, x) for x in items])
    if kind == "question-answering":  # top_k 1: each question's best answer as an object
        found = [answers[0] for answers in found]
    return found if isinstance(inputs, list) else found[0]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("stage", ["encode", "run", "answer"])
def test_health_metrics_and_a_small_request_answer_while_a_large_one_is_held(sessions, kind, stage):
    """While a large request is held in tokenising, in a model call or in decoding its answers or entities, the
    health probe and the metrics page answer, and so does a one-item request unless the model thread itself is
    held (decoding on the event loop held them all)."""
    session = sessions[kind]
    model = Gated(session, stage)
    app = _app(model, max_batch=4, max_text_chars=5000)
    with ThreadServer(app) as srv, ThreadPoolExecutor(2) as pool, httpx.Client(timeout=20) as client:
        try:
            large = pool.submit(httpx.post, f"{srv.url}/predict", json={"inputs": _large(kind)}, timeout=60)
            assert model.entered.wait(30)
            assert client.get(f"{srv.url}/v2/health/live").json() == {"live": True}
            assert client.get(f"{srv.url}/metrics").status_code == 200
            if stage != "run":
                small = client.post(f"{srv.url}/predict", json={"inputs": _small(kind)})
                assert small.status_code == 200, small.text
                assert small.json() == _expected(session, kind, _small(kind))
            assert not large.done()
        finally:
            model.gate.set()
        answer = large.result()
        assert answer.status_code == 200, answer.text
        assert answer.json() == _expected(session, kind, _large(kind))


def _item(kind, x):
    from serving.validation import Question

    return Question(**x) if kind == "question-answering" else x


def test_a_question_runs_between_the_window_batches_of_a_large_request(sessions):
    session = sessions["question-answering"]
    model = Gated(session, "run")
    app = _app(model, max_batch=2, max_text_chars=5000)
    windows = len(session.encode([_item("question-answering", x) for x in _large("question-answering", 2)]))
    assert windows > 4
    with ThreadServer(app) as srv, ThreadPoolExecutor(2) as pool:
        large = pool.submit(
            httpx.post, f"{srv.url}/predict", json={"inputs": _large("question-answering", 2)}, timeout=60
        )
        assert model.entered.wait(30)
        small = pool.submit(
            httpx.post, f"{srv.url}/predict", json={"inputs": _small("question-answering")}, timeout=60
        )
        wait_until(lambda: app.state.service.batcher.queued == 1)
        model.gate.set()
        assert large.result().status_code == 200 and small.result().status_code == 200
    assert model.calls[:2] == [2, 1]  # the large request's first batch of windows, then the one question
    assert sum(model.calls) == windows + 1


def test_top_k_is_bounded_and_a_large_top_k_equals_the_scan_merge(sessions):
    from serving.spans import MAX_TOP_K

    session = sessions["question-answering"]
    with ThreadServer(_app(Gated(session, "none"), max_text_chars=5000)) as srv, httpx.Client(timeout=60) as c:
        body = {"inputs": _large("question-answering", 1, 4000)[0]}
        for top_k in (MAX_TOP_K + 1, 10**9):
            response = c.post(f"{srv.url}/predict", json={**body, "parameters": {"top_k": top_k}})
            json_error(response, 422, f"'parameters.top_k' must be an integer from 1 to {MAX_TOP_K} or null")
        response = c.post(f"{srv.url}/predict", json={**body, "parameters": {"top_k": MAX_TOP_K}})
        assert response.status_code == 200, response.text
        assert len(response.json()) == MAX_TOP_K


def _scan_merge(windows, starts, ends, context, max_answer_len, top_k):
    """The pipeline's merge as transformers writes it: a scan over every answer so far for one of the same text."""
    from serving.spans import _window_spans, _word_chars

    answers = []
    for window, start, end in zip(windows, starts, ends, strict=True):
        for s, e, score in _window_spans(start, end, window.allowed, 2 * top_k + 10, max_answer_len):
            first, last = _word_chars(window.encoding, s, e)
            text = context[first:last]
            same = next((a for a in answers if a["answer"].lower() == text.lower()), None)
            if same is not None:
                same["score"] += score.item()
            else:
                answers.append({"score": score.item(), "start": first, "end": last, "answer": text})
    return sorted(answers, key=lambda a: a["score"], reverse=True)[:top_k]


@pytest.mark.parametrize("seed", range(3))
def test_the_indexed_merge_equals_the_scan(sessions, seed):
    from serving.spans import MAX_TOP_K, best_answers, question_windows

    session = sessions["question-answering"]
    context = _contexts(1, 4000)[0].replace("the", "The", seed)  # answers that differ only in case merge
    windows = question_windows(session.windowing, QUESTION, context, session.cls_id)
    assert len(windows) > 4
    rng = np.random.default_rng(seed)
    starts = [rng.normal(size=len(w.encoding.ids)).astype(np.float32) for w in windows]
    ends = [rng.normal(size=len(w.encoding.ids)).astype(np.float32) for w in windows]
    for top_k in (1, 3, MAX_TOP_K):
        got = best_answers(windows, starts, ends, context, 30, top_k)
        assert got == _scan_merge(windows, starts, ends, context, 30, top_k)


def test_windows_per_request_are_capped(sessions):
    session = sessions["question-answering"]
    items = _large("question-answering", 4, 4000)
    windows = len(session.encode([_item("question-answering", x) for x in items]))
    with ThreadServer(_app(Gated(session, "none"), max_text_chars=5000, max_windows=windows - 1)) as srv:
        response = httpx.post(f"{srv.url}/predict", json={"inputs": items}, timeout=60)
        json_error(response, 413, f"windows of the model's max tokens; at most {windows - 1} per request")
        assert httpx.post(f"{srv.url}/predict", json={"inputs": items[:1]}, timeout=60).status_code == 200


def test_the_session_stops_tokenising_once_past_the_cap(sessions, monkeypatch):
    from serving.kinds.question_answering import ServedQuestionAnswering
    from serving.session import ArtifactSession
    from serving.validation import Question, RequestError

    capped = ArtifactSession(sessions["question-answering"].path, max_windows=3)
    items = [Question(QUESTION, c) for c in _contexts(64, 4000)]
    calls = []
    original = ServedQuestionAnswering._encodings
    monkeypatch.setattr(
        ServedQuestionAnswering, "_encodings", staticmethod(lambda s, q: calls.append(q) or original(s, q))
    )
    with pytest.raises(RequestError, match=r"at least \d+ windows of the model's max tokens; at most 3") as e:
        capped.encode(items)
    assert e.value.status == 413 and len(calls) == 1  # the first context alone passes the cap


def test_the_queue_counts_windows(sessions):
    """With a request in the model and one waiting, a third whose windows would take the queue past max_queue x
    max_batch items gets a 503, though the queue holds far fewer requests than max_queue."""
    session = sessions["question-answering"]
    model = Gated(session, "run")
    items = _large("question-answering", 2, 4000)
    windows = len(session.encode([_item("question-answering", x) for x in items]))
    max_batch = 2
    max_queue = windows // max_batch  # room for one such request's windows, not two
    app = _app(model, max_batch=max_batch, max_queue=max_queue, max_text_chars=5000)
    with ThreadServer(app) as srv, ThreadPoolExecutor(2) as pool:
        try:
            first = pool.submit(httpx.post, f"{srv.url}/predict", json={"inputs": items}, timeout=60)
            assert model.entered.wait(30)
            second = pool.submit(httpx.post, f"{srv.url}/predict", json={"inputs": items}, timeout=60)
            wait_until(lambda: app.state.service.batcher.queued == 1)  # the second, all its windows
            third = httpx.post(f"{srv.url}/predict", json={"inputs": items}, timeout=60)
            json_error(third, 503, "texts or windows waiting")
        finally:
            model.gate.set()
        assert first.result().status_code == 200 and second.result().status_code == 200

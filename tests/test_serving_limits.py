"""A few large requests cannot stall the server, and settings that would hang or lock it out are refused.

- Tokenisation is bounded: a long text is tokenised only as far as `max_length` tokens can use it, and the token
  ids equal those of the whole text (property-tested on the tokenizers of the BERT family, adversarial texts).
- Tokenisation runs on tokeniser threads, not the model thread; requests with fewer texts go first, and a large
  request runs one batch at a time (functional checks with gates, not timings: `benchmarks/stall_test.py`
  measures the latency).
- `--max-wait-ms inf`, a blank API key and the like end start-up with one `error:` line; `/predict/` is a 404.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir

from tests.helpers import GatedModel, ThreadServer, gated_app, json_error, sample_sentences, wait_until

set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "hypothesis-encoder-deploy")
PROPERTY = settings(deadline=None, database=None, suppress_health_check=list(HealthCheck), max_examples=400)
PROSE = " ".join(sample_sentences("dev"))
LONG = [(PROSE * 4)[i * 997 : i * 997 + 10_000] for i in range(64)]  # 64 texts of 10,000 characters


def _assert_predictions(response, session, texts) -> None:
    """The server's top labels and scores for the list `texts` are the session's."""
    assert response.status_code == 200, response.text
    served, expected = [row[0] for row in response.json()], [row[0] for row in session.predict(texts)]
    assert [s["label"] for s in served] == [e["label"] for e in expected]
    assert [s["score"] for s in served] == pytest.approx([e["score"] for e in expected], abs=1e-5)


# -- bounded tokenisation equals full tokenisation -------------------------------------------------------------
TOKENIZERS = ["bert", "bert-plain", "roberta", "roberta-plain", "xlmr", "xlmr-plain"]


def _whitespace_sentences() -> list[str]:
    """The sample's sentences with runs of whitespace and format characters between words, so that a byte-level
    BPE learns merges across them, which a cut in the wrong place would split."""
    joins = ["\n", "\n  ", "  ", "\t", " \n", "\u200b ", "\xa0"]
    return [
        "".join(w + joins[(i + j) % len(joins)] for j, w in enumerate(s.split()))
        for i, s in enumerate(sample_sentences("train"))
    ]


@functools.cache
def family() -> dict:
    """Tokenizers of the families the pipeline exports, by name, without truncation: WordPiece with the BERT
    normaliser ([CLS] a [SEP] b [SEP]: odd pair budgets), byte-level BPE (RoBERTa's special tokens) and an
    XLM-R-like SentencePiece Unigram (NMT and NFKC normalisers, Metaspace), each also without special tokens (as
    the tiny artifact's), where a token cut wrongly at the end of a prefix is not truncated away by them."""
    from tokenizers import Tokenizer
    from tokenizers.implementations import ByteLevelBPETokenizer, SentencePieceUnigramTokenizer
    from tokenizers.processors import BertProcessing, RobertaProcessing, TemplateProcessing

    from tests.helpers import tiny_tokenizer

    bert = tiny_tokenizer("bert")._tokenizer
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(_whitespace_sentences(), vocab_size=600, special_tokens=["<s>", "<pad>", "</s>", "<unk>"])
    unigram = SentencePieceUnigramTokenizer()
    unigram.train_from_iterator(
        sample_sentences("train"), vocab_size=300, special_tokens=["<s>", "<pad>", "</s>", "<unk>"], unk_token="<unk>"
    )
    plain = {"bert": bert, "roberta": bpe._tokenizer, "xlmr": unigram._tokenizer}
    processors = {
        "bert": BertProcessing(("[SEP]", 3), ("[CLS]", 2)),
        "roberta": RobertaProcessing(("</s>", 2), ("<s>", 0)),
        "xlmr": TemplateProcessing(
            single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
        ),
    }
    out = {}
    for name, tok in plain.items():
        out[f"{name}-plain"] = tok
        out[name] = Tokenizer.from_str(tok.to_str())
        out[name].post_processor = processors[name]
    return out


@functools.cache
def truncating(name: str, max_length: int):
    """A copy of family()[name] that truncates to `max_length`, as ArtifactSession sets its tokenizer up."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(family()[name].to_str())
    tok.enable_truncation(max_length)
    return tok


# Pieces that stress a cut: whitespace of every kind (some removed, some mapped to spaces by a normaliser),
# control and format characters, combining marks, characters NFKC expands to a space and a mark, CJK, emoji,
# punctuation, special tokens written in the text, contractions; and each of the odd ones just before a space.
ODD = ["\n", "\t", "\x0b", "\x85", "\xa0", "\u3000", "\u200b", "\u2581", "\ufffd", "\x00", "\xad", "\u0301", "¨"]
PIECES = [*(c + " " for c in ODD),
          " ", "  ", "\t", "\n", "\r\n", "\x0b", "\x0c", "\x1c", "\x85", "\xa0", "\u2000", "\u3000", "\u200b",
          "\u2581", "\ufffd", "\x00", "\x7f", "\xad", "a", "word", "Word", "é", "e\u0301", "\u0301", "İ", "ß", "¨",
          "´", "中文", "日本語", "😀", "👍🏽", "!", "...", "'s", "-", "[MASK]", "[SEP]", "<mask>", "</s>", "12", "١٢",
          "ﬁ"]  # fmt: skip
chunks = st.one_of(
    st.sampled_from(PIECES),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=6),
    st.builds(lambda piece, n: piece * n, st.sampled_from(PIECES), st.integers(2, 80)),  # runs, one giant word
    st.builds(lambda start, n: PROSE[start : start + n], st.integers(0, len(PROSE) - 1), st.integers(0, 300)),
)
texts = st.lists(chunks, max_size=25).map("".join).map(lambda t: t[:1500])
items = st.one_of(
    st.lists(texts, min_size=1, max_size=3),
    st.lists(st.tuples(texts, texts), min_size=1, max_size=3),
    st.lists(st.tuples(texts, st.sampled_from(["", "a b", PROSE[:2000]])), min_size=1, max_size=2),  # one side huge
)


def _same(got, want) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert (g.ids, g.type_ids, g.attention_mask) == (w.ids, w.type_ids, w.attention_mask)


@PROPERTY
@given(
    tokenizer=st.sampled_from(TOKENIZERS),
    max_length=st.sampled_from([2, 3, 5, 8, 9, 16, 128]),
    first_chars=st.sampled_from([None, 1, 8, 40]),
    batch=items,
)
# A cut after a character that some normaliser maps to a space, or inside a run of whitespace that byte-level BPE
# merges, would change the prefix's last token:
@example(tokenizer="xlmr-plain", max_length=2, first_chars=1, batch=["the\u200b the the"])  # NMT: U+200B is a space
@example(tokenizer="xlmr-plain", max_length=2, first_chars=1, batch=["the\ufffd the the"])
@example(tokenizer="xlmr-plain", max_length=2, first_chars=1, batch=["the\u2581 the the"])
@example(tokenizer="xlmr-plain", max_length=2, first_chars=1, batch=["the\xa0 the the"])
@example(tokenizer="roberta-plain", max_length=2, first_chars=1, batch=["the\n  the the"])
@example(tokenizer="bert", max_length=8, first_chars=1, batch=[(PROSE[:900], PROSE[50:900])])  # both long, odd budget
@example(tokenizer="bert", max_length=8, first_chars=1, batch=[(PROSE[50:900], PROSE[:900])])
@example(tokenizer="xlmr", max_length=9, first_chars=8, batch=[(PROSE[:700], PROSE[:700])])  # a tie: the second side
@example(tokenizer="roberta", max_length=5, first_chars=1, batch=["ab" + "\u200b " * 300 + "cd " * 20])  # no cut
def test_bounded_tokenisation_equals_full_tokenisation(tokenizer, max_length, first_chars, batch):
    from serving.bounded import BoundedTokenizer

    tok = truncating(tokenizer, max_length)
    bounded = BoundedTokenizer(tok, first_chars=first_chars)
    specials = tok.post_processor.num_special_tokens_to_add(True) if tok.post_processor else 0
    assert bounded.bounded == (max_length > specials)  # else the tokenizer returns specials alone, or fails
    want = tok.encode_batch(batch)
    _same(bounded.encode_batch(batch), want)
    _same(bounded.encode_batch(batch), want)  # again, from the characters per token learnt (first_chars=None)


def test_unknown_tokenizer_parts_get_texts_whole():
    """A pre-tokeniser that does not split at spaces (or none) could join a cut word with the next: no cuts."""
    from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers

    from serving.bounded import BoundedTokenizer

    for change in (
        lambda t: setattr(t, "pre_tokenizer", None),
        lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.Split(Regex("x"), "isolated")),
        lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.ByteLevel(use_regex=False)),
        lambda t: setattr(t, "normalizer", normalizers.Replace(Regex("a b"), "c")),
        lambda t: setattr(t, "normalizer", normalizers.Replace(Regex(" +"), "")),  # words joined
        lambda t: t.enable_padding(),
    ):
        tok = Tokenizer.from_str(family()["roberta"].to_str())
        tok.enable_truncation(8)
        change(tok)
        recording = _Recording(tok)
        bounded = BoundedTokenizer(recording, first_chars=4)
        assert not bounded.bounded
        batch = [PROSE[:500], "a b " * 50]
        bounded.encode_batch(batch)
        assert recording.longest == 500  # the whole text reached the tokenizer, not a prefix


class _Recording:
    """A tokenizer that records the longest text it was given."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer, self.longest = tokenizer, 0

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)

    def _record(self, inputs) -> None:
        for item in inputs:
            self.longest = max(self.longest, *(len(t) for t in (item if isinstance(item, tuple) else (item,))))

    def encode_batch(self, inputs, *args, **kwargs):
        self._record(inputs)
        return self._tokenizer.encode_batch(inputs, *args, **kwargs)

    def encode(self, sequence, *args, **kwargs):
        self._record([sequence])
        return self._tokenizer.encode(sequence, *args, **kwargs)


def test_the_session_tokenises_a_bounded_prefix_of_long_texts(artifact, session, monkeypatch):
    """64 texts of 10,000 characters: at most 8 characters per token of max_length (and a doubling) reach the
    tokenizer, and the logits are those of the whole texts."""
    from tokenizers import Tokenizer

    import serving.session

    recorders = []

    class RecordingTokenizer:
        @staticmethod
        def from_file(path):
            recorders.append(_Recording(Tokenizer.from_file(path)))
            return recorders[-1]

    monkeypatch.setattr(serving.session, "Tokenizer", RecordingTokenizer)
    bounded = serving.session.ArtifactSession(artifact)
    logits = bounded.logits(LONG)
    assert 0 < recorders[0].longest <= 2 * 8 * 128
    whole = Tokenizer.from_file(str(artifact / "tokenizer.json"))
    whole.enable_truncation(128)
    assert np.array_equal(logits, session.run(whole.encode_batch(LONG)))


# -- large requests are tokenised off the model thread, and do not hold smaller ones back --------------------------
STALL = "stall here"


class SlowTokenizing:
    """The real session, whose tokenizer stalls on a request holding STALL until the test releases it."""

    def __init__(self, session) -> None:
        self.session, self.labels, self.pair = session, session.labels, session.pair
        self.stalled, self.release = threading.Event(), threading.Event()

    def encode(self, texts):
        if any(STALL in t for t in texts):
            self.stalled.set()
            assert self.release.wait(60)
        return self.session.encode(texts)

    def tokens(self, item):
        return self.session.tokens(item)

    def run(self, encoded):
        return self.session.run(encoded)

    def logits(self, texts):  # the one-call model of a server that tokenised on its model thread
        return self.run(self.encode(texts))


def test_a_one_text_request_is_answered_while_a_large_one_is_tokenised(artifact, session):
    model = SlowTokenizing(session)
    large = [STALL, *LONG[:63]]

    def post(inputs):
        return httpx.post(f"{srv.url}/predict", json={"inputs": inputs}, timeout=60)

    with ThreadServer(gated_app(artifact, model, max_wait_ms=0)) as srv, ThreadPoolExecutor(2) as pool:
        try:
            stalled = pool.submit(post, large)
            assert model.stalled.wait(30)
            small = pool.submit(post, ["a warm , funny film"])
            answer = small.result(timeout=30)  # a server that tokenises on its model thread never answers this
            assert not stalled.done()
            _assert_predictions(answer, session, ["a warm , funny film"])
        finally:
            model.release.set()
        _assert_predictions(stalled.result(), session, large)


class _Ordered(GatedModel):
    """GatedModel that also records, per model call, the texts it ran."""

    def __init__(self, session) -> None:
        super().__init__(session)
        self.texts: list[list[str]] = []

    def run(self, encoded):
        self.texts.append([text for text, _ in encoded])
        return super().run(encoded)


def test_a_small_request_runs_between_the_batches_of_a_large_one(artifact, session):
    model = _Ordered(session)
    app = gated_app(artifact, model, max_batch=2, max_wait_ms=0)
    large = [f"large {i}" for i in range(6)]
    with ThreadServer(app) as srv, ThreadPoolExecutor(2) as pool:
        first = pool.submit(httpx.post, f"{srv.url}/predict", json={"inputs": large}, timeout=60)
        assert model.entered.wait(30)
        small = pool.submit(httpx.post, f"{srv.url}/predict", json={"inputs": ["small"]}, timeout=60)
        wait_until(lambda: app.state.service.batcher.queued == 1)
        model.gate.set()
        _assert_predictions(first.result(), session, large)
        _assert_predictions(small.result(), session, ["small"])
    assert model.texts == [large[:2], ["small"], large[2:4], large[4:]]


def test_a_large_request_is_not_held_back_for_ever_by_small_ones(artifact, session):
    """Once later requests' items filling four batches (serving.batcher.STARVING_BATCHES) have run first, the large
    request goes first."""
    starving_batches = 4
    model = _Ordered(session)
    app = gated_app(artifact, model, max_batch=1, max_wait_ms=0)
    smalls = [f"small {i}" for i in range(starving_batches + 2)]

    def post(inputs):
        return httpx.post(f"{srv.url}/predict", json={"inputs": inputs}, timeout=60)

    with ThreadServer(app) as srv, ThreadPoolExecutor(len(smalls) + 2) as pool:
        running = pool.submit(post, "running")
        assert model.entered.wait(30)
        large = pool.submit(post, ["large 0", "large 1"])
        wait_until(lambda: app.state.service.batcher.queued == 1)
        rest = []
        for i, text in enumerate(smalls):
            rest.append(pool.submit(post, text))
            wait_until(lambda i=i: app.state.service.batcher.queued == i + 2)
        model.gate.set()
        assert all(f.result().status_code == 200 for f in (running, large, *rest))
    order = [texts[0] for texts in model.texts]
    n = starving_batches
    assert order == ["running", *smalls[:n], "large 0", "large 1", *smalls[n:]]


def test_accepted_connections_send_without_nagle_delay():
    """asyncio turns Nagle off only on sockets created with proto IPPROTO_TCP; with it on, a keep-alive client
    waits ~40 ms (a delayed ACK) for each response that is written as headers, then body."""
    from serving.server import bind

    async def nodelay() -> int:
        sock = bind("127.0.0.1", 0)
        accepted = asyncio.get_running_loop().create_future()

        def on_connect(reader, writer):
            accepted.set_result(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(on_connect, sock=sock)
        _, writer = await asyncio.open_connection(*sock.getsockname()[:2])
        try:
            return await asyncio.wait_for(accepted, 30)
        finally:
            writer.close()
            server.close()

    assert asyncio.run(nodelay())


# -- start-up refusals and paths -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (["--max-wait-ms", "inf"], {}, "max-wait-ms must be a finite number, 0 or more, not inf"),
        (["--max-wait-ms", "nan"], {}, "max-wait-ms must be a finite number, 0 or more, not nan"),
        (["--max-wait-ms", "-1"], {}, "max-wait-ms must be a finite number, 0 or more, not -1.0"),
        (["--graceful-timeout", "inf"], {}, "graceful-timeout must be a finite number, 0 or more, not inf"),
        (["--graceful-timeout", "nan"], {}, "graceful-timeout must be a finite number, 0 or more, not nan"),
        (["--api-key", " "], {}, "api-key must not be blank or start or end with whitespace"),
        (["--api-key", "\t"], {}, "api-key must not be blank"),
        (["--api-key", " s3cret"], {}, "api-key must not be blank or start or end with whitespace"),
        ([], {"SERVING_API_KEY": "s3cret\n"}, "api-key must not be blank or start or end with whitespace"),
    ],
)
def test_settings_that_would_hang_or_lock_out_are_refused(tmp_path, monkeypatch, capsys, args, env, needle):
    """Refused at start-up, before the artifact is even looked at (the folder here does not exist)."""
    from serving.cli import main

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main([str(tmp_path / "missing"), "--port", "0", *args]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], lines


def test_a_blank_api_key_is_refused_but_an_empty_one_means_none():
    from serving.config import ServerConfig

    with pytest.raises(ValueError, match="api-key must not be blank"):
        ServerConfig(artifact=".", api_key=" ")
    assert ServerConfig(artifact=".", api_key="").api_key is None  # e.g. SERVING_API_KEY= in a container
    assert ServerConfig(artifact=".", api_key="a key").api_key == "a key"  # inner spaces survive HTTP


def test_a_trailing_slash_is_a_404_not_a_redirect(artifact, session, client):
    with ThreadServer(gated_app(artifact, session)) as srv:
        for method, path in [
            ("POST", "/predict/"),
            ("GET", "/v2/health/ready/"),
            ("GET", "/v2/models/tiny/"),
            ("POST", "/v2/models/tiny/infer/"),
        ]:
            evil = {"Host": "evil.example"}  # a redirect's Location would be built from it
            response = client.request(method, f"{srv.url}{path}", json={"inputs": "a"}, headers=evil)
            json_error(response, 404, f"no such endpoint: {method} {path}")
            assert "location" not in response.headers
        assert client.post(f"{srv.url}/predict", json={"inputs": "a"}).status_code == 200


def test_a_model_call_holds_at_most_the_token_budget_of_padded_tokens(artifact, session):
    """Long texts run a few at a time (a request arriving meanwhile waits for a short call), short ones many at a
    time, and a text longer than the whole budget still runs, alone."""
    model = _Ordered(session)
    long_text = " ".join(["word"] * 200)  # truncated to max_length 128 tokens
    budget = 3 * 128
    app = gated_app(artifact, model, max_batch=32, max_wait_ms=0, max_batch_tokens=budget)
    model.gate.set()
    with ThreadServer(app) as srv:
        for inputs in ([long_text] * 7, ["short"] * 20):
            _assert_predictions(httpx.post(f"{srv.url}/predict", json={"inputs": inputs}, timeout=60), session, inputs)
    sizes = [len(texts) for texts in model.texts]
    assert sizes == [3, 3, 1, 20]  # 3 x 128 padded tokens fit the budget; 20 short texts are 20 x 3 tokens
    alone = _Ordered(session)
    app = gated_app(artifact, alone, max_batch=32, max_wait_ms=0, max_batch_tokens=8)
    alone.gate.set()
    with ThreadServer(app) as srv:
        _assert_predictions(httpx.post(f"{srv.url}/predict", json={"inputs": [long_text] * 2}, timeout=60),
                            session, [long_text] * 2)  # fmt: skip
    assert [len(texts) for texts in alone.texts] == [1, 1]

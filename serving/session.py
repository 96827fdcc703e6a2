"""Load an artifact for inference: manifest check, Rust tokenizer, one ONNX Runtime session. No torch.

The HTTP server builds on this; it is also the reference for "what the artifact predicts", for every task kind:
labels of a text or text pair (sequence classification), the entities of a text (token classification), the
answer to a question in a context (question answering; the context cut into overlapping windows).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tokenizers import Encoding, Tokenizer

from serving.artifact import (
    CONFIG,
    GRAPHS,
    QA,
    TASK_KEY,
    TOKEN,
    TOKENIZER,
    ArtifactError,
    max_positions,
    task_kind,
    trained_length,
)
from serving.artifact import verify as verify_artifact
from serving.bounded import BoundedTokenizer
from serving.spans import (
    MAX_ANSWER_LEN,
    Window,
    best_answers,
    entity_groups,
    question_encodings,
    window_of,
    window_stride,
)
from serving.spans import windowing as windowing_tokenizer
from serving.validation import Question, RequestError, Text


@dataclass(frozen=True)
class QuestionWindow:
    """One window of a question-answering request's item: which of the request's questions it belongs to."""

    question: int
    window: Window


class ArtifactSession:
    """Tokenise a request's items and run the artifact's fp32 or int8 graph over them. Items are texts, or text
    pairs for an artifact of a sentence-pair task, or `Question`s for a question-answering artifact.

    `predict` is `answer(items, encoded, run(encoded))` with `encoded = encode(items)`: the server calls the
    three apart, `encode` on its tokeniser threads and `run` on its model thread (over the encodings of several
    requests), so that tokenising a large request holds up no other request's model call.

    Args:
        artifact: the artifact folder.
        precision: "fp32" or "int8".
        threads: ONNX Runtime intra-op threads (None: ORT's default, the physical cores).
        max_length: tokens per text; longer texts are truncated (keeping the start). A question-answering
            context is cut into windows of `max_length` tokens (with its question) overlapping by `window_stride`.
            None: the length the artifact was trained at (its task block's `max_length`), else 128.
        verify: check every file against manifest.json first (`serving.artifact.verify`).
        trust_key: with `verify`, also refuse the artifact unless its signature verifies with this public key.
        spinning: let idle intra-op threads busy-wait (ORT's default). A server turns it off: spinning
            threads would take the cores that its event loop needs between batches.
        max_windows: most question-answering windows one `encode` call may cut its contexts into (None: no
            limit); tokenising stops, with a 413 `RequestError`, as soon as a request passes it.
    """

    def __init__(
        self,
        artifact: str | Path,
        precision: str = "fp32",
        threads: int | None = None,
        max_length: int | None = None,
        verify: bool = True,
        spinning: bool = True,
        trust_key: str | Path | None = None,
        max_windows: int | None = None,
    ) -> None:
        self.path = Path(artifact)
        self.max_windows = max_windows
        if precision not in GRAPHS:
            raise ArtifactError(f"precision must be one of {', '.join(GRAPHS)}")
        if verify:
            verify_artifact(self.path, (CONFIG, TOKENIZER, GRAPHS[precision]), trust_key)
        config = json.loads((self.path / CONFIG).read_text())
        self.kind = task_kind(config.get(TASK_KEY))
        max_length = max_length or trained_length(config.get(TASK_KEY))
        positions = max_positions(config)
        if positions is not None and max_length > positions:
            raise ArtifactError(f"max_length {max_length} exceeds the model's {positions} positions")
        self.tokenizer = Tokenizer.from_file(str(self.path / TOKENIZER))
        self.tokenizer.enable_truncation(max_length)
        self.tokenizer.no_padding()  # `run` pads: the texts of several requests, to the longest of them
        self.pad_id = config.get("pad_token_id") or 0
        self.encoder = BoundedTokenizer(self.tokenizer)
        self.precision = precision
        self.max_length = max_length
        so = ort.SessionOptions()
        if threads:
            so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        if not spinning:
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(str(self.path / GRAPHS[precision]), so, providers=["CPUExecutionProvider"])
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.labels = _labels(config, self.session)
        self.task = config.get(TASK_KEY) or {}  # artifacts from before pair support have none: single texts
        self.pair = bool(self.task.get("pair"))
        self.outputs = [o.name for o in self.session.get_outputs()]  # logits, or start_logits and end_logits
        if self.kind == QA:
            self.stride = window_stride(max_length)
            self.windowing = windowing_tokenizer(self.tokenizer, max_length, self.stride)
            probe = self.tokenizer.encode("a", "b")  # the classification token, which stays an answer candidate
            self.cls_id = probe.ids[0] if probe.special_tokens_mask[:1] == [1] else None
        unk = getattr(self.tokenizer.model, "unk_token", None)
        self.unk_id = self.tokenizer.token_to_id(unk) if unk else None

    def encode(self, items: list) -> list:
        """What the model runs for `items`: one encoding per text or pair (truncated to `max_length`; only the
        part of a long text that can reach the model is tokenised, `serving.bounded`, the ids being those of the
        whole text), or for question answering the `QuestionWindow`s of every question. Thread-safe.

        Raises:
            ArtifactError: items of the wrong type for the artifact (pairs for a single-text one, ...).
            RequestError: a question that leaves its context no room in a window (422); more windows than
                `max_windows` (413).
        """
        if self.kind == QA:
            if not all(isinstance(q, Question) for q in items):
                raise ArtifactError(f"{self.path} answers questions: pass serving.validation.Question items")
            encodings: list[tuple[int, Encoding]] = []
            for i, q in enumerate(items):  # counted before any window is built: a refused request costs little
                encodings += [(i, e) for e in self._encodings(q)]
                check_windows(len(encodings), self.max_windows, done=i + 1 == len(items))
            return [QuestionWindow(i, window_of(e, self.cls_id)) for i, e in encodings]
        if any(isinstance(t, tuple) != self.pair for t in items):
            want = "(text, text_pair) tuples" if self.pair else "strings"
            raise ArtifactError(f"{self.path} reads {'sentence pairs' if self.pair else 'single texts'}: pass {want}")
        return self.encoder.encode_batch(items)

    def _encodings(self, q: Question) -> list[Encoding]:
        try:
            return question_encodings(self.windowing, q.question, q.context)
        except Exception:  # the Rust tokenizer's truncation error: the question alone fills the window
            room = len(self.tokenizer.encode(q.question, "").ids)
            raise RequestError(
                422,
                f"the question takes {room} of the {self.max_length} tokens of a window, which leaves its context "
                f"no room beyond the {self.stride} tokens windows overlap by: shorten it",
                "question_too_long",
            ) from None

    @staticmethod
    def tokens(item: Encoding | QuestionWindow) -> int:
        """An encoded item's length in tokens (what it costs a model call once padded)."""
        return len(_encoding(item).ids)

    def run(self, encoded: list) -> np.ndarray:
        """The graph's outputs, one row per encoded item (of one or more `encode` calls), padded to the longest:
        class logits [n, labels] for sequence classification; for the other kinds an object array of each item's
        rows without the padding (token classification: logits [tokens, labels]; question answering: a
        (start logits, end logits) pair over the window's tokens)."""
        encodings = [_encoding(e) for e in encoded]
        width = max(1, max((len(e.ids) for e in encodings), default=0))
        ids = np.full((len(encodings), width), self.pad_id, dtype=np.int64)
        mask, types = np.zeros_like(ids), np.zeros_like(ids)
        for i, e in enumerate(encodings):
            n = len(e.ids)
            ids[i, :n], mask[i, :n], types[i, :n] = e.ids, e.attention_mask, e.type_ids
            if not mask[i].any():  # no tokens (an empty text, a tokenizer without [CLS]/[SEP]): one [PAD]
                mask[i, 0] = 1  # is attended, whatever the batch, instead of a failed or batch-dependent run
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        outputs = self.session.run(self.outputs, {n: feeds[n] for n in self.input_names})
        if self.kind not in (TOKEN, QA):
            return outputs[0]
        rows = np.empty(len(encodings), dtype=object)
        for i, e in enumerate(encodings):
            n = len(e.ids)
            rows[i] = outputs[0][i, :n] if self.kind == TOKEN else (outputs[0][i, :n], outputs[1][i, :n])
        return rows

    def logits(self, texts: list[Text]) -> np.ndarray:
        """`run(encode(texts))`: one row of class logits per text (sequence classification)."""
        return self.run(self.encode(texts))

    def answer(
        self, items: list, encoded: list, rows: np.ndarray, top_k: int | None = 1, max_answer_len: int = MAX_ANSWER_LEN
    ) -> list:
        """Per item, what the artifact answers, from `encode(items)` and `run` of it: the `top_k` labels (None:
        all) with softmax scores, best first; the entities of a text, as transformers' token-classification
        pipeline groups them (aggregation "simple"); or the `top_k` answers to a question (spans of at most
        `max_answer_len` tokens), as its question-answering pipeline decodes them."""
        if self.kind == TOKEN:
            return [
                entity_groups(self.tokenizer, text, enc, row, self.labels, self.unk_id)
                for text, enc, row in zip(items, encoded, rows, strict=True)
            ]
        if self.kind == QA:
            windows: list[list[int]] = [[] for _ in items]
            for n, item in enumerate(encoded):
                windows[item.question].append(n)
            answers = []
            for q, ns in zip(items, windows, strict=True):
                starts, ends = [rows[n][0] for n in ns], [rows[n][1] for n in ns]
                spans = [encoded[n].window for n in ns]
                answers.append(best_answers(spans, starts, ends, q.context, max_answer_len, top_k or 1))
            return answers
        return top_labels(softmax(rows), self.labels, top_k)

    def predict(self, items: list, top_k: int | None = 1, max_answer_len: int = MAX_ANSWER_LEN) -> list:
        """`answer` of `items`, tokenised and run here."""
        encoded = self.encode(items)
        return self.answer(items, encoded, self.run(encoded), top_k, max_answer_len)


def check_windows(windows: int, limit: int | None, done: bool = True) -> None:
    """Refuse a request that cuts its contexts into more than `limit` windows (`done`: all of them counted)."""
    if limit is not None and windows > limit:
        counted = f"{windows}" if done else f"at least {windows}"
        raise RequestError(
            413, f"the contexts make {counted} windows of the model's max tokens; at most {limit} per request "
            "(shorter or fewer contexts)", "too_many_windows",
        )  # fmt: skip


def _encoding(item: Encoding | QuestionWindow) -> Encoding:
    return item.window.encoding if isinstance(item, QuestionWindow) else item


def _labels(config: dict, session: ort.InferenceSession) -> list[str]:
    """`id2label` from config.json; without it (transformers omits the default LABEL_i names), from the graph."""
    if config.get("id2label"):
        return [config["id2label"][str(i)] for i in range(len(config["id2label"]))]
    n = session.get_outputs()[0].shape[-1]
    return [f"LABEL_{i}" for i in range(n if isinstance(n, int) else config.get("num_labels", 2))]


def softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def top_labels(scores: np.ndarray, labels: list[str], top_k: int | None = 1) -> list[list[dict]]:
    """Per row of `scores`, the `top_k` labels (None: all) with their scores, best first (ties: lower id)."""
    k = len(labels) if top_k is None else top_k
    return [
        [{"label": labels[j], "score": float(row[j])} for j in np.argsort(-row, kind="stable")[:k]] for row in scores
    ]

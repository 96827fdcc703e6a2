"""Answers and entities from a model's per-token outputs, decoded exactly as transformers' `question-answering`
and `token-classification` (aggregation_strategy="simple") pipelines decode them, over the Rust tokenizer alone.

Question answering: the question and the context are encoded as a pair, the context cut into windows of
`max_length` tokens overlapping by `stride` (the tokenizer's own overflow, as the pipeline asks for it). In each
window the start and end logits of tokens that cannot be in an answer (the question, special tokens other than
the first) are masked, each side is soft-maxed over the window, the first token's probability is zeroed, and
every span of at most `max_answer_len` context tokens scores start × end. The best `2 × top_k + 10` spans of each
window are widened to whole words; answers with the same text (ignoring case) across windows add their scores.

Token classification: every non-special token takes its arg-max label with its soft-max probability; adjacent
tokens of one entity type join into a group unless a token says `B-`; a group scores the mean of its tokens and
reads its word through the tokenizer's decoder; groups of `O` are dropped.

The project evaluates with these same functions (`pipeline.stages.validate`), so the reported exact match, F1 and
entity F1 are those of what the server answers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tokenizers import Encoding, Tokenizer

# The longest answer decoded, in tokens: transformers' run_qa default for SQuAD (its pipeline's is 15). The project
# evaluates with it, and the server answers with it unless a request asks for another.
MAX_ANSWER_LEN = 30
# The most answers a question-answering request may ask for (transformers' pipeline only checks top_k >= 1). Each
# window decodes 2 x top_k + 10 spans, so a request's decoding grows with it; 20 answers is past any ranked list a
# reader looks at.
MAX_TOP_K = 20


def window_stride(max_length: int) -> int:
    """The overlap of question-answering windows: 128 tokens, at most half a window (transformers' pipeline)."""
    return min(128, max_length // 2)


@dataclass(frozen=True)
class Window:
    """One window of a (question, context) pair: its encoding and which tokens may be part of an answer."""

    encoding: Encoding
    allowed: np.ndarray  # bool per token: the context's tokens and the first token (the pipeline's p_mask, inverted)


def windowing(tokenizer: Tokenizer, max_length: int, stride: int) -> Tokenizer:
    """A copy of `tokenizer` that cuts a (question, context) pair's context into windows of at most `max_length`
    tokens overlapping by `stride`, as the pipeline asks for them. Made once: truncation is state of the Rust
    object, and copying it (through its JSON) costs more than encoding a question."""
    tok = Tokenizer.from_str(tokenizer.to_str())
    tok.no_padding()
    tok.enable_truncation(max_length, stride=stride, strategy="only_second", direction="right")
    return tok


def question_encodings(windowing_tokenizer: Tokenizer, question: str, context: str) -> list[Encoding]:
    """The encodings of the windows of `context` after `question`, cut by a `windowing` tokenizer."""
    # encode_batch lets go of the GIL while the Rust tokenizer works (encode holds it): a long context's windows
    # take milliseconds, which on a server would hold up every other thread, the event loop's included.
    (first,) = windowing_tokenizer.encode_batch([(question, context)])
    return [first, *first.overflowing]


def question_windows(windowing_tokenizer: Tokenizer, question: str, context: str, cls_id: int | None) -> list[Window]:
    """The windows of `context` after `question`, cut by a `windowing` tokenizer (`cls_id`: the tokenizer's
    classification token, which stays a candidate as in the pipeline)."""
    return [window_of(enc, cls_id) for enc in question_encodings(windowing_tokenizer, question, context)]


def window_of(encoding: Encoding, cls_id: int | None) -> Window:
    """A window of an encoded (question, context) pair: the context's tokens may be an answer, and the first
    token stays a candidate as in the pipeline (`cls_id`: the tokenizer's classification token)."""
    allowed = np.array([s == 1 for s in encoding.sequence_ids], dtype=bool)
    if cls_id is not None:
        allowed |= np.array(encoding.ids) == cls_id  # the pipeline keeps [CLS] unmasked (null answers)
    allowed &= np.array(encoding.attention_mask, dtype=bool)
    return Window(encoding, allowed)


def _softmax_masked(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    x = np.where(allowed, logits, np.float32(-10000.0))
    x = np.exp(x - x.max(axis=-1, keepdims=True))
    return x / x.sum()


def _window_spans(start: np.ndarray, end: np.ndarray, allowed: np.ndarray, top_k: int, max_answer_len: int):
    """(start token, end token, score) of the best spans of one window, best first (the pipeline's decode_spans)."""
    p_start, p_end = _softmax_masked(start, allowed), _softmax_masked(end, allowed)
    p_start[0] = p_end[0] = 0.0
    outer = np.matmul(p_start[None, :, None], p_end[None, None, :])
    candidates = np.tril(np.triu(outer), max_answer_len - 1)
    flat = candidates.flatten()
    if top_k == 1:
        order = np.array([np.argmax(flat)])
    elif len(flat) < top_k:
        order = np.argsort(-flat)
    else:
        idx = np.argpartition(-flat, top_k)[0:top_k]
        order = idx[np.argsort(-flat[idx])]
    starts, ends = np.unravel_index(order, candidates.shape)[1:]
    keep = np.isin(starts, allowed.nonzero()) & np.isin(ends, allowed.nonzero())
    starts, ends = starts[keep], ends[keep]
    return [(int(s), int(e), candidates[0, s, e]) for s, e in zip(starts, ends, strict=True)]


def _word_chars(enc: Encoding, s: int, e: int) -> tuple[int, int]:
    """The characters of the context from the word of token `s` to the word of token `e` (token offsets where a
    token belongs to no word)."""
    try:
        first = enc.word_to_chars(enc.token_to_word(s), sequence_index=1)
        last = enc.word_to_chars(enc.token_to_word(e), sequence_index=1)
        return first[0], last[1]
    except Exception:
        return enc.offsets[s][0], enc.offsets[e][1]


def best_answers(
    windows: list[Window],
    start_logits: list[np.ndarray],
    end_logits: list[np.ndarray],
    context: str,
    max_answer_len: int,
    top_k: int = 1,
) -> list[dict]:
    """The `top_k` answers as {"score", "start", "end", "answer"}, best first (character offsets into `context`)."""
    # The pipeline adds a span's score to the first answer whose text equals it ignoring case, found by a scan of
    # every answer so far; indexed by that key, the merge is linear and its result the same.
    answers: dict[str, dict] = {}
    for window, start, end in zip(windows, start_logits, end_logits, strict=True):
        spans = _window_spans(np.asarray(start), np.asarray(end), window.allowed, 2 * top_k + 10, max_answer_len)
        for s, e, score in spans:
            first, last = _word_chars(window.encoding, s, e)
            text = context[first:last]
            same = answers.get(key := text.lower())
            if same is not None:
                same["score"] += score.item()
            else:
                answers[key] = {"score": score.item(), "start": first, "end": last, "answer": text}
    return sorted(answers.values(), key=lambda a: a["score"], reverse=True)[:top_k]


def _bi_tag(label: str) -> tuple[str, str]:
    """("B" | "I", type): a label outside the B-/I- scheme continues as I- (the pipeline's get_tag)."""
    if label.startswith("B-"):
        return "B", label[2:]
    if label.startswith("I-"):
        return "I", label[2:]
    return "I", label


def entity_groups(
    tokenizer: Tokenizer, text: str, encoding: Encoding, logits: np.ndarray, labels: list[str], unk_id: int | None
) -> list[dict]:
    """The entities of `text` (encoded as `encoding`) as {"entity_group", "score", "word", "start", "end"}
    (`labels`: the model's id2label in id order; `unk_id`: the unknown token, whose word is read from the text)."""
    logits = np.asarray(logits)
    scores = np.exp(logits - logits.max(axis=-1, keepdims=True))
    scores = scores / scores.sum(axis=-1, keepdims=True)
    tokens = []
    for i, token_scores in enumerate(scores):
        if encoding.special_tokens_mask[i]:
            continue
        best = int(token_scores.argmax())
        start, end = encoding.offsets[i]
        word = text[start:end] if encoding.ids[i] == unk_id else encoding.tokens[i]
        tokens.append({"entity": labels[best], "score": token_scores[best], "word": word, "start": start, "end": end})
    groups, current = [], []
    for token in tokens:
        bi, kind = _bi_tag(token["entity"])
        if current and not (kind == _bi_tag(current[-1]["entity"])[1] and bi != "B"):
            groups.append(_group(tokenizer, current))
            current = []
        current.append(token)
    if current:
        groups.append(_group(tokenizer, current))
    return [g for g in groups if g["entity_group"] != "O"]


def _group(tokenizer: Tokenizer, tokens: list[dict]) -> dict:
    words = [t["word"] for t in tokens]
    decoder = tokenizer.decoder
    return {
        "entity_group": tokens[0]["entity"].split("-", 1)[-1],
        "score": float(np.nanmean([t["score"] for t in tokens])),
        "word": decoder.decode(words) if decoder is not None else " ".join(words),
        "start": tokens[0]["start"],
        "end": tokens[-1]["end"],
    }

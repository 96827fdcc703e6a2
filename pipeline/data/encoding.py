"""Tokenise a split once, then cut it into dynamically padded tensor batches, for every task kind.

Sequence classification: one feature per example, its class id. Token classification: the words, joined by spaces,
are tokenised as text, and a word's tag labels its first sub-token; the other sub-tokens and the special tokens
are IGNORED in the loss, as the field trains NER. Question answering: the question and the context are
encoded as a pair and the context is cut into windows of `max_length` tokens overlapping by `window_stride`
(the tokenizer's own overflow, as serving.spans cuts them); a window is labelled with the token positions of the
question's first answer, or with position 0 (the first token) when the answer is not inside it.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from pipeline.data.corpus import Corpus
from pipeline.data.loaders import AnySplit, TaskData
from pipeline.data.squad import QASplit
from pipeline.data.tagged import TaggedSplit
from pipeline.data.tasks import QA, SEQUENCE, TOKEN
from pipeline.errors import PipelineError
from serving.spans import Window, window_of, window_stride

IGNORED = -100  # a label the loss skips (cross-entropy's ignore_index)


@dataclass(frozen=True)
class Encoded:
    """A tokenised split: one dict of token lists per feature, plus labels and the pad id. A label is a class id
    (sequence), a list of tag ids per token (token classification), or a (start, end) token pair (QA windows).

    Token classification and QA also keep what scoring needs: the split itself (gold tags and their names; gold
    answers and contexts) and, for QA, each window's question (`samples`) and `windows` (serving.spans)."""

    features: list[dict[str, list[int]]]
    labels: list
    pad_id: int
    kind: str = SEQUENCE
    source: AnySplit | None = None
    samples: list[int] | None = None
    windows: list[Window] | None = None

    def __len__(self) -> int:
        return len(self.labels)


def encode(tokenizer, split: AnySplit, max_length: int, stride: int | None = None) -> Encoded:
    """The features of `split` (`stride`: the overlap of question-answering windows, `window_stride` if None)."""
    if isinstance(split, TaggedSplit):
        return _encode_tagged(tokenizer, split, max_length)
    if isinstance(split, QASplit):
        return _encode_questions(tokenizer, split, max_length, window_stride(max_length) if stride is None else stride)
    return _encode_texts(tokenizer, list(zip(*split.texts, strict=True)), list(split.labels), max_length)


# Paragraphs tokenised at a time: the tokenizer holds every token of its batch before truncating, so a corpus
# tokenised whole would cost tens of bytes per character of the corpus at once.
CORPUS_BLOCK = 256


def encode_corpus(tokenizer, corpus: Corpus, max_length: int) -> Encoded:
    """Each paragraph of a general-distillation corpus as one example, truncated at `max_length` tokens; no labels.
    Tokenised `CORPUS_BLOCK` paragraphs at a time, so memory holds the truncated examples, not the whole text's
    tokens."""
    features = []
    for at in range(0, len(corpus), CORPUS_BLOCK):
        block = corpus.texts[at : at + CORPUS_BLOCK]
        features += _encode_texts(tokenizer, [block], [None] * len(block), max_length).features
    return Encoded(features, [None] * len(corpus), tokenizer.pad_token_id or 0)


def _encode_texts(tokenizer, columns: list, labels: list, max_length: int) -> Encoded:
    """One example per row of `columns` (one text column, or two for pairs), each with its label."""
    enc = tokenizer(*columns, truncation=True, max_length=max_length)
    keys = feature_keys(enc)
    features = [{k: enc[k][i] for k in keys} for i in range(len(labels))]
    return Encoded(features, labels, tokenizer.pad_token_id or 0)


def feature_keys(enc) -> list[str]:
    return [k for k in ("input_ids", "attention_mask", "token_type_ids") if k in enc]


def _encode_tagged(tokenizer, split: TaggedSplit, max_length: int) -> Encoded:
    """Each sentence as the text a user would send (its words joined by single spaces), so every family's
    tokenizer reads it as it will be served (byte-level BPE needs no `add_prefix_space`); a token starting inside
    a word belongs to it, and the word's first such token carries its tag."""
    texts, starts = [], []
    for words in split.words:
        offsets, at = [], 0
        for word in words:
            offsets.append(at)
            at += len(word) + 1
        texts.append(" ".join(words))
        starts.append(offsets)
    enc = tokenizer(texts, truncation=True, max_length=max_length, return_offsets_mapping=True)
    keys, features, labels = feature_keys(enc), [], []
    for i, tags in enumerate(split.tags):
        features.append({k: enc[k][i] for k in keys})
        row, seen = [], set()
        for token, (begin, end) in zip(enc.encodings[i].special_tokens_mask, enc["offset_mapping"][i], strict=True):
            word = bisect.bisect_right(starts[i], begin) - 1 if not token and end > begin else None
            row.append(IGNORED if word is None or word in seen else tags[word])
            seen.add(word)
        labels.append(row)
    return Encoded(features, labels, tokenizer.pad_token_id or 0, TOKEN, split)


def _encode_questions(tokenizer, split: QASplit, max_length: int, stride: int) -> Encoded:
    questions = split.questions
    alone = tokenizer([q.question for q in questions])["input_ids"]  # one batched call, not one per question
    for q, ids in zip(questions, alone, strict=True):  # the tokenizer panics when a question leaves no room
        room = max_length - len(ids) - 2
        if room <= stride:
            raise PipelineError(f"question {q.id} leaves {room} tokens of {max_length} for its context, not more than "
                                f"the stride {stride}: shorten it, or raise max_length")  # fmt: skip
    enc = tokenizer([q.question for q in questions], [q.context for q in questions], truncation="only_second",
                    max_length=max_length, stride=stride, return_overflowing_tokens=True,
                    return_offsets_mapping=True)  # fmt: skip
    keys, features, labels = feature_keys(enc), [], []
    samples = list(enc["overflow_to_sample_mapping"])
    for i, sample in enumerate(samples):
        features.append({k: enc[k][i] for k in keys})
        text, start = questions[sample].answers[0]
        labels.append(_answer_tokens(enc.sequence_ids(i), enc["offset_mapping"][i], start, start + len(text)))
    windows = [window_of(e, tokenizer.cls_token_id) for e in enc.encodings]
    return Encoded(features, labels, tokenizer.pad_token_id or 0, QA, split, samples, windows)


def _answer_tokens(sequence_ids: list, offsets: list, start: int, end: int) -> tuple[int, int]:
    """The first and last context tokens of the answer's characters [start, end), or (0, 0) outside the window."""
    context = [i for i, s in enumerate(sequence_ids) if s == 1]
    first, last = context[0], context[-1]
    if not (offsets[first][0] <= start and offsets[last][1] >= end):
        return 0, 0
    s = next(i for i in context[::-1] if offsets[i][0] <= start)
    e = next(i for i in context if offsets[i][1] >= end)
    return s, e


def encode_task(tokenizer, data: TaskData, max_length: int) -> tuple[Encoded, Encoded]:
    """(train, validation): what training sees. Dev is the test; only validation reports it."""
    return encode(tokenizer, data.train, max_length), encode(tokenizer, data.validation, max_length)


def collate(enc: Encoded, idx: list[int]) -> dict[str, torch.Tensor]:
    """Pad the examples `idx` to their longest one (right padding, mask 0 on pads)."""
    feats = [enc.features[i] for i in idx]
    width = max(len(f["input_ids"]) for f in feats)
    batch = {}
    for key in feats[0]:
        fill = enc.pad_id if key == "input_ids" else 0
        batch[key] = torch.tensor([f[key] + [fill] * (width - len(f[key])) for f in feats], dtype=torch.long)
    labels = [enc.labels[i] for i in idx]
    if labels[0] is None:  # unlabelled text (a general distillation corpus)
        return batch
    if isinstance(labels[0], list):  # tags per token: pads are not scored
        labels = [row + [IGNORED] * (width - len(row)) for row in labels]
    batch["labels"] = torch.tensor(labels, dtype=torch.long)
    return batch


GROUP_SPAN = 50  # batches whose examples are sorted by length together when grouping


def iter_batches(
    enc: Encoded,
    batch_size: int,
    *,
    shuffle: bool = False,
    generator: torch.Generator | None = None,
    group_by_length: bool = False,
) -> Iterator[dict[str, torch.Tensor]]:
    """Batches of `enc` in order, or shuffled by `generator`. `group_by_length` (with `shuffle`): the shuffled order
    is cut into spans of `GROUP_SPAN` batches, each span sorted by length and cut into batches, and the batches are
    shuffled again, so a batch holds examples of similar length and pads little (transformers' `group_by_length`)."""
    order = torch.randperm(len(enc), generator=generator).tolist() if shuffle else list(range(len(enc)))
    batches = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    if shuffle and group_by_length:
        span = GROUP_SPAN * batch_size
        grouped = []
        for start in range(0, len(order), span):
            part = sorted(order[start : start + span], key=lambda i: len(enc.features[i]["input_ids"]))
            grouped += [part[k : k + batch_size] for k in range(0, len(part), batch_size)]
        batches = [grouped[i] for i in torch.randperm(len(grouped), generator=generator).tolist()]
    for idx in batches:
        yield collate(enc, idx)

"""Tokenise a split once, then cut it into dynamically padded tensor batches, for every task kind.

How a split of each kind becomes features and labels is the kind's (`pipeline.kinds`): one feature per example
(sequence classification), per sentence with a label per token (token classification), or per window of a
context (question answering). Here: the dispatch, the general-distillation corpus, and the batches.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from pipeline.data.corpus import Corpus
from pipeline.data.loaders import AnySplit, TaskData
from pipeline.kinds import kind_of
from pipeline.kinds.base import IGNORED, Encoded
from pipeline.kinds.sequence import encode_texts


def encode(tokenizer, split: AnySplit, max_length: int, stride: int | None = None) -> Encoded:
    """The features of `split`, as its kind encodes them (`stride`: the overlap of question-answering windows,
    `serving.spans.window_stride` if None)."""
    return kind_of(split.kind).encode(tokenizer, split, max_length, stride)


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
        features += encode_texts(tokenizer, [block], [None] * len(block), max_length).features
    return Encoded(features, [None] * len(corpus), tokenizer.pad_token_id or 0)


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

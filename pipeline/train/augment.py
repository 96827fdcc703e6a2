"""Augmented training sentences for output KD: TinyBERT's word replacement, with the teacher's own embeddings.

TinyBERT (arXiv 1909.10351, section 3.2) grows a task's training set about twentyfold by replacing words: with
probability p a word becomes one of its K nearest words (a masked LM's candidates for one-piece words, GloVe
neighbours for the others), and the student learns the teacher's outputs on the new sentences. Neither a masked
LM head (the sentence encoders we compress have none) nor GloVe (no hub here) is at hand, so the neighbours are the
nearest words by the cosine of the teacher's input embeddings, among the one-token words of the task's own training
texts (the vocabulary the task uses, in the form the tokenizer reads it mid-sentence). Words that are not one token
stay. The new sentences carry no label: the label loss skips them (`encoding.IGNORED`), output KD uses them.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import torch
from torch import nn

from pipeline.config.schema import AugmentConfig
from pipeline.data.encoding import encode
from pipeline.data.loaders import Split
from pipeline.kinds.base import IGNORED, Encoded

CHUNK = 2048  # rows of the word-by-word similarity computed at once
# The most frequent words of the texts are kept as they are and offered to none: they are the function words
# ("the", "not", "of"), whose embedding neighbours are other function words, so replacing them broke sentences
# ("on the worst ..." -> "on s worst ...") without changing what they say.
FREQUENT_KEPT = 100


def one_token_words(tokenizer, texts: list[tuple[str, ...]]) -> dict[str, int]:
    """The alphabetic words of `texts` that the tokenizer reads as one token mid-sentence, with that token,
    except the `FREQUENT_KEPT` most frequent."""
    counts = Counter(w for row in texts for text in row for w in text.split() if w.isalpha())
    frequent = {w for w, _ in counts.most_common(FREQUENT_KEPT)}
    words = sorted(w for w in counts if w not in frequent)
    ids = tokenizer([" " + w for w in words], add_special_tokens=False)["input_ids"]
    return {w: i[0] for w, i in zip(words, ids, strict=True) if len(i) == 1}


def neighbours(words: dict[str, int], embeddings: torch.Tensor, k: int) -> dict[str, list[str]]:
    """Each word's `k` nearest other words by the cosine of their input embeddings."""
    names = list(words)
    if len(names) < 2:
        return {}
    vectors = nn.functional.normalize(embeddings[list(words.values())].float(), dim=1)
    k = min(k, len(names) - 1)
    near = {}
    with torch.no_grad():
        for start in range(0, len(names), CHUNK):
            sims = vectors[start : start + CHUNK] @ vectors.T
            rows = torch.arange(sims.shape[0])
            sims[rows, rows + start] = -2.0  # not itself
            top = sims.topk(k, dim=1).indices.tolist()
            for offset, row in enumerate(top):
                near[names[start + offset]] = [names[j] for j in row]
    return near


def replace_words(text: str, near: dict[str, list[str]], p: float, rng: np.random.Generator) -> str:
    """`text` with each word that has neighbours replaced by one of them with probability `p`."""
    out = []
    for word in text.split(" "):
        options = near.get(word)
        out.append(options[rng.integers(len(options))] if options and rng.random() < p else word)
    return " ".join(out)


def augmented_split(split: Split, near: dict[str, list[str]], cfg: AugmentConfig) -> Split:
    """`cfg.copies` replaced copies of every example, unlabelled."""
    rng = np.random.default_rng(cfg.seed)
    texts = [tuple(replace_words(t, near, cfg.p, rng) for t in row) for _ in range(cfg.copies) for row in split.texts]
    return Split(texts, [IGNORED] * len(texts))


def with_augmented(
    train: Encoded, split: Split, tokenizer, teacher: nn.Module, cfg: AugmentConfig, max_length: int
) -> tuple[Encoded, dict]:
    """The training split with its augmented copies appended, and what was made."""
    words = one_token_words(tokenizer, split.texts)
    near = neighbours(words, teacher.get_input_embeddings().weight.detach(), cfg.neighbours)
    extra = encode(tokenizer, augmented_split(split, near, cfg), max_length)
    joined = Encoded(train.features + extra.features, list(train.labels) + list(extra.labels), train.pad_id)
    changed = sum(a != b for a, b in zip(extra.features, train.features * cfg.copies, strict=True))
    report = {"copies": cfg.copies, "examples": len(extra), "changed": changed, "vocabulary": len(near)}
    return joined, report

"""A validation split of whole sentences for training sets made of phrases (SST-2: 67k phrases cut from the parse
trees of a few thousand sentences).

A random slice of such a set is mostly phrases whose parent or child phrase stays in train, so it measures what a
model memorised: on SST-2 1,447 of 2,000 randomly carved validation phrases occur inside a training phrase, 1 of the
872 dev sentences does (docs/results.md). Here validation draws only *roots*, texts that occur inside no other
training text (the whole sentences), and every training text that occurs inside a drawn root leaves train with it,
so no validation sentence has any of its phrases in train.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from functools import lru_cache

LEAK_WARNING = 0.2  # the share of validation texts inside training texts that is a leak (SST-2's random slice: 0.86)


def _key(text: str) -> str:
    return " ".join(text.split())


def _spans(words: list[str]) -> set[str]:
    """Every contiguous run of `words` shorter than all of them."""
    n = len(words)
    return {" ".join(words[i:j]) for i in range(n) for j in range(i + 1, n + 1) if j - i < n}


@lru_cache(maxsize=2)  # every stage reloads its data; finding the roots of 67k phrases takes seconds
def _roots(keys: tuple[str, ...]) -> tuple[dict[str, list[int]], tuple[str, ...]]:
    by_key: dict[str, list[int]] = {}
    for i, k in enumerate(keys):
        by_key.setdefault(k, []).append(i)
    inside: set[str] = set()
    for k in by_key:
        inside.update(s for s in _spans(k.split()) if s in by_key)
    return by_key, tuple(sorted(k for k in by_key if k not in inside))


def whole_sentences(texts: Sequence[str], n: int, seed: int) -> tuple[set[int], set[int]]:
    """(validation, dropped): indices of roots drawn with `seed` until at least `n` (at least one text left for
    train), and the indices of the other texts that occur inside a drawn root (they leave train). Texts compare by
    whole words, whitespace normalised; equal texts go together."""
    by_key, roots = _roots(tuple(_key(t) for t in texts))
    roots = list(roots)
    random.Random(seed).shuffle(roots)
    chosen: set[int] = set()
    dropped: set[int] = set()
    for root in roots:
        if len(chosen) >= n:
            break
        parts = {i for s in _spans(root.split()) if s in by_key for i in by_key[s]}  # never a root: not chosen
        if len(chosen) + len(by_key[root]) + len(dropped | parts) >= len(texts):
            break
        chosen.update(by_key[root])
        dropped |= parts
    return chosen, dropped


def share_inside(validation: Sequence[str], train: Sequence[str], sample: int = 200, seed: int = 0) -> float:
    """The share of (up to `sample` drawn) validation texts of three words or more that occur, as whole words,
    inside a training text: near 0 for independent sentences, 0.86 for SST-2's random slice."""
    pool = [k for k in (_key(t) for t in validation) if len(k.split()) >= 3]
    if not pool:
        return 0.0
    drawn = random.Random(seed).sample(pool, min(sample, len(pool)))
    haystack = "\n".join(f" {_key(t)} " for t in train)
    return sum(f" {k} " in haystack for k in drawn) / len(drawn)

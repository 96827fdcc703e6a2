"""SQuAD v1.1's exact match and F1, as the official evaluation script (`evaluate-v1.1.py`) computes them.

An answer is normalised before comparing: lower-cased, punctuation (Python's `string.punctuation`) removed, the
articles a/an/the removed as whole words, whitespace collapsed. Exact match: the normalised strings are equal.
F1: over the normalised answers' whitespace tokens as bags (shared tokens counted with multiplicity). A question
scores the best of its gold answers; the split scores the mean, in percent.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """The official normalisation: lower, drop punctuation, drop articles, collapse whitespace (in that order)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> bool:
    return normalize_answer(prediction) == normalize_answer(gold)


def token_f1(prediction: str, gold: str) -> float:
    """F1 of the two normalised answers' token bags, in [0, 1] (0 when they share no token, or one is empty)."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    same = sum((Counter(pred) & Counter(ref)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def squad_scores(predictions: Sequence[str], golds: Sequence[Sequence[str]]) -> dict[str, float]:
    """{"exact_match", "f1"} in percent: each question's best over its gold answers, averaged over questions."""
    if len(predictions) != len(golds):
        raise ValueError(f"{len(predictions)} predictions for {len(golds)} questions")
    if not golds:
        return {"exact_match": 0.0, "f1": 0.0}
    em = sum(max(exact_match(p, g) for g in gs) for p, gs in zip(predictions, golds, strict=True))
    f1 = sum(max(token_f1(p, g) for g in gs) for p, gs in zip(predictions, golds, strict=True))
    return {"exact_match": 100.0 * em / len(golds), "f1": 100.0 * f1 / len(golds)}

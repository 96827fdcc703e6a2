"""Entity-level precision, recall and F1 over IOB2 tag sequences, as `seqeval` computes them by default (the
CoNLL `conlleval` rules).

An entity is a maximal run of tags of one type that starts at `B-X`, or at an `I-X` that does not continue an
entity of type X (a model may predict an `I-` after `O`: it starts an entity, as conlleval reads it); it ends
before the next `B-`, `O` or change of type. A predicted entity counts when its type, first and last token equal
a gold entity's. Scores are micro-averaged over all entities of all sentences, in percent. Our own ~30 lines
rather than the `seqeval` package at run time (it brings scikit-learn); the tests check it against `seqeval`.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.kinds.tagged import OUTSIDE, split_tag


def entities(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """The entities of one sentence as (type, first token, last token)."""
    found, start, current = [], None, ""
    for i, tag in enumerate([*tags, OUTSIDE]):  # the sentinel closes an entity running to the end
        prefix, kind = split_tag(tag)
        continues = prefix == "I" and kind == current and start is not None
        if start is not None and not continues:
            found.append((current, start, i - 1))
            start, current = None, ""
        if prefix != OUTSIDE and not continues:
            start, current = i, kind
    return found


def entity_scores(predictions: Sequence[Sequence[str]], golds: Sequence[Sequence[str]]) -> dict[str, float]:
    """{"precision", "recall", "f1"} in percent, micro-averaged over the entities of every sentence."""
    if len(predictions) != len(golds):
        raise ValueError(f"{len(predictions)} predicted sentences for {len(golds)} gold ones")
    pred, gold = set(), set()
    for n, (p, g) in enumerate(zip(predictions, golds, strict=True)):
        if len(p) != len(g):
            raise ValueError(f"sentence {n}: {len(p)} predicted tags for {len(g)} tokens")
        pred.update((n, *e) for e in entities(p))
        gold.update((n, *e) for e in entities(g))
    hit = len(pred & gold)
    precision = 100.0 * hit / len(pred) if pred else 0.0
    recall = 100.0 * hit / len(gold) if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if hit else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}

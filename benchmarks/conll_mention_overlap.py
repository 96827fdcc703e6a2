"""How much a CoNLL validation slice leaks through its documents: the share of its entity mentions (exact words with
their type) that also occur in the training sentences left beside it, for a random slice of sentences (the draw the
token kind's `validation_draw` makes, of the recipes' default size: min(2,000, a tenth of train)) and for a slice of
whole documents of about the same size, against the same share for dev. Reads the files only; no model.

Usage:
    python benchmarks/conll_mention_overlap.py ../shared/data/conll2003 [--seed 0]
"""

from __future__ import annotations

import argparse
import math
import random
from collections import Counter
from pathlib import Path

from pipeline.config.schema import DataLimits
from pipeline.kinds import kind_of
from pipeline.kinds.entity_metric import entities
from pipeline.kinds.tagged import DOCSTART
from serving.artifact import TOKEN


def read_documents(path: Path) -> list[tuple[int, list[tuple[str, str]]]]:
    """(document index, [(word, tag)]) per sentence: `pipeline.kinds.tagged.read_conll` without dropping the
    `-DOCSTART-` lines, which are the documents' boundaries here."""
    sentences, current, doc = [], [], -1
    for line in [*path.read_text(encoding="utf-8").splitlines(), ""]:
        fields = line.split()
        if not fields or fields[0] == DOCSTART:
            if current:
                sentences.append((doc, current))
                current = []
            doc += bool(fields)
            continue
        current.append((fields[0], fields[-1]))
    return sentences


def mentions(sentence: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(type, words) of each entity of a sentence (IOB1 or IOB2, read as entity F1 reads them)."""
    words = [w for w, _ in sentence]
    return [(kind, " ".join(words[a : b + 1])) for kind, a, b in entities([t for _, t in sentence])]


def seen_share(held, train) -> tuple[float, int]:
    seen = {m for _, s in train for m in mentions(s)}
    held_mentions = [m for _, s in held for m in mentions(s)]
    return sum(m in seen for m in held_mentions) / len(held_mentions), len(held_mentions)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    train = read_documents(args.data_dir / "train.txt")
    dev = read_documents(args.data_dir / "dev.txt")
    limits = DataLimits()
    n = min(limits.validation_size, math.floor(limits.validation_fraction * len(train)))
    drawn = kind_of(TOKEN).validation_draw(train, n, args.seed)
    held = [train[i] for i in sorted(drawn)]
    rows = {"random sentences": (held, [s for i, s in enumerate(train) if i not in drawn])}
    docs = sorted({d for d, _ in train})
    random.Random(args.seed).shuffle(docs)
    sizes = Counter(d for d, _ in train)
    chosen, count = set(), 0
    for d in docs:
        if count >= n:
            break
        chosen.add(d)
        count += sizes[d]
    rows["whole documents"] = ([s for s in train if s[0] in chosen], [s for s in train if s[0] not in chosen])
    rows["dev against all of train"] = (dev, train)
    for name, (held, rest) in rows.items():
        share, total = seen_share(held, rest)
        print(f"{name:26s} {len(held):5d} sentences  {total:5d} mentions  {100 * share:5.1f}% seen in training")


if __name__ == "__main__":
    main()

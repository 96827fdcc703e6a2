"""How much a CoNLL validation split leaks through its documents: the share of its entity mentions (exact words with
their type) that also occur in the training sentences left beside it, for the two splits the pipeline can carve
(`data.validation_unit`: `example`, a random slice of sentences; `document`, whole documents, what `auto` carves
where the file marks them), against the same share for dev. Reads the files only; no model.

Usage:
    python benchmarks/conll_mention_overlap.py ../shared/data/conll2003 [--seed 0]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.config.schema import DataLimits
from pipeline.data.loaders import load_task_data
from pipeline.kinds.entity_metric import entities
from pipeline.kinds.tagged import TaggedSplit, read_conll


def mentions(split: TaggedSplit) -> list[tuple[str, str]]:
    """(type, words) of each entity of each sentence of `split` (IOB2, read as entity F1 reads them)."""
    found = []
    for words, tags in zip(split.words, split.tags, strict=True):
        names = [split.names[t] for t in tags]
        found += [(kind, " ".join(words[a : b + 1])) for kind, a, b in entities(names)]
    return found


def seen_share(held: TaggedSplit, train: TaggedSplit) -> tuple[float, int]:
    seen = set(mentions(train))
    held_mentions = mentions(held)
    return sum(m in seen for m in held_mentions) / len(held_mentions), len(held_mentions)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    limits = DataLimits(validation_seed=args.seed)
    rows = {}
    for unit in ("example", "document"):
        data = load_task_data("conll2003", args.data_dir, validation=(*limits.validation[:3], unit))
        rows[f"validation by {unit}"] = (data.validation, data.train)
    rows["dev against all of train"] = (data.dev, read_conll(args.data_dir / "train.txt", data.train.names))
    for name, (held, rest) in rows.items():
        share, total = seen_share(held, rest)
        print(f"{name:26s} {len(held):5d} sentences  {total:5d} mentions  {100 * share:5.1f}% seen in training")


if __name__ == "__main__":
    main()

"""Tokenise a split once, then cut it into dynamically padded tensor batches."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from pipeline.data.loaders import Split, TaskData


@dataclass(frozen=True)
class Encoded:
    """A tokenised split: one dict of token lists per example, plus labels and the pad id."""

    features: list[dict[str, list[int]]]
    labels: list[int]
    pad_id: int

    def __len__(self) -> int:
        return len(self.labels)


def encode(tokenizer, split: Split, max_length: int) -> Encoded:
    columns = list(zip(*split.texts, strict=True))
    enc = tokenizer(*columns, truncation=True, max_length=max_length)
    keys = [k for k in ("input_ids", "attention_mask", "token_type_ids") if k in enc]
    features = [{k: enc[k][i] for k in keys} for i in range(len(split))]
    return Encoded(features, list(split.labels), tokenizer.pad_token_id or 0)


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
    batch["labels"] = torch.tensor([enc.labels[i] for i in idx], dtype=torch.long)
    return batch


def iter_batches(
    enc: Encoded, batch_size: int, *, shuffle: bool = False, generator: torch.Generator | None = None
) -> Iterator[dict[str, torch.Tensor]]:
    order = torch.randperm(len(enc), generator=generator).tolist() if shuffle else list(range(len(enc)))
    for start in range(0, len(order), batch_size):
        yield collate(enc, order[start : start + batch_size])

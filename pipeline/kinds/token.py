"""Token classification (NER): one IOB2 tag per word. CoNLL or JSONL files (`pipeline.kinds.tagged`); the words are
tokenised as the text a user would send and a word's tag labels its first sub-token (the others, and the special
tokens, are IGNORED in the loss, as the field trains NER); entity-level precision, recall and F1
(`pipeline.kinds.entity_metric`)."""

from __future__ import annotations

import bisect
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from pipeline.kinds.base import IGNORED, Encoded, Kind, Spec, feature_keys, scored_by_f1
from pipeline.kinds.entity_metric import entity_scores
from pipeline.kinds.tagged import OUTSIDE, TaggedSplit, check_tag_set, read_conll, read_tagged_jsonl, tagged_rows
from serving.artifact import TOKEN


class TokenClassification(Kind):
    name = TOKEN
    rows = "token"  # a row of tag logits per real token
    formats: ClassVar[dict[str, str]] = {".txt": "conll", ".conll": "conll", ".jsonl": "jsonl"}
    task_file_defaults: ClassVar[dict[str, Any]] = {
        "text_columns": ["tokens"],
        "label_column": "tags",
        "metric": "f1",
        "scheme": "IOB2",
    }
    hub_name = "Token Classification"
    example = 'classify("Peter Blackburn spoke in Brussels.")'
    pipeline_options = ', aggregation_strategy="simple"'
    target_recipes = ((1.0, "conll2003"),)  # entity F1 needs a longer distillation and recovery, with the labels

    def check_task_file(self, task: Any) -> None:
        if len(task.text_columns) != 1:
            raise ValueError("text_columns: a token-classification task reads one column, its words")
        scored_by_f1(task)
        if not task.labels:
            raise ValueError("labels: give the tag set in id order, e.g. [O, B-PER, I-PER]")

    def check_labels(self, labels: list[str]) -> None:
        check_tag_set(labels)

    def inputs(self, spec: Spec) -> str:
        return "words"

    def card_description(self, task: dict) -> str:
        return f"token classifier ({', '.join(task['labels'])})"

    def read(self, spec: Spec, path: Path) -> TaggedSplit:
        if path.suffix.lower() == ".jsonl":
            return read_tagged_jsonl(path, spec.text_columns[0], spec.label_column, spec.labels)
        return read_conll(path, spec.labels)

    def hf_columns(self, spec: Spec) -> tuple[str, ...]:
        return (*spec.hf_text_columns, spec.label_column)

    def hf_split(self, spec: Spec, part: Any, where: str, part_name: str) -> TaggedSplit:
        """Words and tags (ids in the task's tag order, which is the dataset's, or names)."""
        split = f"{where}: split {part_name}"
        rows = ((f"{split}, row {i}", row) for i, row in enumerate(part))
        return tagged_rows(rows, spec.hf_text_columns[0], spec.label_column, spec.labels, split)

    def holds(self, out: Any) -> bool:
        return getattr(out, "logits", None) is not None and out.logits.dim() == 3

    def output_rows(self, out: Any, lengths: list[int]) -> list[np.ndarray]:
        values = out.logits.float().cpu()
        return [values[j][:n].numpy().copy() for j, n in enumerate(lengths)]

    def assemble(self, rows: list[np.ndarray], width: int, device: Any) -> Any:
        import torch
        from transformers.modeling_outputs import TokenClassifierOutput

        logits = torch.zeros(len(rows), width, rows[0].shape[-1])
        for i, r in enumerate(rows):
            logits[i, : len(r)] = torch.from_numpy(r)
        return TokenClassifierOutput(logits=logits.to(device))

    def encode(self, tokenizer: Any, split: TaggedSplit, max_length: int, stride: int | None = None) -> Encoded:
        """Each sentence as the text a user would send (its words joined by single spaces), so every family's
        tokenizer reads it as it will be served (byte-level BPE needs no `add_prefix_space`); a token starting
        inside a word belongs to it, and the word's first such token carries its tag."""
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
            special, offsets = enc.encodings[i].special_tokens_mask, enc["offset_mapping"][i]
            for token, (begin, end) in zip(special, offsets, strict=True):
                word = bisect.bisect_right(starts[i], begin) - 1 if not token and end > begin else None
                row.append(IGNORED if word is None or word in seen else tags[word])
                seen.add(word)
            labels.append(row)
        return Encoded(features, labels, tokenizer.pad_token_id or 0, TOKEN, split)

    def scores(self, rows: np.ndarray, enc: Encoded) -> dict[str, float]:
        """Each word takes the tag of its first sub-token; words cut off by `max_length` are predicted outside."""
        split, names = enc.source, enc.source.names
        predicted, gold, start = [], [], 0
        for i, feature in enumerate(enc.features):
            token_rows = rows[start : start + sum(feature["attention_mask"])]
            start += len(token_rows)
            firsts = [n for n, label in enumerate(enc.labels[i]) if label != IGNORED]
            tags = [names[t] for t in token_rows[firsts].argmax(-1)]
            predicted.append(tags + [OUTSIDE] * (len(split.words[i]) - len(tags)))
            gold.append([names[t] for t in split.tags[i]])
        return entity_scores(predicted, gold)

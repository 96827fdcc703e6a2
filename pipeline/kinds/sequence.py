"""Sequence classification: one label per text or text pair (GLUE, a user's intents). Rows files (TSV, CSV,
JSONL) or a Hugging Face split with a `label` column; one feature per example; accuracy, F1 of class 1 (two
classes) and macro-F1."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from pipeline.errors import PipelineError
from pipeline.kinds.base import Encoded, Kind, Spec, feature_keys
from pipeline.kinds.records import ROW_FORMATS, describe, records
from serving.artifact import SEQUENCE


@dataclass(frozen=True)
class Split:
    """Examples of one split: `texts[i]` holds one string (single-sentence task) or two (pair task)."""

    texts: list[tuple[str, ...]]
    labels: list[int]
    kind: ClassVar[str] = SEQUENCE

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, idx) -> Split:
        return Split([self.texts[i] for i in idx], [self.labels[i] for i in idx])

    def head(self, n: int | None) -> Split:
        """The first `n` examples (all of them for None)."""
        return Split(self.texts[:n], self.labels[:n])

    def digest(self, h) -> None:
        for text, label in zip(self.texts, self.labels, strict=True):
            h.update("\x1f".join(text).encode() + b"\x1e" + str(label).encode() + b"\n")
        h.update(b"\x1d")


def encode_texts(tokenizer, columns: list, labels: list, max_length: int) -> Encoded:
    """One example per row of `columns` (one text column, or two for pairs), each with its label."""
    enc = tokenizer(*columns, truncation=True, max_length=max_length)
    keys = feature_keys(enc)
    features = [{k: enc[k][i] for k in keys} for i in range(len(labels))]
    return Encoded(features, labels, tokenizer.pad_token_id or 0)


def _f1(preds: np.ndarray, labels: np.ndarray, c: int) -> float:
    tp = int(((preds == c) & (labels == c)).sum())
    fp = int(((preds == c) & (labels != c)).sum())
    fn = int(((preds != c) & (labels == c)).sum())
    return float(200 * tp / (2 * tp + fp + fn)) if tp else 0.0


class SequenceClassification(Kind):
    name = SEQUENCE
    rows = "sequence"  # a row of class logits per example
    formats = ROW_FORMATS
    folder_name = "GLUE TSV"
    hub_name = "Text Classification"
    example = 'classify("a warm, funny film")'
    # from 6x: layer-wise KD, augmented sentences, longer training (6x within 1.0 on SST-2 dev where the default
    # lost 4 to 7 points on validation at 8x)
    target_recipes = ((6.0, "layerwise"),)

    def check_task_file(self, task: Any) -> None:
        if not task.text_columns:
            raise ValueError("text_columns: give one text column, or two for a pair task")
        if not task.label_column:
            raise ValueError("label_column: name the column that holds the label")
        if task.scheme is not None:
            raise ValueError("scheme: IOB1/IOB2 is for token-classification tasks")
        values = [str(v) for v in task.labels]
        if len(values) < 2:
            raise ValueError(f"labels: a classification task needs at least two labels, got {values}")
        if len(set(values)) != len(values):
            raise ValueError(f"labels: each label once, got {values}")
        if task.metric not in ("accuracy", "f1", "macro_f1"):
            raise ValueError(f"metric: a classification task is scored by accuracy, f1 or macro_f1, not {task.metric}")
        if task.metric == "f1" and len(values) != 2:
            raise ValueError(f"metric f1 is for two labels; {len(values)} labels: use macro_f1 or accuracy")

    def is_pair(self, spec: Spec) -> bool:
        return len(spec.text_columns) == 2

    def inputs(self, spec: Spec) -> str:
        return "sentence pairs" if self.is_pair(spec) else "single sentence"

    def card_description(self, task: dict) -> str:
        reads = "sentence pairs" if task.get("pair") else "single texts"
        return f"classifier ({', '.join(task['labels'])}; {reads})"

    def read(self, spec: Spec, path: Path) -> Split:
        fmt = ROW_FORMATS.get(path.suffix.lower())
        if fmt is None:
            raise PipelineError(f"{path}: unknown format {path.suffix!r}; data files are {', '.join(ROW_FORMATS)}")
        columns = (*spec.text_columns, spec.label_column)
        values = {v: i for i, v in enumerate(spec.label_values)}
        texts, labels = [], []
        for lineno, record in records(path, fmt, columns):
            for c in spec.text_columns:
                if not isinstance(record[c], str):
                    raise PipelineError(f"{path}:{lineno}: column {c!r} is {describe(record[c])}; expected text")
            raw = record[spec.label_column]
            key = str(raw).strip() if isinstance(raw, str | int) and not isinstance(raw, bool) else None
            if key not in values:
                raise PipelineError(
                    f"{path}:{lineno}: label {raw!r} is not one of task {spec.name}'s labels ({', '.join(values)})"
                )
            texts.append(tuple(record[c] for c in spec.text_columns))
            labels.append(values[key])
        if not labels:
            raise PipelineError(f"{path}: no examples")
        return Split(texts, labels)

    def hf_columns(self, spec: Spec) -> tuple[str, ...]:
        return (*spec.hf_text_columns, "label")

    def hf_split(self, spec: Spec, part: Any, where: str, part_name: str) -> Split:
        """Integer labels are class ids (GLUE's test-style -1 rows are dropped), string labels the task's values."""
        texts = list(zip(*(part[c] for c in spec.hf_text_columns), strict=True))
        values = {v: i for i, v in enumerate(spec.label_values)}
        n = self.num_labels(spec)
        kept_texts, labels = [], []
        for row, (text, raw) in enumerate(zip(texts, part["label"], strict=True)):
            if isinstance(raw, int) and not isinstance(raw, bool):
                if raw == -1:
                    continue
                label = raw if 0 <= raw < n else None
            else:
                label = values.get(str(raw).strip())
            if label is None:
                known = f"{', '.join(values)} or ids 0-{n - 1}"
                where_row = f"{where}: split {part_name}, row {row}"
                raise PipelineError(f"{where_row}: label {raw!r} is not one of {spec.name}'s labels ({known})")
            if not all(isinstance(t, str) for t in text):
                raise PipelineError(f"{where}: split {part_name}, row {row}: a text is not a string ({text!r:.80})")
            kept_texts.append(text)
            labels.append(label)
        if not labels:
            raise PipelineError(f"{where}: split {part_name} has no labelled examples")
        return Split(kept_texts, labels)

    def holds(self, out: Any) -> bool:
        return getattr(out, "logits", None) is not None and out.logits.dim() == 2

    def output_rows(self, out: Any, lengths: list[int]) -> list[np.ndarray]:
        return [row.numpy().copy() for row in out.logits.float().cpu()]

    def assemble(self, rows: list[np.ndarray], width: int, device: Any) -> Any:
        import torch
        from transformers.modeling_outputs import SequenceClassifierOutput

        return SequenceClassifierOutput(logits=torch.stack([torch.from_numpy(r) for r in rows]).to(device))

    def encode(self, tokenizer: Any, split: Split, max_length: int, stride: int | None = None) -> Encoded:
        return encode_texts(tokenizer, list(zip(*split.texts, strict=True)), list(split.labels), max_length)

    def scores(self, rows: np.ndarray, enc: Encoded) -> dict[str, float]:
        preds = np.asarray(rows).argmax(-1)
        labels = np.asarray(enc.labels)
        result = {"accuracy": float((preds == labels).mean() * 100)}
        f1 = [_f1(preds, labels, c) for c in range(rows.shape[-1])]
        if rows.shape[-1] == 2:
            result["f1"] = f1[1]
        result["macro_f1"] = float(np.mean(f1))
        return result

    def example_scores(self, rows: np.ndarray, enc: Encoded) -> np.ndarray:
        """Accuracy: 0 or 100 per example."""
        return 100.0 * (np.asarray(rows).argmax(-1) == np.asarray(enc.labels))

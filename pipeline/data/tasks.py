"""Tasks are data, not branches: one `TaskSpec` per GLUE-style classification task.

A spec says where the text and the label live in each source (GLUE TSV folder, Hugging Face dataset), how
raw label values map to class ids, and which metric to report. Pair tasks need no code change: they name two
text columns.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.errors import PipelineError


@dataclass(frozen=True)
class TaskSpec:
    """A sequence-classification task.

    Attributes:
        name: registry key and CLI value.
        labels: class names in id order (they become the model's `id2label`).
        tsv_text_columns: header names of the text column(s) in the GLUE TSV files (two for pair tasks).
        tsv_label_column: header name of the label column.
        tsv_label_values: the raw TSV value of each class, in id order.
        train_file, dev_file: file names inside `--data-dir`.
        hf_dataset: `datasets.load_dataset` arguments (path, config name).
        hf_text_columns: text field(s) in the Hugging Face dataset.
        hf_dev_split: the split used as dev.
        metric: headline metric, `accuracy` or `f1` (binary, positive class 1).
        has_sample: whether the project ships an embedded sample for this task.
    """

    name: str
    labels: tuple[str, ...]
    tsv_text_columns: tuple[str, ...]
    tsv_label_column: str
    tsv_label_values: tuple[str, ...]
    hf_dataset: tuple[str, str]
    hf_text_columns: tuple[str, ...]
    train_file: str = "train.tsv"
    dev_file: str = "dev.tsv"
    hf_dev_split: str = "validation"
    metric: str = "accuracy"
    has_sample: bool = False

    @property
    def num_labels(self) -> int:
        return len(self.labels)

    @property
    def is_pair(self) -> bool:
        return len(self.tsv_text_columns) == 2


TASKS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in (
        TaskSpec(
            name="sst2",
            labels=("negative", "positive"),
            tsv_text_columns=("sentence",),
            tsv_label_column="label",
            tsv_label_values=("0", "1"),
            hf_dataset=("glue", "sst2"),
            hf_text_columns=("sentence",),
            has_sample=True,
        ),
        TaskSpec(
            name="mrpc",
            labels=("not_equivalent", "equivalent"),
            tsv_text_columns=("#1 String", "#2 String"),
            tsv_label_column="Quality",
            tsv_label_values=("0", "1"),
            hf_dataset=("glue", "mrpc"),
            hf_text_columns=("sentence1", "sentence2"),
            metric="f1",
        ),
        TaskSpec(
            name="rte",
            labels=("entailment", "not_entailment"),
            tsv_text_columns=("sentence1", "sentence2"),
            tsv_label_column="label",
            tsv_label_values=("entailment", "not_entailment"),
            hf_dataset=("glue", "rte"),
            hf_text_columns=("sentence1", "sentence2"),
        ),
        TaskSpec(
            name="mnli",
            labels=("entailment", "neutral", "contradiction"),
            tsv_text_columns=("sentence1", "sentence2"),
            tsv_label_column="gold_label",
            tsv_label_values=("entailment", "neutral", "contradiction"),
            hf_dataset=("glue", "mnli"),
            hf_text_columns=("premise", "hypothesis"),
            dev_file="dev_matched.tsv",
            hf_dev_split="validation_matched",
        ),
        TaskSpec(
            name="qnli",
            labels=("entailment", "not_entailment"),
            tsv_text_columns=("question", "sentence"),
            tsv_label_column="label",
            tsv_label_values=("entailment", "not_entailment"),
            hf_dataset=("glue", "qnli"),
            hf_text_columns=("question", "sentence"),
        ),
    )
}


def get_task(name: str) -> TaskSpec:
    """Return the task called `name`, or fail with the list of known ones."""
    try:
        return TASKS[name]
    except KeyError:
        raise PipelineError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}") from None

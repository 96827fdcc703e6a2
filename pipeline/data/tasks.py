"""Tasks are data, not branches: one `TaskSpec` per task.

A spec says what kind of task it is (sequence classification, token classification, extractive question
answering: the names of transformers' pipelines), where the text and the labels live in each source (files,
Hugging Face dataset), how raw label values map to class ids, and which metric to report. Pair tasks need no code
change: they name two text columns. The built-in tasks are in `TASKS` (GLUE, CoNLL-2003 NER, SQuAD v1.1); a
user's own task comes from a small YAML file (`CustomTask`, `--task-file`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.config.recipes import read_yaml_mapping
from pipeline.config.schema import CustomTask, parse
from pipeline.errors import PipelineError
from pipeline.kinds import kind_of
from serving.artifact import EMBEDDING, QA, SEQUENCE, TOKEN

CONLL_TAGS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")  # Hugging Face's order


@dataclass(frozen=True)
class TaskSpec:
    """A task.

    Attributes:
        name: registry key and CLI value (or the user's task name).
        labels: class names (token classification: IOB2 tags) in id order; they become the model's `id2label`.
            Question answering has none.
        text_columns: the text column(s) in the data files (two for pair tasks; token classification: the words;
            question answering: question and context).
        label_column: the label column (token classification: the tags; question answering: the answers).
        label_values: the raw value of each class in the files, in id order.
        hf_dataset: `datasets.load_dataset` arguments (path, config name); None for a user's task.
        hf_text_columns: text field(s) in the Hugging Face dataset (also read from a local dataset folder).
        train_file, dev_file: file names inside `--data-dir` (absolute paths for a user's task).
        hf_dev_split: the split used as dev.
        metric: headline metric: accuracy, f1 (two labels, positive class 1) or macro_f1; token classification:
            f1 of entities; question answering: SQuAD's f1 (exact match is reported beside it); sentence
            embeddings: spearman (scored pairs) or ndcg_at_10 (retrieval; recall@1 and @10 beside it).
        has_sample: whether the project ships an embedded sample for this task.
        custom: a user's task (`--task-file`), not a built-in one.
        kind: the task kind's name (`pipeline.kinds`): SEQUENCE, TOKEN, QA or EMBEDDING.
    """

    name: str
    labels: tuple[str, ...]
    text_columns: tuple[str, ...]
    label_column: str
    label_values: tuple[str, ...]
    hf_dataset: tuple[str, str] | None = None
    hf_text_columns: tuple[str, ...] = ()
    train_file: str = "train.tsv"
    dev_file: str = "dev.tsv"
    hf_dev_split: str = "validation"
    metric: str = "accuracy"
    has_sample: bool = False
    custom: bool = False
    kind: str = SEQUENCE

    @property
    def num_labels(self) -> int:
        """Classes of the model's head (question answering: start and end)."""
        return kind_of(self.kind).num_labels(self)

    @property
    def is_pair(self) -> bool:
        """Two texts classified together (a QA task's question and context are not a sentence pair)."""
        return kind_of(self.kind).is_pair(self)

    @property
    def identity(self) -> str:
        """What the data fingerprint hashes besides the examples: a user's task also by its label names."""
        return self.name if not self.custom else f"{self.name}\x1f" + "\x1f".join(self.labels)

    def describe(self) -> dict:
        """The task block that travels with an artifact (config.json and manifest): what any consumer needs."""
        return {
            "name": self.name,
            "kind": self.kind,
            "labels": list(self.labels),
            "text_columns": list(self.text_columns),
            "pair": self.is_pair,
            "metric": self.metric,
        }


TASKS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in (
        TaskSpec(
            name="sst2",
            labels=("negative", "positive"),
            text_columns=("sentence",),
            label_column="label",
            label_values=("0", "1"),
            hf_dataset=("glue", "sst2"),
            hf_text_columns=("sentence",),
            has_sample=True,
        ),
        TaskSpec(
            name="mrpc",
            labels=("not_equivalent", "equivalent"),
            text_columns=("#1 String", "#2 String"),
            label_column="Quality",
            label_values=("0", "1"),
            hf_dataset=("glue", "mrpc"),
            hf_text_columns=("sentence1", "sentence2"),
            metric="f1",
        ),
        TaskSpec(
            name="rte",
            labels=("entailment", "not_entailment"),
            text_columns=("sentence1", "sentence2"),
            label_column="label",
            label_values=("entailment", "not_entailment"),
            hf_dataset=("glue", "rte"),
            hf_text_columns=("sentence1", "sentence2"),
        ),
        TaskSpec(
            name="mnli",
            labels=("entailment", "neutral", "contradiction"),
            text_columns=("sentence1", "sentence2"),
            label_column="gold_label",
            label_values=("entailment", "neutral", "contradiction"),
            hf_dataset=("glue", "mnli"),
            hf_text_columns=("premise", "hypothesis"),
            dev_file="dev_matched.tsv",
            hf_dev_split="validation_matched",
        ),
        TaskSpec(
            name="qnli",
            labels=("entailment", "not_entailment"),
            text_columns=("question", "sentence"),
            label_column="label",
            label_values=("entailment", "not_entailment"),
            hf_dataset=("glue", "qnli"),
            hf_text_columns=("question", "sentence"),
        ),
        TaskSpec(
            name="conll2003",
            kind=TOKEN,
            labels=CONLL_TAGS,
            text_columns=("tokens",),
            label_column="ner_tags",
            label_values=CONLL_TAGS,
            hf_dataset=("conll2003", "conll2003"),
            hf_text_columns=("tokens",),
            train_file="train.txt",  # CoNLL columns, IOB2 (`valid.txt` of the usual distribution is dev.txt)
            dev_file="dev.txt",
            metric="f1",
        ),
        TaskSpec(
            name="squad",
            kind=QA,
            labels=(),
            text_columns=("question", "context"),
            label_column="answers",
            label_values=(),
            hf_dataset=("squad", "plain_text"),
            hf_text_columns=("question", "context"),
            train_file="train.json",
            dev_file="dev.json",
            metric="f1",
        ),
        TaskSpec(  # the STS benchmark: Spearman of the cosine similarity against the pairs' scores
            name="stsb",
            kind=EMBEDDING,
            labels=(),
            text_columns=("sentence1", "sentence2"),
            label_column="score",
            label_values=(),
            hf_dataset=("glue", "stsb"),
            hf_text_columns=("sentence1", "sentence2"),
            metric="spearman",
        ),
        TaskSpec(  # SQuAD's questions against every paragraph of their split's articles
            name="squad-retrieval",
            kind=EMBEDDING,
            labels=(),
            text_columns=("question", "context"),
            label_column="",
            label_values=(),
            hf_dataset=("squad", "plain_text"),
            hf_text_columns=("question", "context"),
            train_file="train.json",
            dev_file="dev.json",
            metric="ndcg_at_10",
        ),
    )
}


def get_task(name: str) -> TaskSpec:
    """Return the task called `name`, or fail with the list of known ones."""
    try:
        return TASKS[name]
    except KeyError:
        raise PipelineError(
            f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))} (or define your own: --task-file)"
        ) from None


def custom_spec(task: CustomTask) -> TaskSpec:
    """The spec of a user's task: its label values are its label names."""
    values = tuple(str(v) for v in task.labels)
    return TaskSpec(
        name=task.name,
        labels=values,
        text_columns=task.text_columns,
        label_column=task.label_column,
        label_values=values,
        hf_text_columns=task.text_columns,
        train_file=task.train,
        dev_file=task.dev,
        metric=task.metric,
        custom=True,
        kind=task.kind,
    )


def load_task_file(path: str | Path) -> CustomTask:
    """The task a YAML file defines, with its data paths resolved against the file's folder; one-line errors."""
    path = Path(path)
    data = read_yaml_mapping(path, "task file")
    for key in ("train", "dev"):
        if isinstance(data.get(key), str):
            data[key] = str((path.parent / data[key]).resolve())
    task = parse(CustomTask, data, f"task file {path}")
    try:
        kind_of(task.kind).check_labels([str(t) for t in task.labels])
    except ValueError as e:
        raise PipelineError(f"invalid task file {path}: labels: {e}") from None
    if task.name in TASKS:
        raise PipelineError(f"task file {path}: name {task.name!r} is a built-in task; use --task {task.name}, or "
                            "another name")  # fmt: skip
    return task


def task_spec(name: str, custom: CustomTask | dict | None = None) -> TaskSpec:
    """The spec of a built-in task, or of the user's task when its definition is given."""
    if custom is None:
        return get_task(name)
    return custom_spec(custom if isinstance(custom, CustomTask) else CustomTask.model_validate(custom))

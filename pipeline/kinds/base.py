"""What the pipeline knows about one task kind, and the encoded split every kind produces.

A kind (sequence classification, token classification, extractive question answering: the names of transformers'
pipelines, which the artifact's task block carries) is one adapter module beside this one: how a task file of it
is written and checked, how its data files are read, how a split is tokenised and labelled, how the model's
prediction rows are scored. The generic code (data loading, encoding, training, validation, the model card) asks
the adapter (`pipeline.kinds.kind_of`) instead of branching on the kind.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np

from serving.artifact import GRAPHS, HEAD_SUFFIXES, SEQUENCE, pipeline_tag

IGNORED = -100  # a label the loss skips (cross-entropy's ignore_index)


class Spec(Protocol):
    """What a kind reads of a task (`pipeline.data.tasks.TaskSpec` has these fields and more)."""

    name: str
    labels: tuple[str, ...]
    text_columns: tuple[str, ...]
    label_column: str
    label_values: tuple[str, ...]
    hf_text_columns: tuple[str, ...]
    metric: str


@dataclass(frozen=True)
class Encoded:
    """A tokenised split: one dict of token lists per feature, plus labels and the pad id. A label is a class id
    (sequence), a list of tag ids per token (token classification), or a (start, end) token pair (QA windows).

    Token classification and QA also keep what scoring needs: the split itself (gold tags and their names; gold
    answers and contexts) and, for QA, each window's question (`samples`) and `windows` (serving.spans)."""

    features: list[dict[str, list[int]]]
    labels: list
    pad_id: int
    kind: str = SEQUENCE
    source: Any = None
    samples: list[int] | None = None
    windows: list | None = None

    def __len__(self) -> int:
        return len(self.labels)


def scored_by_f1(task: Any) -> None:
    """A task file of a kind whose only metric is f1 (entities, answers) says f1, or nothing."""
    if task.metric != "f1":
        raise ValueError(f"metric: a {task.kind} task is scored by f1, not {task.metric}")


def whole_groups(keys: list[str], n: int, seed: int, most: int | None = None) -> set[int]:
    """The indices of whole groups of examples (examples sharing a key), drawn in a seeded order until there are
    `n`, at least one example left out. With `most`, a group that would take the draw past `most` is passed over
    (the first is taken whatever its size); without it, the draw stops at the first group that would leave
    nothing out."""
    by_key: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        by_key.setdefault(key, []).append(i)
    groups = list(by_key.values())
    random.Random(seed).shuffle(groups)
    chosen: set[int] = set()
    for group in groups:
        if len(chosen) >= n:
            break
        if len(chosen) + len(group) >= len(keys):
            if most is None:
                break
            continue
        if most is not None and chosen and len(chosen) + len(group) > most:
            continue
        chosen.update(group)
    return chosen or {0}


def feature_keys(enc) -> list[str]:
    return [k for k in ("input_ids", "attention_mask", "token_type_ids") if k in enc]


class Kind:
    """One task kind; subclasses fill in what differs."""

    name: ClassVar[str]  # the contract's name (`serving.artifact`): the task block and task files say it
    rows: ClassVar[str]  # what one stored teacher-output row holds (`pipeline.train.teacher_outputs`)
    formats: ClassVar[dict[str, str]]  # a data file's format, from its extension
    task_file_defaults: ClassVar[dict[str, Any]] = {}  # what a task file of this kind may leave out
    folder_name: ClassVar[str] = "data"  # what a `--data-dir` folder of its files is called in the report
    hub_name: ClassVar[str]  # the model card's task name
    example: ClassVar[str]  # the model card's example call of transformers' pipeline
    pipeline_options: ClassVar[str] = ""  # what that call adds to `pipeline(...)`
    # the packaged recipe a speed target of at least X runs with when none is named: (X, recipe), ascending; what the
    # notebook measured best for the kind (docs/results.md)
    target_recipes: ClassVar[tuple[tuple[float, str], ...]] = ()
    # whether the teacher is the base model fine-tuned on the task's labels; else the base model as it is (an
    # embedding model is its own teacher, a student learns its vectors)
    fine_tunes_teacher: ClassVar[bool] = True
    # whether a prediction row is a vector (an embedding), compared by cosine, not by its argmax
    vectors: ClassVar[bool] = False

    # -- the task ------------------------------------------------------------------------------------------------

    def check_task_file(self, task: Any) -> None:
        """Raise ValueError naming what a task file of this kind (a `CustomTask`) gets wrong."""

    def check_labels(self, labels: list[str]) -> None:
        """Raise ValueError when `labels` cannot be this kind's label set."""

    def target_recipe(self, speedup: float) -> str | None:
        """The recipe a `--target-speedup` of `speedup` runs with when none is named (None: the chain's default)."""
        return next((recipe for least, recipe in reversed(self.target_recipes) if speedup >= least), None)

    def num_labels(self, spec: Spec) -> int:
        """Classes of the model's head."""
        return len(spec.labels)

    def is_pair(self, spec: Spec) -> bool:
        """Two texts classified together."""
        return False

    def inputs(self, spec: Spec) -> str:
        """What a request of this kind carries, in `pipeline tasks`' words."""
        raise NotImplementedError

    def predicts(self, spec: Spec) -> str:
        """What its model answers, in `pipeline tasks`' words."""
        return f"{len(spec.labels)} labels ({', '.join(spec.labels)})"

    def card_description(self, task: dict) -> str:
        """The model card's name for the model of a task block."""
        raise NotImplementedError

    # -- data files ---------------------------------------------------------------------------------------------

    def read(self, spec: Spec, path: Path) -> Any:
        """The examples of one data file (its format from its extension); every bad row is a one-line error."""
        raise NotImplementedError

    def hf_columns(self, spec: Spec) -> tuple[str, ...]:
        """The columns a Hugging Face split of this kind must have."""
        raise NotImplementedError

    def hf_split(self, spec: Spec, part: Any, rows: Any, where: str) -> Any:
        """One Hugging Face split (`part`; `rows`: (where, row) pairs of it; `where`: the split's name)."""
        raise NotImplementedError

    def validation_draw(self, split: Any, n: int, seed: int) -> set[int]:
        """The indices of `n` examples drawn with `seed` for the validation split."""
        return set(random.Random(seed).sample(range(len(split)), n))

    def sharing_texts(self, split: Any, chosen: set[int]) -> set[int]:
        """The examples outside `chosen` that share a text with it, dropped from training when `chosen` becomes
        validation (none by default: a kind whose texts recur across examples says which)."""
        return set()

    # -- the model's outputs, one row per example (the teacher outputs kept for output KD) -----------------------

    def holds(self, out: Any) -> bool:
        """Whether a model output (transformers' `ModelOutput`) is of this kind."""
        raise NotImplementedError

    def output_rows(self, out: Any, lengths: list[int]) -> list[np.ndarray]:
        """Each example's float32 row of `out`, cut to its `lengths` real tokens where rows run over tokens."""
        raise NotImplementedError

    def assemble(self, rows: list[np.ndarray], width: int, device: Any) -> Any:
        """A batch's model output from its rows, padded to `width` tokens (pads read 0; the losses drop them)."""
        raise NotImplementedError

    # -- the artifact --------------------------------------------------------------------------------------------

    def write_layout(self, folder: Path, model: Any, max_length: int) -> list[str]:
        """Write what this kind's consumers read beside the graphs into the artifact `folder` (its exported
        `model`, the tokens per text it was made at); the files written (none by default: Optimum's and the
        server's layout is the graphs, config and tokenizer)."""
        return []

    def baseline_graphs(self, model_dir: str, work: Path, cache_dir: str) -> dict:
        """Write the dense baselines this kind's users have besides the dense fp32 and int8 graphs into `work` (the
        benchmark times them beside the others; made once per teacher in `cache_dir`); a report of what was made
        (none by default)."""
        return {}

    def card_usage(self, task: dict) -> list[str]:
        """The model card's "Use" lines for a model of the task block `task`: Optimum's ORTModel class in
        transformers' pipeline, on the int8 graph."""
        tag, ort_class, options = pipeline_tag(self.name), f"ORTModel{HEAD_SUFFIXES[self.name]}", self.pipeline_options
        return [
            "```python",
            f"from optimum.onnxruntime import {ort_class}",
            "from transformers import AutoTokenizer, pipeline",
            "",
            f'model = {ort_class}.from_pretrained(".", file_name="{GRAPHS["int8"]}")',
            f'# on a GPU: file_name="{GRAPHS["fp16"]}", provider="CUDAExecutionProvider"',
            f'classify = pipeline("{tag}", model=model, tokenizer=AutoTokenizer.from_pretrained("."){options})',
            self.example,
            "```",
        ]

    # -- encoding and scoring -----------------------------------------------------------------------------------

    def encode(self, tokenizer: Any, split: Any, max_length: int, stride: int | None = None) -> Encoded:
        raise NotImplementedError

    def join_rows(self, batches: list[np.ndarray], enc: Encoded) -> np.ndarray:
        """The prediction rows of every batch in order."""
        return np.concatenate(batches)

    def scores(self, rows: np.ndarray, enc: Encoded) -> dict[str, float]:
        """The kind's metrics in percent."""
        raise NotImplementedError

    def mixed_scores(self, rows: np.ndarray, reference: np.ndarray, enc: Encoded) -> dict[str, float] | None:
        """The metrics with one side of each comparison from `rows` (a compressed model's) and the other from
        `reference` (its teacher's), where the kind's rows are compared with each other (embeddings: student
        queries against a teacher's index); None for a kind whose rows are scored alone."""
        return None

    def example_scores(self, rows: np.ndarray, enc: Encoded) -> np.ndarray | None:
        """Each example's share of a metric that is a mean over examples, in percent (None: the metric counts the
        whole split)."""
        return None

"""SMP's task head: the verbalizer (label words through the MLM head) when the base model has one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.compress.methods.smp.verbalizer import LABEL_WORDS, has_mlm_head, label_word_ids
from pipeline.data.tasks import SEQUENCE, TaskSpec
from pipeline.errors import PipelineError
from pipeline.models.families import mlm_layout, mlm_model_types
from pipeline.models.folders import load_tokenizer


def resolve_head(
    cfg, model_dir: str | Path, model_config: dict[str, Any], task: TaskSpec
) -> tuple[str, list[str] | None]:
    """("verbalizer", label words) or ("classifier", None); checks that every label word is one token.

    The verbalizer reuses BERT's and RoBERTa's MLM head modules; other families, and token-classification and
    question-answering tasks, take the task's own head.
    """
    model_type = model_config.get("model_type")
    if task.kind != SEQUENCE:  # label words score a whole text, not a token or a span
        if cfg.head == "verbalizer":
            raise PipelineError(f"smp head 'verbalizer' is for sequence classification; task {task.name} is "
                                f"{task.kind}: use head 'classifier'")  # fmt: skip
        return "classifier", None
    if cfg.head == "verbalizer" and mlm_layout(model_type) is None:
        supported = ", ".join(mlm_model_types())
        raise PipelineError(f"smp head 'verbalizer' supports {supported}, not {model_type!r}: use head 'classifier'")
    mlm = mlm_layout(model_type) is not None and has_mlm_head(model_dir)
    if cfg.head == "verbalizer" and not mlm:
        raise PipelineError(f"smp head 'verbalizer' needs a base model with an MLM head; {model_dir} has none")
    if cfg.head == "classifier" or not mlm:
        return "classifier", None
    words = cfg.label_words or LABEL_WORDS.get(task.name)
    if not words:
        raise PipelineError(f"no default label words for task {task.name!r}; set config.label_words")
    if len(words) != task.num_labels:
        raise PipelineError(f"label_words {words} must give one word per label of {task.name} ({task.num_labels})")
    label_word_ids(load_tokenizer(model_dir), words, model_config.get("model_type", "bert"))
    return "verbalizer", list(words)

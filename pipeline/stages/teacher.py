"""The teacher stage: the dense fine-tuned classifier every later stage compares against and distils from (for
sentence embeddings, the base model itself)."""

from __future__ import annotations

import logging
from pathlib import Path

from pipeline.config.schema import TrainConfig
from pipeline.data.loaders import DataRef
from pipeline.errors import PipelineError
from pipeline.kinds import kind_of
from pipeline.models.folders import load_tokenizer
from pipeline.models.io import load_model
from pipeline.train.fine_tune import fine_tuned

log = logging.getLogger(__name__)


def run(model_dir: str, teacher_dir: str | None, ref: DataRef, cfg: TrainConfig, cache_dir: str) -> dict:
    """The dense fine-tuned teacher: `teacher_dir` as given, else `model_dir` fine-tuned on the task (cached)."""
    data = ref.load()
    if teacher_dir is not None:
        teacher = load_model(teacher_dir)
        if teacher.config.num_labels != data.task.num_labels:
            raise PipelineError(
                f"teacher {teacher_dir} has {teacher.config.num_labels} labels, "
                f"task {data.task.name} has {data.task.num_labels}"
            )
        load_tokenizer(teacher_dir)
        return {"path": str(Path(teacher_dir).resolve()), "source": "given (--teacher)", "cached": False}
    path, hit, info = fine_tuned(model_dir, data, cfg, cache_dir)
    made = "fine-tuned" if kind_of(data.task.kind).fine_tunes_teacher else "the base model as it is, scored"
    log.info("teacher: %s (%s), validation %s", path, "cached" if hit else f"{made} now", info.get("validation"))
    source = f"fine-tuned from {model_dir}" if made == "fine-tuned" else f"{model_dir} itself (the base model)"
    return {"path": str(path), "source": source, "cached": hit, **info}

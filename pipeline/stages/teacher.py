"""The teacher stage: the dense fine-tuned classifier every later stage compares against and distils from."""

from __future__ import annotations

import logging
from pathlib import Path

from pipeline.cache import cached_stage, dir_digest
from pipeline.config.schema import TrainConfig
from pipeline.data.encoding import encode_task
from pipeline.data.loaders import DataRef
from pipeline.errors import PipelineError
from pipeline.models.folders import check_model_dir, load_tokenizer
from pipeline.models.io import load_base_model, load_model, save_model
from pipeline.train.loop import train

log = logging.getLogger(__name__)

# Bump when a change alters what the stage produces, to invalidate its cache entries.
TEACHER_VERSION = "1"


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
    check_model_dir(model_dir)

    def build(out: Path) -> dict:
        tokenizer = load_tokenizer(model_dir)
        model = load_base_model(model_dir, data.task)
        train_enc, val_enc = encode_task(tokenizer, data, cfg.max_length)
        result = train(model, train_enc, val_enc, cfg, desc="teacher fine-tuning")
        save_model(model, tokenizer, out)
        return {**result.report(), "base_model": str(model_dir)}

    key = dict(stage="teacher", v=TEACHER_VERSION, model=dir_digest(Path(model_dir)), data=data.fingerprint,
               cfg=cfg.model_dump())  # fmt: skip
    path, hit, info = cached_stage(cache_dir, "teachers", key, build)
    log.info("teacher: %s (%s), validation %s", path, "cached" if hit else "fine-tuned now", info.get("validation"))
    return {"path": str(path), "source": f"fine-tuned from {model_dir}", "cached": hit, **info}

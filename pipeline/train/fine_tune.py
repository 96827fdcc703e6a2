"""A base model fine-tuned on a task's training split, cached by model, data and recipe: the teacher, and the KD
teacher made from `--kd-model` (the same build, so the same rules for the cache, stopping and resuming). A kind
whose teacher is the base model as it is (sentence embeddings) gets it scored on validation, not trained."""

from __future__ import annotations

from pathlib import Path

from pipeline.cache import cached_stage, dir_digest
from pipeline.config.schema import TrainConfig
from pipeline.data.encoding import encode_task
from pipeline.data.loaders import TaskData
from pipeline.kinds import kind_of
from pipeline.models.folders import check_model_dir, load_tokenizer
from pipeline.models.io import load_base_model, save_model
from pipeline.train.loop import train
from pipeline.train.metrics import predict_logits, scores

# Bump when a change alters what the fine-tuning produces, to invalidate its cache entries.
TEACHER_VERSION = "2"  # 2: the new head drawn from the recipe's seed alone (`load_base_model`)


def fine_tuned(model_dir: str, data: TaskData, cfg: TrainConfig, cache_dir: str) -> tuple[Path, bool, dict]:
    """(folder, cache hit, report) of `model_dir` fine-tuned on `data`'s training split with `cfg`, scored on its
    validation split."""
    check_model_dir(model_dir)

    def build(out: Path) -> dict:
        tokenizer = load_tokenizer(model_dir)
        model = load_base_model(model_dir, data.task, cfg.seed)
        train_enc, val_enc = encode_task(tokenizer, data, cfg.max_length)
        if kind_of(data.task.kind).fine_tunes_teacher:
            report = train(model, train_enc, val_enc, cfg, desc="teacher fine-tuning").report()
        else:
            report = {"steps": 0, "validation": scores(predict_logits(model, val_enc), val_enc)}
        save_model(model, tokenizer, out)
        return {**report, "base_model": str(model_dir)}

    key = dict(stage="teacher", v=TEACHER_VERSION, model=dir_digest(Path(model_dir)), data=data.fingerprint,
               cfg=cfg.model_dump())  # fmt: skip
    return cached_stage(cache_dir, "teachers", key, build, trains=True)

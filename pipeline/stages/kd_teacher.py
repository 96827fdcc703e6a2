"""The KD-teacher stage: a stronger classifier of the task whose logits output KD distils (`--kd-model`, a base
model this stage fine-tunes; or `--kd-teacher`, one already fine-tuned), scored beside the teacher.

`--kd-model` is fine-tuned exactly as the teacher is (the teacher stage's build and cache, on the same training
split and validation carve: a KD teacher that saw the validation sentences would flatter every choice made on
them), with the teacher's recipe in bf16 where that is fast (a GPU, or a CPU with native bfloat16) and with
length-grouped batches: 12 x 768 on two CPU cores took 13 minutes so, 86 in fp32 with shuffled batches. It is used
only when it scores above the teacher on validation; otherwise the run says so and distils the teacher's own
logits. A given `--kd-teacher` is the user's choice: scored and used (with a warning when it is not above).
"""

from __future__ import annotations

import logging
from pathlib import Path

from pipeline.cache import cached_stage, dir_digest
from pipeline.config.schema import TrainConfig
from pipeline.data.encoding import encode
from pipeline.data.loaders import DataRef, TaskData
from pipeline.train.fine_tune import fine_tuned

log = logging.getLogger(__name__)

SCORES_VERSION = "1"


def kd_recipe(cfg: TrainConfig) -> TrainConfig:
    """The teacher's recipe for the KD model: bf16 where it is fast, batches grouped by length."""
    from pipeline.devices import fast_precision

    fast_bf16 = fast_precision(cfg.device) == "bf16"
    return cfg.model_copy(update={"group_by_length": True, **({"precision": "bf16"} if fast_bf16 else {})})


def scores(folder: str, data: TaskData, max_length: int, cache_dir: str) -> dict:
    """The task metrics of the classifier in `folder` on validation and dev (its PyTorch forward), cached by
    model, data and length."""
    from pipeline.models.folders import load_tokenizer
    from pipeline.models.io import load_model
    from pipeline.train.metrics import predict_logits
    from pipeline.train.metrics import scores as metrics

    def build(out: Path) -> dict:
        model, tokenizer = load_model(folder), load_tokenizer(folder)
        splits = {"validation": data.validation, "dev": data.dev}
        encoded = {name: encode(tokenizer, split, max_length) for name, split in splits.items()}
        return {name: metrics(predict_logits(model, enc), enc) for name, enc in encoded.items()}

    key = dict(stage="scores", v=SCORES_VERSION, model=dir_digest(Path(folder)), data=data.fingerprint,
               max_length=max_length)  # fmt: skip
    return cached_stage(cache_dir, "scores", key, build)[2]


def run(
    kd_model: str | None, kd_given: str | None, teacher: dict, ref: DataRef, cfg: TrainConfig, cache_dir: str
) -> dict:
    """The KD teacher's record: its folder, whether output KD uses it, and both teachers' validation and dev
    scores. `kd_model` is fine-tuned with the teacher's recipe `cfg` (cached as the teacher is); `kd_given` is
    taken as it is."""
    data = ref.load()
    if kd_model is not None:
        path, hit, made = fine_tuned(kd_model, data, kd_recipe(cfg), cache_dir)
        log.info("KD teacher: %s (%s)", path, "cached" if hit else "fine-tuned now")
        record = {"path": str(path), "source": f"fine-tuned from {kd_model}", "cached": hit,
                  **{k: made[k] for k in ("steps", "seconds") if k in made}}  # fmt: skip
    else:
        record = {"path": kd_given, "source": "given (--kd-teacher)", "cached": False}
    metric = data.task.metric
    own, theirs = (
        scores(teacher["path"], data, cfg.max_length, cache_dir),
        scores(record["path"], data, cfg.max_length, cache_dir),
    )
    above = theirs["validation"][metric] > own["validation"][metric]
    record |= {
        "used": above or kd_model is None,
        "metric": metric,
        "validation": {"kd_teacher": theirs["validation"][metric], "teacher": own["validation"][metric]},
        "dev": {"kd_teacher": theirs["dev"][metric], "teacher": own["dev"][metric]},
    }
    said = (f"KD teacher {record['path']}: validation {metric} {record['validation']['kd_teacher']:.2f} against the "
            f"teacher's {record['validation']['teacher']:.2f}")  # fmt: skip
    if above:
        log.info("%s: output KD distils its logits", said)
    elif record["used"]:
        log.warning("%s, not above it; given by --kd-teacher, so output KD distils its logits anyway", said)
    else:
        log.warning("%s, not above it: output KD distils the teacher's own logits", said)
    return record

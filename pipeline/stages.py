"""The torch-side stages as plain functions over paths: teacher, compress, compact.

Each takes and returns paths and small JSON-able reports, so a Prefect task can wrap it directly; expensive
outputs go to the content-addressed cache (`pipeline.cache`) so a rerun with the same inputs reuses them.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from pathlib import Path

from pipeline.cache import cached_build, dir_digest, key_of
from pipeline.compress.compaction import compact_
from pipeline.compress.context import StageContext
from pipeline.compress.registry import get_method, method_config
from pipeline.config.schema import DeployConfig, TrainConfig
from pipeline.data.encoding import encode, encode_task
from pipeline.data.loaders import DataRef, Split
from pipeline.errors import GateError, PipelineError
from pipeline.models.folders import check_model_dir, load_tokenizer
from pipeline.models.io import load_base_model, load_model, save_model
from pipeline.train.loop import train
from pipeline.train.metrics import predict_logits

log = logging.getLogger(__name__)

STAGE_FILE = "stage.json"
# Bump a stage's version when a change alters what it produces, to invalidate its cache entries.
TEACHER_VERSION = "1"
COMPRESS_VERSION = "3"  # 3: MLP Fusion's layer-wise tuning runs all `tune_steps` (it was capped at one epoch)


def describe_data(ref: DataRef) -> dict:
    """Load once to validate and fingerprint the data; say which source was used."""
    data = ref.load()
    log.info("data: %s (%d train, %d dev)", data.source, len(data.train), len(data.dev))
    return {"source": data.source, "train": len(data.train), "dev": len(data.dev), "fingerprint": data.fingerprint}


def prepare_teacher(model_dir: str, teacher_dir: str | None, ref: DataRef, cfg: TrainConfig, cache_dir: str) -> dict:
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
    key = key_of(
        stage="teacher",
        v=TEACHER_VERSION,
        model=dir_digest(Path(model_dir)),
        data=data.fingerprint,
        cfg=cfg.model_dump(),
    )

    def build(out: Path) -> None:
        tokenizer = load_tokenizer(model_dir)
        model = load_base_model(model_dir, data.task)
        train_enc, dev_enc = encode_task(tokenizer, data, cfg.max_length)
        result = train(model, train_enc, dev_enc, cfg, desc="teacher fine-tuning")
        save_model(model, tokenizer, out)
        _write_stage(out, {**result.report(), "base_model": str(model_dir)})

    path, hit = cached_build(Path(cache_dir), "teachers", key, build)
    info = _read_stage(path)
    log.info("teacher: %s (%s), dev %s", path, "cached" if hit else "fine-tuned now", info.get("dev"))
    return {"path": str(path), "source": f"fine-tuned from {model_dir}", "cached": hit, **info}


def compress(
    config: DeployConfig, teacher_dir: str, ref: DataRef, cache_dir: str, base_model: str | None = None
) -> dict:
    """Run the configured method on a copy of the teacher; the result (not yet compacted) is cached.

    `base_model` is the pre-trained folder, for methods that can start from it (SMP's verbalizer head).
    """
    method = get_method(config.method)
    method_cfg = method_config(config)
    data = ref.load()
    key = key_of(
        stage="compress",
        v=COMPRESS_VERSION,
        teacher=dir_digest(Path(teacher_dir)),
        data=data.fingerprint,
        method=config.method,
        cfg=method_cfg.model_dump(),
        base=dir_digest(Path(base_model)) if base_model and Path(base_model).is_dir() else None,
    )

    def build(out: Path) -> None:
        tokenizer = load_tokenizer(teacher_dir)
        teacher = load_model(teacher_dir)
        for p in teacher.parameters():
            p.requires_grad_(False)
        train_enc, dev_enc = encode_task(tokenizer, data, method_cfg.train.max_length)
        ctx = StageContext(teacher, train_enc, dev_enc, task=data.task.name, base_model=base_model)
        start = time.perf_counter()
        student = copy.deepcopy(teacher).requires_grad_(True)  # the copy must not inherit the teacher's freeze
        model = method.apply()(student, method_cfg, ctx)
        ctx.report["seconds"] = round(time.perf_counter() - start, 1)
        save_model(model, tokenizer, out)
        _write_stage(out, ctx.report)

    path, hit = cached_build(Path(cache_dir), "compressed", key, build)
    log.info("compress (%s): %s (%s)", config.method, path, "cached" if hit else "computed now")
    return {"path": str(path), "cached": hit, "method": config.method, **_read_stage(path)}


def compact(
    compressed_dir: str, ref: DataRef, out_dir: str, atol: float, max_length: int, max_examples: int = 256
) -> dict:
    """Compact the compressed model into `out_dir` and prove it exact on dev inputs (GateError otherwise)."""
    tokenizer = load_tokenizer(compressed_dir)
    model = load_model(compressed_dir)
    split = ref.load().dev
    dev = encode(tokenizer, Split(split.texts[:max_examples], split.labels[:max_examples]), max_length)
    before = predict_logits(model, dev)
    report = compact_(model)
    after = predict_logits(model, dev)
    diff = float(abs(before - after).max())
    report.update(max_abs_diff=diff, atol=atol, examples=len(dev), max_length=max_length)
    if not diff <= atol:
        raise GateError(f"compaction changed logits by {diff:.2e} (> {atol:.0e})")
    save_model(model, tokenizer, out_dir)
    reloaded = predict_logits(load_model(out_dir), dev)
    if float(abs(reloaded - after).max()) != 0.0:
        raise GateError(f"compacted model does not reload exactly from {out_dir}")
    report["params"] = sum(p.numel() for p in model.parameters())
    return report


def _write_stage(folder: Path, report: dict) -> None:
    (Path(folder) / STAGE_FILE).write_text(json.dumps(report, indent=2, default=str))


def _read_stage(folder: Path) -> dict:
    f = Path(folder) / STAGE_FILE
    return json.loads(f.read_text()) if f.is_file() else {}

"""The torch-side stages as plain functions over paths: teacher, compress, compact.

Each takes and returns paths and small JSON-able reports, so a Prefect task can wrap it directly; expensive
outputs go to the content-addressed cache (`pipeline.cache`) so a rerun with the same inputs reuses them.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import socket
import time
from pathlib import Path

from pipeline.cache import cached_build, dir_digest, key_of
from pipeline.compress.compaction import compact_
from pipeline.compress.context import StageContext
from pipeline.compress.registry import Method, chain_configs
from pipeline.config.schema import DeployConfig, MethodConfig, TrainConfig
from pipeline.data.encoding import encode, encode_task
from pipeline.data.loaders import DataRef, TaskData
from pipeline.errors import GateError, PipelineError
from pipeline.models.folders import check_model_dir, load_tokenizer
from pipeline.models.io import load_base_model, load_model, save_model
from pipeline.train.loop import train
from pipeline.train.metrics import predict_logits

log = logging.getLogger(__name__)

STAGE_FILE = "stage.json"
# Bump a stage's version when a change alters what it produces, to invalidate its cache entries.
TEACHER_VERSION = "1"
COMPRESS_VERSION = "4"  # 4: training evaluates on the validation split carved from train (the data changed too)


def describe_data(ref: DataRef) -> dict:
    """Load once to validate and fingerprint the data; say which source was used."""
    data = ref.load()
    log.info(
        "data: %s (%d train, %d validation carved from train, %d dev)",
        data.source,
        len(data.train),
        len(data.validation),
        len(data.dev),
    )
    return data.describe()


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
        train_enc, val_enc = encode_task(tokenizer, data, cfg.max_length)
        result = train(model, train_enc, val_enc, cfg, desc="teacher fine-tuning")
        save_model(model, tokenizer, out)
        _write_stage(out, {**result.report(), "base_model": str(model_dir)})

    path, hit = cached_build(Path(cache_dir), "teachers", key, build)
    info = _read_stage(path)
    log.info("teacher: %s (%s), validation %s", path, "cached" if hit else "fine-tuned now", info.get("validation"))
    return {"path": str(path), "source": f"fine-tuned from {model_dir}", "cached": hit, **info}


def compress(
    config: DeployConfig, teacher_dir: str, ref: DataRef, cache_dir: str, base_model: str | None = None
) -> dict:
    """Run the configured method, or each method of a chain, starting from a copy of the teacher.

    Between two methods of a chain the model is compacted (exactly, or the run stops), so the next method starts
    from the real smaller shapes. Every method's output and every intermediate compaction is cached on its own:
    a chain that shares its first stages with an earlier run reuses them. The last output is not compacted here
    (the `compact` stage does it into the artifact). `base_model` is the pre-trained folder, for a first method
    that can start from it (SMP's verbalizer head). `none` returns the teacher itself.
    """
    chain = chain_configs(config)
    if all(m.apply_path is None for m, _ in chain):
        return {"path": teacher_dir, "cached": False, "method": config.method, "stages": []}
    data = ref.load()
    start, stages = teacher_dir, []
    for i, (method, method_cfg) in enumerate(chain):
        if i > 0:
            start, hit = _compacted(stages[-1]["path"], ref, cache_dir, config.gates.compaction_atol, method_cfg)
            stages[-1]["compacted"] = {"path": start, "cached": hit}
        out = _compress_one(method, method_cfg, teacher_dir, start, data, cache_dir, base_model if i == 0 else None)
        stages.append(out)
    last = stages[-1]
    return {
        **last,
        "cached": all(s["cached"] for s in stages),
        "method": config.method,
        "stages": stages,
        "ran_on": f"{socket.gethostname()} pid {os.getpid()}",  # a sweep's runs train on Dask workers
    }


def _compress_one(
    method: Method,
    method_cfg: MethodConfig,
    teacher_dir: str,
    start_dir: str,
    data: TaskData,
    cache_dir: str,
    base_model: str | None,
) -> dict:
    """One method on a copy of the model in `start_dir` (the teacher, or the previous method's compacted
    output), with the dense teacher for distillation; cached."""
    key = key_of(
        stage="compress",
        v=COMPRESS_VERSION,
        teacher=dir_digest(Path(teacher_dir)),
        start=dir_digest(Path(start_dir)) if start_dir != teacher_dir else None,
        data=data.fingerprint,
        method=method.name,
        cfg=method_cfg.model_dump(),
        base=dir_digest(Path(base_model)) if base_model and Path(base_model).is_dir() else None,
    )

    def build(out: Path) -> None:
        tokenizer = load_tokenizer(teacher_dir)
        teacher = load_model(teacher_dir)
        for p in teacher.parameters():
            p.requires_grad_(False)
        train_enc, val_enc = encode_task(tokenizer, data, method_cfg.train.max_length)
        ctx = StageContext(teacher, train_enc, val_enc, task=data.task, base_model=base_model)
        began = time.perf_counter()
        # a fresh copy: it must not share the teacher's tensors or inherit its freeze
        student = (copy.deepcopy(teacher) if start_dir == teacher_dir else load_model(start_dir)).requires_grad_(True)
        model = method.apply()(student, method_cfg, ctx)
        ctx.report["seconds"] = round(time.perf_counter() - began, 1)
        save_model(model, tokenizer, out)
        _write_stage(out, ctx.report)

    path, hit = cached_build(Path(cache_dir), "compressed", key, build)
    log.info("compress (%s): %s (%s)", method.name, path, "cached" if hit else "computed now")
    return {"path": str(path), "cached": hit, "method": method.name, **_read_stage(path)}


def _compacted(
    compressed_dir: str, ref: DataRef, cache_dir: str, atol: float, next_cfg: MethodConfig
) -> tuple[str, bool]:
    """The compacted copy of a chain's intermediate output (the next method's starting point), cached."""
    max_length = next_cfg.train.max_length
    key = key_of(stage="compacted", src=dir_digest(Path(compressed_dir)), atol=atol, max_length=max_length)

    def build(out: Path) -> None:
        _write_stage(out, compact(compressed_dir, ref, str(out), atol, max_length))

    path, hit = cached_build(Path(cache_dir), "compacted", key, build)
    return str(path), hit


def compact(
    compressed_dir: str, ref: DataRef, out_dir: str, atol: float, max_length: int, max_examples: int = 256
) -> dict:
    """Compact the compressed model into `out_dir` and prove it exact on validation inputs (GateError otherwise)."""
    tokenizer = load_tokenizer(compressed_dir)
    model = load_model(compressed_dir)
    split = ref.load().validation
    inputs = encode(tokenizer, split.head(max_examples), max_length)
    before = predict_logits(model, inputs)
    report = compact_(model)
    after = predict_logits(model, inputs)
    diff = float(abs(before - after).max())
    report.update(max_abs_diff=diff, atol=atol, examples=len(inputs), max_length=max_length)
    if not diff <= atol:
        raise GateError(f"compaction changed logits by {diff:.2e} (> {atol:.0e})")
    save_model(model, tokenizer, out_dir)
    reloaded = predict_logits(load_model(out_dir), inputs)
    if float(abs(reloaded - after).max()) != 0.0:
        raise GateError(f"compacted model does not reload exactly from {out_dir}")
    report["params"] = sum(p.numel() for p in model.parameters())
    return report


def _write_stage(folder: Path, report: dict) -> None:
    (Path(folder) / STAGE_FILE).write_text(json.dumps(report, indent=2, default=str))


def _read_stage(folder: Path) -> dict:
    f = Path(folder) / STAGE_FILE
    return json.loads(f.read_text()) if f.is_file() else {}

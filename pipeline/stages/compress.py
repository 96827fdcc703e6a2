"""The compress stage: the configured method, or each method of a chain, on a copy of the dense teacher."""

from __future__ import annotations

import copy
import logging
import os
import socket
import time
from pathlib import Path

import torch

from pipeline.cache import cached_stage, dir_digest
from pipeline.compress.context import StageContext
from pipeline.compress.deploy_config import DeployConfig
from pipeline.compress.exact_compaction import compact_folder
from pipeline.compress.registry import Method
from pipeline.config.schema import MethodConfig
from pipeline.data.encoding import encode_task
from pipeline.data.loaders import DataRef, TaskData
from pipeline.models.folders import load_tokenizer
from pipeline.models.io import load_model, save_model
from pipeline.train.augment import with_augmented
from pipeline.train.kd_teacher import load_kd_teacher
from pipeline.train.teacher_outputs import TeacherOutputs

log = logging.getLogger(__name__)

# Bump when a change alters what the stage produces, to invalidate its cache entries.
OUTPUTS_DIR = "teacher_outputs"  # per teacher, its outputs on the inputs distilled so far (offline output KD)
# 6: what a method draws before training (a narrower student's projections, a base model's new head) comes from
# its recipe's seed alone; 5: MLP Fusion's scale is saved on the FFN output layer (`output.dense.scale`), every family
COMPRESS_VERSION = "6"


def run(
    config: DeployConfig,
    teacher_dir: str,
    ref: DataRef,
    cache_dir: str,
    base_model: str | None = None,
    kd_teacher: str | None = None,
) -> dict:
    """Run the configured method, or each method of a chain, starting from a copy of the teacher.

    Between two methods of a chain the model is compacted (exactly, or the run stops), so the next method starts
    from the real smaller shapes. Every method's output and every intermediate compaction is cached on its own:
    a chain that shares its first stages with an earlier run reuses them. The last output is not compacted here
    (the `compact` stage does it into the artifact). `base_model` is the pre-trained folder, for a first method
    that can start from it (SMP's verbalizer head). `none` returns the teacher itself.
    """
    chain = config.chain_configs
    if all(m.apply_path is None for m, _ in chain):
        return {"path": teacher_dir, "cached": False, "method": config.method, "stages": []}
    data = ref.load()
    kd = (kd_teacher, dir_digest(Path(kd_teacher))) if kd_teacher else None  # hashed once, not once per stage
    start, stages = teacher_dir, []
    for i, (method, method_cfg) in enumerate(chain):
        if i > 0:
            start, hit = _compacted(stages[-1]["path"], ref, cache_dir, config.gates.compaction_atol, method_cfg)
            stages[-1]["compacted"] = {"path": start, "cached": hit}
        base = base_model if i == 0 else None
        out = _compress_one(method, method_cfg, teacher_dir, start, data, cache_dir, base, kd)
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
    kd: tuple[str, str] | None = None,
) -> dict:
    """One method on a copy of the model in `start_dir` (the teacher, or the previous method's compacted
    output), with the dense teacher for distillation (and the logits of `kd`, a (folder, digest), for output KD);
    cached."""
    teacher_digest = dir_digest(Path(teacher_dir))
    kd_teacher, kd_digest = kd or (None, None)
    # rows are keyed by the teacher's token ids, so another model's rows are stored per (model, teacher)
    rows_file = f"{teacher_digest}.npz" if kd_digest is None else f"{kd_digest}-for-{teacher_digest[:20]}.npz"
    key = dict(
        stage="compress",
        v=COMPRESS_VERSION,
        teacher=teacher_digest,
        start=dir_digest(Path(start_dir)) if start_dir != teacher_dir else None,
        data=data.fingerprint,
        method=method.name,
        cfg=method_cfg.model_dump(),
        base=dir_digest(Path(base_model)) if base_model and Path(base_model).is_dir() else None,
        **({"kd_teacher": kd_digest} if kd_digest else {}),  # absent without one: the keys cached before stay
        # distill ignored train.layer_kd before this key: an entry (or a stopped run's checkpoint) made with it set
        # trained without it, so those configs alone get new keys
        **({"layer_kd": "trained"} if method.name == "distill" and method_cfg.train.layer_kd else {}),
    )

    def build(out: Path) -> dict:
        tokenizer = load_tokenizer(teacher_dir)
        teacher = load_model(teacher_dir)
        for p in teacher.parameters():
            p.requires_grad_(False)
        train_enc, val_enc = encode_task(tokenizer, data, method_cfg.train.max_length)
        augmented = None
        if method_cfg.train.augment is not None:  # unlabelled copies for output KD, before the method sees the split
            train_enc, augmented = with_augmented(
                train_enc, data.train, tokenizer, teacher, method_cfg.train.augment, method_cfg.train.max_length
            )
            log.info("augmented training split: %s", augmented)
        source = load_kd_teacher(kd_teacher, tokenizer) if kd_teacher else None
        outputs = TeacherOutputs(teacher, Path(cache_dir) / OUTPUTS_DIR / rows_file, source)
        ctx = StageContext(teacher, train_enc, val_enc, task=data.task, base_model=base_model, teacher_outputs=outputs)
        began = time.perf_counter()
        # a fresh copy: it must not share the teacher's tensors or inherit its freeze
        student = (copy.deepcopy(teacher) if start_dir == teacher_dir else load_model(start_dir)).requires_grad_(True)
        # what the method draws before its training loop seeds itself (a narrower student's projections) comes from
        # the recipe's seed, not from how many numbers loading took first (transformers releases differ in that)
        torch.manual_seed(method_cfg.train.seed)
        model = method.apply(student, method_cfg, ctx)
        outputs.save()  # for the next stage and the next run that distils from this teacher
        ctx.report["teacher_outputs"] = {"read_back": outputs.hits, "computed": outputs.misses}
        if kd_teacher:
            ctx.report["kd_teacher"] = {"path": kd_teacher, "digest": kd_digest}
        if augmented is not None:
            ctx.report["augmented"] = augmented
        ctx.report["seconds"] = round(time.perf_counter() - began, 1)
        save_model(model, tokenizer, out)
        return ctx.report

    path, hit, report = cached_stage(cache_dir, "compressed", key, build, trains=True)
    log.info("compress (%s): %s (%s)", method.name, path, "cached" if hit else "computed now")
    return {"path": str(path), "cached": hit, "method": method.name, **report}


def _compacted(
    compressed_dir: str, ref: DataRef, cache_dir: str, atol: float, next_cfg: MethodConfig
) -> tuple[str, bool]:
    """The compacted copy of a chain's intermediate output (the next method's starting point), cached."""
    max_length = next_cfg.train.max_length
    key = dict(stage="compacted", src=dir_digest(Path(compressed_dir)), atol=atol, max_length=max_length)
    path, hit, _ = cached_stage(
        cache_dir, "compacted", key, lambda out: compact_folder(compressed_dir, ref, str(out), atol, max_length)
    )
    return str(path), hit

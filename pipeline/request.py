"""A deploy request, checked up front: every bad input fails here, in one line, before any stage runs.

This is the layer between the CLI (or a flow's caller) and the stages: it resolves the recipe into a validated
`DeployConfig`, checks the model, teacher, data and output folders, and returns one frozen `DeployRequest`.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from pipeline import distributed
from pipeline.cache import default_cache_dir
from pipeline.compress.deploy_config import DeployConfig
from pipeline.compress.methods.distill.config import GeneralConfig
from pipeline.compress.registry import parse_chain
from pipeline.compress.shapes import check_depth_options, check_hidden_options, check_target_chain
from pipeline.config.recipes import (
    apply_override,
    load_recipe,
    read_recipe,
    resolve_recipe,
    shortcut_overrides,
)
from pipeline.config.schema import CustomTask, parse
from pipeline.data.corpus import read_corpus
from pipeline.data.loaders import DataRef, resolve_source
from pipeline.data.tasks import SEQUENCE, TaskSpec, get_task, load_task_file, task_spec
from pipeline.errors import PipelineError
from pipeline.kinds import kind_of
from pipeline.models.families import family_for
from pipeline.models.folders import check_model_dir, default_model_path, head_kind
from pipeline.paths import check_new_folder, check_writable_dir
from serving.artifact import ArtifactError, check_signing_key

log = logging.getLogger(__name__)


def check_devices(devices: dict[str, str]) -> None:
    """Every requested device exists on this machine: `cuda` without CUDA fails here, not minutes into a run."""
    wanted = {key: dev for key, dev in devices.items() if dev.startswith("cuda")}
    if not wanted:
        return
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for key, dev in wanted.items():
        index = int(dev.partition(":")[2] or 0)
        if index >= count:
            have = f"{count} CUDA device(s)" if count else "no CUDA device (torch " + torch.__version__ + ")"
            raise PipelineError(f"{key}={dev}, but this machine has {have}; use auto or cpu")


def check_nproc(nproc: int, devices: dict[str, str]) -> None:
    """`--nproc` processes fit this machine: on GPUs, one GPU each (NCCL cannot share one between ranks)."""
    if nproc < 1:
        raise PipelineError(f"--nproc {nproc}: expected 1 or more processes")
    if distributed.launched_rank():  # every rank would run a whole deploy of its own
        raise PipelineError("this command starts torchrun itself for its training: give --nproc N (or set "
                            "PIPELINE_LAUNCHER) instead of starting it under torchrun")  # fmt: skip
    if nproc == 1 or all(dev == "cpu" for dev in devices.values()):
        return
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus and nproc > gpus:
        raise PipelineError(f"--nproc {nproc}: this machine has {gpus} GPU(s), one per process; use --nproc {gpus}")


def build_deploy_config(
    method: str,
    task: str,
    recipe: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    custom_task: CustomTask | None = None,
    steps: int | None = None,
) -> DeployConfig:
    """Resolve recipe (given, else the packaged default for method/task) + overrides into a validated config;
    `custom_task` is a user's task (its name is `task`), else `task` is a built-in one. A speed target with no recipe
    named runs with the one its task kind measured best at that speed (`Kind.target_recipes`), where the chain
    ships it; the config records which (`chosen_recipe`). `steps` (`--steps`) is every training phase's budget
    (`lay_step_budget`)."""
    chain = parse_chain(method)
    kind = custom_task.kind if custom_task is not None else get_task(task).kind
    fields = {m.name: m.config_cls.model_fields for m in chain}
    trained = {m.name: {k: fields[m.name][k].default for k in m.config_cls.PHASE_STEPS}
               for m in chain if "train" in fields[m.name]}  # fmt: skip

    def config(recipe: str | Path | None, **extra: str) -> DeployConfig:
        data = load_recipe(method, task, recipe, overrides, task_recipes=custom_task is None, kind=kind,
                           trained=trained, steps=steps)  # fmt: skip
        if custom_task is not None:
            data["custom_task"] = custom_task.model_dump()
        return parse(DeployConfig, {**data, **extra}, "recipe")  # each method's section parsed once, here

    cfg = config(recipe)
    if cfg.target.speedup is None:
        return cfg
    check_target_chain(cfg)
    chosen = kind_of(kind).target_recipe(cfg.target.speedup) if recipe is None else None
    if chosen is None or not resolve_recipe(method, chosen).is_file():
        return cfg
    log.info("--target-speedup %g for %s: recipe %s, the one measured best from there (--recipe names another)",
             cfg.target.speedup, kind, chosen)  # fmt: skip
    return config(chosen, chosen_recipe=chosen)


def check_lengths(config: DeployConfig, chain: list, model_cfg: dict) -> None:
    """Every token length the run will use (training, benchmark, plan) within the model's position embeddings:
    a longer one would fail with a traceback after training, or index out of range natively."""
    positions = family_for(model_cfg.get("model_type")).usable_positions(model_cfg)
    if positions is None:
        return
    lengths = {"teacher.max_length": config.teacher.max_length, "target.seq": config.target.seq}
    lengths.update({f"bench.seq_lens[{i}]": n for i, n in enumerate(config.bench.seq_lens)})
    for m, method_cfg in chain:
        section = "config" if len(chain) == 1 else f"config.{m.name}"
        lengths[f"{section}.train.max_length"] = method_cfg.train.max_length
    for key, n in lengths.items():
        if n > positions:
            raise PipelineError(f"{key}={n} exceeds the model's {positions} positions")


def checked_signing_key(path: str) -> str:
    """The signing key's absolute path, refused now (one line) if it is not an elliptic-curve private key."""
    try:
        check_signing_key(path)
    except ArtifactError as e:
        raise PipelineError(str(e)) from None
    return str(Path(path).resolve())


def _check_labels(option: str, folder: str, cfg: dict, spec: TaskSpec) -> None:
    """A classifier's labels are the task's: as many, and (when named) in the task's order."""
    names = [str(v) for _, v in sorted((int(k), v) for k, v in (cfg.get("id2label") or {}).items())]
    names = names or [f"LABEL_{i}" for i in range(cfg.get("num_labels", 2))]  # config.json leaves defaults out
    generic = names == [f"LABEL_{i}" for i in range(len(names))]  # unnamed: the order is the user's word
    named_alike = [n.lower() for n in names] == [str(n).lower() for n in spec.labels]
    if len(names) != len(spec.labels) or not (generic or named_alike):
        raise PipelineError(f"{option} {folder} has labels {names}; task {spec.name} has {list(spec.labels)}")


def _check_output_kd(option: str, spec: TaskSpec, chain: list) -> None:
    """A KD teacher's logits need a sentence task and a chain that distils outputs."""
    if spec.kind != SEQUENCE:
        raise PipelineError(f"{option} distils sentence labels; task {spec.name} is {spec.kind}")
    if not any(m_cfg.train.kd_alpha > 0 for _, m_cfg in chain):
        raise PipelineError(f"{option}: no stage of this chain distils outputs (every train.kd_alpha is 0)")


def checked_kd_teacher(folder: str, spec: TaskSpec, chain: list) -> str:
    """`--kd-teacher`'s absolute path, refused now (one line) unless it is a sentence classifier with the task's
    labels in the task's order, and some stage of the chain distils outputs."""
    cfg = check_model_dir(folder)
    _check_output_kd("--kd-teacher", spec, chain)
    if head_kind(cfg) != SEQUENCE:
        raise PipelineError(
            f"--kd-teacher {folder} is not a fine-tuned {SEQUENCE} model (architectures: {cfg.get('architectures')})"
        )
    _check_labels("--kd-teacher", folder, cfg, spec)
    return str(Path(folder).resolve())


def checked_kd_model(folder: str, spec: TaskSpec, chain: list) -> str:
    """`--kd-model`'s absolute path: a base model of a supported family (or a sentence classifier of the task's
    labels, fine-tuned again), for a sentence task whose chain distils outputs; refused now in one line."""
    cfg = check_model_dir(folder)
    _check_output_kd("--kd-model", spec, chain)
    head = head_kind(cfg)
    if head is not None and head != SEQUENCE:
        raise PipelineError(f"--kd-model {folder} is a fine-tuned {head} model; give a base model")
    if head == SEQUENCE:
        _check_labels("--kd-model", folder, cfg, spec)
    return str(Path(folder).resolve())


class DeployRequest(BaseModel):
    """Inputs of one deploy run (the Prefect flow's parameter)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    config: DeployConfig
    model: str
    teacher: str | None = None
    kd_teacher: str | None = None  # a stronger classifier of the task: output KD distils its logits
    kd_model: str | None = None  # a stronger base model: the kd_teacher stage fine-tunes it into one
    data_dir: str | None = None
    corpus: str | None = None  # unlabelled sentences added to a sentence-embedding task's training split
    output_dir: str = "artifacts"
    cache_dir: str
    data_source: str
    sign_key: str | None = None  # an elliptic-curve private key (PEM): the artifact is signed with it
    nproc: int = 1  # processes each training stage runs on (`pipeline.launch`); results do not depend on it

    @property
    def task(self) -> TaskSpec:
        return task_spec(self.config.task, self.config.custom_task)

    @property
    def data(self) -> DataRef:
        limits = self.config.data
        return DataRef(self.task, self.data_source, self.data_dir, limits.max_train, limits.max_dev, limits.validation,
                       self.corpus, limits.corpus_lines)  # fmt: skip


def resolve_task(task: str | None, task_file: str | Path | None) -> tuple[str, CustomTask | None]:
    """(task name, the user's task definition or None) from `--task` or `--task-file`, exactly one of them."""
    if task_file is None:
        if task is None:
            raise PipelineError("name a task: --task NAME (a built-in one) or --task-file FILE (your own)")
        return task, None
    if task is not None:
        raise PipelineError("name one task: --task or --task-file, not both")
    custom = load_task_file(task_file)
    return custom.name, custom


def prepare_request(
    method: str,
    task: str | None,
    *,
    task_file: str | None = None,
    model: str | None = None,
    teacher: str | None = None,
    kd_teacher: str | None = None,
    kd_model: str | None = None,
    data_dir: str | None = None,
    corpus: str | None = None,
    hub: bool = False,
    output_dir: str = "artifacts",
    cache_dir: str | None = None,
    recipe: str | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    sign_key: str | None = None,
    nproc: int = 1,
    steps: int | None = None,
) -> DeployRequest:
    """Validate method, task, recipe, model and teacher folders, data and output path; return the request."""
    task, custom = resolve_task(task, task_file)
    config = build_deploy_config(method, task, recipe, overrides, custom, steps)
    spec = task_spec(config.task, config.custom_task)
    check_writable_dir(output_dir, "output folder")
    cache = check_writable_dir(cache_dir or default_cache_dir(), "cache folder")
    # With only --teacher, the teacher's folder is the model: nothing trains from a base model, and checks must see
    # the teacher's family, not the embedded MiniLM's.
    model_dir = str(Path(model or teacher).resolve()) if model or teacher else str(default_model_path())
    model_cfg = check_model_dir(model_dir) if teacher is None else None
    if model_cfg is not None:
        from pipeline.models.io import check_weights_agree  # torch: only once the arguments are sound

        check_weights_agree(model_dir)
    if teacher is not None:
        cfg = check_model_dir(teacher)
        if head_kind(cfg) != spec.kind:
            raise PipelineError(
                f"teacher {teacher} is not a fine-tuned {spec.kind} model (architectures: {cfg.get('architectures')})"
            )
        teacher = str(Path(teacher).resolve())
        model_cfg = cfg
    devices = {"teacher.device": config.teacher.device}
    chain = config.chain_configs
    for m, method_cfg in chain:
        section = "config" if len(chain) == 1 else f"config.{m.name}"  # the key a user would --set
        if method_cfg.train.augment is not None and spec.kind != SEQUENCE:
            raise PipelineError(
                f"{section}.train.augment replaces words of sentence-classification examples; task {spec.name} is "
                f"{spec.kind}"
            )
        method_cfg.preflight(Path(model_dir), Path(teacher) if teacher else None, model_cfg, spec)
        devices[f"{section}.train.device"] = method_cfg.train.device
    check_devices(devices)
    check_nproc(nproc, devices)
    if kd_teacher is not None and kd_model is not None:
        raise PipelineError("name one KD teacher: --kd-teacher (fine-tuned) or --kd-model (to fine-tune), not both")
    if kd_teacher is not None:
        kd_teacher = checked_kd_teacher(kd_teacher, spec, chain)
    if kd_model is not None:
        kd_model = checked_kd_model(kd_model, spec, chain)
    check_lengths(config, chain, model_cfg)
    check_hidden_options(config, model_cfg)
    check_depth_options(config, model_cfg)
    if sign_key is not None:
        sign_key = checked_signing_key(sign_key)
    request = DeployRequest(
        config=config,
        model=model_dir,
        teacher=teacher,
        kd_teacher=kd_teacher,
        kd_model=kd_model,
        data_dir=str(Path(data_dir).resolve()) if data_dir else None,
        corpus=str(Path(corpus).resolve()) if corpus else None,
        output_dir=str(Path(output_dir).resolve()),
        cache_dir=str(cache.resolve()),
        data_source=resolve_source(spec, data_dir, hub),
        sign_key=sign_key,
        nproc=nproc,
    )
    request.data.load()  # files, columns, labels, emptiness: all checked now
    return request


def prepare_general(
    output: str,
    model: str | None,
    corpus: str,
    layers: int | None = None,
    hidden: int | None = None,
    heads: int | None = None,
    ffn: int | None = None,
    init: str | None = None,
    steps: int | None = None,
    recipe: str | None = None,
    set_: list[str] | None = None,
    cache_dir: str | None = None,
) -> tuple[str, str, GeneralConfig, str, str]:
    """The checked arguments of the general-student flow: (model folder, corpus folder, config, cache, output)."""
    data = read_recipe(resolve_recipe("general", recipe or "default"), "general")
    shortcuts = {"student.layers": layers, "student.hidden": hidden, "student.heads": heads, "student.ffn": ffn,
                 "init": init, "train.max_steps": steps}  # fmt: skip
    for assignment in shortcut_overrides(set_, shortcuts):
        apply_override(data, assignment)
    cfg = parse(GeneralConfig, data, "recipe")
    model_dir = str(model or default_model_path())
    cfg.preflight(check_model_dir(model_dir))
    check_devices({"train.device": cfg.train.device})
    check_writable_dir(check_new_folder(output, "output").parent, "output")
    read_corpus(corpus, 1)  # a missing, empty or non-UTF-8 start fails here; the stage reads it whole
    return model_dir, corpus, cfg, cache_dir or str(default_cache_dir()), output

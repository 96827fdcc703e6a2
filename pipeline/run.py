"""The run engine: one deploy's state between the stages, the steps in order, and the work folder that keeps it.

A `Run` holds the (planned) config and the small reports of finished stages, and calls each stage through its
`stages` table: the plain `run` functions of `pipeline/stages/` (the per-stage commands, which need no Prefect
server), or the Prefect tasks that wrap them (`flows/`, which only sequence these steps). The steps:
`prepare` (data, teacher, plan), `compress`, then `STEPS` (compact, export, validate, bench) into a staging folder
(`pipeline.staging`), then `publish`, which renames it into place once every gate has passed; any failure removes
it. `pipeline compress|compact|export|validate|bench|package` run one step each over a work folder whose
`state.json` keeps the Run, and a step that fails leaves none of its files.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from pipeline import interrupts, launch
from pipeline.compress.deploy_config import DeployConfig
from pipeline.errors import PipelineError
from pipeline.request import DeployRequest, checked_signing_key
from pipeline.stages import bench, compact, compress, data, export, kd_teacher, package, plan, teacher, validate
from pipeline.staging import WORK, artifact_name, discard, new_staging, published_name
from serving.artifact import PYTORCH

STATE_FILE = "state.json"
# each stage's plain function, by the stage's name (the Prefect tasks in `flows/stage_tasks.py` wrap these); the
# training stages run on several processes where the Run asks for them (`pipeline.launch`)
PLAIN: dict[str, Callable] = {
    name: launch.ranked(name) if name in launch.TRAINING else m.run
    for m in (data, teacher, kd_teacher, plan, compress, compact, export, validate, bench, package)
    for name in [m.__name__.rpartition(".")[2]]
}


@dataclass
class Run:
    """One deploy's state between the stages: the (planned) config and the small reports of finished stages.

    `stages` calls each stage by name (plain functions, or a flow's Prefect tasks); `announce` receives the report
    before it is published (a flow's UI artifacts)."""

    config: DeployConfig
    data: dict = field(default_factory=dict)
    teacher: dict = field(default_factory=dict)
    kd_teacher: dict | None = None  # the stronger classifier output KD may distil (--kd-model, --kd-teacher)
    plan: dict | None = None
    compressed: dict | None = None
    reports: dict = field(default_factory=dict)  # compaction, export, validation, speed
    timings: dict = field(default_factory=dict)
    nproc: int = 1  # processes each training stage runs on (torchrun, data-parallel)
    stages: Mapping[str, Callable] = field(default_factory=lambda: PLAIN, repr=False)
    announce: Callable[[dict], None] | None = field(default=None, repr=False)

    def timed(self, name: str, *args: Any) -> Any:
        interrupts.check()  # a stage boundary: a stop signal whose raise was dropped ends the run here
        start = time.perf_counter()
        with launch.processes(self.nproc):
            result = self.stages[name](*args)
        self.timings[name] = round(time.perf_counter() - start, 1)
        interrupts.check()
        return result

    def save(self, request: DeployRequest, folder: Path) -> None:
        state = {
            **{k: v for k, v in asdict(self).items() if k not in ("stages", "announce")},
            "config": self.config.model_dump(mode="json"),
            "request": request.model_dump(mode="json"),
        }
        tmp = folder / f".{STATE_FILE}.tmp"
        tmp.write_text(json.dumps(state, indent=2, default=str))
        tmp.replace(folder / STATE_FILE)

    @classmethod
    def load(cls, folder: Path) -> tuple[DeployRequest, Run]:
        path = Path(folder) / STATE_FILE
        if not path.is_file():
            raise PipelineError(f"{folder} is not a work folder of `pipeline compress` (no {STATE_FILE})")
        state = json.loads(path.read_text())
        request = DeployRequest.model_validate(state.pop("request"))
        return request, cls(**{**state, "config": DeployConfig.model_validate(state["config"])})


def prepare(request: DeployRequest, stages: Mapping[str, Callable] = PLAIN) -> Run:
    """Data, teacher, the KD teacher when one is asked for, and (for a speed target) the plan, whose configuration
    then replaces the requested one."""
    cfg, ref = request.config, request.data
    run = Run(cfg, nproc=request.nproc, stages=stages)
    run.data = run.timed("data", ref)
    run.teacher = run.timed("teacher", request.model, request.teacher, ref, cfg.teacher, request.cache_dir)
    if request.kd_model or request.kd_teacher:
        run.kd_teacher = run.timed("kd_teacher", request.kd_model, request.kd_teacher, run.teacher, ref, cfg.teacher,
                                   request.cache_dir)  # fmt: skip
    if cfg.target.speedup is not None:
        run.plan, run.config = run.timed("plan", cfg, run.teacher["path"], request.cache_dir)
    return run


def kd_folder(run: Run) -> str | None:
    """The KD teacher output KD distils, if any: the one made or given, unless it was not above the teacher."""
    return run.kd_teacher["path"] if run.kd_teacher and run.kd_teacher["used"] else None


def compress_args(request: DeployRequest, run: Run) -> tuple:
    return run.config, run.teacher["path"], request.data, request.cache_dir, request.model, kd_folder(run)


def compress(request: DeployRequest, run: Run) -> None:
    run.compressed = run.timed("compress", *compress_args(request, run))


def _compact(request: DeployRequest, run: Run, folder: Path) -> dict:
    cfg = run.config  # the planned one: planning may drop the training stages, and with them their max_length
    return run.timed("compact", run.compressed["path"], request.data, str(folder / PYTORCH), cfg.gates.compaction_atol,
                     cfg.model_max_length)  # fmt: skip


def _export(request: DeployRequest, run: Run, folder: Path) -> dict:
    cfg = run.config
    return run.timed("export", str(folder), run.teacher["path"], request.cache_dir, request.data, cfg.export,
                     cfg.model_max_length)  # fmt: skip


def _validate(request: DeployRequest, run: Run, folder: Path) -> dict:
    cfg = run.config
    return run.timed("validate", str(folder), run.teacher["path"], request.data, cfg.gates, cfg.model_max_length,
                     cfg.teacher.max_length)  # fmt: skip


def _bench(request: DeployRequest, run: Run, folder: Path) -> dict:
    target = run.config.target  # the report leads with the target's shape (8 x 128; question answering's 8 x 384)
    return run.timed("bench", str(folder), run.teacher["path"], run.config.bench, (target.batch, target.seq),
                     request.data)  # fmt: skip


class Step(NamedTuple):
    command: str  # `pipeline COMMAND WORK` runs it by hand
    report: str  # its report's key in `run.reports` and report.json
    fn: Callable[[DeployRequest, Run, Path], dict]


# after compress, in order; each needs the ones before it
STEPS = (
    Step("compact", "compaction", _compact),
    Step("export", "export", _export),
    Step("validate", "validation", _validate),
    Step("bench", "speed", _bench),
)


def report_of(request: DeployRequest, run: Run) -> dict:
    cfg = run.config
    return {
        "task": cfg.task,
        "method": cfg.method,
        "requested_method": request.config.method,
        "plan": run.plan,
        "data": run.data,
        "teacher": run.teacher,
        **({"kd_teacher": run.kd_teacher} if run.kd_teacher else {}),
        "compress": run.compressed,
        **run.reports,
        "timings": run.timings,
    }


def publish(request: DeployRequest, run: Run, staging: Path) -> str:
    """Write report and manifest and rename the staging folder into place: the last step, nothing after it fails."""
    report = report_of(request, run)
    inputs = {"model": request.model, "teacher": run.teacher["path"], "data": run.data}
    if kd_folder(run):
        inputs["kd_teacher"] = kd_folder(run)
    if request.kd_model:
        inputs["kd_model"] = request.kd_model
    if run.announce is not None:
        run.announce({**report, "artifact": published_name(staging)})
    config = run.config.model_dump(mode="json")
    return str(run.stages["package"](str(staging), report, inputs, config, request.sign_key))


def _staged(request: DeployRequest, run: Run, output_dir: str, fill: Callable[[Path], None]) -> str:
    """`fill` a new staging folder in `output_dir`, then publish it; on any failure it is removed."""
    cfg = run.config
    staging = new_staging(output_dir, artifact_name(cfg.task, cfg.method, cfg.model_dump_json()))
    try:
        fill(staging)
        return publish(request, run, staging)
    except BaseException:
        discard(staging)
        raise


def finish(request: DeployRequest, run: Run) -> str:
    """Every step after compress (compact, export, validate, bench) into a new staging folder, then publish it as
    the artifact (the package stage)."""

    def every_step(staging: Path) -> None:
        for step in STEPS:
            run.reports[step.report] = step.fn(request, run, staging)

    return _staged(request, run, request.output_dir, every_step)


# --- the same steps by hand, over a work folder that keeps the Run in state.json ---------------------------------


def check_new_work(folder: Path) -> None:
    if folder.exists() and any(folder.iterdir()):
        raise PipelineError(f"work folder {folder} exists and is not empty")


def start_work(request: DeployRequest, folder: Path) -> None:
    """`pipeline compress`: data, teacher, plan and compression, then the Run saved into a new work folder."""
    check_new_work(folder)
    run = prepare(request)
    compress(request, run)
    (folder / WORK).mkdir(parents=True, exist_ok=True)  # the dense graphs, as in a staging folder
    run.save(request, folder)


def run_step(folder: Path, command: str) -> dict:
    """`pipeline COMMAND WORK`: one step over a work folder, after its prerequisites; returns its report.

    The step and every later one count as not done from here on; a step that fails leaves none of its files."""
    request, run = Run.load(folder)
    i = [s.command for s in STEPS].index(command)
    missing = next((s.command for s in STEPS[:i] if s.report not in run.reports), None)
    if missing:
        raise PipelineError(f"{folder}: run `pipeline {missing} {folder}` first")
    for later in STEPS[i:]:
        run.reports.pop(later.report, None)
    before = set(folder.rglob("*"))
    try:
        run.reports[STEPS[i].report] = STEPS[i].fn(request, run, folder)
    except BaseException:
        for p in sorted(set(folder.rglob("*")) - before, reverse=True):
            p.unlink() if p.is_file() or p.is_symlink() else p.rmdir()
        raise
    finally:
        run.save(request, folder)
    return run.reports[STEPS[i].report]


def publish_work(folder: Path, output_dir: str | None, sign_key: str | None = None) -> str:
    """`pipeline package`: a work folder whose every step is done, published as an artifact (signed with
    `sign_key`, else with the key `pipeline compress` was given, if any)."""
    request, run = Run.load(folder)
    if sign_key is not None:
        request = request.model_copy(update={"sign_key": checked_signing_key(sign_key)})
    if STEPS[-1].report not in run.reports:
        raise PipelineError(f"{folder}: run `pipeline {STEPS[-1].command} {folder}` first")

    def copy(staging: Path) -> None:
        shutil.copytree(folder, staging, dirs_exist_ok=True, ignore=shutil.ignore_patterns(STATE_FILE, ".*"))

    return _staged(request, run, output_dir or request.output_dir, copy)

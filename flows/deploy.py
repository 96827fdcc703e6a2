"""The deploy flow: data → teacher → (plan) → compress → compact → export → validate → bench → package.

`plan` runs for a speed target only: it measures the latency table and rewrites the method configuration to the
planned shape, which the later stages then see as if the recipe had said it.

It only sequences tasks (`flows.stage_tasks`) through named steps over one `Run` (the planned config and the small
reports of finished stages): `prepare` (data, teacher, plan), `compress`, then `STEPS` (compact, export, validate,
bench) into a folder, then `publish`. The flow runs them all into a hidden staging folder that is renamed into
place when every gate has passed and removed on any failure; the sweep flow reuses the same pieces; `pipeline
compress|compact|export|validate|bench|package` run one step each over a work folder that keeps the Run on disk.
"""

import json
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

from prefect import flow
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from flows import stage_tasks
from pipeline import interrupts
from pipeline.compress.registry import model_max_length
from pipeline.config.schema import DeployConfig
from pipeline.errors import PipelineError
from pipeline.report import latency_rows, render_markdown
from pipeline.request import DeployRequest, checked_signing_key
from pipeline.stages.package import WORK, artifact_name, discard, new_staging, published_name
from serving.artifact import PYTORCH

log = logging.getLogger(__name__)

STATE_FILE = "state.json"


@flow(name="deploy", log_prints=True)
def deploy(request: DeployRequest) -> str:
    """Every stage of `pipeline/stages/` in order; returns the artifact folder."""
    interrupts.rearm()  # Prefect's flow engine has just replaced the SIGTERM handler with its own
    run = prepare(request)
    compress(request, run)
    return finish(request, run)


@dataclass
class Run:
    """One deploy's state between the stages: the (planned) config and the small reports of finished stages.

    `plain` calls the stage functions directly instead of as Prefect tasks (the per-stage commands, which run
    outside any flow and need no Prefect server)."""

    config: DeployConfig
    data: dict = field(default_factory=dict)
    teacher: dict = field(default_factory=dict)
    plan: dict | None = None
    compressed: dict | None = None
    reports: dict = field(default_factory=dict)  # compaction, export, validation, speed
    timings: dict = field(default_factory=dict)
    plain: bool = False

    def call(self, task, *args):
        return task.fn(*args) if self.plain else task(*args)

    def timed(self, name: str, task, *args):
        interrupts.check()  # a stage boundary: a stop signal whose raise was dropped ends the run here
        start = time.perf_counter()
        result = self.call(task, *args)
        self.timings[name] = round(time.perf_counter() - start, 1)
        interrupts.check()
        return result

    def save(self, request: DeployRequest, folder: Path) -> None:
        state = {
            **asdict(self),
            "config": self.config.model_dump(mode="json"),
            "request": request.model_dump(mode="json"),
        }
        state.pop("plain")
        tmp = folder / f".{STATE_FILE}.tmp"
        tmp.write_text(json.dumps(state, indent=2, default=str))
        tmp.replace(folder / STATE_FILE)

    @classmethod
    def load(cls, folder: Path) -> "tuple[DeployRequest, Run]":
        path = Path(folder) / STATE_FILE
        if not path.is_file():
            raise PipelineError(f"{folder} is not a work folder of `pipeline compress` (no {STATE_FILE})")
        state = json.loads(path.read_text())
        request = DeployRequest.model_validate(state.pop("request"))
        return request, cls(**{**state, "config": DeployConfig.model_validate(state["config"]), "plain": True})


def prepare(request: DeployRequest, plain: bool = False) -> Run:
    """Data, teacher and (for a speed target) the plan, which rewrites the method config to the planned shape."""
    cfg, ref = request.config, request.data
    run = Run(cfg, plain=plain)
    run.data = run.timed("data", stage_tasks.data, ref)
    run.teacher = run.timed(
        "teacher", stage_tasks.teacher, request.model, request.teacher, ref, cfg.teacher, request.cache_dir
    )
    if cfg.target.speedup is not None:
        run.plan = run.timed("plan", stage_tasks.plan, cfg, run.teacher["path"], request.cache_dir)
        run.config = cfg.model_copy(update={"method": run.plan["method"], "config": run.plan["config"]})
    return run


def compress_args(request: DeployRequest, run: Run) -> tuple:
    return run.config, run.teacher["path"], request.data, request.cache_dir, request.model, request.kd_teacher


def compress(request: DeployRequest, run: Run) -> None:
    run.compressed = run.timed("compress", stage_tasks.compress, *compress_args(request, run))


def _max_length(run: Run) -> int:
    return model_max_length(run.config)  # of the planned configuration: planning may drop the training stages


def _compact(request: DeployRequest, run: Run, folder: Path) -> dict:
    cfg = run.config
    return run.timed(
        "compact",
        stage_tasks.compact,
        run.compressed["path"],
        request.data,
        str(folder / PYTORCH),
        cfg.gates.compaction_atol,
        _max_length(run),
    )


def _export(request: DeployRequest, run: Run, folder: Path) -> dict:
    return run.timed(
        "export",
        stage_tasks.export,
        str(folder),
        run.teacher["path"],
        request.cache_dir,
        request.data,
        run.config.export,
        _max_length(run),
    )


def _validate(request: DeployRequest, run: Run, folder: Path) -> dict:
    cfg = run.config
    return run.timed(
        "validate",
        stage_tasks.validate,
        str(folder),
        run.teacher["path"],
        request.data,
        cfg.gates,
        _max_length(run),
        cfg.teacher.max_length,
    )


def _bench(request: DeployRequest, run: Run, folder: Path) -> dict:
    target = run.config.target  # the report leads with the target's shape (8 x 128; question answering's 8 x 384)
    return run.timed("bench", stage_tasks.bench, str(folder), run.teacher["path"], run.config.bench,
                     (target.batch, target.seq), request.data)  # fmt: skip


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
        "compress": run.compressed,
        **run.reports,
        "timings": run.timings,
    }


def publish(request: DeployRequest, run: Run, staging: Path) -> str:
    """Write report and manifest and rename the staging folder into place: the last step, nothing after it fails."""
    report = report_of(request, run)
    inputs = {"model": request.model, "teacher": run.teacher["path"], "data": run.data}
    if request.kd_teacher:
        inputs["kd_teacher"] = request.kd_teacher
    if not run.plain:
        report_to_prefect({**report, "artifact": published_name(staging)})
    config = run.config.model_dump(mode="json")
    return str(run.call(stage_tasks.package, str(staging), report, inputs, config, request.sign_key))


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
    run = prepare(request, plain=True)
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


def report_to_prefect(report: dict) -> None:
    """The report as Prefect markdown and table artifacts, for the UI; a failure here never fails the run."""
    try:
        create_markdown_artifact(key="deploy-report", markdown=render_markdown(report))
        create_table_artifact(key="deploy-latency", table=latency_rows(report["speed"]))
    except Exception as e:  # the artifact folder, not the UI, is the product
        log.warning("could not create the Prefect report artifacts: %s: %s", type(e).__name__, e)

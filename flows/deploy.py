"""The deploy flow: data → teacher → (plan) → compress → compact → export → validate → benchmark → package.

`plan` runs for a speed target only: it measures the latency table and rewrites the method configuration to the
planned shape, which the later stages then see as if the recipe had said it.

It only sequences tasks (`flows.stage_tasks`), in three steps the sweep flow reuses: `prepare` (data, teacher,
plan), compress, `package` (everything after compress). Every stage after `compress` writes into a hidden staging
folder that is renamed into place when all gates have passed, and removed on any failure.
"""

import logging
import time
from dataclasses import dataclass, field

from prefect import flow
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from export.package import artifact_name, discard, new_staging, published_name
from export.report import latency_rows, render_markdown
from flows import stage_tasks
from pipeline.compress.registry import model_max_length
from pipeline.config.schema import DeployConfig
from pipeline.request import DeployRequest

log = logging.getLogger(__name__)


@flow(name="deploy", log_prints=True)
def deploy(request: DeployRequest) -> str:
    """Compress, compact, export, validate, benchmark and package; returns the artifact folder."""
    run = prepare(request)
    run.compressed = run.timed("compress", stage_tasks.compress, *compress_args(request, run))
    return package(request, run)


@dataclass
class Run:
    """One deploy's state between the stages: the (planned) config and the small reports of finished stages."""

    config: DeployConfig
    data: dict
    teacher: dict
    plan: dict | None
    compressed: dict | None = None
    timings: dict = field(default_factory=dict)

    def timed(self, name: str, fn, *args):
        start = time.perf_counter()
        result = fn(*args)
        self.timings[name] = round(time.perf_counter() - start, 1)
        return result


def prepare(request: DeployRequest) -> Run:
    """Data, teacher and (for a speed target) the plan, which rewrites the method config to the planned shape;
    the later stages then see it as if the recipe had said it."""
    cfg, ref = request.config, request.data
    run = Run(cfg, {}, {}, None)
    run.data = run.timed("data", stage_tasks.describe_data, ref)
    run.teacher = run.timed(
        "teacher", stage_tasks.prepare_teacher, request.model, request.teacher, ref, cfg.teacher, request.cache_dir
    )
    if cfg.target.speedup is not None:
        run.plan = run.timed("plan", stage_tasks.plan_target, cfg, run.teacher["path"], request.cache_dir)
        run.config = cfg.model_copy(update={"method": run.plan["method"], "config": run.plan["config"]})
    return run


def compress_args(request: DeployRequest, run: Run) -> tuple:
    return run.config, run.teacher["path"], request.data, request.cache_dir, request.model


def package(request: DeployRequest, run: Run) -> str:
    """Compact, export, validate and benchmark into a staging folder, then publish it as the artifact."""
    cfg, ref, teacher = run.config, request.data, run.teacher
    max_length = model_max_length(cfg)  # of the planned configuration: planning may drop the training stages
    staging = new_staging(request.output_dir, artifact_name(cfg.task, cfg.method, cfg.model_dump_json()))
    try:
        compaction = run.timed(
            "compact",
            stage_tasks.compact,
            run.compressed["path"],
            ref,
            str(staging / "pytorch"),
            cfg.gates.compaction_atol,
            max_length,
        )
        exported = run.timed(
            "export",
            stage_tasks.export_models,
            str(staging),
            teacher["path"],
            request.cache_dir,
            ref,
            cfg.export,
            max_length,
        )
        validation = run.timed(
            "validate",
            stage_tasks.validate_models,
            str(staging),
            teacher["path"],
            ref,
            cfg.gates,
            max_length,
            cfg.teacher.max_length,
        )
        speed = run.timed("benchmark", stage_tasks.measure_speed, str(staging), teacher["path"], cfg.bench)
        report = {
            "task": cfg.task,
            "method": cfg.method,
            "requested_method": request.config.method,
            "plan": run.plan,
            "data": run.data,
            "teacher": teacher,
            "compress": run.compressed,
            "compaction": compaction,
            "export": exported,
            "validation": validation,
            "speed": speed,
            "timings": run.timings,
        }
        inputs = {"model": request.model, "teacher": teacher["path"], "data": run.data}
        report_to_prefect({**report, "artifact": published_name(staging)})
        # publishing is the last step: nothing after it can fail the run
        final = stage_tasks.publish(str(staging), report, inputs, cfg.model_dump(mode="json"))
    except BaseException:
        discard(staging)
        raise
    return str(final)


def report_to_prefect(report: dict) -> None:
    """The report as Prefect markdown and table artifacts, for the UI; a failure here never fails the run."""
    try:
        create_markdown_artifact(key="deploy-report", markdown=render_markdown(report))
        create_table_artifact(key="deploy-latency", table=latency_rows(report["speed"]))
    except Exception as e:  # the artifact folder, not the UI, is the product
        log.warning("could not create the Prefect report artifacts: %s: %s", type(e).__name__, e)

"""The deploy flow: data → teacher → (plan) → compress → compact → export → validate → benchmark → package.

`plan` runs for a speed target only: it measures the latency table and rewrites the method configuration to the
planned shape, which the later stages then see as if the recipe had said it.

It only sequences tasks (`flows.stage_tasks`). Every stage after `compress` writes into a hidden staging folder
that is renamed into place when all gates have passed, and removed on any failure.
"""

import logging
import time

from prefect import flow
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from export.package import artifact_name, discard, new_staging, published_name
from export.report import latency_rows, render_markdown
from flows import stage_tasks
from pipeline.compress.registry import model_max_length
from pipeline.request import DeployRequest

log = logging.getLogger(__name__)


@flow(name="deploy", log_prints=True)
def deploy(request: DeployRequest) -> str:
    """Compress, compact, export, validate, benchmark and package; returns the artifact folder."""
    cfg, ref, timings = request.config, request.data, {}

    def timed(name, fn, *args):
        start = time.perf_counter()
        result = fn(*args)
        timings[name] = round(time.perf_counter() - start, 1)
        return result

    data = timed("data", stage_tasks.describe_data, ref)
    teacher = timed(
        "teacher", stage_tasks.prepare_teacher, request.model, request.teacher, ref, cfg.teacher, request.cache_dir
    )
    plan = None
    if cfg.target.speedup is not None:
        plan = timed("plan", stage_tasks.plan_target, cfg, teacher["path"], request.cache_dir)
        cfg = cfg.model_copy(update={"method": plan["method"], "config": plan["config"]})
    max_length = model_max_length(cfg)  # of the planned configuration: planning may drop the training stages
    compressed = timed("compress", stage_tasks.compress, cfg, teacher["path"], ref, request.cache_dir, request.model)
    staging = new_staging(request.output_dir, artifact_name(cfg.task, cfg.method, cfg.model_dump_json()))
    try:
        compaction = timed(
            "compact",
            stage_tasks.compact,
            compressed["path"],
            ref,
            str(staging / "pytorch"),
            cfg.gates.compaction_atol,
            max_length,
        )
        exported = timed(
            "export",
            stage_tasks.export_models,
            str(staging),
            teacher["path"],
            request.cache_dir,
            ref,
            cfg.export,
            max_length,
        )
        validation = timed(
            "validate",
            stage_tasks.validate_models,
            str(staging),
            teacher["path"],
            ref,
            cfg.gates,
            max_length,
            cfg.teacher.max_length,
        )
        speed = timed("benchmark", stage_tasks.measure_speed, str(staging), teacher["path"], cfg.bench)
        report = {
            "task": cfg.task,
            "method": cfg.method,
            "requested_method": request.config.method,
            "plan": plan,
            "data": data,
            "teacher": teacher,
            "compress": compressed,
            "compaction": compaction,
            "export": exported,
            "validation": validation,
            "speed": speed,
            "timings": timings,
        }
        inputs = {"model": request.model, "teacher": teacher["path"], "data": data}
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

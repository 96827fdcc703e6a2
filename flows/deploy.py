"""The deploy flow: data → teacher → (plan) → compress → compact → export → validate → bench → package.

It only sequences: the steps, the Run they share, the staging folder and the work folder are the run engine's
(`pipeline.run`); here every stage runs as a Prefect task (`flows.stage_tasks`) and the report becomes Prefect
UI artifacts before it is published. `plan` runs for a speed target only: its planned configuration replaces the
requested one for the later stages. The sweep flow reuses the same steps.
"""

import logging

from prefect import flow
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from flows import stage_tasks
from pipeline import interrupts
from pipeline.report import latency_rows, render_markdown
from pipeline.request import DeployRequest
from pipeline.run import Run, compress, finish, prepare

log = logging.getLogger(__name__)


@flow(name="deploy", log_prints=True)
def deploy(request: DeployRequest) -> str:
    """Every stage of `pipeline/stages/` in order; returns the artifact folder."""
    interrupts.rearm()  # Prefect's flow engine has just replaced the SIGTERM handler with its own
    run = start(request)
    compress(request, run)
    return finish(request, run)


def start(request: DeployRequest) -> Run:
    """The prepared Run (data, teacher, plan) of a flow: its stages are Prefect tasks, its report goes to the UI."""
    run = prepare(request, stage_tasks.TASKS)
    run.announce = report_to_prefect
    return run


def report_to_prefect(report: dict) -> None:
    """The report as Prefect markdown and table artifacts, for the UI; a failure here never fails the run."""
    try:
        create_markdown_artifact(key="deploy-report", markdown=render_markdown(report))
        create_table_artifact(key="deploy-latency", table=latency_rows(report["speed"]))
    except Exception as e:  # the artifact folder, not the UI, is the product
        log.warning("could not create the Prefect report artifacts: %s: %s", type(e).__name__, e)

"""The sweep flow: many deploy runs of one task, training in parallel on the flow's task runner (Dask), then the
Pareto report and the pick.

1. `prepare` each run in the flow's own process, one after another: the teacher is fine-tuned once (the first
   run builds the cache entry, the rest reuse it) and speed-target plans time their latency tables alone.
2. `compress` every run at once on the task runner (a local Dask cluster, or the scheduler given).
3. `finish` each run in turn in the flow's process once all training is done: compaction, export, validation
   and above all the latency benchmark never share the machine with anything else.
4. The Pareto report over the published artifacts and the dense baselines, and the pick within the budget.
A run that fails (a gate, a bad plan) is reported as failed; the others go on.
"""

import logging
from pathlib import Path

from prefect import flow
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from flows import stage_tasks
from flows.deploy import start
from pipeline import interrupts
from pipeline.errors import PipelineError
from pipeline.pareto import pareto_report, pareto_rows, write_pareto
from pipeline.request import DeployRequest
from pipeline.run import compress_args, finish

log = logging.getLogger(__name__)


@flow(name="sweep", log_prints=True)
def sweep(labels: list[str], requests: list[DeployRequest], output: str, max_metric_drop: float | None) -> dict:
    """Run every request, then write pareto.json, pareto.png and the `selected` link into `output`."""
    interrupts.rearm()  # Prefect's flow engine has just replaced the SIGTERM handler with its own
    failed, prepared = [], []
    for label, request in zip(labels, requests, strict=True):
        try:
            prepared.append((label, request, start(request)))
        except PipelineError as e:
            failed.append({"run": label, "stage": "prepare", "error": str(e)})
    futures = [
        (label, request, run, stage_tasks.compress.submit(*compress_args(request, run)))
        for label, request, run in prepared
    ]
    trained = []
    for label, request, run, future in futures:
        try:
            run.compressed = future.result()
            trained.append((label, request, run))
        except Exception as e:  # one run's failure is reported, not the sweep's
            failed.append({"run": label, "stage": "compress", "error": f"{type(e).__name__}: {e}"})
    artifacts = []
    for label, request, run in trained:
        try:
            artifacts.append((label, Path(finish(request, run))))
        except PipelineError as e:  # GateError included: the staging folder is gone, nothing was published
            failed.append({"run": label, "stage": "package", "error": str(e)})
    for f in failed:
        log.warning("sweep: run %r failed in %s: %s", f["run"], f["stage"], f["error"])
    result = pareto_report(artifacts, failed, max_metric_drop)
    write_pareto(Path(output), result)
    _to_prefect(result)
    return result


def _to_prefect(result: dict) -> None:
    """The Pareto table as Prefect artifacts; a failure here never fails the sweep (the folder is the product)."""
    try:
        create_table_artifact(key="sweep-pareto", table=pareto_rows(result))
        chosen = result["selected"]
        create_markdown_artifact(
            key="sweep-selection",
            markdown=f"selected: `{chosen}`" if chosen else "selected: none (no artifact within the budget)",
        )
    except Exception as e:
        log.warning("could not create the Prefect sweep artifacts: %s: %s", type(e).__name__, e)

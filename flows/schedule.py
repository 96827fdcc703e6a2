"""Scheduled deploys: the deploy flow served on a cron or interval schedule, or registered on a work pool.

Both need a real Prefect server (PREFECT_API_URL): the ephemeral one `pipeline deploy` starts runs no scheduler,
so a schedule on it would never fire. Prefect 3.8.8 also needs SQLAlchemy < 2.1 to create scheduled runs at
all (pinned in pyproject.toml).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal

from pydantic import ValidationError

from pipeline.errors import PipelineError


def make_schedule(cron: str | None, interval: float | None, timezone: str | None = None):
    """A Prefect schedule from exactly one of `cron` and `interval` (seconds); a bad expression fails in one line."""
    from prefect.client.schemas.schedules import CronSchedule, IntervalSchedule

    if (cron is None) == (interval is None):
        raise PipelineError("give exactly one of --cron EXPR and --interval SECONDS")
    try:
        if cron is not None:
            return CronSchedule(cron=cron, timezone=timezone or "UTC")
        return IntervalSchedule(interval=dt.timedelta(seconds=interval), timezone=timezone)
    except ValidationError as e:
        msg = e.errors()[0]["msg"].removeprefix("Value error, ")
        raise PipelineError(f"invalid schedule {cron if cron is not None else interval!r}: {msg}") from None


def check_prefect_api(timeout: float = 10.0) -> str:
    """The Prefect API URL, after a health check; one line when it is unset or does not answer."""
    import httpx

    url = os.environ.get("PREFECT_API_URL")
    if not url:
        from prefect.settings import PREFECT_API_URL

        url = PREFECT_API_URL.value()
    if not url:
        raise PipelineError(
            "scheduling needs a Prefect server: start one (prefect server start) and set PREFECT_API_URL, "
            "e.g. http://127.0.0.1:4200/api"
        )
    try:
        httpx.get(f"{url.rstrip('/')}/health", timeout=timeout).raise_for_status()
    except httpx.HTTPError as e:
        raise PipelineError(f"cannot reach the Prefect API at {url}: {e}") from None
    return url


def serve_until_stopped(flow, name: str, schedule, parameters: dict) -> None:
    """Serve `flow` as deployment `name` on `schedule`, one run at a time, until Ctrl-C; then pause the deployment.

    Ctrl-C raises KeyboardInterrupt wherever the runner is. asyncio's own handler only cancels the main task, once,
    and a cancellation that lands while the runner starts a run was swallowed (the process served on, and runs
    piled up); the pause is then made through the API, not left to the runner's shutdown path.
    """
    from prefect.client.orchestration import get_client

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, interrupt)
    try:
        # one run at a time: overlapping runs would share the cores, and benchmarks must run alone
        flow.serve(name=name, schedule=schedule, parameters=parameters, limit=1)
    finally:
        signal.signal(signal.SIGINT, previous)
        with get_client(sync_client=True) as client:
            client.pause_deployment(client.read_deployment_by_name(f"{flow.name}/{name}").id)


def parse_job_variables(text: str | None, work_pool: str | None) -> dict | None:
    """`--job-variables`: a JSON object, and only beside `--work-pool` (a served deployment has no pool to read
    them); one line otherwise."""
    if text is None:
        return None
    if work_pool is None:
        raise PipelineError("--job-variables needs --work-pool: they are the pool's settings for this deployment")
    try:
        variables = json.loads(text)
    except json.JSONDecodeError as e:
        raise PipelineError(f"--job-variables is not JSON: {e}") from None
    if not isinstance(variables, dict):
        raise PipelineError(f"--job-variables must be a JSON object, not {type(variables).__name__}")
    return variables


def register_on_pool(flow, name: str, schedule, parameters: dict, work_pool: str, job_variables: dict | None = None):
    """Register `flow` as a deployment on `work_pool`, by module path (the package is installed where the worker
    runs, so there is no code to upload), with the pool's `job_variables` for it (a GPU request, an image: the
    pool's base job template says which it takes, docs/work-pools.md)."""
    from prefect import deploy
    from prefect.deployments.runner import EntrypointType
    from prefect.exceptions import ObjectNotFound

    deployment = flow.to_deployment(
        name,
        schedule=schedule,
        parameters=parameters,
        entrypoint_type=EntrypointType.MODULE_PATH,
        job_variables=job_variables,
    )
    try:
        deploy(deployment, work_pool_name=work_pool, build=False, push=False, print_next_steps_message=False)
    except (ObjectNotFound, ValueError) as e:
        raise PipelineError(f"cannot register on work pool {work_pool!r}: {e}") from None

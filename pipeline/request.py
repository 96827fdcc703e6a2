"""A deploy request, checked up front: every bad input fails here, in one line, before any stage runs."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from pipeline.cache import default_cache_dir
from pipeline.config import DeployConfig, build_deploy_config
from pipeline.data import DataRef, resolve_source
from pipeline.errors import PipelineError
from pipeline.modeling import check_model_dir
from pipeline.tasks import get_task


def check_output_dir(output_dir: str | Path) -> Path:
    out = Path(output_dir)
    if out.exists() and not out.is_dir():
        raise PipelineError(f"output path {out} is a file, not a folder")
    return out


class DeployRequest(BaseModel):
    """Inputs of one deploy run (the Prefect flow's parameter)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    config: DeployConfig
    model: str
    teacher: str | None = None
    data_dir: str | None = None
    output_dir: str = "artifacts"
    cache_dir: str
    data_source: str

    @property
    def data(self) -> DataRef:
        limits = self.config.data
        return DataRef(self.config.task, self.data_source, self.data_dir, limits.max_train, limits.max_dev)


def prepare_request(
    method: str,
    task: str,
    *,
    model: str | None = None,
    teacher: str | None = None,
    data_dir: str | None = None,
    output_dir: str = "artifacts",
    cache_dir: str | None = None,
    recipe: str | None = None,
    overrides: list[str] | tuple[str, ...] = (),
) -> DeployRequest:
    """Validate method, task, recipe, model and teacher folders, data and output path; return the request."""
    from pipeline.modeling import default_model_path

    config = build_deploy_config(method, task, recipe, overrides)
    check_output_dir(output_dir)
    model_dir = str(Path(model).resolve()) if model else str(default_model_path())
    model_cfg = check_model_dir(model_dir) if teacher is None else None
    if teacher is not None:
        cfg = check_model_dir(teacher)
        if not any(a.endswith("ForSequenceClassification") for a in cfg.get("architectures") or []):
            raise PipelineError(f"teacher {teacher} is not a fine-tuned sequence classifier (architectures: {cfg.get('architectures')})")
        teacher = str(Path(teacher).resolve())
        model_cfg = cfg
    config.method_config().preflight(Path(model_dir), Path(teacher) if teacher else None, model_cfg, task)
    request = DeployRequest(
        config=config,
        model=model_dir,
        teacher=teacher,
        data_dir=str(Path(data_dir).resolve()) if data_dir else None,
        output_dir=str(Path(output_dir).resolve()),
        cache_dir=str(Path(cache_dir).resolve()) if cache_dir else str(default_cache_dir()),
        data_source=resolve_source(get_task(task), data_dir),
    )
    request.data.load()  # files, columns, labels, emptiness: all checked now
    return request

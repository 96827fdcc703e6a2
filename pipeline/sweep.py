"""A sweep file: many deploy runs of one task, as a list of runs or a grid, checked up front into requests.

```yaml
task: sst2                      # a built-in task, or task_file: mytask.yaml (your own, relative to this file)
data_dir: ../data/sst2          # optional, relative to this file; default: the task's embedded sample
model: null                     # optional base model folder; teacher: an already fine-tuned one
set: {data.max_train: 5000}     # optional, applies to every run (as --set takes it)
runs:                           # a list of runs ...
  - {method: mlp_fusion, set: {config.ratio: 0.25}}
  - {method: smp, recipe: paper}
grid:                           # ... and/or a grid: every method x every combination of the values
  method: [smp, gmp]
  set: {config.sparsity: [0.3, 0.5, 0.7]}
```
Every run becomes a `DeployRequest` through the same checks as `pipeline deploy`, so a bad value anywhere fails
the whole sweep in one line before anything trains.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from pipeline.config.recipes import read_yaml_mapping
from pipeline.config.schema import FrozenModel, parse
from pipeline.errors import PipelineError
from pipeline.request import DeployRequest, prepare_request

# Each run is a whole deploy (minutes to hours): a file that expands past this is a mistake, and expanding it
# first would exhaust memory (10^7 runs did).
MAX_RUNS = 1000


class SweepRun(FrozenModel):
    """One run: a method or chain, an optional recipe, and overrides as `--set` takes them."""

    method: str
    recipe: str | None = None
    set: dict[str, Any] = Field(default_factory=dict)


class SweepGrid(FrozenModel):
    """Every method with every combination of the listed values."""

    method: list[str] = Field(min_length=1)
    recipe: str | None = None
    set: dict[str, list[Any]] = Field(default_factory=dict)


class SweepSpec(FrozenModel):
    task: str | None = None
    task_file: str | None = None
    data_dir: str | None = None
    hub: bool = False
    model: str | None = None
    teacher: str | None = None
    kd_teacher: str | None = None
    kd_model: str | None = None
    set: dict[str, Any] = Field(default_factory=dict)
    runs: list[SweepRun] = Field(default_factory=list)
    grid: SweepGrid | None = None

    @model_validator(mode="after")
    def _some_runs(self) -> SweepSpec:
        if not self.runs and self.grid is None:
            raise ValueError("a sweep needs `runs:` or `grid:`")
        return self

    def size(self) -> int:
        """How many runs the file expands to, counted without expanding it."""
        grid = 0
        if self.grid is not None:
            grid = len(self.grid.method) * math.prod(len(values) for values in self.grid.set.values())
        return len(self.runs) + grid

    def expanded(self) -> list[SweepRun]:
        runs = list(self.runs)
        if self.grid is not None:
            keys = list(self.grid.set)
            for method in self.grid.method:
                for values in itertools.product(*(self.grid.set[k] for k in keys)):
                    runs.append(
                        SweepRun(method=method, recipe=self.grid.recipe, set=dict(zip(keys, values, strict=True)))
                    )
        return runs


def run_label(run: SweepRun) -> str:
    """A short human name: `smp sparsity=0.5` (the last key part of each override)."""
    parts = [run.method, *([f"recipe={run.recipe}"] if run.recipe else [])]
    parts += [
        f"{k.rsplit('.', 1)[-1]}={json.dumps(v) if isinstance(v, (dict, list)) else v}" for k, v in run.set.items()
    ]
    return " ".join(parts)


def overrides(settings: dict[str, Any]) -> list[str]:
    """`{key.path: value}` as `--set` strings (JSON is YAML, so lists and mappings survive)."""
    return [f"{k}={json.dumps(v)}" for k, v in settings.items()]


def load_sweep(
    path: str | Path, output_dir: str, cache_dir: str | None = None, extra: list[str] | tuple[str, ...] = ()
) -> list[tuple[str, DeployRequest]]:
    """Read and check a sweep file; return one (label, request) per run, in order. `extra` are overrides for every
    run (the CLI's --set)."""
    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"sweep file {path} does not exist")
    spec = parse(SweepSpec, read_yaml_mapping(path, "sweep file"), f"sweep file {path}")
    if spec.size() > MAX_RUNS:
        raise PipelineError(
            f"sweep file {path} expands to {spec.size():,} runs; at most {MAX_RUNS:,} (each run is a full deploy): "
            "split it, or list fewer values"
        )
    here = path.resolve().parent

    def rel(p: str | None) -> str | None:
        return str((here / p).resolve()) if p else None

    runs = spec.expanded()
    labels = [run_label(r) for r in runs]
    if len(set(labels)) != len(labels):
        dup = next(lab for lab in labels if labels.count(lab) > 1)
        raise PipelineError(f"sweep file {path}: run {dup!r} is listed twice")
    requests = []
    for label, run in zip(labels, runs, strict=True):
        try:
            requests.append(
                (
                    label,
                    prepare_request(
                        run.method,
                        spec.task,
                        task_file=rel(spec.task_file),
                        model=rel(spec.model),
                        teacher=rel(spec.teacher),
                        kd_teacher=rel(spec.kd_teacher),
                        kd_model=rel(spec.kd_model),
                        data_dir=rel(spec.data_dir),
                        hub=spec.hub,
                        output_dir=output_dir,
                        cache_dir=cache_dir,
                        recipe=rel(run.recipe) if run.recipe and (here / run.recipe).is_file() else run.recipe,
                        overrides=[*overrides(spec.set), *overrides(run.set), *extra],
                    ),
                )
            )
        except PipelineError as e:
            raise PipelineError(f"sweep file {path}, run {label!r}: {e}") from None
    return requests

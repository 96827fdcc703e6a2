"""One registry of compression methods: each name maps to its config class and its `apply` function.

The table at the bottom is the whole list: nothing registers itself as a side effect of an import. A new method
is a folder under `pipeline/compress/methods/` with a `config.py` (a `MethodConfig` subclass whose `name` is the
CLI value) and a `stage.py` (`apply(model, cfg, ctx) -> model`), plus one line here and a recipe in
`pipeline/config/recipes/<name>/default.yaml`. Config classes are pydantic and torch-free, so listing methods
and validating a recipe (the CLI's fast path) never imports torch; `apply` is imported on first use.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipeline.compress.methods.distill.config import DistillConfig
from pipeline.compress.methods.gmp.config import GmpConfig
from pipeline.compress.methods.mlp_fusion.config import MlpFusionConfig
from pipeline.compress.methods.smp.config import SmpConfig
from pipeline.config.schema import DeployConfig, MethodConfig, validate
from pipeline.errors import PipelineError


@dataclass(frozen=True)
class Method:
    """A registered compression method."""

    name: str
    config_cls: type[MethodConfig]
    apply_path: str  # "package.module:function"
    summary: str

    def apply(self) -> Callable[..., Any]:
        module, _, func = self.apply_path.partition(":")
        return getattr(importlib.import_module(module), func)


def method(config_cls: type[MethodConfig], apply_path: str) -> Method:
    """A method named `config_cls.name` (a lowercase identifier), summarised by its docstring's first line."""
    name = config_cls.name
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise ValueError(f"method name {name!r} must be a lowercase identifier")
    summary = (config_cls.__doc__ or "").strip().splitlines()[0] if config_cls.__doc__ else ""
    return Method(name, config_cls, apply_path, summary)


_METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        method(DistillConfig, "pipeline.compress.methods.distill.stage:apply"),
        method(GmpConfig, "pipeline.compress.methods.gmp.stage:apply"),
        method(MlpFusionConfig, "pipeline.compress.methods.mlp_fusion.stage:apply"),
        method(SmpConfig, "pipeline.compress.methods.smp.stage:apply"),
    )
}


def get_method(name: str) -> Method:
    """Return the method called `name`, or fail with the list of known ones."""
    try:
        return _METHODS[name]
    except KeyError:
        raise PipelineError(f"unknown method {name!r}; known methods: {', '.join(sorted(_METHODS))}") from None


def methods() -> list[Method]:
    return [_METHODS[n] for n in sorted(_METHODS)]


def method_config(config: DeployConfig) -> MethodConfig:
    """The deploy configuration's method section, validated by that method's config class."""
    cls = get_method(config.method).config_cls
    return validate(cls, config.config, f"{config.method} config")

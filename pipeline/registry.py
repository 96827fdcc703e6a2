"""One registry of compression methods: a config class plus an `apply` function, keyed by name.

`apply` is registered as a dotted path and imported on first use, so listing methods and validating a
recipe (the CLI's fast path) never imports torch.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipeline.errors import PipelineError


@dataclass(frozen=True)
class Method:
    """A registered compression method."""

    name: str
    config_cls: type
    apply_path: str  # "package.module:function"
    summary: str

    def apply(self) -> Callable[..., Any]:
        module, _, func = self.apply_path.partition(":")
        return getattr(importlib.import_module(module), func)


_METHODS: dict[str, Method] = {}


def register_stage(config_cls: type, apply_path: str) -> None:
    """Register a method under `config_cls.name`; names are unique lowercase identifiers."""
    name = config_cls.name
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise ValueError(f"method name {name!r} must be a lowercase identifier")
    if name in _METHODS:
        raise ValueError(f"method {name!r} is registered twice")
    summary = (config_cls.__doc__ or "").strip().splitlines()[0] if config_cls.__doc__ else ""
    _METHODS[name] = Method(name, config_cls, apply_path, summary)


def get_method(name: str) -> Method:
    """Return the method called `name`, or fail with the list of known ones."""
    try:
        return _METHODS[name]
    except KeyError:
        raise PipelineError(f"unknown method {name!r}; known methods: {', '.join(sorted(_METHODS))}") from None


def methods() -> list[Method]:
    return [_METHODS[n] for n in sorted(_METHODS)]

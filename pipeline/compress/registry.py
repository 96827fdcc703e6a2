"""One registry of compression methods: each name maps to its config class and its `apply` function.

Methods chain: `distill+smp` runs distill, compacts its student, then runs smp on the compacted student (see
`parse_chain` for what may follow what). A chain's recipe holds one config section per method, keyed by name.

The table at the bottom is the whole list: nothing registers itself as a side effect of an import. A new method
is a folder under `pipeline/compress/methods/` with a `config.py` (a `MethodConfig` subclass whose `name` is the
CLI value) and a `stage.py` (`apply(model, cfg, ctx) -> model`), plus one line here and a recipe in
`pipeline/config/recipes/<name>/default.yaml`. Config classes are pydantic and torch-free, so listing methods
and validating a recipe (the CLI's fast path) never imports torch; `apply` is imported on first use.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import Any

from pipeline.compress.methods.distill.config import DistillConfig
from pipeline.compress.methods.gmp.config import GmpConfig
from pipeline.compress.methods.mlp_fusion.config import MlpFusionConfig
from pipeline.compress.methods.none.config import NoneConfig
from pipeline.compress.methods.smp.config import SmpConfig
from pipeline.config.recipes import CHAIN_SEP
from pipeline.config.schema import MethodConfig
from pipeline.errors import PipelineError


@dataclass(frozen=True)
class Method:
    """A registered compression method."""

    name: str
    config_cls: type[MethodConfig]
    apply_path: str | None  # "package.module:function"; None: the model passes through unchanged
    summary: str
    builds_student: bool = False  # a new model from the dense teacher: first in a chain, sets a planned depth
    shapes: bool = False  # prunes whole heads and FFN neurons to a planned per-layer shape (`--target-speedup`)

    def apply(self, model: Any, cfg: MethodConfig, ctx: Any) -> Any:
        """Compress `model` (a trainable copy of the teacher, or the previous method's compacted output) with this
        method and return the result; the method's module (torch) is imported on first use. `none` returns it."""
        if self.apply_path is None:
            return model
        module, _, func = self.apply_path.partition(":")
        return getattr(importlib.import_module(module), func)(model, cfg, ctx)


def method(config_cls: type[MethodConfig], apply_path: str | None, **flags: bool) -> Method:
    """A method named `config_cls.name` (a lowercase identifier), summarised by its docstring's first line."""
    name = config_cls.name
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise ValueError(f"method name {name!r} must be a lowercase identifier")
    summary = (config_cls.__doc__ or "").strip().splitlines()[0] if config_cls.__doc__ else ""
    return Method(name, config_cls, apply_path, summary, **flags)


def registry(*entries: Method) -> dict[str, Method]:
    """The methods by name; a name given twice is an error (a dict would keep the last in silence)."""
    names = [m.name for m in entries]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"method name(s) registered twice: {', '.join(twice)}")
    return {m.name: m for m in entries}


_METHODS: dict[str, Method] = registry(
    method(DistillConfig, "pipeline.compress.methods.distill.stage:apply", builds_student=True),
    method(GmpConfig, "pipeline.compress.methods.gmp.stage:apply", shapes=True),
    method(MlpFusionConfig, "pipeline.compress.methods.mlp_fusion.stage:apply"),
    method(NoneConfig, None),
    method(SmpConfig, "pipeline.compress.methods.smp.stage:apply", shapes=True),
)


def get_method(name: str) -> Method:
    """Return the method called `name`, or fail with the list of known ones."""
    try:
        return _METHODS[name]
    except KeyError:
        raise PipelineError(f"unknown method {name!r}; known methods: {', '.join(sorted(_METHODS))}") from None


def methods() -> list[Method]:
    return [_METHODS[n] for n in sorted(_METHODS)]


def parse_chain(name: str) -> list[Method]:
    """The methods of `name` ("smp", or a chain such as "distill+smp"), checked to be a chain that can run.

    Rules: no empty link, no method twice (a chain's config is keyed by method name), `none` only alone, and a
    method that builds its model from the dense teacher (distill) only first.
    """
    parts = name.split(CHAIN_SEP)
    if any(not p.strip() for p in parts):
        raise PipelineError(f"method chain {name!r} has an empty link; write e.g. distill{CHAIN_SEP}smp")
    chain = [get_method(p.strip()) for p in parts]
    if len(chain) == 1:
        return chain
    names = [m.name for m in chain]
    for i, m in enumerate(chain):
        if names.count(m.name) > 1:
            raise PipelineError(f"method chain {name!r} names {m.name} twice")
        if m.apply_path is None:
            raise PipelineError(f"method chain {name!r}: {m.name} cannot be chained (it compresses nothing)")
        if i > 0 and m.builds_student:
            raise PipelineError(
                f"method chain {name!r}: {m.name} cannot follow {chain[i - 1].name}: it builds its student from "
                "the dense teacher, so it must come first"
            )
    return chain

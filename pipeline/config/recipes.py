"""YAML recipes: a whole deploy configuration for one method, read from a file, with `--set` overrides.

A recipe holds `method`, its `config`, `teacher` (the name of a shared teacher definition in `recipes/teacher/`,
`default` when absent, or an inline mapping), `data` limits, the `bench` grid and `gates`. The teacher's
settings are part of its cache key, so every packaged CPU recipe names the one shared definition: editing it
changes the teacher of every method at once, and methods keep sharing one cached teacher.

Recipe lookup for `--method M --task T`: `recipes/M/T.yaml`, else `recipes/M/default.yaml` (the method's
defaults for any task). A task kind whose defaults do not fit has `recipes/kinds/<kind>.yaml`, settings laid
under every recipe of such a task (question answering's token lengths), before `--set`.
`--recipe NAME` is `recipes/M/NAME.yaml`; any other value is a file path. A recipe may start from another with
`extends: NAME` (a file beside it, else the packaged recipe NAME of the method) and say only what differs. A chain
(`--method distill+smp`) has its own folder when it ships a tuned recipe; otherwise its recipe is composed from
its methods' recipes: each method's `config` under its name, the rest (teacher, data, bench, gates) from the
chain's last method, which produces the artifact.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from pipeline.errors import PipelineError
from pipeline.paths import read_utf8

RECIPES_DIR = Path(__file__).parent / "recipes"
TEACHERS_DIR = RECIPES_DIR / "teacher"
KINDS_DIR = RECIPES_DIR / "kinds"
DEFAULT_TEACHER = "default"


def default_recipe_path(method: str, task: str | None) -> Path | None:
    """recipes/<method>/<task>.yaml where it exists, else recipes/<method>/default.yaml (`task` None: a user's
    task, which always gets the default)."""
    for name in (f"{task}.yaml", "default.yaml") if task else ("default.yaml",):
        path = RECIPES_DIR / method / name
        if path.is_file():
            return path
    return None


def resolve_recipe(method: str, recipe: str | Path) -> Path:
    """A recipe file, or the name of a packaged one (`--recipe unstructured` is recipes/<method>/unstructured.yaml)."""
    path = Path(recipe)
    packaged = RECIPES_DIR / method / f"{recipe}.yaml"
    if not path.is_file() and path.suffix == "" and packaged.is_file():
        return packaged
    return path


def read_yaml_mapping(path: str | Path, what: str = "recipe") -> dict[str, Any]:
    """Read a YAML file whose top level is a mapping (validated later, after overrides)."""
    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"{what} not found: {path}")
    try:
        data = yaml.safe_load(read_utf8(path, what)) or {}
    except yaml.YAMLError as e:
        raise PipelineError(f"{what} {path} is not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise PipelineError(f"{what} {path} must be a mapping at the top level")
    return data


def read_recipe(path: str | Path, method: str, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A recipe file's mapping with its `extends: NAME` laid under it, recursively: NAME is a file beside the recipe
    (`NAME` or `NAME.yaml`), else the method's packaged recipe NAME. The recipe's own values win; mappings merge key
    by key, lists and scalars replace."""
    path = Path(path)
    data = read_yaml_mapping(path)
    base = data.pop("extends", None)
    if base is None:
        return data
    if not isinstance(base, str) or not base.strip():
        raise PipelineError(f"recipe {path}: extends must name a recipe, got {base!r}")
    beside = (path.parent / base, path.parent / f"{base}.yaml")
    target = next((p for p in beside if p.is_file()), None) or resolve_recipe(method, base)
    seen = (*_seen, path.resolve())
    if target.resolve() in seen:
        raise PipelineError(f"recipe {path}: extends {base!r} goes round in a circle")
    _lay_under(data, read_recipe(target, method, seen))
    return data


def teacher_names() -> list[str]:
    return sorted(p.stem for p in TEACHERS_DIR.glob("*.yaml"))


def resolve_teacher(data: dict[str, Any]) -> None:
    """Replace a teacher name (or its absence) by the shared definition it names, in place."""
    teacher = data.get("teacher", DEFAULT_TEACHER)
    if isinstance(teacher, str):
        path = TEACHERS_DIR / f"{teacher}.yaml"
        if not path.is_file():
            raise PipelineError(f"unknown teacher definition {teacher!r}; known: {', '.join(teacher_names())}")
        data["teacher"] = read_yaml_mapping(path, "teacher definition")


def apply_override(data: dict[str, Any], assignment: str) -> None:
    """Apply one `dotted.key=value` override in place; the value is parsed as YAML (numbers, lists, null)."""
    key, sep, raw = assignment.partition("=")
    if not sep or not key:
        raise PipelineError(f"override {assignment!r} must look like key.path=value")
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise PipelineError(f"override {assignment!r}: {part!r} is not a section")
        node = child
    try:
        node[parts[-1]] = yaml.safe_load(raw)
    except yaml.YAMLError:
        raise PipelineError(f"override {assignment!r}: value is not valid YAML") from None


def shortcut_overrides(overrides: list[str] | None, shortcuts: dict[str, Any]) -> list[str]:
    """`overrides` followed by `key=value` for each command-line shortcut that was given (not None)."""
    return [*(overrides or []), *(f"{key}={value}" for key, value in shortcuts.items() if value is not None)]


CHAIN_SEP = "+"


def stage_path(method: str, name: str) -> tuple[str, ...]:
    """Where method `name`'s settings sit under a recipe's `config` for `method`: `config` itself for one method,
    `config.<name>` for a method of a chain (a chain has one config section per method)."""
    return (name,) if CHAIN_SEP in method else ()


def stage_keys(method: str, key: str) -> list[str]:
    """The `--set` key of `key` in each method's settings of `method` (`config.<key>`, or `config.<m>.<key>` per
    method m of a chain)."""
    return [".".join(("config", *stage_path(method, name), key)) for name in method.split(CHAIN_SEP)]


def lay_step_budget(data: dict[str, Any], method: str, steps: int, trained: dict[str, dict[str, int]]) -> None:
    """`--steps N`, in the recipe `data`, in place: every trained method's `train.max_steps` and each of its other
    phases (`trained[name]`: SMP's recovery, distillation's relation transfer, MLP Fusion's tuning, with the value
    each has when the recipe is silent) take N steps, so `--steps 4` is a short run of every phase. A phase the
    recipe leaves out (0 steps: pure SMP, one joint distillation phase) stays out; a `--set` still wins."""
    for name, phases in trained.items():
        section = data.setdefault("config", {})
        for part in stage_path(method, name):
            section = section.setdefault(part, {})
        section.setdefault("train", {})["max_steps"] = steps
        for key, default in phases.items():
            if section.get(key, default):
                section[key] = steps


def lay_kind_settings(data: dict[str, Any], kind: str, method: str, trained: tuple[str, ...]) -> None:
    """Lay `recipes/kinds/<kind>.yaml` under the recipe `data`, in place: the recipe's own values win. Its `train`
    section goes under each trained method's settings (see `stage_path`)."""
    path = KINDS_DIR / f"{kind}.yaml"
    if not path.is_file():
        return
    settings = read_yaml_mapping(path, "kind settings")
    train = settings.pop("train", {})
    _lay_under(data, settings)
    for name in trained:
        section = data.setdefault("config", {})
        for part in stage_path(method, name):
            section = section.setdefault(part, {})
        _lay_under(section, {"train": train})


def _lay_under(data: dict[str, Any], defaults: dict[str, Any]) -> None:
    for key, value in defaults.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            _lay_under(data[key], value)
        else:
            data.setdefault(key, value)


def composed_chain_recipe(method: str, task: str | None) -> dict[str, Any]:
    """A chain's recipe from its methods' own (packaged) recipes, for a chain that ships none."""
    data: dict[str, Any] = {"method": method, "config": {}}
    for name in method.split(CHAIN_SEP):
        path = default_recipe_path(name, task)
        part = read_recipe(path, name) if path else {}
        data["config"][name] = part.pop("config", {})
        part.pop("method", None)
        data.update(part)  # the last method's teacher, data, bench and gates win
    return data


def load_recipe(
    method: str,
    task: str,
    recipe: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    task_recipes: bool = True,
    kind: str | None = None,
    trained: dict[str, dict[str, int]] | None = None,
    steps: int | None = None,
) -> dict[str, Any]:
    """The recipe (given, else the packaged default for method/task) with its teacher resolved, the task kind's
    settings laid under it, the step budget `steps` (`lay_step_budget`) and the overrides applied, as a plain
    mapping for `DeployConfig`. `task_recipes` False (a user's task, whose name may be any recipe's) skips the
    per-task recipe files; `trained` maps each method of the chain that has a `train` section to its other
    training phases and their defaults (`PHASE_STEPS`)."""
    trained = trained or {}
    lookup = task if task_recipes else None
    path = resolve_recipe(method, recipe) if recipe else default_recipe_path(method, lookup)
    if path is None and CHAIN_SEP in method:
        data = composed_chain_recipe(method, lookup)
    else:
        data = read_recipe(path, method) if path else {}
    if data.setdefault("method", method) != method:
        raise PipelineError(f"recipe is for method {data['method']!r}, not {method!r}")
    data["task"] = task
    resolve_teacher(data)
    if kind is not None:
        lay_kind_settings(data, kind, method, tuple(trained))
    if steps is not None:
        lay_step_budget(data, method, steps, trained)
    for assignment in overrides:
        apply_override(data, assignment)
    resolve_teacher(data)  # `--set teacher=NAME` names another shared definition
    if CHAIN_SEP not in method:  # one method: `config` in a recipe and in --set, `config.<method>` from here on
        data["config"] = {method: data.get("config") or {}}
    return data

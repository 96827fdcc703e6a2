"""The code's shape: every import points down the road (config → data → models → train → compress → stages →
request → run → flows → cli), no import cycles, no stage imports another, the server and the exporter import
nothing of the pipeline, the pipeline nothing of the server but the artifact contract (its files, and how its
outputs are decoded), and each piece of the house has one home (the staging layout, the run engine)."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "flows", "export", "serving")
# The artifact's contract, in the server's modules: file names, task block, manifest and signature (artifact), and
# how its outputs become answers and entities (spans), which the pipeline's metrics decode exactly as served.
CONTRACT = ("serving.artifact", "serving.spans")

# A module may import its own unit and units of a lower rank only. `export` (ONNX export, fusion, int8, sessions,
# the timing harness) is a leaf: it takes what it needs as arguments and imports nothing of the pipeline (only the
# artifact contract), so every unit may use it. The server stands apart: the slim image installs it without the
# rest, and the pipeline imports only its artifact contract.
RANKS = {
    "export": -1,
    "base": 0,
    "kinds": 0.5,
    "config": 1,
    "data": 2,
    "models": 3,
    "train": 4,
    "compress": 5,
    "stages": 6,
    "request": 7,
    "run": 8,
    "flows": 9,
    "cli": 10,
}


def unit(module: str) -> str:
    parts = module.split(".")
    if parts[0] in ("export", "flows", "serving"):
        return parts[0]
    sub = parts[1] if len(parts) > 1 else ""
    if sub in ("sweep", "pareto", "evaluate", "launch"):  # a sweep's requests and its analysis, `evaluate`, and
        return "request"  # launching the training stages on several processes: beside the request
    if sub == "model_card":  # the package stage's model card
        return "stages"
    if sub in ("config", "kinds", "data", "models", "train", "compress", "stages", "request", "run", "cli"):
        return sub
    return "base"  # __init__, errors, cache, paths, report, interrupts, watchdog, staging, jsonfile, distributed


def project_modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def imports_of(path: Path, module: str, known: dict[str, Path]) -> set[str]:
    """Project modules that `module` imports anywhere (top level, inside functions, under TYPE_CHECKING)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                out.add(name)
    return out


def graph() -> dict[str, set[str]]:
    known = project_modules()
    return {m: imports_of(p, m, known) for m, p in known.items()}


def uphill_imports(g: dict[str, set[str]]) -> list[str]:
    """Imports from a unit into one of the same or a higher rank (the server may only import itself)."""
    uphill = []
    for module, deps in g.items():
        for dep in deps:
            if dep.startswith(module + "."):  # a package's __init__ naming its own submodules
                continue
            mine, theirs = unit(module), unit(dep)
            if mine == "serving" or theirs == "serving":
                # the server imports nothing of the pipeline; the pipeline only the artifact contract (and the CLI
                # the server's command line)
                if mine != theirs and mine != "cli" and not (mine != "serving" and dep in CONTRACT):
                    uphill.append(f"{module} -> {dep}")
                continue
            if mine != theirs and RANKS[theirs] >= RANKS[mine]:
                uphill.append(f"{module} ({mine}) -> {dep} ({theirs})")
    return sorted(uphill)


def import_cycles(g: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in sorted(g.get(node, ())):
            if state.get(dep) == 1:
                cycles.append(" -> ".join([*stack[stack.index(dep) :], dep]))
            elif dep not in state:
                visit(dep, [*stack, dep])
        state[node] = 2

    for node in sorted(g):
        if node not in state:
            visit(node, [node])
    return cycles


def test_every_import_points_down_the_road():
    uphill = uphill_imports(graph())
    assert not uphill, "imports that do not point down the road:\n" + "\n".join(uphill)


def test_no_import_cycles():
    cycles = import_cycles(graph())
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_checks_fail_on_an_uphill_import_and_a_cycle(tmp_path):
    """A nested import from a lower unit into a higher one is seen and reported, and so is a cycle."""
    path = tmp_path / "loop.py"
    path.write_text("def f():\n    from pipeline.compress.registry import get_method\n")
    deps = imports_of(path, "pipeline.train.loop", project_modules())
    assert deps == {"pipeline.compress.registry"}
    assert uphill_imports({"pipeline.train.loop": deps}) == [
        "pipeline.train.loop (train) -> pipeline.compress.registry (compress)"
    ]
    assert uphill_imports({"serving.app": {"pipeline.errors"}}) == ["serving.app -> pipeline.errors"]
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a -> b -> c -> a"]


def test_no_stage_imports_another_stage():
    """Stages share the staging layout (`pipeline.staging`) and lower units, never each other: the run engine
    alone knows their order."""
    found = [f"{m} -> {d}" for m, deps in graph().items() if m.startswith("pipeline.stages.")
             for d in deps if d.startswith("pipeline.stages.")]  # fmt: skip
    assert not found, "stages importing stages:\n" + "\n".join(found)


# each name is defined (assigned, or a def or class) in its home module and nowhere else in the project
HOMES = {
    "pipeline.staging": ("WORK", "DENSE_GRAPHS", "STAGING_PREFIX", "stamp_task", "new_staging", "discard"),
    "pipeline.run": ("Run", "STATE_FILE", "STEPS", "prepare", "finish", "run_step", "start_work", "publish_work"),
    "pipeline.compress.deploy_config": ("DeployConfig",),
    "pipeline.kinds": ("KINDS", "kind_of"),
    "serving.kinds": ("SERVED", "served_kind"),
}


def defined_names(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def test_every_piece_of_the_house_has_one_home():
    """The staging layout, the run engine and the deploy config are defined once, where the docs say; the flows
    define no class (they only sequence the engine's steps)."""
    modules = project_modules()
    for home, names in HOMES.items():
        assert set(names) <= defined_names(modules[home]), home
        elsewhere = {m: set(names) & defined_names(p) for m, p in modules.items() if m != home}
        assert not {m: n for m, n in elsewhere.items() if n}, f"defined outside {home}: {elsewhere}"
    for module, path in modules.items():
        if module.startswith("flows."):
            assert not [n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef)], module


KIND_NAMES = {"SEQUENCE", "TOKEN", "QA"}
# the features that exist for one kind only, and so name it: output KD from another teacher and augmented
# sentences (sentence labels), SMP's verbalizer (label words), the transformers pipeline tag of the contract, and
# `pipeline tasks` marking the kinds that are not the default
ONE_KIND_FEATURES = {"pipeline.request", "pipeline.compress.methods.smp.heads", "serving.artifact", "pipeline.cli"}


def kind_branches(path: Path) -> list[int]:
    """Lines that compare something with a kind's name (`kind == QA`, `spec.kind != SEQUENCE`, `kind in (...)`)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            if names & KIND_NAMES:
                lines.append(node.lineno)
    return lines


def test_task_kinds_are_branched_on_only_in_their_adapters():
    """What differs between kinds is each kind's adapter (`pipeline/kinds/`, `serving/kinds/`); elsewhere only the
    one-kind features name a kind."""
    found = {m: kind_branches(p) for m, p in project_modules().items()
             if not m.startswith(("pipeline.kinds", "serving.kinds")) and m not in ONE_KIND_FEATURES}  # fmt: skip
    assert not {m: lines for m, lines in found.items() if lines}, found
    sample = ROOT / "tests" / "test_layout.py"
    assert kind_branches(sample)  # the scan sees a comparison with a kind's name (this module's own, below)


def _a_branch_for_the_scan(kind: str) -> bool:
    return kind == QA  # noqa: F821 - never run: the scan above must find it


def test_methods_are_listed_without_importing_any_other_pipeline_module_first():
    """Registration is the registry's own table, not a side effect of importing `pipeline` or a method package."""
    code = (
        "import sys; from pipeline.compress.registry import methods; "
        "assert [m.name for m in methods()] == ['distill', 'gmp', 'mlp_fusion', 'none', 'smp']; "
        "assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_benchmark_scripts_import_what_exists():
    """The scripts under benchmarks/ are not imported by any test module: run each one's --help."""
    for script in sorted((ROOT / "benchmarks").glob("*.py")):
        result = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0 and "usage" in result.stdout, (script.name, result.stderr[-2000:])


# import names of extras that need not be installed where the tests run (optimum-onnx holds transformers at 4.x)
UNINSTALLED_EXTRAS = {"optimum": {"optimum-onnx"}}


def test_every_third_party_import_is_a_declared_dependency():
    """What the code imports (anywhere, nested imports too) is named in pyproject.toml (its dependencies or an
    extra's), not merely pulled in by another package's requirements."""
    import re
    from importlib.metadata import packages_distributions

    import pytest

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = [d for group in project["optional-dependencies"].values() for d in group]  # e.g. optimum, behind a guard
    declared = {re.split(r"[\s<>=!\[;]", d, maxsplit=1)[0].lower().replace("_", "-")
                for d in [*project["dependencies"], *extras]}  # fmt: skip
    dists = packages_distributions()
    missing = set()
    for path in project_modules().values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                tops = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                tops = [node.module.split(".")[0]]
            else:
                continue
            for top in tops:
                if top in sys.stdlib_module_names or top in PACKAGES or top == "__future__":
                    continue
                names = {d.lower().replace("_", "-") for d in dists.get(top, [top])}
                names |= UNINSTALLED_EXTRAS.get(top, set())
                if not names & declared:
                    missing.add(f"{top} ({', '.join(sorted(names))}) in {path.relative_to(ROOT)}")
    assert not missing, "imported but not declared:\n" + "\n".join(sorted(missing))


def test_the_lock_satisfies_the_ranges_and_the_serving_lock_follows_it():
    """requirements/lock.txt pins a version inside every range pyproject.toml states, its extras' too (a range
    edited without a new lock fails here), and the serving image's own lock pins what it shares with it at the
    same versions."""
    import re

    import pytest
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    def pins(path: Path) -> dict[str, str]:
        found = re.findall(r"^([A-Za-z0-9._-]+)==(\S+)", path.read_text(), re.M)
        return {canonicalize_name(name): version for name, version in found}

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    lock = pins(ROOT / "requirements" / "lock.txt")
    wrong = []
    for line in [*project["dependencies"], *extras["dev"], *extras["serve"]]:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate():
            continue
        pinned = lock.get(canonicalize_name(req.name))
        if pinned is None or not req.specifier.contains(pinned, prereleases=True):
            wrong.append(f"{req.name}{req.specifier}: the lock has {pinned}")
    assert not wrong, "requirements/lock.txt is out of step with pyproject.toml:\n" + "\n".join(wrong)
    serving = pins(ROOT / "serving" / "requirements.txt")
    apart = {name: (version, lock[name]) for name, version in serving.items() if lock.get(name, version) != version}
    assert not apart, f"serving/requirements.txt differs from the lock: {apart}"


def test_only_the_artifact_contract_is_imported_from_the_server():
    assert uphill_imports({"pipeline.stages.package": {"serving.artifact"}}) == []
    assert uphill_imports({"pipeline.stages.package": {"serving.session"}}) == [
        "pipeline.stages.package -> serving.session"
    ]
    assert uphill_imports({"serving.artifact": {"pipeline.errors"}}) == ["serving.artifact -> pipeline.errors"]


def test_the_stages_the_flow_the_commands_and_the_readme_match_one_to_one():
    """One name per stage: a module with a `run` in pipeline/stages/, the engine's table and the Prefect task of
    each, the flow's steps after compress, the `pipeline` stage commands, and a row of the README's stage table, in
    the same order."""
    import importlib
    import re

    from flows import stage_tasks
    from pipeline.cli import app
    from pipeline.run import PLAIN, STEPS
    from pipeline.stages import OWN_FLOW, STAGES

    assert list(PLAIN) == list(stage_tasks.TASKS) == list(STAGES)  # the engine's table, in the flow's order
    for name in STAGES:
        assert callable(importlib.import_module(f"pipeline.stages.{name}").run), name
        assert stage_tasks.TASKS[name].name == name
    modules = sorted(p.stem for p in (ROOT / "pipeline" / "stages").glob("*.py") if p.stem != "__init__")
    assert modules == sorted(STAGES + OWN_FLOW)
    by_hand = list(STAGES[STAGES.index("compress") + 1 : STAGES.index("package")])
    assert [s.command for s in STEPS] == by_hand
    commands = [c.name for c in app.registered_commands]
    assert [c for c in commands if c in STAGES] == ["compress", *by_hand, "package"]
    table = re.findall(r"^\| (\w+) \|", (ROOT / "README.md").read_text(), re.M)
    assert [row for row in table if row in STAGES] == list(STAGES)

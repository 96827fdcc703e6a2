"""The code's shape: every import points down the road (config → data → models → train → compress → stages /
export → request → flows → cli), no import cycles, the server imports nothing of the pipeline, and the pipeline
nothing of the server but the artifact contract."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "flows", "export", "serving")
CONTRACT = "serving.artifact"  # the artifact's file names, task block, manifest and signature: the server's module

# A module may import its own unit and units of a lower rank only. `stages` and `export` share a rank: neither
# may import the other. The server stands apart: the slim image installs it without the rest.
RANKS = {
    "base": 0,
    "config": 1,
    "data": 2,
    "models": 3,
    "train": 4,
    "compress": 5,
    "stages": 6,
    "export": 6,
    "request": 7,
    "flows": 8,
    "cli": 9,
}


def unit(module: str) -> str:
    parts = module.split(".")
    if parts[0] in ("export", "flows", "serving"):
        return parts[0]
    sub = parts[1] if len(parts) > 1 else ""
    if sub == "sweep":  # a sweep file is many deploy requests: it sits with `request`
        return "request"
    if sub in ("config", "data", "models", "train", "compress", "stages", "request", "cli"):
        return sub
    return "base"  # pipeline/__init__, errors, cache


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
                if mine != theirs and mine != "cli" and not (mine != "serving" and dep == CONTRACT):
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


def test_every_third_party_import_is_a_declared_dependency():
    """What the code imports (anywhere, nested imports too) is named in pyproject.toml, not merely pulled in by
    another package's requirements."""
    import re
    from importlib.metadata import packages_distributions

    import pytest

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {re.split(r"[\s<>=!\[;]", d, maxsplit=1)[0].lower().replace("_", "-") for d in project["dependencies"]}
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
                if not names & declared:
                    missing.add(f"{top} ({', '.join(sorted(names))}) in {path.relative_to(ROOT)}")
    assert not missing, "imported but not declared:\n" + "\n".join(sorted(missing))


def test_only_the_artifact_contract_is_imported_from_the_server():
    assert uphill_imports({"export.package": {"serving.artifact"}}) == []
    assert uphill_imports({"export.package": {"serving.session"}}) == ["export.package -> serving.session"]
    assert uphill_imports({"serving.artifact": {"pipeline.errors"}}) == ["serving.artifact -> pipeline.errors"]

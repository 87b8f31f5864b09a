"""The dependency rule of the code base (docs/architecture.md): each package imports only the
packages of the floors below its own, so no import cycle between packages can form, the
sandbox imports nothing above it and nothing of the library imports the command line.

Read from the source: every import anywhere in a module counts (at the top, inside a
function, under ``TYPE_CHECKING``), since each is a dependency of the design."""

from __future__ import annotations

import ast
from pathlib import Path

import tempering

SOURCE = Path(tempering.__file__).parent

FLOORS = [
    {"errors", "syntax"},   # leaves everything may use
    {"sandbox"},            # isolation: the sandbox contract and its backends
    {"tasks"},              # what an episode is about: task formats, the built-in families
    {"reward"},             # grading a task's outcome
    {"trajectory"},         # what an episode leaves: its record, tool calls, storage
    {"scheduler"},          # running jobs, in one process or on Ray
    {"policy"},             # inference
    {"agent", "serve"},     # episodes: played here, or served to an outside agent
    {"recipes"},            # what one built-in workload needs for training: the warm-up
    {"train", "demo"},      # the learner and the run that feeds it; the sandbox demo
    {"cli"},                # the command line, on top
]
FLOOR = {package: level for level, packages in enumerate(FLOORS) for package in packages}


def _package(path: Path) -> str:
    """The package (or top-level module) of ``tempering`` a source file belongs to."""
    return path.relative_to(SOURCE).parts[0].removesuffix(".py")


def _imports(path: Path) -> set[str]:
    """The packages of ``tempering`` that ``path`` imports, its own left out."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else (
            [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else [])
        for name in names:
            parts = name.split(".")
            if parts[0] == "tempering" and len(parts) > 1 and parts[1] in FLOOR:
                found.add(parts[1])
    return found - {_package(path) if path.is_relative_to(SOURCE) else ""}


def _edges() -> dict[tuple[str, str], list[str]]:
    """(importer, imported) package pairs, with the modules behind each."""
    edges: dict[tuple[str, str], list[str]] = {}
    for path in sorted(SOURCE.rglob("*.py")):
        if path.parent == SOURCE and path.name == "__init__.py":
            continue  # the package's own face: its version
        for imported in _imports(path):
            edges.setdefault((_package(path), imported), []).append(
                str(path.relative_to(SOURCE)))
    return edges


def test_every_package_has_a_floor() -> None:
    packages = {_package(p) for p in SOURCE.rglob("*.py")} - {"__init__"}
    assert packages <= set(FLOOR), f"no floor in FLOORS for {sorted(packages - set(FLOOR))}"


def test_each_package_imports_only_the_floors_below_it() -> None:
    upward = [f"{a} (floor {FLOOR[a]}) imports {b} (floor {FLOOR[b]}) in {', '.join(mods)}"
              for (a, b), mods in _edges().items() if FLOOR[b] >= FLOOR[a]]
    assert not upward, "\n".join(upward)


def test_the_rule_catches_an_import_upward(tmp_path: Path) -> None:
    """The rule reads what it should: an import from a function body, upward, is found."""
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from tempering.cli.common import UsageError\n"
                      "import tempering.agent.episode\n")
    assert _imports(module) == {"cli", "agent"}


def test_the_sandbox_core_imports_no_backend() -> None:
    """The sandbox's core (contract, spec, pool, stock, file API and what both backends run
    on) knows no backend: each is a package of its own (``local/``, ``docker/``), reached by
    name through ``spec.BACKENDS``. ``doctor.py`` checks both backends, so it names them."""
    core = SOURCE / "sandbox"
    found = []
    for path in sorted(core.glob("*.py")):
        if path.name == "doctor.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            found += [f"{path.name}: {n}" for n in names
                      if n.startswith(("tempering.sandbox.local", "tempering.sandbox.docker"))]
    assert not found, "\n".join(found)


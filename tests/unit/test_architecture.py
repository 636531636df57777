"""The import graph of the package: layers that only import downward, and no cycles (docs/architecture.md).

Every import counts, wherever it is written: at the top, inside a function (deferred for start-up time) or
under TYPE_CHECKING. A deferred import still ties the two modules together; it must not close a circle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "fleetfix"

# Bottom to top. A module may import its own layer and the layers below, never above.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("fleetfix", "fleetfix.errors", "fleetfix.target", "fleetfix.paths", "fleetfix.secrets",
     "fleetfix.yamlsource", "fleetfix.boundedjson", "fleetfix.terminal", "fleetfix.wheels",
     "fleetfix.importahead"),
    ("fleetfix.transport",),
    ("fleetfix.guests",),
    # The fleet package, bottom to top: what a target's run came to, the node connections, Fleet.map (where
    # concurrency is decided), then what runs over it (the node batches) and the package's public names.
    ("fleetfix.fleet.outcome",),
    ("fleetfix.fleet.connections",),
    ("fleetfix.fleet.run",),
    ("fleetfix.fleet",),
    ("fleetfix.command", "fleetfix.inventory"),
    ("fleetfix.probe",),
    ("fleetfix.playbook",),
    ("fleetfix.audit",),
    ("fleetfix.reports",),
    ("fleetfix.cli", "fleetfix.__main__"),
)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported(path: Path, known: set[str]) -> Iterator[str]:
    """The fleetfix modules a file imports (`from fleetfix.x import y` counts y when y is a module)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            assert not node.level, f"{path}: relative import; fleetfix spells imports out in full"
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                     for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:  # fleetfix.probe.rules.Finding -> fleetfix.probe.rules
                name = name.rpartition(".")[0]
            if name.startswith("fleetfix"):
                yield name


def layer_of(module: str) -> int:
    best: tuple[int, int] | None = None  # (prefix length, layer): the longest matching prefix wins
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            matches = module == prefix or module.startswith(prefix + ".")
            if matches and (best is None or len(prefix) > best[0]):
                best = (len(prefix), index)
    assert best is not None, f"{module} is in no layer: add it to LAYERS (and docs/architecture.md)"
    return best[1]


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: set(imported(path, known)) - {name} for name, path in found.items()}


def test_every_module_is_in_a_layer() -> None:
    for module in modules():
        layer_of(module)


def test_no_module_imports_a_higher_layer() -> None:
    upward = [f"{module} (layer {layer_of(module)}) imports {target} (layer {layer_of(target)})"
              for module, targets in graph().items() for target in sorted(targets)
              if layer_of(target) > layer_of(module)]
    assert not upward, "\n".join(upward)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles() -> None:
    assert cycles(graph()) == []


@pytest.mark.parametrize("edges, expected", [
    ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
])
def test_the_cycle_finder_finds_cycles(edges: dict[str, set[str]], expected: list[list[str]]) -> None:
    assert cycles(edges) == expected


def test_the_layer_check_sees_deferred_imports(tmp_path: Path) -> None:
    source = tmp_path / "mod.py"
    source.write_text("def f():\n    from fleetfix.cli import main\n    return main\n")
    assert list(imported(source, set(modules()))) == ["fleetfix.cli"]


def test_test_modules_have_unique_names() -> None:
    # pytest imports test modules by basename (no __init__.py in the test folders): two files of one
    # name break collection of the whole suite, which a run of one folder does not show.
    tests = Path(__file__).resolve().parents[1]
    names = [path.name for path in tests.rglob("test_*.py")]
    assert sorted({name for name in names if names.count(name) > 1}) == []


def all_imports(path: Path) -> set[str]:
    """Every module a file imports, fleetfix's or not (`from a.b import c` counts a.b and a.b.c)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_the_probe_leaves_concurrency_to_the_fleet() -> None:
    # How many scripts run at once, on which threads and over which channels is decided in fleetfix.fleet;
    # the probe passes in its scripts, limits and parsers. A thread or a batch in probe/ is a second place.
    concurrent = {"threading", "queue", "concurrent.futures", "fleetfix.guests.pctbatch",
                  "fleetfix.fleet.Pending", "fleetfix.fleet.RunOnThread", "fleetfix.fleet.run"}
    found = {f"{module}: {name}" for module, path in modules().items() if module.startswith("fleetfix.probe")
             for name in all_imports(path) & concurrent}
    assert not found, sorted(found)

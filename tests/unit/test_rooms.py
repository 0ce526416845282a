"""The rooms' arrows go one way: the product (bake, bootstrap, kiln, localcloud, trainer) never imports the stand-ins
only the tests use (testbed/); the stand-ins build on the local cloud."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("bake", "bootstrap", "kiln", "localcloud", "trainer")


def imported(path: Path, members: bool = False) -> set[str]:
    """Every module a file imports, at any depth (a function's lazy import too); with `members`, also each name
    imported from one (`from a import b`: a.b, which may be a module)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            if members:
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_no_product_module_imports_the_tests_stand_ins():
    found = {str(path.relative_to(ROOT)): sorted(name for name in imported(path) if name.split(".")[0] == "testbed")
             for room in PRODUCT for path in (ROOT / room).rglob("*.py")}
    assert {path: names for path, names in found.items() if names} == {}
    assert len(found) > 100  # the rooms were found


def test_the_stand_ins_build_on_the_local_cloud():
    used = {name for path in (ROOT / "testbed").glob("*.py") for name in imported(path)}
    assert "localcloud.guest" in used


CLOUDS = ("bootstrap.providers.aws", "bootstrap.providers.gcp", "bootstrap.providers.azure")


def test_the_local_cloud_imports_no_clouds_package():
    """The local cloud stands beside the clouds: what it shares with them is the providers' neutral part
    (bootstrap.providers.common), never one cloud's plan."""
    found = {str(path.relative_to(ROOT)): sorted(name for name in imported(path) if name.startswith(CLOUDS))
             for path in (ROOT / "localcloud").rglob("*.py")}
    assert {path: names for path, names in found.items() if names} == {}
    assert len(found) > 5


def module_imports(room: str) -> dict[str, set[str]]:
    """Each module of a room and the room's modules it imports (lazy imports too; a package's own modules that its
    __init__ gathers, as bootstrap.tasks gathers its tasks, are not counted as its imports)."""
    modules = {}
    for path in (ROOT / room).rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        modules[name] = path
    graph = {}
    for name, path in modules.items():
        own = name + "." if path.name == "__init__.py" else "\0"
        graph[name] = {m for m in imported(path, members=True) if m in modules and m != name and not m.startswith(own)}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of a graph: its strongly connected parts of more than one module."""
    order, low, stack, found, counter = {}, {}, [], [], [0]

    def visit(module: str) -> None:
        order[module] = low[module] = counter[0]
        counter[0] += 1
        stack.append(module)
        for other in graph[module]:
            if other not in order:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], order[other])
        if low[module] == order[module]:
            part = []
            while not part or part[-1] != module:
                part.append(stack.pop())
            if len(part) > 1:
                found.append(sorted(part))

    for module in graph:
        if module not in order:
            visit(module)
    return found


def test_no_import_circle_in_the_launcher():
    """bootstrap's modules import one another one way: the tasks call the launcher, never the other way, and no
    two task modules import each other (a managed run's move reads from recovery down)."""
    graph = module_imports("bootstrap")
    assert circles(graph) == []
    assert circles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]  # the check sees a circle
    callers = {module for module, names in graph.items() if not module.startswith("bootstrap.tasks")
               for name in names if name.startswith("bootstrap.tasks")}
    assert callers == {"bootstrap.main"}, "only the command itself calls the tasks"

"""The rooms' arrows go one way: the product (bake, bootstrap, kiln, localcloud, trainer) never imports the stand-ins
only the tests use (testbed/); the stand-ins build on the local cloud."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("bake", "bootstrap", "kiln", "localcloud", "trainer")


def imported(path: Path) -> set[str]:
    """Every module a file imports, at any depth (a function's lazy import too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
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

"""The version matrix, ansible/group_vars/all/versions.yml: its one reader. A matrix file (matrices/*.yml) overrides
some of its entries for one bake or one environment, e.g. an older TensorFlow by choice.

    python -m bake.matrix pins [--override FILE]    # the pip pins of the image's Python environment (scripts/setup
                                                    # and scripts/wheelhouse install and collect them)
    python -m bake.matrix environment [--override FILE]   # the environment whose Horovod build serves that matrix
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path

import yaml

from kiln.errors import KilnError, UsageError, run_main
from kiln.paths import PROJECT

MATRIX = PROJECT / "ansible" / "group_vars" / "all" / "versions.yml"
OVERRIDES = PROJECT / "matrices"
# The matrix entries that are pip distributions in the image's environment (and in pyproject.toml's pins).
PIP = {"tensorflow_version": "tensorflow", "tensorflow_tf_keras_version": "tf-keras",
       "tensorflow_numpy_version": "numpy", "tensorflow_tensorboard_version": "tensorboard"}
# PyTorch and JAX where the matrix gives them a version, as the CPU builds (the wheelhouse's, and a matrix
# environment's; a gpu image takes its CUDA builds from the indexes, ansible/roles/frameworks): the distributions
# each entry installs, with PyTorch's build label.
FRAMEWORKS = {"frameworks_torch_version": (("torch", "+cpu"),),
              "frameworks_jax_version": (("jax", ""), ("jaxlib", ""))}


def _load(path: Path, what: str) -> dict[str, str]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as error:
        raise KilnError(f"cannot read the {what} {path}: {error}") from None
    if not isinstance(data, dict) or any(isinstance(value, (dict, list)) for value in data.values()):
        raise KilnError(f"{path}: the {what} must be a flat mapping of name: version")
    floats = sorted(str(name) for name, value in data.items() if isinstance(value, float))
    if floats:  # YAML reads 2.20 as the number 2.2
        raise KilnError(f"{path}: quote the version of {', '.join(floats)} (YAML reads it as a number)")
    return {str(name): str(value) for name, value in data.items()}


def overrides(base: dict[str, str], override: dict[str, str], source: str) -> dict[str, str]:
    """The entries an override changes; an entry the matrix lacks, or an empty version, is refused by name."""
    unknown = sorted(set(override) - set(base))
    if unknown:
        raise UsageError(f"{source}: {', '.join(unknown)} is not an entry of the version matrix ({MATRIX.name})")
    empty = sorted(name for name, value in override.items() if not value.strip() or value == "None")
    if empty:
        raise UsageError(f"{source}: {', '.join(empty)} has no version")
    return {name: value for name, value in override.items() if base[name] != value}


def read_override(path: Path | str, base: dict[str, str] | None = None) -> dict[str, str]:
    """The entries a matrix file changes (only those that differ from the matrix)."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"matrix file {path}: no such file (the ones kept here: {OVERRIDES.relative_to(PROJECT)}/)")
    return overrides(read_matrix() if base is None else base, _load(path, "matrix file"), str(path))


def read_matrix(path: Path = MATRIX, override: Path | str | None = None) -> dict[str, str]:
    """Every `name: version` of the matrix, the values as strings (what Packer and the roles receive), with a matrix
    file's entries in place of the matrix's where one is given."""
    matrix = _load(path, "version matrix")
    return {**matrix, **(read_override(override, matrix) if override else {})}


def labels(matrix: dict[str, str]) -> dict[str, str]:
    """The entries an image is labelled with (Packer's `versions`): those with a version; an empty one (PyTorch or
    JAX left out) is not in the image."""
    return {name: version for name, version in matrix.items() if version}


def pins(matrix: dict[str, str], pyproject: Path = PROJECT / "pyproject.toml") -> list[str]:
    """The pip pins of the image's Python environment (Horovod is built, not pinned here): the matrix's TensorFlow,
    tf-keras, numpy and TensorBoard, then, at pyproject.toml's pins, Horovod's runtime needs."""
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    return [*(f"{package}=={matrix[name]}" for name, package in PIP.items()), *extras["horovod"][1:],
            *framework_pins(matrix)]


def framework_pins(matrix: dict[str, str]) -> list[str]:
    """PyTorch's and JAX's CPU builds at the matrix's versions; none for an entry left empty (the default)."""
    return [f"{package}=={matrix[name]}{build}" for name, packages in FRAMEWORKS.items() if matrix.get(name)
            for package, build in packages]


def environment(override: Path | str | None, base: dict[str, str] | None = None) -> str:
    """The Python environment (scripts/setup's) whose Horovod build serves a matrix file: .venv-NAME where the file
    changes what Horovod is built against (TensorFlow and the rest of PIP), else .venv (PyTorch and JAX alone
    change nothing Horovod is built with)."""
    if not override:
        return ".venv"
    changed = read_override(override, base)
    return f".venv-{Path(override).stem}" if set(changed) & set(PIP) else ".venv"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bake.matrix", description="Read the version matrix.")
    parser.add_argument("what", choices=("pins", "environment"))
    parser.add_argument("--override", default="", help="a matrix file whose entries replace the matrix's")
    args = parser.parse_args(argv)
    if args.what == "environment":
        return run_main("matrix", lambda: print(environment(args.override or None)) or 0)
    return run_main("matrix", lambda: print(*pins(read_matrix(override=args.override or None)), sep="\n") or 0)


if __name__ == "__main__":
    sys.exit(main())

"""The version matrix, ansible/group_vars/all/versions.yml: its one reader."""

from __future__ import annotations

from pathlib import Path

import yaml

from kiln.errors import KilnError
from kiln.paths import PROJECT

MATRIX = PROJECT / "ansible" / "group_vars" / "all" / "versions.yml"


def read_matrix(path: Path = MATRIX) -> dict[str, str]:
    """Every `name: version` of the matrix, the values as strings (what Packer and the roles receive)."""
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as error:
        raise KilnError(f"cannot read the version matrix {path}: {error}") from None
    if not isinstance(data, dict):
        raise KilnError(f"{path}: the version matrix must be a flat mapping of name: version")
    return {str(name): str(value) for name, value in data.items()}

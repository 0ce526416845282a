"""The bake's static promises: one version matrix agreeing with pyproject.toml, every role's defaults and
argument spec naming the same variables, all role-prefixed, and internal roles (imported by other roles, never
listed in a playbook) given their required inputs by every role that imports them."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLES = sorted(p for p in (ROOT / "ansible" / "roles").iterdir() if p.is_dir())
MATRIX = yaml.safe_load((ROOT / "ansible" / "group_vars" / "all" / "versions.yml").read_text())
ROLE_NAMES = [role.name for role in ROLES]
PLAYBOOKS = [ROOT / "ansible" / "image.yml", ROOT / "ansible" / "cleanup.yml"]
ROLE_IMPORTS = ("ansible.builtin.import_role", "ansible.builtin.include_role")


def tasks_of(items: list) -> list[dict]:
    """Every task in a task list, blocks (block, rescue, always) flattened."""
    found = []
    for item in items:
        nested = [part for key in ("block", "rescue", "always") for part in item.get(key, [])]
        found.extend(tasks_of(nested) if nested else [item])
    return found


def role_imports() -> list[tuple[str, str, dict]]:
    """(importing role, imported role, the vars it passes) for every import_role / include_role in a role."""
    imports = []
    for role in ROLES:
        for path in sorted((role / "tasks").glob("*.yml")):
            for task in tasks_of(yaml.safe_load(path.read_text()) or []):
                for module in ROLE_IMPORTS:
                    if module in task:
                        imports.append((role.name, task[module]["name"], task.get("vars") or {}))
    return imports


def playbook_roles() -> set[str]:
    return {entry["role"] if isinstance(entry, dict) else entry
            for path in PLAYBOOKS for play in yaml.safe_load(path.read_text()) for entry in play.get("roles", [])}


IMPORTS = role_imports()
INTERNAL = sorted({imported for _, imported, _ in IMPORTS})
PUBLIC = [role for role in ROLES if role.name not in INTERNAL]


def pyproject_pins() -> dict[str, str]:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return dict(pin.split("==", 1) for pin in extras["train"] + extras["horovod"] if "==" in pin)


@pytest.mark.parametrize(("variable", "package"), [
    ("tensorflow_version", "tensorflow"), ("tensorflow_tf_keras_version", "tf-keras"),
    ("tensorflow_numpy_version", "numpy"), ("tensorflow_tensorboard_version", "tensorboard"),
    ("tensorflow_horovod_version", "horovod")])
def test_matrix_python_pins_equal_pyproject(variable, package):
    assert str(MATRIX[variable]) == pyproject_pins()[package], (
        f"versions.yml {variable}={MATRIX[variable]} but pyproject.toml pins {package}=={pyproject_pins()[package]}")


def test_the_frameworks_matrix_file_names_the_frameworks_environments_versions():
    """matrices/pytorch-jax.yml puts into an image the PyTorch and JAX that make setup's .venv-frameworks has
    (pyproject.toml's `frameworks`; PyTorch's build label, +cpu, is the image profile's to choose)."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pins = {name: version.split("+")[0] for name, version in (pin.split("==", 1) for pin in extras["frameworks"])}
    chosen = yaml.safe_load((ROOT / "matrices" / "pytorch-jax.yml").read_text())
    assert chosen == {"frameworks_torch_version": pins["torch"], "frameworks_jax_version": pins["jax"]}
    assert pins["jaxlib"] == pins["jax"]
    assert MATRIX["frameworks_torch_version"] == MATRIX["frameworks_jax_version"] == ""  # left out by default


def test_every_matrix_entry_belongs_to_a_role():
    orphans = [name for name in MATRIX if not any(name.startswith(role + "_") for role in ROLE_NAMES)]
    assert not orphans, f"matrix entries no role owns (name them <role>_...): {orphans}"


def test_every_matrix_entry_is_a_string():
    assert all(isinstance(value, str) for value in MATRIX.values()), "quote every version: YAML reads 12.10 as 12.1"


def role_spec(role: Path) -> dict:
    return yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]


def role_defaults(role: Path) -> dict:
    path = role / "defaults" / "main.yml"
    return (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}


@pytest.mark.parametrize("role", ROLES, ids=ROLE_NAMES)
def test_defaults_and_argument_spec_name_the_same_variables(role):
    spec, defaults = role_spec(role), role_defaults(role)
    optional = {name for name, option in spec.items() if not option.get("required")}
    assert set(defaults) - set(spec) == set(), f"{role.name}: defaults missing from the argument spec"
    assert optional - set(defaults) == set(), f"{role.name}: optional spec options without a default"
    required_with_default = {name for name, option in spec.items() if option.get("required")} & set(defaults)
    assert not required_with_default, f"{role.name}: required options must come from the matrix, not defaults"


@pytest.mark.parametrize("role", ROLES, ids=ROLE_NAMES)
def test_variables_are_role_prefixed(role):
    names = set(role_spec(role)) | set(role_defaults(role))
    unprefixed = sorted(name for name in names if not name.startswith(role.name + "_"))
    assert not unprefixed, f"{role.name}: variables must start with {role.name}_: {unprefixed}"


@pytest.mark.parametrize("role", ROLES, ids=ROLE_NAMES)
def test_every_spec_option_is_typed_and_described(role):
    loose = [name for name, option in role_spec(role).items() if "type" not in option or not option.get("description")]
    assert not loose, f"{role.name}: options without type or description: {loose}"


@pytest.mark.parametrize("role", PUBLIC, ids=[role.name for role in PUBLIC])
def test_required_spec_options_are_in_the_matrix(role):
    required = [name for name, option in role_spec(role).items() if option.get("required")]
    missing = [name for name in required if name not in MATRIX]
    assert not missing, f"{role.name}: required options the matrix does not set: {missing}"


def test_every_role_is_in_a_playbook_or_imported_by_a_role_but_not_both():
    listed = playbook_roles()
    assert "apt_source" in INTERNAL, f"apt_source is no longer imported by any role ({IMPORTS})"
    assert listed & set(INTERNAL) == set(), f"internal roles listed in a playbook: {sorted(listed & set(INTERNAL))}"
    unused = sorted(set(ROLE_NAMES) - listed - set(INTERNAL))
    assert not unused, f"roles no playbook lists and no role imports: {unused}"


@pytest.mark.parametrize(("importer", "role", "passed"), IMPORTS,
                         ids=[f"{importer}->{role}" for importer, role, _ in IMPORTS])
def test_internal_role_imports_pass_every_required_option_and_no_unknown_one(importer, role, passed):
    spec = role_spec(ROOT / "ansible" / "roles" / role)
    required = {name for name, option in spec.items() if option.get("required")}
    assert required - set(passed) == set(), f"{importer} imports {role} without {sorted(required - set(passed))}"
    assert set(passed) - set(spec) == set(), f"{importer} passes {role} options it does not have: " \
                                             f"{sorted(set(passed) - set(spec))}"


def test_an_image_is_labelled_with_the_entries_it_carries():
    from bake.matrix import labels

    assert labels({"tensorflow_version": "2.21.0", "frameworks_torch_version": ""}) == {
        "tensorflow_version": "2.21.0"}
    assert "frameworks_jax_version" not in labels(MATRIX) and labels(MATRIX)["tensorflow_version"]

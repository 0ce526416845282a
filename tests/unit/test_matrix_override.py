"""A matrix file overrides some entries of the version matrix for one bake: what it may change, what it is refused
for, the pins it gives, and what verify then holds an image to."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bake import verify
from bake.matrix import MATRIX, OVERRIDES, PIP, environment, overrides, pins, read_matrix, read_override
from kiln.errors import KilnError, UsageError
from kiln.paths import PROJECT

BASE = read_matrix()


def test_an_override_changes_only_its_entries():
    merged = read_matrix(override=OVERRIDES / "tensorflow-2.18.yml")
    assert merged["tensorflow_version"] == "2.18.1" and merged["tensorflow_tf_keras_version"] == "2.18.0"
    assert {name for name in merged if merged[name] != BASE[name]} == {
        "tensorflow_version", "tensorflow_tf_keras_version", "tensorflow_numpy_version",
        "tensorflow_tensorboard_version"}


def test_entries_equal_to_the_matrix_are_not_counted_as_chosen():
    same = {"tensorflow_version": BASE["tensorflow_version"], "cuda_version": "12.4.1"}
    assert overrides(BASE, same, "f.yml") == {"cuda_version": "12.4.1"}


@pytest.mark.parametrize(("override", "said"), [
    ({"tensorflow": "2.18.1"}, "f.yml: tensorflow is not an entry of the version matrix"),
    ({"tensorflow_version": ""}, "f.yml: tensorflow_version has no version"),
    ({"tensorflow_version": "None"}, "f.yml: tensorflow_version has no version"),
])
def test_an_override_the_matrix_cannot_take_is_refused_by_name(override, said):
    with pytest.raises(UsageError) as error:
        overrides(BASE, override, "f.yml")
    assert said in str(error.value)


@pytest.mark.parametrize(("text", "said"), [
    ("tensorflow_version: 2.20\n", "quote the version of tensorflow_version"),
    ("- tensorflow_version\n", "must be a flat mapping"),
    ("tensorflow_version: [2.18.1]\n", "must be a flat mapping"),
    ("tensorflow_version: '2.18.1\n", "cannot read the matrix file"),
])
def test_a_malformed_matrix_file_is_refused(tmp_path, text, said):
    path = tmp_path / "m.yml"
    path.write_text(text)
    with pytest.raises(KilnError) as error:
        read_override(path)
    assert said in str(error.value)


def test_a_missing_matrix_file_names_the_folder_of_the_kept_ones(tmp_path):
    with pytest.raises(UsageError, match="no such file .*matrices/"):
        read_override(tmp_path / "absent.yml")


def test_the_kept_matrix_files_are_valid_overrides():
    kept = sorted(OVERRIDES.glob("*.yml"))
    assert kept
    for path in kept:
        assert read_override(path), f"{path.name} changes nothing"


def test_the_pins_are_the_matrix_python_entries_then_horovods_needs_from_pyproject(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project.optional-dependencies]\ntrain = ["tensorflow==0", "scikit-learn==1.2", "rich==3"]\n'
                         'horovod = ["horovod==0.28.1", "psutil==7"]\n')
    assert pins(BASE, pyproject) == [*(f"{package}=={BASE[name]}" for name, package in PIP.items()), "psutil==7"]
    assert pins(read_matrix(override=OVERRIDES / "tensorflow-2.18.yml"))[0] == "tensorflow==2.18.1"
    assert not any(pin.startswith("scikit-learn==") for pin in pins(BASE))  # the trainer's digits are its own


def test_pytorch_and_jax_are_pinned_as_their_cpu_builds_only_where_the_matrix_names_them():
    assert not any(pin.startswith(("torch==", "jax==", "jaxlib==")) for pin in pins(BASE))
    chosen = pins(read_matrix(override=OVERRIDES / "pytorch-jax.yml"))
    assert chosen[-3:] == ["torch==2.13.0+cpu", "jax==0.10.2", "jaxlib==0.10.2"]
    assert chosen[:-3] == pins(BASE)  # the rest of the environment is the default's
    only_jax = pins({**BASE, "frameworks_jax_version": "0.9.0"})
    assert only_jax[-2:] == ["jax==0.9.0", "jaxlib==0.9.0"] and not any(p.startswith("torch==") for p in only_jax)


def test_the_environment_whose_horovod_serves_a_matrix_file_is_its_own_only_where_horovods_inputs_change(tmp_path):
    assert environment(None) == ".venv"
    assert environment(OVERRIDES / "pytorch-jax.yml") == ".venv"  # PyTorch and JAX: Horovod is built the same
    assert environment(OVERRIDES / "tensorflow-2.18.yml") == ".venv-tensorflow-2.18"
    (tmp_path / "numpy.yml").write_text("tensorflow_numpy_version: '1.26.4'\nframeworks_jax_version: '0.9.0'\n")
    assert environment(tmp_path / "numpy.yml") == ".venv-numpy"
    (tmp_path / "same.yml").write_text(f"tensorflow_version: '{BASE['tensorflow_version']}'\n")
    assert environment(tmp_path / "same.yml") == ".venv"  # the matrix's own version changes nothing


def test_the_command_prints_the_pins_and_refuses_a_bad_file_with_one_line(tmp_path):
    ran = subprocess.run([sys.executable, "-m", "bake.matrix", "pins", "--override", "matrices/tensorflow-2.18.yml"],
                         capture_output=True, text=True, cwd=PROJECT, timeout=60)
    assert ran.returncode == 0 and ran.stdout.splitlines()[0] == "tensorflow==2.18.1", ran.stderr
    (tmp_path / "bad.yml").write_text("nope_version: '1'\n")
    ran = subprocess.run([sys.executable, "-m", "bake.matrix", "pins", "--override", str(tmp_path / "bad.yml")],
                         capture_output=True, text=True, cwd=PROJECT, timeout=60)
    assert ran.returncode == 2 and ran.stderr.count("\n") == 1 and "nope_version" in ran.stderr


def test_verify_holds_a_local_image_to_the_entries_it_was_baked_with(tmp_path, capsys):
    image = tmp_path / "local-cpu-0123"
    image.mkdir()
    entries = {"tensorflow_version": "2.18.1"}
    (image / "image.json").write_text(json.dumps({"matrix_override": {"file": "m.yml", "entries": entries}}))
    assert verify.chosen_entries(None, image) == entries
    assert "baked with m.yml" in capsys.readouterr().out
    (image / "image.json").write_text(json.dumps({"matrix_override": None}))
    assert verify.chosen_entries(None, image) == {}
    assert verify.chosen_entries(OVERRIDES / "tensorflow-2.18.yml", image)["tensorflow_version"] == "2.18.1"


def test_verify_gives_the_suite_the_whole_matrix_with_the_chosen_entries():
    with verify.matrix_args({"tensorflow_version": "2.18.1"}) as args:
        (option,) = args
        written = yaml.safe_load(Path(option.split("=", 1)[1]).read_text())
    assert written == {**yaml.safe_load(MATRIX.read_text()), "tensorflow_version": "2.18.1"}
    with verify.matrix_args({}) as args:
        assert args == []


def test_the_local_bake_refuses_pytorch_and_jax_with_one_line():
    """Its VM reaches the wheelhouse over plain http, which the frameworks role does not tell pip to trust yet."""
    ran = subprocess.run([sys.executable, "-m", "bake.image", "local", "--matrix", "matrices/pytorch-jax.yml"],
                         capture_output=True, text=True, cwd=PROJECT, timeout=60)
    assert ran.returncode == 2 and ran.stderr.count("\n") == 1, ran.stderr
    assert "frameworks_torch_version, frameworks_jax_version for PROVIDER=local" in ran.stderr

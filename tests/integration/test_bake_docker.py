"""A real container bake: Packer's docker builder runs the container roles in a container of the local engine
(from the Debian base made here, wheels from the wheelhouse), the image is tagged by its fingerprint, pushed to a
real registry, verified by the testinfra suite through testinfra's docker backend, and reused when unchanged."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import CONTAINER_MATRIX

from bake.matrix import read_matrix, read_override
from kiln.paths import PROJECT as ROOT

pytestmark = [pytest.mark.integration, pytest.mark.timeout(3600)]  # the first test waits for the container bake

MATRIX = read_matrix(override=CONTAINER_MATRIX)  # the session's image: PyTorch and JAX beside TensorFlow


def run(argv: list[str], timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, **(env or {})})


def inspect(reference: str) -> dict:
    result = run(["docker", "image", "inspect", reference], timeout=60)
    assert result.returncode == 0, f"the engine has no image {reference}: {result.stderr}"
    return json.loads(result.stdout)[0]


def test_the_container_image_is_tagged_and_labelled_with_its_inputs(container_bake):
    _, record = container_bake
    assert record["provider"] == "docker" and record["profile"] == "cpu"
    assert record["image"] == f"kiln:cpu-{record['fingerprint']}"
    image = inspect(record["image"])
    assert image["Id"] == record["image_id"]
    labels = image["Config"]["Labels"]
    assert labels["kiln.fingerprint"] == record["fingerprint"] and labels["kiln.profile"] == "cpu"
    for key in ("tensorflow_version", "tensorflow_tf_keras_version", "tensorflow_horovod_version",
                "frameworks_torch_version", "frameworks_jax_version"):
        assert labels[f"kiln.{key.removesuffix('_version')}"] == MATRIX[key]
        assert record["versions"]["installed"][key].split("+")[0] == MATRIX[key]  # torch's is 2.13.0+cpu
    assert record["matrix_override"]["entries"] == read_override(CONTAINER_MATRIX), record["matrix_override"]
    assert record["versions"]["target"] == "container"
    assert "nvidia_driver_version" not in record["versions"]["matrix"], "a container carries no driver"
    assert any(env.startswith("PATH=/opt/kiln/venv/bin:") for env in image["Config"]["Env"]), image["Config"]["Env"]


def test_the_suite_passes_in_a_container_of_the_image(container_bake):
    _, record = container_bake
    result = run([sys.executable, "-m", "bake.verify", "--container", record["image"], "--matrix",
                  str(CONTAINER_MATRIX), "--", "-rfEs"], timeout=900)
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:]
    assert " passed" in result.stdout
    assert "usable_by_any_user" not in result.stdout.split("short test summary")[-1], result.stdout[-3000:]


def test_the_pushed_image_pulls_back_by_its_digest(container_bake, container_registry):
    _, record = container_bake
    assert record["pushed"].startswith(f"{container_registry}/kiln@sha256:"), record["pushed"]
    remote = f"{container_registry}/kiln:cpu-{record['fingerprint']}"
    assert run(["docker", "rmi", remote], timeout=120).returncode == 0
    pulled = run(["docker", "pull", record["pushed"]], timeout=900)
    assert pulled.returncode == 0, pulled.stderr
    assert inspect(record["pushed"])["Id"] == record["image_id"]
    run(["docker", "tag", record["image_id"], remote], timeout=60)


def test_an_unchanged_fingerprint_reuses_the_container_image(container_bake, container_images, container_registry):
    folder, _ = container_bake
    before = (folder / "image.json").stat().st_mtime
    result = run([sys.executable, "-m", "bake.image", "docker", "--registry", container_registry, "--matrix",
                  str(CONTAINER_MATRIX)], timeout=600, env={"KILN_IMAGES": str(container_images)})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "up to date" in result.stdout and str(folder) in result.stdout, result.stdout
    assert "packer build" not in result.stdout
    assert (folder / "image.json").stat().st_mtime == before


def test_a_kept_image_the_registry_holds_under_another_name_is_not_pushed_again(container_bake, container_images,
                                                                                 container_registry):
    """A kept image asked for with a registry whose address differs from the one it was pushed to (a session's
    registry on another port, a host's other name) is not compressed and pushed again where that registry already
    holds its manifest: the record names it there, by the same digest."""
    folder, record = container_bake
    digest = record["pushed"].partition("@")[2]
    other = container_registry.replace("127.0.0.1", "localhost")
    try:
        for registry in (other, container_registry):
            result = run([sys.executable, "-m", "bake.image", "docker", "--registry", registry, "--matrix",
                          str(CONTAINER_MATRIX)], timeout=600, env={"KILN_IMAGES": str(container_images)})
            assert result.returncode == 0, result.stdout + result.stderr
            assert f"image: {registry} holds it already: {registry}/kiln@{digest}" in result.stdout, result.stdout
            assert "image: pushed" not in result.stdout, result.stdout
            assert json.loads((folder / "image.json").read_text())["pushed"] == f"{registry}/kiln@{digest}"
    finally:
        run(["docker", "rmi", f"{other}/kiln:cpu-{record['fingerprint']}"], timeout=120)

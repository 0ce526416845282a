"""A real container bake: Packer's docker builder runs the container roles in a container of the local engine
(from the Debian base made here, wheels from the wheelhouse), the image is tagged by its fingerprint, pushed to a
real registry, verified by the testinfra suite through testinfra's docker backend, and reused when unchanged."""

from __future__ import annotations

import json
import sys

import pytest
from conftest import run

from bake.matrix import read_matrix
from testbed.registry import serving

pytestmark = pytest.mark.image_bake

MATRIX = read_matrix()


@pytest.fixture(scope="session")
def registry(tmp_path_factory):
    with serving(tmp_path_factory.mktemp("registry")) as address:
        yield address


@pytest.fixture(scope="session")
def container_bake(images_dir, registry):
    """`make image PROVIDER=docker REGISTRY=...` into a fresh images folder: (its folder, image.json). The image
    is removed from the engine afterwards (each is some GB)."""
    if run(["docker", "info"], timeout=60).returncode != 0:
        pytest.fail("no Docker engine answers (make setup starts one: scripts/docker-engine)")
    result = run([sys.executable, "-m", "bake.image", "docker", "--registry", registry], timeout=3600,
                 env={"KILN_IMAGES": str(images_dir)})
    assert result.returncode == 0, f"the container bake failed:\n{result.stdout[-8000:]}\n{result.stderr[-3000:]}"
    found = list(images_dir.glob("docker-cpu-*/image.json"))
    assert len(found) == 1, f"expected one container image record in {images_dir}, found {found}"
    record = json.loads(found[0].read_text())
    yield found[0].parent, record
    for name in (record["image"], record.get("pushed", "").split("@")[0] + f":cpu-{record['fingerprint']}"):
        run(["docker", "rmi", name], timeout=120)


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
    for key in ("tensorflow_version", "tensorflow_tf_keras_version", "tensorflow_horovod_version"):
        assert labels[f"kiln.{key.removesuffix('_version')}"] == MATRIX[key]
        assert record["versions"]["installed"][key] == MATRIX[key]
    assert record["versions"]["target"] == "container"
    assert "nvidia_driver_version" not in record["versions"]["matrix"], "a container carries no driver"
    assert any(env.startswith("PATH=/opt/kiln/venv/bin:") for env in image["Config"]["Env"]), image["Config"]["Env"]


def test_the_suite_passes_in_a_container_of_the_image(container_bake):
    _, record = container_bake
    result = run([sys.executable, "-m", "bake.verify", "--container", record["image"], "--", "-rfEs"], timeout=900)
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:]
    assert " passed" in result.stdout
    assert "usable_by_any_user" not in result.stdout.split("short test summary")[-1], result.stdout[-3000:]


def test_the_pushed_image_pulls_back_by_its_digest(container_bake, registry):
    _, record = container_bake
    assert record["pushed"].startswith(f"{registry}/kiln@sha256:"), record["pushed"]
    remote = f"{registry}/kiln:cpu-{record['fingerprint']}"
    assert run(["docker", "rmi", remote], timeout=120).returncode == 0
    pulled = run(["docker", "pull", record["pushed"]], timeout=900)
    assert pulled.returncode == 0, pulled.stderr
    assert inspect(record["pushed"])["Id"] == record["image_id"]
    run(["docker", "tag", record["image_id"], remote], timeout=60)


def test_an_unchanged_fingerprint_reuses_the_container_image(container_bake, images_dir, registry):
    folder, _ = container_bake
    before = (folder / "image.json").stat().st_mtime
    result = run([sys.executable, "-m", "bake.image", "docker", "--registry", registry], timeout=600,
                 env={"KILN_IMAGES": str(images_dir)})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "up to date" in result.stdout and str(folder) in result.stdout, result.stdout
    assert "packer build" not in result.stdout
    assert (folder / "image.json").stat().st_mtime == before

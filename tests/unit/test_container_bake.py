"""The container bake's names and choices (bake.container, bake.container_base): pure."""

from __future__ import annotations

import pytest

from bake import container, container_base
from bake.plan import check_packer_for, choose_profile
from kiln.errors import KilnError, UsageError


def test_the_tag_names_profile_and_fingerprint_under_the_registry():
    assert container.tag("cpu", "0123abcd") == "kiln:cpu-0123abcd"
    assert container.tag("gpu", "0123abcd", "127.0.0.1:5000/") == "127.0.0.1:5000/kiln:gpu-0123abcd"


@pytest.mark.parametrize("registry", ["http://127.0.0.1:5000", "https://r.example", "r.example/a b", "/", "r@x"])
def test_a_registry_with_a_scheme_or_spaces_is_refused(registry):
    with pytest.raises(UsageError, match="HOST\\[:PORT\\]"):
        container.check_registry(registry)


def test_a_registry_keeps_its_host_port_and_path():
    assert container.check_registry("10.0.0.1:5000/team/") == "10.0.0.1:5000/team"


def test_the_cpu_base_is_the_local_one_and_the_gpu_base_nvidias_at_the_matrix_cuda():
    matrix = {"cuda_version": "12.5.1"}
    assert container.base_image("cpu", matrix, "kiln-base:debian12-abc") == ("kiln-base:debian12-abc", False)
    assert container.base_image("gpu", matrix) == ("nvidia/cuda:12.5.1-cudnn-devel-ubuntu22.04", True)


def test_the_artifact_is_the_last_build_of_the_packer_manifest():
    manifest = {"builds": [{"artifact_id": "sha256:old"}, {"artifact_id": "sha256:new"}]}
    assert container.artifact_id(manifest) == "sha256:new"
    with pytest.raises(KilnError, match="names no image"):
        container.artifact_id({"builds": []})


def test_docker_bakes_with_old_packer_and_defaults_to_cpu():
    check_packer_for("docker", (1, 6, 6))
    assert choose_profile("docker", None) == "cpu"
    with pytest.raises(UsageError, match="packer >= 1.7"):
        check_packer_for("aws", (1, 6, 6))


def test_the_container_base_key_follows_its_inputs():
    first = container_base.input_key(b"one")
    assert first == container_base.input_key(b"one") != container_base.input_key(b"two")
    assert container_base.image_name(first) == f"kiln-base:debian12-{first}"
    argv = container_base.import_argv("kiln-base:debian12-x")
    assert argv[:2] == ["docker", "import"] and argv[-2:] == ["-", "kiln-base:debian12-x"]

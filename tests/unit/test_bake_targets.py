"""What differs between the bake's targets (bake.targets), one record each: the clouds add nothing to the tree,
the local VM refuses what its wheelhouse cannot carry, only the container image is pushed to a registry."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from bake import plan
from bake.targets import TARGETS, Prepared, still_there
from kiln.errors import UsageError


def test_every_provider_the_bake_takes_has_a_target_and_no_other():
    assert set(TARGETS) == set(plan.SOURCES)
    assert all(target.name == name for name, target in TARGETS.items())


@pytest.mark.parametrize("name", ["aws", "gcp", "azure"])
def test_a_clouds_bake_adds_nothing_to_the_fingerprint_or_to_packer(name, tmp_path):
    target = TARGETS[name]
    assert target.prepare("gpu", {}, None) == Prepared()
    with contextlib.ExitStack() as stack:
        assert target.variables(Prepared(), tmp_path, stack) == ({}, {})
    assert not target.reusable(tmp_path, "")
    (tmp_path / "image.json").write_text("{}")
    assert target.reusable(tmp_path, "")


def test_only_the_container_image_is_pushed():
    assert [name for name, target in TARGETS.items() if target.pushes] == ["docker"]


def test_the_local_vm_refuses_frameworks_its_wheelhouse_cannot_carry():
    TARGETS["local"].check({"tensorflow_version": "2.17.1"}, None)
    with pytest.raises(UsageError, match="frameworks_torch_version for PROVIDER=local"):
        TARGETS["local"].check({"frameworks_torch_version": "2.5.1"}, Path("matrices/pytorch-jax.yml"))
    TARGETS["docker"].check({"frameworks_torch_version": "2.5.1"}, None)


def test_a_container_bake_serves_its_wheelhouse_on_loopback_and_names_its_base(tmp_path):
    (tmp_path / "wheels").mkdir()
    prepared = Prepared({"base": "sha256:1"}, tmp_path / "wheels", base_image="kiln-base:debian12-1", pull=False)
    with contextlib.ExitStack() as stack:
        own, extra = TARGETS["docker"].variables(prepared, tmp_path, stack)
        assert own == {"docker_base_image": "kiln-base:debian12-1", "docker_pull": False}
        assert extra["kiln_image_target"] == "container"
        assert extra["tensorflow_wheelhouse_url"].startswith("http://127.0.0.1:")


def test_a_container_image_is_reused_only_while_its_tag_names_the_image_baked():
    """A kept record whose tag has since moved to another image (a bake elsewhere of the same inputs) is not
    reused: publishing it again would tag an image that is gone."""
    record = {"image": "kiln:cpu-ab", "image_id": "sha256:old"}
    assert still_there(record, {"Id": "sha256:old"})
    assert not still_there(record, {"Id": "sha256:new"})
    assert not still_there(record, None)

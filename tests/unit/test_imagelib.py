"""bake.plan: the pure half of `make image` (profiles, packer versions, fingerprint, argv)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bake import plan as imagelib
from bake.plan import Bake
from kiln.errors import UsageError


@pytest.mark.parametrize(("provider", "profile", "expected"), [
    ("local", None, "cpu"), ("aws", None, "gpu"), ("gcp", "cpu", "cpu"), ("azure", None, "gpu")])
def test_profile_defaults_per_provider(provider, profile, expected):
    assert imagelib.choose_profile(provider, profile) == expected


def test_unknown_provider_is_named_with_the_choices():
    with pytest.raises(UsageError, match=r"PROVIDER=openstack: choose one of aws, gcp, azure, local") as error:
        imagelib.choose_profile("openstack", None)
    assert error.value.exit_code == 2


def test_unknown_profile_is_refused():
    with pytest.raises(UsageError, match="PROFILE=tpu: choose gpu or cpu"):
        imagelib.choose_profile("aws", "tpu")


def test_cloud_builds_refuse_old_packer_but_local_builds_do_not():
    imagelib.check_packer_for("local", (1, 6, 6))
    imagelib.check_packer_for("aws", (1, 11, 2))
    with pytest.raises(UsageError, match=r"PROVIDER=gcp needs packer >= 1.7 \(this is 1.6.6\)"):
        imagelib.check_packer_for("gcp", (1, 6, 6))


def make_tree(root: Path) -> None:
    (root / "packer").mkdir(parents=True)
    (root / "ansible" / "roles" / "base").mkdir(parents=True)
    (root / "packer" / "build.pkr.hcl").write_text("build {}\n")
    (root / "ansible" / "roles" / "base" / "main.yml").write_text("---\n")
    (root / "ansible" / "__pycache__").mkdir()
    (root / "ansible" / "__pycache__" / "x.pyc").write_bytes(b"\0")


def test_fingerprint_is_stable_and_covers_every_input(tmp_path):
    make_tree(tmp_path)
    first = imagelib.fingerprint(tmp_path, "local", "cpu", {"base": "debian12-ab"})
    assert first == imagelib.fingerprint(tmp_path, "local", "cpu", {"base": "debian12-ab"})
    assert len(first) == 16 and int(first, 16) >= 0
    assert first != imagelib.fingerprint(tmp_path, "local", "gpu", {"base": "debian12-ab"})
    assert first != imagelib.fingerprint(tmp_path, "aws", "cpu", {"base": "debian12-ab"})
    assert first != imagelib.fingerprint(tmp_path, "local", "cpu", {"base": "debian12-cd"})
    (tmp_path / "ansible" / "roles" / "base" / "main.yml").write_text("---\n# changed\n")
    assert first != imagelib.fingerprint(tmp_path, "local", "cpu", {"base": "debian12-ab"})


def test_fingerprint_ignores_caches(tmp_path):
    make_tree(tmp_path)
    before = imagelib.fingerprint(tmp_path, "local", "cpu", {})
    (tmp_path / "ansible" / "__pycache__" / "x.pyc").write_bytes(b"\1")
    assert imagelib.fingerprint(tmp_path, "local", "cpu", {}) == before


def test_fingerprint_names_a_renamed_file_apart(tmp_path):
    make_tree(tmp_path)
    before = imagelib.fingerprint(tmp_path, "local", "cpu", {})
    (tmp_path / "packer" / "build.pkr.hcl").rename(tmp_path / "packer" / "other.pkr.hcl")
    assert imagelib.fingerprint(tmp_path, "local", "cpu", {}) != before


def test_output_dir_names_provider_profile_and_fingerprint():
    assert imagelib.output_dir(Path("/i"), "local", "cpu", "ab12") == Path("/i/local-cpu-ab12")


def test_packer_build_argv_selects_the_provider_source_in_var_file_order():
    bake = Bake("aws", "gpu", "ab12", Path("/i/aws-gpu-ab12"))
    var_files = [Path("vars/aws.pkrvars.hcl"), Path("/w/kiln.pkrvars.hcl")]
    argv = imagelib.packer_build_argv(bake, Path("/t/packer"), var_files)
    assert argv == ["packer", "build", "-only=amazon-ebs.gpu", "-var-file=vars/aws.pkrvars.hcl",
                    "-var-file=/w/kiln.pkrvars.hcl", "/t/packer"]

"""Static checks of packer/ (parsed with python-hcl2), the 1.6.6 compatibility stripping, and
bake.validate (scripts/packer-validate) run for real against the installed packer."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import hcl2
import pytest

from bake import packer as packer_compat
from bake.packer import CompatError, compat_tree, pkrvars, strip_modern, strip_modern_settings

ROOT = Path(__file__).resolve().parents[2]
PACKER = ROOT / "packer"

OPTIONS = hcl2.SerializationOptions(with_comments=False, explicit_blocks=False, strip_string_quotes=True)
TEMPLATE_FILES = sorted(PACKER.rglob("*.hcl"))


def load(name: str) -> dict:
    with (PACKER / name).open() as handle:
        return hcl2.load(handle, serialization_options=OPTIONS)


def source(name: str, kind: str, label: str) -> dict:
    return load(name)["source"][0][kind][label]


def variables() -> dict[str, dict]:
    return {name: body for block in load("variables.pkr.hcl")["variable"] for name, body in block.items()}


def provisioners() -> list[tuple[str, dict]]:
    build = load("build.pkr.hcl")["build"][0]
    return [(kind, body) for block in build["provisioner"] for kind, body in block.items()]


def locals_text() -> str:
    return (PACKER / "locals.pkr.hcl").read_text()


# --- the templates ----------------------------------------------------------------------


def test_the_build_lists_all_five_sources():
    builds = load("build.pkr.hcl")["build"]
    assert len(builds) == 1
    assert builds[0]["sources"] == [
        "source.amazon-ebs.gpu",
        "source.googlecompute.gpu",
        "source.azure-arm.gpu",
        "source.qemu.local",
        "source.docker.container",
    ]


def test_each_source_lives_in_its_own_file():
    assert list(load("source.aws.pkr.hcl")["source"][0]) == ["amazon-ebs"]
    assert list(load("source.gcp.pkr.hcl")["source"][0]) == ["googlecompute"]
    assert list(load("source.azure.pkr.hcl")["source"][0]) == ["azure-arm"]
    assert list(load("source.local.pkr.hcl")["source"][0]) == ["qemu"]
    assert list(load("source.docker.pkr.hcl")["source"][0]) == ["docker"]


def test_the_container_bake_commits_and_reaches_the_container_without_ssh():
    docker = source("source.docker.pkr.hcl", "docker", "container")
    assert docker["commit"] is True
    assert "--network=host" in docker["run_command"]
    assert "--entrypoint" not in " ".join(docker["run_command"]), "the committed image would keep that entrypoint"
    build = load("build.pkr.hcl")["build"][0]
    for provisioner in build["provisioner"]:
        if "ansible" in provisioner:
            assert "docker" in provisioner["ansible"]["inventory_file_template"]
    inventory = load("locals.pkr.hcl")["locals"][0]["docker_inventory"]
    assert "ansible_connection=docker" in inventory and "{{ .ID }}" in inventory

def test_aws_build_instance_requires_imdsv2_and_the_ami_too():
    aws = source("source.aws.pkr.hcl", "amazon-ebs", "gpu")
    assert aws["metadata_options"] == [
        {"http_endpoint": "enabled", "http_tokens": "required", "http_put_response_hop_limit": 1}
    ]
    assert aws["imds_support"] == "v2.0"


def test_aws_root_volume_and_ami_are_encrypted():
    aws = source("source.aws.pkr.hcl", "amazon-ebs", "gpu")
    (root,) = aws["launch_block_device_mappings"]
    assert root["encrypted"] is True
    assert root["device_name"] == "${local.aws.root}"
    assert aws["encrypt_boot"] is True
    assert aws["kms_key_id"] == root["kms_key_id"] == "${var.aws_kms_key_id}"


def test_aws_ssh_is_admitted_from_the_builders_address_only():
    aws = source("source.aws.pkr.hcl", "amazon-ebs", "gpu")
    assert aws["temporary_security_group_source_public_ip"] is True
    assert "temporary_security_group_source_cidrs" not in aws
    assert "security_group_id" not in aws and "security_group_ids" not in aws


@pytest.mark.parametrize("path", TEMPLATE_FILES, ids=lambda path: str(path.relative_to(PACKER)))
def test_no_template_opens_anything_to_the_world(path):
    text = path.read_text()
    assert "0.0.0.0/0" not in text
    assert "::/0" not in text


def test_aws_spot_build_is_optional_and_uses_the_spot_type_list():
    aws = source("source.aws.pkr.hcl", "amazon-ebs", "gpu")
    assert aws["spot_price"] == '${var.aws_spot ? "auto" : ""}'
    assert aws["spot_instance_types"] == "${var.aws_spot ? var.aws_spot_instance_types : []}"
    assert variables()["aws_spot"]["default"] is False


def test_aws_source_ami_comes_from_canonical_or_debian_by_filter():
    text = locals_text()
    canonical = r'name = "ubuntu/images/[^"]*{}-amd64-server-\*", owner = "099720109477"'
    assert re.search(r'"ubuntu-22\.04" += \{ ' + canonical.format(r"jammy-22\.04"), text)
    assert re.search(r'"ubuntu-24\.04" += \{ ' + canonical.format(r"noble-24\.04"), text)
    assert re.search(r'"debian-12" += \{ name = "debian-12-amd64-\*", owner = "136693071363", user = "admin"', text)
    aws = source("source.aws.pkr.hcl", "amazon-ebs", "gpu")
    (ami_filter,) = aws["source_ami_filter"]
    assert ami_filter["owners"] == ["${local.aws.owner}"]
    assert ami_filter["most_recent"] is True


def test_aws_image_and_build_instance_carry_the_kiln_tags():
    aws = source("source.aws.pkr.hcl", "amazon-ebs", "gpu")
    for key in ("tags", "run_tags", "snapshot_tags", "run_volume_tags"):
        assert aws[key] == "${local.tags}"
    text = locals_text()
    assert '"kiln:${trimsuffix(name, "_version")}" => version' in text
    assert '"kiln:profile"     = var.profile' in text
    assert '"kiln:fingerprint" = var.fingerprint' in text


def test_aws_default_build_instance_has_no_gpu():
    assert variables()["aws_instance_type"]["default"] == "c6i.2xlarge"


def test_gcp_builds_on_a_shielded_vm():
    gcp = source("source.gcp.pkr.hcl", "googlecompute", "gpu")
    assert gcp["enable_secure_boot"] == "${var.gcp_secure_boot}"
    assert variables()["gcp_secure_boot"]["default"] is True
    assert gcp["enable_vtpm"] is True
    assert gcp["enable_integrity_monitoring"] is True
    assert "UEFI_COMPATIBLE" in gcp["image_guest_os_features"]


def test_gcp_labels_are_converted_to_what_gcp_allows():
    gcp = source("source.gcp.pkr.hcl", "googlecompute", "gpu")
    assert gcp["image_labels"] == gcp["labels"] == "${local.labels}"
    assert gcp["image_family"] == "${var.image_name_prefix}-${var.profile}"
    assert 'regex_replace(lower(key), "[^a-z0-9_-]", "-")' in locals_text()
    assert 'regex_replace(lower(value), "[^a-z0-9_-]", "-")' in locals_text()


def test_azure_makes_a_linux_managed_image_with_an_optional_gallery():
    azure = source("source.azure.pkr.hcl", "azure-arm", "gpu")
    assert azure["os_type"] == "Linux"
    assert azure["managed_image_name"] == "${local.image_name}"
    assert azure["managed_image_resource_group_name"] == "${var.azure_resource_group}"
    gallery = azure["dynamic"][0]["shared_image_gallery_destination"]
    assert gallery["for_each"] == '${var.azure_gallery_name != "" ? [var.azure_gallery_name] : []}'
    assert azure["use_azure_cli_auth"] == "${var.azure_use_cli_auth}"


def test_azure_client_secret_is_sensitive():
    assert variables()["azure_client_secret"]["sensitive"] is True


def test_local_source_boots_the_base_disk_under_tcg():
    local = source("source.local.pkr.hcl", "qemu", "local")
    assert local["accelerator"] == "tcg"
    assert local["disk_image"] is True
    assert local["iso_url"] == "${var.local_base_disk}"
    assert local["format"] == "qcow2"
    assert local["disk_interface"] == "virtio"
    assert local["net_device"] == "virtio-net"
    assert local["headless"] is True
    assert local["ssh_username"] == "root"
    assert local["ssh_private_key_file"] == "${var.local_ssh_private_key_file}"
    assert local["qemuargs"] == "${local.local_qemuargs}"


def test_local_qemuargs_add_direct_kernel_boot_and_leave_packers_own_switches():
    text = locals_text()
    block = text[text.index("local_qemuargs = concat(") :]
    assert '["-kernel", var.local_kernel]' in block
    assert '["-initrd", var.local_initrd]' in block
    assert '["-append", "root=/dev/vda rw console=ttyS0 net.ifnames=0"]' in block
    assert '["-cpu", "max"]' in block
    for switch in ("-drive", "-netdev", "-device", "-machine", "-m", "-smp", "-boot"):
        assert f'["{switch}"' not in block


def test_every_variable_is_typed_and_described():
    for name, body in variables().items():
        assert body.get("type"), f"variable {name} has no type"
        assert body.get("description"), f"variable {name} has no description"


def test_cloud_inputs_carry_their_provider_prefix():
    common = {
        "profile",
        "fabric",
        "base_os",
        "image_name_prefix",
        "fingerprint",
        "versions",
        "ansible_playbook_command",
        "ansible_extra_vars",
        "ansible_directory",
        "output_directory",
    }
    for name in variables():
        assert name in common or name.split("_", 1)[0] in {"aws", "gcp", "azure", "local", "docker"}, name


@pytest.mark.parametrize("name", ["profile", "fabric", "base_os", "fingerprint", "versions", "image_name_prefix"])
def test_inputs_that_are_easy_to_get_wrong_are_validated(name):
    assert variables()[name].get("validation"), f"variable {name} has no validation"


def test_ansible_runs_the_bake_then_fetches_the_manifest_then_cleans():
    steps = [(kind, body.get("playbook_file") or body.get("source")) for kind, body in provisioners()]
    assert steps == [
        ("shell-local", None),
        ("ansible", "${local.ansible_directory}/image.yml"),
        ("file", "/etc/kiln/manifest.json"),
        ("ansible", "${local.ansible_directory}/cleanup.yml"),
        ("shell-local", None),
    ]
    download = dict(provisioners())["file"]
    assert download["direction"] == "download"
    assert download["destination"] == "${var.output_directory}/versions.json"
    assert '"${path.root}/../ansible"' in locals_text()


def test_ansible_connects_directly_with_one_json_extra_vars():
    for kind, body in provisioners():
        if kind == "ansible":
            assert body["use_proxy"] is False
            assert body["command"] == "${var.ansible_playbook_command}"
            assert body["extra_arguments"] == ["--extra-vars", "${local.ansible_extra_vars}"]
            assert body["ansible_env_vars"] == "${local.ansible_env_vars}"
    text = locals_text()
    assert "ansible_extra_vars = jsonencode(merge(var.ansible_extra_vars, {" in text
    assert "kiln_image_profile        = var.profile" in text
    assert "kiln_image_fabric         = var.fabric" in text
    assert '"ANSIBLE_CONFIG=${local.ansible_directory}/ansible.cfg"' in text


def test_ansible_never_disables_host_key_checking():
    lines = (line for path in TEMPLATE_FILES for line in path.read_text().splitlines())
    text = "\n".join(line for line in lines if not line.lstrip().startswith("#"))
    assert not re.search(r"host_key_checking\s*=\s*false|HOST_KEY_CHECKING=False", text, re.IGNORECASE)
    assert "StrictHostKeyChecking=no" not in text
    assert "UserKnownHostsFile=/dev/null" not in text
    for kind, body in provisioners():
        if kind == "ansible":
            assert "ssh_host_key_file" not in body and "ansible_ssh_extra_args" not in body


def test_ansible_pins_the_build_vm_host_key_in_a_per_build_file():
    text = locals_text()
    # Packer exports ANSIBLE_HOST_KEY_CHECKING=False itself; the extra var overrides it.
    assert 'ansible_host_key_checking = "true"' in text
    assert 'known_hosts_file = "${var.output_directory}/build-known-hosts"' in text
    assert (
        '"ANSIBLE_SSH_COMMON_ARGS=-o UserKnownHostsFile=${local.known_hosts_file} -o StrictHostKeyChecking=accept-new"'
        in text
    )
    first, *_, last = provisioners()
    fresh = ["mkdir -p '${var.output_directory}'", "rm -f '${local.known_hosts_file}'"]
    assert first == ("shell-local", {"inline": fresh})
    assert last == ("shell-local", {"inline": ["rm -f '${local.known_hosts_file}'"]})


def test_manifest_post_processor_records_profile_and_fingerprint():
    (block,) = load("build.pkr.hcl")["build"][0]["post-processor"]
    manifest = block["manifest"]
    assert manifest["output"] == "${var.output_directory}/packer-manifest.json"
    assert manifest["custom_data"]["profile"] == "${var.profile}"
    assert manifest["custom_data"]["fingerprint"] == "${var.fingerprint}"


def test_plugins_are_pinned_to_exact_versions():
    (packer_block,) = load("plugins/plugins.pkr.hcl")["packer"]
    (plugins,) = packer_block["required_plugins"]
    assert set(plugins) == {"amazon", "googlecompute", "azure", "qemu", "ansible"}
    for name, pin in plugins.items():
        assert pin["source"] == f"github.com/hashicorp/{name}"
        assert re.fullmatch(r"= \d+\.\d+\.\d+", pin["version"]), f"{name}: {pin['version']} is not an exact pin"
    assert packer_block["required_version"]


def test_plugin_pins_live_apart_from_the_templates():
    for path in PACKER.glob("*.pkr.hcl"):
        assert "required_plugins" not in path.read_text(), path.name


def test_each_provider_has_a_var_file_setting_its_profile():
    profiles = {}
    for provider in ("aws", "gcp", "azure", "local", "docker"):
        with (PACKER / "vars" / f"{provider}.pkrvars.hcl").open() as handle:
            profiles[provider] = hcl2.load(handle, serialization_options=OPTIONS)["profile"]
    assert profiles == {"aws": "gpu", "gcp": "gpu", "azure": "gpu", "local": "cpu", "docker": "cpu"}


def test_aws_bakes_efa_and_azure_infiniband_and_no_other_provider_a_fabric():
    fabrics = {}
    for provider in ("aws", "gcp", "azure", "local", "docker"):
        with (PACKER / "vars" / f"{provider}.pkrvars.hcl").open() as handle:
            fabrics[provider] = hcl2.load(handle, serialization_options=OPTIONS).get("fabric", "none")
    assert fabrics == {"aws": "efa", "gcp": "none", "azure": "infiniband", "local": "none", "docker": "none"}
    assert variables()["fabric"]["default"] == "none"


def test_only_known_settings_carry_the_modern_mark():
    marked = [
        f"{path.name}:{strip.name}"
        for path in TEMPLATE_FILES
        for strip in strip_modern_settings(path.read_text(), path.name)[1]
    ]
    assert marked == [
        "source.aws.pkr.hcl:temporary_security_group_source_public_ip",
        "source.aws.pkr.hcl:metadata_options",
        "source.aws.pkr.hcl:imds_support",
        "source.gcp.pkr.hcl:image_guest_os_features",
    ]


# --- strip_modern / compat_tree -----------------------------------------------------------

MARK = "# packer>=1.7"


def test_strip_removes_a_marked_attribute_line():
    text = f'source "x" "y" {{\n  a = 1\n  b = "v2.0" {MARK}\n  c = 3\n}}\n'
    assert strip_modern(text) == 'source "x" "y" {\n  a = 1\n  c = 3\n}\n'


def test_strip_removes_a_whole_marked_block_with_nested_braces():
    text = (
        'source "x" "y" {\n'
        "  a = 1\n"
        f"  opts {{ {MARK}\n"
        '    m = { k = "v" }\n'
        "    inner {\n"
        "      z = true\n"
        "    }\n"
        "  }\n"
        "  c = 3\n"
        "}\n"
    )
    assert strip_modern(text) == 'source "x" "y" {\n  a = 1\n  c = 3\n}\n'


def test_strip_ignores_brackets_in_strings_interpolations_and_comments():
    text = (
        "b {\n"
        f"  opts {{ {MARK}\n"
        '    s = "}}}"\n'
        '    t = "${merge({ a = "}" }, {})}"\n'
        "    # } a comment\n"
        "  }\n"
        "  kept = 1\n"
        "}\n"
    )
    assert strip_modern(text) == "b {\n  kept = 1\n}\n"


def test_strip_removes_a_marked_multi_line_list():
    text = f'b {{\n  features = [ {MARK}\n    "A",\n    "B",\n  ]\n  kept = 1\n}}\n'
    assert strip_modern(text) == "b {\n  kept = 1\n}\n"


def test_strip_removes_a_marked_heredoc_attribute():
    text = f"b {{\n  script = <<EOF {MARK}\n  }} not code\nEOF\n  kept = 1\n}}\n"
    assert strip_modern(text) == "b {\n  kept = 1\n}\n"


def test_strip_leaves_unmarked_text_alone():
    text = (PACKER / "source.local.pkr.hcl").read_text()
    assert strip_modern(text) == text


def test_strip_reports_what_it_removed_with_line_numbers():
    text = f"a = 1\nb = 2 {MARK}\nc {{ {MARK}\n  d = 4\n}}\n"
    stripped, removed = strip_modern_settings(text)
    assert stripped == "a = 1\n"
    assert removed == [packer_compat.Stripped(2, "b"), packer_compat.Stripped(3, "c")]


def test_a_marked_block_that_never_closes_is_an_error():
    with pytest.raises(CompatError, match=r"t\.pkr\.hcl:2: the marked setting never closes"):
        strip_modern_settings(f"a = 1\nb {{ {MARK}\n  c = 2\n", "t.pkr.hcl")


def test_a_mark_on_a_closing_line_is_an_error():
    with pytest.raises(CompatError, match=r"t\.pkr\.hcl:3: .* mark the opening line"):
        strip_modern_settings(f"b {{\n  c = 2\n}} {MARK}\n", "t.pkr.hcl")


def test_stripped_aws_source_keeps_every_other_security_setting():
    text = strip_modern((PACKER / "source.aws.pkr.hcl").read_text())
    aws = hcl2.loads(text, serialization_options=OPTIONS)["source"][0]["amazon-ebs"]["gpu"]
    assert {"metadata_options", "imds_support", "temporary_security_group_source_public_ip"}.isdisjoint(aws)
    assert aws["encrypt_boot"] is True
    assert aws["launch_block_device_mappings"][0]["encrypted"] is True


def test_compat_tree_copies_everything_and_strips_only_marked_settings(tmp_path):
    copy = tmp_path / "packer"
    report = compat_tree(PACKER, copy)
    assert report == [
        "source.aws.pkr.hcl:28 temporary_security_group_source_public_ip",
        "source.aws.pkr.hcl:31 metadata_options",
        "source.aws.pkr.hcl:36 imds_support",
        "source.gcp.pkr.hcl:28 image_guest_os_features",
    ]
    originals = sorted(path.relative_to(PACKER) for path in PACKER.rglob("*") if path.is_file())
    assert sorted(path.relative_to(copy) for path in copy.rglob("*") if path.is_file()) == originals
    for relative in originals:
        text = (copy / relative).read_text()
        assert MARK not in text.replace(f"`{MARK}`", "")
        if relative.name not in ("source.aws.pkr.hcl", "source.gcp.pkr.hcl"):
            assert text == (PACKER / relative).read_text()


# --- variable files and packer argv ---------------------------------------------------------


def test_pkrvars_renders_every_value_kind():
    text = pkrvars(
        {
            "fingerprint": "ab12",
            "spot": True,
            "cpus": 2,
            "types": ["c6i.2xlarge", "m6i.2xlarge"],
            "versions": {"tensorflow_version": "2.18.1"},
            "empty": {},
            "template": "${not-a-template}",
        }
    )
    assert text == (
        'fingerprint = "ab12"\n'
        "spot = true\n"
        "cpus = 2\n"
        'types = ["c6i.2xlarge", "m6i.2xlarge"]\n'
        'versions = { "tensorflow_version" = "2.18.1" }\n'
        "empty = {}\n"
        'template = "$${not-a-template}"\n'
    )


def test_pkrvars_output_parses_back_to_the_same_values():
    values = {"versions": {"cuda_version": "12.5.1", "quote": 'a "b"'}, "list": ["x"]}
    assert hcl2.loads(pkrvars(values), serialization_options=OPTIONS) == values


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("Packer v1.6.6\n", (1, 6, 6)),
        ("Packer v1.11.2\n\nYour version is out of date", (1, 11, 2)),
        ("1.14.1", (1, 14, 1)),
    ],
)
def test_packer_version_is_parsed(text, version):
    assert packer_compat.parse_packer_version(text) == version


def test_packer_1_7_is_the_first_modern_version():
    assert not packer_compat.is_modern((1, 6, 6))
    assert packer_compat.is_modern((1, 7, 0))
    assert packer_compat.is_modern((1, 14, 1))


def test_fmt_on_old_packer_checks_each_folder_without_recursive():
    assert packer_compat.fmt_argvs("packer", "p", modern=False, subdirs=["p/plugins", "p/vars"]) == [
        ["packer", "fmt", "-check", "p"],
        ["packer", "fmt", "-check", "p/plugins"],
        ["packer", "fmt", "-check", "p/vars"],
    ]
    assert packer_compat.fmt_argvs("packer", "p", modern=True, subdirs=["p/vars"]) == [
        ["packer", "fmt", "-check", "-recursive", "p"]
    ]


def test_validate_argv_names_the_provider_source_and_var_files_in_order():
    assert packer_compat.validate_argv("packer", "p", "local", ["p/vars/local.pkrvars.hcl", "/t/v.pkrvars.hcl"]) == [
        "packer",
        "validate",
        "-only=qemu.local",
        "-var-file=p/vars/local.pkrvars.hcl",
        "-var-file=/t/v.pkrvars.hcl",
        "p",
    ]


# --- the real packer ------------------------------------------------------------------------

needs_packer = pytest.mark.skipif(
    shutil.which("packer") is None, reason="packer is not on PATH (apt-get install packer)"
)


def run_validate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bake.validate", *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@needs_packer
def test_packer_validate_passes_for_all_five_sources():
    result = run_validate()
    assert result.returncode == 0, result.stdout + result.stderr
    for provider, name in packer_compat.SOURCES.items():
        assert f"validate {provider} ({name}): ok" in result.stdout


@needs_packer
def test_packer_validate_fails_with_packers_error_on_a_bad_template(tmp_path):
    copy = tmp_path / "packer"
    shutil.copytree(PACKER, copy)
    local = copy / "source.local.pkr.hcl"
    local.write_text(local.read_text().replace('accelerator = "tcg"', 'accelerator = "warp"'))
    result = run_validate("--only", "local", "--templates", str(copy))
    assert result.returncode == 1
    assert "local: packer validate failed" in result.stderr
    assert "accelerator" in result.stderr


@needs_packer
def test_packer_validate_fails_on_unformatted_templates(tmp_path):
    copy = tmp_path / "packer"
    shutil.copytree(PACKER, copy)
    build = copy / "build.pkr.hcl"
    build.write_text(build.read_text().replace("    use_proxy        = false", "    use_proxy = false", 1))
    result = run_validate("--only", "local", "--templates", str(copy))
    assert result.returncode == 1
    assert "not formatted" in result.stderr

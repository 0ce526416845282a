"""The GPU catalog (bootstrap.providers.catalog): what `kiln up --gpus MODEL:COUNT` finds on each cloud, the errors
that name what a cloud offers instead, and `kiln up --dry-run --gpus` / `kiln gpus` through the command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bootstrap.errors import UsageError
from bootstrap.providers import catalog
from bootstrap.providers.aws import plan as aws_plan
from bootstrap.providers.azure import plan as azure_plan
from bootstrap.providers.gcp import plan as gcp_plan

KILN = Path(sys.executable).with_name("kiln")
NAMING = {"aws": aws_plan.INSTANCE_TYPE, "gcp": gcp_plan.MACHINE_TYPE, "azure": azure_plan.VM_SIZE}


def kiln(*args: str, home: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(KILN), *args], cwd=home, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(home), "KILN_HOME": str(home / ".kiln")})


@pytest.mark.parametrize("cloud", catalog.CLOUDS)
def test_every_entry_is_a_type_its_provider_takes_once_with_a_source(cloud):
    machines = catalog.of_cloud(cloud)
    assert machines and catalog.SOURCES[cloud].startswith("https://")
    names = [machine.instance_type for machine in machines]
    assert len(names) == len(set(names)), names
    assert all(NAMING[cloud].fullmatch(name) for name in names), names
    assert all(machine.count > 0 and machine.memory_gb > 0 for machine in machines)


def test_each_providers_default_is_its_clouds_first_entry():
    assert aws_plan.DEFAULT_INSTANCE_TYPE == catalog.of_cloud("aws")[0].instance_type == "g6.xlarge"
    assert gcp_plan.DEFAULT_MACHINE_TYPE == "g2-standard-4" and azure_plan.DEFAULT_VM_SIZE == "Standard_NC24ads_A100_v4"


@pytest.mark.parametrize(("text", "cloud", "types"), [
    ("H100:8", "aws", ["p5.48xlarge"]),
    ("h200:8", "aws", ["p5en.48xlarge", "p5e.48xlarge"]),  # any case; the preferred type first
    ("H100:8", "gcp", ["a3-highgpu-8g", "a3-megagpu-8g"]),
    ("H100:8", "azure", ["Standard_ND96isr_H100_v5"]),
    ("L4", "gcp", ["g2-standard-4"]),  # no count: one
    ("A100-80GB:8", "azure", ["Standard_ND96amsr_A100_v4"]),
    ("A100:8", "aws", ["p4d.24xlarge"]),  # the 40 GB A100, not p4de's 80 GB
])
def test_gpus_find_the_types_that_carry_exactly_them(text, cloud, types):
    assert [machine.instance_type for machine in catalog.choose(text, cloud)] == types


@pytest.mark.parametrize(("text", "cloud", "said"), [
    ("H100:4", "aws", "--gpus H100:4: kiln's catalog has H100 on aws in machines of 8 (--instance-type"),
    ("T4:1", "aws", "--gpus T4:1: kiln's catalog has no T4 on aws; T4:1 is on azure"),
    ("L4:8", "azure", "--gpus L4:8: kiln's catalog has no L4 on azure; L4:8 is on aws, gcp"),
    ("H200:1", "gcp", "--gpus H200:1: kiln's catalog has H200 on gcp in machines of 8"),
    ("Z9:1", "aws", "--gpus Z9:1: no cloud kiln knows offers Z9; the GPUs: A10, A100,"),
    (":8", "aws", "no cloud kiln knows offers an unnamed GPU"),
    ("H100:0", "aws", "the count after ':' must be a whole number above 0"),
    ("H100:-1", "aws", "the count after ':' must be a whole number above 0"),
    ("H100:eight", "aws", "the count after ':' must be a whole number above 0"),
    ("H100:\u00b2", "aws", "the count after ':' must be a whole number above 0"),  # a digit to str.isdigit, not to int
])
def test_gpus_no_type_carries_are_refused_naming_what_the_clouds_offer(text, cloud, said):
    with pytest.raises(UsageError) as refused:
        catalog.choose(text, cloud)
    assert said in str(refused.value) and "\n" not in str(refused.value)


def test_up_dry_run_with_gpus_plans_the_catalogs_type(tmp_path):
    done = kiln("up", "big", "--gpus", "H100:8", "--count", "2", "--dry-run", "--ssh-cidr", "203.0.113.7/32",
                "--region", "us-east-1", home=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("--gpus H100:8: aws p5.48xlarge (kiln gpus lists the catalog)\n"), done.stdout
    assert '"InstanceType": "p5.48xlarge"' in done.stdout
    refused = kiln("up", "big", "--gpus", "H100:8", "--instance-type", "g6.xlarge", "--dry-run", "--ssh-cidr",
                   "203.0.113.7/32", home=tmp_path)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "give one" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_kiln_gpus_lists_the_catalog_by_cloud(tmp_path):
    listed = kiln("gpus", home=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[0] for line in listed.stdout.splitlines() if not line.startswith(" ")] == [
        *catalog.CLOUDS, "where"]
    assert listed.stdout.endswith("where each type is offered: not read yet (kiln gpus --refresh asks each cloud you "
                                  "have credentials for; an up --gpus with no place named asks the cloud it needs)\n")
    assert sum(line.startswith("  ") for line in listed.stdout.splitlines()) == len(catalog.MACHINES)
    one = kiln("gpus", "--provider", "azure", home=tmp_path)
    assert one.returncode == 0 and "Standard_ND96isr_H200_v5" in one.stdout and "p5.48xlarge" not in one.stdout
    bad = kiln("gpus", "--provider", "local", home=tmp_path)
    assert bad.returncode == 2 and "the catalog has aws, gcp, azure" in bad.stderr

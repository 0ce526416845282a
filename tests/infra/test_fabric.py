"""The GPU fabric: an image baked with a fabric's stack (its manifest's "fabric": efa on AWS, infiniband on Azure's
RDMA sizes) carries it at the matrix's version, and a host with the fabric's devices has them working: fi_info
finds libfabric's EFA provider on every EFA device, ibv_devinfo shows every InfiniBand HCA's port active. Each
check skips with its reason where the image has no fabric stack or the host no such device (this machine, a
cpu image, a GPU machine without a fabric)."""

from __future__ import annotations

import pytest
from kiln_infra import RDMA_LISTING, rdma_devices

from kiln.gpu import fabric as fabric_tools

pytestmark = pytest.mark.fabric

FI_INFO = "/opt/amazon/efa/bin/fi_info"
EFA_RECORD = "/opt/amazon/efa_installed_packages"


@pytest.fixture(scope="module")
def fabric(manifest) -> str:
    baked = manifest.get("fabric", "none")
    if baked == "none":
        pytest.skip("the image was baked without a fabric stack (its manifest says fabric: none)")
    return baked


@pytest.fixture(scope="module")
def devices(host, host_record) -> list[dict[str, str]]:
    found = rdma_devices(host.run(RDMA_LISTING).stdout)
    host_record["rdma"] = found
    return found


def test_the_efa_stack_is_the_matrix_s(host, fabric, matrix):
    if fabric != "efa":
        pytest.skip(f"the image's fabric is {fabric}, not EFA")
    record = host.file(EFA_RECORD)
    assert record.exists, f"{EFA_RECORD} is missing: the EFA installer did not run"
    assert record.content_string.splitlines()[0] == f"# EFA installer version: {matrix['efa_installer_version']}"
    assert host.file(FI_INFO).exists, f"{FI_INFO} is missing"
    folders = [line for line in host.file("/etc/ld.so.conf.d/kiln-ofi-nccl.conf").content_string.splitlines()
               if line.startswith("/")]
    assert any(host.file(f"{folder}/libnccl-net-ofi.so").exists for folder in folders), (
        f"no libnccl-net-ofi.so (aws-ofi-nccl) in the folders the dynamic linker is told of: {folders}")


def test_the_infiniband_stack_is_in_place(host, fabric):
    if fabric != "infiniband":
        pytest.skip(f"the image's fabric is {fabric}, not InfiniBand")
    for package in ("rdma-core", "ibverbs-providers", "ibverbs-utils", "infiniband-diags"):
        assert host.package(package).is_installed, f"{package} is not installed"
    assert "memlock    unlimited" in host.file("/etc/security/limits.d/kiln-rdma.conf").content_string
    for name in ("ndv4-topo.xml", "ndv5-topo.xml"):
        assert host.file(f"/opt/microsoft/{name}").exists, f"/opt/microsoft/{name} is missing"


@pytest.mark.machine
def test_every_efa_device_answers_to_libfabric(host, devices):
    efa = [device["name"] for device in devices if device["driver"] == "efa"]
    if not efa:
        pytest.skip("no EFA device on this host (/sys/class/infiniband lists none with the efa driver)")
    assert host.file(FI_INFO).exists, f"the host has EFA devices ({', '.join(efa)}) but no {FI_INFO}"
    listing = host.run(f"timeout 60 {FI_INFO} -p efa -t FI_EP_RDM")
    missing = fabric_tools.efa_missing(efa, listing.stdout)
    assert not missing, (f"libfabric's EFA provider does not open {', '.join(missing)}:\n"
                         f"{listing.stdout}{listing.stderr}")


@pytest.mark.machine
def test_every_infiniband_hca_is_up(host, devices):
    hcas = [device["name"] for device in devices if device["link_layer"] == "InfiniBand"]
    if not hcas:
        pytest.skip("no InfiniBand HCA on this host (/sys/class/infiniband lists none with an InfiniBand link)")
    assert host.exists("ibv_devinfo"), f"the host has InfiniBand HCAs ({', '.join(hcas)}) but no ibv_devinfo"
    shown = host.run("timeout 60 ibv_devinfo")
    problems = fabric_tools.ib_not_up(hcas, shown.stdout)
    assert not problems, "; ".join(problems) + f"\n{shown.stdout}{shown.stderr}"

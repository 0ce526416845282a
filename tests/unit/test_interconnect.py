"""The fabric a run's collectives use (bootstrap.interconnect): what the nodes' RDMA devices say, and what NCCL is
told. The device lists are what sysfs shows on these machines (node.py's `rdma` facts):
- p5.48xlarge: 32 EFA devices, rdmap*s* names (AWS, "Get started with EFA and NCCL": `fi_info -p efa` lists
  one efa domain per device, rdmap79s0-rdm ...);
- Standard_ND96isr_H100_v5: 8 InfiniBand HCAs mlx5_ib0-7 and the accelerated-networking NIC mlx5_an0, whose link
  layer is Ethernet (Azure, "InfiniBand on HPC VMs"; `ibv_devinfo` shows link_layer InfiniBand for the eight);
  its image carries /opt/microsoft/ndv5-topo.xml (azhpc-images)."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from bootstrap import interconnect, launch
from bootstrap import node as node_side
from bootstrap.errors import UsageError

UP, DOWN = "4: ACTIVE", "1: DOWN"


def efa_facts(count=32, state=UP):
    return {"rdma": [{"name": f"rdmap{79 + i}s0", "driver": "efa", "link_layer": "Unspecified", "state": state}
                     for i in range(count)]}


def nd_facts(down=()):
    hcas = [{"name": f"mlx5_ib{i}", "driver": "mlx5_core", "link_layer": "InfiniBand",
             "state": DOWN if i in down else UP} for i in range(8)]
    return {"rdma": [{"name": "mlx5_an0", "driver": "mlx5_core", "link_layer": "Ethernet", "state": UP}, *hcas],
            "nccl_topology": ["/opt/microsoft/ndv5-topo.xml", "/opt/microsoft/ndv4-topo.xml"], "gpu_pci": ["2330"] * 8}


def test_a_node_s_fabric_is_read_from_its_rdma_devices():
    assert interconnect.of_node(efa_facts(4)) == interconnect.NodeFabric(
        "efa", ("rdmap79s0", "rdmap80s0", "rdmap81s0", "rdmap82s0"))
    nd = interconnect.of_node(nd_facts(down=(7,)))
    assert nd.kind == "ib" and nd.devices == tuple(f"mlx5_ib{i}" for i in range(7)) and nd.down == ("mlx5_ib7",)
    assert nd.topology == "/opt/microsoft/ndv5-topo.xml"
    assert interconnect.of_node({"rdma": []}) == interconnect.NodeFabric()
    assert interconnect.of_node({}) == interconnect.NodeFabric(), "facts of an older node.py"


def test_the_topology_file_is_the_one_made_for_the_node_s_gpus():
    """The image carries the files of every ND size (the infiniband role); each machine gets its own."""
    both = ["/opt/microsoft/ndv5-topo.xml", "/opt/microsoft/ndv4-topo.xml"]
    assert interconnect.topology_of({"nccl_topology": both, "gpu_pci": ["2335"] * 8}) == both[0]  # ND H200 v5
    assert interconnect.topology_of({"nccl_topology": both, "gpu_pci": ["20b2"] * 8}) == both[1]  # ND A100 v4
    assert interconnect.topology_of({"nccl_topology": both[:1], "gpu_pci": ["20b0"] * 8}) == ""  # not its file
    assert interconnect.topology_of({"nccl_topology": both, "gpu_pci": ["2330", "20b0"]}) == ""  # mixed: none fits
    assert interconnect.topology_of({"nccl_topology": both}) == "", "facts of an older node.py: no GPU ids"


def test_every_node_with_efa_up_runs_nccl_over_the_ofi_plugin():
    nodes = [(f"node{i}", interconnect.of_node(efa_facts())) for i in (1, 2)]
    choice = interconnect.choose(nodes)
    assert choice.kind == "efa"
    assert choice.env == {"NCCL_NET": "AWS Libfabric", "NCCL_NET_PLUGIN": "ofi", "FI_PROVIDER": "efa",
                          "FI_EFA_FORK_SAFE": "1", "RDMAV_FORK_SAFE": "1"}
    assert choice.note == "fabric: EFA (32 device(s) per node), NCCL over AWS Libfabric"


def test_every_node_with_infiniband_runs_nccl_ib_on_the_hcas_all_have_up():
    nodes = [("node1", interconnect.of_node(nd_facts())), ("node2", interconnect.of_node(nd_facts(down=(3,))))]
    choice = interconnect.choose(nodes)
    assert choice.kind == "ib"
    assert choice.env == {"NCCL_NET": "IB", "NCCL_IB_DISABLE": "0", "NCCL_IB_PCI_RELAXED_ORDERING": "1",
                          "NCCL_IB_HCA": "=mlx5_ib0,mlx5_ib1,mlx5_ib2,mlx5_ib4,mlx5_ib5,mlx5_ib6,mlx5_ib7",
                          "NCCL_TOPO_FILE": "/opt/microsoft/ndv5-topo.xml"}
    assert "mlx5_an0" not in choice.env["NCCL_IB_HCA"], "the Ethernet NIC is not an IB HCA"
    assert choice.note == ("fabric: InfiniBand (7-8 device(s) per node), NCCL over IB, "
                           "topology /opt/microsoft/ndv5-topo.xml")


def test_a_node_without_the_fabric_makes_the_run_use_sockets_and_says_which():
    nodes = [("node1", interconnect.of_node(efa_facts())), ("node2", interconnect.of_node(efa_facts())),
             ("node3", interconnect.of_node(efa_facts(state=DOWN)))]
    choice = interconnect.choose(nodes)
    assert choice.kind == "" and choice.env == {}
    assert choice.note.startswith("fabric: TCP sockets: node3 has no EFA device up where node1, node2 have")
    assert "node3: rdmap79s0" in choice.note and "down" in choice.note


def test_no_fabric_anywhere_changes_nothing_and_says_nothing():
    assert interconnect.choose([("a", interconnect.NodeFabric()), ("b", interconnect.NodeFabric())]) == \
        interconnect.Choice("")


def test_a_fabric_asked_for_is_refused_naming_the_nodes_that_lack_it():
    nodes = [("node1", interconnect.of_node(efa_facts())), ("node2", interconnect.NodeFabric())]
    with pytest.raises(UsageError, match=r"^--fabric efa: node2 has no EFA device up$"):
        interconnect.choose(nodes, "efa")
    with pytest.raises(UsageError, match=r"^--fabric ib: node1, node2 have no InfiniBand device up$"):
        interconnect.choose(nodes, "ib")
    with pytest.raises(UsageError, match=r"^--fabric 'rdma': choose auto, efa, ib, socket$"):
        interconnect.choose(nodes, "rdma")
    assert interconnect.choose(nodes[:1], "efa").kind == "efa"


def test_socket_is_forced_even_over_a_fabric():
    nodes = [("node1", interconnect.of_node(efa_facts())), ("node2", interconnect.of_node(efa_facts()))]
    choice = interconnect.choose(nodes, "socket")
    assert choice.env == {"NCCL_NET": "Socket", "NCCL_IB_DISABLE": "1"}
    assert choice.note == "fabric: TCP sockets (--fabric socket), though every node has EFA"
    assert interconnect.planned("socket").env == choice.env
    assert "found from their RDMA devices at run time" in interconnect.planned("auto").note


def test_every_process_of_a_plan_gets_the_fabric_and_the_placement_says_it():
    nodes = [(name, interconnect.of_node(efa_facts(4))) for name in ("n1", "n2")]
    spec = launch.RunSpec("r", "torchrun", ("n1", "n2"), (None, None), "/v/bin/python", "/h/kiln",
                          launch.Program(("python", "t.py")), nic="eth0", gpus=(8, 8),
                          fabric=interconnect.choose(nodes))
    plan = launch.plan_run(spec)
    assert all(item.env["NCCL_NET"] == "AWS Libfabric" and item.env["FI_PROVIDER"] == "efa"
               for item in plan.launches)
    assert plan.placement.splitlines()[-1] == "fabric: EFA (4 device(s) per node), NCCL over AWS Libfabric"
    plain = launch.plan_run(replace(spec, fabric=interconnect.Choice("")))
    assert all("NCCL_NET" not in item.env for item in plain.launches)


def test_the_node_reads_its_rdma_devices_from_sysfs(tmp_path):
    drivers = tmp_path / "drivers"
    for name, driver, layer, state in (("mlx5_ib0", "mlx5_core", "InfiniBand", UP),
                                       ("rdmap79s0", "efa", "Unspecified", DOWN)):
        port = tmp_path / "class" / name / "ports" / "1"
        port.mkdir(parents=True)
        (port / "link_layer").write_text(layer + "\n")
        (port / "state").write_text(state + "\n")
        (drivers / driver).mkdir(parents=True, exist_ok=True)
        (tmp_path / "class" / name / "device").mkdir()
        os.symlink(drivers / driver, tmp_path / "class" / name / "device" / "driver")
    assert node_side.rdma_devices(str(tmp_path / "class")) == [
        {"name": "mlx5_ib0", "driver": "mlx5_core", "link_layer": "InfiniBand", "state": UP},
        {"name": "rdmap79s0", "driver": "efa", "link_layer": "Unspecified", "state": DOWN}]
    assert node_side.rdma_devices(str(tmp_path / "none")) == []


def test_the_node_reads_its_gpus_pci_ids_from_sysfs(tmp_path):
    for address, vendor, klass, device in (("0001:00:00.0", "0x10de", "0x030200", "0x2330"),  # H100 SXM5
                                           ("0101:00:00.0", "0x15b3", "0x020700", "0x101e"),  # ConnectX-7 (IB)
                                           ("0000:00:08.0", "0x10de", "0x068000", "0x22a3")):  # NVSwitch bridge
        folder = tmp_path / address
        folder.mkdir()
        for name, value in (("vendor", vendor), ("class", klass), ("device", device)):
            (folder / name).write_text(value + "\n")
    assert node_side.gpu_pci_devices(str(tmp_path)) == ["2330"]
    assert node_side.gpu_pci_devices(str(tmp_path / "none")) == []

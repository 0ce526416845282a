"""kiln.gpu.fabric against the fabric tools' recorded outputs (tests/unit/data/gpu/SOURCES.md names each)."""

from __future__ import annotations

from pathlib import Path

from kiln.gpu import fabric

DATA = Path(__file__).parent / "data" / "gpu"
P4DE = ["rdmap16s27", "rdmap32s27", "rdmap144s27", "rdmap160s27"]
ND_HCAS = [f"mlx5_ib{i}" for i in range(8)]


def test_fi_info_lists_the_p4de_s_four_efa_devices():
    listing = (DATA / "fi-info-efa-p4de.txt").read_text()
    assert fabric.efa_devices(listing) == P4DE
    assert fabric.efa_missing(P4DE, listing) == []
    assert fabric.efa_missing([*P4DE, "rdmap176s27"], listing) == ["rdmap176s27"]


def test_no_efa_device_answers_where_fi_info_finds_no_data():
    assert fabric.efa_devices("fi_getinfo: -61 (No data available)\n") == []
    assert fabric.efa_missing(P4DE[:1], "fi_getinfo: -61 (No data available)\n") == P4DE[:1]
    tcp = "provider: tcp\n    fabric: 10.0.0.0/24\n    domain: eth0\n"
    assert fabric.efa_devices(tcp) == [], "another provider's domains are not EFA devices"


def test_ibv_devinfo_of_an_nd_h200_v5_shows_eight_active_hcas_and_an_ethernet_nic():
    shown = (DATA / "ibv-devinfo-nd-h200-v5.txt").read_text()
    ports = fabric.ib_ports(shown)
    assert list(ports) == [*ND_HCAS, "mlx5_an0"]
    assert all(ports[name] == {"state": "PORT_ACTIVE", "link_layer": "InfiniBand"} for name in ND_HCAS)
    assert ports["mlx5_an0"]["link_layer"] == "Ethernet"
    assert fabric.ib_not_up(ND_HCAS, shown) == []


def test_an_hca_whose_port_is_down_or_missing_is_named():
    shown = (DATA / "ibv-devinfo-nd-h200-v5.txt").read_text()
    down = shown.replace("PORT_ACTIVE (4)", "PORT_DOWN (1)", 4)  # the first four HCAs lose their link
    assert fabric.ib_not_up(ND_HCAS, down) == [f"mlx5_ib{i}: PORT_DOWN on InfiniBand" for i in range(4)]
    assert fabric.ib_not_up(["mlx5_ib9"], shown) == ["mlx5_ib9: not shown by ibv_devinfo"]
    assert fabric.ib_not_up(["mlx5_an0"], shown) == ["mlx5_an0: PORT_ACTIVE on Ethernet"]


def test_the_recorded_machines_get_nccl_s_environment_for_their_fabric():
    """From what each machine's own tools showed to what NCCL is told (bootstrap/interconnect.py): the facts a node
    of each kind gathers (its sysfs devices) are built here from the recording."""
    from bootstrap import interconnect

    shown = fabric.ib_ports((DATA / "ibv-devinfo-nd-h200-v5.txt").read_text())
    nd = {"rdma": [{"name": name, "driver": "mlx5_core", "link_layer": port["link_layer"],
                    "state": "4: ACTIVE" if port["state"] == "PORT_ACTIVE" else "1: DOWN"}
                   for name, port in shown.items()],
          "nccl_topology": ["/opt/microsoft/ndv5-topo.xml", "/opt/microsoft/ndv4-topo.xml"],
          "gpu_pci": ["2335"] * 8}  # ND H200 v5
    ib = interconnect.choose([(f"node{i}", interconnect.of_node(nd)) for i in (1, 2)])
    assert ib.kind == "ib" and ib.env["NCCL_IB_HCA"] == "=" + ",".join(ND_HCAS), "mlx5_an0 (Ethernet) left out"
    assert ib.env["NCCL_TOPO_FILE"] == "/opt/microsoft/ndv5-topo.xml"
    p4de = {"rdma": [{"name": name, "driver": "efa", "link_layer": "Unspecified", "state": "4: ACTIVE"}
                     for name in fabric.efa_devices((DATA / "fi-info-efa-p4de.txt").read_text())]}
    efa = interconnect.choose([(f"node{i}", interconnect.of_node(p4de)) for i in (1, 2)])
    assert efa.kind == "efa" and efa.env["FI_PROVIDER"] == "efa" and efa.env["NCCL_NET_PLUGIN"] == "ofi"
    assert efa.note == "fabric: EFA (4 device(s) per node), NCCL over AWS Libfabric"

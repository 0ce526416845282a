"""The Azure provider's plan (bootstrap/providers/azure/plan.py): what `kiln up --provider azure` asks Azure
Resource Manager for, checked for exact output without touching it."""

from __future__ import annotations

import base64
from datetime import UTC, datetime

import pytest

from bootstrap.errors import UsageError
from bootstrap.providers import common
from bootstrap.providers.azure import plan

NOW = datetime(2026, 11, 26, 8, 0, tzinfo=UTC)
SUB = "00000000-0000-0000-0000-000000000000"
IMAGE = f"/subscriptions/{SUB}/resourceGroups/kiln-images/providers/Microsoft.Compute/images/kiln-gpu-ab12"


def request(**changes):
    given = {"location": "eastus", "ssh_cidr": "203.0.113.7/32", **changes}
    return plan.validate_request(given.pop("name", "c1"), given.pop("count", 2), given.pop("vm_size", None), **given)


def test_a_request_takes_a_current_gpu_size_by_default():
    made = request(image_tags="kiln:fingerprint=ab12")
    assert (made.vm_size, made.user, made.image_tags) == ("Standard_NC24ads_A100_v4", "azureuser",
                                                          (("kiln:fingerprint", "ab12"),))
    assert plan.image_matches({"kiln:profile": "gpu", "kiln:fingerprint": "ab12"}, "gpu", made.image_tags)
    assert not plan.image_matches({"kiln:profile": "gpu", "kiln:fingerprint": "cd34"}, "gpu", made.image_tags)


@pytest.mark.parametrize(("changes", "said"), [
    ({"location": None}, "give --location"),
    ({"location": "East US"}, "--location 'East US' is not an Azure region name"),
    ({"vm_size": "g6.xlarge"}, "--instance-type 'g6.xlarge' is not an Azure VM size"),
    ({"image_id": "kiln-gpu"}, "--image-id 'kiln-gpu': give a managed image's id"),
    ({"max_price": 1}, "--max-price applies to Spot VMs only"),
    ({"spot": True, "max_price": "free"}, "--max-price 'free' is not a positive price"),
    ({"spot": True, "max_price": "nan"}, "--max-price 'nan' is not a positive price"),
    ({"user": "root"}, "--user 'root' is not a login name Azure takes"),
    ({"ssh_cidr": "0.0.0.0/0"}, "too broad"),
    ({"count": 0}, "--count 0"),
])
def test_bad_input_is_one_line_naming_it(changes, said):
    with pytest.raises(UsageError, match=said.replace("(", r"\(")):
        request(**changes)


def test_the_security_group_admits_ssh_from_the_operator_and_the_cluster_to_itself():
    rules = plan.security_group_body(request(), {})["properties"]["securityRules"]
    assert [(r["name"], r["properties"]["sourceAddressPrefix"], r["properties"]["destinationPortRange"])
            for r in rules] == [("kiln-ssh", "203.0.113.7/32", "22"), ("kiln-cluster", plan.SUBNET, "*")]
    assert all(r["properties"]["access"] == "Allow" and r["properties"]["direction"] == "Inbound" for r in rules)


def test_a_vm_has_the_clusters_key_only_boot_diagnostics_and_spot_deleted_when_evicted():
    made = request(spot=True, max_price=2.5, volume_gb=50)
    body = plan.vm_body(made, index=1, image_id=IMAGE, public_key="ssh-ed25519 AAAAkey",
                        tags={"kiln:cluster": "c1"}, interface_id="/nic", placement_id="/ppg", data_disk_id="/disk")
    properties = body["properties"]
    linux = properties["osProfile"]["linuxConfiguration"]
    assert linux["disablePasswordAuthentication"] and linux["ssh"]["publicKeys"] == [
        {"path": "/home/azureuser/.ssh/authorized_keys", "keyData": "ssh-ed25519 AAAAkey"}]
    assert properties["diagnosticsProfile"] == {"bootDiagnostics": {"enabled": True}}
    assert (properties["priority"], properties["evictionPolicy"], properties["billingProfile"]) == (
        "Spot", "Delete", {"maxPrice": 2.5})
    assert properties["storageProfile"]["dataDisks"] == [{"lun": 0, "createOption": "Attach",
                                                          "deleteOption": "Detach", "managedDisk": {"id": "/disk"}}]
    assert properties["storageProfile"]["osDisk"]["deleteOption"] == "Delete"
    assert common.DATA_SETTINGS in base64.b64decode(properties["osProfile"]["customData"]).decode()
    assert body["tags"] == {"kiln:cluster": "c1", "kiln:node": "1"}
    plain = plan.vm_body(request(), index=0, image_id=IMAGE, public_key="k", tags={}, interface_id="/nic",
                         placement_id="/ppg")["properties"]
    assert "priority" not in plain and "customData" not in plain["osProfile"]


def test_an_autostopping_vm_has_its_own_identity_allowed_to_deallocate_it_alone():
    body = plan.vm_body(request(idle_minutes=30), index=0, image_id=IMAGE, public_key="k", tags={},
                        interface_id="/nic", placement_id="/ppg", identity=True)
    assert body["identity"] == {"type": "SystemAssigned"}
    assert "identity" not in plan.vm_body(request(), index=0, image_id=IMAGE, public_key="k", tags={},
                                          interface_id="/nic", placement_id="/ppg")
    vm = f"/subscriptions/{SUB}/resourceGroups/kiln-c1/providers/Microsoft.Compute/virtualMachines/kiln-c1-0"
    name, assignment = plan.self_deallocation(SUB, vm, "p-1")
    assert assignment["properties"] == {
        "roleDefinitionId": f"/subscriptions/{SUB}/providers/Microsoft.Authorization/roleDefinitions/"
                            "40c5ff49-9181-41f8-ae61-143b0e78555e",
        "principalId": "p-1", "principalType": "ServicePrincipal",
        "description": "kiln autostop: the VM may deallocate itself"}
    assert plan.SUBSCRIPTION.fullmatch(name)  # a GUID, as ARM wants it
    assert plan.self_deallocation(SUB, vm.upper(), "p-1")[0] == name  # arming again asks for the same one
    assert plan.self_deallocation(SUB, vm, "p-2")[0] != name  # a new VM's identity gets its own
    assert [plan.has_system_identity(t) for t in ("SystemAssigned", "SystemAssigned, UserAssigned", "UserAssigned",
                                                  "None", None)] == [True, True, False, False, False]


def sku(name: str, location: str = "eastus", restriction: str = "", kind: str = "virtualMachines", **capabilities):
    given = {"GPUs": "1", "AcceleratedNetworkingEnabled": "True", "PremiumIO": "True", "LowPriorityCapable": "True"}
    return {"resourceType": kind, "name": name, "locations": [location],
            "capabilities": [{"name": k, "value": v} for k, v in {**given, **capabilities}.items()],
            "restrictions": [{"type": "Location", "values": [location], "reasonCode": restriction}]
            if restriction else [{"type": "Zone", "values": [location], "reasonCode": "NotAvailableForSubscription"}]}


def test_the_size_asked_for_must_be_offered_open_premium_and_spot_capable_where_asked():
    sizes = plan.size_facts([
        sku("Standard_NC24ads_A100_v4"), sku("Standard_NC40ads_H100_v5", restriction="NotAvailableForSubscription"),
        sku("Standard_B2s", GPUs="0", AcceleratedNetworkingEnabled="False", LowPriorityCapable="False"),
        sku("Standard_NC4as_T4_v3", location="westus2"), sku("Premium_LRS", kind="disks"),
        sku("Standard_A1", PremiumIO="False", GPUs="0")], "eastus")
    assert sorted(sizes) == ["Standard_A1", "Standard_B2s", "Standard_NC24ads_A100_v4", "Standard_NC40ads_H100_v5"]
    assert plan.check_size(request(), sizes) == plan.SizeFacts("Standard_NC24ads_A100_v4", 1, True, True, True)
    assert plan.check_size(request(vm_size="Standard_B2S"), sizes).accelerated_networking is False
    for changes, said in (
            ({"vm_size": "Standard_NC4as_T4_v3"}, "--instance-type Standard_NC4as_T4_v3: not offered in eastus; GPU "
                                                  "sizes open to you there: Standard_NC24ads_A100_v4"),
            ({"vm_size": "Standard_NC40ads_H100_v5"}, "--instance-type Standard_NC40ads_H100_v5: not open to this "
                                                      "subscription in eastus (NotAvailableForSubscription); ask "
                                                      "Azure for access, or try another --location"),
            ({"vm_size": "Standard_A1"}, "--instance-type Standard_A1: takes no Premium SSD disks, which kiln's are"),
            ({"vm_size": "Standard_B2s", "spot": True}, "--spot: Standard_B2s cannot run as a Spot VM")):
        with pytest.raises(UsageError) as refused:
            plan.check_size(request(**changes), sizes)
        assert str(refused.value) == said
    body = plan.interface_body(request(), {}, subnet_id="/s", address_id="/a", accelerated=False)
    assert body["properties"]["enableAcceleratedNetworking"] is False


def test_a_disk_comes_back_from_a_snapshot_never_smaller_and_a_snapshot_keeps_the_node():
    body = plan.disk_body(request(volume_gb=10), index=1, tags={"kiln:cluster": "c1"}, snapshot_id="/snap",
                          snapshot_gb=50)
    assert body["properties"] == {"creationData": {"createOption": "Copy", "sourceResourceId": "/snap"},
                                  "diskSizeGB": 50}
    assert body["tags"]["kiln:data"] == "1"
    snap = plan.snapshot_body("/disk", "eastus", {"kiln:cluster": "c1", "kiln:data": "1", "other": "x"}, NOW, 30)
    assert snap["tags"] == {"kiln:cluster": "c1", "kiln:data": "1", "kiln:snapshot-set": "2026-11-26T08:00:00Z",
                            "kiln:expires": "2026-12-26T08:00:00Z"}
    assert plan.snapshot_name("kiln-c1-data-1", "2026-11-26T08:00:00Z") == "kiln-c1-data-1-20261126t080000z"


def test_names_ids_and_tags():
    assert plan.group_name("c1") == "kiln-c1" and plan.vm_name("c1", 2, "ab") == "kiln-c1-2-ab"
    assert plan.resource_id(SUB, "kiln-c1", "Microsoft.Compute/disks", "d") == (
        f"/subscriptions/{SUB}/resourceGroups/kiln-c1/providers/Microsoft.Compute/disks/d")
    assert plan.cluster_tags("c1", "me", NOW, 2)[plan.TAG_EXPIRES] == "2026-11-26T10:00:00Z"
    assert plan.IMAGE_ID.fullmatch(IMAGE) and plan.IMAGE_ID.fullmatch(
        f"/subscriptions/{SUB}/resourceGroups/g/providers/Microsoft.Compute/galleries/kiln/images/gpu/versions/latest")


def retail_item(size, sku_name, product, price, unit="1 Hour"):
    """One item as Azure's Retail Prices API answers (its documented sample's fields)."""
    return {"currencyCode": "USD", "retailPrice": price, "unitPrice": price, "armRegionName": "eastus",
            "location": "US East", "meterName": sku_name, "productName": product, "skuName": sku_name,
            "serviceName": "Virtual Machines", "unitOfMeasure": unit, "type": "Consumption", "armSkuName": size}


def test_the_spot_price_is_the_linux_spot_meter_of_each_size():
    items = [retail_item("Standard_NC4as_T4_v3", "NC4as T4 v3", "Virtual Machines NCasT4 v3 Series", 0.526),
             retail_item("Standard_NC4as_T4_v3", "NC4as T4 v3 Spot", "Virtual Machines NCasT4 v3 Series", 0.21),
             retail_item("Standard_NC4as_T4_v3", "NC4as T4 v3 Spot", "Virtual Machines NCasT4 v3 Series Windows",
                         0.19),
             retail_item("Standard_NC4as_T4_v3", "NC4as T4 v3 Low Priority", "Virtual Machines NCasT4 v3 Series",
                         0.1),
             retail_item("Standard_NC4as_T4_v3", "NC4as T4 v3", "Virtual Machines NCasT4 v3 Series Windows", 0.4),
             retail_item("Standard_NC8as_T4_v3", "NC8as T4 v3 Spot", "Virtual Machines NCasT4 v3 Series", 0.3),
             retail_item("Standard_NC8as_T4_v3", "NC8as T4 v3 Spot", "Virtual Machines NCasT4 v3 Series", 9.0,
                         unit="1/Month")]
    assert plan.lowest_prices(items, spot=True) == {"Standard_NC4as_T4_v3": 0.21, "Standard_NC8as_T4_v3": 0.3}
    assert plan.lowest_prices([], spot=True) == {}
    # pay-as-you-go: the Linux meter that is neither Spot nor Low Priority
    assert plan.lowest_prices(items, spot=False) == {"Standard_NC4as_T4_v3": 0.526}
    assert plan.lowest_prices_by_place(items, spot=False) == {("Standard_NC4as_T4_v3", "eastus"): 0.526}


def test_the_price_filter_names_one_size_in_one_location_and_refuses_anything_else():
    assert plan.price_filter("eastus", "Standard_NC4as_T4_v3") == (
        "serviceName eq 'Virtual Machines' and armRegionName eq 'eastus' and armSkuName eq 'Standard_NC4as_T4_v3' "
        "and priceType eq 'Consumption'")
    with pytest.raises(UsageError, match="not a VM size and a location"):
        plan.price_filter("eastus", "Standard_X' or serviceName eq 'Storage")
    with pytest.raises(UsageError, match="not a VM size and a location"):
        plan.price_filter("east' or 'x", "Standard_NC4as_T4_v3")
    assert plan.price_filter(None, "Standard_NC4as_T4_v3") == (  # every location's
        "serviceName eq 'Virtual Machines' and armSkuName eq 'Standard_NC4as_T4_v3' and priceType eq 'Consumption'")


@pytest.mark.parametrize(("size", "rdma"), [
    ("Standard_ND96isr_H100_v5", True), ("Standard_ND96isr_H200_v5", True), ("Standard_ND96asr_v4", True),
    ("Standard_ND96amsr_A100_v4", True), ("Standard_HB120-96rs_v3", True), ("Standard_HC44rs", True),
    ("Standard_NC24ads_A100_v4", False), ("Standard_NC80adis_H100_v5", False), ("Standard_NC4as_T4_v3", False),
    ("Standard_D4s_v5", False), ("Standard_B2s", False), ("ND96isr", False),
])
def test_an_rdma_size_is_one_whose_name_has_the_r_feature_letter(size, rdma):
    assert plan.rdma_by_name(size) is rdma


def test_the_skus_rdma_capability_decides_and_the_name_speaks_where_it_is_silent():
    sizes = plan.size_facts([
        sku("Standard_ND96isr_H100_v5", GPUs="8", RdmaEnabled="True"),
        sku("Standard_ND96isr_H200_v5", GPUs="8"),  # no word on RDMA: its name says it
        sku("Standard_HC44rs", GPUs="0", RdmaEnabled="False"),  # the capability wins over the name
        sku("Standard_NC24ads_A100_v4")], "eastus")
    assert {name: facts.rdma for name, facts in sizes.items()} == {
        "Standard_ND96isr_H100_v5": True, "Standard_ND96isr_H200_v5": True, "Standard_HC44rs": False,
        "Standard_NC24ads_A100_v4": False}


def test_an_rdma_size_gets_a_flexible_scale_set_on_one_fabric_and_each_vm_joins_it():
    made = request(vm_size="Standard_ND96isr_H100_v5")
    tags = {"kiln:cluster": "c1"}
    ppg = plan.resource_id(SUB, "kiln-c1", "Microsoft.Compute/proximityPlacementGroups", "kiln-c1-ppg")
    assert plan.scale_set_name("c1") == "kiln-c1-vmss"
    assert plan.scale_set_body(made, tags, ppg) == {
        "location": "eastus", "tags": {"kiln:cluster": "c1"}, "properties": {
            "orchestrationMode": "Flexible", "platformFaultDomainCount": 1, "singlePlacementGroup": True,
            "proximityPlacementGroup": {"id": ppg}}}
    vmss = plan.resource_id(SUB, "kiln-c1", "Microsoft.Compute/virtualMachineScaleSets", "kiln-c1-vmss")
    properties = plan.vm_body(made, index=0, image_id=IMAGE, public_key="k", tags=tags, interface_id="/nic",
                              placement_id=ppg, scale_set_id=vmss)["properties"]
    assert properties["virtualMachineScaleSet"] == {"id": vmss}
    assert "proximityPlacementGroup" not in properties, "the set places its VMs: the group is set on it alone"


def test_a_size_without_rdma_makes_its_vms_alone_as_before():
    properties = plan.vm_body(request(), index=0, image_id=IMAGE, public_key="k", tags={}, interface_id="/nic",
                              placement_id="/ppg")["properties"]
    assert "virtualMachineScaleSet" not in properties and properties["proximityPlacementGroup"] == {"id": "/ppg"}


@pytest.mark.parametrize(("size", "shown"), [("Standard_ND96isr_H200_v5", True), ("Standard_NC24ads_A100_v4", False)])
def test_the_dry_run_shows_the_scale_set_of_an_rdma_size_only(size, shown, tmp_path, monkeypatch):
    from bootstrap import providers

    monkeypatch.setenv("KILN_HOME", str(tmp_path))
    provider = providers.named("azure", {"subscription": SUB, "location": "eastus"})
    lines = provider.plan(provider.request("c1", 2, {"instance_type": size, "ssh_cidr": "203.0.113.7/32"}, None))
    scale_sets = [line for line in lines if line.startswith("virtualMachineScaleSets ")]
    vm = next(line for line in lines if line.startswith("per node: "))
    if shown:
        [line] = scale_sets
        assert line.startswith('virtualMachineScaleSets kiln-c1-vmss {"location": "eastus", ')
        assert '"orchestrationMode": "Flexible", "platformFaultDomainCount": 1, "singlePlacementGroup": true' in line
        assert '"virtualMachineScaleSet": {"id": "<kiln-c1-vmss>"}' in vm
    else:
        assert scale_sets == [] and "virtualMachineScaleSet" not in vm

"""testbed.arm: the Azure Resource Manager stand-in, driven only through the official SDK clients and their pollers."""

from __future__ import annotations

import pytest
import requests
from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    ResourceExistsError,
    ResourceNotFoundError,
)
from azure.core.pipeline.policies import SansIOHTTPPolicy
from azure.core.rest import HttpRequest
from azure.mgmt.authorization import AuthorizationManagementClient
from azure.mgmt.compute import ComputeManagementClient
from azure.mgmt.compute import models as cm
from azure.mgmt.network import NetworkManagementClient
from azure.mgmt.resource.resources import ResourceManagementClient

from bootstrap import node
from kiln.hostkeys import console_host_keys
from testbed import arm_access as access
from testbed.arm import Arm
from testbed.arm_rules import COMPUTE_API

SUB, RG, LOCATION = "00000000-0000-0000-0000-000000000000", "kiln-rg", "eastus"
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKd1mV0QuGx4cmPbgDF0ZNl6QbX3xk0BUnK4WG7ETvqT kiln"


@pytest.fixture
def arm():
    with Arm(op_delay=0.02) as arm:
        arm.add_image("images", "kiln-gpu-1")
        yield arm


@pytest.fixture
def clients(arm):
    """(resource, network, compute) clients, pointed at the stand-in by their own options only. azure-core reads
    ARM's `Retry-After: 0` as "none given" and waits `polling_interval` between polls (30 s by default)."""
    options = {"base_url": arm.endpoint, "connection_verify": arm.ca_file, "polling_interval": 0.01}
    return (ResourceManagementClient(arm.credential(), SUB, **options),
            NetworkManagementClient(arm.credential(), SUB, **options),
            ComputeManagementClient(arm.credential(), SUB, **options))


def code_of(error: HttpResponseError) -> str:
    return error.error.code if error.error else ""


def network(clients, group: str = RG, *, nics: int = 1, location: str = LOCATION) -> list[str]:
    """A group with a network, an NSG, public IPs and `nics` NICs; their ids."""
    resource, net, _ = clients
    resource.resource_groups.create_or_update(group, {"location": location})
    vnet = net.virtual_networks.begin_create_or_update(group, "vnet", {"location": location, "properties": {
        "addressSpace": {"addressPrefixes": ["10.1.0.0/16"]},
        "subnets": [{"name": "nodes", "properties": {"addressPrefix": "10.1.0.0/24"}}]}}).result()
    nsg = net.network_security_groups.begin_create_or_update(group, "nsg", {"location": location, "properties": {
        "securityRules": [{"name": "ssh", "properties": {
            "protocol": "Tcp", "access": "Allow", "direction": "Inbound", "priority": 100,
            "sourceAddressPrefix": "198.51.100.0/24", "destinationAddressPrefix": "*",
            "destinationPortRange": "22"}}]}}).result()
    ids = []
    for i in range(nics):
        ip = net.public_ip_addresses.begin_create_or_update(group, f"ip-{i}", {
            "location": location, "sku": {"name": "Standard"},
            "properties": {"publicIPAllocationMethod": "Static"}}).result()
        nic = net.network_interfaces.begin_create_or_update(group, f"nic-{i}", {"location": location, "properties": {
            "networkSecurityGroup": {"id": nsg.id},
            "ipConfigurations": [{"name": "ipconfig1", "properties": {
                "subnet": {"id": vnet.subnets[0].id}, "publicIPAddress": {"id": ip.id}}}]}}).result()
        ids.append(nic.id)
    return ids


def vm_body(image: str, nic: str, *, spot: bool = True, eviction: str | None = "Delete", diagnostics: bool = True,
            data_disks: tuple[str, ...] = (), location: str = LOCATION, nic_delete: str = "Delete",
            size: str = "Standard_NC4as_T4_v3", ppg: str | None = None) -> cm.VirtualMachine:
    reference = cm.ImageReference(id=image) if image.startswith("/") else cm.ImageReference(
        publisher="Canonical", offer="ubuntu-24_04-lts", sku="server", version=image)
    return cm.VirtualMachine(
        location=location, tags={"cluster": "c1"},
        hardware_profile=cm.HardwareProfile(vm_size=size),
        storage_profile=cm.StorageProfile(
            image_reference=reference, os_disk=cm.OSDisk(create_option="FromImage", delete_option="Delete"),
            data_disks=[cm.DataDisk(lun=i, create_option="Attach", managed_disk=cm.ManagedDiskParameters(id=d))
                        for i, d in enumerate(data_disks)]),
        os_profile=cm.OSProfile(admin_username="kiln", linux_configuration=cm.LinuxConfiguration(
            disable_password_authentication=True, ssh=cm.SshConfiguration(public_keys=[
                cm.SshPublicKey(path="/home/kiln/.ssh/authorized_keys", key_data=SSH_KEY)]))),
        network_profile=cm.NetworkProfile(network_interfaces=[
            cm.NetworkInterfaceReference(id=nic, delete_option=nic_delete)]),
        diagnostics_profile=cm.DiagnosticsProfile(boot_diagnostics=cm.BootDiagnostics(enabled=diagnostics)),
        proximity_placement_group=cm.SubResource(id=ppg) if ppg else None,
        **({"priority": "Spot", "eviction_policy": eviction, "billing_profile": cm.BillingProfile(max_price=-1)}
           if spot else {}))


def image_id(arm: Arm, name: str = "kiln-gpu-1") -> str:
    return f"/subscriptions/{arm.subscription}/resourceGroups/images/providers/Microsoft.Compute/images/{name}"


def create_vm(clients, arm: Arm, name: str, nic: str, **kw) -> cm.VirtualMachine:
    return clients[2].virtual_machines.begin_create_or_update(RG, name, vm_body(image_id(arm), nic, **kw)).result()


def empty_disk(clients, name: str, size: int = 64, tags: dict | None = None) -> cm.Disk:
    return clients[2].disks.begin_create_or_update(RG, name, cm.Disk(
        location=LOCATION, tags=tags, sku=cm.DiskSku(name="Premium_LRS"), disk_size_gb=size,
        creation_data=cm.CreationData(create_option="Empty"))).result()


def serial_log(arm: Arm, compute: ComputeManagementClient, name: str) -> str:
    uri = compute.virtual_machines.retrieve_boot_diagnostics_data(RG, name).serial_console_log_blob_uri
    answer = requests.get(uri, verify=arm.ca_file, timeout=10)  # a SAS URL: no bearer token
    answer.raise_for_status()
    return answer.text


def test_a_spot_vm_from_a_managed_image_is_made_with_its_network_and_read_back(arm, clients):
    resource, net, compute = clients
    nic_id = network(clients)[0]
    first = compute.virtual_machines.begin_create_or_update(RG, "node-1", vm_body(image_id(arm), nic_id),
                                                            polling=False).result()  # the PUT's own answer
    assert first.provisioning_state == "Creating" and first.vm_id
    assert ("PUT", f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachines/node-1"
            ) in arm.calls
    vm = compute.virtual_machines.begin_create_or_update(RG, "node-1", vm_body(image_id(arm), nic_id)).result()
    assert vm.provisioning_state == "Succeeded" and vm.vm_id == first.vm_id
    assert vm.id == f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachines/node-1"
    assert (vm.type, vm.location, vm.tags) == ("Microsoft.Compute/virtualMachines", LOCATION, {"cluster": "c1"})
    assert (vm.priority, vm.eviction_policy, vm.billing_profile.max_price) == ("Spot", "Delete", -1)
    assert vm.hardware_profile.vm_size == "Standard_NC4as_T4_v3"
    assert vm.storage_profile.image_reference.id == image_id(arm)
    assert vm.os_profile.computer_name == "node-1" and vm.os_profile.admin_password is None

    seen = compute.virtual_machines.get(RG, "node-1", expand="instanceView")
    assert [s.code for s in seen.instance_view.statuses] == ["ProvisioningState/succeeded", "PowerState/running"]
    assert [v.name for v in compute.virtual_machines.list(RG)] == ["node-1"]
    assert [v.name for v in compute.virtual_machines.list_all()] == ["node-1"]
    os_disk = compute.disks.get(RG, vm.storage_profile.os_disk.name)
    assert (os_disk.disk_state, os_disk.managed_by, os_disk.os_type) == ("Attached", vm.id, "Linux")

    nic = net.network_interfaces.get(RG, "nic-0")
    assert nic.virtual_machine.id == vm.id and nic.provisioning_state == "Succeeded"
    assert nic.ip_configurations[0].private_ip_address == "10.1.0.4"
    public = net.public_ip_addresses.get(RG, "ip-0")
    assert public.ip_address.startswith("203.0.113.") and public.sku.name == "Standard"
    assert public.ip_configuration.id == nic.ip_configurations[0].id
    subnet = net.subnets.get(RG, "vnet", "nodes")
    assert [c.id for c in subnet.ip_configurations] == [nic.ip_configurations[0].id]
    nsg = net.network_security_groups.get(RG, "nsg")
    assert [n.id for n in nsg.network_interfaces] == [nic.id]
    assert [r.name for r in nsg.security_rules] == ["ssh"] and len(nsg.default_security_rules) == 6
    assert resource.resource_groups.get(RG).properties.provisioning_state == "Succeeded"


def test_the_serial_log_behind_the_sas_url_shows_the_host_keys_the_vm_has(arm, clients):
    compute = clients[2]
    nics = network(clients, nics=2)
    create_vm(clients, arm, "node-1", nics[0])
    create_vm(clients, arm, "node-2", nics[1])
    real = arm.host_keys(RG, "node-1")
    assert {k.split()[0] for k in real} == {"ssh-ed25519", "ecdsa-sha2-nistp256"}
    assert set(console_host_keys(serial_log(arm, compute, "node-1"))) == set(real)
    assert set(real).isdisjoint(arm.host_keys(RG, "node-2"))

    uri = compute.virtual_machines.retrieve_boot_diagnostics_data(RG, "node-1").serial_console_log_blob_uri
    forged = uri.replace("sig=", "sig=x")
    assert requests.get(forged, verify=arm.ca_file, timeout=10).status_code == 403
    with pytest.raises(requests.exceptions.SSLError):  # the server's certificate is the stand-in CA's only
        requests.get(uri, timeout=10)

    compute.virtual_machines.begin_power_off(RG, "node-1").result()
    compute.virtual_machines.begin_start(RG, "node-1").result()
    log = serial_log(arm, compute, "node-1")
    assert log.count("-----BEGIN SSH HOST KEY KEYS-----") == 2 and set(console_host_keys(log)) == set(real)


def test_boot_diagnostics_of_a_vm_without_them_is_refused(arm, clients):
    create_vm(clients, arm, "quiet", network(clients)[0], diagnostics=False)
    with pytest.raises(HttpResponseError) as caught:
        clients[2].virtual_machines.retrieve_boot_diagnostics_data(RG, "quiet")
    assert caught.value.status_code == 409 and code_of(caught.value) == "OperationNotAllowed"
    assert "Boot diagnostics is not enabled" in caught.value.message


def test_an_api_version_other_than_the_sdks_or_none_is_bad_request(arm, clients):
    resource, _, compute = clients
    resource.resource_groups.create_or_update(RG, {"location": LOCATION})
    with pytest.raises(HttpResponseError) as caught:
        compute.disks.get(RG, "any", api_version="2020-06-30")
    assert caught.value.status_code == 400 and code_of(caught.value) == "NoRegisteredProviderFound"
    older = ResourceManagementClient(arm.credential(), SUB, base_url=arm.endpoint, connection_verify=arm.ca_file,
                                     api_version="2019-10-01")
    with pytest.raises(HttpResponseError) as caught:
        older.resource_groups.get(RG)
    assert caught.value.status_code == 400 and code_of(caught.value) == "InvalidApiVersionParameter"
    answer = compute.send_request(HttpRequest("GET", f"/subscriptions/{SUB}/resourceGroups/{RG}"))
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "MissingApiVersionParameter"


def test_a_request_without_the_token_or_with_another_is_unauthorized(arm, clients):
    clients[0].resource_groups.create_or_update(RG, {"location": LOCATION})
    anonymous = ComputeManagementClient(arm.credential(), SUB, base_url=arm.endpoint, connection_verify=arm.ca_file,
                                        authentication_policy=SansIOHTTPPolicy())  # sends no Authorization header
    with pytest.raises(ClientAuthenticationError) as caught:
        anonymous.virtual_machines.get(RG, "any")
    assert caught.value.status_code == 401 and code_of(caught.value) == "AuthenticationFailed"
    with pytest.raises(ClientAuthenticationError) as caught:
        arm.client("compute", credential=arm.credential("not-the-token")).virtual_machines.get(RG, "any")
    assert code_of(caught.value) == "InvalidAuthenticationToken"


# What CRP answers for an image it cannot find: 404 NotFound for a managed image ("The Image '...' cannot be found in
# '<location>' region."), 404 GalleryImageNotFound for a gallery image, 404 PlatformImageNotFound for a marketplace one.
@pytest.mark.parametrize(("image", "code"), [
    (f"/subscriptions/{SUB}/resourceGroups/images/providers/Microsoft.Compute/images/no-such", "NotFound"),
    (f"/subscriptions/{SUB}/resourceGroups/images/providers/Microsoft.Compute/galleries/g/images/d/versions/latest",
     "GalleryImageNotFound"),
    ("20.04.202001010", "PlatformImageNotFound"),
])
def test_a_missing_image_is_not_found_and_nothing_is_made(arm, clients, image, code):
    compute = clients[2]
    nic = network(clients)[0]
    with pytest.raises(ResourceNotFoundError) as caught:
        compute.virtual_machines.begin_create_or_update(RG, "node-1", vm_body(image, nic)).result()
    assert caught.value.status_code == 404 and code_of(caught.value) == code
    assert list(compute.virtual_machines.list(RG)) == [] and list(compute.disks.list_by_resource_group(RG)) == []
    assert clients[1].network_interfaces.get(RG, "nic-0").virtual_machine is None


def test_gallery_latest_and_the_ubuntu_marketplace_image_make_vms(arm, clients):
    compute = clients[2]
    nics = network(clients, nics=2)
    for version in ("1.0.0", "1.10.0", "1.9.0"):
        arm.add_gallery_image("images", "kiln", "gpu", version)
    latest = f"/subscriptions/{SUB}/resourceGroups/images/providers/Microsoft.Compute/galleries/kiln/images/gpu/" \
             "versions/latest"
    compute.virtual_machines.begin_create_or_update(RG, "g1", vm_body(latest, nics[0])).result()
    os_disk = compute.disks.get(RG, compute.virtual_machines.get(RG, "g1").storage_profile.os_disk.name)
    assert os_disk.creation_data.image_reference.id == latest
    assert compute.gallery_image_versions.get("images", "kiln", "gpu", "1.10.0").provisioning_state == "Succeeded"
    ubuntu = compute.virtual_machines.begin_create_or_update(RG, "u1", vm_body("latest", nics[1])).result()
    assert ubuntu.storage_profile.image_reference.exact_version.startswith("24.04.")


@pytest.mark.parametrize(("spot", "eviction", "price", "target"), [
    (True, None, -1, "evictionPolicy"),
    (True, "Hibernate", -1, "evictionPolicy"),
    (False, "Delete", None, "evictionPolicy"),
    (True, "Deallocate", 0, "billingProfile.maxPrice"),
])
def test_spot_settings_outside_azures_rules_are_invalid_parameter(arm, clients, spot, eviction, price, target):
    body = vm_body(image_id(arm), network(clients)[0], spot=spot, eviction=eviction)
    if not spot:
        body.eviction_policy = eviction
    if price is not None:
        body.billing_profile = cm.BillingProfile(max_price=price)
    with pytest.raises(HttpResponseError) as caught:
        clients[2].virtual_machines.begin_create_or_update(RG, "node-1", body).result()
    assert caught.value.status_code == 400 and code_of(caught.value) == "InvalidParameter"
    assert caught.value.error.target == target
    assert list(clients[2].virtual_machines.list(RG)) == []


def refused(**change):
    """A VM body changed as `change` says (name, computerName, keys, vmSize, key path)."""
    def edit(body: cm.VirtualMachine) -> cm.VirtualMachine:
        linux = body.os_profile.linux_configuration
        if "computer_name" in change:
            body.os_profile.computer_name = change["computer_name"]
        if "no_keys" in change:
            linux.ssh.public_keys = []
        if "vm_size" in change:
            body.hardware_profile.vm_size = change["vm_size"]
        if "path" in change:
            linux.ssh.public_keys[0].path = change["path"]
        return body
    return edit


@pytest.mark.parametrize(("name", "edit", "target"), [
    ("node_1", refused(), "vmName"),
    ("-node", refused(), "vmName"),
    ("n" * 65, refused(), "vmName"),
    ("node-1", refused(computer_name="h" * 65), "computerName"),
    ("node-1", refused(no_keys=True), "linuxConfiguration"),
    ("node-1", refused(vm_size="Standard_NC6"), "vmSize"),
    ("node-1", refused(path="/root/.ssh/authorized_keys"), "linuxConfiguration.ssh.publicKeys.path"),
])
def test_a_vm_request_crp_refuses_is_invalid_parameter_and_makes_nothing(arm, clients, name, edit, target):
    body = edit(vm_body(image_id(arm), network(clients)[0]))
    with pytest.raises(HttpResponseError) as caught:
        clients[2].virtual_machines.begin_create_or_update(RG, name, body).result()
    assert caught.value.status_code == 400 and code_of(caught.value) == "InvalidParameter"
    assert caught.value.error.target == target
    assert list(clients[2].virtual_machines.list(RG)) == [] and list(clients[2].disks.list_by_resource_group(RG)) == []


def test_a_data_disk_must_exist_be_in_the_vms_location_and_take_its_own_lun(arm, clients):
    compute = clients[2]
    nic = network(clients)[0]
    here = empty_disk(clients, "here")
    there = compute.disks.begin_create_or_update(RG, "there", cm.Disk(
        location="westus2", disk_size_gb=8, creation_data=cm.CreationData(create_option="Empty"))).result()
    with pytest.raises(ResourceNotFoundError) as caught:
        create_vm(clients, arm, "node-1", nic, data_disks=(here.id.replace("/here", "/nowhere"),))
    assert code_of(caught.value) == "NotFound"
    with pytest.raises(HttpResponseError) as caught:
        create_vm(clients, arm, "node-1", nic, data_disks=(there.id,))
    assert caught.value.status_code == 400 and "westus2" in caught.value.message
    body = vm_body(image_id(arm), nic, data_disks=(here.id, there.id))
    body.storage_profile.data_disks[1].lun = 0
    with pytest.raises(HttpResponseError) as caught:
        compute.virtual_machines.begin_create_or_update(RG, "node-1", body).result()
    assert caught.value.status_code == 400 and "LUN 0" in caught.value.message
    assert compute.disks.get(RG, "here").disk_state == "Unattached"


def test_an_attached_data_disk_cannot_be_deleted_until_its_vm_is_gone(arm, clients):
    compute = clients[2]
    nic = network(clients)[0]
    disk = empty_disk(clients, "data-1")
    assert (disk.disk_state, disk.disk_size_gb, disk.provisioning_state) == ("Unattached", 64, "Succeeded")
    vm = create_vm(clients, arm, "node-1", nic, data_disks=(disk.id,))
    assert [(d.lun, d.managed_disk.id) for d in vm.storage_profile.data_disks] == [(0, disk.id)]
    attached = compute.disks.get(RG, "data-1")
    assert (attached.disk_state, attached.managed_by) == ("Attached", vm.id)
    with pytest.raises(HttpResponseError) as caught:
        compute.disks.begin_delete(RG, "data-1").result()
    assert caught.value.status_code == 409 and code_of(caught.value) == "OperationNotAllowed"
    with pytest.raises(HttpResponseError) as caught:  # and it cannot be attached to a second VM
        create_vm(clients, arm, "node-2", network(clients, "other-rg")[0], data_disks=(disk.id,))
    assert code_of(caught.value) == "OperationNotAllowed"

    compute.virtual_machines.begin_delete(RG, "node-1").result()
    left = compute.disks.get(RG, "data-1")  # the data disk's deleteOption is Detach; the OS disk's Delete
    assert (left.disk_state, left.managed_by) == ("Unattached", None)
    assert [d.name for d in compute.disks.list_by_resource_group(RG)] == ["data-1"]
    assert [n.name for n in clients[1].network_interfaces.list(RG)] == []  # its NIC's deleteOption was Delete
    compute.disks.begin_delete(RG, "data-1").result()
    with pytest.raises(ResourceNotFoundError):
        compute.disks.get(RG, "data-1")


def test_a_snapshot_of_a_disk_makes_a_disk_again(arm, clients):
    compute = clients[2]
    clients[0].resource_groups.create_or_update(RG, {"location": LOCATION})
    source = empty_disk(clients, "data-1", size=128)
    snapshot = compute.snapshots.begin_create_or_update(RG, "snap-1", cm.Snapshot(
        location=LOCATION, tags={"kiln-cluster": "c1"},
        creation_data=cm.CreationData(create_option="Copy", source_resource_id=source.id))).result()
    assert (snapshot.disk_size_gb, snapshot.tags, snapshot.provisioning_state) == (128, {"kiln-cluster": "c1"},
                                                                                   "Succeeded")
    assert snapshot.creation_data.source_resource_id == source.id
    assert snapshot.creation_data.source_unique_id == source.unique_id
    copy = compute.disks.begin_create_or_update(RG, "data-2", cm.Disk(location=LOCATION, creation_data=cm.CreationData(
        create_option="Copy", source_resource_id=snapshot.id))).result()
    assert (copy.disk_size_gb, copy.creation_data.source_resource_id) == (128, snapshot.id)
    assert [s.name for s in compute.snapshots.list()] == ["snap-1"]
    assert [s.name for s in compute.snapshots.list_by_resource_group(RG)] == ["snap-1"]
    gone = source.id.replace("data-1", "data-9")
    with pytest.raises(ResourceNotFoundError):
        compute.snapshots.begin_create_or_update(RG, "snap-2", cm.Snapshot(
            location=LOCATION, creation_data=cm.CreationData(create_option="Copy", source_resource_id=gone))).result()
    compute.snapshots.begin_delete(RG, "snap-1").result()
    assert list(compute.snapshots.list()) == []


@pytest.mark.parametrize(("code", "says"), [
    ("OperationNotAllowed", "exceeding approved standardNCASv3_T4Family Cores quota"),
    ("AllocationFailed", "sufficient capacity for the requested VM size in this region"),
    ("ZonalAllocationFailed", "in this zone"),
    ("SkuNotAvailable", "Standard_NC4as_T4_v3' is currently not available in location 'eastus'"),
])
def test_an_operation_set_to_fail_raises_its_code_from_the_poller_and_makes_nothing(arm, clients, code, says):
    compute = clients[2]
    nic = network(clients)[0]
    arm.fail("virtualMachines.createOrUpdate", code=code, status=409, on="operation")
    poller = compute.virtual_machines.begin_create_or_update(RG, "node-1", vm_body(image_id(arm), nic))
    with pytest.raises(HttpResponseError) as caught:
        poller.result()
    assert code_of(caught.value) == code and says in caught.value.message
    with pytest.raises(ResourceNotFoundError):
        compute.virtual_machines.get(RG, "node-1")
    assert list(compute.disks.list_by_resource_group(RG)) == []
    assert clients[1].network_interfaces.get(RG, "nic-0").virtual_machine is None
    assert create_vm(clients, arm, "node-1", nic).provisioning_state == "Succeeded"  # the fault was for one call


def test_a_call_set_to_fail_raises_at_once_on_its_nth_call(arm, clients):
    clients[0].resource_groups.create_or_update(RG, {"location": LOCATION})
    arm.fail("disks.createOrUpdate", code="OperationNotAllowed", status=409, nth=2, message="quota")
    empty_disk(clients, "d1")
    with pytest.raises(ResourceExistsError) as caught:
        empty_disk(clients, "d2")
    assert caught.value.status_code == 409 and code_of(caught.value) == "OperationNotAllowed"
    assert caught.value.error.message == "quota"
    assert [d.name for d in clients[2].disks.list_by_resource_group(RG)] == ["d1"]
    with pytest.raises(ValueError):
        arm.fail("resourceGroups.createOrUpdate", code="Conflict", status=409, on="operation")  # answers at once


def test_deleting_a_resource_group_deletes_everything_in_it(arm, clients):
    resource, net, compute = clients
    create_vm(clients, arm, "node-1", network(clients)[0])
    empty_disk(clients, "data-1")
    other = network(clients, "other-rg")
    resource.resource_groups.begin_delete(RG).result()
    assert resource.resource_groups.check_existence(RG) is False
    with pytest.raises(ResourceNotFoundError) as caught:
        compute.virtual_machines.get(RG, "node-1")
    assert code_of(caught.value) == "ResourceGroupNotFound"
    assert [d.name for d in compute.disks.list()] == [] and [v.name for v in compute.virtual_machines.list_all()] == []
    assert [n.id for n in net.network_interfaces.list_all()] == other
    assert [g.name for g in resource.resource_groups.list()] == ["images", "other-rg"]
    with pytest.raises(ResourceNotFoundError):
        resource.resource_groups.begin_delete(RG).result()


def test_resource_groups_are_listed_by_tag_name_and_value(arm, clients):
    resource = clients[0]
    for name, tags in (("a", {"kiln-cluster": "c1"}), ("b", {"kiln-cluster": "c2"}), ("c", {"other": "c1"})):
        resource.resource_groups.create_or_update(name, {"location": LOCATION, "tags": tags})
    assert [g.name for g in resource.resource_groups.list(filter="tagName eq 'kiln-cluster'")] == ["a", "b"]
    assert [g.name for g in resource.resource_groups.list(
        filter="tagName eq 'kiln-cluster' and tagValue eq 'c2'")] == ["b"]
    with pytest.raises(HttpResponseError) as caught:
        list(resource.resource_groups.list(filter="name eq 'a'"))
    assert caught.value.status_code == 400


def test_lists_page_by_next_link(arm, clients):
    resource = clients[0]
    for i in range(60):
        resource.resource_groups.create_or_update(f"g{i:02}", {"location": LOCATION})
    before = len(arm.calls)
    assert [g.name for g in resource.resource_groups.list()] == [f"g{i:02}" for i in range(60)] + ["images"]
    assert arm.calls[before:] == [("GET", f"/subscriptions/{SUB}/resourcegroups")] * 2  # 50, then the nextLink's 11


def test_a_body_member_unknown_to_the_schema_or_of_the_wrong_type_is_refused(arm, clients):
    clients[0].resource_groups.create_or_update(RG, {"location": LOCATION})
    for body, says in (({"location": LOCATION, "properties": {"creationData": {"createOption": "Empty"},
                                                                "diskSizeGB": 8, "diskSizeGb": 8}}, "diskSizeGb"),
                       ({"location": LOCATION, "properties": {"creationData": {"createOption": "Empty"},
                                                                "diskSizeGB": "8"}}, "properties.diskSizeGB")):
        with pytest.raises(HttpResponseError) as caught:
            clients[2].disks.begin_create_or_update(RG, "d1", body).result()
        assert code_of(caught.value) == "InvalidRequestContent" and says in caught.value.message
    assert list(clients[2].disks.list_by_resource_group(RG)) == []


def test_network_references_must_exist_and_resources_in_use_cannot_be_deleted(arm, clients):
    _, net, compute = clients
    nic = network(clients)[0]
    missing = nic.replace("networkInterfaces/nic-0", "virtualNetworks/vnet/subnets/none")
    with pytest.raises(HttpResponseError) as caught:
        net.network_interfaces.begin_create_or_update(RG, "nic-x", {"location": LOCATION, "properties": {
            "ipConfigurations": [{"name": "c", "properties": {"subnet": {"id": missing}}}]}}).result()
    assert code_of(caught.value) == "InvalidResourceReference"
    create_vm(clients, arm, "node-1", nic)
    for delete, code in ((lambda: net.network_interfaces.begin_delete(RG, "nic-0"), "NicInUse"),
                         (lambda: net.public_ip_addresses.begin_delete(RG, "ip-0"), "PublicIPAddressCannotBeDeleted"),
                         (lambda: net.network_security_groups.begin_delete(RG, "nsg"),
                          "InUseNetworkSecurityGroupCannotBeDeleted"),
                         (lambda: net.subnets.begin_delete(RG, "vnet", "nodes"), "InUseSubnetCannotBeDeleted")):
        with pytest.raises(HttpResponseError) as caught:
            delete().result()
        assert caught.value.status_code == 400 and code_of(caught.value) == code
    with pytest.raises(HttpResponseError) as caught:  # one NIC, one VM
        create_vm(clients, arm, "node-2", nic)
    assert code_of(caught.value) == "NicInUse"
    compute.virtual_machines.begin_delete(RG, "node-1").result()
    net.public_ip_addresses.begin_delete(RG, "ip-0").result()  # its NIC went with the VM (deleteOption Delete)
    assert [p.name for p in net.public_ip_addresses.list(RG)] == []


def test_a_placement_group_named_by_a_vm_cannot_be_deleted(arm, clients):
    compute = clients[2]
    nic = network(clients)[0]
    ppg = compute.proximity_placement_groups.create_or_update(RG, "ppg", cm.ProximityPlacementGroup(
        location=LOCATION, proximity_placement_group_type="Standard"))
    create_vm(clients, arm, "node-1", nic, ppg=ppg.id, nic_delete="Detach")
    assert [v.id for v in compute.proximity_placement_groups.get(RG, "ppg").virtual_machines] == [
        compute.virtual_machines.get(RG, "node-1").id]
    with pytest.raises(HttpResponseError) as caught:
        compute.proximity_placement_groups.delete(RG, "ppg")
    assert caught.value.status_code == 409
    compute.virtual_machines.begin_delete(RG, "node-1").result()
    compute.proximity_placement_groups.delete(RG, "ppg")
    assert clients[1].network_interfaces.get(RG, "nic-0").virtual_machine is None  # kept: deleteOption Detach


@pytest.mark.parametrize(("policy", "left"), [("Delete", None), ("Deallocate", "PowerState/deallocated")])
def test_eviction_deletes_or_deallocates_a_spot_vm_as_its_policy_says(arm, clients, policy, left):
    compute = clients[2]
    vm = create_vm(clients, arm, "node-1", network(clients)[0], eviction=policy)
    arm.evict(RG, "node-1")
    if left is None:
        with pytest.raises(ResourceNotFoundError):
            compute.virtual_machines.get(RG, "node-1")
        assert list(compute.disks.list_by_resource_group(RG)) == []
    else:
        assert compute.virtual_machines.instance_view(RG, "node-1").statuses[1].code == left
        assert compute.disks.get(RG, vm.storage_profile.os_disk.name).disk_state == "Reserved"
    with pytest.raises(ValueError):
        arm.evict(RG, "node-1")


@pytest.mark.parametrize("tags", [{f"t{i}": "v" for i in range(51)}, {"x" * 513: "v"}, {"k": "v" * 257},
                                  {"a/b": "v"}])
def test_tags_beyond_arm_limits_are_invalid_tag(arm, clients, tags):
    with pytest.raises(HttpResponseError) as caught:
        clients[0].resource_groups.create_or_update(RG, {"location": LOCATION, "tags": tags})
    assert caught.value.status_code == 400 and code_of(caught.value) == "InvalidTag"


def test_a_vm_in_a_missing_group_is_resource_group_not_found(arm, clients):
    nic = network(clients)[0]
    with pytest.raises(ResourceNotFoundError) as caught:
        clients[2].virtual_machines.begin_create_or_update("no-such-rg", "node-1", vm_body(image_id(arm), nic))
    assert code_of(caught.value) == "ResourceGroupNotFound"


def test_a_method_the_stand_in_does_not_serve_is_not_an_empty_success(arm, clients):
    create_vm(clients, arm, "node-1", network(clients)[0])
    with pytest.raises(HttpResponseError) as caught:
        clients[2].virtual_machines.begin_restart(RG, "node-1").result()
    assert caught.value.status_code == 501 and code_of(caught.value) == "NotImplemented"


# ---------------------------------------------------------------------------------------------- identities and roles

VM_CONTRIBUTOR = f"/subscriptions/{SUB}/providers/Microsoft.Authorization/roleDefinitions/" \
                 "9980e02c-c2be-4d73-94e8-173b1dc7cf3c"
ASSIGNMENT = "6f1c3a5e-2b4d-4c8e-9a0f-1e2d3c4b5a69"


def authorization(arm: Arm, credential=None) -> AuthorizationManagementClient:
    return AuthorizationManagementClient(credential or arm.credential(), SUB, base_url=arm.endpoint,
                                         connection_verify=arm.ca_file)


def with_identity(clients, arm: Arm, name: str, nic: str) -> cm.VirtualMachine:
    body = vm_body(image_id(arm), nic)
    body.identity = cm.VirtualMachineIdentity(type="SystemAssigned")
    return clients[2].virtual_machines.begin_create_or_update(RG, name, body).result()


def assign(arm: Arm, scope: str, principal: str, name: str = ASSIGNMENT, role: str = VM_CONTRIBUTOR):
    return authorization(arm).role_assignments.create(scope, name, {"properties": {
        "roleDefinitionId": role, "principalId": principal, "principalType": "ServicePrincipal"}})


def test_a_vm_identity_is_allowed_what_its_role_grants_at_its_scope_and_nothing_else(arm, clients):
    first, second = network(clients, nics=2)
    vm = with_identity(clients, arm, "vm-1", first)
    other = create_vm(clients, arm, "vm-2", second)
    assert vm.identity.type == "SystemAssigned" and vm.identity.principal_id and vm.identity.tenant_id
    assert other.identity is None and arm.identity_token(other.id) is None
    made = assign(arm, vm.id, vm.identity.principal_id)
    assert (made.scope, made.principal_id, made.role_definition_id) == (vm.id, vm.identity.principal_id,
                                                                        VM_CONTRIBUTOR)
    as_vm = arm.client("compute", credential=arm.credential(arm.identity_token(vm.id)))
    assert as_vm.virtual_machines.get(RG, "vm-1").name == "vm-1"
    as_vm.virtual_machines.begin_deallocate(RG, "vm-1").result()
    with pytest.raises(HttpResponseError) as caught:
        as_vm.virtual_machines.begin_deallocate(RG, "vm-2")
    assert caught.value.status_code == 403 and code_of(caught.value) == "AuthorizationFailed"
    assert "'Microsoft.Compute/virtualMachines/deallocate/action'" in caught.value.message
    with pytest.raises(HttpResponseError) as caught:  # the network is outside its scope
        arm.client("network", credential=as_vm._config.credential).network_interfaces.get(RG, "nic-0")
    assert code_of(caught.value) == "AuthorizationFailed"


def test_role_assignments_are_refused_as_arm_refuses_them(arm, clients):
    [nic] = network(clients)
    vm = with_identity(clients, arm, "vm-1", nic)
    principal = vm.identity.principal_id
    for name, role, who, code in (("not-a-guid", VM_CONTRIBUTOR, principal, "InvalidRoleAssignmentId"),
                                  (ASSIGNMENT, VM_CONTRIBUTOR[:-1] + "0", principal, "RoleDefinitionDoesNotExist"),
                                  (ASSIGNMENT, VM_CONTRIBUTOR, "2b9f0e4c-0000-4000-8000-000000000000",
                                   "PrincipalNotFound")):
        with pytest.raises(HttpResponseError) as caught:
            assign(arm, vm.id, who, name, role)
        assert (caught.value.status_code, code_of(caught.value)) == (400, code)
    assign(arm, vm.id, principal)
    with pytest.raises(ResourceExistsError) as caught:  # the same grant under another name
        assign(arm, vm.id, principal, "0d6e6a0e-1111-4222-8333-444455556666")
    assert code_of(caught.value) == "RoleAssignmentExists"
    with arm.denied("Microsoft.Authorization/roleAssignments/write"), pytest.raises(HttpResponseError) as caught:
        assign(arm, vm.id, principal, "0d6e6a0e-1111-4222-8333-444455556666")
    assert (caught.value.status_code, code_of(caught.value)) == (403, "AuthorizationFailed")


def test_an_identity_goes_with_its_vm_and_its_assignments_stay_until_deleted(arm, clients):
    [nic] = network(clients)
    vm = with_identity(clients, arm, "vm-1", nic)
    assign(arm, vm.id, vm.identity.principal_id)
    token = arm.identity_token(vm.id)
    clients[2].virtual_machines.begin_delete(RG, "vm-1").result()
    assert arm.identity_token(vm.id) is None
    with pytest.raises(ClientAuthenticationError):
        arm.client("compute", credential=arm.credential(token)).virtual_machines.get(RG, "vm-1")
    clients[0].resource_groups.begin_delete(RG).result()
    [left] = arm.role_assignments()  # granting nothing, until someone deletes it
    assert left["properties"]["scope"] == vm.id
    authorization(arm).role_assignments.delete(vm.id, ASSIGNMENT)
    assert arm.role_assignments() == []


def test_a_new_identity_is_not_in_the_directory_at_once(arm, clients):
    [nic] = network(clients)
    arm.delay_principals(30)
    vm = with_identity(clients, arm, "vm-1", nic)
    with pytest.raises(HttpResponseError) as caught:
        assign(arm, vm.id, vm.identity.principal_id)
    assert code_of(caught.value) == "PrincipalNotFound"
    arm.delay_principals(0)
    assert assign(arm, vm.id, vm.identity.principal_id).principal_id == vm.identity.principal_id


def test_access_rules():
    vms = ("Microsoft.Compute/virtualMachines/*",)
    assert access.grants(vms, "microsoft.compute/virtualmachines/deallocate/action")
    assert not access.grants(vms, "Microsoft.Compute/disks/delete")
    assert access.grants(("*/read",), "Microsoft.Network/networkInterfaces/read")
    assert access.within("/s/1/rg/g/vm/a", "/S/1/rg/g/vm/a/deallocate")
    assert not access.within("/s/1/rg/g/vm/a", "/s/1/rg/g/vm/ab")
    subnet = "/subscriptions/s/resourceGroups/g/providers/Microsoft.Network/virtualNetworks/v/subnets/n"
    assert access.action_of("x", "GET", subnet) == "Microsoft.Network/virtualNetworks/subnets/read"
    assert access.action_of("virtualMachines.deallocate", "POST", "") == \
        "Microsoft.Compute/virtualMachines/deallocate/action"


def test_the_node_agent_asks_for_the_compute_api_version_the_stand_in_serves():
    assert node.AZURE_COMPUTE_API == COMPUTE_API


def test_resource_skus_list_the_sizes_of_a_location_and_what_they_can_do(arm, clients):
    arm.restrict_size("Standard_NC40ads_H100_v5", LOCATION)
    listed = {s.name: s for s in clients[2].resource_skus.list(filter=f"location eq '{LOCATION}'")}
    assert "Standard_NC6" not in listed and all(s.locations == [LOCATION] for s in listed.values())
    capabilities = {c.name: c.value for c in listed["Standard_B2s"].capabilities}
    assert (capabilities["AcceleratedNetworkingEnabled"], capabilities["LowPriorityCapable"]) == ("False", "False")
    assert [r.reason_code for r in listed["Standard_NC40ads_H100_v5"].restrictions] == ["NotAvailableForSubscription"]
    assert len(list(clients[2].resource_skus.list())) == len(listed) * len(arm.locations)
    with pytest.raises(HttpResponseError) as caught:
        list(clients[2].resource_skus.list(filter="name eq 'x'"))
    assert code_of(caught.value) == "InvalidFilterInQueryString"


def test_a_vm_of_a_size_it_cannot_be_is_refused_as_crp_refuses_it(arm, clients):
    arm.restrict_size("Standard_NC40ads_H100_v5", LOCATION)
    [nic] = network(clients)
    accelerated = clients[1].network_interfaces.get(RG, "nic-0")
    accelerated.enable_accelerated_networking = True
    clients[1].network_interfaces.begin_create_or_update(RG, "nic-0", accelerated).result()
    for size, spot, status, code in (("Standard_NC40ads_H100_v5", False, 409, "SkuNotAvailable"),
                                     ("Standard_NC6", False, 400, "InvalidParameter"),
                                     ("Standard_B2s", True, 400, "InvalidParameter"),
                                     ("Standard_B2s", False, 400, "VMSizeIsNotPermittedToEnableAcceleratedNetworking")):
        with pytest.raises(HttpResponseError) as caught:
            create_vm(clients, arm, "vm-1", nic, size=size, spot=spot)
        assert (caught.value.status_code, code_of(caught.value)) == (status, code), caught.value.message
    assert list(clients[2].virtual_machines.list(RG)) == []

"""What `kiln up --provider azure` asks Azure Resource Manager for, decided without touching it: validation, tags,
names, and the request bodies (in ARM's own JSON, as its REST reference documents them). Pure, and unit-tested for
exact output; bootstrap.providers.azure.cloud makes the calls.

A cluster NAME is one resource group, kiln-NAME, so that `down` (deleting the group) cannot miss a resource: a
virtual network with one subnet, a network security group (the subnet to itself, SSH from --ssh-cidr only), a
proximity placement group, and per node a public address, a network interface and a VM (the cluster's own SSH key,
password logins off, boot diagnostics on: its serial log shows the host keys), with a managed data disk where
--volume asks. An RDMA size (ND96isr_H100_v5, ND96asr_v4, HB120rs_v3...) reaches the other nodes over InfiniBand
only where they share its fabric: in one scale set or availability set. Its VMs join one Flexible scale set,
kiln-NAME-vmss, made with no VM profile, in the placement group, on a single placement group (one fabric).
Snapshots of the data disks live outside it, in kiln_snapshots_LOCATION, so they outlive the cluster. Everything
carries the tags kiln:cluster, kiln:owner and kiln:expires.

Autostop: a VM that shuts itself down stays allocated and billed, so the node's idle agent deallocates its own VM
through Resource Manager, as its system-assigned managed identity. That identity holds one built-in role that
can power a VM on and off and no more (POWER_ROLE), at the scope of its own VM only: no other node, disk or
network of the cluster.
"""

from __future__ import annotations

import base64
import json
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from bootstrap.autostop import validate_idle_minutes
from bootstrap.errors import UsageError
from bootstrap.providers import catalog
from bootstrap.providers.common import (
    DATA_MOUNT,
    CloudRequest,
    first_boot_settings,
    format_time,
    matching,
    parse_image_tags,
    validate_cidr,
    validate_count,
    validate_max_price,
    validate_name,
    validate_ttl,
    validate_volume,
)
from bootstrap.providers.failover import Unavailable

# Where Azure's users keep a place not given on the command line, by option
ENV = {"location": ("AZURE_LOCATION",), "subscription": ("AZURE_SUBSCRIPTION_ID",)}
SUBSCRIPTION_PLACEHOLDER = "00000000-0000-0000-0000-000000000000"  # up --dry-run, where none is known
TAG_CLUSTER = "kiln:cluster"
TAG_OWNER = "kiln:owner"
TAG_EXPIRES = "kiln:expires"
TAG_PROFILE = "kiln:profile"  # on kiln's images (packer/source.azure.pkr.hcl writes their tags)
TAG_NODE = "kiln:node"  # on a VM: its node's index
TAG_DATA = "kiln:data"  # on a data disk and its snapshots: the node's index
TAG_SNAPSHOT_SET = "kiln:snapshot-set"  # the snapshots of one `down --snapshot`: its time

LOCATION = re.compile(r"[a-z][a-z0-9]{2,30}")
VM_SIZE = re.compile(r"Standard_[A-Za-z0-9_]+")
IMAGE_ID = re.compile(r"/subscriptions/[0-9a-f-]{36}/resourceGroups/[-\w.()]{1,90}/providers/Microsoft\.Compute/"
                      r"(images/[-\w.]{1,80}|galleries/\w[\w.]{0,79}/images/[-\w.]{1,80}/versions/"
                      r"(latest|\d+\.\d+\.\d+))", re.IGNORECASE)
# A size's name: Standard_, the family (capitals), the vCPUs (and -N constrained ones), the feature letters, then
# _accelerator and _version parts: Standard_ND96isr_H100_v5 is ND, 96, "isr". "r" among the letters is RDMA: an
# InfiniBand interface (learn.microsoft.com/azure/virtual-machines/vm-naming-conventions; setup-infiniband: "N-series
# sizes designated with 'r' are also RDMA-capable")
SIZE_NAME = re.compile(r"Standard_(?P<family>[A-Z]+)(?P<vcpus>\d+)(-\d+)?(?P<features>[a-z]*)(_.*)?")
SUBSCRIPTION = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# `kiln up`'s default: the first of the catalog's Azure GPU sizes (kiln up --gpus picks from them).
DEFAULT_VM_SIZE = catalog.default_type("azure")
ADDRESS_SPACE = "10.42.0.0/16"
SUBNET = "10.42.0.0/20"
OS_DISK_GB = 128
DISK_SKU = "Premium_LRS"
DATA_LUN = 0
# The narrowest built-in role that may deallocate a VM, "Desktop Virtualization Power On Off Contributor" (made for
# Azure Virtual Desktop): at a VM's scope, read, start, restart, power off and deallocate it; not write or delete
# it, run commands on it or add extensions (what "Virtual Machine Contributor" would allow whoever takes the token)
POWER_ROLE = "40c5ff49-9181-41f8-ae61-143b0e78555e"
# The scale set an RDMA size's VMs join (one InfiniBand fabric; learn.microsoft.com/azure/virtual-machines/
# setup-infiniband): Flexible, since only a Flexible set takes VMs made apart from it (virtual-machine-scale-sets-
# attach-detach-vm); one fault domain, maximal spreading (virtual-machine-scale-sets-manage-fault-domains, Flexible's
# default); a single placement group, which InfiniBand in a scale set needs and which Azure's Compute provider
# asks of a Flexible set for such sizes (Azure/azure-cli#21834)
SCALE_SET_PROPERTIES = {"orchestrationMode": "Flexible", "platformFaultDomainCount": 1, "singlePlacementGroup": True}
IMAGE_PLACEHOLDER = "<newest image tagged kiln:profile={profile}{more}>"
PUBLIC_KEY_PLACEHOLDER = "<public key of {path}>"


@dataclass(frozen=True, kw_only=True)
class Request(CloudRequest):
    """What the operator asked for on Azure: a location, a VM size, an image (or the newest of the profile's, by
    its tags), a Spot price, a data disk; the login is azureuser unless given."""

    location: str
    vm_size: str
    image_id: str | None = None
    image_tags: tuple[tuple[str, str], ...] = ()
    max_price: float | None = None
    user: str = "azureuser"
    volume_gb: int | None = None


def validate_request(name: str, count, vm_size: str | None, *, location: str | None, ssh_cidr: str | None,
                     image_id: str | None = None, image_profile: str = "gpu", image_tags: str | None = None,
                     spot: bool = False, max_price=None, user: str = "azureuser", ttl_hours=24.0, volume_gb=None,
                     idle_minutes: float | None = None) -> Request:
    """Check everything that can be checked without Azure; raise one UsageError line naming the bad input."""
    validate_name(name)
    count = validate_count(count)
    matching(location, LOCATION, "location", "an Azure region name", "eastus", "set AZURE_LOCATION")
    vm_size = matching(vm_size or DEFAULT_VM_SIZE, VM_SIZE, "instance-type", "an Azure VM size", DEFAULT_VM_SIZE)
    if image_id is not None and not IMAGE_ID.fullmatch(image_id):
        raise UsageError(f"--image-id {image_id!r}: give a managed image's id (/subscriptions/S/resourceGroups/G/"
                         "providers/Microsoft.Compute/images/NAME) or a gallery image version's (.../galleries/G/"
                         "images/D/versions/1.2.3 or latest)")
    if image_id is None and not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,63}", image_profile or ""):
        raise UsageError(f"--image-profile {image_profile!r}: use lowercase letters, digits, '-' and '_'")
    if max_price is not None:
        if not spot:
            raise UsageError("--max-price applies to Spot VMs only: add --spot")
        max_price = validate_max_price(max_price)
    if not re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}", user or "") or user in ("root", "admin", "administrator"):
        raise UsageError(f"--user {user!r} is not a login name Azure takes")
    ttl_hours = validate_ttl(ttl_hours)
    ssh_cidr = validate_cidr(ssh_cidr)
    if ":" in ssh_cidr:
        raise UsageError(f"--ssh-cidr {ssh_cidr}: kiln's Azure nodes have IPv4 addresses only; give an IPv4 range")
    return Request(name=name, count=count, location=location, vm_size=vm_size, ssh_cidr=ssh_cidr, image_id=image_id,
                   image_profile=image_profile, image_tags=parse_image_tags(image_tags), spot=bool(spot),
                   max_price=max_price, user=user, ttl_hours=ttl_hours, volume_gb=validate_volume(volume_gb),
                   idle_minutes=validate_idle_minutes(idle_minutes) or None)


def cluster_tags(name: str, owner: str, now: datetime, ttl_hours: float) -> dict[str, str]:
    return {TAG_CLUSTER: name, TAG_OWNER: owner[:256], TAG_EXPIRES: format_time(now + timedelta(hours=ttl_hours))}


def group_name(name: str) -> str:
    return f"kiln-{name}"


def snapshot_group(location: str) -> str:
    """Outside every cluster's group: no cluster name (letters, digits, '-') can make this one."""
    return f"kiln_snapshots_{location}"


def vm_name(name: str, index: int, suffix: str = "") -> str:
    """kiln-NAME-INDEX, and a replacement kiln-NAME-INDEX-SUFFIX (a name is not free while the old VM lives)."""
    return f"kiln-{name}-{index}" + (f"-{suffix}" if suffix else "")


def scale_set_name(name: str) -> str:
    return f"kiln-{name}-vmss"


def disk_name(name: str, index: int) -> str:
    return f"kiln-{name}-data-{index}"


def resource_id(subscription: str, group: str, kind: str, name: str) -> str:
    """`kind` as ARM names it: Microsoft.Network/virtualNetworks, Microsoft.Compute/disks..."""
    return f"/subscriptions/{subscription}/resourceGroups/{group}/providers/{kind}/{name}"


def image_matches(tags: Mapping[str, str], profile: str, wanted: tuple[tuple[str, str], ...]) -> bool:
    return tags.get(TAG_PROFILE) == profile and all(tags.get(key) == value for key, value in wanted)


def network_body(request: Request, tags: Mapping[str, str], nsg_id: str) -> dict:
    """The cluster's virtual network: one subnet, behind the cluster's security group."""
    return {"location": request.location, "tags": dict(tags),
            "properties": {"addressSpace": {"addressPrefixes": [ADDRESS_SPACE]},
                           "subnets": [{"name": "nodes", "properties": {
                               "addressPrefix": SUBNET, "networkSecurityGroup": {"id": nsg_id}}}]}}


def security_group_body(request: Request, tags: Mapping[str, str]) -> dict:
    """SSH from the operator's range only, and the cluster's subnet to itself; Azure's default rules deny every
    other inbound flow from outside the virtual network."""
    def rule(name: str, priority: int, source: str, ports: str, protocol: str) -> dict:
        return {"name": name, "properties": {
            "priority": priority, "direction": "Inbound", "access": "Allow", "protocol": protocol,
            "sourceAddressPrefix": source, "sourcePortRange": "*", "destinationAddressPrefix": SUBNET,
            "destinationPortRange": ports}}

    return {"location": request.location, "tags": dict(tags), "properties": {"securityRules": [
        rule("kiln-ssh", 100, request.ssh_cidr, "22", "Tcp"), rule("kiln-cluster", 110, SUBNET, "*", "*")]}}


def placement_group_body(request: Request, tags: Mapping[str, str]) -> dict:
    return {"location": request.location, "tags": dict(tags), "properties": {"proximityPlacementGroupType": "Standard"}}


def rdma_by_name(size: str) -> bool:
    """Whether a VM size's name says RDMA: an "r" among its feature letters (ND96isr_H100_v5, HB120-96rs_v3, not
    NC24ads_A100_v4)."""
    found = SIZE_NAME.fullmatch(size)
    return bool(found) and "r" in found["features"]


def scale_set_body(request: Request, tags: Mapping[str, str], placement_id: str) -> dict:
    """The Flexible scale set an RDMA size's VMs join: no VM profile (kiln makes each VM), in the cluster's
    placement group (set on the scale set, where Azure asks it to be, and kept on each VM: the same group)."""
    return {"location": request.location, "tags": dict(tags), "properties": {
        **SCALE_SET_PROPERTIES, "proximityPlacementGroup": {"id": placement_id}}}


def public_address_body(request: Request, tags: Mapping[str, str]) -> dict:
    return {"location": request.location, "tags": dict(tags), "sku": {"name": "Standard"},
            "properties": {"publicIPAllocationMethod": "Static", "publicIPAddressVersion": "IPv4"}}


def interface_body(request: Request, tags: Mapping[str, str], *, subnet_id: str, address_id: str,
                   accelerated: bool = True) -> dict:
    """A VM's interface: accelerated networking where its size has it (SR-IOV: what NCCL's TCP path wants)."""
    return {"location": request.location, "tags": dict(tags), "properties": {
        "enableAcceleratedNetworking": accelerated,
        "ipConfigurations": [{"name": "primary", "properties": {
            "subnet": {"id": subnet_id}, "publicIPAddress": {"id": address_id},
            "privateIPAllocationMethod": "Dynamic"}}]}}


@dataclass(frozen=True)
class SizeFacts:
    """What kiln needs of a VM size in one location, as the Resource SKUs API lists it."""

    name: str
    gpus: int = 0
    accelerated_networking: bool = False
    premium_io: bool = False
    spot: bool = False
    restriction: str = ""  # the reason code of a restriction on this subscription in the location
    rdma: bool = False  # an InfiniBand interface: its VMs join one scale set (one fabric)


def size_facts(documents: Iterable[Mapping], location: str) -> dict[str, SizeFacts]:
    """The VM sizes offered in `location`, by name, from ARM's resource SKU documents (every resource type)."""
    found = {}
    for sku in documents:
        if sku.get("resourceType") != "virtualMachines" or location.lower() not in (
                place.lower() for place in sku.get("locations") or ()):
            continue
        capability = {c.get("name"): str(c.get("value")) for c in sku.get("capabilities") or ()}
        restricted = next((r.get("reasonCode") or "restricted" for r in sku.get("restrictions") or ()
                           if r.get("type") == "Location" and location.lower() in
                           (v.lower() for v in r.get("values") or ())), "")
        gpus = capability.get("GPUs", "0")
        # RdmaEnabled is listed for the RDMA sizes; where a document has no word on it, the name says
        rdma = capability["RdmaEnabled"] == "True" if "RdmaEnabled" in capability else rdma_by_name(sku["name"])
        found[sku["name"]] = SizeFacts(
            sku["name"], int(gpus) if gpus.isdigit() else 0, capability.get("AcceleratedNetworkingEnabled") == "True",
            capability.get("PremiumIO") == "True", capability.get("LowPriorityCapable") == "True", restricted, rdma)
    return found


def check_size(request: Request, sizes: Mapping[str, SizeFacts]) -> SizeFacts:
    """The facts of the size asked for, once it is offered in the location, open to the subscription, takes
    kiln's Premium SSD disks and, with --spot, runs as Spot; else one line saying which."""
    facts = next((f for name, f in sizes.items() if name.lower() == request.vm_size.lower()), None)
    if facts is None:
        gpu = sorted(name for name, f in sizes.items() if f.gpus and not f.restriction)
        raise Unavailable(f"--instance-type {request.vm_size}: not offered in {request.location}"
                          + (f"; GPU sizes open to you there: {', '.join(gpu)}" if gpu else ""), code="SkuNotAvailable")
    if facts.restriction:
        raise Unavailable(f"--instance-type {facts.name}: not open to this subscription in {request.location} "
                          f"({facts.restriction}); ask Azure for access, or try another --location",
                          code="SkuNotAvailable")
    if not facts.premium_io:
        raise UsageError(f"--instance-type {facts.name}: takes no Premium SSD disks, which kiln's are")
    if request.spot and not facts.spot:  # with --on-demand-fallback, the on-demand candidates' turn
        raise Unavailable(f"--spot: {facts.name} cannot run as a Spot VM", code="SpotNotSupported")
    return facts


def custom_data(request: Request) -> str | None:
    """cloud-init's first-boot settings of the data disk, as the VM's customData (base64)."""
    if not request.volume_gb:
        return None
    return base64.b64encode(first_boot_settings(request.volume_gb, request.user).encode()).decode()


def vm_body(request: Request, *, index: int, image_id: str, public_key: str, tags: Mapping[str, str],
            interface_id: str, placement_id: str, data_disk_id: str | None = None, identity: bool = False,
            scale_set_id: str | None = None) -> dict:
    """virtualMachines' create body for node `index`: password logins off, the cluster's key only; boot
    diagnostics on (its serial log shows the host keys); the OS disk and the interface go with the VM, a data
    disk stays (detached); Spot VMs are deleted when evicted (a deallocated one still bills for its disks); in the
    cluster's scale set where it has one (an RDMA size: scale_set_body)."""
    properties = {
        "hardwareProfile": {"vmSize": request.vm_size},
        "storageProfile": {
            "imageReference": {"id": image_id},
            "osDisk": {"createOption": "FromImage", "diskSizeGB": OS_DISK_GB, "deleteOption": "Delete",
                       "managedDisk": {"storageAccountType": DISK_SKU}},
            "dataDisks": [{"lun": DATA_LUN, "createOption": "Attach", "deleteOption": "Detach",
                           "managedDisk": {"id": data_disk_id}}] if data_disk_id else []},
        "osProfile": {"computerName": vm_name(request.name, index), "adminUsername": request.user,
                      "linuxConfiguration": {"disablePasswordAuthentication": True, "ssh": {"publicKeys": [
                          {"path": f"/home/{request.user}/.ssh/authorized_keys", "keyData": public_key}]}}},
        "networkProfile": {"networkInterfaces": [{"id": interface_id, "properties": {
            "primary": True, "deleteOption": "Delete"}}]},
        "diagnosticsProfile": {"bootDiagnostics": {"enabled": True}},
    }
    if scale_set_id:  # the scale set holds the placement group, and its VMs are placed by it (Azure's advice)
        properties["virtualMachineScaleSet"] = {"id": scale_set_id}
    else:
        properties["proximityPlacementGroup"] = {"id": placement_id}
    data = custom_data(request)
    if data:
        properties["osProfile"]["customData"] = data
    if request.spot:
        properties |= {"priority": "Spot", "evictionPolicy": "Delete",
                       "billingProfile": {"maxPrice": request.max_price if request.max_price else -1}}
    body = {"location": request.location, "tags": {**tags, TAG_NODE: str(index)}, "properties": properties}
    return {**body, "identity": SYSTEM_IDENTITY} if identity else body


SYSTEM_IDENTITY = {"type": "SystemAssigned"}  # a VM's own managed identity: it goes when the VM goes


def has_system_identity(identity_type: str | None) -> bool:
    """Whether a VM's identity type ("SystemAssigned", "SystemAssigned, UserAssigned", None...) includes its own."""
    return "systemassigned" in (identity_type or "").replace(" ", "").lower().split(",")


def assignment_name(vm_id: str, principal_id: str) -> str:
    """The GUID naming a VM's autostop role assignment: one VM, principal and role always give the same."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"kiln-autostop:{vm_id.lower()}:{principal_id}:{POWER_ROLE}"))


def self_deallocation(subscription: str, vm_id: str, principal_id: str) -> tuple[str, dict]:
    """The role assignment that lets a VM's identity deallocate that VM alone: its name (a GUID that one VM,
    principal and role always give, so that arming twice asks for the same one) and body."""
    role = f"/subscriptions/{subscription}/providers/Microsoft.Authorization/roleDefinitions/{POWER_ROLE}"
    return assignment_name(vm_id, principal_id), {"properties": {
        "roleDefinitionId": role, "principalId": principal_id, "principalType": "ServicePrincipal",
        "description": "kiln autostop: the VM may deallocate itself"}}


def disk_body(request: Request, *, index: int, tags: Mapping[str, str], snapshot_id: str | None = None,
              snapshot_gb: int = 0) -> dict:
    """A managed data disk for node `index`: empty, or copied from a snapshot (never smaller than it)."""
    creation = {"createOption": "Copy", "sourceResourceId": snapshot_id} if snapshot_id else {
        "createOption": "Empty"}
    return {"location": request.location, "tags": {**tags, TAG_DATA: str(index)}, "sku": {"name": DISK_SKU},
            "properties": {"creationData": creation, "diskSizeGB": max(request.volume_gb or 0, snapshot_gb)}}


def snapshot_body(disk_id: str, location: str, tags: Mapping[str, str], moment: datetime, ttl_days: float) -> dict:
    """A snapshot of a data disk: it keeps the cluster's name and owner and the node's index, and expires on its
    own clock; a disk kept when its snapshot failed carries the set it missed (so a retry completes that set)."""
    taken = tags.get(TAG_SNAPSHOT_SET) or format_time(moment)
    kept = {key: tags[key] for key in (TAG_CLUSTER, TAG_OWNER, TAG_DATA) if key in tags}
    return {"location": location, "tags": {**kept, TAG_SNAPSHOT_SET: taken,
                                           TAG_EXPIRES: format_time(moment + timedelta(days=ttl_days))},
            "properties": {"creationData": {"createOption": "Copy", "sourceResourceId": disk_id},
                           "incremental": False}}


def snapshot_name(disk: str, taken: str) -> str:
    return f"{disk}-{taken.lower().replace(':', '').replace('-', '')}"


# Azure's Retail Prices API (no sign-in): every meter's price, filtered with OData. A VM size has a meter per OS and
# kind of use; Spot ones end their skuName with "Spot", Windows ones name Windows in their productName.
RETAIL_PRICES = "https://prices.azure.com"
RETAIL_PRICES_API = "2023-01-01-preview"


def price_filter(location: str | None, size: str) -> str:
    """The $filter that asks for one size's pay-as-you-go meters in one location (None: in every location; both
    checked first: they go into the filter's quotes)."""
    if location is not None and not LOCATION.fullmatch(location) or not VM_SIZE.fullmatch(size):
        raise UsageError(f"no prices for {size!r} in {location!r}: not a VM size and a location")
    where = f" and armRegionName eq '{location}'" if location else ""
    return f"serviceName eq 'Virtual Machines'{where} and armSkuName eq '{size}' and priceType eq 'Consumption'"


def lowest_prices(items: Iterable[Mapping], *, spot: bool) -> dict[str, float]:
    """Each size's Linux price per hour from the Retail Prices API's items of one location (lowest_prices_by_place);
    the lowest where a size has several."""
    lowest: dict[str, float] = {}
    for (size, _), usd in lowest_prices_by_place(items, spot=spot).items():
        lowest[size] = min(lowest.get(size, usd), usd)
    return lowest


def lowest_prices_by_place(items: Iterable[Mapping], *, spot: bool) -> dict[tuple[str, str], float]:
    """Each (size, location)'s Linux price per hour from the Retail Prices API's items: its Spot meters (spot),
    else its pay-as-you-go ones (neither Spot nor Low Priority); never Windows', priced by the hour in USD; the
    lowest where it has several."""
    lowest: dict[tuple[str, str], float] = {}
    for item in items:
        sku = str(item.get("skuName", ""))
        kind = sku.endswith(" Spot") if spot else not sku.endswith((" Spot", " Low Priority"))
        if (kind and "Windows" not in str(item.get("productName", ""))
                and item.get("unitOfMeasure") == "1 Hour" and item.get("currencyCode", "USD") == "USD"
                and item.get("armSkuName") and isinstance(item.get("unitPrice"), int | float)):
            key = (item["armSkuName"], str(item.get("armRegionName", "")).lower())
            lowest[key] = min(lowest.get(key, float("inf")), float(item["unitPrice"]))
    return lowest


def from_options(name: str, count, options: Mapping[str, Any], idle_minutes: float | None,
                 place: Mapping[str, str | None]) -> Request:
    """A `kiln up`'s request on Azure from its options and its location (validate_request)."""
    return validate_request(
        name, count, options.get("instance_type"), location=place.get("location"), ssh_cidr=options.get("ssh_cidr"),
        image_id=options.get("image_id"), image_profile=options.get("image_profile") or "gpu",
        image_tags=options.get("image_tags"), spot=bool(options.get("spot")), max_price=options.get("max_price"),
        user=options.get("user") or "azureuser", ttl_hours=options.get("ttl_hours", 24.0),
        volume_gb=options.get("volume"), idle_minutes=idle_minutes)


def dry_run(request: Request, *, key: str, place: Mapping[str, str | None], now: datetime) -> list[str]:
    """What `up` would do on Azure (up --dry-run), up to the wait: the resources of its group, with their bodies
    (its autostop's identity and role last)."""
    sub = place.get("subscription") or SUBSCRIPTION_PLACEHOLDER
    group = group_name(request.name)
    tags = cluster_tags(request.name, "you", now, request.ttl_hours)
    more = "".join(f", {k}={v}" for k, v in request.image_tags)
    image = request.image_id or IMAGE_PLACEHOLDER.format(profile=request.image_profile, more=more)
    nsg = resource_id(sub, group, "Microsoft.Network/networkSecurityGroups", f"{group}-nsg")
    lines = [f"cluster {request.name}: key {key} (made if missing), then in resource group {group} "
             f"({request.location}); any failure deletes the group",
             f"resourceGroups {json.dumps({'location': request.location, 'tags': tags})}",
             f"networkSecurityGroups {group}-nsg {json.dumps(security_group_body(request, tags))}",
             f"virtualNetworks {group}-vnet {json.dumps(network_body(request, tags, nsg))}",
             f"proximityPlacementGroups {group}-ppg {json.dumps(placement_group_body(request, tags))}"]
    # up asks Resource SKUs (RdmaEnabled); the dry run, which asks Azure nothing, goes by the size's name
    scale_set = scale_set_name(request.name) if rdma_by_name(request.vm_size) else None
    if scale_set:
        body = scale_set_body(request, tags, f"<{group}-ppg>")
        lines.append(f"virtualMachineScaleSets {scale_set} {json.dumps(body)} ({request.vm_size} is an RDMA "
                     "size: its VMs reach each other over InfiniBand only within one scale set)")
    if request.volume_gb:
        lines.append(f"disks {disk_name(request.name, 0)} {json.dumps(disk_body(request, index=0, tags=tags))} "
                     f"(each node one, from the cluster's newest snapshot of it if any; mounted at {DATA_MOUNT})")
    vm = vm_name(request.name, 0)
    body = vm_body(request, index=0, image_id=image, public_key=PUBLIC_KEY_PLACEHOLDER.format(path=f"{key}.pub"),
                   tags=tags, interface_id=f"<{vm}-nic>", placement_id=f"<{group}-ppg>",
                   data_disk_id=f"<{disk_name(request.name, 0)}>" if request.volume_gb else None,
                   scale_set_id=f"<{scale_set}>" if scale_set else None)
    lines.append(f"per node: publicIPAddresses {vm}-ip, networkInterfaces {vm}-nic, virtualMachines {vm} "
                 f"{json.dumps(body)} (node 0 of {request.count})")
    if request.idle_minutes:
        _, assignment = self_deallocation(sub, f"<{vm} id>", f"<{vm} principal>")
        lines.append(f"autostop: each VM gets identity {json.dumps(SYSTEM_IDENTITY)} and, on its own scope, "
                     f"roleAssignments <GUID> {json.dumps(assignment)}; its idle agent deallocates it after "
                     f"{request.idle_minutes:g} minute(s) without a kiln run")
    return lines

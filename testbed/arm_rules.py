"""The pure rules of the ARM stand-in (testbed/arm.py): errors as ARM writes them, resource ids, names, tags, the
request schema (the SDK's own model classes), VM sizes, images, list filters and pages. Nothing here holds state or
touches the network."""

from __future__ import annotations

import datetime
import enum
import ipaddress
import json
import re
import sys
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from http import HTTPStatus

# api-version each provider's routes take: the one the installed SDK sends (azure-mgmt-compute 39.0.0,
# azure-mgmt-network 33.1.0, azure-mgmt-resource 26.0.0); any other is refused as ARM refuses an unknown one.
RESOURCES_API = "2025-04-01"  # resource groups
COMPUTE_API = "2026-04-01"  # virtualMachines, proximityPlacementGroups, images
DISK_API = "2026-03-02"  # disks, snapshots
GALLERY_API = "2026-03-03"  # galleries, their images and versions
NETWORK_API = "2026-03-01"  # every Microsoft.Network type
SKUS_API = "2021-07-01"  # resourceSkus

PAGE_SIZE = 50
MAX_TAGS, MAX_TAG_NAME, MAX_TAG_VALUE = 50, 512, 256
TAG_NAME_FORBIDDEN = "<>%&\\?/"
RG_NAME_RE = re.compile(r"[-\w.()]{1,90}")
VM_NAME_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,62}[A-Za-z0-9])?")
LINUX_HOST_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,62}[A-Za-z0-9])?")
NAME_RE = re.compile(r"\w([\w.-]{0,78}\w)?")  # networking types, disks, snapshots, placement groups
NOT_FOUND_FIX = "For more details please go to https://aka.ms/ARMResourceNotFoundFix"


class ArmError(Exception):
    """An error ARM answers: HTTP status, error code, message (and the target ARM names for some)."""

    def __init__(self, status: int, code: str, message: str, target: str | None = None):
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message, self.target = status, code, message, target

    def error(self) -> dict:
        return {"code": self.code, "message": self.message, **({"target": self.target} if self.target else {})}

    def body(self) -> dict:
        return {"error": self.error()}


def invalid_parameter(message: str, target: str | None = None) -> ArmError:
    return ArmError(400, "InvalidParameter", message, target)


def group_not_found(group: str) -> ArmError:
    return ArmError(404, "ResourceGroupNotFound", f"Resource group '{group}' could not be found.")


def resource_not_found(type_name: str, name: str, group: str) -> ArmError:
    """ARM's own 404 for a tracked resource (`Microsoft.Compute/virtualMachines`, `vm-1`)."""
    return ArmError(404, "ResourceNotFound",
                    f"The Resource '{type_name}/{name}' under resource group '{group}' was not found. {NOT_FOUND_FIX}")


def request_content(detail: str) -> ArmError:
    return ArmError(400, "InvalidRequestContent",
                    f"The request content was invalid and could not be deserialized: '{detail}'")


def fault_message(code: str, status: int, size: str = "", cores: int = 0, location: str = "",
                  family: str = "") -> str:
    """The message Azure writes for a capacity or quota error code (and the HTTP phrase for any other)."""
    if code == "OperationNotAllowed" and family:
        return (f"Operation could not be completed as it results in exceeding approved {family} Cores quota. "
                f"Additional details - Deployment Model: Resource Manager, Location: {location}, Current Limit: 0, "
                f"Current Usage: 0, Additional Required: {cores}, (Minimum) New Limit Required: {cores}. Submit a "
                "request for Quota increase at https://aka.ms/ProdportalCRP/#blade/Microsoft_Azure_Capacity/"
                "UsageAndQuota.ReactView by specifying parameters listed in the 'Details' section for deployment "
                "to succeed. Please read more about quota limits at https://docs.microsoft.com/en-us/azure/"
                "azure-supportability/per-vm-quota-requests")
    if code == "AllocationFailed":
        return ("Allocation failed. We do not have sufficient capacity for the requested VM size in this region. "
                "Read more about improving likelihood of allocation success at http://aka.ms/allocation-guidance")
    if code == "ZonalAllocationFailed":
        return ("Allocation failed. We do not have sufficient capacity for the requested VM size in this zone. "
                "Read more about improving likelihood of allocation success at http://aka.ms/allocation-guidance")
    if code == "SkuNotAvailable":
        return (f"The requested VM size for resource 'Following SKUs have failed for Capacity Restrictions: {size}' "
                f"is currently not available in location '{location}'. Please try another size or deploy to a "
                "different location or different zone. See https://aka.ms/azureskunotavailable for details.")
    return HTTPStatus(status).phrase


# ------------------------------------------------------------------------------------------------------ resource ids


@dataclass(frozen=True)
class ResourceId:
    """`/subscriptions/S/resourceGroups/G/providers/NS/type/name[/subtype/subname]`, parts as written."""

    subscription: str
    group: str
    namespace: str
    types: tuple[str, ...]
    names: tuple[str, ...]

    @property
    def type(self) -> str:
        return "/".join((self.namespace, *self.types))

    @property
    def name(self) -> str:
        return self.names[-1]

    @property
    def parent(self) -> ResourceId:
        return ResourceId(self.subscription, self.group, self.namespace, self.types[:-1], self.names[:-1])

    def child(self, kind: str, name: str) -> ResourceId:
        return ResourceId(self.subscription, self.group, self.namespace, (*self.types, kind), (*self.names, name))

    def __str__(self) -> str:
        tail = "/".join(f"{t}/{n}" for t, n in zip(self.types, self.names, strict=True))
        return f"/subscriptions/{self.subscription}/resourceGroups/{self.group}/providers/{self.namespace}/{tail}"

    @property
    def key(self) -> str:
        """The id as ARM compares them: without regard to case."""
        return str(self).lower()


_ID_RE = re.compile(r"/subscriptions/([^/]+)/resourceGroups/([^/]+)/providers/([^/]+)/((?:[^/]+/[^/]+/?)+)",
                    re.IGNORECASE)


def parse_id(text: object) -> ResourceId | None:
    """The parts of a resource id, or None when `text` is no resource id."""
    found = _ID_RE.fullmatch(text.rstrip("/")) if isinstance(text, str) else None
    if not found:
        return None
    parts = found[4].rstrip("/").split("/")
    return ResourceId(found[1], found[2], found[3], tuple(parts[0::2]), tuple(parts[1::2]))


def id_of(value: object) -> str:
    """The `id` of a sub-resource reference ({"id": ...}) in a request, or ""."""
    return value.get("id") or "" if isinstance(value, Mapping) else ""


# ------------------------------------------------------------------------------------------------------ names, tags


def check_group_name(name: str) -> None:
    if not RG_NAME_RE.fullmatch(name) or name.endswith("."):
        bad = "".join(sorted(set(re.sub(r"[-\w.()]", "", name)))) or name[-1:]
        raise ArmError(400, "InvalidResourceGroup",
                       f"The provided resource group name '{name}' has these invalid characters: '{bad}'. The name "
                       "can only be a letter, digit, '-', '.', '(', ')' or '_'.")


def check_name(type_name: str, name: str) -> None:
    """ARM's name rules for the types served: virtual machines (1-64: letters, digits, '-'), the others 1-80."""
    if type_name.lower() == "microsoft.compute/virtualmachines":
        if not VM_NAME_RE.fullmatch(name):
            raise invalid_parameter(
                f"The virtual machine name '{name}' is invalid. It can contain only letters, digits and '-', must "
                "begin and end with a letter or digit and be at most 64 characters long.", "vmName")
        return
    if not NAME_RE.fullmatch(name):
        raise ArmError(400, "InvalidResourceName",
                       f"Resource name {name} is invalid. The name can be up to 80 characters long. It must begin "
                       "with a word character, and it must end with a word character or with '_'. The name may "
                       "contain word characters or '.', '-', '_'.")


def check_computer_name(name: str) -> None:
    if not LINUX_HOST_RE.fullmatch(name) or name.isdigit():
        raise invalid_parameter(
            "Linux host name cannot exceed 64 characters in length or contain the following characters: "
            "` ~ ! @ # $ % ^ & * ( ) = + _ [ ] { } \\ | ; : ' \" , < > / ?.", "computerName")


def check_tags(tags: object) -> dict[str, str]:
    """The tags as ARM stores them; 400 InvalidTag beyond ARM's limits."""
    if tags is None:
        return {}
    if not isinstance(tags, Mapping) or not all(isinstance(v, str) for v in tags.values()):
        raise request_content("Tags must be an object of string values. Path 'tags'.")
    if len(tags) > MAX_TAGS:
        raise ArmError(400, "InvalidTag", f"The number of tags {len(tags)} exceeds the maximum of {MAX_TAGS}.")
    for name, value in tags.items():
        if not name or len(name) > MAX_TAG_NAME:
            raise ArmError(400, "InvalidTag", f"The tag name '{name[:40]}' must be 1 to {MAX_TAG_NAME} characters.")
        if any(c in TAG_NAME_FORBIDDEN for c in name):
            raise ArmError(400, "InvalidTag", f"The tag name '{name}' has invalid characters '<,>,%,&,\\,?,/'.")
        if len(value) > MAX_TAG_VALUE:
            raise ArmError(400, "InvalidTag",
                           f"The tag value of tag '{name}' exceeds the maximum length of {MAX_TAG_VALUE} characters.")
    return dict(tags)


def check_location(location: object, locations: tuple[str, ...], type_name: str) -> str:
    """The location in ARM's normal form ("East US" -> "eastus"); 400 where it is missing or not offered."""
    if not isinstance(location, str) or not location:
        raise ArmError(400, "LocationRequired", "The location property is required for this definition.")
    normal = location.replace(" ", "").lower()
    if normal in locations:
        return normal
    if type_name == "Microsoft.Resources/resourceGroups":
        raise ArmError(400, "LocationNotAvailableForResourceGroup",
                       f"The provided location '{location}' is not available for resource group. List of available "
                       f"regions is '{','.join(locations)}'.")
    raise ArmError(400, "LocationNotAvailableForResourceType",
                   f"The provided location '{location}' is not available for resource type '{type_name}'. List of "
                   f"available regions for the resource type is '{','.join(locations)}'.")


# ----------------------------------------------------------------------------------------------------------- schema


def schema_problem(model: type, body: object) -> ArmError | None:
    """400 InvalidRequestContent for the first property of `body` that the SDK model `model` does not know, or
    whose JSON type is not the model's, as ARM's deserializer refuses it; None when the body fits."""
    if not isinstance(body, Mapping):
        return request_content("The request body must be a JSON object.")
    problem = _check(model, body, "")
    return request_content(problem) if problem else None


@cache
def _fields(model: type) -> dict[str, object]:
    """REST name -> type hint of each field of an SDK model class (DPG models: `_attr_to_rest_field`)."""
    model()  # the model base fills _attr_to_rest_field on first construction
    module = sys.modules[model.__module__]
    package = sys.modules[model.__module__.rsplit(".", 1)[0]]
    hints = typing.get_type_hints(model, globalns={**vars(module), "_models": package})
    return {field._rest_name: hints.get(attr, typing.Any) for attr, field in model._attr_to_rest_field.items()}


def _is_model(hint: object) -> bool:
    return isinstance(hint, type) and hasattr(hint, "_attr_to_rest_field") or (
        isinstance(hint, type) and hasattr(hint, "as_dict") and issubclass(hint, Mapping))


_NAMES = {int: "Int32", float: "Double", bool: "Boolean", str: "String"}


def _check(hint: object, value: object, path: str) -> str | None:
    """Why `value` (at JSON path `path`) does not fit the type hint `hint`, as ARM words it; None when it fits."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union:
        kinds = [a for a in args if a is not type(None)]
        if any(isinstance(a, type) and issubclass(a, enum.Enum) for a in kinds):
            kinds = [str]  # an open enum: any string
        return None if value is None or len(kinds) != 1 else _check(kinds[0], value, path)
    where = f"Path '{path}'."
    if _is_model(hint):
        if not isinstance(value, Mapping):
            return f"Error converting value {json.dumps(value)} to type '{hint.__name__}'. {where}"
        fields = _fields(hint)
        for key, item in value.items():
            inner = f"{path}.{key}" if path else key
            if key not in fields:
                return f"Could not find member '{key}' on object of type '{hint.__name__}'. Path '{inner}'."
            problem = _check(fields[key], item, inner)
            if problem:
                return problem
        return None
    if value is None:
        return None
    if origin is list:
        if not isinstance(value, list):
            return f"Error converting value {json.dumps(value)} to type 'List'. {where}"
        return next((p for i, item in enumerate(value) if (p := _check(args[0], item, f"{path}[{i}]"))), None)
    if origin is dict:
        if not isinstance(value, Mapping):
            return f"Error converting value {json.dumps(value)} to type 'Dictionary'. {where}"
        return next((p for k, item in value.items() if (p := _check(args[1], item, f"{path}.{k}"))), None)
    fits = {int: lambda v: isinstance(v, int) and not isinstance(v, bool),
            float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
            bool: lambda v: isinstance(v, bool), str: lambda v: isinstance(v, str),
            datetime.datetime: lambda v: isinstance(v, str)}.get(hint)
    if fits and not fits(value):
        return f"Error converting value {json.dumps(value)} to type '{_NAMES.get(hint, 'DateTime')}'. {where}"
    return None


# ---------------------------------------------------------------------------------------------------- VM sizes, images


@dataclass(frozen=True)
class VmSize:
    vcpus: int
    memory_gb: int
    gpus: int = 0
    gpu: str = ""
    family: str = ""  # the quota family its cores count against
    locations: tuple[str, ...] = ()  # where it is offered; () everywhere the stand-in serves
    accelerated_networking: bool = True
    premium_io: bool = True
    spot: bool = True  # LowPriorityCapable
    rdma: bool = False  # RdmaEnabled: an InfiniBand interface (the sizes whose name has the "r" feature letter)


VM_SIZES = {
    "Standard_B2s": VmSize(2, 4, family="standardBSFamily", accelerated_networking=False, spot=False),
    "Standard_D4s_v5": VmSize(4, 16, family="standardDSv5Family"),
    "Standard_NC4as_T4_v3": VmSize(4, 28, 1, "NVIDIA Tesla T4", "standardNCASv3_T4Family"),
    "Standard_NC24ads_A100_v4": VmSize(24, 220, 1, "NVIDIA A100 80GB PCIe", "StandardNCADSA100v4Family"),
    "Standard_NC40ads_H100_v5": VmSize(40, 320, 1, "NVIDIA H100 NVL", "standardNCadsH100v5Family"),
    "Standard_ND96isr_H100_v5": VmSize(96, 1900, 8, "NVIDIA H100 80GB HBM3", "standardNDSH100v5Family", rdma=True),
    "Standard_ND96isr_H200_v5": VmSize(96, 1850, 8, "NVIDIA H200 141GB HBM3e", "standardNDSH200v5Family", rdma=True),
    "Standard_NC6": VmSize(6, 56, 1, "NVIDIA Tesla K80", "standardNCFamily", locations=("southcentralus",),
                           accelerated_networking=False),  # retired: offered nowhere the tests go
}


def sku_document(name: str, size: VmSize, location: str, restriction: str = "") -> dict:
    """A VM size in one location as the Resource SKUs API lists it (capabilities are strings, as ARM writes them);
    `restriction`: the reason code of a restriction on this subscription there."""
    capabilities = {"vCPUs": size.vcpus, "MemoryGB": size.memory_gb, "GPUs": size.gpus,
                    "AcceleratedNetworkingEnabled": size.accelerated_networking, "PremiumIO": size.premium_io,
                    "LowPriorityCapable": size.spot, "HyperVGenerations": "V1,V2", "MaxDataDiskCount": 32}
    if size.rdma:  # listed for the RDMA sizes only, as Resource SKUs lists it
        capabilities["RdmaEnabled"] = True
    document = {"resourceType": "virtualMachines", "name": name, "tier": "Standard", "size": name.split("_", 1)[1],
                "family": size.family, "locations": [location],
                "locationInfo": [{"location": location, "zones": ["1", "2", "3"], "zoneDetails": []}],
                "capabilities": [{"name": k, "value": str(v)} for k, v in capabilities.items()], "restrictions": []}
    if restriction:
        document["restrictions"] = [{"type": "Location", "values": [location], "reasonCode": restriction,
                                     "restrictionInfo": {"locations": [location]}}]
    return document


def offered(size: VmSize, location: str) -> bool:
    return not size.locations or location in size.locations

# The one marketplace image served: Canonical's Ubuntu 24.04 LTS (publisher, offer, sku), its versions oldest first.
MARKETPLACE = ("canonical", "ubuntu-24_04-lts", "server")
MARKETPLACE_VERSIONS = ("24.04.202504290", "24.04.202505020", "24.04.202506030")
IMAGE_DISK_GB = 30


def vm_size(name: object) -> tuple[str, VmSize]:
    """The size's canonical name and its shape; 400 InvalidParameter for a size this stand-in does not offer."""
    found = next((n for n in VM_SIZES if isinstance(name, str) and n.lower() == name.lower()), None)
    if not found:
        raise invalid_parameter(f"The requested VM size {name} is not available in the current region. The sizes "
                                f"available in the current region are: {', '.join(VM_SIZES)}. Find out more on the "
                                f"available VM sizes in each region at https://aka.ms/azure-regions.", "vmSize")
    return found, VM_SIZES[found]


def marketplace_version(reference: Mapping) -> str:
    """The exact version of a marketplace image reference; 404 PlatformImageNotFound for any other image."""
    wanted = tuple(str(reference.get(k) or "").lower() for k in ("publisher", "offer", "sku"))
    version = str(reference.get("version") or "")
    if wanted == MARKETPLACE and (version.lower() == "latest" or version in MARKETPLACE_VERSIONS):
        return MARKETPLACE_VERSIONS[-1] if version.lower() == "latest" else version
    urn = ":".join((*(str(reference.get(k) or "") for k in ("publisher", "offer", "sku")), version))
    raise ArmError(404, "PlatformImageNotFound",
                   f"The platform image '{urn}' is not available. Verify that all fields in the storage profile are "
                   "correct. For more details about storage profile information, please refer to "
                   "https://aka.ms/storageprofile", "imageReference")


def version_key(version: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"[.]", version))


# ------------------------------------------------------------------------------------------------ filters and pages


_TAG_FILTER = re.compile(r"\s*tagName\s+eq\s+'(?P<name>(?:[^']|'')*)'"
                         r"(?:\s+and\s+tagValue\s+eq\s+'(?P<value>(?:[^']|'')*)')?\s*", re.IGNORECASE)


def parse_tag_filter(text: str) -> tuple[str, str | None] | None:
    """(tag name, tag value or None) of `tagName eq 'X' [and tagValue eq 'Y']`; None for no filter; 400 for
    anything else."""
    if not text:
        return None
    found = _TAG_FILTER.fullmatch(text)
    if not found:
        raise ArmError(400, "InvalidFilterInQueryString", f"Invalid $filter '{text}' specified in the query string.")
    value = found["value"]
    return found["name"].replace("''", "'"), value.replace("''", "'") if value is not None else None


def tags_match(tags: Mapping[str, str], wanted: tuple[str, str | None] | None) -> bool:
    """ARM compares tag names without regard to case, values exactly."""
    if wanted is None:
        return True
    name, value = wanted
    key = next((k for k in tags if k.lower() == name.lower()), None)
    return key is not None and (value is None or tags[key] == value)


def page(items: list, skiptoken: str) -> tuple[list, int | None]:
    """One page of PAGE_SIZE items from `$skiptoken` on, and the token of the next (None at the end)."""
    try:
        start = int(skiptoken or 0)
    except ValueError:
        raise ArmError(400, "InvalidSkipToken", f"The skip token '{skiptoken}' is not valid.") from None
    end = start + PAGE_SIZE
    return items[start:end], end if end < len(items) else None


# ------------------------------------------------------------------------------------------------ VM profile checks


SSH_KEY_RE = re.compile(r"(ssh-rsa|ssh-ed25519|ecdsa-sha2-nistp(256|384|521)) [A-Za-z0-9+/]+={0,3}( .*)?\s*")
RESERVED_USERS = {"admin", "administrator", "root", "guest", "user", "test", "sys", "daemon", "bin", "nobody"}
PRIORITIES = ("Regular", "Low", "Spot")
EVICTION_POLICIES = ("Deallocate", "Delete")


def linux_os_profile(profile: Mapping | None, vm_name: str) -> dict:
    """The osProfile of a Linux VM as CRP keeps it (never the password or the custom data); 400 InvalidParameter
    where CRP refuses it."""
    if not profile:
        raise invalid_parameter("Required parameter 'osProfile' is missing (null).", "osProfile")
    computer = profile.get("computerName") or vm_name
    check_computer_name(computer)
    user = profile.get("adminUsername")
    if not user:
        raise invalid_parameter("Required parameter 'adminUsername' is missing (null).", "adminUsername")
    if user.lower() in RESERVED_USERS or not re.fullmatch(r"[a-z_][a-z0-9_.-]{0,63}", user):
        raise invalid_parameter("The Admin Username specified is not allowed.", "adminUsername")
    if profile.get("windowsConfiguration"):
        raise invalid_parameter("This stand-in serves Linux images only: windowsConfiguration is not allowed.",
                                "windowsConfiguration")
    linux = profile.get("linuxConfiguration") or {}
    keys = (linux.get("ssh") or {}).get("publicKeys") or []
    no_password = bool(linux.get("disablePasswordAuthentication"))
    if (no_password and not keys) or (not no_password and not profile.get("adminPassword")):
        raise invalid_parameter("Authentication using either SSH or by user name and password must be enabled in "
                                "Linux profile.", "linuxConfiguration")
    home = f"/home/{user}/.ssh/authorized_keys"
    for key in keys:
        if key.get("path") != home:
            raise invalid_parameter(f"Destination path for SSH public keys is currently limited to its default value "
                                    f"{home}  due to a known issue in Linux provisioning agent.",
                                    "linuxConfiguration.ssh.publicKeys.path")
        if not SSH_KEY_RE.fullmatch(key.get("keyData") or ""):
            raise invalid_parameter("The value of parameter linuxConfiguration.ssh.publicKeys.keyData is invalid.",
                                    "linuxConfiguration.ssh.publicKeys.keyData")
    return {"computerName": computer, "adminUsername": user, "linuxConfiguration": {
        "disablePasswordAuthentication": no_password, "ssh": {"publicKeys": [dict(k) for k in keys]},
        "provisionVMAgent": linux.get("provisionVMAgent", True),
        "patchSettings": linux.get("patchSettings") or {"patchMode": "ImageDefault", "assessmentMode": "ImageDefault"},
    }, "secrets": list(profile.get("secrets") or []),
        "allowExtensionOperations": profile.get("allowExtensionOperations", True), "requireGuestProvisionSignal": True}


def spot_settings(props: Mapping) -> dict:
    """priority, evictionPolicy and billingProfile as CRP keeps them; 400 InvalidParameter where refused. Stricter
    than Azure in one point: a Spot VM must name its eviction policy (Azure takes Deallocate when it is left out)."""
    priority = props.get("priority") or "Regular"
    if priority not in PRIORITIES:
        raise invalid_parameter(f"The value '{priority}' of parameter 'priority' is not allowed. Allowed values are "
                                f"{', '.join(PRIORITIES)}.", "priority")
    policy = props.get("evictionPolicy")
    billing = props.get("billingProfile")
    spot = priority in ("Spot", "Low")
    if not spot and policy:
        raise invalid_parameter("Eviction policy can be set only on Azure Spot Virtual Machines.", "evictionPolicy")
    if not spot and billing:
        raise invalid_parameter("Billing profile can be set only on Azure Spot Virtual Machines.", "billingProfile")
    if spot and policy not in EVICTION_POLICIES:
        raise invalid_parameter("Azure Spot Virtual Machines must name an eviction policy (Deallocate or Delete), "
                                f"not '{policy}'.", "evictionPolicy")
    settings = {"priority": priority}
    if spot:
        settings["evictionPolicy"] = policy
        price = (billing or {}).get("maxPrice", -1)
        if price is None:
            price = -1
        if price != -1 and not price > 0:
            raise invalid_parameter(f"The value {price} of parameter 'billingProfile.maxPrice' is invalid. It must be "
                                    "-1 or greater than 0.", "billingProfile.maxPrice")
        settings["billingProfile"] = {"maxPrice": price}
    return settings


# ---------------------------------------------------------------------------------------------------- network checks


PROTOCOLS = ("Tcp", "Udp", "Icmp", "Esp", "Ah", "*")


def address_space(prefixes: object, vnet_id: str) -> list[ipaddress.IPv4Network]:
    if not isinstance(prefixes, list) or not prefixes:
        raise ArmError(400, "InvalidAddressSpace", f"Virtual network {vnet_id} must have an address space.")
    try:
        return [ipaddress.ip_network(p) for p in prefixes]
    except ValueError as error:
        raise ArmError(400, "InvalidAddressPrefixFormat", f"Address prefix has an invalid format: {error}.") from None


def subnet_network(subnet: Mapping, space: list, vnet_name: str, taken: list) -> ipaddress.IPv4Network:
    """The subnet's range; 400 where it is not inside the network's space or overlaps another subnet's."""
    name = subnet.get("name") or ""
    props = subnet.get("properties") or {}
    prefix = props.get("addressPrefix") or (props.get("addressPrefixes") or [None])[0]
    try:
        network = ipaddress.ip_network(prefix)
    except (TypeError, ValueError):
        raise ArmError(400, "InvalidAddressPrefixFormat",
                       f"Subnet '{name}' has an invalid address prefix '{prefix}'.") from None
    if not any(network.subnet_of(s) for s in space if s.version == network.version):
        raise ArmError(400, "NetcfgSubnetRangeOutsideVnet",
                       f"Subnet '{name}' is not valid because its IP address range is outside the IP address range of "
                       f"virtual network '{vnet_name}'.")
    for other_name, other in taken:
        if network.overlaps(other):
            raise ArmError(400, "NetcfgSubnetRangesOverlap",
                           f"Subnet '{name}' is not valid in virtual network '{vnet_name}'. Its range overlaps the "
                           f"range of subnet '{other_name}'.")
    if network.prefixlen > 29:
        raise ArmError(400, "InvalidAddressPrefixFormat", f"Subnet '{name}' must be /29 or larger.")
    return network


def next_private_address(network: ipaddress.IPv4Network, used: set[str]) -> str:
    """The first free address Azure hands out in a subnet: the first four and the last are reserved."""
    hosts = list(network.hosts())[3:]
    free = next((str(a) for a in hosts if str(a) not in used), None)
    if free is None:
        raise ArmError(400, "SubnetIsFull", f"Subnet with address prefix {network} does not have enough capacity.")
    return free


def security_rules(rules: object, nsg_id: str) -> list[dict]:
    """The security rules of a network security group as NRP keeps them; 400 where NRP refuses them."""
    kept, seen = [], {}
    for rule in rules or []:
        name = rule.get("name") or ""
        props = dict(rule.get("properties") or {})
        rule_id = f"{nsg_id}/securityRules/{name}"
        priority = props.get("priority")
        if not isinstance(priority, int) or not 100 <= priority <= 4096:
            raise ArmError(400, "SecurityRuleInvalidPriority",
                           f"Security rule has invalid Priority. Value provided: {priority} Allowed range 100-4096.")
        direction, access, protocol = props.get("direction"), props.get("access"), props.get("protocol")
        if direction not in ("Inbound", "Outbound") or access not in ("Allow", "Deny") or protocol not in PROTOCOLS:
            raise ArmError(400, "SecurityRuleParameterContainsUnsupportedValue",
                           f"Security rule parameter direction, access or protocol of rule {rule_id} has an "
                           f"unsupported value ({direction}, {access}, {protocol}).")
        if (direction, priority) in seen:
            raise ArmError(400, "SecurityRuleConflict",
                           f"Security rule {name} conflicts with rule {seen[direction, priority]}. Rules cannot have "
                           "the same Priority and Direction. To learn more, see aka.ms/nsgrules.")
        seen[direction, priority] = name
        props.setdefault("sourcePortRange", "*")
        props["provisioningState"] = "Succeeded"
        kept.append({"name": name, "id": rule_id, "type": "Microsoft.Network/networkSecurityGroups/securityRules",
                     "properties": props})
    return kept


def default_security_rules(nsg_id: str) -> list[dict]:
    rows = (("AllowVnetInBound", "VirtualNetwork", "VirtualNetwork", "Allow", 65000, "Inbound"),
            ("AllowAzureLoadBalancerInBound", "AzureLoadBalancer", "*", "Allow", 65001, "Inbound"),
            ("DenyAllInBound", "*", "*", "Deny", 65500, "Inbound"),
            ("AllowVnetOutBound", "VirtualNetwork", "VirtualNetwork", "Allow", 65000, "Outbound"),
            ("AllowInternetOutBound", "*", "Internet", "Allow", 65001, "Outbound"),
            ("DenyAllOutBound", "*", "*", "Deny", 65500, "Outbound"))
    return [{"name": name, "id": f"{nsg_id}/defaultSecurityRules/{name}",
             "type": "Microsoft.Network/networkSecurityGroups/defaultSecurityRules",
             "properties": {"provisioningState": "Succeeded", "description": name, "protocol": "*",
                            "sourcePortRange": "*", "destinationPortRange": "*", "sourceAddressPrefix": source,
                            "destinationAddressPrefix": destination, "access": access, "priority": priority,
                            "direction": direction}}
            for name, source, destination, access, priority, direction in rows]

"""What the ARM stand-in's modules share: the resource types it serves and the records of a call (route, request,
reply), of a fault set by a test, and of a long-running operation."""

from __future__ import annotations

import ipaddress
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from azure.core.credentials import AccessToken

GROUP = "Microsoft.Resources/resourceGroups"
VM, DISK, SNAPSHOT = "Microsoft.Compute/virtualMachines", "Microsoft.Compute/disks", "Microsoft.Compute/snapshots"
PPG, IMAGE = "Microsoft.Compute/proximityPlacementGroups", "Microsoft.Compute/images"
VMSS = "Microsoft.Compute/virtualMachineScaleSets"
GALLERY = "Microsoft.Compute/galleries"
GALLERY_IMAGE, GALLERY_VERSION = GALLERY + "/images", GALLERY + "/images/versions"
VNET, NSG = "Microsoft.Network/virtualNetworks", "Microsoft.Network/networkSecurityGroups"
SUBNET = VNET + "/subnets"
PIP, NIC = "Microsoft.Network/publicIPAddresses", "Microsoft.Network/networkInterfaces"
TYPES = {"virtualMachines": VM, "virtualMachineScaleSets": VMSS, "disks": DISK, "snapshots": SNAPSHOT,
         "proximityPlacementGroups": PPG,
         "images": IMAGE, "galleries": GALLERY, "galleryImages": GALLERY_IMAGE, "galleryImageVersions": GALLERY_VERSION,
         "virtualNetworks": VNET, "subnets": SUBNET, "networkSecurityGroups": NSG, "publicIPAddresses": PIP,
         "networkInterfaces": NIC}
PUBLIC_RANGE = ipaddress.ip_network("203.0.113.0/24")
POWER_TEXT = {"starting": "VM starting", "running": "VM running", "stopping": "VM stopping", "stopped": "VM stopped",
              "deallocating": "VM deallocating", "deallocated": "VM deallocated"}
SAS_VERSION = "2022-11-02"
SAFE = "'$"  # left unquoted in the query of a nextLink, as ARM writes them





@dataclass(frozen=True)
class Route:
    verb: str
    pattern: re.Pattern
    name: str  # the operation, as fail() names it: "virtualMachines.createOrUpdate"
    api: str | None  # the api-version it takes; None for the blob URLs
    handler: Callable
    lro: bool = False


@dataclass(frozen=True)
class Request:
    op: str
    path: str
    query: dict[str, str]
    params: dict[str, str]
    body: object


@dataclass
class Reply:
    status: int
    body: object = None  # dict: JSON; str: text; bytes
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "application/json; charset=utf-8"


@dataclass
class Fault:
    operation: str
    code: str
    status: int
    message: str | None
    countdown: int
    on: str


@dataclass
class Op:
    name: str
    provider: str  # compute, disk, network, resources: which status URLs it has
    location: str
    due: float
    started: str
    finish: Callable[[], None] | None
    undo: Callable[[], None] | None
    context: dict
    fault: Fault | None = None
    status: str = "InProgress"
    error: dict | None = None
    ended: str = ""
    caller: str | None = None  # the principal that started it (None: the operator)


class Credential:
    """A token credential as azure-core takes it: `get_token(*scopes)` gives an AccessToken."""

    def __init__(self, token: str):
        self._token = token

    def get_token(self, *scopes: str, **kwargs) -> AccessToken:
        return AccessToken(self._token, int(time.time()) + 3600)

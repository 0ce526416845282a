"""A stand-in for the part of Azure Resource Manager kiln uses, served over HTTPS on loopback.

No emulator of Azure compute exists (Azurite is storage only). The official SDK clients are pointed here by their own
options and nothing is patched:

    with Arm() as arm:                                  # https://127.0.0.1:PORT, a throwaway CA: arm.ca_file
        arm.add_image("images", "kiln-gpu-1")
        compute = arm.client("compute")
        # == ComputeManagementClient(arm.credential(), arm.subscription, base_url=arm.endpoint,
        #                            connection_verify=arm.ca_file, polling_interval=...)

It serves one subscription in a few locations: resource groups (create, get, check existence, list with a tag
filter, delete with everything in them); Microsoft.Network virtual networks and their subnets, network security
groups, public IP addresses (Standard, static, from 203.0.113.0/24) and network interfaces; Microsoft.Compute
virtual machines (create or update, get with the instance view, list, delete, power off, deallocate, start, boot
diagnostics; sizes offered per location, listed by Resource SKUs, `restrict_size` closing one to the subscription),
virtual machine scale sets (Flexible ones that VMs join; testbed/arm_scalesets.py names the source of each rule),
disks, snapshots, proximity placement groups, managed images and gallery image versions (read; `add_image`,
`add_gallery_image` make them); VMs' system-assigned identities and role assignments at any scope, checked on every
call as RBAC checks them (testbed/arm_access.py; `identity_token(vm_id)` is what the VM's metadata service hands
out, `denied(action)` refuses the operator an action); the operation status and result URLs the pollers follow; and
the boot diagnostics blobs behind the SAS URLs it hands out.

How it holds to the real API:
- URLs, verbs, the api-version of each operation and the status codes each accepts are those of the SDKs' own
  operations code (azure-mgmt-compute 39.0.0, azure-mgmt-network 33.1.0, azure-mgmt-resource 26.0.0). A request
  with no api-version, or another one, is refused with 400 as ARM refuses it; a verb or path the stand-in does not
  serve answers 501 with an ARM error body, never an empty success.
- Every request needs `Authorization: Bearer <token>` with the token `credential()` gives (401 otherwise; ARM's
  error codes); the blob URLs are SAS URLs and need no token, only their signature.
- Request bodies are checked against the SDK's own model classes (their fields and JSON types, read from the DPG
  models' `_attr_to_rest_field` and type hints): an unknown member or a wrong type is 400 InvalidRequestContent, as
  ARM's deserializer answers. Read-only members in a request are ignored, as ARM does.
- Errors are ARM's `{"error": {"code", "message", "target"?}}` with ARM's status codes, so azure-core raises
  ResourceNotFoundError, ResourceExistsError, ClientAuthenticationError or HttpResponseError with `.error.code`.
- Long-running operations answer as the providers do: PUT 201 (create) or 200 (update) with the body
  (provisioningState Creating or Updating) and `Azure-AsyncOperation` (disks and snapshots: 202, as DiskRP);
  DELETE and POST actions 202 with `Azure-AsyncOperation` and `Location`; resource group delete 202 with
  `Location` only. The status URL answers `{"status": "InProgress"}` until `op_delay` seconds have passed, then
  Succeeded (or Failed with its error, when a fault says so); the Location URL 202 then 200. All carry
  `Retry-After: 0`: azure-core reads 0 as "not given" and waits its client's `polling_interval` (30 s by default)
  between polls, so `client()` builds clients with a short one. For code under test that builds its own clients,
  `op_delay=0` completes each operation at its first poll (the PUT still answers Creating), whatever the interval.
- DELETE of a resource that is not there is 204, as ARM answers; of a resource in use, the provider's 400/409.
- Back references (a subnet's ipConfigurations, a NIC's virtualMachine, a disk's managedBy and diskState, a public
  IP's ipConfiguration, a placement group's virtualMachines and virtualMachineScaleSets) are derived from the
  forward ones at each read, so they cannot disagree.
- A VM gets real SSH host keys (ssh-keygen) when it is made; with boot diagnostics on, its serial log shows them
  between cloud-init's `-----BEGIN SSH HOST KEY KEYS-----` markers, once per boot, as an Ubuntu VM's console does.

Where it is knowingly not Azure: one subscription and no ARM templates; only Linux; only existing NICs (no
networkInterfaceConfigurations); Spot VMs must name their evictionPolicy (Azure would take Deallocate); a failed
create leaves nothing behind (Azure may keep a Failed VM); a scale set makes no instances of its own and cannot be
deleted while VMs are in it; provider error codes outside the ones the SDK docs show are the closest known ones.

Faults for tests: `fail("virtualMachines.createOrUpdate", code="AllocationFailed", status=200, on="operation")`,
`evict(group, vm)`; `calls` lists (verb, path) as served.

The service is this module (state, routes, serving, operations, resource groups, role assignments) with one mixin
per resource provider (arm_network, arm_disks, arm_vms, arm_scalesets); its pure rules are in arm_rules, RBAC in
arm_access, the shared records in arm_types, TLS and HTTP in arm_tls. As a program:

    python -m testbed.arm --port 8443 --location eastus --image images/kiln-gpu-1
"""

from __future__ import annotations

import base64
import contextlib
import copy
import hashlib
import json
import re
import secrets
import signal
import ssl
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

from azure.mgmt.compute import ComputeManagementClient
from azure.mgmt.network import NetworkManagementClient
from azure.mgmt.resource.resources import ResourceManagementClient
from azure.mgmt.resource.resources import models as resource_models

from localcloud.guest import Served
from testbed import end_operation, serve, settle, stand_in_parser, take_fault
from testbed.arm_access import AUTHORIZATION_API, OPERATION_POLLS, Access, authorization_failed
from testbed.arm_access import action_of as access_action
from testbed.arm_disks import DiskHandlers
from testbed.arm_network import NetworkHandlers
from testbed.arm_prices import PriceHandlers
from testbed.arm_rules import (
    COMPUTE_API,
    DISK_API,
    GALLERY_API,
    IMAGE_DISK_GB,
    NETWORK_API,
    RESOURCES_API,
    SKUS_API,
    ArmError,
    ResourceId,
    check_group_name,
    check_location,
    check_name,
    check_tags,
    fault_message,
    group_not_found,
    id_of,
    invalid_parameter,
    page,
    parse_id,
    parse_tag_filter,
    request_content,
    resource_not_found,
    schema_problem,
    tags_match,
    vm_size,
)
from testbed.arm_scalesets import ScaleSetHandlers
from testbed.arm_tls import TlsServer, handler_for, make_tls
from testbed.arm_types import (
    DISK,
    GALLERY,
    GALLERY_IMAGE,
    GROUP,
    IMAGE,
    NIC,
    NSG,
    PIP,
    PPG,
    SAFE,
    SAS_VERSION,
    SNAPSHOT,
    SUBNET,
    TYPES,
    VM,
    VMSS,
    VNET,
    Credential,
    Fault,
    Op,
    Reply,
    Request,
    Route,
)
from testbed.arm_vms import Guest, VmHandlers

# ------------------------------------------------------------------------------------------------------ service


class Arm(Served, NetworkHandlers, DiskHandlers, VmHandlers, ScaleSetHandlers, PriceHandlers):
    """The service: state under one lock, a route table, one group of handlers per resource kind."""

    scheme = "https"

    def __init__(self, subscription: str = "00000000-0000-0000-0000-000000000000",
                 locations: Iterable[str] = ("eastus", "westus2"), op_delay: float = 0.05, *,
                 host: str = "127.0.0.1", port: int = 0, boot_delay: float = 0.0):
        """`op_delay`: seconds until a long-running operation completes; `boot_delay`: how long after a VM runs
        cloud-init prints its host keys on the serial console."""
        self.subscription = subscription
        self.locations = tuple(locations)
        self.op_delay = op_delay
        self.boot_delay = boot_delay
        self.calls: list[tuple[str, str]] = []
        self.prices_asked: list[dict[str, str]] = []  # the Retail Prices API's queries, as asked
        self._meters: list[dict] = []  # the Retail Prices API's items (price())
        self._token = secrets.token_urlsafe(32)
        self._groups: dict[str, dict] = {}  # lower-case name -> resource group
        self._resources: dict[str, dict] = {}  # lower-case id -> resource, as ARM writes it
        self._guests: dict[str, Guest] = {}  # VM id (lower case) -> its guest
        self._ops: dict[str, Op] = {}
        self._faults: list[Fault] = []
        self._next_public = 0
        self._lock = threading.RLock()
        self._fault_now: Fault | None = None
        self._access = Access(subscription)
        self._restricted: dict[tuple[str, str], str] = {}  # (size, location) -> the restriction's reason code
        self._caller: str | None = None  # the principal of the call being served; None: the operator
        self._tmp = tempfile.TemporaryDirectory(prefix="arm-standin-")
        self.ca_file, cert, key = make_tls(Path(self._tmp.name), host)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self._routes = self._route_table()
        self.serve(TlsServer((host, port), handler_for(self), context))

    # ------------------------------------------------------------------------------------------- for tests

    def credential(self, token: str | None = None) -> Credential:
        """A credential whose token the stand-in takes (or, given `token`, one it refuses)."""
        return Credential(token or self._token)

    def client(self, kind: str | type, credential: object | None = None):
        """A management client ("compute", "network", "resource", or the class) pointed here by its own options."""
        classes = {"compute": ComputeManagementClient, "network": NetworkManagementClient,
                   "resource": ResourceManagementClient}
        cls = classes[kind] if isinstance(kind, str) else kind
        return cls(credential or self.credential(), self.subscription, base_url=self.endpoint,
                   connection_verify=self.ca_file, polling_interval=max(self.op_delay / 3, 0.005))

    def identity_token(self, vm_id: str) -> str | None:
        """A token for the VM's system-assigned identity, as its metadata service hands it out (None: it has no
        identity); ARM allows its calls what the principal's role assignments grant."""
        with self._lock:
            return self._access.token_for(vm_id)

    @contextlib.contextmanager
    def denied(self, action: str):
        """Refuse the operator an action while in the block (403 AuthorizationFailed), as ARM refuses a
        Contributor `Microsoft.Authorization/roleAssignments/write`."""
        with self._lock:
            self._access.denied.add(action)
        try:
            yield
        finally:
            with self._lock:
                self._access.denied.discard(action)

    def delay_principals(self, seconds: float) -> None:
        """Keep each new identity's principal out of the directory this long (PrincipalNotFound), as Entra ID's
        replication does."""
        with self._lock:
            self._access.principal_delay = seconds

    def role_assignments(self) -> list[dict]:
        """Every role assignment, as ARM shows it."""
        with self._lock:
            return copy.deepcopy(list(self._access.assignments.values()))

    def restrict_size(self, size: str, location: str, reason: str = "NotAvailableForSubscription") -> None:
        """Restrict a VM size in a location for this subscription, as Azure does for a size not open to it: the
        SKU list shows the restriction, a VM of it there is 409 SkuNotAvailable."""
        with self._lock:
            self._restricted[(vm_size(size)[0], location)] = reason

    def host_keys(self, resource_group: str, vm_name: str) -> list[str]:
        """The host keys the VM really has: `<type> <base64>` lines."""
        with self._lock:
            return list(self._guests[self._id(resource_group, VM, vm_name).key].keys)

    def add_image(self, resource_group: str, name: str, tags: dict[str, str] | None = None, *,
                  location: str | None = None, disk_size_gb: int = IMAGE_DISK_GB) -> str:
        """Add a generalized Linux managed image (and its group, if missing); its id."""
        with self._lock:
            location = self._ensure_group(resource_group, location)
            rid = self._id(resource_group, IMAGE, name)
            self._resources[rid.key] = self._tracked(rid, location, check_tags(tags), {
                "storageProfile": {"osDisk": {"osType": "Linux", "osState": "Generalized", "diskSizeGB": disk_size_gb,
                                              "caching": "ReadWrite", "storageAccountType": "Premium_LRS"},
                                   "dataDisks": [], "zoneResilient": False},
                "hyperVGeneration": "V2", "provisioningState": "Succeeded"})
            return str(rid)

    def add_gallery_image(self, resource_group: str, gallery: str, definition: str, version: str,
                          tags: dict[str, str] | None = None, *, location: str | None = None,
                          regions: Iterable[str] | None = None, exclude_from_latest: bool = False) -> str:
        """Add a gallery image version (and its gallery, definition and group, if missing), replicated to `regions`
        (default: the gallery's location); its id."""
        with self._lock:
            location = self._ensure_group(resource_group, location)
            gallery_id = self._id(resource_group, GALLERY, gallery)
            definition_id = gallery_id.child("images", definition)
            version_id = definition_id.child("versions", version)
            self._resources.setdefault(gallery_id.key, self._tracked(gallery_id, location, {}, {
                "identifier": {"uniqueName": f"{self.subscription}-{gallery.upper()}"},
                "provisioningState": "Succeeded"}))
            self._resources.setdefault(definition_id.key, self._tracked(definition_id, location, {}, {
                "osType": "Linux", "osState": "Generalized", "hyperVGeneration": "V2", "architecture": "x64",
                "identifier": {"publisher": "kiln", "offer": gallery, "sku": definition},
                "provisioningState": "Succeeded"}))
            targets = [{"name": r, "regionalReplicaCount": 1, "storageAccountType": "Standard_LRS"}
                       for r in (regions or [location])]
            self._resources[version_id.key] = self._tracked(version_id, location, check_tags(tags), {
                "publishingProfile": {"targetRegions": targets, "replicaCount": 1,
                                      "excludeFromLatest": exclude_from_latest, "publishedDate": self._now(),
                                      "storageAccountType": "Standard_LRS"},
                "storageProfile": {"osDiskImage": {"sizeInGB": IMAGE_DISK_GB, "hostCaching": "ReadWrite"}},
                "safetyProfile": {"allowDeletionOfReplicatedLocations": True},
                "provisioningState": "Succeeded"})
            return str(version_id)

    def fail(self, operation: str, *, code: str, status: int, message: str | None = None, nth: int = 1,
             on: str = "call") -> None:
        """Make the nth call of `operation` from now ("virtualMachines.createOrUpdate") fail: at once with HTTP
        `status` and error `code` (on="call"), or as a long-running operation that ends Failed with that code
        (on="operation": OperationNotAllowed for quota, AllocationFailed, SkuNotAvailable, ZonalAllocationFailed...)
        while nothing is made. A 5xx or 429 on="call" is retried by azure-core, as against Azure."""
        routes = {route.name: route for route in self._routes}
        if operation not in routes:
            raise ValueError(f"no operation {operation!r}: one of {sorted(routes)}")
        if on not in ("call", "operation") or nth < 1:
            raise ValueError("on is 'call' or 'operation', nth at least 1")
        if on == "operation" and not routes[operation].lro:
            raise ValueError(f"{operation} answers at once, with no long-running operation")
        with self._lock:
            self._faults.append(Fault(operation, code, status, message, nth, on))

    def evict(self, resource_group: str, vm_name: str) -> None:
        """Evict a running Spot VM as Azure does: deallocated, or, with evictionPolicy Delete, deleted with what its
        deleteOptions delete."""
        with self._lock:
            self._settle()
            rid = self._id(resource_group, VM, vm_name)
            vm, guest = self._resources.get(rid.key), self._guests.get(rid.key)
            if vm is None or vm["properties"]["priority"] not in ("Spot", "Low") or guest.power != "running":
                raise ValueError(f"{rid} is no running Spot VM")
            if vm["properties"]["evictionPolicy"] == "Delete":
                self._remove_vm(rid.key)
            else:
                guest.power = "deallocated"

    # -------------------------------------------------------------------------------------------- plumbing

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        self._tmp.cleanup()

    def _id(self, group: str, type_name: str, *names: str) -> ResourceId:
        stored = self._groups.get(group.lower())
        namespace, *types = type_name.split("/")
        return ResourceId(self.subscription, stored["name"] if stored else group, namespace, tuple(types), names)

    @staticmethod
    def _now() -> str:
        return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")

    def _ensure_group(self, name: str, location: str | None) -> str:
        check_group_name(name)
        group = self._groups.get(name.lower())
        if group is None:
            location = check_location(location or self.locations[0], self.locations, GROUP)
            self._groups[name.lower()] = group = self._group_body(name, location, {})
        return check_location(location, self.locations, IMAGE) if location else group["location"]

    def _group_body(self, name: str, location: str, tags: dict) -> dict:
        return {"id": f"/subscriptions/{self.subscription}/resourceGroups/{name}", "name": name, "type": GROUP,
                "location": location, "tags": tags, "properties": {"provisioningState": "Succeeded"}}

    @staticmethod
    def _tracked(rid: ResourceId, location: str, tags: dict, properties: dict, **extra) -> dict:
        return {"id": str(rid), "name": rid.name, "type": rid.type, "location": location, "tags": tags, **extra,
                "properties": properties}

    def _route_table(self) -> list[Route]:
        sub = "/subscriptions/{subscription}"
        rg = sub + "/resourcegroups/{group}"
        cp, np = rg + "/providers/Microsoft.Compute", rg + "/providers/Microsoft.Network"
        vm = cp + "/virtualMachines/{n1}"
        table = [
            ("GET", sub + "/resourcegroups", "resourceGroups.list", RESOURCES_API, self._groups_list),
            ("PUT", rg, "resourceGroups.createOrUpdate", RESOURCES_API, self._groups_put),
            ("GET", rg, "resourceGroups.get", RESOURCES_API, self._groups_get),
            ("HEAD", rg, "resourceGroups.checkExistence", RESOURCES_API, self._groups_head),
            ("DELETE", rg, "resourceGroups.delete", RESOURCES_API, self._groups_delete, True),
            ("GET", sub + "/operationresults/{operation}", "operationResults.get", RESOURCES_API, self._op_result),
            ("PUT", vm, "virtualMachines.createOrUpdate", COMPUTE_API, self._vm_put, True),
            ("GET", vm, "virtualMachines.get", COMPUTE_API, self._vm_get),
            ("DELETE", vm, "virtualMachines.delete", COMPUTE_API, self._delete, True),
            ("GET", vm + "/instanceView", "virtualMachines.instanceView", COMPUTE_API, self._vm_instance_view),
            ("POST", vm + "/powerOff", "virtualMachines.powerOff", COMPUTE_API, self._vm_power, True),
            ("POST", vm + "/deallocate", "virtualMachines.deallocate", COMPUTE_API, self._vm_power, True),
            ("POST", vm + "/start", "virtualMachines.start", COMPUTE_API, self._vm_power, True),
            ("POST", vm + "/retrieveBootDiagnosticsData", "virtualMachines.retrieveBootDiagnosticsData",
             COMPUTE_API, self._vm_boot_diagnostics),
            ("GET", cp + "/virtualMachines", "virtualMachines.list", COMPUTE_API, self._list),
            ("GET", sub + "/providers/Microsoft.Compute/virtualMachines", "virtualMachines.listAll", COMPUTE_API,
             self._list),
            ("GET", sub + "/providers/Microsoft.Compute/skus", "resourceSkus.list", SKUS_API, self._skus_list),
            ("PUT", cp + "/virtualMachineScaleSets/{n1}", "virtualMachineScaleSets.createOrUpdate", COMPUTE_API,
             self._vmss_put, True),
            ("GET", cp + "/virtualMachineScaleSets/{n1}", "virtualMachineScaleSets.get", COMPUTE_API, self._get),
            ("DELETE", cp + "/virtualMachineScaleSets/{n1}", "virtualMachineScaleSets.delete", COMPUTE_API,
             self._delete, True),
            ("GET", cp + "/virtualMachineScaleSets", "virtualMachineScaleSets.list", COMPUTE_API, self._list),
            ("GET", sub + "/providers/Microsoft.Compute/virtualMachineScaleSets", "virtualMachineScaleSets.listAll",
             COMPUTE_API, self._list),
            ("PUT", cp + "/proximityPlacementGroups/{n1}", "proximityPlacementGroups.createOrUpdate", COMPUTE_API,
             self._ppg_put),
            ("GET", cp + "/proximityPlacementGroups/{n1}", "proximityPlacementGroups.get", COMPUTE_API, self._get),
            ("DELETE", cp + "/proximityPlacementGroups/{n1}", "proximityPlacementGroups.delete", COMPUTE_API,
             self._ppg_delete),
            ("GET", cp + "/proximityPlacementGroups", "proximityPlacementGroups.listByResourceGroup", COMPUTE_API,
             self._list),
            ("GET", cp + "/images/{n1}", "images.get", COMPUTE_API, self._get),
            ("GET", cp + "/images", "images.listByResourceGroup", COMPUTE_API, self._list),
            ("GET", sub + "/providers/Microsoft.Compute/images", "images.list", COMPUTE_API, self._list),
            ("GET", cp + "/galleries/{n1}", "galleries.get", GALLERY_API, self._get),
            ("GET", cp + "/galleries/{n1}/images/{n2}", "galleryImages.get", GALLERY_API, self._get),
            ("GET", cp + "/galleries/{n1}/images/{n2}/versions/{n3}", "galleryImageVersions.get", GALLERY_API,
             self._get),
            ("GET", cp + "/galleries/{n1}/images/{n2}/versions", "galleryImageVersions.listByGalleryImage",
             GALLERY_API, self._list),
            ("GET", sub + "/providers/Microsoft.Compute/locations/{location}/operations/{operation}",
             "computeOperations.get", COMPUTE_API, self._op_poll),
            ("GET", sub + "/providers/Microsoft.Compute/locations/{location}/DiskOperations/{operation}",
             "diskOperations.get", DISK_API, self._op_poll),
            ("GET", sub + "/providers/Microsoft.Network/locations/{location}/operations/{operation}",
             "networkOperations.get", NETWORK_API, self._op_status),
            ("GET", sub + "/providers/Microsoft.Network/locations/{location}/operationResults/{operation}",
             "networkOperationResults.get", NETWORK_API, self._op_result),
            ("GET", "/blobs/{n1}/{blob}", "blobs.get", None, self._blob_get),
            ("GET", "/api/retail/prices", "retailPrices.list", None, self._prices_list),
        ]
        for kind, put in (("disks", self._disk_put), ("snapshots", self._snapshot_put)):
            table += [("PUT", cp + f"/{kind}/{{n1}}", f"{kind}.createOrUpdate", DISK_API, put, True),
                      ("GET", cp + f"/{kind}/{{n1}}", f"{kind}.get", DISK_API, self._get),
                      ("DELETE", cp + f"/{kind}/{{n1}}", f"{kind}.delete", DISK_API, self._delete, True),
                      ("GET", cp + f"/{kind}", f"{kind}.listByResourceGroup", DISK_API, self._list),
                      ("GET", sub + f"/providers/Microsoft.Compute/{kind}", f"{kind}.list", DISK_API, self._list)]
        for kind, put in (("virtualNetworks", self._vnet_put), ("networkSecurityGroups", self._nsg_put),
                          ("publicIPAddresses", self._pip_put), ("networkInterfaces", self._nic_put)):
            table += [("PUT", np + f"/{kind}/{{n1}}", f"{kind}.createOrUpdate", NETWORK_API, put, True),
                      ("GET", np + f"/{kind}/{{n1}}", f"{kind}.get", NETWORK_API, self._get),
                      ("DELETE", np + f"/{kind}/{{n1}}", f"{kind}.delete", NETWORK_API, self._delete, True),
                      ("GET", np + f"/{kind}", f"{kind}.list", NETWORK_API, self._list),
                      ("GET", sub + f"/providers/Microsoft.Network/{kind}", f"{kind}.listAll", NETWORK_API,
                       self._list)]
        subnet = np + "/virtualNetworks/{n1}/subnets/{n2}"
        table += [("PUT", subnet, "subnets.createOrUpdate", NETWORK_API, self._subnet_put, True),
                  ("GET", subnet, "subnets.get", NETWORK_API, self._subnet_get),
                  ("DELETE", subnet, "subnets.delete", NETWORK_API, self._subnet_delete, True),
                  ("GET", np + "/virtualNetworks/{n1}/subnets", "subnets.list", NETWORK_API, self._subnet_list)]
        routes = [Route(verb, re.compile(re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", uri) + "/?", re.IGNORECASE),
                         name, api, handler, bool(rest and rest[0]))
                  for verb, uri, name, api, handler, *rest in table]
        assignment = re.compile(r"(?P<scope>/subscriptions/(?P<subscription>[^/]+)(?:/.+?)?)/providers/"
                                r"Microsoft\.Authorization/roleAssignments/(?P<n1>[^/]+)/?", re.IGNORECASE)
        return routes + [Route(verb, assignment, f"roleAssignments.{name}", AUTHORIZATION_API, handler)
                         for verb, name, handler in (("PUT", "create", self._assignment_put),
                                                     ("GET", "get", self._assignment_get),
                                                     ("DELETE", "delete", self._assignment_delete))]

    # -------------------------------------------------------------------------------------------- serving

    def _serve(self, verb: str, target: str, headers, raw: bytes) -> Reply:
        split = urlsplit(target)
        query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        found = next(((route, match) for route in self._routes
                      if route.verb == verb and (match := route.pattern.fullmatch(split.path))), None)
        with self._lock:
            self.calls.append((verb, split.path))
            try:
                self._settle()
                if found is None or found[0].api:
                    self._caller = self._authenticate(headers.get("Authorization"))
                if found is None:
                    raise ArmError(501, "NotImplemented", f"The ARM stand-in does not serve {verb} {split.path}.")
                route, match = found
                params = {k: unquote(v) for k, v in match.groupdict().items()}
                if route.api:
                    self._check_scope(route, params, query)
                    if route.name not in OPERATION_POLLS:  # a poll is checked against who started it
                        self._access.check(self._caller, route.name, verb, split.path)
                try:
                    body = json.loads(raw) if raw.strip() else None
                except ValueError as error:
                    raise request_content(f"Unexpected character in the JSON content: {error}.") from None
                return self._call(route, Request(route.name, split.path, query, params, body))
            except ArmError as error:
                reply = Reply(error.status, error.body())
                if error.status == 401:
                    reply.headers["WWW-Authenticate"] = ('Bearer authorization_uri="https://login.microsoftonline.com'
                                                         '/common", error="invalid_token", error_description='
                                                         f'"{error.message}"')
                return reply
            except Exception:  # a bug of the stand-in: say so, as ARM's 500 the client shows
                return Reply(500, {"error": {"code": "InternalServerError", "message": traceback.format_exc()}})

    def _authenticate(self, header: str | None) -> str | None:
        """The caller's principal (None: the operator); 401 for no token or one the stand-in did not give."""
        if not header:
            raise ArmError(401, "AuthenticationFailed", "Authentication failed. The 'Authorization' header is missing.")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ArmError(401, "AuthenticationFailed",
                           "Authentication failed. The 'Authorization' header is provided in an invalid format.")
        if secrets.compare_digest(token.strip(), self._token):
            return None
        principal = self._access.tokens.get(token.strip())
        if principal is None:
            raise ArmError(401, "InvalidAuthenticationToken", "The access token is invalid.")
        return principal

    def _check_scope(self, route: Route, params: dict[str, str], query: dict[str, str]) -> None:
        if params["subscription"] != self.subscription:
            raise ArmError(404, "SubscriptionNotFound", f"The subscription '{params['subscription']}' could not be "
                                                        "found.")
        given = query.get("api-version")
        if not given:
            raise ArmError(400, "MissingApiVersionParameter",
                           "The api-version query parameter (?api-version=) is required for all requests.")
        if given == route.api:
            return
        if route.api == RESOURCES_API:
            raise ArmError(400, "InvalidApiVersionParameter",
                           f"The api-version '{given}' is invalid. The supported versions are '{route.api}'.")
        kind = route.name.split(".")[0]
        raise ArmError(400, "NoRegisteredProviderFound",
                       f"No registered resource provider found for location '{self.locations[0]}' and API version "
                       f"'{given}' for type '{kind}'. The supported api-versions are '{route.api}'. The supported "
                       f"locations are '{', '.join(self.locations)}'.")

    def _call(self, route: Route, request: Request) -> Reply:
        fault = self._take_fault(route.name)
        if fault and fault.on == "call":
            context = self._fault_context(request.body)
            raise ArmError(fault.status, fault.code, fault.message or fault_message(fault.code, fault.status,
                                                                                    **context))
        self._fault_now = fault
        try:
            return route.handler(request)
        finally:
            self._fault_now = None

    def _take_fault(self, operation: str) -> Fault | None:
        """The fault this call of `operation` meets, if any (nth counts the calls since the fault was set)."""
        return take_fault(self._faults, lambda fault: fault.operation == operation)

    @staticmethod
    def _fault_context(body: object) -> dict:
        """What a quota or capacity message names, from a VM request body: size, cores, family, location."""
        if not isinstance(body, dict):
            return {}
        try:
            size_name, size = vm_size(((body.get("properties") or {}).get("hardwareProfile") or {}).get("vmSize"))
        except ArmError:
            return {"location": str(body.get("location") or "")}
        return {"size": size_name, "cores": size.vcpus, "family": size.family, "location": body.get("location", "")}

    # -------------------------------------------------------------------------------------------- operations

    def _begin(self, provider: str, location: str, finish: Callable[[], None] | None = None,
               undo: Callable[[], None] | None = None, context: dict | None = None) -> Op:
        """Start a long-running operation: InProgress now, done op_delay from now; then `finish` runs, or, where a
        fault fails it, `undo`."""
        op = Op(str(uuid.uuid4()), provider, location, time.monotonic() + self.op_delay, self._now(), finish, undo,
                 context or {}, self._fault_now, caller=self._caller)
        self._fault_now = None
        self._ops[op.name] = op
        return op

    def _urls(self, op: Op) -> tuple[str, str]:
        """(Azure-AsyncOperation, Location) of an operation, as each provider writes them."""
        sub = f"{self.endpoint}/subscriptions/{self.subscription}"
        if op.provider == "network":
            base = f"{sub}/providers/Microsoft.Network/locations/{op.location}"
            return (f"{base}/operations/{op.name}?api-version={NETWORK_API}",
                    f"{base}/operationResults/{op.name}?api-version={NETWORK_API}")
        if op.provider == "resources":
            token = base64.urlsafe_b64encode(f"RGDELETE|{op.name}".encode()).decode().rstrip("=")
            op_url = f"{sub}/operationresults/{token}?api-version={RESOURCES_API}"
            return op_url, op_url
        kind, api = ("DiskOperations", DISK_API) if op.provider == "disk" else ("operations", COMPUTE_API)
        base = f"{sub}/providers/Microsoft.Compute/locations/{op.location}/{kind}/{op.name}?p={uuid.uuid4()}"
        return f"{base}&api-version={api}", f"{base}&monitor=true&api-version={api}"

    def _op_headers(self, op: Op, *, status: bool = True, location: bool = True) -> dict[str, str]:
        status_url, location_url = self._urls(op)
        return {**({"Azure-AsyncOperation": status_url} if status else {}),
                **({"Location": location_url} if location else {}), "Retry-After": "0"}

    def _settle(self) -> None:
        settle(self._ops, lambda op: op.status == "InProgress", self._complete)

    def _complete(self, op: Op) -> None:
        fault = end_operation(op)
        if fault:
            op.status = "Failed"
            op.error = {"code": fault.code, "message": fault.message or fault_message(fault.code, fault.status,
                                                                                        **op.context)}
        else:
            op.status = "Succeeded"
        op.ended = self._now()

    def _op_of(self, request: Request) -> Op:
        name = request.params["operation"]
        if request.op == "operationResults.get":
            with contextlib.suppress(ValueError):
                name = base64.urlsafe_b64decode(name + "=" * (-len(name) % 4)).decode().split("|")[-1]
        if name not in self._ops:
            raise ArmError(404, "NotFound", f"The operation '{request.params['operation']}' was not found.")
        if self._caller not in (None, self._ops[name].caller):  # the operator reads every operation
            raise authorization_failed(self._caller, access_action(request.op, "GET", request.path), request.path)
        return self._ops[name]

    def _op_poll(self, request: Request) -> Reply:
        """Compute and disk operations: the status, or, with monitor=true, the result (Location)."""
        return self._op_result(request) if request.query.get("monitor") == "true" else self._op_status(request)

    def _op_status(self, request: Request) -> Reply:
        op = self._op_of(request)
        body = {"name": op.name, "status": op.status, "startTime": op.started}
        if op.status != "InProgress":
            body["endTime"] = op.ended
        if op.error:
            body["error"] = op.error
        return Reply(200, body, {"Retry-After": "0"} if op.status == "InProgress" else {})

    def _op_result(self, request: Request) -> Reply:
        op = self._op_of(request)
        if op.status == "InProgress":
            return Reply(202, None, {"Location": self.endpoint + request.path + "?" + urlencode(request.query),
                                      "Retry-After": "0"})
        if op.status == "Failed":
            return Reply(op.fault.status if op.fault.status >= 400 else 409, {"error": op.error})
        return Reply(200)

    # ------------------------------------------------------------------------------------------- common verbs

    def _group(self, name: str, *, live: bool = False) -> dict:
        group = self._groups.get(name.lower())
        if group is None:
            raise group_not_found(name)
        if live and group["properties"]["provisioningState"] == "Deleting":
            raise ArmError(409, "ResourceGroupBeingDeleted", f"The resource group '{group['name']}' is in "
                                                             "deprovisioning state and cannot perform this operation.")
        return group

    def _rid(self, request: Request, type_name: str | None = None) -> ResourceId:
        names = [request.params[k] for k in ("n1", "n2", "n3") if k in request.params]
        return self._id(request.params["group"], type_name or TYPES[request.op.split(".")[0]], *names)

    def _missing(self, rid: ResourceId) -> ArmError:
        if rid.namespace.lower() == "microsoft.network" and len(rid.types) > 1:
            return ArmError(404, "NotFound", f"Resource {rid} not found.")
        path = "/".join(f"{t}/{n}" for t, n in zip(rid.types, rid.names, strict=True))
        return resource_not_found(rid.namespace, path, rid.group)

    def _existing(self, request: Request) -> ResourceId:
        self._group(request.params["group"])
        rid = self._rid(request)
        if rid.key not in self._resources:
            raise self._missing(rid)
        return rid

    def _get(self, request: Request) -> Reply:
        return Reply(200, self._view(self._existing(request).key))

    def _in_group(self, key: str, group: str) -> bool:
        return parse_id(key).group.lower() == group.lower()

    def _list(self, request: Request) -> Reply:
        type_name = TYPES[request.op.split(".")[0]]
        if "$filter" in request.query:
            raise ArmError(400, "InvalidFilterInQueryString",
                           f"Invalid $filter '{request.query['$filter']}' specified in the query string.")
        group = self._group(request.params["group"])["name"] if "group" in request.params else None
        parent = self._rid(request, GALLERY_IMAGE).key if "n2" in request.params else None
        keys = sorted(k for k, r in self._resources.items() if r["type"] == type_name
                      and (group is None or self._in_group(k, group))
                      and (parent is None or parse_id(k).parent.key == parent))
        expand = request.query.get("$expand") == "instanceView" or request.query.get("statusOnly") == "true"
        return self._paged(request, [self._view(k, expand=expand) for k in keys])

    def _paged(self, request: Request, items: list) -> Reply:
        chosen, following = page(items, request.query.get("$skiptoken", ""))
        body: dict = {"value": chosen}
        if following is not None:
            query = {k: v for k, v in request.query.items() if k != "$skiptoken"} | {"$skiptoken": following}
            body["nextLink"] = f"{self.endpoint}{request.path}?{urlencode(query, quote_via=quote, safe=SAFE)}"
        return Reply(200, body)

    def _parse(self, model: type, body: object) -> dict:
        """A request body as the SDK's model takes it, less its read-only members; 400 where the schema refuses."""
        problem = schema_problem(model, body if body is not None else "")
        if problem:
            raise problem
        encoder = sys.modules[model.__module__.rsplit(".", 2)[0] + "._utils.model_base"].SdkJSONEncoder
        return json.loads(json.dumps(model(body), cls=encoder, exclude_readonly=True))

    def _put_prologue(self, request: Request, model: type) -> tuple[ResourceId, dict, dict | None]:
        """The id, body (location and tags checked) and former state of a tracked resource's PUT."""
        self._group(request.params["group"], live=True)
        rid = self._rid(request)
        check_name(rid.type, rid.name)
        body = self._parse(model, request.body)
        body["location"] = check_location(body.get("location"), self.locations, rid.type)
        body["tags"] = check_tags(body.get("tags"))
        old = self._resources.get(rid.key)
        if old and old["location"] != body["location"]:
            raise ArmError(409, "InvalidResourceLocation",
                           f"The resource '{rid.name}' already exists in location '{old['location']}' in resource "
                           f"group '{rid.group}'. A resource with the same name cannot be created in location "
                           f"'{body['location']}'. Please select a new resource name.")
        if old and old["properties"].get("provisioningState") == "Deleting":
            raise ArmError(409, "OperationNotAllowed", f"The resource {rid} is being deleted.")
        return rid, body, old

    def _store(self, rid: ResourceId, stored: dict, old: dict | None, provider: str, *, state: str,
               finish: Callable[[], None] | None = None, undo: Callable[[], None] | None = None,
               context: dict | None = None) -> tuple[Op, int]:
        """Store a resource being made or changed (provisioningState `state` until its operation is done): the
        operation, and the status the PUT answers."""
        stored["properties"]["provisioningState"] = state
        self._resources[rid.key] = stored

        def done() -> None:
            if self._resources.get(rid.key) is stored:
                stored["properties"]["provisioningState"] = "Succeeded"
            if finish:
                finish()

        def undone() -> None:
            if undo:
                undo()
            if self._resources.get(rid.key) is stored:
                if old is None:
                    self._resources.pop(rid.key)
                else:
                    self._resources[rid.key] = old

        return self._begin(provider, stored["location"], done, undone, context), 200 if old else 201

    def _delete(self, request: Request) -> Reply:
        self._group(request.params["group"])
        rid = self._rid(request)
        stored = self._resources.get(rid.key)
        if stored is None:
            return Reply(204)
        self._check_deletable(rid)
        before = stored["properties"].get("provisioningState")
        stored["properties"]["provisioningState"] = "Deleting"

        def finish() -> None:
            if rid.type == VM:
                self._remove_vm(rid.key)
            else:
                self._resources.pop(rid.key, None)

        def undo() -> None:
            stored["properties"]["provisioningState"] = before

        op = self._begin(self._provider(rid), stored["location"], finish, undo)
        return Reply(202, None, self._op_headers(op))

    @staticmethod
    def _provider(rid: ResourceId) -> str:
        if rid.namespace == "Microsoft.Network":
            return "network"
        return "disk" if rid.type in (DISK, SNAPSHOT) else "compute"

    def _check_deletable(self, rid: ResourceId) -> None:
        """400/409 where the provider refuses to delete a resource still in use."""
        self._check_scale_set_deletable(rid)
        if rid.type == NIC and (user := self._nic_user(rid.key)):
            raise ArmError(400, "NicInUse", f"Network Interface {rid} is used by existing resource {user}. In order "
                                            "to delete the network interface, it must be dissociated from the "
                                            "resource. To learn more, see aka.ms/deletenic.")
        if rid.type == DISK and (user := self._disk_user(rid.key)):
            raise ArmError(409, "OperationNotAllowed", f"Disk {rid.name} is attached to VM {user}.")
        if rid.type == PIP and (users := self._ipconfigs(lambda c: self._same(id_of(c.get("publicIPAddress")),
                                                                             rid))):
            raise ArmError(400, "PublicIPAddressCannotBeDeleted",
                           f"Public IP address {rid} can not be deleted since it is still allocated to resource "
                           f"{users[0]}. In order to delete the public IP, disassociate/detach the Public IP address "
                           "from the resource. To learn how to do this, see aka.ms/deletepublicip.")
        if rid.type == NSG and (users := self._nsg_users(rid)):
            raise ArmError(400, "InUseNetworkSecurityGroupCannotBeDeleted",
                           f"Network security group {rid} cannot be deleted because it is in use by the following "
                           f"resources: {', '.join(users)}. In order to delete the Network security group, remove "
                           "the association with the resource(s). To learn how to do this, see aka.ms/deletensg.")
        if rid.type == VNET:
            for subnet in self._resources[rid.key]["properties"]["subnets"]:
                self._check_subnet_unused(subnet)

    # -------------------------------------------------------------------------------------------- references

    @staticmethod
    def _same(ref: str, rid: ResourceId | str) -> bool:
        return bool(ref) and ref.lower() == (rid.key if isinstance(rid, ResourceId) else rid.lower())

    def _of_type(self, type_name: str) -> list[tuple[str, dict]]:
        return [(k, r) for k, r in self._resources.items() if r["type"] == type_name]

    def _ipconfigs(self, wanted: Callable[[dict], bool]) -> list[str]:
        """The ids of the NIC ip configurations whose properties `wanted` picks."""
        return [c["id"] for _, nic in self._of_type(NIC) for c in nic["properties"]["ipConfigurations"]
                if wanted(c["properties"])]

    def _nic_user(self, nic_key: str) -> str:
        """The id of the VM a NIC is attached to, or ""."""
        return next((vm["id"] for _, vm in self._of_type(VM)
                     for ref in vm["properties"]["networkProfile"]["networkInterfaces"]
                     if self._same(ref["id"], nic_key)), "")

    def _disk_user(self, disk_key: str) -> str:
        """The id of the VM a disk is attached to, or ""."""
        for _, vm in self._of_type(VM):
            storage = vm["properties"]["storageProfile"]
            if any(self._same(d["managedDisk"]["id"], disk_key) for d in [storage["osDisk"], *storage["dataDisks"]]):
                return vm["id"]
        return ""

    def _nsg_users(self, rid: ResourceId) -> list[str]:
        nics = [nic["id"] for _, nic in self._of_type(NIC)
                if self._same(id_of(nic["properties"].get("networkSecurityGroup")), rid)]
        subnets = [s["id"] for _, vnet in self._of_type(VNET) for s in vnet["properties"]["subnets"]
                   if self._same(id_of(s["properties"].get("networkSecurityGroup")), rid)]
        return nics + subnets

    def _stored_as(self, ref: object, type_name: str) -> tuple[ResourceId | None, dict | None]:
        """The id `ref` parses to, and the resource of type `type_name` stored under it: None where `ref` is no id
        of that type or nothing is there."""
        rid = parse_id(ref)
        return rid, self._resources.get(rid.key) if rid and rid.type == type_name else None

    def _reference(self, ref: str, type_name: str, user: ResourceId, location: str) -> dict:
        """The resource a network reference names; 400 InvalidResourceReference where none is, or in another
        region."""
        rid = parse_id(ref)
        stored = self._resources.get(rid.key) if rid and rid.type.lower() == type_name.lower() else None
        if stored is None or stored["location"] != location:
            raise ArmError(400, "InvalidResourceReference",
                           f"Resource {ref} referenced by resource {user} was not found. Please make sure that the "
                           "referenced resource exists, and that both resources are in the same region.")
        return stored

    def _subnet_of(self, ref: str, user: ResourceId, location: str) -> dict:
        rid = parse_id(ref)
        vnet = self._resources.get(rid.parent.key) if rid and rid.type.lower() == SUBNET.lower() else None
        subnet = next((s for s in vnet["properties"]["subnets"] if self._same(s["id"], rid)), None) if vnet else None
        if subnet is None or vnet["location"] != location:
            raise ArmError(400, "InvalidResourceReference",
                           f"Resource {ref} referenced by resource {user} was not found. Please make sure that the "
                           "referenced resource exists, and that both resources are in the same region.")
        return subnet

    def _view(self, key: str, *, expand: bool = False) -> dict:
        """A resource as ARM answers it: its back references derived from the forward ones."""
        view = copy.deepcopy(self._resources[key])
        props = view["properties"]
        if view["type"] == VNET:
            for subnet in props["subnets"]:
                self._subnet_view(subnet)
        elif view["type"] == NSG:
            rid = parse_id(key)
            props["networkInterfaces"] = [{"id": n} for n in self._nsg_users(rid) if "/networkInterfaces/" in n]
            props["subnets"] = [{"id": s} for s in self._nsg_users(rid) if "/subnets/" in s]
        elif view["type"] == PIP:
            users = self._ipconfigs(lambda c: self._same(id_of(c.get("publicIPAddress")), key))
            if users:
                props["ipConfiguration"] = {"id": users[0]}
        elif view["type"] == NIC:
            user = self._nic_user(key)
            if user:
                vm = self._resources[user.lower()]
                refs = vm["properties"]["networkProfile"]["networkInterfaces"]
                ref = next(r for r in refs if self._same(r["id"], key))
                props["virtualMachine"] = {"id": user}
                props["primary"] = len(refs) == 1 or bool(ref.get("properties", {}).get("primary"))
                digest = hashlib.sha256(key.encode()).hexdigest().upper()
                props["macAddress"] = "-".join(["00", "0D", "3A", digest[0:2], digest[2:4], digest[4:6]])
        elif view["type"] == DISK:
            user = self._disk_user(key)
            if user:
                view["managedBy"] = user
            power = self._guests[user.lower()].power if user else ""
            props["diskState"] = "Reserved" if power == "deallocated" else "Attached" if user else "Unattached"
        elif view["type"] == PPG:
            props["virtualMachines"] = [{"id": vm["id"]} for _, vm in self._of_type(VM)
                                        if self._same(id_of(vm["properties"].get("proximityPlacementGroup")), key)]
            props["virtualMachineScaleSets"] = [
                {"id": vmss["id"]} for _, vmss in self._of_type(VMSS)
                if self._same(id_of(vmss["properties"].get("proximityPlacementGroup")), key)]
        elif view["type"] == VM and expand:
            props["instanceView"] = self._instance_view(key)
        return view

    def _subnet_view(self, subnet: dict) -> dict:
        configs = self._ipconfigs(lambda c: self._same(id_of(c.get("subnet")), subnet["id"]))
        if configs:
            subnet["properties"]["ipConfigurations"] = [{"id": c} for c in configs]
        return subnet

    # -------------------------------------------------------------------------------------------- resource groups

    def _groups_put(self, request: Request) -> Reply:
        name = request.params["group"]
        check_group_name(name)
        body = self._parse(resource_models.ResourceGroup, request.body)
        location = check_location(body.get("location"), self.locations, GROUP)
        tags = check_tags(body.get("tags"))
        group = self._groups.get(name.lower())
        if group is None:
            self._groups[name.lower()] = group = self._group_body(name, location, tags)
            if body.get("managedBy"):
                group["managedBy"] = body["managedBy"]
            return Reply(201, group)
        self._group(name, live=True)
        if group["location"] != location:
            raise ArmError(409, "InvalidResourceGroupLocation",
                           f"Invalid resource group location '{location}'. The Resource group already exists in "
                           f"location '{group['location']}'.")
        group["tags"] = tags
        return Reply(200, group)

    def _groups_get(self, request: Request) -> Reply:
        return Reply(200, self._group(request.params["group"]))

    def _groups_head(self, request: Request) -> Reply:
        return Reply(204 if request.params["group"].lower() in self._groups else 404)

    def _groups_list(self, request: Request) -> Reply:
        wanted = parse_tag_filter(request.query.get("$filter", ""))
        groups = [g for _, g in sorted(self._groups.items()) if tags_match(g["tags"], wanted)]
        top = request.query.get("$top")
        if top:
            if not top.isdigit():
                raise ArmError(400, "InvalidTopInQueryString", f"Invalid $top '{top}' specified in the query string.")
            groups = groups[:int(top)]
        return self._paged(request, groups)

    def _groups_delete(self, request: Request) -> Reply:
        group = self._group(request.params["group"])
        name = group["name"]
        before = group["properties"]["provisioningState"]
        group["properties"]["provisioningState"] = "Deleting"

        def finish() -> None:
            for key in [k for k in self._resources if self._in_group(k, name)]:
                self._access.forget(self._resources.pop(key)["id"])
                self._guests.pop(key, None)
            self._groups.pop(name.lower(), None)

        def undo() -> None:
            group["properties"]["provisioningState"] = before

        op = self._begin("resources", group["location"], finish, undo)
        return Reply(202, None, self._op_headers(op, status=False))

    # -------------------------------------------------------------------------------------------- role assignments

    def _scope_of(self, request: Request, *, must_exist: bool = False) -> str:
        """The scope of a role assignment call; for a new assignment it must exist (a subscription, a group or a
        resource), while one whose scope was deleted can still be read and deleted."""
        scope = request.path[:request.path.lower().rindex("/providers/microsoft.authorization/")]
        parts = scope.strip("/").split("/")
        if not must_exist:
            return scope
        if len(parts) > 2:
            self._group(parts[3])
        if len(parts) > 4 and scope.lower() not in self._resources:
            rid = parse_id(scope)
            raise resource_not_found(rid.type if rid else scope, parts[-1], parts[3])
        return scope

    def _assignment_put(self, request: Request) -> Reply:
        status, made = self._access.put(self._scope_of(request, must_exist=True), request.params["n1"], request.body)
        return Reply(status, made)

    def _assignment_get(self, request: Request) -> Reply:
        return Reply(200, self._access.get(self._scope_of(request), request.params["n1"]))

    def _assignment_delete(self, request: Request) -> Reply:
        gone = self._access.delete(self._scope_of(request), request.params["n1"])
        return Reply(200, gone) if gone else Reply(204)

    def _vm_boot_diagnostics(self, request: Request) -> Reply:
        rid = self._existing(request)
        vm, guest = self._resources[rid.key], self._guests[rid.key]
        diagnostics = (vm["properties"].get("diagnosticsProfile") or {}).get("bootDiagnostics") or {}
        if not diagnostics.get("enabled"):
            raise ArmError(409, "OperationNotAllowed", f"Boot diagnostics is not enabled for the virtual machine "
                                                       f"'{rid.name}'. Enable diagnosticsProfile.bootDiagnostics to "
                                                       "retrieve its boot diagnostics data.")
        minutes = request.query.get("sasUriExpirationTimeInMinutes") or "120"
        if not minutes.isdigit() or not 1 <= int(minutes) <= 1440:
            raise invalid_parameter(f"The value {minutes} of parameter 'sasUriExpirationTimeInMinutes' is invalid.",
                                    "sasUriExpirationTimeInMinutes")
        signature = secrets.token_urlsafe(24)
        guest.signatures[signature] = time.time() + int(minutes) * 60
        expiry = (datetime.now(UTC) + timedelta(minutes=int(minutes))).strftime("%Y-%m-%dT%H:%M:%SZ")
        query = urlencode({"sv": SAS_VERSION, "sr": "b", "se": expiry, "sp": "r", "sig": signature})
        base = f"{self.endpoint}/blobs/{quote(rid.name)}"
        return Reply(200, {"consoleScreenshotBlobUri": f"{base}/screenshot.bmp?{query}",
                            "serialConsoleLogBlobUri": f"{base}/serial.log?{query}"})

    def _blob_get(self, request: Request) -> Reply:
        """A boot diagnostics blob, as Blob Storage answers a SAS URL (XML errors, no bearer token)."""
        signature = request.query.get("sig", "")
        guest = next((g for k, g in self._guests.items() if signature in g.signatures
                      and parse_id(k).name.lower() == request.params["n1"].lower()), None)
        if guest is None or guest.signatures[signature] < time.time() or request.query.get("sp") != "r":
            return Reply(403, "<?xml version=\"1.0\" encoding=\"utf-8\"?><Error><Code>AuthenticationFailed</Code>"
                               "<Message>Server failed to authenticate the request. Make sure the value of "
                               "Authorization header is formed correctly including the signature.</Message></Error>",
                          content_type="application/xml")
        headers = {"x-ms-blob-type": "BlockBlob", "x-ms-version": SAS_VERSION}
        if request.params["blob"] == "serial.log":
            return Reply(200, guest.serial(time.monotonic()), headers, "text/plain")
        if request.params["blob"] == "screenshot.bmp":
            pixel = b"BM:\x00\x00\x00\x00\x00\x00\x006\x00\x00\x00(\x00\x00\x00\x01\x00\x00\x00\x01\x00\x00\x00" \
                    b"\x01\x00\x18\x00\x00\x00\x00\x00\x04\x00\x00\x00\x13\x0b\x00\x00\x13\x0b" + bytes(12)
            return Reply(200, pixel, headers, "image/bmp")
        return Reply(404, "<?xml version=\"1.0\" encoding=\"utf-8\"?><Error><Code>BlobNotFound</Code><Message>The "
                           "specified blob does not exist.</Message></Error>", content_type="application/xml")




def main(argv: list[str] | None = None) -> int:
    parser = stand_in_parser("arm", "a stand-in Azure Resource Manager", "completes")
    parser.add_argument("--subscription", default="00000000-0000-0000-0000-000000000000")
    parser.add_argument("--location", action="append", dest="locations", help="a location served (repeatable)")
    parser.add_argument("--image", action="append", default=[], metavar="GROUP/NAME", help="a managed image to serve")
    args = parser.parse_args(argv)
    arm = Arm(args.subscription, args.locations or ("eastus", "westus2"), args.op_delay, host=args.host,
              port=args.port)
    for image in args.image:
        group, _, name = image.partition("/")
        arm.add_image(group, name)
    print(f"serving ARM for subscription {arm.subscription} at {arm.endpoint}\nCA file: {arm.ca_file}\n"
          f"bearer token: {arm.credential().get_token().token}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # so the CA's temporary directory goes too
    try:
        serve(arm._server)
    finally:
        arm._tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A stand-in for the part of the Compute Engine v1 REST API kiln uses, served over plain HTTP on loopback.

No emulator of GCE exists (moto covers AWS only). The official client is pointed here by its own option and nothing
is patched:

    with Gce() as gce:                                   # serves on 127.0.0.1, a free port: gce.endpoint
        gce.add_image("kiln-gpu-1", family="kiln-gpu")
        instances = gce.client(compute_v1.InstancesClient)
        # == compute_v1.InstancesClient(credentials=AnonymousCredentials(),
        #                               client_options={"api_endpoint": gce.endpoint})

It serves one project (and, read-only, the images of other projects added with `add_image(project=...)`) in a few
zones: instances (insert, get, list, aggregatedList, delete, getGuestAttributes, getSerialPortOutput, setLabels,
stop, start, attachDisk), zones (list), machineTypes (get, aggregatedList: the types each zone offers), disks
(insert, get, list, delete, setLabels), resourcePolicies (insert, get, list, delete), snapshots and firewalls
(global: the same), images (get, getFromFamily, list) and the zone, region and global operations (get, list, wait).
A resource's numeric id serves in place of its name, as in GCE.

How it holds to the real API:
- URIs, verbs and query parameters are those of the library's own REST transport (`transports/rest_base.py`).
- Request bodies are parsed with the library's message types, refusing unknown fields (400), and every answer is
  one of them, written with `to_json` (empty lists left out, as the API does).
- Errors are Google API errors (`{"error": {"code", "message", "errors": [{"message", "domain", "reason"}]}}`), so
  google-api-core raises NotFound, Conflict, BadRequest, PreconditionFailed... as against the real thing. A method
  the stand-in does not serve answers 501, never an empty success.
- Self links are full `https://www.googleapis.com/compute/v1/...` URLs; references in requests may be full URLs
  or partial paths (`zones/Z/machineTypes/T`, `projects/P/global/images/family/F`, `global/networks/default`).
- Every mutating call answers an Operation, RUNNING at first, DONE `op_delay` seconds later (checked at each
  request); `wait` blocks until DONE or WAIT_SECONDS. An instance shows PROVISIONING until its insert is DONE,
  then RUNNING; its serial console then shows the cloud-init host key block of a real Ubuntu boot, and with
  `enable-guest-attributes=TRUE` the guest agent's `hostkeys/` guest attributes, both from real keys made at insert.
- Stopping releases ephemeral external addresses and starting assigns new ones, as GCE does.

Faults for tests: `fail("instances.insert", reason="ZONE_RESOURCE_POOL_EXHAUSTED", code=503, on="operation")`,
`preempt(zone, name)`; `calls` lists (method, path) as served.

The service is this module (state, routes, serving, operations, the calls every resource shares) with a mixin for
instances (gce_instances) and one for disks, snapshots, firewalls and policies (gce_resources); its pure rules are in
gce_rules, the shared records in gce_types. As a program:

    python -m testbed.gce --port 8089 --zone us-central1-a --image kiln-gpu-1=kiln-gpu
"""

from __future__ import annotations

import re
import secrets
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, unquote, urlsplit

from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from localcloud.guest import QuietServer, Served
from testbed import end_operation, serve, settle, stand_in_parser, take_fault
from testbed.gce_instances import InstanceHandlers
from testbed.gce_prices import PriceHandlers
from testbed.gce_resources import ResourceHandlers
from testbed.gce_rules import (
    DONE,
    MACHINE_TYPES,
    POOL_MESSAGE,
    QUOTA_MESSAGE,
    WAIT_SECONDS,
    ApiError,
    already_exists,
    api_url,
    check_labels,
    check_name,
    filter_matches,
    fingerprint,
    invalid,
    not_found,
    page,
    parse_filter,
    ref_path,
    region_of,
    scope_of,
)
from testbed.gce_types import Fault, Guest, Op, dump

# ------------------------------------------------------------------------------------------------------ service


class Gce(Served, InstanceHandlers, ResourceHandlers, PriceHandlers):
    """The service: state under one lock, a route table, one group of handlers per resource kind."""

    def __init__(self, project: str = "kiln-test", zones: Iterable[str] = ("us-central1-a", "us-central1-b"),
                 op_delay: float = 0.05, *, host: str = "127.0.0.1", port: int = 0, boot_delay: float = 0.0,
                 machine_types: Mapping[str, Iterable[str]] | None = None):
        """`machine_types` names the types each zone offers (default: all of MACHINE_TYPES in every zone);
        `boot_delay` is how long after RUNNING cloud-init prints the host keys and the guest agent publishes them."""
        self.project = project
        self.zones = tuple(zones)
        self.regions = tuple(dict.fromkeys(region_of(z) for z in self.zones))
        self.op_delay = op_delay
        self.boot_delay = boot_delay
        offered = machine_types or {}
        self.machine_types = {z: set(offered.get(z, MACHINE_TYPES)) & set(MACHINE_TYPES) for z in self.zones}
        self.calls: list[tuple[str, str]] = []
        self._resources: dict[str, object] = {}  # path projects/P/... -> message
        self._skus: list[dict] = []  # the Billing Catalog's (price_sku)
        self._guests: dict[str, Guest] = {}  # instance path -> its guest
        self._ops: dict[str, Op] = {}  # operation path -> operation
        self._faults: list[Fault] = []
        self._capacity: dict[str, int] = {}  # zone -> how many instances it can hold now (capacity())
        self._request_ids: dict[tuple[str, str], str] = {}  # (method, requestId) -> operation path
        self._last_stamp = datetime.min.replace(tzinfo=UTC)
        self._next_nat = 0
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self.add_network("default")
        self._routes = self._route_table()
        self.serve(QuietServer((host, port), _handler(self)))

    # ------------------------------------------------------------------------------------------- for tests

    def client(self, kind: type):
        """A compute_v1 client of `kind` (InstancesClient, ...) pointed here, with anonymous credentials."""
        return kind(credentials=AnonymousCredentials(), client_options={"api_endpoint": self.endpoint})

    def add_image(self, name: str, family: str | None = None, labels: Mapping[str, str] | None = None, *,
                  project: str | None = None, disk_size_gb: int = 10, deprecated: bool = False) -> str:
        """Add a READY image (to `project`, default this one: public image projects too); its self link."""
        check_name(name)
        check_labels(labels or {})
        with self._lock:
            path = f"projects/{project or self.project}/global/images/{name}"
            image = compute_v1.Image(
                kind="compute#image", id=self._id(), creation_timestamp=self._stamp(), name=name, family=family or "",
                labels=dict(labels or {}), label_fingerprint=fingerprint(labels or {}), self_link=api_url(path),
                status="READY", disk_size_gb=disk_size_gb, source_type="RAW", architecture="X86_64",
                archive_size_bytes=disk_size_gb * 2**28, storage_locations=["us"])
            if deprecated:
                image.deprecated = compute_v1.DeprecationStatus(state="DEPRECATED")
            self._resources[path] = image
            return image.self_link

    def add_network(self, name: str) -> str:
        """Add an auto-mode VPC network (a subnetwork of its name in every region); its self link."""
        check_name(name)
        path = f"projects/{self.project}/global/networks/{name}"
        with self._lock:
            self._resources[path] = compute_v1.Network(
                kind="compute#network", id=self._id(), name=name, self_link=api_url(path),
                creation_timestamp=self._stamp(), auto_create_subnetworks=True,
                subnetworks=[api_url(f"projects/{self.project}/regions/{r}/subnetworks/{name}") for r in self.regions])
        return api_url(path)

    def host_keys(self, zone: str, name: str) -> list[str]:
        """The host keys the instance really has: `<type> <base64>` lines."""
        with self._lock:
            path = self._path("zones", zone, "instances", name)
            if path not in self._guests:
                raise KeyError(path)
            return list(self._guests[path].keys)

    def fail(self, method: str, *, reason: str, code: int, message: str | None = None, nth: int = 1,
             on: str = "call") -> None:
        """Make the nth call of `method` from now ("instances.insert") fail: at once with that HTTP code and
        reason (on="call"), or as a DONE operation with that error (on="operation": reason is the operation's
        error code, e.g. QUOTA_EXCEEDED, ZONE_RESOURCE_POOL_EXHAUSTED) while nothing is made."""
        methods = {name for _, _, name, _ in self._routes}
        if method not in methods:
            raise ValueError(f"no method {method!r}: one of {sorted(methods)}")
        if on not in ("call", "operation") or nth < 1:
            raise ValueError("on is 'call' or 'operation', nth at least 1")
        if on == "operation" and not self._mutating(method):
            raise ValueError(f"{method} answers no operation")
        with self._lock:
            self._faults.append(Fault(method, reason, code, message, nth, on))

    def capacity(self, zone: str, machines: int | None) -> None:
        """How many instances `zone` can hold from now (None: as many as asked): an insert beyond it fails as GCE's
        does when a zone has no machines left, a DONE operation with ZONE_RESOURCE_POOL_EXHAUSTED, and nothing of
        it is left. 0 empties the zone; None fills it again."""
        if zone not in self.zones:
            raise ValueError(f"no zone {zone!r}: one of {self.zones}")
        with self._lock:
            if machines is None:
                self._capacity.pop(zone, None)
            else:
                self._capacity[zone] = machines

    def offer(self, zone: str, machine_types: Iterable[str] | None) -> None:
        """The machine types `zone` offers from now (None: all of MACHINE_TYPES, as at the start): machineTypes.get
        of another answers 404, and an insert of one is refused (400), as GCE does for a type the zone lacks."""
        if zone not in self.zones:
            raise ValueError(f"no zone {zone!r}: one of {self.zones}")
        with self._lock:
            self.machine_types[zone] = set(MACHINE_TYPES if machine_types is None else machine_types) & set(
                MACHINE_TYPES)

    def preempt(self, zone: str, name: str) -> None:
        """Preempt a running SPOT instance as GCE does: TERMINATED, or deleted if its termination action says so;
        a `compute.instances.preempted` operation records it."""
        with self._lock:
            self._settle()
            path = self._path("zones", zone, "instances", name)
            inst = self._resources.get(path)
            if inst is None or inst.scheduling.provisioning_model != "SPOT" or inst.status != "RUNNING":
                raise ValueError(f"{path} is no running SPOT instance")
            op = self._operation("compute.instances.preempted", path, inst.id)
            if inst.scheduling.instance_termination_action == "DELETE":
                self._remove_instance(path)
            else:
                self._stopped(path)
            self._complete(self._ops[ref_path(op.self_link, self.project)])

    # -------------------------------------------------------------------------------------------- plumbing

    def _path(self, scope: str, where: str, collection: str, name: str) -> str:
        middle = "global" if scope == "global" else f"{scope}/{where}"
        return f"projects/{self.project}/{middle}/{collection}/{name}"

    def _new_path(self, scope: str, where: str, collection: str, name: str) -> str:
        """Where an insert puts the resource `name`: 400 where the name is not one GCE allows, 409 where one is there
        already."""
        check_name(name)
        path = self._path(scope, where, collection, name)
        if path in self._resources:
            raise already_exists(path)
        return path

    def _id(self) -> int:
        return secrets.randbelow(2**63 - 2**62) + 2**62

    def _stamp(self) -> str:
        """Now, RFC 3339, strictly after the last stamp (so creation order is creationTimestamp order)."""
        now = max(datetime.now(UTC), self._last_stamp + timedelta(milliseconds=1))
        self._last_stamp = now
        return now.isoformat(timespec="milliseconds")

    @staticmethod
    def _mutating(method: str) -> bool:
        return not method.endswith((".get", ".list", ".aggregatedList", ".wait", ".getFromFamily",
                                    ".getGuestAttributes", ".getSerialPortOutput"))

    def _route_table(self) -> list[tuple[str, re.Pattern, str, Callable]]:
        p = "/compute/v1/projects/{project}"
        inst = p + "/zones/{zone}/instances/{instance}"
        table = [
            ("GET", p + "/zones/{zone}/instances", "instances.list", self._list),
            ("POST", p + "/zones/{zone}/instances", "instances.insert", self._instances_insert),
            ("GET", p + "/aggregated/instances", "instances.aggregatedList", self._aggregated),
            ("GET", p + "/aggregated/disks", "disks.aggregatedList", self._aggregated),
            ("GET", p + "/aggregated/resourcePolicies", "resourcePolicies.aggregatedList", self._aggregated),
            ("GET", inst, "instances.get", self._get_one),
            ("DELETE", inst, "instances.delete", self._instances_delete),
            ("GET", inst + "/getGuestAttributes", "instances.getGuestAttributes", self._instances_guest_attributes),
            ("GET", inst + "/serialPort", "instances.getSerialPortOutput", self._instances_serial),
            ("POST", inst + "/setLabels", "instances.setLabels", self._set_labels),
            ("POST", inst + "/stop", "instances.stop", self._instances_stop),
            ("POST", inst + "/start", "instances.start", self._instances_start),
            ("POST", inst + "/attachDisk", "instances.attachDisk", self._instances_attach_disk),
            ("GET", p + "/zones/{zone}/machineTypes/{machineType}", "machineTypes.get", self._machine_types_get),
            ("GET", p + "/aggregated/machineTypes", "machineTypes.aggregatedList", self._machine_types_aggregated),
            ("GET", p + "/zones", "zones.list", self._zones_list),
            ("GET", p + "/zones/{zone}/disks", "disks.list", self._list),
            ("POST", p + "/zones/{zone}/disks", "disks.insert", self._disks_insert),
            ("GET", p + "/zones/{zone}/disks/{disk}", "disks.get", self._get_one),
            ("DELETE", p + "/zones/{zone}/disks/{disk}", "disks.delete", self._disks_delete),
            ("POST", p + "/zones/{zone}/disks/{disk}/setLabels", "disks.setLabels", self._set_labels),
            ("GET", p + "/global/snapshots", "snapshots.list", self._list),
            ("POST", p + "/global/snapshots", "snapshots.insert", self._snapshots_insert),
            ("GET", p + "/global/snapshots/{snapshot}", "snapshots.get", self._get_one),
            ("DELETE", p + "/global/snapshots/{snapshot}", "snapshots.delete", self._delete_plain),
            ("GET", p + "/global/images", "images.list", self._list),
            ("GET", p + "/global/images/family/{family}", "images.getFromFamily", self._images_from_family),
            ("GET", p + "/global/images/{image}", "images.get", self._get_one),
            ("GET", p + "/global/firewalls", "firewalls.list", self._list),
            ("POST", p + "/global/firewalls", "firewalls.insert", self._firewalls_insert),
            ("GET", p + "/global/firewalls/{firewall}", "firewalls.get", self._get_one),
            ("DELETE", p + "/global/firewalls/{firewall}", "firewalls.delete", self._delete_plain),
            ("GET", p + "/regions/{region}/resourcePolicies", "resourcePolicies.list", self._list),
            ("POST", p + "/regions/{region}/resourcePolicies", "resourcePolicies.insert", self._policies_insert),
            ("GET", p + "/regions/{region}/resourcePolicies/{policy}", "resourcePolicies.get", self._get_one),
            ("DELETE", p + "/regions/{region}/resourcePolicies/{policy}", "resourcePolicies.delete",
             self._policies_delete),
            ("GET", "/v1/services/{service}/skus", "services.skus.list", self._skus_list),  # the Billing Catalog
        ]
        for scope, service in (("/zones/{zone}", "zoneOperations"), ("/regions/{region}", "regionOperations"),
                               ("/global", "globalOperations")):
            ops = p + scope + "/operations"
            table += [("GET", ops, f"{service}.list", self._list),
                      ("GET", ops + "/{operation}", f"{service}.get", self._operations_get),
                      ("POST", ops + "/{operation}/wait", f"{service}.wait", self._operations_wait)]
        return [(verb, re.compile(re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", uri) + "$"), name, handler)
                for verb, uri, name, handler in table]

    def _serve(self, verb: str, target: str, body: str) -> tuple[int, str]:
        """Answer one request: (status, JSON)."""
        split = urlsplit(target)
        query = {k: v[0] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        route = next(((found, method, handler) for route_verb, pattern, method, handler in self._routes
                      if route_verb == verb and (found := pattern.match(split.path))), None)
        if route is None:
            with self._lock:
                self.calls.append((f"{verb} ?", split.path))
            return 501, ApiError(501, "notImplemented", f"The GCE stand-in does not serve {verb} {split.path}").body()
        found, method, handler = route
        params = {k: unquote(v) for k, v in found.groupdict().items()}
        with self._lock:
            self.calls.append((method, split.path))
            try:
                self._settle()
                return 200, dump(self._call(method, handler, params, query, body))
            except ApiError as error:
                return error.code, error.body()
            except Exception:  # a bug of the stand-in: say so, as a 500 the client shows
                return 500, ApiError(500, "backendError", traceback.format_exc()).body()

    def _call(self, method: str, handler: Callable, params: dict[str, str], query: dict[str, str], body: str):
        self._check_scope(method, params)
        request_id = query.get("requestId", "")
        if request_id and (method, request_id) in self._request_ids:  # a retried request: its first operation
            return self._ops[self._request_ids[method, request_id]].msg
        fault = self._take_fault(method) or self._over_capacity(method, params)
        if fault and fault.on == "call":
            raise ApiError(fault.code, fault.reason, fault.message or HTTPStatus(fault.code).phrase)
        answer = handler(method, params, query, body)
        if isinstance(answer, compute_v1.Operation):
            op_path = ref_path(answer.self_link, self.project)
            self._ops[op_path].fault = fault
            if request_id:
                self._request_ids[method, request_id] = op_path
                answer.client_operation_id = request_id
        return answer

    def _check_scope(self, method: str, params: dict[str, str]) -> None:
        project = params.get("project", self.project)  # the Billing Catalog's calls name none
        image_projects = {path.split("/")[1] for path in self._resources if "/global/images/" in path}
        if project != self.project and not (method.startswith("images.") and project in image_projects):
            raise not_found(f"projects/{project}")
        if "zone" in params and params["zone"] not in self.zones:
            raise invalid("zone", params["zone"], "Unknown zone.")
        if "region" in params and params["region"] not in self.regions:
            raise invalid("region", params["region"], "Unknown region.")

    def _over_capacity(self, method: str, params: dict[str, str]) -> Fault | None:
        """The zone's lack of machines, where capacity() set a limit and the zone's instances reach it."""
        zone = params.get("zone", "")
        if method != "instances.insert" or zone not in self._capacity:
            return None
        held = sum(1 for path in self._resources if path.startswith(f"projects/{self.project}/zones/{zone}/instances/"))
        if held < self._capacity[zone]:
            return None
        return Fault(method, "ZONE_RESOURCE_POOL_EXHAUSTED", 503, None, 0, "operation")

    def _take_fault(self, method: str) -> Fault | None:
        """The fault this call of `method` meets, if any (nth counts the calls since the fault was set)."""
        return take_fault(self._faults, lambda fault: fault.method == method)

    def _target(self, params: dict[str, str], collection: str) -> str:
        """The path of the resource a request names (projects/P/zones/Z/instances/X ...); a numeric id in place
        of the name, as GCE takes it, names the resource of that id."""
        names = [v for k, v in params.items() if k not in ("project", "zone", "region")]
        scope = (f"zones/{params['zone']}" if "zone" in params else
                 f"regions/{params['region']}" if "region" in params else "global")
        parent = f"projects/{params['project']}/{scope}/{collection}"
        if not names:
            return parent
        path = f"{parent}/{names[0]}"
        if path not in self._resources and names[0].isdigit():
            return next((p for p, m in self._resources.items() if p.rsplit("/", 1)[0] == parent
                         and m.id == int(names[0])), path)
        return path

    def _existing(self, path: str):
        if path not in self._resources:
            raise not_found(path)
        return self._resources[path]

    # -------------------------------------------------------------------------------------------- operations

    def _operation(self, op_type: str, target: str, target_id: int, *, finish: Callable[[], None] | None = None,
                   undo: Callable[[], None] | None = None) -> compute_v1.Operation:
        """Start an operation on `target` (a path): RUNNING now, DONE op_delay from now; then `finish` runs, or,
        where a fault fails it, `undo`."""
        scope, where = scope_of(target)
        name = f"operation-{int(time.time() * 1000)}-{secrets.token_hex(6)}-{secrets.token_hex(4)}"
        path = self._path(scope, where, "operations", name)
        now = self._stamp()
        op = compute_v1.Operation(
            kind="compute#operation", id=self._id(), name=name, operation_type=op_type, target_link=api_url(target),
            target_id=target_id, status="RUNNING", user=f"anonymous@{self.project}.iam.gserviceaccount.com",
            progress=0, insert_time=now, start_time=now, self_link=api_url(path))
        if scope == "zones":
            op.zone = api_url(f"projects/{self.project}/zones/{where}")
        elif scope == "regions":
            op.region = api_url(f"projects/{self.project}/regions/{where}")
        self._ops[path] = Op(op, time.monotonic() + self.op_delay, finish, undo)
        self._resources[path] = op
        return op

    def _settle(self) -> None:
        settle(self._ops, lambda op: op.msg.status != DONE, self._complete)

    def _complete(self, op: Op) -> None:
        fault = end_operation(op)
        if fault:
            default = {"QUOTA_EXCEEDED": QUOTA_MESSAGE, "ZONE_RESOURCE_POOL_EXHAUSTED": POOL_MESSAGE
                       }.get(fault.reason, HTTPStatus(fault.code).phrase)
            message = fault.message or default.format(zone=ref_path(op.msg.zone, self.project))
            error = compute_v1.Errors(code=fault.reason, message=message)
            if fault.reason == "QUOTA_EXCEEDED" and not fault.message:
                error.error_details = [compute_v1.ErrorDetails(quota_info=compute_v1.QuotaExceededInfo(
                    metric_name="compute.googleapis.com/gpus_all_regions", limit_name="GPUS-ALL-REGIONS-per-project",
                    limit=0.0))]
            op.msg.error = compute_v1.Error(errors=[error])
            op.msg.http_error_status_code = fault.code
            op.msg.http_error_message = HTTPStatus(fault.code).phrase.upper()
        op.msg.status = DONE
        op.msg.progress = 100
        op.msg.end_time = self._stamp()
        self._changed.notify_all()

    def _operations_get(self, method, params, query, body):
        return self._op_of(params).msg

    def _op_of(self, params: dict[str, str]) -> Op:
        path = self._target(params, "operations")
        if path not in self._ops:
            raise not_found(path)
        return self._ops[path]

    def _operations_wait(self, method, params, query, body):
        op = self._op_of(params)
        deadline = time.monotonic() + WAIT_SECONDS
        while op.msg.status != DONE and (left := deadline - time.monotonic()) > 0:
            self._changed.wait(min(left, max(op.due - time.monotonic(), 0.001)))  # releases the lock meanwhile
            self._settle()
        return op.msg

    # ------------------------------------------------------------------------------------------- common verbs

    @staticmethod
    def _collection(method: str) -> str:
        """The collection a method works on: instances.get -> instances, zoneOperations.wait -> operations."""
        kind = method.split(".")[0]
        return "operations" if kind.endswith("Operations") else kind

    def _get_one(self, method, params, query, body):
        return self._existing(self._target(params, self._collection(method)))

    def _list(self, method, params, query, body):
        collection = self._collection(method)
        parent = self._target(params, collection)
        items = self._filtered([msg for path, msg in self._resources.items() if path.rsplit("/", 1)[0] == parent],
                               query)
        chosen, token = page(items, query.get("maxResults", ""), query.get("pageToken", ""))
        list_type, kind = {
            "instances": (compute_v1.InstanceList, "compute#instanceList"),
            "disks": (compute_v1.DiskList, "compute#diskList"),
            "snapshots": (compute_v1.SnapshotList, "compute#snapshotList"),
            "images": (compute_v1.ImageList, "compute#imageList"),
            "firewalls": (compute_v1.FirewallList, "compute#firewallList"),
            "resourcePolicies": (compute_v1.ResourcePolicyList, "compute#resourcePolicyList"),
            "operations": (compute_v1.OperationList, "compute#operationList"),
        }[collection]
        return list_type(kind=kind, id=parent, items=chosen, next_page_token=token, self_link=api_url(parent))

    @staticmethod
    def _filtered(items: list, query: dict[str, str]) -> list:
        terms = parse_filter(query.get("filter", ""))
        items = [m for m in items if filter_matches(terms, m.name, dict(getattr(m, "labels", None) or {}))]
        order = query.get("orderBy", "")
        if order not in ("", "name", "creationTimestamp desc"):
            raise invalid("orderBy", order, "Sorting is supported only by name or by creationTimestamp desc.")
        if order == "creationTimestamp desc":
            return sorted(items, key=lambda m: datetime.fromisoformat(m.creation_timestamp), reverse=True)
        return sorted(items, key=lambda m: m.name)

    def _delete_plain(self, method, params, query, body):
        path = self._target(params, self._collection(method))
        target = self._existing(path)
        return self._operation("delete", path, target.id, finish=lambda: self._resources.pop(path, None))

    def _insert(self, path: str, resource, finish: Callable[[], None] | None = None) -> compute_v1.Operation:
        """Store a new resource at once; a failed operation takes it away again."""
        self._resources[path] = resource
        return self._operation("insert", path, resource.id, finish=finish, undo=lambda: self._resources.pop(path, None))

    def _stamped(self, resource, kind: str, path: str):
        resource.kind = kind
        resource.id = self._id()
        resource.creation_timestamp = self._stamp()
        resource.self_link = api_url(path)
        return resource

# ---------------------------------------------------------------------------------------------------------- HTTP


def _handler(gce: Gce) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = 60

        def _reply(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length).decode() if length else ""
            status, text = gce._serve(self.command, self.path, body)
            data = text.encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=UTF-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = do_PATCH = do_PUT = _reply

        def log_message(self, *args) -> None:
            pass

    return Handler


def main(argv: list[str] | None = None) -> int:
    parser = stand_in_parser("gce", "a stand-in Compute Engine v1 API", "is DONE")
    parser.add_argument("--project", default="kiln-test")
    parser.add_argument("--zone", action="append", dest="zones", help="a zone served (repeatable)")
    parser.add_argument("--image", action="append", default=[], metavar="NAME[=FAMILY]", help="an image to serve")
    args = parser.parse_args(argv)
    gce = Gce(args.project, args.zones or ("us-central1-a", "us-central1-b"), args.op_delay,
              host=args.host, port=args.port)
    for image in args.image:
        name, _, family = image.partition("=")
        gce.add_image(name, family or None)
    print(f"serving GCE for project {gce.project} at {gce.endpoint}", flush=True)
    serve(gce._server)
    return 0


if __name__ == "__main__":
    sys.exit(main())

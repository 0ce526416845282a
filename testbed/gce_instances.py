"""The Compute Engine stand-in's instances: create, get, list, delete, start, stop, the serial port and guest
attributes, disks attached (a mixin of testbed.gce.Gce, which holds the state and the routes)."""

from __future__ import annotations

import ipaddress
import time
import zlib
from datetime import UTC, datetime

from google.cloud import compute_v1

from localcloud.guest import make_host_keys
from testbed import next_free
from testbed.gce_rules import (
    INTERNAL_RANGE,
    MACHINE_TYPES,
    NAT_RANGE,
    TRUE_WORDS,
    ApiError,
    MachineType,
    already_exists,
    api_url,
    check_labels,
    fingerprint,
    in_use,
    invalid,
    match_ref,
    metadata_problem,
    not_found,
    not_ready,
    page,
    ref_path,
    region_of,
    scheduling_with_defaults,
)
from testbed.gce_types import Guest, boot_log, parse_body


class InstanceHandlers:
    """compute.instances, as GCE answers."""


    def _aggregated(self, method, params, query, body):
        """instances, disks or resourcePolicies in every zone (region) of the project, by scope, as
        aggregatedList answers: a scope with nothing on this page carries the NO_RESULTS_ON_PAGE warning."""
        collection = method.split(".", 1)[0]
        scope, scopes = ("regions", self.regions) if collection == "resourcePolicies" else ("zones", self.zones)
        everything = [msg for path, msg in self._resources.items()
                      if path.split("/")[2] == scope and path.split("/")[4] == collection]
        items = sorted(self._filtered(everything, query), key=lambda m: (m.self_link, m.name))
        chosen, token = page(items, query.get("maxResults", ""), query.get("pageToken", ""))
        scoped_type, list_type, field_name, kind = {
            "instances": (compute_v1.InstancesScopedList, compute_v1.InstanceAggregatedList, "instances",
                          "compute#instanceAggregatedList"),
            "disks": (compute_v1.DisksScopedList, compute_v1.DiskAggregatedList, "disks",
                      "compute#diskAggregatedList"),
            "resourcePolicies": (compute_v1.ResourcePoliciesScopedList, compute_v1.ResourcePolicyAggregatedList,
                                 "resource_policies", "compute#resourcePolicyAggregatedList"),
        }[collection]
        scoped = {}
        for where in scopes:
            here = [m for m in chosen if f"/{scope}/{where}/" in m.self_link]
            scoped[f"{scope}/{where}"] = scoped_type(**{field_name: here}) if here else scoped_type(
                warning=compute_v1.Warning(
                    code="NO_RESULTS_ON_PAGE",
                    message=f"There are no results for scope '{scope}/{where}' on this page.",
                    data=[compute_v1.Data(key="scope", value=f"{scope}/{where}")]))
        parent = f"projects/{self.project}/aggregated/{collection}"
        return list_type(kind=kind, id=parent, items=scoped, next_page_token=token, self_link=api_url(parent))

    def _machine_types_get(self, method, params, query, body):
        """A machine type as the zone offers it (404 where the zone does not: GCE has no such resource there)."""
        zone, name = params["zone"], params["machineType"]
        if zone not in self.machine_types or name not in self.machine_types[zone]:
            raise not_found(f"projects/{self.project}/zones/{zone}/machineTypes/{name}")
        return self._machine_type_message(zone, name)

    def _machine_types_aggregated(self, method, params, query, body):
        """The machine types every zone offers, by scope `zones/Z` (filtered by name, paged over the types, as
        machineTypes.aggregatedList answers): a zone with none on this page carries NO_RESULTS_ON_PAGE."""
        everything = [self._machine_type_message(zone, name) for zone in self.zones
                      for name in sorted(self.machine_types[zone])]
        items = sorted(self._filtered(everything, query), key=lambda m: (m.zone, m.name))
        chosen, token = page(items, query.get("maxResults", ""), query.get("pageToken", ""))
        scoped = {}
        for zone in self.zones:
            here = [m for m in chosen if m.zone == zone]
            scoped[f"zones/{zone}"] = compute_v1.MachineTypesScopedList(machine_types=here) if here else \
                compute_v1.MachineTypesScopedList(warning=compute_v1.Warning(
                    code="NO_RESULTS_ON_PAGE", message=f"There are no results for scope 'zones/{zone}' on this page.",
                    data=[compute_v1.Data(key="scope", value=f"zones/{zone}")]))
        parent = f"projects/{self.project}/aggregated/machineTypes"
        return compute_v1.MachineTypeAggregatedList(kind="compute#machineTypeAggregatedList", id=parent, items=scoped,
                                                    next_page_token=token, self_link=api_url(parent))

    def _zones_list(self, method, params, query, body):
        """The zones the project sees, UP, each in its region (filtered by name, paged, as zones.list answers)."""
        everything = [compute_v1.Zone(kind="compute#zone", id=zlib.crc32(zone.encode()), name=zone, status="UP",
                                      region=api_url(f"projects/{self.project}/regions/{region_of(zone)}"),
                                      self_link=api_url(f"projects/{self.project}/zones/{zone}"))
                      for zone in self.zones]
        chosen, token = page(self._filtered(everything, query), query.get("maxResults", ""),
                             query.get("pageToken", ""))
        parent = f"projects/{self.project}/zones"
        return compute_v1.ZoneList(kind="compute#zoneList", id=parent, items=chosen, next_page_token=token,
                                   self_link=api_url(parent))

    def _machine_type_message(self, zone: str, name: str):
        path = f"projects/{self.project}/zones/{zone}/machineTypes/{name}"
        machine = MACHINE_TYPES[name]
        accelerators = [compute_v1.Accelerators(guest_accelerator_count=machine.gpus,
                                                guest_accelerator_type=machine.accelerator)] if machine.gpus else []
        return compute_v1.MachineType(
            kind="compute#machineType", id=zlib.crc32(name.encode()), name=name, zone=zone, guest_cpus=machine.vcpus,
            memory_mb=machine.memory_mb, accelerators=accelerators, is_shared_cpu=False, self_link=api_url(path),
            description=f"{machine.vcpus} vCPUs, {machine.memory_mb // 1024} GB RAM")

    def _machine_type(self, ref: str, zone: str) -> tuple[str, MachineType]:
        found = match_ref(ref, self.project, "zones/{zone}/machineTypes/{name}")
        if not found or found["project"] != self.project or found["zone"] != zone \
                or found["name"] not in self.machine_types[zone]:
            name = found["name"] if found else ref
            raise invalid("resource.machineType", ref, f"Machine type with name '{name}' does not exist in zone "
                                                       f"'{zone}'.")
        return found["name"], MACHINE_TYPES[found["name"]]

    def _instances_insert(self, method, params, query, body):
        zone = params["zone"]
        inst = parse_body(compute_v1.Instance, body)
        path = self._new_path("zones", zone, "instances", inst.name)
        type_name, machine = self._machine_type(inst.machine_type, zone)
        check_labels(inst.labels)
        problem = metadata_problem((i.key, i.value) for i in inst.metadata.items)
        if problem:
            raise invalid("resource.metadata", "", problem)
        scheduling = scheduling_with_defaults(inst.scheduling, machine)
        accelerators = self._accelerators(inst, zone, machine)
        policies = [self._policy_for(ref, zone, type_name, i) for i, ref in enumerate(inst.resource_policies)]
        attached, new_disks = self._plan_disks(inst, zone)
        nics, static_nat = self._plan_nics(inst.network_interfaces, region_of(zone))
        keys = make_host_keys()

        self._stamped(inst, "compute#instance", path)
        inst.zone = api_url(f"projects/{self.project}/zones/{zone}")
        inst.machine_type = api_url(f"projects/{self.project}/zones/{zone}/machineTypes/{type_name}")
        inst.status = "PROVISIONING"
        inst.scheduling = scheduling
        inst.guest_accelerators = accelerators
        inst.resource_policies = policies
        inst.disks = attached
        inst.network_interfaces = nics
        inst.label_fingerprint = fingerprint(dict(inst.labels))
        inst.metadata.kind = "compute#metadata"
        inst.metadata.fingerprint = fingerprint([(i.key, i.value) for i in inst.metadata.items])
        inst.tags.fingerprint = fingerprint(list(inst.tags.items))
        inst.fingerprint = fingerprint(path, inst.id, inst.creation_timestamp)
        inst.cpu_platform = "Intel Cascade Lake"
        for disk in new_disks:
            self._resources[ref_path(disk.self_link, self.project)] = disk
        for att in attached:
            disk = self._resources[ref_path(att.source, self.project)]
            disk.users.append(inst.self_link)
            disk.last_attach_timestamp = inst.creation_timestamp
        self._guests[path] = Guest(keys, static_nat)

        def finish() -> None:
            for disk in new_disks:
                disk.status = "READY"
            if path in self._guests:
                self._running(path)

        def undo() -> None:
            self._remove_instance(path, delete_disks=False)
            for disk in new_disks:
                self._resources.pop(ref_path(disk.self_link, self.project), None)

        self._resources[path] = inst
        return self._operation("insert", path, inst.id, finish=finish, undo=undo)

    def _accelerators(self, inst: compute_v1.Instance, zone: str, machine: MachineType) -> list:
        wanted = [compute_v1.AcceleratorConfig(accelerator_type=api_url(
            f"projects/{self.project}/zones/{zone}/acceleratorTypes/{machine.accelerator}"),
            accelerator_count=machine.gpus)] if machine.gpus else []
        given = [(a.accelerator_type.rsplit("/", 1)[-1], a.accelerator_count) for a in inst.guest_accelerators]
        if given and given != [(machine.accelerator, machine.gpus)]:
            raise invalid("resource.guestAccelerators", given, "The accelerators must match the machine type's.")
        return wanted

    def _policy_for(self, ref: str, zone: str, type_name: str, index: int) -> str:
        field_name = f"resource.resourcePolicies[{index}]"
        found = match_ref(ref, self.project, "regions/{region}/resourcePolicies/{name}")
        if not found:
            raise invalid(field_name, ref, "The URL is malformed.")
        if found["region"] != region_of(zone):
            raise invalid(field_name, ref, "Resource policy must be in the same region as the instance.")
        path = ref_path(ref, self.project)
        policy = self._existing(path)
        if policy.group_placement_policy.collocation == "COLLOCATED" and type_name.startswith("e2-"):
            raise invalid(field_name, ref, f"Compact placement is not supported for machine type {type_name}.")
        return api_url(path)

    def _disk_users(self, disk_url: str) -> list[tuple[str, str]]:
        """(instance self link, mode) of every instance the disk is attached to."""
        return [(inst.self_link, att.mode) for path, inst in self._resources.items() if path in self._guests
                for att in inst.disks if att.source == disk_url]

    def _plan_disks(self, inst: compute_v1.Instance, zone: str) -> tuple[list, list]:
        """The instance's attached disks as GCE stores them, and the new disks to make; ApiError where refused."""
        if not inst.disks:
            raise invalid("resource.disks", "", "No disks are specified.")
        if [d.boot for d in inst.disks].count(True) != 1 or not inst.disks[0].boot:
            raise invalid("resource.disks", "", "Exactly one boot disk must be specified, first.")
        attached, new = [], []
        for i, given in enumerate(inst.disks):
            field_name = f"resource.disks[{i}]"
            if given.source:
                disk = self._attachable(given, zone, field_name)
            else:
                params = given.initialize_params
                name = params.disk_name or (inst.name if given.boot else f"{inst.name}-{i}")
                path = self._path("zones", zone, "disks", name)
                if path in self._resources or any(d.name == name for d in new):
                    raise already_exists(path)
                disk = self._build_disk(zone, name, params.disk_size_gb if "disk_size_gb" in params else 0,
                                        params.disk_type, params.source_image, params.source_snapshot,
                                        dict(params.labels), f"{field_name}.initializeParams")
                new.append(disk)
            attached.append(self._attached(given, disk, i))
        return attached, new

    def _attachable(self, given: compute_v1.AttachedDisk, zone: str, field_name: str) -> compute_v1.Disk:
        """The existing disk an attachment names, if it may be attached in this mode; ApiError otherwise."""
        found = match_ref(given.source, self.project, "zones/{zone}/disks/{name}")
        if not found:
            raise invalid(f"{field_name}.source", given.source, "The URL is malformed.")
        path = ref_path(given.source, self.project)
        disk = self._existing(path)
        if found["zone"] != zone:
            raise invalid(f"{field_name}.source", given.source, "The disk must be in the instance's zone.")
        if disk.status != "READY":
            raise not_ready(path)
        users = self._disk_users(disk.self_link)
        if users and ((given.mode or "READ_WRITE") == "READ_WRITE" or any(m == "READ_WRITE" for _, m in users)):
            raise in_use("disk", path, ref_path(users[0][0], self.project))
        return disk

    @staticmethod
    def _attached(given: compute_v1.AttachedDisk, disk: compute_v1.Disk, index: int) -> compute_v1.AttachedDisk:
        return compute_v1.AttachedDisk(
            kind="compute#attachedDisk", type_="PERSISTENT", mode=given.mode or "READ_WRITE", source=disk.self_link,
            device_name=given.device_name or f"persistent-disk-{index}", index=index, boot=given.boot,
            auto_delete=given.auto_delete, interface=given.interface or "SCSI", disk_size_gb=disk.size_gb)

    def _instances_attach_disk(self, method, params, query, body):
        path = self._target(params, "instances")
        inst = self._existing(path)
        given = parse_body(compute_v1.AttachedDisk, body)
        if given.boot or not given.source:
            raise invalid("resource.source", given.source, "Only an existing, non-boot disk can be attached.")
        disk = self._attachable(given, params["zone"], "resource")
        device = given.device_name or f"persistent-disk-{len(inst.disks)}"
        if any(att.device_name == device for att in inst.disks):
            raise invalid("resource.deviceName", device, "The device name is already in use on the instance.")
        inst.disks.append(self._attached(given, disk, len(inst.disks)))
        disk.users.append(inst.self_link)
        disk.last_attach_timestamp = self._stamp()

        def undo() -> None:
            inst.disks = [att for att in inst.disks if att.source != disk.self_link]
            disk.users = [u for u in disk.users if u != inst.self_link]

        return self._operation("attachDisk", path, inst.id, undo=undo)

    def _plan_nics(self, given: list, region: str) -> tuple[list, set[str]]:
        """The instance's network interfaces with their addresses, and the external addresses it asked for."""
        if not given:
            raise invalid("resource.networkInterfaces", "", "At least one network interface is required.")
        used_ips = self._addresses("network_i_p")
        used_nat = self._addresses("nat_i_p")
        static: set[str] = set()
        nics = []
        for i, nic in enumerate(given):
            field_name = f"resource.networkInterfaces[{i}]"
            network_ref = nic.network or "global/networks/default"
            if not match_ref(network_ref, self.project, "global/networks/{name}"):
                raise invalid(f"{field_name}.network", network_ref, "The URL is malformed.")
            network = self._existing(ref_path(network_ref, self.project))
            subnet = api_url(f"projects/{self.project}/regions/{region}/subnetworks/{network.name}")
            if nic.subnetwork:
                found = match_ref(nic.subnetwork, self.project, "regions/{region}/subnetworks/{name}")
                if not found or found["region"] != region:
                    raise invalid(f"{field_name}.subnetwork", nic.subnetwork, "The subnetwork must be in the "
                                                                              "instance's region.")
                if api_url(ref_path(nic.subnetwork, self.project)) != subnet:
                    raise not_found(ref_path(nic.subnetwork, self.project))
            if nic.network_i_p:
                if nic.network_i_p in used_ips or ipaddress.ip_address(nic.network_i_p) not in INTERNAL_RANGE:
                    raise invalid(f"{field_name}.networkIP", nic.network_i_p, "IP address is in use or out of the "
                                                                              "subnetwork's range.")
                address = nic.network_i_p
            else:
                address = next(str(ip) for ip in list(INTERNAL_RANGE.hosts())[1:] if str(ip) not in used_ips)
            used_ips.add(address)
            configs = []
            for config in nic.access_configs:
                config.kind = "compute#accessConfig"
                config.type_ = config.type_ or "ONE_TO_ONE_NAT"
                config.name = config.name or "External NAT"
                config.network_tier = config.network_tier or "PREMIUM"
                if config.nat_i_p:
                    static.add(config.nat_i_p)
                elif config.type_ == "ONE_TO_ONE_NAT":
                    config.nat_i_p = self._nat_address(used_nat)
                used_nat.add(config.nat_i_p)
                configs.append(config)
            nics.append(compute_v1.NetworkInterface(
                kind="compute#networkInterface", name=f"nic{i}", network=network.self_link, subnetwork=subnet,
                network_i_p=address, access_configs=configs, stack_type="IPV4_ONLY", fingerprint=fingerprint(
                    address, i)))
        return nics, static

    def _addresses(self, attribute: str) -> set[str]:
        nics = [nic for path in self._guests for nic in self._resources[path].network_interfaces]
        if attribute == "network_i_p":
            return {nic.network_i_p for nic in nics}
        return {c.nat_i_p for nic in nics for c in nic.access_configs if c.nat_i_p}

    def _nat_address(self, used: set[str]) -> str:
        """The next free ephemeral external address, round robin (a restarted instance gets another)."""
        found = next_free([str(host) for host in NAT_RANGE.hosts()], used, self._next_nat)
        if found is None:
            raise ApiError(403, "quotaExceeded", "Quota 'IN_USE_ADDRESSES' exceeded. Limit: 254.0 in region.")
        address, self._next_nat = found
        return address

    def _running(self, path: str) -> None:
        """The instance boots: RUNNING, external addresses, a new boot on its console."""
        inst, guest = self._resources[path], self._guests[path]
        used = self._addresses("nat_i_p")
        for nic in inst.network_interfaces:
            for config in nic.access_configs:
                if config.type_ == "ONE_TO_ONE_NAT" and not config.nat_i_p:
                    config.nat_i_p = self._nat_address(used)
                    used.add(config.nat_i_p)
        inst.status = "RUNNING"
        inst.last_start_timestamp = self._stamp()
        early, late = boot_log(inst.name, guest.keys, len(guest.boots), datetime.now(UTC))
        guest.boots.append((early, late, time.monotonic() + self.boot_delay))

    def _stopped(self, path: str) -> None:
        """The instance stops: TERMINATED, its ephemeral external addresses released."""
        inst, guest = self._resources[path], self._guests[path]
        for nic in inst.network_interfaces:
            for config in nic.access_configs:
                if config.nat_i_p not in guest.static_nat:
                    config.nat_i_p = ""
        inst.status = "TERMINATED"
        inst.last_stop_timestamp = self._stamp()

    def _remove_instance(self, path: str, delete_disks: bool = True) -> None:
        """The instance goes: disks it deletes with it go too, the others are detached."""
        inst = self._resources.pop(path, None)
        self._guests.pop(path, None)
        for att in inst.disks if inst else ():
            disk_path = ref_path(att.source, self.project)
            disk = self._resources.get(disk_path)
            if disk is None:
                continue
            if att.auto_delete and delete_disks:
                del self._resources[disk_path]
            else:
                disk.users = [u for u in disk.users if u != inst.self_link]
                disk.last_detach_timestamp = self._stamp()

    def _instances_delete(self, method, params, query, body):
        path = self._target(params, "instances")
        inst = self._existing(path)
        before = inst.status
        inst.status = "STOPPING"
        return self._operation("delete", path, inst.id, finish=lambda: self._remove_instance(path),
                               undo=lambda: setattr(inst, "status", before))

    def _instances_stop(self, method, params, query, body):
        path = self._target(params, "instances")
        inst = self._existing(path)
        before = inst.status
        if before != "TERMINATED":
            inst.status = "STOPPING"

        def finish() -> None:
            if path in self._guests and inst.status != "TERMINATED":
                self._stopped(path)

        return self._operation("stop", path, inst.id, finish=finish, undo=lambda: setattr(inst, "status", before))

    def _instances_start(self, method, params, query, body):
        path = self._target(params, "instances")
        inst = self._existing(path)
        before = inst.status
        if before == "TERMINATED":
            inst.status = "STAGING"

        def finish() -> None:
            if path in self._guests and inst.status in ("TERMINATED", "STOPPING", "STAGING"):
                self._running(path)

        return self._operation("start", path, inst.id, finish=finish, undo=lambda: setattr(inst, "status", before))

    def _set_labels(self, method, params, query, body):
        """instances.setLabels and disks.setLabels: the labels replaced, if the fingerprint is the current one."""
        collection = self._collection(method)
        path = self._target(params, collection)
        target = self._existing(path)
        kind = compute_v1.InstancesSetLabelsRequest if collection == "instances" else compute_v1.ZoneSetLabelsRequest
        request = parse_body(kind, body)
        check_labels(request.labels)
        if request.label_fingerprint != target.label_fingerprint:
            raise ApiError(412, "conditionNotMet", "Labels fingerprint either invalid or resource labels have changed")
        before = dict(target.labels)
        target.labels = dict(request.labels)
        target.label_fingerprint = fingerprint(dict(request.labels), target.id, time.monotonic_ns())

        def undo() -> None:
            target.labels = before
            target.label_fingerprint = fingerprint(before, target.id, time.monotonic_ns())

        return self._operation("setLabels", path, target.id, undo=undo)

    def _instances_serial(self, method, params, query, body):
        path = self._target(params, "instances")
        self._existing(path)
        port = int(query.get("port") or 1)
        if not 1 <= port <= 4:
            raise invalid("port", port, "Must be between 1 and 4.")
        contents = self._guests[path].serial(time.monotonic()) if port == 1 else ""
        start = min(int(query.get("start") or 0), len(contents))
        return compute_v1.SerialPortOutput(kind="compute#serialPortOutput", contents=contents[start:], start=start,
                                           next_=len(contents), self_link=api_url(path) + f"/serialPort?port={port}")

    def _instances_guest_attributes(self, method, params, query, body):
        path = self._target(params, "instances")
        inst = self._existing(path)
        query_path = query.get("queryPath", "")
        variable = query.get("variableKey", "")
        flag = next((i.value for i in inst.metadata.items if i.key == "enable-guest-attributes"), "")
        published = inst.status == "RUNNING" and flag.lower() in TRUE_WORDS and \
            self._guests[path].booted(time.monotonic())
        entries = {key.split()[0]: key.split()[1] for key in self._guests[path].keys} if published else {}
        answer = compute_v1.GuestAttributes(kind="compute#guestAttributes",
                                            self_link=api_url(path) + "/getGuestAttributes")
        if query_path in ("hostkeys/", "hostkeys") and entries and not variable:
            answer.query_path = query_path
            answer.query_value = compute_v1.GuestAttributesValue(items=[
                compute_v1.GuestAttributesEntry(namespace="hostkeys", key=k, value=v) for k, v in entries.items()])
            return answer
        if variable.startswith("hostkeys/") and variable.split("/", 1)[1] in entries:
            answer.variable_key = variable
            answer.variable_value = entries[variable.split("/", 1)[1]]
            return answer
        raise not_found(f"{path}/guestAttributes/{query_path or variable}")

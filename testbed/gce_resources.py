"""The Compute Engine stand-in's disks, snapshots, firewall rules and resource policies (a mixin of testbed.gce.Gce,
which holds the state and the routes)."""

from __future__ import annotations

import ipaddress
import re
from datetime import datetime

from google.cloud import compute_v1

from testbed.gce_rules import (
    DISK_TYPES,
    api_url,
    check_labels,
    check_name,
    fingerprint,
    in_use,
    invalid,
    match_ref,
    not_found,
    not_ready,
    ref_path,
)
from testbed.gce_types import parse_body


class ResourceHandlers:
    """compute.disks, snapshots, firewalls and resourcePolicies, as GCE answers."""

    # -------------------------------------------------------------------------------------------- disks, snapshots

    def _build_disk(self, zone: str, name: str, size_gb: int, type_ref: str, image_ref: str, snapshot_ref: str,
                    labels: dict[str, str], field_name: str) -> compute_v1.Disk:
        """A new disk (CREATING) as GCE makes it for disks.insert or an instance's initializeParams."""
        check_name(name, f"{field_name}.name")
        check_labels(labels, f"{field_name}.labels")
        type_ref = type_ref or f"zones/{zone}/diskTypes/pd-standard"
        found = match_ref(type_ref, self.project, "zones/{zone}/diskTypes/{name}")
        if not found or found["zone"] != zone or found["name"] not in DISK_TYPES:
            raise invalid(f"{field_name}.diskType", type_ref, "Disk type does not exist in the disk's zone.")
        path = self._path("zones", zone, "disks", name)
        disk = self._stamped(compute_v1.Disk(name=name, labels=labels, status="CREATING"), "compute#disk", path)
        disk.zone = api_url(f"projects/{self.project}/zones/{zone}")
        disk.type_ = api_url(ref_path(type_ref, self.project))
        disk.label_fingerprint = fingerprint(labels)
        disk.physical_block_size_bytes = 4096
        source_size, what = DISK_TYPES[found["name"]], ""
        if image_ref:
            image = self._image(image_ref, f"{field_name}.sourceImage")
            disk.source_image, disk.source_image_id = image.self_link, str(image.id)
            source_size, what = image.disk_size_gb, "image"
        if snapshot_ref:
            if not match_ref(snapshot_ref, self.project, "global/snapshots/{name}"):
                raise invalid(f"{field_name}.sourceSnapshot", snapshot_ref, "The URL is malformed.")
            snapshot = self._existing(ref_path(snapshot_ref, self.project))
            if snapshot.status != "READY":
                raise not_ready(ref_path(snapshot.self_link, self.project))
            disk.source_snapshot, disk.source_snapshot_id = snapshot.self_link, str(snapshot.id)
            source_size, what = snapshot.disk_size_gb, "snapshot"
        if size_gb and what and size_gb < source_size:
            raise invalid(f"{field_name}.diskSizeGb", size_gb,
                          f"Requested disk size cannot be smaller than the {what} size ({source_size} GB).")
        disk.size_gb = size_gb or source_size
        return disk

    def _image(self, ref: str, field_name: str) -> compute_v1.Image:
        family = match_ref(ref, self.project, "global/images/family/{family}")
        if family:
            return self._newest(family["project"], family["family"])
        if not match_ref(ref, self.project, "global/images/{name}"):
            raise invalid(field_name, ref, "The URL is malformed.")
        return self._existing(ref_path(ref, self.project))

    def _newest(self, project: str, family: str) -> compute_v1.Image:
        images = [m for p, m in self._resources.items() if p.startswith(f"projects/{project}/global/images/")
                  and m.family == family and m.deprecated.state in ("", "ACTIVE")]
        if not images:
            raise not_found(f"projects/{project}/global/images/family/{family}")
        return max(images, key=lambda m: datetime.fromisoformat(m.creation_timestamp))

    def _images_from_family(self, method, params, query, body):
        return self._newest(params["project"], params["family"])

    def _disks_insert(self, method, params, query, body):
        zone = params["zone"]
        given = parse_body(compute_v1.Disk, body)
        path = self._new_path("zones", zone, "disks", given.name)
        disk = self._build_disk(zone, given.name, given.size_gb, given.type_, given.source_image,
                                given.source_snapshot, dict(given.labels), "resource")
        disk.description = given.description
        return self._insert(path, disk, finish=lambda: setattr(disk, "status", "READY"))

    def _disks_delete(self, method, params, query, body):
        path = self._target(params, "disks")
        disk = self._existing(path)
        users = self._disk_users(disk.self_link)
        if users:
            raise in_use("disk", path, ref_path(users[0][0], self.project))
        return self._operation("delete", path, disk.id, finish=lambda: self._resources.pop(path, None))

    def _snapshots_insert(self, method, params, query, body):
        given = parse_body(compute_v1.Snapshot, body)
        path = self._new_path("global", "", "snapshots", given.name)
        check_labels(given.labels)
        if not match_ref(given.source_disk, self.project, "zones/{zone}/disks/{name}"):
            raise invalid("resource.sourceDisk", given.source_disk, "The URL is malformed.")
        disk = self._existing(ref_path(given.source_disk, self.project))
        if disk.status != "READY":
            raise not_ready(ref_path(disk.self_link, self.project))
        snapshot = self._stamped(given, "compute#snapshot", path)
        snapshot.status = "CREATING"
        snapshot.source_disk, snapshot.source_disk_id = disk.self_link, str(disk.id)
        snapshot.disk_size_gb = disk.size_gb
        snapshot.storage_bytes = disk.size_gb * 2**27
        snapshot.storage_locations = snapshot.storage_locations or ["us"]
        snapshot.snapshot_type = snapshot.snapshot_type or "STANDARD"
        snapshot.label_fingerprint = fingerprint(dict(snapshot.labels))
        return self._insert(path, snapshot, finish=lambda: setattr(snapshot, "status", "READY"))

    # -------------------------------------------------------------------------------------------- firewalls, policies

    def _firewalls_insert(self, method, params, query, body):
        rule = parse_body(compute_v1.Firewall, body)
        path = self._new_path("global", "", "firewalls", rule.name)
        network_ref = rule.network or "global/networks/default"
        if not match_ref(network_ref, self.project, "global/networks/{name}"):
            raise invalid("resource.network", network_ref, "The URL is malformed.")
        network = self._existing(ref_path(network_ref, self.project))
        for i, cidr in enumerate(rule.source_ranges):
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                raise invalid(f"resource.sourceRanges[{i}]", cidr, "Must be a valid IPV4 or IPV6 range.") from None
        if bool(rule.allowed) == bool(rule.denied):
            raise invalid("resource", "", "Exactly one of allowed or denied must be specified.")
        for i, entry in enumerate([*rule.allowed, *rule.denied]):
            if not (entry.I_p_protocol in ("tcp", "udp", "icmp", "esp", "ah", "sctp", "ipip", "all")
                    or entry.I_p_protocol.isdigit()):
                raise invalid(f"resource.allowed[{i}].IPProtocol", entry.I_p_protocol, "Unknown protocol.")
            for port in entry.ports:
                if not re.fullmatch(r"\d{1,5}(-\d{1,5})?", port) or max(map(int, port.split("-"))) > 65535:
                    raise invalid(f"resource.allowed[{i}].ports", port, "Must be a port or a range of ports.")
        self._stamped(rule, "compute#firewall", path)
        rule.network = network.self_link
        rule.direction = rule.direction or "INGRESS"
        rule.priority = rule.priority if "priority" in rule else 1000
        rule.disabled = rule.disabled
        if rule.direction == "INGRESS" and not (rule.source_ranges or rule.source_tags or
                                                rule.source_service_accounts):
            rule.source_ranges = ["0.0.0.0/0"]
        rule.log_config = compute_v1.FirewallLogConfig(enable=rule.log_config.enable)
        return self._insert(path, rule)

    def _policies_insert(self, method, params, query, body):
        region = params["region"]
        policy = parse_body(compute_v1.ResourcePolicy, body)
        path = self._new_path("regions", region, "resourcePolicies", policy.name)
        self._stamped(policy, "compute#resourcePolicy", path)
        policy.region = api_url(f"projects/{self.project}/regions/{region}")
        policy.status = "CREATING"
        return self._insert(path, policy, finish=lambda: setattr(policy, "status", "READY"))

    def _policies_delete(self, method, params, query, body):
        path = self._target(params, "resourcePolicies")
        policy = self._existing(path)
        for inst_path in self._guests:
            if policy.self_link in self._resources[inst_path].resource_policies:
                raise in_use("resource_policy", path, inst_path)
        return self._operation("delete", path, policy.id, finish=lambda: self._resources.pop(path, None))

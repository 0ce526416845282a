"""The Azure provider: bootstrap.providers.azure.plan decides every request (pure); bootstrap.providers.azure.cloud
makes the azure-mgmt calls. A cluster is one resource group (down deletes it whole). Host keys come from each VM's
serial log (boot diagnostics); a Spot VM learns it is being evicted from Scheduled Events (a Preempt event, at
least 30 s ahead). Autostop deallocates: a VM that only powered itself off would stay allocated and billed, so each
VM gets its own managed identity, allowed to deallocate that VM alone, and its idle agent asks Resource Manager to
deallocate it (its disks stay, and bill, until kiln down)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from bootstrap import state
from bootstrap.errors import UsageError
from bootstrap.hosts import Host
from bootstrap.providers import Gone, Made, Notice, Replacement, provision
from bootstrap.providers.azure import plan
from bootstrap.providers.common import DATA_MOUNT, SSH_WAIT_S, listing, swept, validate_ssh_wait

LOCATION_ENV = "AZURE_LOCATION"
SUBSCRIPTION_PLACEHOLDER = "00000000-0000-0000-0000-000000000000"


@dataclass(frozen=True)
class AzureRequest:
    cluster: plan.Request
    ssh_wait: float


class AzureProvider:
    kind = "azure"
    host_keys = "each VM's serial log (boot diagnostics)"
    shutdown = "azure"
    notice = Notice("azure", "Scheduled Events' Preempt event")
    up_options = frozenset({"instance_type", "spot", "max_price", "image_id", "image_profile", "image_tags",
                            "ssh_cidr", "user", "ttl_hours", "ssh_wait", "volume", "subscription", "location"})
    volumes = True
    where = ("subscription", "location")
    scope = "subscription"  # a subscription's list holds every location's resource groups
    prices = "Azure's Retail Prices API (the Linux Spot meter of the size in the location)"

    def __init__(self, subscription: str | None = None, location: str | None = None):
        self.subscription, self.location = subscription, location

    def request(self, name: str, count: int, options: Mapping[str, Any], idle_minutes: float | None) -> AzureRequest:
        request = plan.validate_request(
            name, count, options.get("instance_type"), location=self.location or os.environ.get(LOCATION_ENV),
            ssh_cidr=options.get("ssh_cidr"), image_id=options.get("image_id"),
            image_profile=options.get("image_profile") or "gpu", image_tags=options.get("image_tags"),
            spot=bool(options.get("spot")), max_price=options.get("max_price"),
            user=options.get("user") or "azureuser", ttl_hours=options.get("ttl_hours", 24.0),
            volume_gb=options.get("volume"), idle_minutes=idle_minutes)
        return AzureRequest(request, validate_ssh_wait(options.get("ssh_wait", SSH_WAIT_S)))

    def plan(self, request: AzureRequest) -> list[str]:
        ssh_wait, request = request.ssh_wait, request.cluster
        sub = self.subscription or os.environ.get("AZURE_SUBSCRIPTION_ID") or SUBSCRIPTION_PLACEHOLDER
        group = plan.group_name(request.name)
        key = state.cluster_dir(request.name) / "id_ed25519"
        tags = plan.cluster_tags(request.name, "you", datetime.now(UTC), request.ttl_hours)
        more = "".join(f", {k}={v}" for k, v in request.image_tags)
        image = request.image_id or plan.IMAGE_PLACEHOLDER.format(profile=request.image_profile, more=more)
        nsg = plan.resource_id(sub, group, "Microsoft.Network/networkSecurityGroups", f"{group}-nsg")
        lines = [f"cluster {request.name}: key {key} (made if missing), then in resource group {group} "
                 f"({request.location}); any failure deletes the group",
                 f"resourceGroups {json.dumps({'location': request.location, 'tags': tags})}",
                 f"networkSecurityGroups {group}-nsg {json.dumps(plan.security_group_body(request, tags))}",
                 f"virtualNetworks {group}-vnet {json.dumps(plan.network_body(request, tags, nsg))}",
                 f"proximityPlacementGroups {group}-ppg {json.dumps(plan.placement_group_body(request, tags))}"]
        # up asks Resource SKUs (RdmaEnabled); the dry run, which asks Azure nothing, goes by the size's name
        scale_set = plan.scale_set_name(request.name) if plan.rdma_by_name(request.vm_size) else None
        if scale_set:
            body = plan.scale_set_body(request, tags, f"<{group}-ppg>")
            lines.append(f"virtualMachineScaleSets {scale_set} {json.dumps(body)} ({request.vm_size} is an RDMA "
                         "size: its VMs reach each other over InfiniBand only within one scale set)")
        if request.volume_gb:
            lines.append(f"disks {plan.disk_name(request.name, 0)} "
                         f"{json.dumps(plan.disk_body(request, index=0, tags=tags))} (each node one, from the "
                         f"cluster's newest snapshot of it if any; mounted at {DATA_MOUNT})")
        vm = plan.vm_name(request.name, 0)
        body = plan.vm_body(request, index=0, image_id=image, public_key=plan.PUBLIC_KEY_PLACEHOLDER.format(
            path=f"{key}.pub"), tags=tags, interface_id=f"<{vm}-nic>", placement_id=f"<{group}-ppg>",
            data_disk_id=f"<{plan.disk_name(request.name, 0)}>" if request.volume_gb else None,
            scale_set_id=f"<{scale_set}>" if scale_set else None)
        lines.append(f"per node: publicIPAddresses {vm}-ip, networkInterfaces {vm}-nic, virtualMachines {vm} "
                     f"{json.dumps(body)} (node 0 of {request.count})")
        wait = (f"and for SSH to answer on each (at most {ssh_wait:g}s)" if ssh_wait
                else "(not for SSH: --ssh-wait 0)")
        lines.append(f"then wait for the VMs to run {wait}; pin the host keys their serial logs show")
        if request.idle_minutes:
            _, assignment = plan.self_deallocation(sub, f"<{vm} id>", f"<{vm} principal>")
            lines.append(f"autostop: each VM gets identity {json.dumps(plan.SYSTEM_IDENTITY)} and, on its own scope, "
                         f"roleAssignments <GUID> {json.dumps(assignment)}; its idle agent deallocates it after "
                         f"{request.idle_minutes:g} minute(s) without a kiln run")
        return lines

    def up(self, request: AzureRequest) -> Made:
        from bootstrap.providers.azure import cloud

        made = cloud.up(request.cluster, subscription=self.subscription, ssh_wait_s=request.ssh_wait)
        return Made(made["name"], tuple(said(made)),
                    tuple(a for a, how in made["host_keys"].items() if how == "first-contact"), made["expires"])

    def down(self, name: str, *, snapshot_ttl_days: float | None = None) -> Gone:
        from bootstrap.providers.azure import cloud

        if snapshot_ttl_days is None:
            removed = cloud.down(name, subscription=self.subscription)
            if not removed:
                return Gone((f"cluster {name}: no resource group {plan.group_name(name)} is left; nothing to do",))
            return Gone((f"cluster {name}: removed {', '.join(removed)} and everything in it",))
        done = cloud.down_with_snapshots(name, ttl_days=snapshot_ttl_days, subscription=self.subscription)
        lines = [f"cluster {name}: node {made.index}'s data disk kept as snapshot {made.name} ({made.size_gb} GB, "
                 f"expires {made.tags.get(plan.TAG_EXPIRES, 'never')}); kiln up {name} --provider azure --volume N "
                 "restores it" for made in done.snapshots]
        if not done.snapshots and not done.kept:
            lines.append(f"cluster {name}: no data disks to snapshot")
        if done.removed:
            lines.append(f"cluster {name}: removed {', '.join(done.removed)} and everything in it")
        return Gone(tuple(lines), tuple(f"{disk} (node {node}): {why}" for disk, node, why in done.kept))

    def list(self) -> list[str]:
        from bootstrap.providers.azure import cloud

        return listing(cloud.list_clusters(subscription=self.subscription),
                       cloud.list_snapshots(subscription=self.subscription), datetime.now(UTC),
                       lambda summary: f"{len(summary.instances)} VM(s), resource group "
                                       f"{plan.group_name(summary.name)}",
                       lambda snapshot: f"{snapshot.cluster} node {snapshot.index} {snapshot.name}: {snapshot.size_gb} "
                                        f"GB, {snapshot.state}, taken {snapshot.taken_at}, expires "
                                        f"{snapshot.tags.get(plan.TAG_EXPIRES, 'never')}")

    def sweep(self, *, dry_run: bool = False) -> list[str]:
        from bootstrap.providers.azure import cloud

        return swept(cloud.sweep(dry_run=dry_run, subscription=self.subscription),
                     cloud.sweep_snapshots(dry_run=dry_run, subscription=self.subscription), dry_run,
                     lambda summary: f"resource group {plan.group_name(summary.name)}",
                     lambda snapshot: f"{snapshot.name} of {snapshot.cluster} node {snapshot.index}, taken "
                                      f"{snapshot.taken_at}, expired {snapshot.tags.get(plan.TAG_EXPIRES)}")

    def places(self, every: bool = False) -> list[str | None]:
        return [self.subscription or os.environ.get("AZURE_SUBSCRIPTION_ID") or None]

    def replace(self, cluster: str, host: Host) -> Replacement:
        from bootstrap.providers.azure import cloud

        new, keys = cloud.replace(cluster, host.address)
        return Replacement(host, new, tuple(keys))

    def arm_autostop(self, cluster: str) -> None:
        from bootstrap.providers.azure import cloud

        cloud.arm_autostop(cluster)

    def spot_prices(self, instance_types: Sequence[str]) -> dict[str, float]:
        from bootstrap.providers.azure import cloud

        location = self.location or os.environ.get(LOCATION_ENV)
        if not location:
            raise UsageError(f"no location to price: give --location or set {LOCATION_ENV}")
        return cloud.spot_prices(instance_types, location)


def said(made: dict) -> list[str]:
    """What to tell the user of a cluster cloud.up made."""
    return provision.made_lines(made, where=f"resource group {made['group']} ({made['location']})",
                                image=made["image"].rsplit("/", 1)[-1], ids=made["vms"], volumes=made["data_disks"],
                                volume_word="data disk", machines="VMs", keys_from="the VMs' serial logs",
                                source="shown")


PROVIDER = AzureProvider

"""The GCP provider: bootstrap.providers.gcp.plan decides every request (pure); bootstrap.providers.gcp.cloud makes
the google-cloud-compute calls. Host keys come from each instance's guest attributes (hostkeys/, published by
the guest agent) or the keys cloud-init prints to its serial port; a Spot VM learns it is being preempted from
the metadata server's instance/preempted, about 30 s ahead; autostop's power-off stops the VM (its GPUs and CPUs
stop billing, its disks bill until `kiln down`: GCE has no terminate-on-shutdown for standard VMs)."""

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
from bootstrap.providers.common import DATA_MOUNT, SSH_WAIT_S, listing, swept, validate_ssh_wait
from bootstrap.providers.gcp import plan

ZONE_ENV = "CLOUDSDK_COMPUTE_ZONE"


@dataclass(frozen=True)
class GcpRequest:
    cluster: plan.Request
    ssh_wait: float


class GcpProvider:
    kind = "gcp"
    host_keys = "each instance's guest attributes (hostkeys/), else its serial port output"
    shutdown = "system"
    notice = Notice("gce", "the metadata server's instance/preempted")
    up_options = frozenset({"instance_type", "spot", "source_image", "image_profile", "image_tags", "ssh_cidr",
                            "user", "ttl_hours", "ssh_wait", "volume", "project", "zone"})
    volumes = True
    where = ("project", "zone")
    scope = "project"  # a project's list holds every zone's machines
    prices = ""

    def __init__(self, project: str | None = None, zone: str | None = None):
        self.project, self.zone = project, zone

    def request(self, name: str, count: int, options: Mapping[str, Any], idle_minutes: float | None) -> GcpRequest:
        request = plan.validate_request(
            name, count, options.get("instance_type"), zone=self.zone or os.environ.get(ZONE_ENV),
            ssh_cidr=options.get("ssh_cidr"), source_image=options.get("source_image"),
            image_profile=options.get("image_profile") or "gpu", image_tags=options.get("image_tags"),
            spot=bool(options.get("spot")), user=options.get("user") or "ubuntu",
            ttl_hours=options.get("ttl_hours", 24.0), volume_gb=options.get("volume"), idle_minutes=idle_minutes)
        ssh_wait = validate_ssh_wait(options.get("ssh_wait", SSH_WAIT_S))
        if idle_minutes and not ssh_wait:
            raise UsageError("--idle-minutes starts an agent on every node over SSH: it needs --ssh-wait above 0")
        return GcpRequest(request, ssh_wait)

    def plan(self, request: GcpRequest) -> list[str]:
        ssh_wait, request = request.ssh_wait, request.cluster
        project = self.project or "<project>"
        key = state.cluster_dir(request.name) / "id_ed25519"
        labels = plan.cluster_labels(request.name, "you", datetime.now(UTC), request.ttl_hours)
        more = "".join(f", {k}={v}" for k, v in request.image_labels)
        image = request.source_image or plan.IMAGE_PLACEHOLDER.format(profile=request.image_profile, more=more)
        lines = [f"cluster {request.name}: key {key} (made if missing), then these Compute Engine calls in project "
                 f"{project}; any failure undoes them"]
        lines += [f"firewalls.insert {json.dumps(body)}" for body in plan.firewall_bodies(request, labels)]
        if plan.takes_compact_placement(request):
            lines.append(f"resourcePolicies.insert {json.dumps(plan.policy_body(request, labels))}")
        if request.volume_gb:
            lines.append(f"disks.insert {json.dumps(plan.disk_body(request, index=0, labels=labels))} (node 0; "
                         f"each node one, from the cluster's newest snapshot of it if any; mounted at {DATA_MOUNT})")
        body = plan.instance_body(request, index=0, suffix="xxxx", image=image,
                                  public_key=plan.PUBLIC_KEY_PLACEHOLDER.format(path=f"{key}.pub"), labels=labels,
                                  project=project,
                                  data_disk=plan.disk_name(request.name, 0) if request.volume_gb else None)
        lines.append(f"instances.insert {json.dumps(body)} (node 0 of {request.count})")
        wait = (f"and for SSH to answer on each (at most {ssh_wait:g}s)" if ssh_wait
                else "(not for SSH: --ssh-wait 0)")
        lines.append(f"then wait for the instances to run {wait}; pin the host keys they show")
        return lines

    def up(self, request: GcpRequest) -> Made:
        from bootstrap.providers.gcp import cloud

        made = cloud.up(request.cluster, project=self.project, ssh_wait_s=request.ssh_wait)
        return Made(made["name"], tuple(said(made)),
                    tuple(a for a, how in made["host_keys"].items() if how == "first-contact"), made["expires"])

    def down(self, name: str, *, snapshot_ttl_days: float | None = None) -> Gone:
        from bootstrap.providers.gcp import cloud

        if snapshot_ttl_days is None:
            removed = cloud.down(name, project=self.project)
            if not removed:
                return Gone((f"cluster {name}: nothing labelled {plan.LABEL_CLUSTER}={name} is left; nothing to do",))
            return Gone((f"cluster {name}: removed {len(removed)} resource(s):", *(f"  {line}" for line in removed)))
        done = cloud.down_with_snapshots(name, ttl_days=snapshot_ttl_days, project=self.project)
        lines = [f"cluster {name}: node {made.index}'s data disk kept as snapshot {made.id} ({made.size_gb} GB, "
                 f"expires {plan.format_expiry(made.labels)}); kiln up {name} --provider gcp --volume N restores it"
                 for made in done.snapshots]
        if not done.snapshots and not done.kept:
            lines.append(f"cluster {name}: no data disks to snapshot")
        lines.append(f"cluster {name}: removed {len(done.removed)} resource(s)")
        return Gone(tuple(lines), tuple(f"{disk} (node {node}): {why}" for disk, node, why in done.kept))

    def list(self) -> list[str]:
        from bootstrap.providers.gcp import cloud

        return listing(cloud.list_clusters(project=self.project), cloud.list_snapshots(project=self.project),
                       datetime.now(UTC),
                       lambda summary: f"{len(summary.instances)} instance(s), {summary.resources} resource(s)",
                       lambda snapshot: f"{snapshot.cluster} node {snapshot.index} {snapshot.id}: {snapshot.size_gb} "
                                        f"GB, {snapshot.state}, taken {snapshot.taken_at}, expires "
                                        f"{plan.format_expiry(snapshot.labels)}")

    def sweep(self, *, dry_run: bool = False) -> list[str]:
        from bootstrap.providers.gcp import cloud

        return swept(cloud.sweep(dry_run=dry_run, project=self.project),
                     cloud.sweep_snapshots(dry_run=dry_run, project=self.project), dry_run,
                     lambda summary: f"{summary.resources} resource(s)",
                     lambda snapshot: f"{snapshot.id} of {snapshot.cluster} node {snapshot.index}, taken "
                                      f"{snapshot.taken_at}, expired {plan.format_expiry(snapshot.labels)}")

    def places(self, every: bool = False) -> list[str | None]:
        from bootstrap.providers.gcp import cloud

        return [self.project or next((os.environ[name] for name in cloud.PROJECT_ENVS if os.environ.get(name)),
                                     None)]

    def replace(self, cluster: str, host: Host) -> Replacement:
        from bootstrap.providers.gcp import cloud

        new, keys = cloud.replace(cluster, host.address)
        return Replacement(host, new, tuple(keys))

    def arm_autostop(self, cluster: str) -> None:
        """Nothing to arm: a GCE VM that powers itself off stops (TERMINATED) and its GPUs and CPUs stop billing;
        `kiln list` shows it, `kiln down` removes it and its disks."""

    def spot_prices(self, instance_types: Sequence[str]) -> dict[str, float]:
        """None: Compute Engine's prices are in the Cloud Billing Catalog API, which kiln does not read."""
        return {}

def said(made: dict) -> list[str]:
    """What to tell the user of a cluster cloud.up made."""
    return provision.made_lines(made, where=f"{made['project']}/{made['zone']}", image=made["image"].rsplit("/", 1)[-1],
                                ids=made["instances"], volumes=made["data_disks"], volume_word="data disk",
                                machines="instances", keys_from="the instances' guest attributes and serial ports",
                                source="shown")


PROVIDER = GcpProvider

"""The AWS provider: bootstrap.providers.aws.plan decides every request (pure); bootstrap.providers.aws.cloud makes
the boto3 calls. Host keys come from each instance's console output; a spot instance learns it is being stopped
from IMDSv2's spot/instance-action, two minutes ahead; autostop's power-off terminates the instance (launched with
InstanceInitiatedShutdownBehavior=terminate; a stopped instance's disks would still bill)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from bootstrap import state
from bootstrap.errors import UsageError
from bootstrap.hosts import Host
from bootstrap.providers import Gone, Made, Notice, Replacement, provision
from bootstrap.providers.aws import efa as efa_plan
from bootstrap.providers.aws import plan
from bootstrap.providers.common import listing, swept

ANY_REGION = "us-east-1"  # where the list of regions is asked when none is configured


@dataclass(frozen=True)
class AwsRequest:
    cluster: plan.Request
    ssh_wait: float


class AwsProvider:
    kind = "aws"
    host_keys = "each instance's console output (GetConsoleOutput)"
    shutdown = "system"
    notice = Notice("ec2", "IMDSv2 latest/meta-data/spot/instance-action")
    up_options = frozenset({"instance_type", "spot", "max_price", "ami", "image_profile", "image_tags", "ssh_cidr",
                            "user", "ttl_hours", "ssh_wait", "volume", "region", "profile"})
    volumes = True
    where = ("region", "profile")
    scope = "region"
    prices = "EC2's spot price history (the newest price in each zone of the region, the lowest of them)"

    def __init__(self, region: str | None = None, profile: str | None = None):
        self.region, self.profile = region, profile

    def request(self, name: str, count: int, options: Mapping[str, Any], idle_minutes: float | None) -> AwsRequest:
        request = plan.validate_request(
            name, count, options.get("instance_type") or plan.DEFAULT_INSTANCE_TYPE, ssh_cidr=options.get("ssh_cidr"),
            ami=options.get("ami"), image_profile=options.get("image_profile") or "gpu",
            spot=bool(options.get("spot")), max_price=options.get("max_price"), user=options.get("user") or "ubuntu",
            ttl_hours=options.get("ttl_hours", 24.0), image_tags=options.get("image_tags"),
            volume_gib=options.get("volume"), idle_minutes=idle_minutes)
        ssh_wait = plan.validate_ssh_wait(options.get("ssh_wait", plan.SSH_WAIT_S))
        if idle_minutes and not ssh_wait:
            raise UsageError("--idle-minutes starts an agent on every node over SSH: it needs --ssh-wait above 0")
        return AwsRequest(request, ssh_wait)

    def plan(self, request: AwsRequest) -> list[str]:
        ssh_wait, request = request.ssh_wait, request.cluster
        key = state.cluster_dir(request.name) / "id_ed25519"
        tags = plan.cluster_tags(request.name, "<caller ARN>", datetime.now(UTC), request.ttl_hours)
        steps = plan.plan_cluster(request, tags=tags,
                                  ami=request.ami or plan.AMI_PLACEHOLDER.format(profile=request.image_profile),
                                  public_key=plan.PUBLIC_KEY_PLACEHOLDER.format(path=f"{key}.pub"),
                                  efa=efa_plan.expected_efa(request.instance_type))
        lines = [f"cluster {request.name}: key {key} (made if missing), then these EC2 calls; any failure undoes them"]
        if steps.efa:
            lines.append(efa_plan.efa_note(steps.efa))
        lines += [f"{action} {json.dumps(params)}" for action, params in steps.steps()]
        if request.volume_gib:
            example = plan.data_volume_request(zone="<instance's zone>", size_gib=request.volume_gib, tags=tags,
                                               index=0)
            lines.append(f"then per node: CreateVolume {json.dumps(example)} (from the cluster's newest snapshot of "
                         f"that node, if any), AttachVolume at {plan.DATA_DEVICE}; the image mounts it at "
                         f"{plan.DATA_MOUNT}")
        wait = (f"and for SSH to answer on each (at most {ssh_wait:g}s)" if ssh_wait
                else "(not for SSH: --ssh-wait 0)")
        lines.append(f"then wait for the instances to run {wait}; pin the host keys their consoles show")
        return lines

    def up(self, request: AwsRequest) -> Made:
        from bootstrap.providers.aws import cloud

        ssh_wait, request = request.ssh_wait, request.cluster
        made = cloud.up(request.name, request.count, request.instance_type, ami=request.ami,
                        image_profile=request.image_profile, spot=request.spot, max_price=request.max_price,
                        ssh_cidr=request.ssh_cidr, user=request.user, ttl_hours=request.ttl_hours,
                        image_tags=",".join(f"{k}={v}" for k, v in request.image_tags) or None,
                        volume_gib=request.volume_gib, idle_minutes=request.idle_minutes, region=self.region,
                        profile=self.profile, ssh_wait_s=ssh_wait)
        return Made(made["name"], tuple(said(made)),
                    tuple(a for a, how in made["host_keys"].items() if how == "first-contact"), made["expires"])

    def down(self, name: str, *, snapshot_ttl_days: float | None = None) -> Gone:
        from bootstrap.providers.aws import cloud

        if snapshot_ttl_days is None:
            removed = cloud.down(name, region=self.region, profile=self.profile)
            if not removed:
                return Gone((f"cluster {name}: nothing tagged kiln:cluster={name} is left; nothing to do",))
            return Gone((f"cluster {name}: removed {len(removed)} resource(s):", *(f"  {line}" for line in removed)))
        done = cloud.down_with_snapshots(name, ttl_days=snapshot_ttl_days, region=self.region, profile=self.profile)
        lines = [f"cluster {name}: node {made.index}'s data volume kept as {made.id} ({made.size_gib} GiB, "
                 f"expires {plan.format_time(made.expires)}); kiln up {name} --volume N restores it"
                 for made in done.snapshots]
        if not done.snapshots and not done.kept:
            lines.append(f"cluster {name}: no data volumes to snapshot")
        lines.append(f"cluster {name}: removed {len(done.removed)} resource(s)")
        kept = tuple(f"{volume} (node {node}): {why}" for volume, node, why in done.kept)
        return Gone(tuple(lines), kept)

    def list(self) -> list[str]:
        from bootstrap.providers.aws import cloud

        return listing(cloud.list_clusters(region=self.region, profile=self.profile),
                       cloud.list_snapshots(region=self.region, profile=self.profile), datetime.now(UTC),
                       lambda summary: f"{len(summary.instances)} instance(s), {summary.resources} resource(s)",
                       lambda snapshot: f"{snapshot.cluster} node {snapshot.index} {snapshot.id}: {snapshot.size_gib} "
                                        f"GiB, {snapshot.state}, taken {snapshot.taken_at}, expires "
                                        f"{plan.format_time(snapshot.expires) if snapshot.expires else 'never'}")

    def sweep(self, *, dry_run: bool = False) -> list[str]:
        from bootstrap.providers.aws import cloud

        return swept(cloud.sweep(dry_run=dry_run, region=self.region, profile=self.profile),
                     cloud.sweep_snapshots(dry_run=dry_run, region=self.region, profile=self.profile), dry_run,
                     lambda summary: f"{summary.resources} resource(s)",
                     lambda snapshot: f"{snapshot.id} of {snapshot.cluster} node {snapshot.index}, taken "
                                      f"{snapshot.taken_at}, expired {plan.format_time(snapshot.expires)}")

    def places(self, every: bool = False) -> list[str | None]:
        from bootstrap.providers.aws import cloud

        own = self.region or cloud.default_region(self.profile)
        if every:  # any region answers DescribeRegions
            return cloud.regions(region=own or ANY_REGION, profile=self.profile)
        return [own] if own else []

    def replace(self, cluster: str, host: Host) -> Replacement:
        from bootstrap.providers.aws import cloud

        new, keys = cloud.replace(cluster, host.address, region=self.region, profile=self.profile)
        return Replacement(host, new, tuple(keys))

    def arm_autostop(self, cluster: str) -> None:
        from bootstrap.providers.aws import cloud

        cloud.terminate_on_shutdown(cluster, region=self.region, profile=self.profile)

    def spot_prices(self, instance_types: Sequence[str]) -> dict[str, float]:
        from bootstrap.providers.aws import cloud

        return cloud.spot_prices(instance_types, region=self.region, profile=self.profile)


def said(made: dict) -> list[str]:
    """What to tell the user of a cluster cloud.up made."""
    return provision.made_lines(made, where=made["region"], image=made["ami"], ids=made["instances"],
                                volumes=made["data_volumes"], volume_word="data volume", machines="instances",
                                keys_from="the console output", source="console")


PROVIDER = AwsProvider

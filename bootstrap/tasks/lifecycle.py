"""Tasks that make and remove clusters: up, down, list, sweep, and launch (up, train, down in one go). AWS by
default (bootstrap.aws does the work); `--provider local` makes a cluster of network namespaces on this machine
(bootstrap.providers). They parse and print."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from bootstrap import autostop, providers, state
from bootstrap.aws import plan
from bootstrap.errors import UsageError
from bootstrap.tasks import cluster_task

AWS_HELP = {
    "name": "the cluster's name (1-32 of a-z, 0-9, '-'); tags every resource as kiln:cluster",
    "count": "how many instances (at least 1)",
    "instance_type": f"EC2 instance type (default {plan.DEFAULT_INSTANCE_TYPE}); GPU types: "
                     + "; ".join(f"{kind} ({gpus})" for kind, gpus in plan.SUGGESTED_INSTANCE_TYPES.items()),
    "spot": "ask for spot instances",
    "max_price": "with --spot: the most to pay, USD per instance-hour",
    "ami": "this AMI instead of the newest one tagged with --image-profile",
    "image_profile": "pick the newest available AMI tagged kiln:profile=PROFILE (default gpu)",
    "image_tags": "and carrying these tags too, e.g. kiln:fingerprint=ab12,kiln:tensorflow=2.21.0",
    "ssh_cidr": "the address range you SSH from, e.g. 203.0.113.7/32 (required; never 0.0.0.0/0)",
    "user": "the login user of the AMI (default ubuntu)",
    "region": "AWS region (default: boto3's chain, e.g. AWS_DEFAULT_REGION)",
    "profile": "AWS profile from your AWS config (default: boto3's chain)",
    "ttl_hours": "tag the resources to expire after this many hours (default 24); kiln sweep removes them",
    "ssh_wait": "wait up to SECONDS for SSH to answer on every instance, else roll back (default 300; 0: skip)",
    "dry_run": "print the plan and change nothing",
    "volume": "give each node an encrypted data volume of SIZE_GB GiB, mounted at /data, restored from the "
              "cluster's newest snapshots (down --snapshot) where there are some",
    "idle_minutes": "power each node off after N minutes without a kiln run (see kiln autostop; AWS: the instance "
                    "terminates, its data volume stays)",
    "provider": "aws (default), or local: nodes in network namespaces on this machine (root); "
                "train --managed replaces lost nodes through it",
    "docker": "local provider: give every node its own Docker engine and the cluster a registry (as a kiln "
              "image has Docker), for train --image",
}
SNAPSHOT_HELP = {
    "snapshot": "snapshot each node's data volume before removing it; the snapshots stay (kiln list shows them, "
                "up --volume restores them, sweep removes them once they expire)",
    "snapshot_ttl_days": "with --snapshot: tag the snapshots to expire after this many days (default 30)",
}


@cluster_task(help=AWS_HELP)
def up(c, name, count=1, instance_type=plan.DEFAULT_INSTANCE_TYPE, spot=False, max_price=None, ami=None,
       image_profile="gpu", ssh_cidr=None, user="ubuntu", region=None, profile=None, ttl_hours=24.0,
       ssh_wait=plan.SSH_WAIT_S, image_tags=None, dry_run=False, provider="aws", volume=None, idle_minutes=None,
       docker=False):
    """Start a cluster (AWS from a kiln AMI, or --provider local) and write its cluster file (then --cluster NAME)."""
    if provider not in providers.KINDS:
        raise UsageError(f"--provider {provider}: choose one of {', '.join(providers.KINDS)}")
    idle_minutes = autostop.validate_idle_minutes(idle_minutes) or None
    if idle_minutes and provider == "aws" and not float(ssh_wait):
        raise UsageError("--idle-minutes starts an agent on every node over SSH: it needs --ssh-wait above 0")
    if provider == "local":
        given = [flag for flag, value in (("--spot", spot), ("--max-price", max_price), ("--ami", ami),
                                          ("--ssh-cidr", ssh_cidr), ("--dry-run", dry_run), ("--volume", volume))
                 if value]
        if given:
            raise UsageError(f"{', '.join(given)}: AWS options; --provider local takes a name and --count")
        record = providers.LocalProvider(name).up(int(count), docker=docker)
        print(f"cluster {name}: {len(record.hosts)} local node(s) up: {', '.join(h.label for h in record.hosts)}; "
              f"next: kiln check --cluster {name}")
        arm_or_remove(c, name, idle_minutes)
        return
    if docker:
        raise UsageError("--docker belongs to --provider local (a kiln AMI has Docker already)")
    request = plan.validate_request(name, count, instance_type, ssh_cidr=ssh_cidr, ami=ami,
                                    image_profile=image_profile, spot=spot, max_price=max_price, user=user,
                                    ttl_hours=ttl_hours, image_tags=image_tags, volume_gib=volume,
                                    idle_minutes=idle_minutes)
    ssh_wait = plan.validate_ssh_wait(ssh_wait)
    if dry_run:
        key = state.cluster_dir(request.name) / "id_ed25519"
        tags = plan.cluster_tags(request.name, "<caller ARN>", datetime.now(UTC), request.ttl_hours)
        steps = plan.plan_cluster(request, tags=tags,
                                  ami=request.ami or plan.AMI_PLACEHOLDER.format(profile=request.image_profile),
                                  public_key=plan.PUBLIC_KEY_PLACEHOLDER.format(path=f"{key}.pub"))
        print(f"cluster {request.name}: key {key} (made if missing), then these EC2 calls; any failure undoes them")
        for action, params in steps.steps():
            print(f"{action} {json.dumps(params)}")
        if request.volume_gib:
            example = plan.data_volume_request(zone="<instance's zone>", size_gib=request.volume_gib, tags=tags,
                                               index=0)
            print(f"then per node: CreateVolume {json.dumps(example)} (from the cluster's newest snapshot of that "
                  f"node, if any), AttachVolume at {plan.DATA_DEVICE}; the image mounts it at {plan.DATA_MOUNT}")
        ssh = f"and for SSH to answer on each (at most {ssh_wait:g}s)" if ssh_wait else "(not for SSH: --ssh-wait 0)"
        print(f"then wait for the instances to run {ssh}; pin the host keys their consoles show")
        return
    from bootstrap.aws import cloud as aws

    made = aws.up(request.name, request.count, request.instance_type, ami=request.ami,
                  image_profile=request.image_profile, spot=request.spot, max_price=request.max_price,
                  ssh_cidr=request.ssh_cidr, user=request.user, ttl_hours=request.ttl_hours,
                  image_tags=",".join(f"{k}={v}" for k, v in request.image_tags) or None,
                  volume_gib=request.volume_gib, idle_minutes=request.idle_minutes, region=region,
                  profile=profile, ssh_wait_s=ssh_wait)
    if not made["ssh_wait"]:
        print("not waiting for SSH to answer (--ssh-wait 0): the instances may still be booting")
    print(f"cluster {made['name']} is running in {made['region']} from {made['ami']}, expires {made['expires']}:")
    volumes = made["data_volumes"] or [None] * len(made["hosts"])
    for host, instance, volume in zip(made["hosts"], made["instances"], volumes, strict=True):
        print(f"  {host} ({instance})" + (f", data volume {volume} at {plan.DATA_MOUNT}" if volume else ""))
    if made["restore_note"]:
        print(made["restore_note"])
    pinned = [a for a, how in made["host_keys"].items() if how == "console"]
    first_contact = [a for a, how in made["host_keys"].items() if how == "first-contact"]
    if pinned:
        print(f"host keys of {', '.join(pinned)} pinned from the console output")
    if first_contact:
        print(plan.first_contact_note(made["name"], first_contact))
    print(f"key {made['identity']}; next: kiln check --cluster {made['name']}")
    if idle_minutes and first_contact:
        print(f"autostop NOT started: kiln does not log in to hosts whose keys it has not seen; once you trust "
              f"them: kiln autostop --cluster {made['name']} --idle-minutes {idle_minutes:g} --accept-new-host-keys "
              f"(the cluster expires at {made['expires']} all the same: kiln sweep)")
        return
    arm_or_remove(c, made["name"], idle_minutes, region=region, profile=profile)


def arm_or_remove(c, name: str, idle_minutes: float | None, **where) -> None:
    """Start the idle agents of a cluster just made; if that fails, remove the cluster (nothing would stop it)."""
    if not idle_minutes:
        return
    from bootstrap.tasks.cluster import arm

    try:
        arm(c, name, idle_minutes)
    except BaseException:
        print(f"cluster {name}: the idle agents could not be started; removing the cluster", flush=True)
        down(c, name, **where)
        raise


LAUNCH_HELP = {
    **{k: AWS_HELP[k] for k in ("name", "provider", "count", "instance_type", "spot", "max_price", "ami", "ssh_cidr",
                                "user", "region", "profile", "ttl_hours", "ssh_wait", "volume")},
    "snapshot": SNAPSHOT_HELP["snapshot"],
    "mode": "horovod (default) or tf-config", "args": "arguments for kiln's reference trainer",
    "code": "the project folder to run from (default: the current folder)", "run_id": "name the run",
    "timeout": "stop the run if it has not ended after this many seconds (default 3600)",
    "managed": "replace a node that is lost or gets a spot notice (see train --managed)",
    "max_recoveries": "with --managed: replace lost nodes at most N times (default 3)",
    "accept_new_host_keys": "trust host keys the consoles did not show, on first contact (default: refuse)",
    "image": "run the training inside this container image on every node (see train --image)",
}


@cluster_task(help=LAUNCH_HELP)
def launch(c, name, provider="aws", count=1, instance_type=plan.DEFAULT_INSTANCE_TYPE, spot=False, max_price=None,
           ami=None, ssh_cidr=None, user="ubuntu", region=None, profile=None, ttl_hours=24.0, ssh_wait=plan.SSH_WAIT_S,
           mode="horovod", args="", code=None, run_id=None, timeout=3600, managed=False, max_recoveries=3,
           accept_new_host_keys=False, volume=None, snapshot=False, image=None):
    """One go: up, train (`-- CMD...` runs your program), collect the run folder, down. The cluster is removed
    whatever happens after it is up: the run ends, fails, or you press Ctrl-C."""
    from bootstrap.tasks.cluster import train

    if snapshot and provider == "local":
        raise UsageError("--snapshot: a local cluster's nodes have no data volumes")
    up(c, name, count=count, provider=provider, instance_type=instance_type, spot=spot, max_price=max_price, ami=ami,
       ssh_cidr=ssh_cidr, user=user, region=region, profile=profile, ttl_hours=ttl_hours, ssh_wait=ssh_wait,
       volume=volume)
    try:
        train(c, cluster=name, mode=mode, args=args, code=code, run_id=run_id, timeout=timeout, managed=managed,
              max_recoveries=max_recoveries, accept_new_host_keys=accept_new_host_keys, image=image)
    finally:
        print(f"launch: removing cluster {name}", flush=True)
        down(c, name, region=region, profile=profile, snapshot=snapshot)


@cluster_task(help={**{k: AWS_HELP[k] for k in ("name", "region", "profile")}, **SNAPSHOT_HELP})
def down(c, name, region=None, profile=None, snapshot=False, snapshot_ttl_days=plan.SNAPSHOT_TTL_DAYS):
    """Remove a cluster: on AWS terminate it and delete everything tagged with its name (safe to repeat)."""
    record = state.load_cluster(name) if plan.NAME.fullmatch(name or "") else None
    if record is not None and record.provider == "local":
        if snapshot:
            raise UsageError(f"--snapshot: cluster {name} is local; its nodes have no data volumes")
        providers.LocalProvider(name).down()
        print(f"cluster {name}: local nodes removed")
        return
    from bootstrap.aws import cloud as aws

    if snapshot:
        done = aws.down_with_snapshots(name, ttl_days=snapshot_ttl_days, region=region, profile=profile)
        for made in done.snapshots:
            print(f"cluster {name}: node {made.index}'s data volume kept as {made.id} ({made.size_gib} GiB, "
                  f"expires {plan.format_time(made.expires)}); kiln up {name} --volume N restores it")
        if not done.snapshots and not done.kept:
            print(f"cluster {name}: no data volumes to snapshot")
        print(f"cluster {name}: removed {len(done.removed)} resource(s)")
        if done.kept:
            raise aws.AwsError(f"cluster.down {name}: could not snapshot {len(done.kept)} data volume(s), kept "
                               f"(tagged kiln:cluster={name}; kiln down {name} --snapshot tries again): "
                               + "; ".join(f"{volume} (node {node}): {why}" for volume, node, why in done.kept))
        return
    removed = aws.down(name, region=region, profile=profile)
    if not removed:
        print(f"cluster {name}: nothing tagged kiln:cluster={name} is left; nothing to do")
        return
    print(f"cluster {name}: removed {len(removed)} resource(s):")
    for line in removed:
        print(f"  {line}")


@cluster_task(name="list", help={k: AWS_HELP[k] for k in ("region", "profile")})
def list_(c, region=None, profile=None):
    """List the AWS clusters kiln has tagged, with their expiry, and the snapshots of their data volumes."""
    from bootstrap.aws import cloud as aws

    summaries = aws.list_clusters(region=region, profile=profile)
    snapshots = aws.list_snapshots(region=region, profile=profile)
    if not summaries:
        print("no kiln clusters")
    now = datetime.now(UTC)
    for summary in summaries:
        expires = plan.format_time(summary.expires) if summary.expires else "never"
        flag = " (expired)" if summary.expired(now) else ""
        print(f"{summary.name}: {len(summary.instances)} instance(s), {summary.resources} resource(s), "
              f"expires {expires}{flag}, owner {summary.owner or '?'}")
        for instance in summary.instances:
            print(f"  {instance}")
    if snapshots:
        print("data snapshots:")
    for snapshot in snapshots:
        expires = plan.format_time(snapshot.expires) if snapshot.expires else "never"
        flag = " (expired)" if snapshot.expired(now) else ""
        print(f"  {snapshot.cluster} node {snapshot.index} {snapshot.id}: {snapshot.size_gib} GiB, {snapshot.state}, "
              f"taken {snapshot.taken_at}, expires {expires}{flag}")


@cluster_task(help={k: AWS_HELP[k] for k in ("region", "profile", "dry_run")})
def sweep(c, region=None, profile=None, dry_run=False):
    """Remove every kiln-tagged AWS cluster and data snapshot past its kiln:expires time."""
    from bootstrap.aws import cloud as aws

    expired = aws.sweep(dry_run=dry_run, region=region, profile=profile)
    snapshots = aws.sweep_snapshots(dry_run=dry_run, region=region, profile=profile)
    if not expired and not snapshots:
        print("nothing has expired")
    verb = "would remove" if dry_run else "removed"
    for summary in expired:
        print(f"{verb} {summary.name}: {summary.resources} resource(s), expired {plan.format_time(summary.expires)}")
    for snapshot in snapshots:
        print(f"{verb} snapshot {snapshot.id} of {snapshot.cluster} node {snapshot.index}, taken {snapshot.taken_at}, "
              f"expired {plan.format_time(snapshot.expires)}")

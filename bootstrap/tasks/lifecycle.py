"""Tasks that make and remove clusters: up, down, list, sweep, and launch (up, train, down in one go). AWS by
default (bootstrap.aws does the work); `--provider local` makes a cluster of network namespaces on this machine
(bootstrap.providers). They parse and print."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from bootstrap import providers, state
from bootstrap.aws import plan
from bootstrap.errors import UsageError
from bootstrap.tasks import cluster_task

AWS_HELP = {
    "name": "the cluster's name (1-32 of a-z, 0-9, '-'); tags every resource as kiln:cluster",
    "count": "how many instances (at least 1)",
    "instance_type": "EC2 instance type, e.g. p3.2xlarge",
    "spot": "ask for spot instances",
    "max_price": "with --spot: the most to pay, USD per instance-hour",
    "ami": "this AMI instead of the newest one tagged with --image-profile",
    "image_profile": "pick the newest available AMI tagged kiln:profile=PROFILE (default gpu)",
    "image_tags": "and carrying these tags too, e.g. kiln:fingerprint=ab12,kiln:tensorflow=2.18.1",
    "ssh_cidr": "the address range you SSH from, e.g. 203.0.113.7/32 (required; never 0.0.0.0/0)",
    "user": "the login user of the AMI (default ubuntu)",
    "region": "AWS region (default: boto3's chain, e.g. AWS_DEFAULT_REGION)",
    "profile": "AWS profile from your AWS config (default: boto3's chain)",
    "ttl_hours": "tag the resources to expire after this many hours (default 24); kiln sweep removes them",
    "ssh_wait": "wait up to SECONDS for SSH to answer on every instance, else roll back (default 300; 0: skip)",
    "dry_run": "print the plan and change nothing",
    "provider": "aws (default), or local: nodes in network namespaces on this machine (root); "
                "train --managed replaces lost nodes through it",
}


@cluster_task(help=AWS_HELP)
def up(c, name, count=1, instance_type="p3.2xlarge", spot=False, max_price=None, ami=None, image_profile="gpu",
       ssh_cidr=None, user="ubuntu", region=None, profile=None, ttl_hours=24.0, ssh_wait=plan.SSH_WAIT_S,
       image_tags=None, dry_run=False, provider="aws"):
    """Start a cluster (AWS from a kiln AMI, or --provider local) and write its cluster file (then --cluster NAME)."""
    if provider not in providers.KINDS:
        raise UsageError(f"--provider {provider}: choose one of {', '.join(providers.KINDS)}")
    if provider == "local":
        given = [flag for flag, value in (("--spot", spot), ("--max-price", max_price), ("--ami", ami),
                                          ("--ssh-cidr", ssh_cidr), ("--dry-run", dry_run)) if value]
        if given:
            raise UsageError(f"{', '.join(given)}: AWS options; --provider local takes a name and --count")
        record = providers.LocalProvider(name).up(int(count))
        print(f"cluster {name}: {len(record.hosts)} local node(s) up: {', '.join(h.label for h in record.hosts)}; "
              f"next: kiln check --cluster {name}")
        return
    request = plan.validate_request(name, count, instance_type, ssh_cidr=ssh_cidr, ami=ami,
                                    image_profile=image_profile, spot=spot, max_price=max_price, user=user,
                                    ttl_hours=ttl_hours, image_tags=image_tags)
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
        ssh = f"and for SSH to answer on each (at most {ssh_wait:g}s)" if ssh_wait else "(not for SSH: --ssh-wait 0)"
        print(f"then wait for the instances to run {ssh}; pin the host keys their consoles show")
        return
    from bootstrap.aws import cloud as aws

    made = aws.up(request.name, request.count, request.instance_type, ami=request.ami,
                  image_profile=request.image_profile, spot=request.spot, max_price=request.max_price,
                  ssh_cidr=request.ssh_cidr, user=request.user, ttl_hours=request.ttl_hours,
                  image_tags=",".join(f"{k}={v}" for k, v in request.image_tags) or None, region=region,
                  profile=profile, ssh_wait_s=ssh_wait)
    if not made["ssh_wait"]:
        print("not waiting for SSH to answer (--ssh-wait 0): the instances may still be booting")
    print(f"cluster {made['name']} is running in {made['region']} from {made['ami']}, expires {made['expires']}:")
    for host, instance in zip(made["hosts"], made["instances"], strict=True):
        print(f"  {host} ({instance})")
    pinned = [a for a, how in made["host_keys"].items() if how == "console"]
    first_contact = [a for a, how in made["host_keys"].items() if how == "first-contact"]
    if pinned:
        print(f"host keys of {', '.join(pinned)} pinned from the console output")
    if first_contact:
        print(plan.first_contact_note(made["name"], first_contact))
    print(f"key {made['identity']}; next: kiln check --cluster {made['name']}")


LAUNCH_HELP = {
    **{k: AWS_HELP[k] for k in ("name", "provider", "count", "instance_type", "spot", "max_price", "ami", "ssh_cidr",
                                "user", "region", "profile", "ttl_hours", "ssh_wait")},
    "mode": "horovod (default) or tf-config", "args": "arguments for kiln's reference trainer",
    "code": "the project folder to run from (default: the current folder)", "run_id": "name the run",
    "timeout": "stop the run if it has not ended after this many seconds (default 3600)",
    "managed": "replace a node that is lost or gets a spot notice (see train --managed)",
    "max_recoveries": "with --managed: replace lost nodes at most N times (default 3)",
    "accept_new_host_keys": "trust host keys the consoles did not show, on first contact (default: refuse)",
}


@cluster_task(help=LAUNCH_HELP)
def launch(c, name, provider="aws", count=1, instance_type="p3.2xlarge", spot=False, max_price=None, ami=None,
           ssh_cidr=None, user="ubuntu", region=None, profile=None, ttl_hours=24.0, ssh_wait=plan.SSH_WAIT_S,
           mode="horovod", args="", code=None, run_id=None, timeout=3600, managed=False, max_recoveries=3,
           accept_new_host_keys=False):
    """One go: up, train (`-- CMD...` runs your program), collect the run folder, down. The cluster is removed
    whatever happens after it is up: the run ends, fails, or you press Ctrl-C."""
    from bootstrap.tasks.cluster import train

    up(c, name, count=count, provider=provider, instance_type=instance_type, spot=spot, max_price=max_price, ami=ami,
       ssh_cidr=ssh_cidr, user=user, region=region, profile=profile, ttl_hours=ttl_hours, ssh_wait=ssh_wait)
    try:
        train(c, cluster=name, mode=mode, args=args, code=code, run_id=run_id, timeout=timeout, managed=managed,
              max_recoveries=max_recoveries, accept_new_host_keys=accept_new_host_keys)
    finally:
        print(f"launch: removing cluster {name}", flush=True)
        down(c, name, region=region, profile=profile)


@cluster_task(help={k: AWS_HELP[k] for k in ("name", "region", "profile")})
def down(c, name, region=None, profile=None):
    """Remove a cluster: on AWS terminate it and delete everything tagged with its name (safe to repeat)."""
    record = state.load_cluster(name) if plan.NAME.fullmatch(name or "") else None
    if record is not None and record.provider == "local":
        providers.LocalProvider(name).down()
        print(f"cluster {name}: local nodes removed")
        return
    from bootstrap.aws import cloud as aws

    removed = aws.down(name, region=region, profile=profile)
    if not removed:
        print(f"cluster {name}: nothing tagged kiln:cluster={name} is left; nothing to do")
        return
    print(f"cluster {name}: removed {len(removed)} resource(s):")
    for line in removed:
        print(f"  {line}")


@cluster_task(name="list", help={k: AWS_HELP[k] for k in ("region", "profile")})
def list_(c, region=None, profile=None):
    """List the AWS clusters kiln has tagged, with their expiry."""
    from bootstrap.aws import cloud as aws

    summaries = aws.list_clusters(region=region, profile=profile)
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


@cluster_task(help={k: AWS_HELP[k] for k in ("region", "profile", "dry_run")})
def sweep(c, region=None, profile=None, dry_run=False):
    """Remove every kiln-tagged AWS cluster past its kiln:expires time."""
    from bootstrap.aws import cloud as aws

    expired = aws.sweep(dry_run=dry_run, region=region, profile=profile)
    if not expired:
        print("nothing has expired")
    for summary in expired:
        verb = "would remove" if dry_run else "removed"
        print(f"{verb} {summary.name}: {summary.resources} resource(s), expired {plan.format_time(summary.expires)}")

"""Tasks that make and remove clusters: up, down, list, sweep, and launch (up, train, down in one go), through the
provider `--provider` names (bootstrap.providers: AWS by default, GCP; local makes a cluster of network namespaces on
this machine). They parse and print."""

from __future__ import annotations

from bootstrap import attached, providers, queue, state
from bootstrap.errors import KilnError, UsageError
from bootstrap.providers import catalog, common, failover, placement
from bootstrap.providers.aws import plan
from bootstrap.providers.azure import plan as azure_plan
from bootstrap.providers.gcp import plan as gcp_plan
from bootstrap.providers.placement import WHERE_OPTIONS
from bootstrap.session import arm
from bootstrap.tasks import cluster_task

UP_HELP = {
    "name": "the cluster's name (1-32 of a-z, 0-9, '-'); tags every resource as kiln:cluster",
    "count": "how many instances (at least 1)",
    "instance_type": f"the machine type: EC2 instance type (default {plan.DEFAULT_INSTANCE_TYPE}), GCP machine type "
                     f"(default {gcp_plan.DEFAULT_MACHINE_TYPE}) or Azure VM size (default "
                     f"{azure_plan.DEFAULT_VM_SIZE}); or ask for GPUs with --gpus",
    "gpus": "MODEL:COUNT, the GPUs each node carries, e.g. H100:8 or L4 (one): kiln picks the cloud's instance type "
            f"that carries them from its catalog (kiln gpus lists it; GPUs: {', '.join(catalog.gpu_names())})",
    "spot": "ask for spot instances (GCP: Spot VMs, deleted when preempted)",
    "max_price": "with --spot: the most to pay, USD per instance-hour",
    "ami": "this AMI instead of the newest one tagged with --image-profile",
    "image_profile": "pick the newest available AMI tagged kiln:profile=PROFILE (default gpu; GCP: the newest image "
                     "labelled kiln-profile=PROFILE)",
    "image_tags": "and carrying these tags too, e.g. kiln:fingerprint=ab12,kiln:tensorflow=2.21.0 (GCP: the labels "
                  "the bake wrote from them, kiln-fingerprint=ab12...)",
    "source_image": "GCP: this image instead of the newest kiln image of --image-profile (NAME, "
                    "projects/P/global/images/NAME or .../images/family/FAMILY)",
    "project": "GCP project (default: GOOGLE_CLOUD_PROJECT, CLOUDSDK_CORE_PROJECT or the credentials')",
    "zone": "GCP zone, e.g. us-central1-a (default: CLOUDSDK_COMPUTE_ZONE); a local zone (a label, with a capacity "
            "local-cluster exhaust --zone takes away)",
    "image_id": "Azure: this managed image or gallery image version (its resource id) instead of the newest kiln "
                "image of --image-profile",
    "subscription": "Azure subscription id (default: AZURE_SUBSCRIPTION_ID)",
    "location": "Azure region, e.g. eastus (default: AZURE_LOCATION)",
    "ssh_cidr": "the address range you SSH from, e.g. 203.0.113.7/32 (required; never 0.0.0.0/0)",
    "user": "the login user of the AMI (default ubuntu)",
    "region": "AWS region (default: boto3's chain, e.g. AWS_DEFAULT_REGION)",
    "profile": "AWS profile from your AWS config (default: boto3's chain)",
    "ttl_hours": "tag (GCP: label) the resources to expire after this many hours (default 24); kiln sweep removes "
                 "them",
    "ssh_wait": "wait up to SECONDS for SSH to answer on every instance, else roll back (default 300; 0: skip)",
    "dry_run": "print the plan and change nothing",
    "volume": "give each node an encrypted data volume of SIZE_GB GiB, mounted at /data, restored from the "
              "cluster's newest snapshots (down --snapshot) where there are some",
    "idle_minutes": "power each node off after N minutes without a kiln run (see kiln autostop; AWS: the instance "
                    "terminates, its data volume stays; GCP: the VM stops; Azure: the VM deallocates itself; their "
                    "disks stay until kiln down)",
    "provider": "aws (default), gcp, azure, or local: nodes in network namespaces on this machine (root); "
                "train --managed replaces lost nodes through it. With --gpus: several clouds to try in order "
                "(aws,gcp) or any",
    "zones": "GCP zones to try in order, e.g. us-central1-a,us-east5-b: a zone without capacity moves on to the next "
             "(local zones alike)",
    "regions": "AWS regions (Azure locations) to try in order, e.g. us-east-1,us-west-2 (aws:us-east-1,azure:eastus "
               "with both clouds)",
    "on_demand_fallback": "with --spot: where no candidate has spot capacity, try them all again on demand",
    "by_price": "try the candidates cheapest first, by the price each cloud gives: spot ones by their spot price "
                "now (AWS: EC2's spot price history; Azure: the Retail Prices API), then on-demand ones by the hour "
                "(AWS's Price List; Azure's pay-as-you-go meter); those without one follow in your order",
    "retry_until_up": "where no candidate has capacity, try them all again, waiting 10 s, then twice as long each "
                      "time (at most 5 minutes), for up to MINUTES (default 0: once)",
    "max_attempts": "how many candidates a round tries before it gives up (or, with --retry-until-up, waits for "
                    "the next round; a place that refuses before anything is made is not a try); default "
                    f"{failover.MAX_ATTEMPTS}",
    "docker": "local provider: give every node its own Docker engine and the cluster a registry (as a kiln "
              "image has Docker), for train --image",
}
SNAPSHOT_HELP = {
    "snapshot": "snapshot each node's data volume before removing it; the snapshots stay (kiln list shows them, "
                "up --volume restores them, sweep removes them once they expire)",
    "snapshot_ttl_days": "with --snapshot: tag the snapshots to expire after this many days (default 30)",
}


@cluster_task(help=UP_HELP)
def up(c, name, count=1, instance_type=None, spot=False, max_price=None, ami=None, image_profile="gpu",
       ssh_cidr=None, user=None, region=None, profile=None, ttl_hours=24.0, ssh_wait=common.SSH_WAIT_S,
       image_tags=None, dry_run=False, provider="aws", volume=None, idle_minutes=None, docker=False,
       source_image=None, project=None, zone=None, image_id=None, subscription=None, location=None, gpus=None,
       zones=None, regions=None, on_demand_fallback=False, retry_until_up=0.0, by_price=False,
       max_attempts=failover.MAX_ATTEMPTS):
    """Start a cluster (AWS, GCP or Azure from a kiln image, or --provider local) and write its cluster file (then
    --cluster NAME); with several candidates (clouds, places, instance types, spot then on-demand), the first
    that comes up whole."""
    attached.refuse_taken(name)
    values = locals()
    planned = placement.plan_up(name, values)
    if gpus:
        print(f"--gpus {gpus}: " + "; ".join(f"{cloud} {', '.join(planned.types[cloud]) or 'has none'}"
                                              for cloud in planned.clouds) + " (kiln gpus lists the catalog)",
              flush=True)
    if planned.where_from:
        print("\n".join(planned.where_from), flush=True)
    order, prices = placement.by_price(planned, say) if by_price else (planned.order, planned.prices)
    if dry_run:
        if len(order) > 1 or by_price:
            print("\n".join(failover.describe_order(order, prices, planned.max_attempts)))
            print(f"the plan of the first ({order[0].describe()}); the others alike:")
        chosen, request = planned.prepared[order[0]]
        print("\n".join(chosen.plan(request)))
        return
    if by_price or prices:
        print("\n".join(failover.describe_order(order, prices, planned.max_attempts)), flush=True)
    made, candidate = placement.bring_up(order, planned.prepared, placement.asked(values), say,
                                         float(retry_until_up) * 60)
    print("\n".join(made.lines))
    if planned.idle_minutes and made.unpinned:
        print(f"autostop NOT started: kiln does not log in to hosts whose keys it has not seen; once you trust "
              f"them: kiln autostop --cluster {made.name} --idle-minutes {planned.idle_minutes:g} "
              f"--accept-new-host-keys (the cluster expires{f' at {made.expires}' if made.expires else ''} all the "
              "same: kiln sweep)")
        return
    arm_or_remove(c, made.name, planned.idle_minutes, planned.prepared[candidate][0])


def say(line: str) -> None:
    print(line, flush=True)


def arm_or_remove(c, name: str, idle_minutes: float | None, chosen: providers.Provider) -> None:
    """Start the idle agents of a cluster just made; if that fails, remove the cluster (nothing would stop it)."""
    if not idle_minutes:
        return
    try:
        arm(c, name, idle_minutes)
    except BaseException:
        print(f"cluster {name}: the idle agents could not be started; removing the cluster", flush=True)
        print("\n".join(chosen.down(name).lines), flush=True)
        raise


DOWN_HELP = {**{k: UP_HELP[k] for k in ("name", *WHERE_OPTIONS)}, **SNAPSHOT_HELP,
             "provider": "where a cluster without a cluster file here was made (default aws)",
             "forget": "where nothing of the cluster is left where its cluster file says it is (you removed it "
                       "yourself), remove kiln's files of it, its key among them"}
for key in WHERE_OPTIONS:
    DOWN_HELP[key] += ("; a cluster with a cluster file here is looked for where the file says (a place given must "
                       "be that place)")


@cluster_task(help=DOWN_HELP)
def down(c, name, region=None, profile=None, snapshot=False, snapshot_ttl_days=common.SNAPSHOT_TTL_DAYS,
         provider="aws", project=None, zone=None, subscription=None, location=None, forget=False):
    """Remove a cluster: terminate (GCP: delete) its machines and delete everything tagged or labelled with its
    name (safe to repeat). A cluster kiln made from here is looked for where its cluster file says it is."""
    record = state.load_cluster(name) if common.NAME.fullmatch(name or "") else None
    if record is None and common.NAME.fullmatch(name or "") and attached.exists(name):
        print("\n".join(attached.detach(name)))  # a Slurm cluster kiln did not make: forgotten, left running
        return
    given = {"region": region, "profile": profile, "project": project, "zone": zone, "subscription": subscription,
             "location": location}
    placed = record is not None and record.provider
    chosen = providers.placed(record, given) if placed else providers.named(provider, given)
    if snapshot and not chosen.volumes:
        raise UsageError(f"--snapshot: cluster {name} is {chosen.kind}; its nodes have no data volumes")
    # a queue of this kiln home's, whatever its cluster file says (another home's queue of the name is not this one)
    if common.NAME.fullmatch(name or "") and queue.folder(name).exists() and queue.stop_controller(name):
        print(f"queue {name}: slurmctld and munged stopped")
    try:
        gone = chosen.down(name, snapshot_ttl_days=float(snapshot_ttl_days) if snapshot else None)
    except providers.Unfound as unfound:
        if not forget:
            raise
        state.forget_cluster(name)
        print(f"cluster {name}: nothing of it is in {unfound.looked}; kiln's files of it are removed (--forget)")
        return
    print("\n".join(gone.lines))
    if gone.kept:
        raise KilnError(f"cluster.down {name}: could not snapshot {len(gone.kept)} data volume(s), kept (kiln down "
                        f"{name} --snapshot tries again): " + "; ".join(gone.kept))


WHERE_HELP = {**{k: UP_HELP[k] for k in WHERE_OPTIONS}, "provider": "aws (default), gcp, azure or local",
              "all_regions": "look in every region of the account (AWS: those DescribeRegions gives), not only in "
                             "the regions of the clusters made from here and the one given or configured"}


@cluster_task(name="list", help={**WHERE_HELP, "verbose": "also say how each cluster made from here came up: "
                                                          "every candidate its up tried first, round by round, "
                                                          "what each met, and where it came up"})
def list_(c, region=None, profile=None, provider="aws", project=None, zone=None, subscription=None, location=None,
          all_regions=False, verbose=False):
    """List the clusters kiln has made (AWS: tagged, GCP: labelled, with their expiry, and the snapshots of their
    data volumes), in every region that holds a cluster made from here, and the one given or configured."""
    looked = providers.look_everywhere(provider, {"region": region, "profile": profile, "project": project,
                                                  "zone": zone, "subscription": subscription, "location": location},
                                       bool(all_regions), "list")
    if looked.lines or not looked.failed:
        print("\n".join(looked.lines) if looked.lines else f"no kiln clusters{in_places(looked)}")
    if verbose:
        print("\n".join(attempt_logs(provider)))
    fail_where_unread(looked)


@cluster_task(help={**WHERE_HELP, "dry_run": UP_HELP["dry_run"]})
def sweep(c, region=None, profile=None, dry_run=False, provider="aws", project=None, zone=None, subscription=None,
          location=None, all_regions=False):
    """Remove every kiln cluster and data snapshot past its expiry (AWS: its kiln:expires tag; GCP: its
    kiln-expires label), in every region that holds a cluster made from here, and the one given or configured."""
    looked = providers.look_everywhere(provider, {"region": region, "profile": profile, "project": project,
                                                  "zone": zone, "subscription": subscription, "location": location},
                                       bool(all_regions), "sweep", dry_run=bool(dry_run))
    if looked.lines or not looked.failed:
        print("\n".join(looked.lines) if looked.lines else f"nothing has expired{in_places(looked)}")
    fail_where_unread(looked)


def attempt_logs(provider: str) -> list[str]:
    """list -v: how each cluster of `provider` made from here came up (its capacity.json); one that cannot be read
    is said, and the others still shown."""
    logs = []
    for record in state.list_clusters(lenient=True):
        if record.provider != provider:
            continue
        try:
            capacity = state.load_capacity(record.name)
        except KilnError as error:
            logs.append(f"{record.name}: {error}")
            continue
        try:
            logs += failover.attempt_log(record.name, capacity) if capacity and "came_up" in capacity else []
        except (KeyError, TypeError, ValueError):
            logs.append(f"{record.name}: its capacity.json is not as kiln writes it")
    return ["how the clusters made from here came up:", *logs] if logs else [
        "no cluster made from here has a record of how it came up"]


def in_places(looked: providers.Looked) -> str:
    return f" in {', '.join(looked.places)}" if len(looked.places) > 1 else ""


def fail_where_unread(looked: providers.Looked) -> None:
    if looked.failed:
        raise KilnError(f"could not look in {len(looked.failed)} place(s): "
                        + "; ".join(f"{where}: {why}" for where, why in looked.failed))


@cluster_task(help={"provider": "only this cloud's: aws, gcp or azure (default: every cloud's)",
                    "refresh": "ask each cloud you have credentials for where it offers each type now (else: what "
                               "kiln kept of the last answer, read again after a day by an up that needs it)"})
def gpus(c, provider=None, refresh=False):
    """List the GPU machines of kiln's catalog, by cloud, and how many regions and zones offer each to you: what
    kiln up --gpus MODEL:COUNT picks from."""
    if provider and provider not in catalog.CLOUDS:
        raise UsageError(f"--provider {provider}: the catalog has {', '.join(catalog.CLOUDS)}")
    kept, unread = placement.known_offerings([provider] if provider else list(catalog.CLOUDS), refresh=refresh)
    print("".join(f"{cloud}: where it offers each type could not be read: {why}\n" for cloud, why in unread.items())
          + "\n".join(catalog.table(provider, kept)))
    if not kept:
        print("where each type is offered: not read yet (kiln gpus --refresh asks each cloud you have credentials "
              "for; an up --gpus with no place named asks the cloud it needs)")

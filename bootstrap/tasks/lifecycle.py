"""Tasks that make and remove clusters: up, down, list, sweep, and launch (up, train, down in one go), through the
provider `--provider` names (bootstrap.providers: AWS by default, GCP; local makes a cluster of network namespaces on
this machine). They parse and print."""

from __future__ import annotations

from bootstrap import autostop, providers, state
from bootstrap.errors import KilnError, UsageError
from bootstrap.providers import catalog, common, failover
from bootstrap.providers.aws import plan
from bootstrap.providers.azure import plan as azure_plan
from bootstrap.providers.gcp import plan as gcp_plan
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
    "by_price": "with --spot: try the candidates cheapest first, by the spot price each cloud gives now (AWS: "
                "EC2's spot price history); those without one follow in your order, then any on-demand fallback",
    "retry_until_up": "where no candidate has capacity, try them all again, waiting 10 s, then twice as long each "
                      "time (at most 5 minutes), for up to MINUTES (default 0: once)",
    "docker": "local provider: give every node its own Docker engine and the cluster a registry (as a kiln "
              "image has Docker), for train --image",
}
SNAPSHOT_HELP = {
    "snapshot": "snapshot each node's data volume before removing it; the snapshots stay (kiln list shows them, "
                "up --volume restores them, sweep removes them once they expire)",
    "snapshot_ttl_days": "with --snapshot: tag the snapshots to expire after this many days (default 30)",
}


PROVIDER_OPTIONS = ("instance_type", "spot", "max_price", "ami", "source_image", "image_id", "image_profile",
                    "image_tags", "ssh_cidr", "user", "ttl_hours", "ssh_wait", "volume", "region", "profile", "project",
                    "zone", "subscription", "location", "docker")
# The options that place a provider's clusters (each provider takes its own: Provider.where).
WHERE_OPTIONS = ("region", "profile", "project", "zone", "subscription", "location")
# The defaults of kiln up's provider options: one given at its default is not counted as given.
UP_DEFAULTS = {"image_profile": "gpu", "ttl_hours": 24.0, "ssh_wait": common.SSH_WAIT_S}


def given_options(values: dict) -> dict:
    """The provider options of a `kiln up` that were given (not left at their defaults)."""
    return {name: values[name] for name in PROVIDER_OPTIONS
            if values.get(name) not in (None, False) and values[name] != UP_DEFAULTS.get(name)}


@cluster_task(help=UP_HELP)
def up(c, name, count=1, instance_type=None, spot=False, max_price=None, ami=None, image_profile="gpu",
       ssh_cidr=None, user=None, region=None, profile=None, ttl_hours=24.0, ssh_wait=common.SSH_WAIT_S,
       image_tags=None, dry_run=False, provider="aws", volume=None, idle_minutes=None, docker=False,
       source_image=None, project=None, zone=None, image_id=None, subscription=None, location=None, gpus=None,
       zones=None, regions=None, on_demand_fallback=False, retry_until_up=0.0, by_price=False):
    """Start a cluster (AWS, GCP or Azure from a kiln image, or --provider local) and write its cluster file (then
    --cluster NAME); with several candidates (clouds, places, instance types, spot then on-demand), the first
    that comes up whole."""
    values = locals()
    clouds = failover.parse_clouds(provider, tuple(providers.KINDS))
    if on_demand_fallback and not spot:
        raise UsageError("--on-demand-fallback: falls back from --spot machines; give --spot too")
    if by_price and not spot:
        raise UsageError("--by-price: orders the candidates by their spot price; give --spot too")
    types = failover.types_of(clouds, gpus, instance_type)
    order = failover.candidates(clouds, failover.places_of(clouds, zones, regions, values), types, bool(spot),
                                on_demand_fallback)
    idle_minutes = autostop.validate_idle_minutes(idle_minutes) or None
    refuse_foreign(clouds, values)
    failover.refuse_across_places(order, {key: values[key] for key in ("volume", "ami", "image_id")})
    if len(order) > 1 and state.load_cluster(name) is not None:
        raise UsageError(f"cluster {name} exists here (kiln down {name} first): trying other places could make a "
                         "second one of that name")
    prepared = {candidate: prepare(name, count, candidate, values, idle_minutes, len(clouds) > 1)
                for candidate in order}  # every candidate's request checked before anything is made
    if gpus:
        print(f"--gpus {gpus}: " + "; ".join(f"{cloud} {', '.join(types[cloud]) or 'has none'}" for cloud in clouds)
              + " (kiln gpus lists the catalog)", flush=True)
    prices = read_prices(order, prepared) if by_price else {}
    if by_price:
        order = failover.by_price(order, prices)
        if not dry_run:
            print("\n".join(failover.describe_order(order, prices)), flush=True)
    if dry_run:
        if len(order) > 1 or by_price:
            print("\n".join(failover.describe_order(order, prices)))
            print(f"the plan of the first ({order[0].describe()}); the others alike:")
        chosen, request = prepared[order[0]]
        print("\n".join(chosen.plan(request)))
        return
    made, candidate = bring_up(order, prepared, asked(values), lambda line: print(line, flush=True),
                               float(retry_until_up) * 60)
    chosen = prepared[candidate][0]
    print("\n".join(made.lines))
    if idle_minutes and made.unpinned:
        print(f"autostop NOT started: kiln does not log in to hosts whose keys it has not seen; once you trust "
              f"them: kiln autostop --cluster {made.name} --idle-minutes {idle_minutes:g} --accept-new-host-keys "
              f"(the cluster expires{f' at {made.expires}' if made.expires else ''} all the same: kiln sweep)")
        return
    arm_or_remove(c, made.name, idle_minutes, chosen)


def read_prices(order: list[failover.Candidate], prepared: dict) -> dict[failover.Candidate, float]:
    """The spot price now of each spot candidate whose cloud gives one (up --by-price), read once per place; a
    place whose prices cannot be read is said, and its candidates keep their place after the priced ones."""
    prices: dict[failover.Candidate, float] = {}
    for (cloud, place), kinds in failover.price_requests(order).items():
        first = next(c for c in order if (c.cloud, c.place, c.spot) == (cloud, place, True))
        chosen = prepared[first][0]
        where = f"{cloud} {place or '(its default place)'}"
        if not chosen.prices:
            print(f"up: {where}: kiln reads no spot prices of {cloud}; its candidates follow the priced ones",
                  flush=True)
            continue
        try:
            found = chosen.spot_prices(kinds)
        except KilnError as error:
            print(f"up: {where}: {error}; its candidates follow the priced ones", flush=True)
            continue
        prices.update({c: found[c.instance_type] for c in order
                       if (c.cloud, c.place, c.spot) == (cloud, place, True) and c.instance_type in found})
    return prices


def refuse_foreign(clouds: list[str], values: dict) -> None:
    """With several clouds, an option none of them takes (--subscription with aws,gcp) is refused by flag; one
    that only some take goes to those (prepare). One provider refuses its foreign options itself."""
    if len(clouds) < 2:
        return
    chosen = [providers.provider_class(cloud) for cloud in clouds]
    taken = {key for kind in chosen for key in (*kind.where, *kind.up_options)}
    foreign = sorted(key for key in given_options(values) if key not in taken and key not in
                     providers.COMMON_UP_OPTIONS and key != "instance_type")
    if foreign:
        raise UsageError(f"{', '.join('--' + key.replace('_', '-') for key in foreign)}: an option of none of "
                         f"--provider {','.join(clouds)}")


def asked(values: dict) -> dict:
    """What an `up` was asked, as capacity.json keeps it (every option but the context and --dry-run)."""
    return {key: value for key, value in values.items() if key not in ("c", "dry_run")}


def up_again(name: str, capacity: dict, say) -> failover.Candidate:
    """Bring cluster `name` (taken down already) up again as its `kiln up` was asked (`capacity`: its capacity.json,
    read before the down), at its candidates of other places (failover.moved_order): where a managed run moves when
    its place has no capacity left. The candidate it came up at."""
    values = capacity.get("asked")
    if not values:
        raise KilnError(f"cluster {name}: what its kiln up asked is not on record (made by an older kiln): it cannot "
                        "be brought up elsewhere")
    candidates = failover.candidates_of(capacity)[0]
    order = failover.moved_order(*failover.candidates_of(capacity))
    clouds = list(dict.fromkeys(candidate.cloud for candidate in order))
    idle_minutes = autostop.validate_idle_minutes(values.get("idle_minutes")) or None
    prepared = {candidate: prepare(name, values["count"], candidate, values, idle_minutes, len(clouds) > 1)
                for candidate in order}
    made, candidate = bring_up(order, prepared, values, say, 0.0, candidates)
    say("\n".join(made.lines))
    return candidate


def bring_up(order: list[failover.Candidate], prepared: dict, values: dict, say, deadline_s: float,
             candidates: list[failover.Candidate] | None = None) -> tuple[providers.Made, failover.Candidate]:
    """The first candidate that comes up (failover.until_up), and where: capacity.json records it, with what the
    up was asked (`values`) and every candidate it named (`candidates`, default `order`: a move tries fewer, but
    the place it left stays one to move back to)."""
    made, candidate, tried = failover.until_up(order, lambda one: prepared[one][0].up(prepared[one][1]), say,
                                               deadline_s)
    state.save_capacity(made.name, failover.capacity_record(candidates or order, candidate, tried, values))
    return made, candidate


def prepare(name: str, count: int, candidate: failover.Candidate, values: dict, idle_minutes: float | None,
            several_clouds: bool) -> tuple[providers.Provider, object]:
    """The provider placed where `candidate` is, and its checked request for that candidate (nothing is made)."""
    where = {key: values[key] for key in WHERE_OPTIONS}
    if candidate.cloud in failover.PLACE:
        where[failover.PLACE[candidate.cloud]] = candidate.place or None
    options = {**{key: values[key] for key in PROVIDER_OPTIONS}, "instance_type": candidate.instance_type or None,
               "spot": candidate.spot,
               # an on-demand fallback try carries no spot price; without --spot the provider refuses --max-price
               "max_price": None if values["spot"] and not candidate.spot else values["max_price"]}
    if several_clouds:  # each cloud gets the options it takes (refuse_foreign refused those none takes)
        kind = providers.provider_class(candidate.cloud)
        where = {key: value for key, value in where.items() if key in kind.where}
        options = {key: value for key, value in options.items()
                   if key in kind.where or key in kind.up_options or key not in (*WHERE_OPTIONS, *kind_options())}
    chosen = providers.named(candidate.cloud, where)
    providers.refuse_foreign_options(chosen, given_options(options))
    return chosen, chosen.request(name, count, options, idle_minutes)


def kind_options() -> set[str]:
    """Every option some provider takes for itself (up_options), besides the common ones."""
    return {key for kind in providers.KINDS for key in providers.provider_class(kind).up_options}


def arm_or_remove(c, name: str, idle_minutes: float | None, chosen: providers.Provider) -> None:
    """Start the idle agents of a cluster just made; if that fails, remove the cluster (nothing would stop it)."""
    if not idle_minutes:
        return
    from bootstrap.tasks.cluster import arm

    try:
        arm(c, name, idle_minutes)
    except BaseException:
        print(f"cluster {name}: the idle agents could not be started; removing the cluster", flush=True)
        print("\n".join(chosen.down(name).lines), flush=True)
        raise


LAUNCH_HELP = {
    **{k: UP_HELP[k] for k in ("name", "provider", "count", "instance_type", "gpus", "spot", "max_price", "ami",
                                "ssh_cidr", "user", "region", "profile", "project", "zone", "subscription", "location",
                                "source_image", "image_id", "ttl_hours", "ssh_wait", "volume")},
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
def launch(c, name, provider="aws", count=1, instance_type=None, spot=False, max_price=None,
           ami=None, ssh_cidr=None, user=None, region=None, profile=None, ttl_hours=24.0, ssh_wait=common.SSH_WAIT_S,
           mode="horovod", args="", code=None, run_id=None, timeout=3600, managed=False, max_recoveries=3,
           accept_new_host_keys=False, volume=None, snapshot=False, image=None, project=None, zone=None,
           source_image=None, subscription=None, location=None, image_id=None, gpus=None):
    """One go: up, train (`-- CMD...` runs your program), collect the run folder, down. The cluster is removed
    whatever happens after it is up: the run ends, fails, or you press Ctrl-C."""
    from bootstrap.tasks.cluster import train

    where = {"region": region, "profile": profile, "project": project, "zone": zone, "subscription": subscription,
             "location": location}
    if snapshot and not providers.named(provider, where).volumes:
        raise UsageError(f"--snapshot: a {provider} cluster's nodes have no data volumes")
    up(c, name, count=count, provider=provider, instance_type=instance_type, spot=spot, max_price=max_price, ami=ami,
       ssh_cidr=ssh_cidr, user=user, ttl_hours=ttl_hours, ssh_wait=ssh_wait, volume=volume,
       source_image=source_image, image_id=image_id, gpus=gpus, **where)
    try:
        train(c, cluster=name, mode=mode, args=args, code=code, run_id=run_id, timeout=timeout, managed=managed,
              max_recoveries=max_recoveries, accept_new_host_keys=accept_new_host_keys, image=image)
    finally:
        print(f"launch: removing cluster {name}", flush=True)
        down(c, name, snapshot=snapshot, **where)


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
    given = {"region": region, "profile": profile, "project": project, "zone": zone, "subscription": subscription,
             "location": location}
    placed = record is not None and record.provider
    chosen = providers.placed(record, given) if placed else providers.named(provider, given)
    if snapshot and not chosen.volumes:
        raise UsageError(f"--snapshot: cluster {name} is {chosen.kind}; its nodes have no data volumes")
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


@cluster_task(name="list", help=WHERE_HELP)
def list_(c, region=None, profile=None, provider="aws", project=None, zone=None, subscription=None, location=None,
          all_regions=False):
    """List the clusters kiln has made (AWS: tagged, GCP: labelled, with their expiry, and the snapshots of their
    data volumes), in every region that holds a cluster made from here, and the one given or configured."""
    looked = providers.look_everywhere(provider, {"region": region, "profile": profile, "project": project,
                                                  "zone": zone, "subscription": subscription, "location": location},
                                       bool(all_regions), "list")
    if looked.lines or not looked.failed:
        print("\n".join(looked.lines) if looked.lines else f"no kiln clusters{in_places(looked)}")
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


def in_places(looked: providers.Looked) -> str:
    return f" in {', '.join(looked.places)}" if len(looked.places) > 1 else ""


def fail_where_unread(looked: providers.Looked) -> None:
    if looked.failed:
        raise KilnError(f"could not look in {len(looked.failed)} place(s): "
                        + "; ".join(f"{where}: {why}" for where, why in looked.failed))


@cluster_task(help={"provider": "only this cloud's: aws, gcp or azure (default: every cloud's)"})
def gpus(c, provider=None):
    """List the GPU machines of kiln's catalog, by cloud: what kiln up --gpus MODEL:COUNT picks from."""
    if provider and provider not in catalog.CLOUDS:
        raise UsageError(f"--provider {provider}: the catalog has {', '.join(catalog.CLOUDS)}")
    print("\n".join(catalog.table(provider)))

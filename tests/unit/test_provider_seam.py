"""The provider seam: every provider implements the same verbs, the tasks never ask which provider they have, and
`kiln up` refuses options the chosen provider does not take."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from bootstrap import providers, state
from bootstrap.errors import UsageError
from bootstrap.shim import interruption

TASKS = Path(providers.__file__).resolve().parents[1] / "tasks"
VERBS = ("request", "plan", "up", "down", "list", "sweep", "places", "replace", "arm_autostop", "spot_prices")
FACTS = ("kind", "host_keys", "shutdown", "notice", "up_options", "volumes", "where", "prices")


@pytest.fixture(params=sorted(providers.KINDS))
def provider(request):
    return providers.named(request.param)


def test_the_seam_lists_these_verbs_and_facts():
    members = {name for name, _ in inspect.getmembers(providers.Provider) if not name.startswith("_")}
    assert members | set(providers.Provider.__annotations__) >= set(VERBS) | set(FACTS)
    assert set(VERBS) <= members


def test_every_provider_implements_every_verb_with_the_seams_parameters(provider):
    for verb in VERBS:
        wanted = list(inspect.signature(getattr(providers.Provider, verb)).parameters)[1:]
        have = list(inspect.signature(getattr(provider, verb)).parameters)
        assert have[:len(wanted)] == wanted, f"{provider.kind}.{verb}{tuple(have)}: the seam has {tuple(wanted)}"
    for fact in FACTS:
        assert getattr(provider, fact) is not None, f"{provider.kind} does not say its {fact}"
    assert provider.scope is None or provider.scope in provider.where
    assert provider.kind in providers.KINDS
    assert provider.notice.source in (*interruption.SOURCES, "any") and provider.notice.grace_s < provider.notice.lead_s


def test_no_task_asks_which_provider_it_has():
    """No comparison in bootstrap/tasks/ has a provider's name on either side."""
    found = []
    for path in sorted(TASKS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                names = [side.value for side in sides if isinstance(side, ast.Constant)]
                names += [e.value for side in sides if isinstance(side, ast.Tuple | ast.List | ast.Set)
                          for e in side.elts if isinstance(e, ast.Constant)]
                if any(name in providers.KINDS for name in names):
                    found.append(f"{path.name}:{node.lineno}")
    assert not found, f"tasks compare a provider's name: {found}"


def test_an_unknown_provider_is_refused_naming_the_known_ones():
    with pytest.raises(UsageError, match="--provider gce: choose one of aws, azure, gcp, local"):
        providers.named("gce")


def test_options_of_another_provider_are_refused_by_flag():
    local = providers.named("local")
    with pytest.raises(UsageError) as error:
        providers.refuse_foreign_options(local, {"spot": True, "ssh_cidr": "10.0.0.0/8", "count": 2})
    assert str(error.value) == ("--spot, --ssh-cidr: not options of --provider local (it takes a name, --count, "
                                "--idle-minutes and --docker)")
    providers.refuse_foreign_options(local, {"docker": True, "count": 2})
    with pytest.raises(UsageError, match="--docker: not options of --provider aws"):
        providers.refuse_foreign_options(providers.named("aws"), {"docker": True})


def test_a_local_cluster_takes_no_region_but_a_local_zone():
    with pytest.raises(UsageError, match=r"--region: not options of --provider local \(it is placed by --zone\)"):
        providers.named("local", {"region": "eu-west-1"})
    assert providers.named("local", {"zone": "a"}).zone == "a"
    with pytest.raises(UsageError, match="--zone 'A B': lowercase letters, digits and '-'"):
        providers.named("local", {"zone": "A B"}).request("kz", 2, {}, None)


@pytest.mark.parametrize(("count", "said"), [("two", "--count 'two' is not a whole number"),
                                             (0, "--count 0: a cluster needs at least 1 node")])
def test_a_local_request_is_checked_before_anything_is_made(count, said):
    with pytest.raises(UsageError, match=said):
        providers.named("local").request("lc", count, {}, None)


def test_the_dry_run_of_each_provider_says_what_up_would_make():
    local = providers.named("local")
    assert local.plan(local.request("lc", 2, {"docker": True}, None)) == [
        "cluster lc: 2 node(s) in network namespaces on this machine, each with its own Docker engine, and a "
        "registry; their host keys pinned from the files the local cloud writes"]
    aws = providers.named("aws")
    lines = aws.plan(aws.request("ac", 2, {"ssh_cidr": "203.0.113.7/32", "ttl_hours": 24.0, "ssh_wait": 300},
                                 None))
    assert lines[0].startswith("cluster ac: key ") and lines[-1].startswith("then wait for the instances to run")
    assert any(line.startswith("RunInstances ") for line in lines)
    with pytest.raises(UsageError, match="--ssh-wait above 0"):
        aws.request("ac", 1, {"ssh_cidr": "203.0.113.7/32", "ssh_wait": 0}, 30.0)


def test_a_cluster_file_names_its_provider(tmp_path, monkeypatch):
    from bootstrap import state
    from bootstrap.hosts import Host

    monkeypatch.setenv("KILN_HOME", str(tmp_path))
    with pytest.raises(UsageError, match="need a cluster that kiln started"):
        providers.for_cluster(None, "x")
    record = state.ClusterRecord("x", (Host("n1"),), "python3", state.SshSettings(), provider="aws",
                                 region="eu-west-1", place=(("region", "eu-west-1"),))
    found = providers.for_cluster(record, "x")
    assert (found.kind, found.region) == ("aws", "eu-west-1")
    with pytest.raises(UsageError, match="does not know the provider 'gce'"):
        providers.for_cluster(state.ClusterRecord("x", (Host("n1"),), "python3", state.SshSettings(),
                                                  provider="gce"), "x")


def test_a_clusters_watchers_read_its_providers_notices_and_keep_its_grace():
    def record(provider):
        return state.ClusterRecord("c", (), "/usr/bin/python3", provider=provider)

    assert [providers.notice_source(r) for r in (None, record(None), record("aws"), record("local"))] == [
        "any", "any", "ec2", "any"]
    # the grace comes from the watcher's table; a watcher of any source keeps the shortest (GCE's)
    assert (providers.Notice("ec2", "").grace_s, providers.Notice("any", "").grace_s) == (
        interruption.SOURCES["ec2"][1], interruption.SOURCES["gce"][1])


def test_a_cluster_is_looked_for_where_its_file_says_whatever_the_defaults_say(monkeypatch):
    """The record's place wins over the environment's default region; the command line adds only what the record
    does not hold, and a place that contradicts the record is refused by flag."""
    from bootstrap.hosts import Host

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    record = state.ClusterRecord("trw", (Host("n1"),), "python3", provider="aws", region="us-west-2",
                                 place=(("region", "us-west-2"),))
    found = providers.placed(record, {"region": None, "profile": "team", "project": None})
    assert (found.region, found.profile) == ("us-west-2", "team")
    assert providers.placed(record, {"region": "us-west-2"}).region == "us-west-2"
    with pytest.raises(UsageError) as error:
        providers.placed(record, {"region": "us-east-1"})
    assert str(error.value) == ("--region us-east-1: cluster trw is in region us-west-2 (its cluster file says so); "
                                "leave --region out")
    gcp = state.ClusterRecord("g", (), "python3", provider="gcp", place=(("project", "p-1"), ("zone", "z-a")))
    assert (providers.placed(gcp, {}).project, providers.placed(gcp, {}).zone) == ("p-1", "z-a")


def test_list_looks_in_every_recorded_place_then_its_own_each_once():
    assert providers.search_places(["us-west-2", "eu-west-1", "us-west-2"], ["us-east-1"]) == [
        "us-west-2", "eu-west-1", "us-east-1"]
    assert providers.search_places(["us-west-2"], ["us-west-2"]) == ["us-west-2"]
    assert providers.search_places([], []) == [None]  # the provider's own default, as its connect finds it
    assert providers.search_places(["p-1"], [None]) == ["p-1"]
    assert providers.search_places([], [None]) == [None]


def test_the_recorded_places_are_those_of_this_providers_clusters():
    def record(name, provider, **place):
        return state.ClusterRecord(name, (), "python3", provider=provider, place=tuple(place.items()))

    records = [record("a", "aws", region="us-west-2"), record("b", "gcp", project="p-1", zone="z"),
               record("c", "aws", region="eu-west-1"), record("d", None), record("e", "local")]
    assert providers.recorded_places("aws", records) == ["us-west-2", "eu-west-1"]
    assert providers.recorded_places("gcp", records) == ["p-1"]
    assert providers.recorded_places("local", records) == []

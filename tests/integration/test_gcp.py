"""kiln up/down/list/sweep/replace on GCP against the Compute Engine stand-in (testbed.gce) over real HTTP, through
Google's own client pointed at it by its `api_endpoint` option (KILN_GCE_ENDPOINT). Every check of what is left
lists each resource kind by the cluster's label (or, for what takes no labels, its description) with the client
library directly, not with kiln's own code."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from conftest import KILN

pytestmark = [pytest.mark.integration, pytest.mark.quick]

compute_v1 = pytest.importorskip("google.cloud.compute_v1")

from google.auth.credentials import AnonymousCredentials  # noqa: E402

from bootstrap import state  # noqa: E402
from bootstrap.errors import UsageError  # noqa: E402
from bootstrap.providers import failover  # noqa: E402
from bootstrap.providers.gcp import cloud, plan  # noqa: E402
from testbed.gce import Gce  # noqa: E402

PROJECT, ZONE = "kiln-test", "us-central1-a"
OTHER_REGION_ZONE = "us-east1-b"
CIDR = "203.0.113.7/32"


@pytest.fixture(scope="module")
def gce():
    with Gce(project=PROJECT, zones=(ZONE, "us-central1-b", OTHER_REGION_ZONE)) as served:
        served.add_image("kiln-cpu-1", family="kiln-cpu", labels={"kiln-profile": "cpu"})
        served.add_image("kiln-gpu-1", family="kiln-gpu", labels={"kiln-profile": "gpu", "kiln-fingerprint": "aa11"})
        served.add_image("kiln-gpu-2", family="kiln-gpu", labels={"kiln-profile": "gpu", "kiln-fingerprint": "bb22"})
        yield served


@pytest.fixture
def env(gce, monkeypatch, tmp_path):
    monkeypatch.setenv(cloud.ENDPOINT_ENV, gce.endpoint)
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", PROJECT)
    monkeypatch.setenv("KILN_HOME", str(tmp_path / "kiln"))
    yield tmp_path
    connected = cloud.connect()
    for summary in cloud.list_clusters(gce=connected):  # a failed test must not leak into the next one
        cloud.down(summary.name, gce=connected)
    for snapshot in cloud.list_snapshots(gce=connected):
        connected.snapshots.delete_unary(project=PROJECT, snapshot=snapshot.id)


def client(gce, kind):
    return getattr(compute_v1, kind)(credentials=AnonymousCredentials(),
                                     client_options={"api_endpoint": gce.endpoint})


def leftovers(gce, name: str | None = None, snapshots: bool = True) -> list[str]:
    """Every resource of every kind kiln makes that carries the cluster's label (or its name in the description,
    for firewall rules and resource policies), straight from the API."""
    query = f'labels.kiln-cluster = "{name}"' if name else "labels.kiln-cluster:*"
    mark = f'"kiln-cluster": "{name}"' if name else '"kiln-cluster"'
    found = []
    scoped = {"project": PROJECT, "filter": query}
    for _, listed in client(gce, "InstancesClient").aggregated_list(request=scoped):
        found += [f"instance {i.name}" for i in listed.instances]
    for _, listed in client(gce, "DisksClient").aggregated_list(request=scoped):
        found += [f"disk {d.name}" for d in listed.disks]
    found += [f"firewall {f.name}" for f in client(gce, "FirewallsClient").list(project=PROJECT)
              if mark in f.description]
    for _, listed in client(gce, "ResourcePoliciesClient").aggregated_list(project=PROJECT):
        found += [f"resource-policy {p.name}" for p in listed.resource_policies if mark in p.description]
    if snapshots:
        found += [f"snapshot {s.name}" for s in client(gce, "SnapshotsClient").list(
            request={"project": PROJECT, "filter": query})]
    return sorted(found)


def instances_of(gce, name: str) -> list:
    return sorted((i for _, listed in client(gce, "InstancesClient").aggregated_list(
        request={"project": PROJECT, "filter": f'labels.kiln-cluster = "{name}"'}) for i in listed.instances),
        key=lambda i: i.labels["kiln-node"])


def request(name: str, count: int = 2, **changes) -> plan.Request:
    return plan.validate_request(name, count, changes.pop("machine_type", None), zone=changes.pop("zone", ZONE),
                                 ssh_cidr=changes.pop("ssh_cidr", CIDR), **changes)


def pinned(env: Path, name: str) -> list[str]:
    return sorted((env / "kiln" / "clusters" / name / "known_hosts").read_text().splitlines())


def test_up_then_down_leaves_nothing(env, gce):
    made = cloud.up(request("alpha", spot=True, ttl_hours=2, idle_minutes=30), ssh_wait_s=0)
    assert made.image.endswith("/global/images/kiln-gpu-2")  # the newest of the profile
    saved = state.load_cluster("alpha")
    assert saved.provider == "gcp" and saved.region == ZONE and saved.node_type == "g2-standard-4"
    assert saved.ssh.identity == str(env / "kiln" / "clusters" / "alpha" / "id_ed25519")
    assert oct((env / "kiln" / "clusters" / "alpha" / "id_ed25519").stat().st_mode & 0o777) == "0o600"
    instances = instances_of(gce, "alpha")
    assert [h.address for h in saved.hosts] == [i.network_interfaces[0].access_configs[0].nat_i_p
                                                 for i in instances]
    for instance in instances:
        assert instance.status == "RUNNING" and instance.machine_type.endswith("/machineTypes/g2-standard-4")
        assert instance.scheduling.provisioning_model == "SPOT"
        assert instance.scheduling.instance_termination_action == "DELETE"
        assert instance.shielded_instance_config.enable_vtpm and not instance.service_accounts
        assert list(instance.tags.items) == ["kiln-alpha"]
        metadata = {item.key: item.value for item in instance.metadata.items}
        assert metadata["ssh-keys"].startswith("ubuntu:ssh-ed25519 ") and metadata["block-project-ssh-keys"] == "TRUE"
        assert [p.rsplit("/", 1)[-1] for p in instance.resource_policies] == ["kiln-alpha-compact"]
        expires = plan.expiry(instance.labels)
        assert timedelta(hours=1.9) < expires - datetime.now(UTC) <= timedelta(hours=2)
    # the host keys pinned are the ones each instance has, as GCE shows them
    wanted = sorted(f"{h.address} {key}" for h, i in zip(saved.hosts, instances, strict=True)
                    for key in gce.host_keys(ZONE, i.name))
    assert pinned(env, "alpha") == wanted and made.host_keys == {h.address: "shown" for h in saved.hosts}
    rules = {f.name: f for f in client(gce, "FirewallsClient").list(project=PROJECT)}
    ssh, internal = rules["kiln-alpha-ssh"], rules["kiln-alpha-internal"]
    assert list(ssh.source_ranges) == [CIDR] and list(ssh.target_tags) == ["kiln-alpha"]
    assert list(internal.source_tags) == list(internal.target_tags) == ["kiln-alpha"]
    assert not internal.source_ranges
    assert [s.name for s in cloud.list_clusters()] == ["alpha"]

    removed = cloud.down("alpha")
    assert {r.split()[0] for r in removed} >= {"instance", "firewall", "resource-policy"}
    assert leftovers(gce) == []
    assert state.load_cluster("alpha") is None
    assert cloud.down("alpha") == []


def test_down_finds_the_cluster_by_labels_without_its_files(env, gce):
    cloud.up(request("lost", 1), ssh_wait_s=0)
    for name in ("cluster.json", "gcp.json"):
        (env / "kiln" / "clusters" / "lost" / name).unlink()
    assert cloud.down("lost")
    assert leftovers(gce) == []


@pytest.mark.parametrize(("method", "on", "code", "reason", "step"), [
    ("firewalls.insert", "call", 403, "forbidden", "create the firewall rules"),
    ("resourcePolicies.insert", "operation", 403, "QUOTA_EXCEEDED", "create the compact placement policy"),
    ("disks.insert", "operation", 403, "QUOTA_EXCEEDED", "create the data disks"),
    ("instances.insert", "operation", 403, "QUOTA_EXCEEDED", "create the instances"),
    ("instances.insert", "operation", 503, "ZONE_RESOURCE_POOL_EXHAUSTED", "create the instances"),
    ("instances.insert", "call", 403, "quotaExceeded", "create the instances"),  # the first one's still under way
    ("instances.getSerialPortOutput", "call", 500, "backendError", "read the host keys the instances show"),
])
def test_a_fault_at_each_step_of_up_leaves_nothing(env, gce, method, on, code, reason, step):
    gce.fail(method, reason=reason, code=code, on=on, nth=2 if method == "instances.insert" else 1)
    if method == "instances.getSerialPortOutput":
        gce.fail("instances.getGuestAttributes", reason="notFound", code=404)
    with pytest.raises(cloud.GcpError, match=f"^cluster.up broken: could not {step}: .*; everything it had created "
                                             "was removed$"):
        cloud.up(request("broken", volume_gb=10), ssh_wait_s=0)
    assert leftovers(gce) == []
    assert not (env / "kiln" / "clusters" / "broken").exists()


def test_a_bad_image_is_one_clear_error_and_creates_nothing(env, gce):
    with pytest.raises(cloud.GcpError, match="^--source-image kiln-none: .*not found"):
        cloud.up(request("badimage", source_image="kiln-none"), ssh_wait_s=0)
    with pytest.raises(UsageError, match=r'no image in project kiln-test with \(labels.kiln-profile = "gpu"\) AND '
                                         r'\(labels.kiln-fingerprint = "cc33"\)') as refused:
        cloud.up(request("badimage", image_tags="kiln:fingerprint=cc33"), ssh_wait_s=0)
    assert isinstance(refused.value, failover.Unavailable)  # bad input alone; among other clouds, their turn
    assert leftovers(gce) == [] and not (env / "kiln" / "clusters" / "badimage").exists()
    made = cloud.up(request("picked", 1, image_tags="kiln:fingerprint=aa11"), ssh_wait_s=0)
    assert made.image.endswith("/images/kiln-gpu-1")


class Interrupting:
    """An instances client whose insert makes the instance, then the operator presses Ctrl-C."""

    def __init__(self, real):
        self.real = real

    def __getattr__(self, attribute):
        if attribute == "insert_unary":
            def call(**kwargs):
                self.real.insert_unary(**kwargs)
                raise KeyboardInterrupt
            return call
        return getattr(self.real, attribute)


def test_ctrl_c_during_the_instances_insert_rolls_back(env, gce):
    connected = cloud.connect()
    connected._clients["instances"] = Interrupting(connected.instances)
    with pytest.raises(cloud.GcpError, match="could not create the instances: interrupted; everything it had "
                                             "created was removed"):
        cloud.up(request("ctrlc"), gce=connected, ssh_wait_s=0)
    assert leftovers(gce) == []


def test_a_second_ctrl_c_during_the_undo_does_not_skip_it(env, gce, capfd):
    """Ctrl-C once the instances are being made starts the undo; a second one (a real SIGINT) as it deletes them is
    told that the undo goes on, and nothing is left."""
    connected = cloud.connect()

    pressed = []

    class Impatient(Interrupting):
        def __getattr__(self, attribute):
            if attribute == "delete_unary":
                def delete(**kwargs):
                    if not pressed:  # once, as the first instance is deleted
                        pressed.append(os.kill(os.getpid(), signal.SIGINT))
                    return self.real.delete_unary(**kwargs)
                return delete
            return super().__getattr__(attribute)

    connected._clients["instances"] = Impatient(connected.instances)
    with pytest.raises(cloud.GcpError, match="could not create the instances: interrupted; everything it had "
                                             "created was removed"):
        cloud.up(request("twice"), gce=connected, ssh_wait_s=0)
    assert "kiln: undoing what cluster.up twice made; Ctrl-C again stops it" in capfd.readouterr().err
    assert leftovers(gce) == []


def test_a_taken_name_is_refused(env, gce):
    cloud.up(request("taken", 1), ssh_wait_s=0)
    before = leftovers(gce)
    with pytest.raises(UsageError, match="cluster name 'taken' is taken"):
        cloud.up(request("taken", 1), ssh_wait_s=0)
    assert leftovers(gce) == before


def test_sweep_removes_expired_clusters_only(env, gce):
    past = datetime.now(UTC) - timedelta(hours=3)
    cloud.up(request("old", 1, ttl_hours=1), now=past, ssh_wait_s=0)
    cloud.up(request("fresh", 1, ttl_hours=1), ssh_wait_s=0)
    assert [s.name for s in cloud.sweep(dry_run=True)] == ["old"]
    assert leftovers(gce, "old")
    assert [s.name for s in cloud.sweep()] == ["old"]
    assert leftovers(gce, "old") == [] and leftovers(gce, "fresh")


def test_data_disks_outlive_the_cluster_as_snapshots_and_come_back(env, gce):
    cloud.up(request("keep", volume_gb=20), ssh_wait_s=0)
    disks = sorted(d.name for _, listed in client(gce, "DisksClient").aggregated_list(
        request={"project": PROJECT, "filter": 'labels.kiln-data:*'}) for d in listed.disks)
    assert disks == ["kiln-keep-data-0", "kiln-keep-data-1"]
    attached = [[d.source.rsplit("/", 1)[-1] for d in i.disks if not d.boot] for i in instances_of(gce, "keep")]
    assert attached == [["kiln-keep-data-0"], ["kiln-keep-data-1"]]
    done = cloud.down_with_snapshots("keep", ttl_days=3)
    assert [s.index for s in done.snapshots] == [0, 1] and not done.kept
    assert leftovers(gce, "keep", snapshots=False) == []
    taken = leftovers(gce, "keep")
    assert len(taken) == 2 and all(line.startswith("snapshot kiln-keep-data-") for line in taken)

    made = cloud.up(request("keep", volume_gb=10), ssh_wait_s=0)
    assert made.restore_note.startswith("cluster keep: data volumes restored from the snapshots of ")
    restored = {d.name: d for _, listed in client(gce, "DisksClient").aggregated_list(
        request={"project": PROJECT, "filter": 'labels.kiln-cluster = "keep"'}) for d in listed.disks
        if "kiln-data" in d.labels}
    assert sorted(restored) == disks
    assert {d.source_snapshot.rsplit("/", 1)[-1] for d in restored.values()} == {s.id for s in done.snapshots}
    assert all(d.size_gb == 20 for d in restored.values())  # never smaller than the snapshot
    assert [s.id for s in cloud.sweep_snapshots(now=datetime.now(UTC) + timedelta(days=4))] == [
        s.id for s in done.snapshots]


def test_a_snapshot_that_fails_keeps_its_disk_named(env, gce):
    cloud.up(request("half", volume_gb=10), ssh_wait_s=0)
    gce.fail("snapshots.insert", reason="QUOTA_EXCEEDED", code=403, on="operation", nth=2)
    done = cloud.down_with_snapshots("half")
    assert [s.index for s in done.snapshots] == [0]
    [(disk, node, why)] = done.kept
    assert (disk, node) == ("kiln-half-data-1", "1") and "QUOTA_EXCEEDED" in why
    assert leftovers(gce, "half", snapshots=False) == ["disk kiln-half-data-1"]
    assert state.load_cluster("half") is not None  # so `kiln down half --snapshot` knows its provider
    [(_, listed)] = [item for item in client(gce, "DisksClient").aggregated_list(
        request={"project": PROJECT, "filter": 'labels.kiln-data = "1"'}) if item[1].disks]
    assert listed.disks[0].labels["kiln-expires"] == done.snapshots[0].tags["kiln-expires"]  # sweep keeps it
    again = cloud.down_with_snapshots("half")  # the retry completes the set the first one missed
    assert [s.taken_at for s in again.snapshots] == [done.snapshots[0].taken_at]
    assert leftovers(gce, "half", snapshots=False) == []


def test_a_node_is_replaced_by_an_instance_made_as_the_cluster_was(env, gce):
    cloud.up(request("swap", spot=True, volume_gb=10), ssh_wait_s=0)
    record, record_request = state.load_cluster("swap"), cloud.Record.load("swap").planned()
    old = instances_of(gce, "swap")[1]
    host, keys = cloud.replace("swap", record.hosts[1].address, ssh_wait_s=0)
    [first, new] = instances_of(gce, "swap")
    assert new.name != old.name and old.name not in [i.name for i in instances_of(gce, "swap")]
    for field in ("machine_type", "labels", "tags", "scheduling", "shielded_instance_config", "resource_policies"):
        assert getattr(new, field) == getattr(old, field), field
    assert new.disks[0].source != old.disks[0].source  # its own boot disk, from the same image
    assert [d.source.rsplit("/", 1)[-1] for d in new.disks if not d.boot] == ["kiln-swap-data-1"]
    assert sorted(keys) == sorted(gce.host_keys(ZONE, new.name))
    after = state.load_cluster("swap")
    assert after.hosts[1] == host and after.hosts[0] == record.hosts[0]
    assert [i.id for i in after.instances] == [first.name, new.name] and after.instances[1].host_keys == "shown"
    # the instances are the cluster file's alone: gcp.json keeps how they are made
    assert {"instances", "host_keys"}.isdisjoint(state.load_cloud_state("swap", "gcp"))
    assert cloud.Record.load("swap").planned() == record_request


def test_a_replacement_that_cannot_be_made_leaves_the_cluster_as_it_was(env, gce):
    cloud.up(request("stay"), ssh_wait_s=0)
    record, before = state.load_cluster("stay"), leftovers(gce, "stay")
    keys = pinned(env, "stay")
    gce.fail("instances.insert", reason="ZONE_RESOURCE_POOL_EXHAUSTED", code=503, on="operation")
    with pytest.raises(cloud.GcpError, match="could not replace .*: could not create the instance: "
                                             "ZONE_RESOURCE_POOL_EXHAUSTED.*nothing new is left running"):
        cloud.replace("stay", record.hosts[0].address, ssh_wait_s=0)
    gce.fail("instances.getSerialPortOutput", reason="backendError", code=500)
    gce.fail("instances.getGuestAttributes", reason="notFound", code=404)
    with pytest.raises(cloud.GcpError, match="could not read the host keys it shows"):
        cloud.replace("stay", record.hosts[0].address, ssh_wait_s=0)
    assert leftovers(gce, "stay") == before and state.load_cluster("stay") == record and pinned(env, "stay") == keys


def kiln(env: Path, *args: str, extra: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(KILN), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "KILN_HOME": str(env / "kiln"), **(extra or {})})


def test_the_cli_makes_lists_sweeps_and_removes_a_gcp_cluster(env, gce):
    up = kiln(env, "up", "cli", "--provider", "gcp", "--zone", ZONE, "--count", "2", "--ssh-cidr", CIDR, "--spot",
              "--volume", "10", "--ssh-wait", "0")
    assert up.returncode == 0, up.stderr
    assert f"cluster cli is running in {PROJECT}/{ZONE} from kiln-gpu-2" in up.stdout
    steps = [line.removeprefix("cluster cli: ") for line in up.stdout.splitlines() if line.startswith("cluster cli: ")]
    assert steps[:6] == ["create the firewall rules", "create the compact placement policy", "create the data disks",
                     "create the instances", "read the host keys the instances show", "write the cluster file"], steps
    listed = kiln(env, "list", "--provider", "gcp")
    assert listed.returncode == 0 and listed.stdout.startswith("cli: 2 instance(s)"), listed.stdout
    swept = kiln(env, "sweep", "--provider", "gcp", "--dry-run")
    assert (swept.returncode, swept.stdout.strip()) == (0, "nothing has expired")
    bad = kiln(env, "up", "cli2", "--provider", "gcp", "--zone", ZONE, "--ssh-cidr", CIDR, "--max-price", "1")
    assert bad.returncode == 2 and bad.stderr == "kiln: --max-price applies to Spot VMs only: add --spot\n"
    foreign = kiln(env, "up", "cli2", "--provider", "gcp", "--zone", ZONE, "--ssh-cidr", CIDR, "--ami",
                   "ami-0123456789abcdef0")
    assert foreign.returncode == 2 and foreign.stderr.startswith("kiln: --ami: not options of --provider gcp")
    down = kiln(env, "down", "cli", "--snapshot")
    assert down.returncode == 0, down.stderr
    assert "node 1's data disk kept as snapshot kiln-cli-data-1-" in down.stdout
    assert leftovers(gce, "cli", snapshots=False) == []


def test_down_finds_a_cluster_where_its_file_says_not_where_the_shell_points(env, gce):
    """A cluster made in another region's zone, then removed from a shell whose project and zone are others: kiln
    down with no place looks in the project its cluster file records; list looks there too, and names the project
    it could not read (the stand-in serves one project, as a project without the rights would answer)."""
    up = kiln(env, "up", "far", "--provider", "gcp", "--zone", OTHER_REGION_ZONE, "--ssh-cidr", CIDR, "--ssh-wait",
              "0")
    assert up.returncode == 0, up.stderr
    assert state.load_cluster("far").where == {"project": PROJECT, "zone": OTHER_REGION_ZONE}
    elsewhere = {"GOOGLE_CLOUD_PROJECT": "elsewhere-1", "CLOUDSDK_COMPUTE_ZONE": ZONE}
    listed = kiln(env, "list", "--provider", "gcp", extra=elsewhere)
    assert f"gcp project {PROJECT}:\n  far: 1 instance(s)" in listed.stdout, listed.stdout
    assert listed.returncode == 1 and "could not look in 1 place(s): gcp project elsewhere-1: " in listed.stderr
    refused = kiln(env, "down", "far", "--zone", ZONE, extra=elsewhere)
    assert refused.returncode == 2 and f"--zone {ZONE}: cluster far is in zone {OTHER_REGION_ZONE}" in refused.stderr
    down = kiln(env, "down", "far", extra=elsewhere)
    assert down.returncode == 0, down.stderr
    assert leftovers(gce, "far") == [] and state.load_cluster("far") is None


def test_an_empty_zone_moves_up_on_to_the_next_and_leaves_nothing_of_the_try(env, gce):
    """--zones A,B with zone A out of machines (GCE's ZONE_RESOURCE_POOL_EXHAUSTED): the try in A is undone whole and
    the cluster comes up in B, all of it there."""
    gce.capacity(ZONE, 0)
    try:
        up = kiln(env, "up", "fo", "--provider", "gcp", "--zones", f"{ZONE},us-central1-b", "--gpus", "L4:1",
                  "--count", "2", "--ssh-cidr", CIDR, "--ssh-wait", "0")
    finally:
        gce.capacity(ZONE, None)
    assert up.returncode == 0, up.stdout + up.stderr
    assert f"up: trying gcp {ZONE} g2-standard-4 on-demand (1 of 2)" in up.stdout
    assert (f"up: gcp {ZONE} g2-standard-4 on-demand: no capacity (ZONE_RESOURCE_POOL_EXHAUSTED); nothing of it is "
            "left") in up.stdout
    assert "cluster fo is running in kiln-test/us-central1-b" in up.stdout
    assert state.load_cluster("fo").region == "us-central1-b"
    record = json.loads((env / "kiln" / "clusters" / "fo" / "capacity.json").read_text())
    assert record["came_up"]["place"] == "us-central1-b" and [(t["place"], t["verdict"], t["code"]) for t in
                                                               record["tried"]] == [
        (ZONE, "capacity", "ZONE_RESOURCE_POOL_EXHAUSTED")]
    listed = kiln(env, "list", "--provider", "gcp", "-v")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert ("fo: came up at gcp us-central1-b g2-standard-4 on-demand after 1 failed try of 2 candidate(s)\n"
            f"  round 1: gcp {ZONE} g2-standard-4 on-demand: capacity (ZONE_RESOURCE_POOL_EXHAUSTED)\n") \
        in listed.stdout, listed.stdout
    instances = instances_of(gce, "fo")
    assert [i.zone.rsplit("/", 1)[-1] for i in instances] == ["us-central1-b"] * 2
    assert leftovers(gce, "fo") == sorted([*(f"{kind} {i.name}" for i in instances for kind in ("disk", "instance")),
                                           "firewall kiln-fo-internal", "firewall kiln-fo-ssh",
                                           "resource-policy kiln-fo-compact"])  # boot disks are named as their VMs


def test_a_zone_without_the_machine_type_is_passed_over_before_anything_is_made_there(env, gce):
    """--zones A,B where zone A does not offer the type asked for: the try in A is refused by machineTypes.get before
    anything is made (no firewall, disk or instance insert there), and the cluster comes up in B. With one zone it
    is bad input, refused by name."""
    gce.offer(ZONE, ["e2-standard-4"])
    try:
        calls = len(gce.calls)
        up = kiln(env, "up", "fz", "--provider", "gcp", "--zones", f"{ZONE},us-central1-b", "--gpus", "L4:1",
                  "--ssh-cidr", CIDR, "--ssh-wait", "0")
        made = [path for method, path in gce.calls[calls:] if method.endswith(".insert")]
        alone = kiln(env, "up", "fy", "--provider", "gcp", "--zone", ZONE, "--instance-type", "g2-standard-4",
                     "--ssh-cidr", CIDR, "--ssh-wait", "0")
    finally:
        gce.offer(ZONE, None)
    assert up.returncode == 0, up.stdout + up.stderr
    assert (f"up: gcp {ZONE} g2-standard-4 on-demand: --instance-type g2-standard-4: not offered in {ZONE}; nothing "
            "was made") in up.stdout
    assert made and all("/zones/us-central1-b/" in path or "/global/" in path or "/regions/" in path
                        for path in made), made
    record = json.loads((env / "kiln" / "clusters" / "fz" / "capacity.json").read_text())
    assert [(t["place"], t["verdict"], t["code"]) for t in record["tried"]] == [(ZONE, "unavailable", "notFound")]
    assert state.load_cluster("fz").region == "us-central1-b"
    assert alone.returncode == 2, alone.stdout + alone.stderr
    assert alone.stderr == f"kiln: --instance-type g2-standard-4: not offered in {ZONE}\n"
    assert leftovers(gce, "fy") == [] and not (env / "kiln" / "clusters" / "fy").exists()


def test_a_quota_error_skips_the_rest_of_its_region_and_all_empty_is_one_error_naming_each_try(env, gce):
    gce.fail("instances.insert", reason="QUOTA_EXCEEDED", code=403, on="operation",
             message="Quota 'NVIDIA_L4_GPUS' exceeded.  Limit: 0.0 in region us-central1.")  # a regional quota
    up = kiln(env, "up", "fq", "--provider", "gcp", "--zones", f"{ZONE},us-central1-b,{OTHER_REGION_ZONE}",
              "--count", "1", "--ssh-cidr", CIDR, "--ssh-wait", "0")
    assert up.returncode == 0, up.stdout + up.stderr
    assert "up: gcp us-central1: over a quota (QUOTA_EXCEEDED: NVIDIA_L4_GPUS): skipping the region" in up.stdout
    assert "trying gcp us-central1-b" not in up.stdout and state.load_cluster("fq").region == OTHER_REGION_ZONE
    assert kiln(env, "down", "fq").returncode == 0
    for zone in (ZONE, OTHER_REGION_ZONE):
        gce.capacity(zone, 0)
    try:
        up = kiln(env, "up", "fe", "--provider", "gcp", "--zones", f"{ZONE},{OTHER_REGION_ZONE}", "--count", "1",
                  "--ssh-cidr", CIDR, "--ssh-wait", "0")
        capped = kiln(env, "up", "fc", "--provider", "gcp", "--zones", f"{ZONE},{OTHER_REGION_ZONE}", "--count", "1",
                      "--ssh-cidr", CIDR, "--ssh-wait", "0", "--max-attempts", "1")
    finally:
        for zone in (ZONE, OTHER_REGION_ZONE):
            gce.capacity(zone, None)
    assert up.returncode == 1 and up.stderr.count("\n") == 1, up.stderr
    assert up.stderr.startswith("kiln: no candidate came up: tried 2: gcp us-central1-a g2-standard-4 on-demand: "
                                "capacity (ZONE_RESOURCE_POOL_EXHAUSTED); gcp us-east1-b"), up.stderr
    assert leftovers(gce) == [] and not (env / "kiln" / "clusters" / "fe").exists()
    assert capped.returncode == 1 and f"trying gcp {OTHER_REGION_ZONE}" not in capped.stdout, capped.stdout
    assert "up: 1 tried, the most a round tries (--max-attempts); 1 not tried" in capped.stdout
    assert capped.stderr.startswith("kiln: no candidate came up: tried 1, 1 not tried (--max-attempts 1): gcp "
                                    f"{ZONE} g2-standard-4 on-demand: capacity"), capped.stderr
    assert leftovers(gce) == [] and not (env / "kiln" / "clusters" / "fc").exists()


def test_retry_until_up_takes_capacity_that_returns_to_the_zone(env, gce):
    """An empty zone with --retry-until-up: the first round finds no capacity and waits; the zone fills again
    meanwhile, and the next round brings the cluster up there."""
    gce.capacity(ZONE, 0)
    try:
        with subprocess.Popen([str(KILN), "up", "fr", "--provider", "gcp", "--zone", ZONE, "--ssh-cidr", CIDR,
                               "--ssh-wait", "0", "--retry-until-up", "2"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env={**os.environ, "KILN_HOME": str(env / "kiln")}) \
                as up:
            first = up.stdout.readline()
            while first.startswith("cluster fr: "):  # the steps of the first try, as each begins
                first = up.stdout.readline()
            assert first.startswith("up: round 1: no capacity (ZONE_RESOURCE_POOL_EXHAUSTED); trying again in 10s"), \
                first + up.stderr.read()
            assert leftovers(gce, "fr") == []  # the round's try left nothing while it waits
            gce.capacity(ZONE, None)
            out, err = up.communicate(timeout=120)
    finally:
        gce.capacity(ZONE, None)
    assert up.returncode == 0, out + err
    assert f"cluster fr is running in kiln-test/{ZONE}" in out and state.load_cluster("fr").region == ZONE
    record = json.loads((env / "kiln" / "clusters" / "fr" / "capacity.json").read_text())
    assert [(t["place"], t["verdict"], t["code"], t["round"]) for t in record["tried"]] == [
        (ZONE, "capacity", "ZONE_RESOURCE_POOL_EXHAUSTED", 1)]  # the whole log: the first round's try too


def test_with_no_zone_named_the_zones_that_offer_the_type_are_tried_and_no_other(env, gce):
    """--gpus L4:1 with no zone given or configured: kiln asks GCE where g2-standard-4 is (machineTypes
    .aggregatedList) and tries those zones alone: us-central1-b, which does not offer it, is never asked for
    anything; the first that offers it has no machines left, and the cluster comes up in the next."""
    gce.offer("us-central1-b", ["e2-standard-4"])
    gce.capacity(ZONE, 0)
    try:
        calls = len(gce.calls)
        up = kiln(env, "up", "nz", "--provider", "gcp", "--gpus", "L4:1", "--ssh-cidr", CIDR, "--ssh-wait", "0")
        asked = gce.calls[calls:]
    finally:
        gce.capacity(ZONE, None)
        gce.offer("us-central1-b", None)
    assert up.returncode == 0, up.stdout + up.stderr
    assert ("gcp: no --zone named: every zone that offers g2-standard-4 to this account, 2 (2 region(s), 2 zone(s); "
            "GCE's machineTypes.aggregatedList, read ") in up.stdout
    assert f"up: trying gcp {ZONE} g2-standard-4 on-demand (1 of 2)" in up.stdout
    assert f"up: gcp {ZONE} g2-standard-4 on-demand: no capacity (ZONE_RESOURCE_POOL_EXHAUSTED)" in up.stdout
    assert state.load_cluster("nz").region == OTHER_REGION_ZONE
    assert ("machineTypes.aggregatedList", f"/compute/v1/projects/{PROJECT}/aggregated/machineTypes") in asked
    assert not [path for _, path in asked if "/zones/us-central1-b/" in path], asked
    assert kiln(env, "down", "nz").returncode == 0
    assert leftovers(gce, "nz") == []


def test_a_queue_grows_the_cluster_by_instances_made_as_its_own_and_shrinks_it_all_or_nothing(env, gce):
    """What a queue's resume and suspend ask of Compute Engine (the provider's grow and shrink): instances made as
    the cluster's were, the keys their guest attributes show pinned; a grow whose second insert finds the zone
    empty deletes the first and leaves the cluster as it was; a shrink deletes the instances it names."""
    from bootstrap import providers

    cloud.up(request("q", 1), ssh_wait_s=0)
    before = state.load_cluster("q")
    provider = providers.for_cluster(before, "q")
    added = [providers.Added(host, host.address, tuple(keys)) for _, host, keys in cloud.grow("q", 2, ssh_wait_s=0)]
    instances = instances_of(gce, "q")
    assert len(instances) == 3 and [i.labels["kiln-node"] for i in instances] == ["0", "1", "2"]
    for new in instances[1:]:
        for field in ("machine_type", "tags", "scheduling", "shielded_instance_config", "resource_policies"):
            assert getattr(new, field) == getattr(instances[0], field), field
    assert [sorted(a.host_keys) for a in added] == [sorted(gce.host_keys(ZONE, i.name)) for i in instances[1:]]
    after = state.load_cluster("q")
    assert [i.id for i in after.instances] == [i.name for i in instances]
    assert after.hosts[1:] == tuple(a.host for a in added)
    pins = pinned(env, "q")

    gce.fail("instances.insert", reason="ZONE_RESOURCE_POOL_EXHAUSTED", code=503, on="operation", nth=2)
    with pytest.raises(cloud.GcpError) as raised:
        cloud.grow("q", 2, ssh_wait_s=0)
    assert str(raised.value).startswith("cluster q: could not add 2 instance(s): could not create the instance: ")
    assert raised.value.code == "ZONE_RESOURCE_POOL_EXHAUSTED"
    assert [i.name for i in instances_of(gce, "q")] == [i.name for i in instances]
    assert state.load_cluster("q") == after and pinned(env, "q") == pins

    provider.shrink("q", [a.host for a in added])
    assert [i.name for i in instances_of(gce, "q")] == [instances[0].name]
    assert state.load_cluster("q") == before
    cloud.down("q")
    assert leftovers(gce, "q") == []


def test_a_zone_gce_does_not_have_is_refused_by_name_before_anything_is_made(env, gce):
    """A zone that is no zone of the project (zones.list) is refused with the nearest real ones, exit 2, and nothing
    is asked for."""
    calls = len(gce.calls)
    refused = kiln(env, "up", "mz", "--provider", "gcp", "--zones", f"{ZONE},us-centrall-b", "--gpus", "L4:1",
                   "--ssh-cidr", CIDR, "--ssh-wait", "0")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert refused.stderr.startswith("kiln: zone us-centrall-b: not a GCP zone (the nearest: us-central1-b, "), \
        refused.stderr
    assert refused.stderr.endswith("), as --zone or --zones named it\n") and refused.stderr.count("\n") == 1
    assert not [method for method, _ in gce.calls[calls:] if not method.endswith((".list", ".get"))]
    assert leftovers(gce, "mz") == []


def test_with_no_zone_named_the_zones_are_tried_cheapest_first_by_the_billing_catalogs_prices(env, gce):
    """--gpus L4:1 with no zone: each zone that offers g2-standard-4 priced from the Cloud Billing Catalog (its
    vCPUs, memory and GPU at its region's SKUs, as Google adds them up), the cheaper region's zone planned first
    with its price and where that came from; with zones named, --spot --by-price orders them by their Spot SKUs."""
    gce.offer("us-central1-b", ["e2-standard-4"])
    americas = ["us-central1", "us-east1"]
    gce.price_sku("G2 Instance Core running in Americas", americas, 0.024988)
    gce.price_sku("G2 Instance Ram running in Americas", americas, 0.002927)
    gce.price_sku("Nvidia L4 GPU running in Americas", ["us-central1"], 0.5599)
    gce.price_sku("Nvidia L4 GPU running in Virginia", ["us-east1"], 0.40)
    gce.price_sku("Nvidia L4 GPU attached to DWS Defined Duration VMs running in Americas", americas, 0.20)
    try:
        planned = kiln(env, "up", "np", "--provider", "gcp", "--gpus", "L4:1", "--ssh-cidr", CIDR, "--dry-run")
    finally:
        gce.offer("us-central1-b", None)
    assert planned.returncode == 0, planned.stdout + planned.stderr
    assert ("gcp: no --zone named: every zone that offers g2-standard-4 to this account, the cheapest first, 2 "
            "(2 region(s), 2 zone(s); GCE's machineTypes.aggregatedList, read ") in planned.stdout, planned.stdout
    assert "; prices: GCP's Cloud Billing Catalog, on demand)" in planned.stdout, planned.stdout
    # 4 vCPUs, 16 GiB and an L4 (the DWS SKU is no on-demand price): 0.546784 in us-east1, 0.706684 in us-central1
    assert (f"  1. gcp {OTHER_REGION_ZONE} g2-standard-4 on-demand ($0.546784/h)\n"
            f"  2. gcp {ZONE} g2-standard-4 on-demand ($0.706684/h)\n") in planned.stdout, planned.stdout
    assert ("services.skus.list", "/v1/services/6F81-5844-456A/skus") in gce.calls

    # zones named, --spot --by-price: each zone's Spot SKUs price its candidate, the Catalog read once for both
    spot_skus = {"Spot Preemptible G2 Instance Core running in Americas": (americas, 0.01),
                 "Spot Preemptible G2 Instance Ram running in Americas": (americas, 0.001),
                 "Nvidia L4 GPU attached to Spot Preemptible VMs running in Americas": (["us-central1"], 0.20),
                 "Nvidia L4 GPU attached to Spot Preemptible VMs running in Virginia": (["us-east1"], 0.30)}
    for description, (regions, usd) in spot_skus.items():
        gce.price_sku(description, regions, usd, usage_type="Preemptible")
    calls = len(gce.calls)
    spot = kiln(env, "up", "np", "--provider", "gcp", "--gpus", "L4:1", "--ssh-cidr", CIDR, "--zones",
                f"{OTHER_REGION_ZONE},{ZONE}", "--spot", "--by-price", "--dry-run")
    assert spot.returncode == 0, spot.stdout + spot.stderr
    assert [c for c in gce.calls[calls:] if c[0] == "services.skus.list"] == \
        [("services.skus.list", "/v1/services/6F81-5844-456A/skus")]
    assert (f"  1. gcp {ZONE} g2-standard-4 spot ($0.256/h now)\n"
            f"  2. gcp {OTHER_REGION_ZONE} g2-standard-4 spot ($0.356/h now)\n") in spot.stdout, spot.stdout

    # --max-price holds on GCE, which takes no bid: a zone whose region's Spot price is above it is refused before
    # anything is made there, and the next zone is taken; with that zone alone, it is the reason, exit 2
    held = kiln(env, "up", "mp", "--provider", "gcp", "--gpus", "L4:1", "--ssh-cidr", CIDR, "--zones",
                f"{OTHER_REGION_ZONE},{ZONE}", "--spot", "--max-price", "0.3", "--ssh-wait", "0")
    assert held.returncode == 0, held.stdout + held.stderr
    assert (f"up: gcp {OTHER_REGION_ZONE} g2-standard-4 spot: --max-price 0.3: the Spot price of g2-standard-4 in "
            "us-east1 is 0.356 USD an hour; nothing was made") in held.stdout, held.stdout
    assert [i.zone.rsplit("/", 1)[-1] for i in instances_of(gce, "mp")] == [ZONE]
    # every instance the cluster gets later is held to it too: a Catalog whose Spot rate of the GPU is now two
    # prices (no price kiln can hold to) refuses a node more, nothing made
    gce.price_sku("Nvidia L4 GPU attached to Spot Preemptible VMs running in Americas", ["us-central1"], 0.9,
                  usage_type="Preemptible")
    cloud._RATES.clear()  # read once a command: this process has read it before
    with pytest.raises(failover.Unavailable, match="the Cloud Billing Catalog has no Spot price of g2-standard-4 in "
                                          "us-central1, so the price cannot be held there"):
        cloud.grow("mp", 1, ssh_wait_s=0)
    assert len(instances_of(gce, "mp")) == 1
    assert kiln(env, "down", "mp").returncode == 0 and leftovers(gce, "mp", snapshots=False) == []
    calls = len(gce.calls)
    over = kiln(env, "up", "mp", "--provider", "gcp", "--gpus", "L4:1", "--ssh-cidr", CIDR, "--zone",
                OTHER_REGION_ZONE, "--spot", "--max-price", "0.3", "--ssh-wait", "0")
    assert over.returncode == 2 and over.stderr == ("kiln: --max-price 0.3: the Spot price of g2-standard-4 in "
                                                    "us-east1 is 0.356 USD an hour\n"), over.stderr
    assert not [method for method, _ in gce.calls[calls:] if not method.endswith((".list", ".get"))]

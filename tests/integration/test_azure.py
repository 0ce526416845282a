"""kiln up/down/list/sweep/replace on Azure against the Resource Manager stand-in (testbed.arm) over TLS on
loopback, through the azure-mgmt clients pointed at it by their own base_url and connection_verify options
(KILN_AZURE_ENDPOINT, KILN_AZURE_CA_FILE). What is left is checked with the SDK directly, by the cluster's
resource group and every resource kind by tag, not with kiln's own code."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from azure.core.exceptions import HttpResponseError
from conftest import KILN

pytestmark = [pytest.mark.integration, pytest.mark.quick]

pytest.importorskip("azure.mgmt.compute")

from bootstrap import node, state  # noqa: E402
from bootstrap.errors import UsageError  # noqa: E402
from bootstrap.providers import common, failover  # noqa: E402
from bootstrap.providers.azure import cloud, plan  # noqa: E402
from bootstrap.ssh import NODE_SCRIPT  # noqa: E402
from localcloud.imds import Imds  # noqa: E402
from testbed.arm import Arm  # noqa: E402

SUB = "00000000-0000-0000-0000-000000000000"
LOCATION = "eastus"
CIDR = "203.0.113.7/32"


@pytest.fixture(scope="module")
def arm():
    with Arm(subscription=SUB, locations=(LOCATION, "westus2")) as served:
        served.add_image("kiln-images", "kiln-cpu-1", tags={"kiln:profile": "cpu"})
        served.add_image("kiln-images", "kiln-gpu-1", tags={"kiln:profile": "gpu", "kiln:fingerprint": "aa11"})
        yield served


@pytest.fixture
def env(arm, monkeypatch, tmp_path):
    monkeypatch.setenv(cloud.ENDPOINT_ENV, arm.endpoint)
    monkeypatch.setenv(cloud.CA_FILE_ENV, str(arm.ca_file))
    monkeypatch.setenv(cloud.TOKEN_ENV, arm.credential().get_token("https://management.azure.com/.default").token)
    monkeypatch.setenv(cloud.SUBSCRIPTION_ENV, SUB)
    monkeypatch.setenv(cloud.PRICES_ENV, arm.endpoint)  # the Retail Prices API too: the stand-in's
    monkeypatch.setenv("KILN_HOME", str(tmp_path / "kiln"))
    yield tmp_path
    connected = cloud.connect()
    for group in cloud.cluster_groups(connected):  # a failed test must not leak into the next one
        cloud.delete_group(connected, group.name)
    for snapshot in cloud.snapshot_records(connected):
        cloud.done(connected.compute.snapshots.begin_delete(snapshot.id.split("/")[4], snapshot.name))


def leftovers(arm, name: str | None = None, snapshots: bool = True) -> list[str]:
    """The cluster's resource group and everything tagged with its name, of every kind, straight from the API."""
    resources, compute, network = (arm.client(kind) for kind in ("resource", "compute", "network"))
    found = []
    for group in resources.resource_groups.list():
        tags = group.tags or {}
        if "kiln:cluster" in tags and name in (None, tags["kiln:cluster"]):
            found.append(f"resource-group {group.name}")
    for kind, items in (("vm", compute.virtual_machines.list_all()), ("disk", compute.disks.list()),
                        ("scale-set", compute.virtual_machine_scale_sets.list_all()),
                        ("nic", network.network_interfaces.list_all()),
                        ("public-ip", network.public_ip_addresses.list_all()),
                        ("nsg", network.network_security_groups.list_all()),
                        ("vnet", network.virtual_networks.list_all()),
                        ("snapshot", compute.snapshots.list() if snapshots else [])):
        for item in items:
            tags = item.tags or {}
            if "kiln:cluster" in tags and name in (None, tags["kiln:cluster"]):
                found.append(f"{kind} {item.name}")
    return sorted(found)


def request(name: str, count: int = 2, **changes) -> plan.Request:
    return plan.validate_request(name, count, changes.pop("vm_size", None), location=changes.pop("location",
                                 LOCATION), ssh_cidr=changes.pop("ssh_cidr", CIDR), **changes)


def pinned(env: Path, name: str) -> list[str]:
    return sorted((env / "kiln" / "clusters" / name / "known_hosts").read_text().splitlines())


def vms_of(arm, name: str) -> list:
    return sorted(arm.client("compute").virtual_machines.list(plan.group_name(name)), key=lambda v: v.tags["kiln:node"])


def test_up_then_down_leaves_nothing(env, arm):
    made = cloud.up(request("alpha", spot=True, ttl_hours=2), ssh_wait_s=0)
    assert made.image.endswith("/images/kiln-gpu-1") and made.where.startswith("resource group kiln-alpha ")
    saved = state.load_cluster("alpha")
    assert saved.provider == "azure" and saved.region == LOCATION and saved.node_type == plan.DEFAULT_VM_SIZE
    vms = vms_of(arm, "alpha")
    assert [v.name for v in vms] == ["kiln-alpha-0", "kiln-alpha-1"]
    for vm in vms:
        assert (vm.priority, vm.eviction_policy) == ("Spot", "Delete")
        linux = vm.os_profile.linux_configuration
        assert linux.disable_password_authentication and linux.ssh.public_keys[0].key_data.startswith("ssh-ed25519")
        assert vm.diagnostics_profile.boot_diagnostics.enabled
        assert vm.proximity_placement_group.id.endswith("/proximityPlacementGroups/kiln-alpha-ppg")
        expires = common.parse_time(vm.tags["kiln:expires"])
        assert timedelta(hours=1.9) < expires - datetime.now(UTC) <= timedelta(hours=2)
    wanted = sorted(f"{h.address} {key}" for h, vm in zip(saved.hosts, vms, strict=True)
                    for key in arm.host_keys("kiln-alpha", vm.name))
    assert pinned(env, "alpha") == wanted
    rules = arm.client("network").network_security_groups.get("kiln-alpha", "kiln-alpha-nsg").security_rules
    assert {(r.name, r.source_address_prefix) for r in rules} == {("kiln-ssh", CIDR), ("kiln-cluster", plan.SUBNET)}
    assert [s.name for s in cloud.list_clusters()] == ["alpha"]
    assert list(arm.client("compute").virtual_machine_scale_sets.list("kiln-alpha")) == []  # not an RDMA size

    assert cloud.down("alpha") == ["resource-group kiln-alpha"]
    assert leftovers(arm) == []
    assert state.load_cluster("alpha") is None and cloud.down("alpha") == []


@pytest.mark.parametrize(("operation", "on", "status", "code", "step"), [
    ("networkSecurityGroups.createOrUpdate", "call", 403, "AuthorizationFailed", "create the network security group"),
    ("proximityPlacementGroups.createOrUpdate", "call", 400, "BadRequest", "create the proximity placement group"),
    ("disks.createOrUpdate", "operation", 409, "OperationNotAllowed", "create the data disks"),
    ("virtualMachines.createOrUpdate", "operation", 409, "OperationNotAllowed", "create the VMs"),
    ("virtualMachines.createOrUpdate", "operation", 200, "AllocationFailed", "create the VMs"),
    ("virtualMachines.retrieveBootDiagnosticsData", "call", 409, "OperationNotAllowed",
     "read the host keys from the serial logs"),
])
def test_a_fault_at_each_step_of_up_leaves_nothing(env, arm, operation, on, status, code, step):
    arm.fail(operation, code=code, status=status, on=on, nth=2 if operation.startswith("virtualMachines.c") else 1)
    with pytest.raises(cloud.AzureError, match=f"^cluster.up broken: could not {step}: .*{code}.*; everything it "
                                               "had created was removed$"):
        cloud.up(request("broken", volume_gb=10), ssh_wait_s=0)
    assert leftovers(arm) == []
    assert not (env / "kiln" / "clusters" / "broken").exists()


def test_a_bad_image_is_one_clear_error_and_creates_nothing(env, arm):
    missing = f"/subscriptions/{SUB}/resourceGroups/kiln-images/providers/Microsoft.Compute/images/kiln-none"
    with pytest.raises(cloud.AzureError, match="^--image-id .*kiln-none: "):
        cloud.up(request("badimage", image_id=missing), ssh_wait_s=0)
    with pytest.raises(UsageError, match="no image in eastus tagged kiln:profile=gpu, kiln:fingerprint=cc33"):
        cloud.up(request("badimage", image_tags="kiln:fingerprint=cc33"), ssh_wait_s=0)
    assert leftovers(arm) == [] and not (env / "kiln" / "clusters" / "badimage").exists()


class InterruptedOnceMade:
    """Compute's virtual machines, but a Ctrl-C comes once the first VM is made (as a user's, mid-up)."""

    def __init__(self, real):
        self.real = real

    def __getattr__(self, attribute):
        if attribute != "begin_create_or_update":
            return getattr(self.real, attribute)

        def call(*args, **kwargs):
            self.real.begin_create_or_update(*args, **kwargs).result()
            raise KeyboardInterrupt
        return call


def test_ctrl_c_during_the_vms_rolls_back(env, arm):
    connected = cloud.connect()
    connected.compute.virtual_machines = InterruptedOnceMade(connected.compute.virtual_machines)
    with pytest.raises(cloud.AzureError, match="could not create the VMs: interrupted; everything it had created "
                                               "was removed"):
        cloud.up(request("ctrlc"), azure=connected, ssh_wait_s=0)
    assert leftovers(arm) == []


def test_a_second_ctrl_c_during_the_undo_does_not_skip_it(env, arm, capfd):
    """Ctrl-C once the VMs are made starts the undo; a second one (a real SIGINT) as the resource group is deleted
    is told that the undo goes on, and nothing is left."""
    connected = cloud.connect()
    real_groups = connected.resources.resource_groups

    class Impatient:
        def __getattr__(self, attribute):
            if attribute == "begin_delete":
                def delete(*args, **kwargs):
                    os.kill(os.getpid(), signal.SIGINT)
                    return real_groups.begin_delete(*args, **kwargs)
                return delete
            return getattr(real_groups, attribute)

    connected.compute.virtual_machines = InterruptedOnceMade(connected.compute.virtual_machines)
    connected.resources.resource_groups = Impatient()
    with pytest.raises(cloud.AzureError, match="could not create the VMs: interrupted; everything it had created "
                                               "was removed"):
        cloud.up(request("twice"), azure=connected, ssh_wait_s=0)
    assert "kiln: undoing what cluster.up twice made; Ctrl-C again stops it" in capfd.readouterr().err
    assert leftovers(arm) == []


def test_sweep_removes_expired_clusters_only(env, arm):
    cloud.up(request("old", 1, ttl_hours=1), now=datetime.now(UTC) - timedelta(hours=3), ssh_wait_s=0)
    cloud.up(request("fresh", 1, ttl_hours=1), ssh_wait_s=0)
    assert [s.name for s in cloud.sweep(dry_run=True)] == ["old"]
    assert [s.name for s in cloud.sweep()] == ["old"]
    assert leftovers(arm, "old") == [] and leftovers(arm, "fresh")


def test_data_disks_outlive_the_cluster_as_snapshots_and_come_back(env, arm):
    cloud.up(request("keep", volume_gb=20), ssh_wait_s=0)
    assert [[d.managed_disk.id.rsplit("/", 1)[-1] for d in vm.storage_profile.data_disks]
            for vm in vms_of(arm, "keep")] == [["kiln-keep-data-0"], ["kiln-keep-data-1"]]
    done = cloud.down_with_snapshots("keep", ttl_days=3)
    assert [s.index for s in done.snapshots] == [0, 1] and not done.kept
    assert leftovers(arm, "keep", snapshots=False) == []
    assert len(leftovers(arm, "keep")) == 2

    made = cloud.up(request("keep", volume_gb=10), ssh_wait_s=0)
    assert made.restore_note.startswith("cluster keep: data volumes restored from the snapshots of ")
    disks = {d.name: d for d in arm.client("compute").disks.list_by_resource_group("kiln-keep")
             if "kiln:data" in (d.tags or {})}
    assert sorted(disks) == ["kiln-keep-data-0", "kiln-keep-data-1"]
    assert {d.creation_data.source_resource_id for d in disks.values()} == {s.id for s in done.snapshots}
    assert all(d.disk_size_gb == 20 for d in disks.values())
    assert [s.name for s in cloud.sweep_snapshots(now=datetime.now(UTC) + timedelta(days=4))] == [
        s.name for s in done.snapshots]


def test_a_node_is_replaced_by_a_vm_made_as_the_cluster_was(env, arm):
    cloud.up(request("swap", spot=True, volume_gb=10), ssh_wait_s=0)
    record = state.load_cluster("swap")
    old = vms_of(arm, "swap")[1]
    host, keys = cloud.replace("swap", record.hosts[1].address, ssh_wait_s=0)
    [first, new] = vms_of(arm, "swap")
    assert new.name.startswith("kiln-swap-1-") and old.name not in [v.name for v in vms_of(arm, "swap")]
    assert (new.hardware_profile.vm_size, new.priority, new.eviction_policy, new.tags) == (
        old.hardware_profile.vm_size, old.priority, old.eviction_policy, old.tags)
    assert new.storage_profile.image_reference.id == old.storage_profile.image_reference.id
    assert [d.managed_disk.id.rsplit("/", 1)[-1] for d in new.storage_profile.data_disks] == ["kiln-swap-data-1"]
    assert sorted(keys) == sorted(arm.host_keys("kiln-swap", new.name))
    after = state.load_cluster("swap")
    assert after.hosts[1] == host and after.hosts[0] == record.hosts[0]
    assert [i.id for i in after.instances] == [first.name, new.name]


def test_a_cluster_file_of_the_previous_version_still_serves_a_replacement(env, arm):
    cloud.up(request("older", count=1), ssh_wait_s=0)
    saved = state.load_cloud_state("older", "azure")
    assert {"vms", "host_keys"}.isdisjoint(saved)  # the VMs are the cluster file's alone
    record = state.load_cluster("older")
    state.save_cloud_state("older", {**saved, "vms": [record.instances[0].id],
                                     "host_keys": {record.hosts[0].address: "shown"}}, "azure")
    host, _ = cloud.replace("older", record.hosts[0].address, ssh_wait_s=0)
    assert state.load_cluster("older").hosts == (host,)
    cloud.down("older")


def test_a_replacement_that_cannot_be_made_leaves_the_cluster_as_it_was(env, arm):
    cloud.up(request("stay"), ssh_wait_s=0)
    record, before, keys = state.load_cluster("stay"), leftovers(arm, "stay"), pinned(env, "stay")
    arm.fail("virtualMachines.createOrUpdate", code="AllocationFailed", status=200, on="operation")
    with pytest.raises(cloud.AzureError, match="could not replace .*: could not create the VM: .*AllocationFailed.*"
                                               "nothing new is left running"):
        cloud.replace("stay", record.hosts[0].address, ssh_wait_s=0)
    arm.fail("virtualMachines.retrieveBootDiagnosticsData", code="OperationNotAllowed", status=409)
    with pytest.raises(cloud.AzureError, match="could not read its host keys from the serial log"):
        cloud.replace("stay", record.hosts[0].address, ssh_wait_s=0)
    assert leftovers(arm, "stay") == before and state.load_cluster("stay") == record and pinned(env, "stay") == keys


def test_the_cli_makes_lists_and_removes_an_azure_cluster(env, arm):
    def kiln(*args):
        return subprocess.run([str(KILN), *args], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "KILN_HOME": str(env / "kiln")})

    up = kiln("up", "cli", "--provider", "azure", "--location", LOCATION, "--count", "2", "--ssh-cidr", CIDR,
              "--spot", "--volume", "10", "--ssh-wait", "0")
    assert up.returncode == 0, up.stderr
    assert "cluster cli is running in resource group kiln-cli (eastus) from kiln-gpu-1" in up.stdout
    listed = kiln("list", "--provider", "azure")
    assert listed.returncode == 0 and listed.stdout.startswith("cli: 2 VM(s)"), listed.stdout
    refused = kiln("up", "cli2", "--provider", "azure", "--location", LOCATION, "--ssh-cidr", CIDR, "--zone", "x")
    assert refused.returncode == 2 and "--zone: not options of --provider azure" in refused.stderr, refused.stderr
    down = kiln("down", "cli", "--snapshot")
    assert down.returncode == 0, down.stderr
    assert "node 1's data disk kept as snapshot kiln-cli-data-1-" in down.stdout
    assert leftovers(arm, "cli", snapshots=False) == []


def test_down_finds_a_cluster_where_its_file_says_not_where_the_shell_points(env, arm):
    """A cluster made in westus2, removed from a shell whose subscription and location are others: kiln down with
    no place deletes it in the subscription its cluster file records; a --subscription that says otherwise is
    refused by flag."""
    def kiln(*args, **extra):
        return subprocess.run([str(KILN), *args], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "KILN_HOME": str(env / "kiln"), **extra})

    arm.add_image("kiln-images-far", "kiln-gpu-far", tags={"kiln:profile": "gpu"}, location="westus2")
    up = kiln("up", "far", "--provider", "azure", "--location", "westus2", "--ssh-cidr", CIDR, "--ssh-wait", "0")
    assert up.returncode == 0, up.stderr
    assert state.load_cluster("far").where == {"subscription": SUB, "location": "westus2"}
    other = "11111111-1111-1111-1111-111111111111"
    refused = kiln("down", "far", "--subscription", other)
    assert refused.returncode == 2 and f"--subscription {other}: cluster far is in subscription {SUB}" in \
        refused.stderr, refused.stderr
    down = kiln("down", "far", AZURE_SUBSCRIPTION_ID=other, AZURE_LOCATION=LOCATION)
    assert down.returncode == 0, down.stderr
    assert leftovers(arm, "far") == [] and state.load_cluster("far") is None


def test_an_up_that_loses_a_race_for_the_name_leaves_the_winners_group(env, arm):
    """Both `up`s looked before either made the group: the one whose PUT finds it there (200, not 201) stops
    without undoing anything, since nothing there is its own (ARM has no create-only PUT for a group: the loser's
    tags replace the winner's, and nothing else of it changes)."""
    winner = {"location": LOCATION, "tags": {"kiln:cluster": "race", "kiln:owner": "first"}}
    arm.client("resource").resource_groups.create_or_update("kiln-race", winner)
    connected = cloud.connect()
    groups = connected.resources.resource_groups

    class LookedTooEarly:
        def __getattr__(self, attribute):
            if attribute == "check_existence":
                return lambda name: False
            if attribute == "list":
                return lambda **kwargs: []
            return getattr(groups, attribute)

    connected.resources.resource_groups = LookedTooEarly()
    network = arm.client("network")
    network.network_security_groups.begin_create_or_update("kiln-race", "theirs", {"location": LOCATION}).result()
    with pytest.raises(UsageError, match="resource group kiln-race was made meanwhile"):
        cloud.up(request("race"), azure=connected, ssh_wait_s=0)
    assert arm.client("resource").resource_groups.check_existence("kiln-race")
    assert [g.name for g in network.network_security_groups.list("kiln-race")] == ["theirs"]


def test_a_snapshot_that_fails_keeps_the_group_until_the_retry_completes_the_set(env, arm):
    cloud.up(request("half", volume_gb=10), ssh_wait_s=0)
    arm.fail("snapshots.createOrUpdate", code="OperationNotAllowed", status=409, on="operation", nth=2)
    done = cloud.down_with_snapshots("half", ttl_days=3)
    assert [s.index for s in done.snapshots] == [0] and [k[:2] for k in done.kept] == [("kiln-half-data-1", "1")]
    group = arm.client("resource").resource_groups.get("kiln-half")
    assert group.tags["kiln:expires"] == done.snapshots[0].tags["kiln:expires"]  # sweep keeps it with the disk
    assert state.load_cluster("half") is not None  # so `kiln down half --snapshot` knows its provider
    again = cloud.down_with_snapshots("half", ttl_days=3)
    assert not again.kept and {s.taken_at for s in again.snapshots} == {done.snapshots[0].taken_at}
    assert sorted(s.index for s in again.snapshots) == [0, 1]  # the set is whole: up restores both
    assert leftovers(arm, "half", snapshots=False) == []


def test_snapshots_of_another_location_are_not_restored(env, arm):
    """A disk is copied from a snapshot of its own region only: a cluster made elsewhere starts empty."""
    cloud.up(request("far", 1, volume_gb=10), ssh_wait_s=0)
    cloud.down_with_snapshots("far")
    assert [s.location for s in cloud.snapshot_records(cloud.connect(), "far")] == [LOCATION]
    image = arm.add_image("kiln-images-west", "kiln-gpu-west", tags={"kiln:profile": "gpu"}, location="westus2")
    made = cloud.up(request("far", 1, volume_gb=10, location="westus2", image_id=image), ssh_wait_s=0)
    assert made.restore_note == "cluster far: no snapshot of its data volumes: each node gets an empty volume"


# ---------------------------------------------------------------------------------------------------- autostop

def power_of(arm, group: str, vm: str) -> str:
    view = arm.client("compute").virtual_machines.instance_view(group, vm)
    return next(s.code for s in view.statuses if s.code.startswith("PowerState/"))


def wait_for_power(arm, group: str, vm: str, wanted: str, seconds: float = 10) -> str:
    for _ in range(int(seconds / 0.05)):
        seen = power_of(arm, group, vm)
        if seen == wanted:
            return seen
        time.sleep(0.05)
    return seen


def test_autostop_lets_each_vm_deallocate_itself_and_nothing_else(env, arm):
    cloud.up(request("idle", spot=True, volume_gb=10, idle_minutes=30), ssh_wait_s=0)
    assert all(v.identity.type == "SystemAssigned" for v in vms_of(arm, "idle"))  # made with it
    assert arm.role_assignments() == []  # given its role once the agents start (arm_autostop)
    armed = cloud.arm_autostop("idle")
    assert cloud.arm_autostop("idle") == armed  # again: the same identities, no second assignment
    vms = vms_of(arm, "idle")
    assert sorted(armed) == sorted(v.id for v in vms)
    assert all(v.identity.type == "SystemAssigned" for v in vms)
    assert len({v.identity.principal_id for v in vms}) == 2
    assignments = arm.role_assignments()
    assert sorted((a["properties"]["scope"], a["properties"]["principalId"]) for a in assignments) == sorted(
        (v.id, v.identity.principal_id) for v in vms)
    assert {a["properties"]["roleDefinitionId"].rsplit("/", 1)[-1] for a in assignments} == {plan.POWER_ROLE}
    first, second = vms

    # node 0's agent deallocates its own VM, as its identity, through its metadata service
    with Imds(first.name, azure_vm=first.id, azure_token=lambda: arm.identity_token(first.id)) as imds:
        assert node.deallocate_self(imds.endpoint, arm.endpoint, cafile=arm.ca_file) is None
    assert wait_for_power(arm, "kiln-idle", first.name, "PowerState/deallocated") == "PowerState/deallocated"
    assert power_of(arm, "kiln-idle", second.name) == "PowerState/running"
    assert "disk kiln-idle-data-0" in leftovers(arm, "idle")  # its data stays

    # node 0's identity may not deallocate node 1; a VM without an identity gets no token
    with Imds(first.name, azure_vm=second.id, azure_token=lambda: arm.identity_token(first.id)) as imds:
        refused = node.deallocate_self(imds.endpoint, arm.endpoint, cafile=arm.ca_file)
    assert refused.startswith(f"could not deallocate {second.id}: HTTP 403 AuthorizationFailed: ") and \
        "'Microsoft.Compute/virtualMachines/deallocate/action'" in refused, refused
    as_first = arm.client("compute", credential=arm.credential(arm.identity_token(first.id)))
    with pytest.raises(HttpResponseError) as caught:  # its role powers it on and off, no more
        as_first.virtual_machines.begin_delete("kiln-idle", first.name)
    assert "'Microsoft.Compute/virtualMachines/delete'" in caught.value.message
    with Imds("elsewhere", azure_vm=second.id, azure_token=lambda: None) as imds:
        assert node.deallocate_self(imds.endpoint, arm.endpoint, cafile=arm.ca_file) == (
            "could not get a token for its managed identity: HTTP 400 invalid_request: Identity not found")
    assert power_of(arm, "kiln-idle", second.name) == "PowerState/running"

    cloud.down("idle")
    assert leftovers(arm, "idle") == [] and arm.role_assignments() == []


def test_the_idle_agent_deallocates_its_own_vm_once_idle(env, arm, tmp_path):
    """node.py's agent itself, detached as kiln starts it on a node, pointed at the stand-ins by its environment."""
    cloud.up(request("agent", count=1, idle_minutes=1), ssh_wait_s=0)
    cloud.arm_autostop("agent")
    [vm] = vms_of(arm, "agent")
    seen = tmp_path / "autostop.json"
    with Imds(vm.name, azure_vm=vm.id, azure_token=lambda: arm.identity_token(vm.id)) as imds:
        started = subprocess.run([sys.executable, "-S", "-c", NODE_SCRIPT, "autostop", "1", "0.2", "azure", str(seen)],
                                 env={"PATH": os.environ["PATH"], "KILN_AZURE_METADATA": imds.endpoint,
                                      "KILN_AZURE_ENDPOINT": arm.endpoint, "KILN_AZURE_CA_FILE": arm.ca_file},
                                 input="", capture_output=True, text=True, timeout=60)
        assert started.returncode == 0, started.stderr
        agent = json.loads(started.stdout)["pid"]
        try:
            assert wait_for_power(arm, "kiln-agent", vm.name, "PowerState/deallocated", 60) == \
                "PowerState/deallocated", (tmp_path / "autostop.log").read_text()
            assert json.loads(seen.read_text())["shutdown"] == "azure"
        finally:
            os.kill(agent, signal.SIGTERM)
    assert (tmp_path / "autostop.log").read_text() == ""  # nothing went wrong on the way
    cloud.down("agent")


def test_autostop_without_the_right_to_give_roles_is_one_clear_error(env, arm):
    cloud.up(request("nope", count=1), ssh_wait_s=0)
    with arm.denied("Microsoft.Authorization/roleAssignments/write"), \
            pytest.raises(cloud.AzureError, match=r"cluster nope: autostop: could not let kiln-nope-0 deallocate "
                                                  r"itself: AuthorizationFailed: .* \(giving a role needs Owner or "
                                                  r"User Access Administrator on the cluster's resource group\)"):
        cloud.arm_autostop("nope")
    assert arm.role_assignments() == [] and not cloud.Record.load("nope").autostop
    cloud.down("nope")


def test_a_new_identity_is_waited_for_until_the_directory_has_it(env, arm):
    arm.delay_principals(3)
    try:
        cloud.up(request("late", count=1, idle_minutes=5), ssh_wait_s=0)
        with pytest.raises(cloud.AzureError, match="could not let kiln-late-0 deallocate itself: PrincipalNotFound"):
            cloud.arm_autostop("late", principal_wait_s=0, principal_poll_s=0.1)
        [vm] = vms_of(arm, "late")
        assert cloud.arm_autostop("late", principal_wait_s=10, principal_poll_s=0.2) == [vm.id]
        assert [a["properties"]["principalId"] for a in arm.role_assignments()] == [vm.identity.principal_id]
    finally:
        arm.delay_principals(0)
    cloud.down("late")
    assert arm.role_assignments() == []


def test_a_replacement_of_an_autostopping_node_may_deallocate_itself_too(env, arm):
    cloud.up(request("again"), ssh_wait_s=0)
    cloud.arm_autostop("again")
    old = vms_of(arm, "again")[1]
    cloud.replace("again", state.load_cluster("again").hosts[1].address, ssh_wait_s=0)
    new = vms_of(arm, "again")[1]
    assert new.name != old.name and new.identity.type == "SystemAssigned"
    scopes = sorted(a["properties"]["scope"] for a in arm.role_assignments())
    assert scopes == sorted([vms_of(arm, "again")[0].id, new.id])  # the old VM's went with it
    with Imds(new.name, azure_vm=new.id, azure_token=lambda: arm.identity_token(new.id)) as imds:
        assert node.deallocate_self(imds.endpoint, arm.endpoint, cafile=arm.ca_file) is None
    assert wait_for_power(arm, "kiln-again", new.name, "PowerState/deallocated") == "PowerState/deallocated"
    cloud.down("again")


# ---------------------------------------------------------------------------------------------------- VM sizes

def test_a_size_the_location_does_not_offer_or_open_or_run_as_spot_is_refused_before_anything_is_made(env, arm):
    arm.restrict_size("Standard_NC40ads_H100_v5", LOCATION)
    before = len(arm.calls)
    for changes, said in (
            ({"vm_size": "Standard_NC6"}, "--instance-type Standard_NC6: not offered in eastus; GPU sizes open to "
                                          "you there: Standard_NC24ads_A100_v4, Standard_NC4as_T4_v3, "
                                          "Standard_ND96isr_H100_v5, Standard_ND96isr_H200_v5"),
            ({"vm_size": "Standard_NC40ads_H100_v5"}, "--instance-type Standard_NC40ads_H100_v5: not open to this "
                                                      "subscription in eastus (NotAvailableForSubscription); ask "
                                                      "Azure for access, or try another --location"),
            ({"vm_size": "Standard_B2s", "spot": True}, "--spot: Standard_B2s cannot run as a Spot VM")):
        with pytest.raises(UsageError) as refused:
            cloud.up(request("sized", 1, **changes), ssh_wait_s=0)
        assert str(refused.value) == said
        assert isinstance(refused.value, failover.Unavailable)  # among candidates: the next one's turn
    arm.fail("resourceSkus.list", code="AuthorizationFailed", status=403)
    with pytest.raises(cloud.AzureError, match="^cluster.up sized: could not look up the VM sizes of eastus: "
                                               "AuthorizationFailed: .*; nothing was created$"):
        cloud.up(request("sized", 1), ssh_wait_s=0)
    assert [verb for verb, _ in arm.calls[before:]] == ["GET"] * (len(arm.calls) - before)  # nothing was asked for
    assert leftovers(arm, "sized") == [] and not (env / "kiln" / "clusters" / "sized").exists()


def test_a_size_without_accelerated_networking_gets_interfaces_without_it(env, arm):
    cloud.up(request("small", 1, vm_size="Standard_B2s"), ssh_wait_s=0)  # the stand-in refuses it on a B2s
    nic = arm.client("network").network_interfaces.get("kiln-small", "kiln-small-0-nic")
    assert nic.enable_accelerated_networking is False
    cloud.replace("small", state.load_cluster("small").hosts[0].address, ssh_wait_s=0)
    [vm] = vms_of(arm, "small")
    replaced = arm.client("network").network_interfaces.get("kiln-small", f"{vm.name}-nic")
    assert replaced.enable_accelerated_networking is False
    cloud.down("small")


def test_a_location_without_the_size_or_its_capacity_moves_the_cluster_to_the_next(env, arm):
    """--regions eastus,westus2: a size eastus does not open to the subscription (SkuNotAvailable, before anything
    is made), then an allocation that fails there (AllocationFailed, the VM's operation: the try's resource group
    is deleted whole): each time the cluster comes up in westus2."""
    arm.add_image("kiln-images-westus2", "kiln-gpu-w", tags={"kiln:profile": "gpu"}, location="westus2")
    arm.restrict_size("Standard_NC40ads_H100_v5", LOCATION)

    def kiln(*args):
        return subprocess.run([str(KILN), *args], capture_output=True, text=True, timeout=300)

    sized = kiln("up", "fs", "--provider", "azure", "--gpus", "H100-NVL:1", "--regions", f"{LOCATION},westus2",
                 "--ssh-cidr", CIDR, "--ssh-wait", "0")
    assert sized.returncode == 0, sized.stdout + sized.stderr
    assert (f"up: azure {LOCATION} Standard_NC40ads_H100_v5 on-demand: --instance-type Standard_NC40ads_H100_v5: not "
            f"open to this subscription in {LOCATION} (NotAvailableForSubscription); ask Azure for access, or try "
            "another --location; nothing was made") in sized.stdout
    assert state.load_cluster("fs").region == "westus2"
    assert kiln("down", "fs").returncode == 0
    arm.fail("virtualMachines.createOrUpdate", code="AllocationFailed", status=200, on="operation")
    allocated = kiln("up", "fa", "--provider", "azure", "--gpus", "T4:1", "--count", "2", "--regions",
                     f"{LOCATION},westus2", "--ssh-cidr", CIDR, "--ssh-wait", "0")
    assert allocated.returncode == 0, allocated.stdout + allocated.stderr
    assert (f"up: azure {LOCATION} Standard_NC4as_T4_v3 on-demand: no capacity (AllocationFailed); nothing of it is "
            "left") in allocated.stdout
    assert state.load_cluster("fa").region == "westus2"
    groups = [group for group in arm.client("resource").resource_groups.list()
              if (group.tags or {}).get("kiln:cluster") == "fa"]
    assert [group.location for group in groups] == ["westus2"]  # the eastus try's group is gone
    assert sum(line.startswith("vm ") for line in leftovers(arm, "fa")) == 2
    assert kiln("down", "fa").returncode == 0
    assert leftovers(arm, "fa") == [] and leftovers(arm, "fs") == []


def test_by_price_tries_the_location_whose_spot_price_is_lowest_now_first(env, arm, monkeypatch):
    """--spot --by-price reads each location's Spot meter from the Retail Prices API (the stand-in's, paged two
    items at a time so kiln follows NextPageLink): westus2 is cheaper now, so the cluster comes up there; the
    Windows and Low Priority meters, cheaper still, are not taken for it."""
    arm.add_image("kiln-images-westus2", "kiln-gpu-w", tags={"kiln:profile": "gpu"}, location="westus2")
    arm.price(LOCATION, "Standard_NC4as_T4_v3", spot=0.30, on_demand=0.526)
    arm.price("westus2", "Standard_NC4as_T4_v3", spot=0.21, on_demand=0.526)
    monkeypatch.setenv(cloud.PRICES_ENV, arm.endpoint)
    monkeypatch.setattr(arm, "page_size", 2)
    asked = len(arm.prices_asked)
    made = subprocess.run([str(KILN), "up", "bp", "--provider", "azure", "--gpus", "T4:1", "--spot", "--by-price",
                           "--regions", f"{LOCATION},westus2", "--ssh-cidr", CIDR, "--ssh-wait", "0"],
                          capture_output=True, text=True, timeout=300)
    try:
        assert made.returncode == 0, made.stdout + made.stderr
        assert ("  1. azure westus2 Standard_NC4as_T4_v3 spot ($0.21/h now)\n"
                f"  2. azure {LOCATION} Standard_NC4as_T4_v3 spot ($0.3/h now)\n") in made.stdout, made.stdout
        assert "up: trying azure westus2 Standard_NC4as_T4_v3 spot (1 of 2)" in made.stdout, made.stdout
        assert state.load_cluster("bp").region == "westus2"
        queries = arm.prices_asked[asked:]
        assert {q["$filter"].split("armRegionName eq '")[1].split("'")[0] for q in queries} == {LOCATION, "westus2"}
        assert any("$skip" in q for q in queries), "kiln read the following pages"
        assert all(q["api-version"] == plan.RETAIL_PRICES_API for q in queries)
    finally:
        cloud.down("bp")
    assert leftovers(arm, "bp") == []


# ------------------------------------------------------------------------------------- RDMA sizes: one fabric


def test_an_rdma_size_puts_every_vm_and_a_replacement_in_one_flexible_scale_set(env, arm):
    """ND96isr_H100_v5 (RdmaEnabled in Resource SKUs): a Flexible scale set, one fault domain, a single placement
    group (one InfiniBand fabric), in the cluster's placement group; every VM joins it, a replacement too; down
    leaves nothing."""
    before = len(arm.calls)
    cloud.up(request("fabric", 2, vm_size="Standard_ND96isr_H100_v5"), ssh_wait_s=0)
    puts = [path.rsplit("/", 2)[-2] for verb, path in arm.calls[before:] if verb == "PUT" and "/providers/" in path]
    assert puts.index("virtualMachineScaleSets") < puts.index("virtualMachines")
    compute = arm.client("compute")
    [vmss] = compute.virtual_machine_scale_sets.list("kiln-fabric")
    assert (vmss.name, vmss.orchestration_mode, vmss.platform_fault_domain_count, vmss.single_placement_group,
            vmss.virtual_machine_profile, vmss.tags["kiln:cluster"]) == (
        "kiln-fabric-vmss", "Flexible", 1, True, None, "fabric")
    ppg = compute.proximity_placement_groups.get("kiln-fabric", "kiln-fabric-ppg")
    assert vmss.proximity_placement_group.id == ppg.id and [s.id for s in ppg.virtual_machine_scale_sets] == [vmss.id]
    for vm in vms_of(arm, "fabric"):
        assert (vm.virtual_machine_scale_set.id, vm.proximity_placement_group.id) == (vmss.id, ppg.id)

    cloud.replace("fabric", state.load_cluster("fabric").hosts[1].address, ssh_wait_s=0)
    [first, new] = vms_of(arm, "fabric")
    assert new.name.startswith("kiln-fabric-1-") and new.virtual_machine_scale_set.id == vmss.id
    assert cloud.down("fabric") == ["resource-group kiln-fabric"]
    assert leftovers(arm) == []


def test_the_stand_in_refuses_what_azure_refuses_of_a_scale_set_and_its_vms(env, arm):
    cloud.up(request("rules", 1, vm_size="Standard_ND96isr_H100_v5"), ssh_wait_s=0)
    azure, kept = cloud.connect(), cloud.Record.load("rules")
    compute = arm.client("compute")
    sets = compute.virtual_machine_scale_sets
    flexible = {"location": LOCATION, "properties": {"orchestrationMode": "Flexible", "platformFaultDomainCount": 1}}

    def refused(call) -> str:
        with pytest.raises(HttpResponseError) as error:
            cloud.done(call())
        return f"{error.value.status_code} {error.value.error.code}"

    def node(scale_set: str, name: str = "kiln-rules-9"):
        return lambda: cloud.make_node(azure, kept.planned(), group="kiln-rules", index=9, name=name,
                                       image=kept.image, public_key=state.cluster_dir("rules").joinpath(
                                           "id_ed25519.pub").read_text().strip(), tags=kept.tags,
                                       subnet_id=kept.subnet_id, placement_id=kept.placement_id, data_disk=None,
                                       timeout_s=30, scale_set_id=scale_set)

    assert refused(lambda: sets.begin_delete("kiln-rules", "kiln-rules-vmss")) == "409 OperationNotAllowed"
    assert refused(lambda: sets.begin_create_or_update("kiln-rules", "bad", {"location": LOCATION, "properties": {
        "orchestrationMode": "Flexible", "platformFaultDomainCount": 5}})) == "400 InvalidParameter"
    uniform = cloud.done(sets.begin_create_or_update("kiln-rules", "uniform", {"location": LOCATION, "properties": {
        "orchestrationMode": "Uniform", "virtualMachineProfile": {"osProfile": {"computerNamePrefix": "u"}}}}))
    assert refused(node(uniform.id)) == "409 OperationNotAllowed"  # a VM joins a Flexible set only
    spread = cloud.done(sets.begin_create_or_update("kiln-rules", "spread", {**flexible, "properties": {
        **flexible["properties"], "singlePlacementGroup": False}}))
    assert refused(node(spread.id)) == "409 OperationNotAllowed"  # an RDMA size needs a single placement group
    other_ppg = compute.proximity_placement_groups.create_or_update("kiln-rules", "other-ppg", {
        "location": LOCATION, "properties": {"proximityPlacementGroupType": "Standard"}})
    apart = cloud.done(sets.begin_create_or_update("kiln-rules", "apart", {**flexible, "properties": {
        **flexible["properties"], "proximityPlacementGroup": {"id": other_ppg.id}}}))
    joined = cloud.done(node(apart.id, "kiln-rules-8")())  # kiln names no group on a VM that joins a set:
    assert joined.proximity_placement_group.id.lower() == other_ppg.id.lower()  # the set's places it
    elsewhere = cloud.done(sets.begin_create_or_update("kiln-rules", "elsewhere", {**flexible,
                                                                                   "location": "westus2"}))
    assert refused(node(elsewhere.id)) == "400 InvalidParameter"
    missing = kept.scale_set_id.replace("kiln-rules-vmss", "nowhere")
    assert refused(node(missing)) == "404 NotFound"
    [vm] = [vm for vm in vms_of(arm, "rules") if vm.name != joined.name]
    moved = vm.as_dict()
    moved["properties"]["virtualMachineScaleSet"] = {"id": spread.id}
    assert refused(lambda: compute.virtual_machines.begin_create_or_update("kiln-rules", vm.name, moved)) == \
        "409 PropertyChangeNotAllowed"
    cloud.down("rules")
    assert leftovers(arm) == []


def test_with_no_location_named_the_locations_open_to_the_subscription_are_planned_and_the_closed_one_said(env, arm):
    """--gpus H100-NVL:1 with no location given or configured: kiln reads the subscription's Resource SKUs and
    plans the locations that offer the size and open it to the subscription; the one that has it closed is left
    out with ARM's reason."""
    arm.restrict_size("Standard_NC40ads_H100_v5", LOCATION)
    planned = subprocess.run([str(KILN), "up", "nl", "--provider", "azure", "--gpus", "H100-NVL:1", "--ssh-cidr", CIDR,
                              "--dry-run"], capture_output=True, text=True, timeout=120,
                             env={key: value for key, value in os.environ.items() if key != "AZURE_LOCATION"})
    assert planned.returncode == 0, planned.stdout + planned.stderr
    assert ("azure: no --location named: every location that offers Standard_NC40ads_H100_v5 to this account, the "
            "cheapest first, 1 (1 region(s), ") in planned.stdout, planned.stdout
    assert "; prices: Azure's Retail Prices, pay-as-you-go)" in planned.stdout
    assert f"  left out: {LOCATION} Standard_NC40ads_H100_v5 (NotAvailableForSubscription)\n" in planned.stdout
    assert "then in resource group kiln-nl (westus2)" in planned.stdout
    assert f'"location": "{LOCATION}"' not in planned.stdout


def test_a_queue_grows_the_cluster_by_vms_made_as_its_own_and_shrinks_it_all_or_nothing(env, arm):
    """What a queue's resume and suspend ask of Resource Manager (the provider's grow and shrink): VMs made as the
    cluster's were, the keys their serial logs show pinned; a grow whose second VM fails to allocate deletes the
    first and leaves the cluster as it was; a shrink deletes the VMs it names with their interfaces and
    addresses."""
    from bootstrap import providers

    cloud.up(request("q", 1, spot=True), ssh_wait_s=0)
    before = state.load_cluster("q")
    grown = cloud.grow("q", 2, ssh_wait_s=0)
    vms = vms_of(arm, "q")
    assert [vm.tags["kiln:node"] for vm in vms] == ["0", "1", "2"]
    for new in vms[1:]:
        assert (new.hardware_profile.vm_size, new.priority, new.eviction_policy) == (
            vms[0].hardware_profile.vm_size, vms[0].priority, vms[0].eviction_policy)
        assert {k: v for k, v in new.tags.items() if k != "kiln:node"} == \
            {k: v for k, v in vms[0].tags.items() if k != "kiln:node"}
    assert [sorted(keys) for _, _, keys in grown] == [sorted(arm.host_keys("kiln-q", vm.name)) for vm in vms[1:]]
    after = state.load_cluster("q")
    assert [i.id for i in after.instances] == [vm.name for vm in vms]
    pins = pinned(env, "q")

    arm.fail("virtualMachines.createOrUpdate", code="AllocationFailed", status=200, on="operation", nth=2)
    with pytest.raises(cloud.AzureError) as raised:
        cloud.grow("q", 2, ssh_wait_s=0)
    assert str(raised.value).startswith("cluster q: could not add 2 VM(s): could not create the VM: ")
    assert raised.value.code == "AllocationFailed"
    assert [vm.name for vm in vms_of(arm, "q")] == [vm.name for vm in vms]
    assert state.load_cluster("q") == after and pinned(env, "q") == pins

    providers.for_cluster(after, "q").shrink("q", [host for _, host, _ in grown])
    assert [vm.name for vm in vms_of(arm, "q")] == [vms[0].name]
    assert state.load_cluster("q") == before
    assert sorted(line for line in leftovers(arm, "q") if line.startswith(("nic", "public-ip"))) == [
        "nic kiln-q-0-nic", "public-ip kiln-q-0-ip"]
    cloud.down("q")
    assert leftovers(arm, "q") == []


def test_a_location_azure_does_not_have_is_refused_by_name_before_anything_is_made(env, arm):
    """A location where Resource SKUs offer the subscription nothing is refused with the nearest real ones, exit
    2, and nothing is made."""
    refused = subprocess.run([str(KILN), "up", "ml", "--provider", "azure", "--gpus", "T4:1", "--regions",
                              f"{LOCATION},eastuss", "--ssh-cidr", CIDR, "--ssh-wait", "0"],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert refused.stderr == ("kiln: location eastuss: not an Azure location (the nearest: eastus, westus2), as "
                              "--location or --regions named it\n"), refused.stderr
    assert leftovers(arm, "ml") == []


def test_by_price_orders_on_demand_candidates_by_their_pay_as_you_go_meter(env, arm, monkeypatch):
    """--by-price without --spot reads each location's Linux pay-as-you-go meter (not Spot, not Low Priority, not
    Windows) from the Retail Prices API: the location cheaper by the hour comes first."""
    arm.price(LOCATION, "Standard_NC4as_T4_v3", spot=0.05, on_demand=0.526)
    arm.price("westus2", "Standard_NC4as_T4_v3", spot=0.30, on_demand=0.48)
    monkeypatch.setenv(cloud.PRICES_ENV, arm.endpoint)
    planned = subprocess.run([str(KILN), "up", "od", "--provider", "azure", "--gpus", "T4:1", "--by-price",
                              "--regions", f"{LOCATION},westus2", "--ssh-cidr", CIDR, "--dry-run"],
                             capture_output=True, text=True, timeout=120)
    assert planned.returncode == 0, planned.stdout + planned.stderr
    assert ("  1. azure westus2 Standard_NC4as_T4_v3 on-demand ($0.48/h)\n"
            f"  2. azure {LOCATION} Standard_NC4as_T4_v3 on-demand ($0.526/h)\n") in planned.stdout, planned.stdout

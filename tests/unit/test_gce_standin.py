"""testbed.gce: the Compute Engine stand-in, driven only through the official google-cloud-compute clients."""

from __future__ import annotations

import ipaddress
import json

import pytest
from google.api_core.exceptions import BadRequest, Conflict, Forbidden, NotFound, PreconditionFailed, from_http_response
from google.auth.credentials import AnonymousCredentials
from google.auth.transport.requests import AuthorizedSession
from google.cloud import compute_v1

from kiln.hostkeys import console_host_keys
from testbed.gce import Gce

PROJECT, ZONE, REGION = "kiln-test", "us-central1-a", "us-central1"
DONE = compute_v1.Operation.Status.DONE


@pytest.fixture
def gce():
    with Gce(op_delay=0.01) as gce:
        gce.add_image("kiln-gpu-1", family="kiln-gpu")
        yield gce


def client(gce: Gce, kind: type):
    """A client pointed at the stand-in by the library's own option, nothing patched."""
    return kind(credentials=AnonymousCredentials(), client_options={"api_endpoint": gce.endpoint})


def instance(name: str, machine: str = "g2-standard-4", *, image: str = "global/images/family/kiln-gpu",
             guest_attributes: bool = True, labels: dict | None = None, scheduling: compute_v1.Scheduling | None = None,
             data_disks: tuple[str, ...] = (), policies: tuple[str, ...] = ()) -> compute_v1.Instance:
    metadata = [compute_v1.Items(key="enable-guest-attributes", value="TRUE")] if guest_attributes else []
    boot = compute_v1.AttachedDiskInitializeParams(source_image=image, disk_type=f"zones/{ZONE}/diskTypes/pd-balanced")
    disks = [compute_v1.AttachedDisk(boot=True, auto_delete=True, initialize_params=boot)]
    disks += [compute_v1.AttachedDisk(source=f"zones/{ZONE}/disks/{d}", auto_delete=False) for d in data_disks]
    return compute_v1.Instance(
        name=name, machine_type=f"zones/{ZONE}/machineTypes/{machine}", labels=labels or {},
        scheduling=compute_v1.Scheduling(on_host_maintenance="TERMINATE") if scheduling is None else scheduling,
        metadata=compute_v1.Metadata(items=metadata), disks=disks, resource_policies=list(policies),
        network_interfaces=[compute_v1.NetworkInterface(
            network="global/networks/default", access_configs=[compute_v1.AccessConfig(type_="ONE_TO_ONE_NAT")])])


def wait_zonal(gce: Gce, op: compute_v1.Operation) -> compute_v1.Operation:
    return client(gce, compute_v1.ZoneOperationsClient).wait(project=PROJECT, zone=ZONE, operation=op.name)


def create(gce: Gce, inst: compute_v1.Instance) -> compute_v1.Instance:
    instances = client(gce, compute_v1.InstancesClient)
    op = wait_zonal(gce, instances.insert_unary(project=PROJECT, zone=ZONE, instance_resource=inst))
    assert op.status == DONE and not op.error.errors, op
    return instances.get(project=PROJECT, zone=ZONE, instance=inst.name)


def create_disk(gce: Gce, disk: compute_v1.Disk) -> compute_v1.Disk:
    disks = client(gce, compute_v1.DisksClient)
    wait_zonal(gce, disks.insert_unary(project=PROJECT, zone=ZONE, disk_resource=disk))
    return disks.get(project=PROJECT, zone=ZONE, disk=disk.name)


def guest_host_keys(gce: Gce, name: str) -> set[str]:
    request = compute_v1.GetGuestAttributesInstanceRequest(project=PROJECT, zone=ZONE, instance=name,
                                                           query_path="hostkeys/")
    answer = client(gce, compute_v1.InstancesClient).get_guest_attributes(request=request)
    assert {item.namespace for item in answer.query_value.items} == {"hostkeys"}
    return {f"{item.key} {item.value}" for item in answer.query_value.items}


def test_an_inserted_instance_runs_with_its_addresses_and_shows_its_host_keys_on_console_and_guest_attributes(gce):
    instances = client(gce, compute_v1.InstancesClient)
    op = instances.insert_unary(project=PROJECT, zone=ZONE, instance_resource=instance("node-1"))
    assert op.status == compute_v1.Operation.Status.RUNNING and op.operation_type == "insert"
    assert op.name.startswith("operation-") and op.zone.endswith(f"/projects/{PROJECT}/zones/{ZONE}")
    assert wait_zonal(gce, op).status == DONE  # PROVISIONING until then: the slow stand-in below shows it

    vm = instances.get(project=PROJECT, zone=ZONE, instance="node-1")
    assert vm.status == "RUNNING" and vm.id and vm.creation_timestamp and vm.label_fingerprint and vm.fingerprint
    assert vm.self_link == f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances/node-1"
    assert vm.machine_type.endswith(f"/zones/{ZONE}/machineTypes/g2-standard-4")
    assert vm.network_interfaces[0].network_i_p == "10.128.0.2"
    assert ipaddress.ip_address(vm.network_interfaces[0].access_configs[0].nat_i_p) in ipaddress.ip_network(
        "203.0.113.0/24")
    assert create(gce, instance("node-2")).network_interfaces[0].network_i_p == "10.128.0.3"

    real = set(gce.host_keys(ZONE, "node-1"))
    assert {key.split()[0] for key in real} == {"ssh-ed25519", "ecdsa-sha2-nistp256"}
    console = instances.get_serial_port_output(project=PROJECT, zone=ZONE, instance="node-1").contents
    assert set(console_host_keys(console)) == real
    assert guest_host_keys(gce, "node-1") == real
    assert real.isdisjoint(gce.host_keys(ZONE, "node-2"))


def test_guest_attributes_hold_no_host_keys_without_the_metadata_flag_or_before_running(gce):
    create(gce, instance("plain", guest_attributes=False))
    with pytest.raises(NotFound):
        guest_host_keys(gce, "plain")
    console = client(gce, compute_v1.InstancesClient).get_serial_port_output(project=PROJECT, zone=ZONE,
                                                                            instance="plain").contents
    assert set(console_host_keys(console)) == set(gce.host_keys(ZONE, "plain"))

    with Gce(op_delay=60) as slow:
        slow.add_image("kiln-gpu-1", family="kiln-gpu")
        client(slow, compute_v1.InstancesClient).insert_unary(project=PROJECT, zone=ZONE,
                                                              instance_resource=instance("booting"))
        assert client(slow, compute_v1.InstancesClient).get(project=PROJECT, zone=ZONE,
                                                            instance="booting").status == "PROVISIONING"
        with pytest.raises(NotFound):
            guest_host_keys(slow, "booting")
        console = client(slow, compute_v1.InstancesClient).get_serial_port_output(
            project=PROJECT, zone=ZONE, instance="booting").contents
        assert console_host_keys(console) == []


def test_a_body_field_unknown_to_the_schema_is_bad_request(gce):
    body = json.loads(compute_v1.Instance.to_json(instance("vm-x")))
    body["acceleratorz"] = [{"count": 1}]
    session = AuthorizedSession(AnonymousCredentials())  # the client's own HTTP session and error mapping
    response = session.post(f"{gce.endpoint}/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances", json=body)
    error = from_http_response(response)
    assert isinstance(error, BadRequest) and "acceleratorz" in error.message
    with pytest.raises(NotFound):
        client(gce, compute_v1.InstancesClient).get(project=PROJECT, zone=ZONE, instance="vm-x")


def test_a_missing_image_is_not_found_at_once_and_nothing_is_made(gce):
    instances = client(gce, compute_v1.InstancesClient)
    missing = f"projects/{PROJECT}/global/images/no-such-image"
    with pytest.raises(NotFound, match=f"{missing}' was not found"):
        instances.insert_unary(project=PROJECT, zone=ZONE, instance_resource=instance("vm", image=missing))
    assert list(instances.list(project=PROJECT, zone=ZONE)) == []
    assert list(client(gce, compute_v1.DisksClient).list(project=PROJECT, zone=ZONE)) == []


def test_a_second_instance_of_the_same_name_is_a_conflict(gce):
    create(gce, instance("twin"))
    with pytest.raises(Conflict, match=f"projects/{PROJECT}/zones/{ZONE}/instances/twin' already exists"):
        client(gce, compute_v1.InstancesClient).insert_unary(project=PROJECT, zone=ZONE,
                                                             instance_resource=instance("twin"))


@pytest.mark.parametrize("name", ["Upper", "1st", "ends-", "x" * 64, "under_score"])
def test_a_name_outside_the_gce_pattern_is_bad_request(gce, name):
    with pytest.raises(BadRequest, match="resource.name"):
        client(gce, compute_v1.InstancesClient).insert_unary(project=PROJECT, zone=ZONE,
                                                             instance_resource=instance(name))


def test_a_spot_instance_must_name_its_termination_action(gce):
    instances = client(gce, compute_v1.InstancesClient)
    bare = compute_v1.Scheduling(provisioning_model="SPOT", automatic_restart=False)
    with pytest.raises(BadRequest, match="instanceTerminationAction"):
        instances.insert_unary(project=PROJECT, zone=ZONE, instance_resource=instance("spot", scheduling=bare))
    restarting = compute_v1.Scheduling(provisioning_model="SPOT", instance_termination_action="STOP",
                                       automatic_restart=True)
    with pytest.raises(BadRequest, match="automaticRestart"):
        instances.insert_unary(project=PROJECT, zone=ZONE, instance_resource=instance("spot", scheduling=restarting))
    good = compute_v1.Scheduling(provisioning_model="SPOT", instance_termination_action="STOP", automatic_restart=False)
    vm = create(gce, instance("spot", scheduling=good))
    assert (vm.scheduling.provisioning_model, vm.scheduling.on_host_maintenance) == ("SPOT", "TERMINATE")


def test_a_gpu_machine_type_must_terminate_on_host_maintenance(gce):
    instances = client(gce, compute_v1.InstancesClient)
    for machine in ("g2-standard-8", "a2-highgpu-1g", "a3-highgpu-8g"):
        with pytest.raises(BadRequest, match="onHostMaintenance"):
            instances.insert_unary(project=PROJECT, zone=ZONE, instance_resource=instance(
                f"gpu-{machine}", machine, scheduling=compute_v1.Scheduling()))
    vm = create(gce, instance("cpu", "e2-standard-4", scheduling=compute_v1.Scheduling()))
    assert vm.scheduling.on_host_maintenance == "MIGRATE" and not vm.guest_accelerators
    a3 = create(gce, instance("a3", "a3-highgpu-8g"))
    assert [(a.accelerator_type.rsplit("/", 1)[1], a.accelerator_count) for a in a3.guest_accelerators] == [
        ("nvidia-h100-80gb", 8)]


@pytest.mark.parametrize("machine_type", ["e2-standard-4", "zones/us-central1-a/machineTypes/n1-mega-96",
                                          "zones/us-central1-b/machineTypes/e2-standard-4"])
def test_a_machine_type_unknown_to_the_zone_is_bad_request(gce, machine_type):
    inst = instance("vm", "e2-standard-4")
    inst.machine_type = machine_type
    with pytest.raises(BadRequest, match="resource.machineType"):
        client(gce, compute_v1.InstancesClient).insert_unary(project=PROJECT, zone=ZONE, instance_resource=inst)


@pytest.mark.parametrize("labels", [{"Team": "a"}, {"team": "A"}, {f"k{i}": "v" for i in range(65)}])
def test_labels_outside_gce_rules_are_bad_request(gce, labels):
    with pytest.raises(BadRequest, match="labels"):
        client(gce, compute_v1.InstancesClient).insert_unary(project=PROJECT, zone=ZONE,
                                                             instance_resource=instance("vm", labels=labels))


def test_list_filters_by_label_value_label_presence_and_name(gce):
    create(gce, instance("a-1", labels={"kiln-cluster": "a", "role": "chief"}))
    create(gce, instance("a-2", labels={"kiln-cluster": "a"}))
    create(gce, instance("b-1", labels={"kiln-cluster": "b"}))
    create(gce, instance("loner"))
    instances = client(gce, compute_v1.InstancesClient)

    def names(expression: str) -> list[str]:
        request = compute_v1.ListInstancesRequest(project=PROJECT, zone=ZONE, filter=expression)
        return [vm.name for vm in instances.list(request=request)]

    assert names('labels.kiln-cluster = "a"') == ["a-1", "a-2"]
    assert names("labels.kiln-cluster=b") == ["b-1"]
    assert names("labels.kiln-cluster:*") == ["a-1", "a-2", "b-1"]
    assert names('(labels.kiln-cluster = "a") AND (labels.role = "chief")') == ["a-1"]
    assert names('(labels.kiln-cluster = "a") (name = "a-2")') == ["a-2"]
    assert names("") == ["a-1", "a-2", "b-1", "loner"]
    aggregated = instances.aggregated_list(request=compute_v1.AggregatedListInstancesRequest(
        project=PROJECT, filter='labels.kiln-cluster = "b"'))
    assert {scope: [vm.name for vm in scoped.instances] for scope, scoped in aggregated} == {
        f"zones/{ZONE}": ["b-1"], "zones/us-central1-b": []}


@pytest.mark.parametrize("expression", ['status = "RUNNING"', 'labels.a != "b"', 'name = "x" OR name = "y"',
                                        'labels.a = "b" AND labels.c = "d"',
                                        "labels.a = b)", 'name ~ "x.*"'])
def test_a_filter_the_stand_in_does_not_know_is_bad_request_not_an_unfiltered_list(gce, expression):
    create(gce, instance("vm"))
    request = compute_v1.ListInstancesRequest(project=PROJECT, zone=ZONE, filter=expression)
    with pytest.raises(BadRequest, match="Invalid list filter expression"):
        list(client(gce, compute_v1.InstancesClient).list(request=request))


def test_the_pager_follows_page_tokens(gce):
    firewalls = client(gce, compute_v1.FirewallsClient)
    for i in range(5):
        firewalls.insert_unary(project=PROJECT, firewall_resource=compute_v1.Firewall(
            name=f"fw-{i}", source_ranges=["10.0.0.0/8"], allowed=[compute_v1.Allowed(I_p_protocol="tcp",
                                                                                       ports=["22"])]))
    pager = firewalls.list(request=compute_v1.ListFirewallsRequest(project=PROJECT, max_results=2))
    assert [rule.name for rule in pager] == [f"fw-{i}" for i in range(5)]
    assert [method for method, _ in gce.calls].count("firewalls.list") == 3


def test_a_firewall_needs_a_known_network_and_valid_ranges(gce):
    firewalls = client(gce, compute_v1.FirewallsClient)
    allowed = [compute_v1.Allowed(I_p_protocol="tcp", ports=["22", "8000-8100"])]
    with pytest.raises(NotFound, match="global/networks/elsewhere"):
        firewalls.insert_unary(project=PROJECT, firewall_resource=compute_v1.Firewall(
            name="fw", network="global/networks/elsewhere", allowed=allowed))
    with pytest.raises(BadRequest, match="sourceRanges"):
        firewalls.insert_unary(project=PROJECT, firewall_resource=compute_v1.Firewall(
            name="fw", source_ranges=["10.0.0.0/33"], allowed=allowed))
    op = firewalls.insert_unary(project=PROJECT, firewall_resource=compute_v1.Firewall(
        name="fw", source_ranges=["203.0.113.7/32"], target_tags=["kiln"], allowed=allowed))
    assert client(gce, compute_v1.GlobalOperationsClient).wait(project=PROJECT, operation=op.name).status == DONE
    rule = firewalls.get(project=PROJECT, firewall="fw")
    assert rule.network.endswith(f"/projects/{PROJECT}/global/networks/default") and list(rule.target_tags) == ["kiln"]


def test_an_attached_disk_cannot_be_deleted_and_stays_detached_when_its_instance_goes(gce):
    data = create_disk(gce, compute_v1.Disk(name="data", size_gb=200, type_=f"zones/{ZONE}/diskTypes/pd-ssd"))
    assert data.status == "READY" and data.size_gb == 200
    vm = create(gce, instance("worker", data_disks=("data",)))
    disks = client(gce, compute_v1.DisksClient)
    assert list(disks.get(project=PROJECT, zone=ZONE, disk="data").users) == [vm.self_link]
    with pytest.raises(BadRequest, match="already being used by"):
        disks.delete_unary(project=PROJECT, zone=ZONE, disk="data")
    with pytest.raises(BadRequest, match="already being used by"):
        client(gce, compute_v1.InstancesClient).insert_unary(project=PROJECT, zone=ZONE,
                                                             instance_resource=instance("thief", data_disks=("data",)))

    wait_zonal(gce, client(gce, compute_v1.InstancesClient).delete_unary(project=PROJECT, zone=ZONE,
                                                                         instance="worker"))
    assert [d.name for d in disks.list(project=PROJECT, zone=ZONE)] == ["data"]  # the boot disk went with it
    assert list(disks.get(project=PROJECT, zone=ZONE, disk="data").users) == []
    wait_zonal(gce, disks.delete_unary(project=PROJECT, zone=ZONE, disk="data"))
    assert list(disks.list(project=PROJECT, zone=ZONE)) == []


def test_a_snapshot_of_a_disk_makes_a_disk_again(gce):
    create_disk(gce, compute_v1.Disk(name="ckpt", size_gb=50, labels={"kiln-run": "r1"}))
    snapshots = client(gce, compute_v1.SnapshotsClient)
    op = snapshots.insert_unary(project=PROJECT, snapshot_resource=compute_v1.Snapshot(
        name="ckpt-1", source_disk=f"projects/{PROJECT}/zones/{ZONE}/disks/ckpt", labels={"kiln-run": "r1"}))
    assert client(gce, compute_v1.GlobalOperationsClient).wait(project=PROJECT, operation=op.name).status == DONE
    snapshot = snapshots.get(project=PROJECT, snapshot="ckpt-1")
    assert (snapshot.status, snapshot.disk_size_gb, dict(snapshot.labels)) == ("READY", 50, {"kiln-run": "r1"})
    assert snapshot.source_disk.endswith(f"/zones/{ZONE}/disks/ckpt")

    restored = create_disk(gce, compute_v1.Disk(name="restored", source_snapshot="global/snapshots/ckpt-1"))
    assert (restored.size_gb, restored.source_snapshot) == (50, snapshot.self_link)
    with pytest.raises(NotFound, match="snapshots/ckpt-2"):
        client(gce, compute_v1.DisksClient).insert_unary(project=PROJECT, zone=ZONE, disk_resource=compute_v1.Disk(
            name="other", source_snapshot="global/snapshots/ckpt-2"))
    with pytest.raises(NotFound, match="disks/nowhere"):
        snapshots.insert_unary(project=PROJECT, snapshot_resource=compute_v1.Snapshot(
            name="ckpt-3", source_disk=f"zones/{ZONE}/disks/nowhere"))


def test_a_resource_policy_in_use_cannot_be_deleted_and_compact_placement_refuses_e2(gce):
    policies = client(gce, compute_v1.ResourcePoliciesClient)
    op = policies.insert_unary(project=PROJECT, region=REGION, resource_policy_resource=compute_v1.ResourcePolicy(
        name="compact", group_placement_policy=compute_v1.ResourcePolicyGroupPlacementPolicy(
            collocation="COLLOCATED", vm_count=2)))
    assert client(gce, compute_v1.RegionOperationsClient).wait(project=PROJECT, region=REGION,
                                                               operation=op.name).status == DONE
    assert policies.get(project=PROJECT, region=REGION, resource_policy="compact").status == "READY"
    policy = f"projects/{PROJECT}/regions/{REGION}/resourcePolicies/compact"

    instances = client(gce, compute_v1.InstancesClient)
    with pytest.raises(BadRequest, match="Compact placement"):
        instances.insert_unary(project=PROJECT, zone=ZONE, instance_resource=instance(
            "small", "e2-standard-4", policies=(policy,)))
    with pytest.raises(NotFound, match="resourcePolicies/spread"):
        instances.insert_unary(project=PROJECT, zone=ZONE, instance_resource=instance(
            "big", "a2-highgpu-1g", policies=(policy.replace("compact", "spread"),)))
    create(gce, instance("big", "a2-highgpu-1g", policies=(policy,)))
    with pytest.raises(BadRequest, match="already being used by"):
        policies.delete_unary(project=PROJECT, region=REGION, resource_policy="compact")

    wait_zonal(gce, instances.delete_unary(project=PROJECT, zone=ZONE, instance="big"))
    op = policies.delete_unary(project=PROJECT, region=REGION, resource_policy="compact")
    client(gce, compute_v1.RegionOperationsClient).wait(project=PROJECT, region=REGION, operation=op.name)
    assert list(policies.list(project=PROJECT, region=REGION)) == []


@pytest.mark.parametrize(("reason", "code", "says"), [
    ("ZONE_RESOURCE_POOL_EXHAUSTED", 503, f"The zone 'projects/{PROJECT}/zones/{ZONE}' does not have enough"),
    ("QUOTA_EXCEEDED", 403, "Quota 'GPUS_ALL_REGIONS' exceeded. Limit: 0.0 globally."),
])
def test_an_operation_that_fails_is_done_with_its_error_and_makes_nothing(gce, reason, code, says):
    gce.fail("instances.insert", reason=reason, code=code, on="operation")
    instances = client(gce, compute_v1.InstancesClient)
    op = instances.insert_unary(project=PROJECT, zone=ZONE, instance_resource=instance("unlucky"))
    assert op.status == compute_v1.Operation.Status.RUNNING

    op = wait_zonal(gce, op)
    assert op.status == DONE and op.http_error_status_code == code
    assert [(e.code, e.message.startswith(says)) for e in op.error.errors] == [(reason, True)]
    with pytest.raises(NotFound):
        instances.get(project=PROJECT, zone=ZONE, instance="unlucky")
    assert list(client(gce, compute_v1.DisksClient).list(project=PROJECT, zone=ZONE)) == []
    assert create(gce, instance("unlucky")).status == "RUNNING"  # only the one call failed


def test_a_call_set_to_fail_raises_at_once_on_its_nth_call(gce):
    gce.fail("disks.insert", reason="rateLimitExceeded", code=403, message="Rate Limit Exceeded", nth=2)
    create_disk(gce, compute_v1.Disk(name="first", size_gb=10))
    with pytest.raises(Forbidden, match="Rate Limit Exceeded"):
        create_disk(gce, compute_v1.Disk(name="second", size_gb=10))
    assert create_disk(gce, compute_v1.Disk(name="third", size_gb=10)).status == "READY"
    assert [m for m, _ in gce.calls if m == "disks.insert"] == ["disks.insert"] * 3


def test_get_from_family_picks_the_newest_image_not_deprecated(gce):
    gce.add_image("kiln-gpu-2", family="kiln-gpu", labels={"kiln-version": "2"})
    gce.add_image("kiln-gpu-3", family="kiln-gpu", deprecated=True)
    gce.add_image("kiln-cpu-9", family="kiln-cpu")
    images = client(gce, compute_v1.ImagesClient)
    newest = images.get_from_family(project=PROJECT, family="kiln-gpu")
    assert (newest.name, dict(newest.labels)) == ("kiln-gpu-2", {"kiln-version": "2"})
    with pytest.raises(NotFound, match="family/kiln-tpu"):
        images.get_from_family(project=PROJECT, family="kiln-tpu")
    vm = create(gce, instance("vm"))  # the boot disk comes from the family's newest image
    boot = client(gce, compute_v1.DisksClient).get(project=PROJECT, zone=ZONE, disk="vm")
    assert boot.source_image == newest.self_link and vm.disks[0].source == boot.self_link


def test_set_labels_needs_the_current_fingerprint(gce):
    vm = create(gce, instance("vm", labels={"kiln-cluster": "a"}))
    instances = client(gce, compute_v1.InstancesClient)
    request = compute_v1.InstancesSetLabelsRequest(labels={"kiln-cluster": "b"}, label_fingerprint=vm.label_fingerprint)
    wait_zonal(gce, instances.set_labels_unary(project=PROJECT, zone=ZONE, instance="vm",
                                               instances_set_labels_request_resource=request))
    assert dict(instances.get(project=PROJECT, zone=ZONE, instance="vm").labels) == {"kiln-cluster": "b"}
    with pytest.raises(PreconditionFailed):  # the same, now stale, fingerprint again
        instances.set_labels_unary(project=PROJECT, zone=ZONE, instance="vm",
                                   instances_set_labels_request_resource=request)


def test_stop_releases_the_external_address_and_start_gives_another(gce):
    instances = client(gce, compute_v1.InstancesClient)
    first = create(gce, instance("vm")).network_interfaces[0]
    wait_zonal(gce, instances.stop_unary(project=PROJECT, zone=ZONE, instance="vm"))
    stopped = instances.get(project=PROJECT, zone=ZONE, instance="vm")
    assert stopped.status == "TERMINATED" and not stopped.network_interfaces[0].access_configs[0].nat_i_p
    wait_zonal(gce, instances.start_unary(project=PROJECT, zone=ZONE, instance="vm"))
    again = instances.get(project=PROJECT, zone=ZONE, instance="vm").network_interfaces[0]
    assert again.network_i_p == first.network_i_p
    assert again.access_configs[0].nat_i_p not in ("", first.access_configs[0].nat_i_p)


@pytest.mark.parametrize(("action", "status"), [("STOP", "TERMINATED"), ("DELETE", None)])
def test_preemption_stops_or_deletes_a_spot_instance_as_its_action_says(gce, action, status):
    spot = compute_v1.Scheduling(provisioning_model="SPOT", instance_termination_action=action,
                                 automatic_restart=False)
    create(gce, instance("spot", scheduling=spot))
    gce.preempt(ZONE, "spot")
    instances = client(gce, compute_v1.InstancesClient)
    if status:
        assert instances.get(project=PROJECT, zone=ZONE, instance="spot").status == status
    else:
        with pytest.raises(NotFound):
            instances.get(project=PROJECT, zone=ZONE, instance="spot")
    ops = client(gce, compute_v1.ZoneOperationsClient).list(project=PROJECT, zone=ZONE)
    assert "compute.instances.preempted" in [op.operation_type for op in ops]


def test_a_method_the_stand_in_does_not_serve_is_not_an_empty_success(gce):
    create(gce, instance("vm"))
    with pytest.raises(Exception, match="does not serve") as raised:
        client(gce, compute_v1.InstancesClient).reset_unary(project=PROJECT, zone=ZONE, instance="vm")
    assert raised.value.code == 501


def test_a_kept_disk_is_attached_to_a_new_instance_and_relabelled_with_the_current_fingerprint(gce):
    create_disk(gce, compute_v1.Disk(name="data", size_gb=20, labels={"kiln-cluster": "a"}))
    old = create(gce, instance("old", data_disks=("data",)))
    instances, disks = client(gce, compute_v1.InstancesClient), client(gce, compute_v1.DisksClient)
    wait_zonal(gce, instances.delete_unary(project=PROJECT, zone=ZONE, instance=str(old.id)))  # by id, as GCE takes
    new = create(gce, instance("new"))
    attach = compute_v1.AttachedDisk(source=f"projects/{PROJECT}/zones/{ZONE}/disks/data", device_name="kiln-data",
                                     auto_delete=False, mode="READ_WRITE")
    wait_zonal(gce, instances.attach_disk_unary(project=PROJECT, zone=ZONE, instance="new",
                                                attached_disk_resource=attach))
    got = instances.get(project=PROJECT, zone=ZONE, instance="new")
    assert [(d.device_name, d.source.rsplit("/", 1)[1]) for d in got.disks][1:] == [("kiln-data", "data")]
    disk = disks.get(project=PROJECT, zone=ZONE, disk="data")
    assert list(disk.users) == [new.self_link]

    relabel = compute_v1.ZoneSetLabelsRequest(labels={**disk.labels, "kiln-set": "s1"},
                                              label_fingerprint=disk.label_fingerprint)
    wait_zonal(gce, disks.set_labels_unary(project=PROJECT, zone=ZONE, resource="data",
                                           zone_set_labels_request_resource=relabel))
    assert dict(disks.get(project=PROJECT, zone=ZONE, disk="data").labels) == {"kiln-cluster": "a", "kiln-set": "s1"}
    with pytest.raises(PreconditionFailed):
        disks.set_labels_unary(project=PROJECT, zone=ZONE, resource="data", zone_set_labels_request_resource=relabel)


def test_the_billing_catalog_lists_skus_in_pages_and_currencies_and_refuses_what_the_api_refuses(gce):
    """services.skus.list through Google's own Cloud Billing client (REST): every page followed by its token, the
    prices in the currency asked (times its conversion rate), 404 for a service it does not know."""
    from google.cloud import billing_v1

    for index in range(3):
        gce.price_sku(f"N{index + 1} Instance Core running in Americas", [REGION], 0.03 + index / 100)
    catalog = billing_v1.CloudCatalogClient(credentials=AnonymousCredentials(), transport="rest",
                                            client_options={"api_endpoint": gce.endpoint})
    listed = list(catalog.list_skus(request={"parent": "services/6F81-5844-456A", "page_size": 2}))
    assert [sku.description for sku in listed] == [f"N{i} Instance Core running in Americas" for i in (1, 2, 3)]
    assert [call for call in gce.calls if call[0] == "services.skus.list"] == \
        [("services.skus.list", "/v1/services/6F81-5844-456A/skus")] * 2
    rate = listed[1].pricing_info[0].pricing_expression.tiered_rates[0].unit_price
    assert (rate.currency_code, rate.units, rate.nanos) == ("USD", 0, 40_000_000)
    [euro] = [sku for sku in catalog.list_skus(request={"parent": "services/6F81-5844-456A", "currency_code": "EUR"})
              if sku.description.startswith("N1 ")]
    assert euro.pricing_info[0].pricing_expression.tiered_rates[0].unit_price.nanos == round(0.03 * 0.92 * 1e9)
    with pytest.raises(NotFound):
        list(catalog.list_skus(request={"parent": "services/0000-0000-0000"}))

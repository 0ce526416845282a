"""The GCP provider's plan (bootstrap/providers/gcp/plan.py): what `kiln up --provider gcp` asks Compute Engine for,
checked for exact output without touching it; the bodies parse as the client library's own messages."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from bootstrap.errors import UsageError
from bootstrap.providers import common
from bootstrap.providers.gcp import plan

NOW = datetime(2026, 11, 26, 8, 0, tzinfo=UTC)


def request(**changes):
    given = {"zone": "us-central1-a", "ssh_cidr": "203.0.113.7/32", **changes}
    return plan.validate_request(given.pop("name", "c1"), given.pop("count", 2), given.pop("machine_type", None),
                                 **given)


def test_a_request_takes_the_current_gpu_default_and_labels_as_the_bake_writes_them():
    made = request(image_tags="kiln:fingerprint=AB12,kiln:tensorflow=2.21.0")
    assert (made.machine_type, made.region, made.family) == ("g2-standard-4", "us-central1", "g2")
    assert made.image_labels == (("kiln-fingerprint", "ab12"), ("kiln-tensorflow", "2-21-0"))
    assert plan.image_filter("gpu", made.image_labels) == (
        '(labels.kiln-profile = "gpu") AND (labels.kiln-fingerprint = "ab12") AND (labels.kiln-tensorflow = "2-21-0")')


@pytest.mark.parametrize(("changes", "said"), [
    ({"zone": None}, "give --zone (e.g. us-central1-a), or set CLOUDSDK_COMPUTE_ZONE"),
    ({"zone": "us-central1"}, "--zone 'us-central1' is not a Compute Engine zone"),
    ({"machine_type": "p5.48xlarge"}, "--instance-type 'p5.48xlarge' is not a Compute Engine machine type"),
    ({"source_image": "Bad_Image"}, "--source-image 'Bad_Image': give an image's name"),
    ({"ssh_cidr": "0.0.0.0/0"}, "too broad"),
    ({"ssh_cidr": None}, "give --ssh-cidr"),
    ({"count": 0}, "--count 0: a cluster needs at least 1 instance"),
    ({"name": "Big"}, "cluster name 'Big'"),
    ({"ttl_hours": 0}, "--ttl-hours 0: give more than 0"),
    ({"volume_gb": "lots"}, "--volume 'lots'"),
    ({"max_price": 1}, "--max-price applies to Spot VMs only: add --spot"),
    ({"spot": True, "max_price": "inf"}, "--max-price 'inf' is not a positive price"),
])
def test_bad_input_is_one_line_naming_it(changes, said):
    with pytest.raises(UsageError, match=said.replace("(", r"\(").replace(")", r"\)")):
        request(**changes)


def test_a_max_price_is_held_by_a_look_before_anything_is_made_as_the_dry_run_says():
    made = request(spot=True, max_price="2.5")
    assert made.max_price == 2.5
    lines = plan.dry_run(made, key="/k", place={"project": "p"}, now=NOW)
    assert lines[0] == ("cluster c1: first the Spot price of g2-standard-4 in us-central1 from the Cloud Billing "
                        "Catalog: above --max-price 2.5 USD an hour (or not read), nothing is made (GCE takes no bid)")
    assert not plan.dry_run(request(spot=True), key="/k", place={"project": "p"}, now=NOW)[0].startswith(
        "cluster c1: first the Spot price")


def test_labels_carry_the_cluster_owner_and_expiry_as_label_values():
    labels = plan.cluster_labels("c1", "Ops.Team@example.com", NOW, 24)
    assert labels == {"kiln-cluster": "c1", "kiln-owner": "ops-team-example-com",
                      "kiln-expires": str(int(NOW.timestamp()) + 86400)}
    assert plan.expiry(labels) == datetime(2026, 11, 27, 8, 0, tzinfo=UTC)
    assert plan.labels_of_description(plan.description(labels)) == labels
    assert plan.labels_of_description("someone else's rule") == {}


def test_the_firewall_admits_the_cluster_to_itself_and_ssh_from_the_operator_only():
    internal, ssh = plan.firewall_bodies(request(), {"kiln-cluster": "c1"})
    assert internal["sourceTags"] == internal["targetTags"] == ["kiln-c1"] and "sourceRanges" not in internal
    assert ssh["sourceRanges"] == ["203.0.113.7/32"] and ssh["allowed"] == [{"IPProtocol": "tcp", "ports": ["22"]}]
    assert "sourceTags" not in ssh and ssh["targetTags"] == ["kiln-c1"]


def test_an_instance_is_shielded_keyless_and_spot_deleted_when_preempted():
    made = request(spot=True, volume_gb=50)
    body = plan.instance_body(made, index=1, suffix="ab12", image="projects/p/global/images/kiln-gpu",
                              public_key="ssh-ed25519 AAAAkey", labels={"kiln-cluster": "c1"}, project="proj-1",
                              data_disk="kiln-c1-data-1")
    assert body["name"] == "kiln-c1-1-ab12" and body["labels"] == {"kiln-cluster": "c1", "kiln-node": "1"}
    assert body["scheduling"] == {"onHostMaintenance": "TERMINATE", "automaticRestart": False,
                                  "provisioningModel": "SPOT", "instanceTerminationAction": "DELETE"}
    assert body["shieldedInstanceConfig"]["enableVtpm"] and body["serviceAccounts"] == []
    items = {item["key"]: item["value"] for item in body["metadata"]["items"]}
    assert items["ssh-keys"] == "ubuntu:ssh-ed25519 AAAAkey kiln-c1"
    assert items["block-project-ssh-keys"] == items["enable-guest-attributes"] == "TRUE"
    assert common.DATA_SETTINGS in items["user-data"]
    assert body["disks"][1]["source"] == "projects/proj-1/zones/us-central1-a/disks/kiln-c1-data-1"
    assert body["resourcePolicies"] == ["projects/proj-1/regions/us-central1/resourcePolicies/kiln-c1-compact"]
    compute_v1 = pytest.importorskip("google.cloud.compute_v1")
    parsed = compute_v1.Instance.from_json(json.dumps(body), ignore_unknown_fields=False)
    assert parsed.scheduling.provisioning_model == "SPOT"


def test_accelerator_families_stop_for_maintenance_and_the_newest_take_hyperdisk_only():
    for machine_type, disk in (("g2-standard-4", "pd-balanced"), ("a3-highgpu-8g", "pd-balanced"),
                               ("a3-ultragpu-8g", "hyperdisk-balanced"), ("a4-highgpu-8g", "hyperdisk-balanced"),
                               ("a4x-highgpu-4g", "hyperdisk-balanced"), ("g4-standard-48", "hyperdisk-balanced")):
        made = request(machine_type=machine_type, volume_gb=10)
        assert plan.scheduling(made)["onHostMaintenance"] == "TERMINATE", machine_type
        body = plan.instance_body(made, index=0, suffix="aa", image="i", public_key="k", labels={}, project="p-123")
        assert body["disks"][0]["initializeParams"]["diskType"].endswith(f"/diskTypes/{disk}"), machine_type
        assert plan.disk_body(made, index=0, labels={})["type"].endswith(f"/diskTypes/{disk}")


def test_placement_and_maintenance_follow_the_machine_family():
    e2 = request(machine_type="e2-standard-4")
    assert not plan.takes_compact_placement(e2) and plan.scheduling(e2)["onHostMaintenance"] == "MIGRATE"
    assert not plan.takes_compact_placement(request(count=1))
    a3 = request(machine_type="a3-highgpu-8g")
    assert plan.takes_compact_placement(a3) and plan.scheduling(a3) == {
        "onHostMaintenance": "TERMINATE", "automaticRestart": True, "provisioningModel": "STANDARD"}


def test_hosts_come_in_node_order_at_their_external_address():
    instances = [{"name": "kiln-c1-1-aa", "labels": {"kiln-node": "1"},
                  "networkInterfaces": [{"networkIP": "10.128.0.3", "accessConfigs": [{"natIP": "203.0.113.9"}]}]},
                 {"name": "kiln-c1-0-bb", "labels": {"kiln-node": "0"},
                  "networkInterfaces": [{"networkIP": "10.1.0.2"}]}]
    assert [h.address for h in plan.hosts_from_instances(instances, "ubuntu")] == ["10.1.0.2", "203.0.113.9"]


def test_guest_attributes_give_the_host_keys_the_agent_published():
    attributes = {"queryValue": {"items": [
        {"namespace": "hostkeys", "key": "ssh-ed25519", "value": "AAAAC3Nza"},
        {"namespace": "hostkeys", "key": "ssh-dss", "value": "AAAAB3"},
        {"namespace": "other", "key": "ssh-rsa", "value": "AAAAB3Nza"}]}}
    assert plan.guest_attribute_keys(attributes) == ["ssh-ed25519 AAAAC3Nza"]
    assert plan.guest_attribute_keys({}) == []


def test_a_snapshot_keeps_the_node_and_expires_on_its_own_clock_and_a_kept_disk_completes_its_set():
    disk = plan.Resource("disk", "kiln-c1-data-0", "us-central1-a",
                         {"kiln-cluster": "c1", "kiln-owner": "me", "kiln-expires": "1", "kiln-data": "0"})
    body = plan.snapshot_body(disk, "proj-1", NOW, 30)
    assert body["name"] == "kiln-c1-data-0-20261126t080000z"
    assert body["sourceDisk"] == "projects/proj-1/zones/us-central1-a/disks/kiln-c1-data-0"
    assert body["labels"] == {"kiln-cluster": "c1", "kiln-owner": "me", "kiln-data": "0",
                              "kiln-snapshot-set": "20261126t080000z",
                              "kiln-expires": str(int(NOW.timestamp()) + 30 * 86400)}
    missed = plan.Resource("disk", disk.name, disk.scope, {**disk.labels, "kiln-snapshot-set": "20261120t000000z"})
    assert plan.snapshot_body(missed, "proj-1", NOW, 30)["labels"]["kiln-snapshot-set"] == "20261120t000000z"


def test_the_newest_complete_snapshot_set_is_restored():
    def snap(name, index, taken, status="READY"):
        return plan.snapshot_of({"name": name, "diskSizeGb": "50", "status": status, "labels": {
            "kiln-cluster": "c1", "kiln-data": str(index), "kiln-snapshot-set": taken}})

    older = [snap("a0", 0, "20261101t000000z"), snap("a1", 1, "20261101t000000z")]
    broken = [snap("b0", 0, "20261120t000000z"), snap("b1", 1, "20261120t000000z", "CREATING")]
    chosen = common.latest_snapshot_set(older + broken, "READY")
    assert {i: s.id for i, s in chosen.items()} == {0: "a0", 1: "a1"}
    body = plan.disk_body(request(volume_gb=20), index=0, labels={}, snapshot=chosen[0])
    assert body["sourceSnapshot"] == "global/snapshots/a0" and body["sizeGb"] == "50"


def test_summaries_and_expiry_by_cluster():
    labels = plan.cluster_labels("c1", "me", NOW, 1)
    resources = [plan.Resource("instance", "kiln-c1-0-aa", "us-central1-a", labels, "RUNNING"),
                 plan.Resource("firewall", "kiln-c1-ssh", "", labels),
                 plan.Resource("instance", "kiln-c2-0-bb", "us-central1-a", plan.cluster_labels("c2", "me", NOW, 48))]
    [one, two] = plan.summarize(resources)
    assert (one.name, one.resources, one.instances) == ("c1", 2, ("kiln-c1-0-aa (RUNNING)",))
    assert [s.name for s in plan.expired_clusters(resources, datetime(2026, 11, 26, 10, 0, tzinfo=UTC))] == ["c1"]
    assert plan.teardown_order(resources)[0].kind == "instance" and two.name == "c2"

"""Exact output of the pure AWS planning in bootstrap.providers.aws.plan."""

from datetime import UTC, datetime

import pytest

from bootstrap.errors import UsageError
from bootstrap.hosts import Host
from bootstrap.providers.aws import plan
from kiln import sshwait as reach

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
TAGS = {"kiln:cluster": "demo", "kiln:owner": "arn:aws:iam::1:user/me", "kiln:expires": "2025-03-02T12:00:00Z",
        "Name": "kiln-demo"}
TAG_LIST = [{"Key": "kiln:cluster", "Value": "demo"}, {"Key": "kiln:owner", "Value": "arn:aws:iam::1:user/me"},
            {"Key": "kiln:expires", "Value": "2025-03-02T12:00:00Z"}, {"Key": "Name", "Value": "kiln-demo"}]


def request(**overrides):
    arguments = {"name": "demo", "count": 2, "instance_type": "p3.2xlarge", "ssh_cidr": "203.0.113.7", **overrides}
    return plan.validate_request(arguments.pop("name"), arguments.pop("count"), arguments.pop("instance_type"),
                                 **arguments)


def test_valid_request_is_normalised():
    assert request(spot=True, max_price=1.5, ttl_hours="6") == plan.Request(
        name="demo", count=2, instance_type="p3.2xlarge", ssh_cidr="203.0.113.7/32", ami=None, image_profile="gpu",
        spot=True, max_price="1.5", user="ubuntu", ttl_hours=6.0)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"name": "Demo_1"}, "cluster name 'Demo_1': use 1 to 32 lowercase letters, digits and '-'"),
    ({"name": "x" * 33}, f"cluster name '{'x' * 33}': use 1 to 32 lowercase letters, digits and '-'"),
    ({"count": 0}, "--count 0: a cluster needs at least 1 instance"),
    ({"count": "two"}, "--count 'two' is not a whole number"),
    ({"instance_type": "p3"}, "--instance-type 'p3' is not an EC2 instance type like g6.xlarge"),
    ({"instance_type": "P3.2XLARGE"}, "--instance-type 'P3.2XLARGE' is not an EC2 instance type like g6.xlarge"),
    ({"ami": "ubuntu"}, "--ami 'ubuntu' is not an AMI id like ami-0123456789abcdef0"),
    ({"max_price": "1"}, "--max-price applies to spot instances only: add --spot"),
    ({"spot": True, "max_price": "-1"}, "--max-price '-1' is not a positive price in USD per hour"),
    ({"spot": True, "max_price": "nan"}, "--max-price 'nan' is not a positive price in USD per hour"),
    ({"spot": True, "max_price": "inf"}, "--max-price 'inf' is not a positive price in USD per hour"),
    ({"ttl_hours": 0}, "--ttl-hours 0: give more than 0 and at most 336"),
    ({"ssh_cidr": None}, "give --ssh-cidr with the address you connect from (e.g. 203.0.113.7/32); "
                         "kiln never opens SSH to 0.0.0.0/0"),
    ({"ssh_cidr": "0.0.0.0/0"}, "--ssh-cidr '0.0.0.0/0' is too broad: at least /8 for IPv4; "
                                "kiln never opens SSH to the whole Internet"),
    ({"ssh_cidr": "::/0"}, "--ssh-cidr '::/0' is too broad: at least /32 for IPv6; "
                           "kiln never opens SSH to the whole Internet"),
    ({"ssh_cidr": "my laptop"}, "--ssh-cidr 'my laptop' is not an IPv4 or IPv6 address or CIDR"),
])
def test_bad_input_is_named_in_one_line(overrides, message):
    with pytest.raises(UsageError) as raised:
        request(**overrides)
    assert str(raised.value) == message


def test_tags_carry_cluster_owner_and_expiry():
    assert plan.cluster_tags("demo", "arn:aws:iam::1:user/me", NOW, 24) == TAGS


def test_security_group_admits_itself_and_ssh_from_the_operator_only():
    assert plan.ingress_permissions("sg-1", "203.0.113.7/32") == [
        {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": "sg-1", "Description": "kiln: cluster members"}]},
        {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22,
         "IpRanges": [{"CidrIp": "203.0.113.7/32", "Description": "kiln: SSH from the operator"}]},
    ]
    assert plan.ingress_permissions("sg-1", "2001:db8::/64")[1]["Ipv6Ranges"] == [
        {"CidrIpv6": "2001:db8::/64", "Description": "kiln: SSH from the operator"}]


def test_run_instances_request_is_exact():
    assert plan.run_instances_request(request(spot=True, max_price="0.9"), ami="ami-1", group_id="sg-1",
                                      tags=TAGS) == {
        "ImageId": "ami-1", "InstanceType": "p3.2xlarge", "MinCount": 2, "MaxCount": 2, "KeyName": "kiln-demo",
        "SecurityGroupIds": ["sg-1"], "Placement": {"GroupName": "kiln-demo"},
        "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled", "HttpPutResponseHopLimit": 2},
        "BlockDeviceMappings": [{"DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": 100, "VolumeType": "gp3",
                                                                    "Encrypted": True, "DeleteOnTermination": True}}],
        "TagSpecifications": [{"ResourceType": kind, "Tags": TAG_LIST}
                              for kind in ("instance", "volume", "network-interface")],
        "InstanceMarketOptions": {"MarketType": "spot", "SpotOptions": {
            "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate", "MaxPrice": "0.9"}},
    }
    assert "InstanceMarketOptions" not in plan.run_instances_request(request(), ami="ami-1", group_id="sg-1",
                                                                     tags=TAGS)


def test_plan_tags_every_resource_and_names_the_unknown_group():
    steps = plan.plan_cluster(request(), tags=TAGS, ami="ami-1", public_key="ssh-ed25519 AAAA kiln-demo")
    assert [name for name, _ in steps.steps()] == ["ImportKeyPair", "CreateSecurityGroup",
                                                    "AuthorizeSecurityGroupIngress", "CreatePlacementGroup",
                                                    "RunInstances"]
    assert steps.import_key_pair == {"KeyName": "kiln-demo", "PublicKeyMaterial": "ssh-ed25519 AAAA kiln-demo",
                                     "TagSpecifications": [{"ResourceType": "key-pair", "Tags": TAG_LIST}]}
    assert steps.create_placement_group == {"GroupName": "kiln-demo", "Strategy": "cluster", "TagSpecifications": [
        {"ResourceType": "placement-group", "Tags": TAG_LIST}]}
    assert steps.create_security_group["TagSpecifications"] == [{"ResourceType": "security-group", "Tags": TAG_LIST}]
    assert steps.authorize_ingress["GroupId"] == "<id of security group kiln-demo>"
    assert steps.run_instances["SecurityGroupIds"] == ["<id of security group kiln-demo>"]


def test_newest_image_wins():
    images = [{"ImageId": "ami-a", "CreationDate": "2025-01-01T00:00:00.000Z"},
              {"ImageId": "ami-b", "CreationDate": "2025-02-01T00:00:00.000Z"},
              {"ImageId": "ami-c", "CreationDate": "2024-12-01T00:00:00.000Z"}]
    assert plan.newest_image(images)["ImageId"] == "ami-b"
    assert plan.newest_image([]) is None


def test_sweep_picks_clusters_past_their_earliest_expiry():
    def resource(kind, cluster, expires):
        return plan.Resource(kind, f"{kind}-{cluster}", {"kiln:cluster": cluster, "kiln:expires": expires})
    resources = [resource("instance", "old", "2025-03-01T11:00:00Z"),
                 resource("key-pair", "old", "2025-03-09T00:00:00Z"),
                 resource("instance", "new", "2025-03-01T13:00:00Z"),
                 resource("key-pair", "odd", "whenever")]
    assert [s.name for s in plan.expired_clusters(resources, NOW)] == ["old"]
    assert [(s.name, s.resources) for s in plan.summarize(resources)] == [("new", 1), ("odd", 1), ("old", 2)]


def test_teardown_removes_instances_first_and_placement_group_last():
    resources = [plan.Resource(kind, kind, {}) for kind in reversed(plan.TEARDOWN_ORDER)]
    assert [r.kind for r in plan.teardown_order(resources)] == list(plan.TEARDOWN_ORDER)


def test_hosts_prefer_public_addresses_in_launch_order():
    instances = [{"InstanceId": "i-2", "AmiLaunchIndex": 1, "PrivateIpAddress": "10.0.0.2"},
                 {"InstanceId": "i-1", "AmiLaunchIndex": 0, "PrivateIpAddress": "10.0.0.1",
                  "PublicIpAddress": "198.51.100.1"}]
    assert plan.hosts_from_instances(instances, "ubuntu") == [Host("198.51.100.1", user="ubuntu"),
                                                              Host("10.0.0.2", user="ubuntu")]


def test_ssh_banner_is_found_after_other_lines():
    assert reach.ssh_banner(b"SSH-2.0-OpenSSH_9.2\r\n") == "SSH-2.0-OpenSSH_9.2"
    assert reach.ssh_banner(b"hello\r\nSSH-2.0-OpenSSH_8.9p1 Ubuntu-3\r\n") == "SSH-2.0-OpenSSH_8.9p1 Ubuntu-3"
    assert reach.ssh_banner(b"HTTP/1.1 400 Bad Request\r\n") is None
    assert reach.ssh_banner(b"") is None


@pytest.mark.parametrize(("given", "expected"), [(300, 300.0), ("0", 0.0), ("2.5", 2.5)])
def test_ssh_wait_is_seconds(given, expected):
    assert plan.validate_ssh_wait(given) == expected


@pytest.mark.parametrize("given", ["soon", -1, 3601, "nan"])
def test_bad_ssh_wait_is_refused(given):
    with pytest.raises(UsageError, match="^--ssh-wait "):
        plan.validate_ssh_wait(given)


def test_instances_that_never_answer_are_named():
    assert plan.no_answer_error(["i-1 (198.51.100.1)", "i-2 (10.0.0.2)"], 300) == \
        "no SSH answer within 300s from 2 instance(s): i-1 (198.51.100.1), i-2 (10.0.0.2)"


def test_first_contact_note_names_the_hosts_and_the_flag():
    from bootstrap.providers import provision

    assert provision.first_contact_note("demo", ["10.0.0.2"], "the console output") == (
        "host keys of 10.0.0.2 were not in the console output: recorded as first-contact; kiln mesh "
        "--cluster demo --accept-new-host-keys (or kiln train --cluster demo --accept-new-host-keys) records "
        "them on first contact")


def test_image_tags_narrow_the_ami_lookup():
    request = plan.validate_request("exp1", 1, "p3.2xlarge", ssh_cidr="203.0.113.7/32",
                                    image_tags="kiln:fingerprint=ab12, kiln:tensorflow=2.18.1")
    assert request.image_tags == (("kiln:fingerprint", "ab12"), ("kiln:tensorflow", "2.18.1"))
    assert plan.image_filters("gpu", request.image_tags) == [
        {"Name": "tag:kiln:profile", "Values": ["gpu"]},
        {"Name": "tag:kiln:fingerprint", "Values": ["ab12"]},
        {"Name": "tag:kiln:tensorflow", "Values": ["2.18.1"]},
        {"Name": "state", "Values": ["available"]},
    ]
    with pytest.raises(UsageError, match="--image-tags 'kiln:fingerprint': write KEY=VALUE"):
        plan.validate_request("exp1", 1, "p3.2xlarge", ssh_cidr="203.0.113.7/32", image_tags="kiln:fingerprint")


@pytest.mark.parametrize(("given", "expected"), [(None, None), ("100", 100), (1, 1), (16384, 16384)])
def test_volume_size_is_whole_gib(given, expected):
    assert request(volume_gib=given).volume_gib == expected


@pytest.mark.parametrize(("given", "message"), [
    ("big", "--volume 'big': give the data volume's size in GiB, e.g. 100"),
    ("1.5", "--volume '1.5': give the data volume's size in GiB, e.g. 100"),
    (0, "--volume 0: give 1 to 16384 GiB"),
    (20000, "--volume 20000: give 1 to 16384 GiB"),
])
def test_bad_volume_size_is_one_clear_error(given, message):
    with pytest.raises(UsageError, match=f"^{message}$".replace("(", r"\(").replace(")", r"\)")):
        request(volume_gib=given)


def test_a_data_volume_puts_its_settings_in_the_user_data():
    with_volume = plan.run_instances_request(request(volume_gib=50, user="ec2-user"), ami="ami-1", group_id="sg-1",
                                             tags=TAGS)
    assert with_volume["UserData"] == (
        '#cloud-config\n{"write_files": [{"content": "{\\"label\\": \\"kiln-data\\", \\"mount\\": \\"/data\\", '
        '\\"owner\\": \\"ec2-user\\", \\"size_bytes\\": 53687091200}\\n", "owner": "root:root", '
        '"path": "/etc/kiln/data-volume.json", "permissions": "0644"}]}\n')
    assert "UserData" not in plan.run_instances_request(request(), ami="ami-1", group_id="sg-1", tags=TAGS)


def snapshot(snapshot_id, index, taken_at, state="completed", size=20, expires="2025-03-08T12:00:00Z",
             cluster="demo"):
    return plan.snapshot_of({"SnapshotId": snapshot_id, "VolumeSize": size, "State": state, "Tags": [
        {"Key": "kiln:cluster", "Value": cluster}, {"Key": "kiln:data", "Value": str(index)},
        {"Key": "kiln:snapshot-set", "Value": taken_at}, {"Key": "kiln:expires", "Value": expires}]})


def test_a_data_volume_is_encrypted_tagged_with_its_node_and_never_smaller_than_its_snapshot():
    assert plan.data_volume_request(zone="us-east-1a", size_gib=10, tags=TAGS, index=2) == {
        "AvailabilityZone": "us-east-1a", "Size": 10, "VolumeType": "gp3", "Encrypted": True,
        "TagSpecifications": [{"ResourceType": "volume", "Tags": [*TAG_LIST, {"Key": "kiln:data", "Value": "2"}]}]}
    restored = plan.data_volume_request(zone="us-east-1a", size_gib=10, tags=TAGS, index=0,
                                        snapshot=snapshot("snap-1", 0, "2025-03-01T12:00:00Z", size=30))
    assert (restored["Size"], restored["SnapshotId"]) == (30, "snap-1")


def test_a_snapshot_keeps_the_cluster_and_owner_and_expires_on_its_own_clock():
    volume_tags = {**TAGS, "kiln:data": "1"}
    tags = plan.snapshot_tags(volume_tags, NOW, 7)
    assert tags == {"kiln:cluster": "demo", "kiln:owner": "arn:aws:iam::1:user/me", "Name": "kiln-demo",
                    "kiln:expires": "2025-03-08T12:00:00Z"}
    made = plan.snapshot_request(plan.Resource("volume", "vol-1", volume_tags), tags, "2025-03-01T12:00:00Z")
    assert made == {"VolumeId": "vol-1", "Description": "kiln cluster demo node 1 data, 2025-03-01T12:00:00Z",
                    "TagSpecifications": [{"ResourceType": "snapshot", "Tags": [
                        {"Key": "kiln:cluster", "Value": "demo"}, {"Key": "kiln:owner",
                                                                   "Value": "arn:aws:iam::1:user/me"},
                        {"Key": "Name", "Value": "kiln-demo-data-1"},
                        {"Key": "kiln:expires", "Value": "2025-03-08T12:00:00Z"},
                        {"Key": "kiln:data", "Value": "1"},
                        {"Key": "kiln:snapshot-set", "Value": "2025-03-01T12:00:00Z"}]}]}


def test_a_retry_snapshots_a_kept_volume_into_the_set_it_missed():
    kept = plan.Resource("volume", "vol-0", {**TAGS, "kiln:data": "0", "kiln:snapshot-set": "2025-03-01T11:00:00Z"})
    made = plan.snapshot_request(kept, plan.snapshot_tags(kept.tags, NOW, 7), "2025-03-01T12:00:00Z")
    assert made["Description"] == "kiln cluster demo node 0 data, 2025-03-01T11:00:00Z"
    assert {"Key": "kiln:snapshot-set", "Value": "2025-03-01T11:00:00Z"} in made["TagSpecifications"][0]["Tags"]


def test_the_newest_complete_set_of_snapshots_is_restored():
    older = [snapshot("snap-a0", 0, "2025-03-01T10:00:00Z"), snapshot("snap-a1", 1, "2025-03-01T10:00:00Z")]
    newer = [snapshot("snap-b1", 1, "2025-03-01T11:00:00Z"), snapshot("snap-b0", 0, "2025-03-01T11:00:00Z")]
    broken = [snapshot("snap-c0", 0, "2025-03-01T12:00:00Z"),
              snapshot("snap-c1", 1, "2025-03-01T12:00:00Z", state="error")]
    assert {i: s.id for i, s in plan.latest_snapshot_set(older + newer + broken).items()} == {
        0: "snap-b0", 1: "snap-b1"}
    assert plan.latest_snapshot_set(broken) == {}
    assert plan.latest_snapshot_set([]) == {}


def test_the_restore_note_names_fresh_and_unused_nodes():
    restored = {0: snapshot("snap-0", 0, "T"), 1: snapshot("snap-1", 1, "T")}
    assert plan.restore_note("demo", 3, restored) == (
        "cluster demo: data volumes restored from the snapshots of T (node 0: snap-0, node 1: snap-1); "
        "node(s) 2 had no snapshot and get an empty volume")
    assert plan.restore_note("demo", 1, restored) == (
        "cluster demo: data volumes restored from the snapshots of T (node 0: snap-0); the snapshot(s) of node(s) 1 "
        "are not used (fewer nodes now)")
    assert plan.restore_note("demo", 2, {}) == "cluster demo: no snapshot of its data volumes: each node gets an " \
                                               "empty volume"


def test_expired_snapshots_in_cluster_time_and_node_order():
    kept = snapshot("snap-k", 0, "T1", expires="2025-03-01T12:00:01Z")
    gone = [snapshot("snap-z", 1, "T1", expires="2025-03-01T12:00:00Z"),
            snapshot("snap-y", 0, "T1", expires="2025-02-01T00:00:00Z"),
            snapshot("snap-x", 0, "T0", expires="2025-02-01T00:00:00Z", cluster="alpha")]
    assert [s.id for s in plan.expired_snapshots([kept, *gone], NOW)] == ["snap-x", "snap-y", "snap-z"]
    assert not snapshot("snap-n", 0, "T", expires="").expired(NOW)


@pytest.mark.parametrize(("instance_type", "family"), [
    ("p5.48xlarge", "P"), ("p4de.24xlarge", "P"), ("p6-b200.48xlarge", "P"), ("g6e.xlarge", "G"),
    ("gr6.4xlarge", "G"), ("vt1.3xlarge", "G"), ("c7gn.large", "Standard"), ("im4gn.large", "Standard"),
    ("m7i-flex.large", "Standard"), ("trn1.32xlarge", None), ("inf2.xlarge", None), ("hpc7a.96xlarge", None),
    ("dl1.24xlarge", None), ("x2idn.32xlarge", None), ("u-6tb1.metal", None), ("mac2.metal", None)])
def test_an_instance_type_counts_against_its_familys_vcpu_quota(instance_type, family):
    assert plan.quota_family(instance_type) == family


def test_every_checked_family_has_an_on_demand_and_a_spot_quota_each_its_own():
    assert {family for family, _ in plan.VCPU_QUOTAS} == {"P", "G", "Standard"}
    assert all((family, spot) in plan.VCPU_QUOTAS for family in ("P", "G", "Standard") for spot in (False, True))
    codes = [quota.code for quota in plan.VCPU_QUOTAS.values()]
    assert len(set(codes)) == len(codes) and all(code.startswith("L-") for code in codes)


def test_vcpus_in_use_are_the_familys_live_machines_on_its_side_of_spot():
    instances = [{"InstanceType": "p5.48xlarge", "State": {"Name": "running"}},
                 {"InstanceType": "p4d.24xlarge", "State": {"Name": "pending"}},
                 {"InstanceType": "p5.48xlarge", "State": {"Name": "running"}, "InstanceLifecycle": "spot"},
                 {"InstanceType": "p5.48xlarge", "State": {"Name": "stopped"}},
                 {"InstanceType": "g6.xlarge", "State": {"Name": "running"}}]
    vcpus = {"p5.48xlarge": 192, "p4d.24xlarge": 96, "g6.xlarge": 4}
    assert plan.vcpus_in_use(instances, vcpus, "P", spot=False) == 288
    assert plan.vcpus_in_use(instances, vcpus, "P", spot=True) == 192
    assert plan.vcpus_in_use(instances, vcpus, "G", spot=False) == 4


def test_a_launch_over_the_quota_is_named_with_its_numbers_and_one_that_fits_is_not():
    quota = plan.VCPU_QUOTAS[("P", False)]
    assert plan.vcpus_short(quota, 384.0, 0, 384, 2, "p5.48xlarge") is None
    assert plan.vcpus_short(quota, 192.0, 0, 384, 2, "p5.48xlarge") == (
        "2 p5.48xlarge need 384 vCPUs of the quota 'Running On-Demand P instances' (L-417A185B), which is 192 here "
        "with 0 in use: ask Service Quotas for more")
    assert plan.vcpus_short(quota, 384.0, 1, 384, 2, "p5.48xlarge") is not None


def test_a_queue_controller_is_one_on_demand_instance_holding_the_queues_profile_outside_the_placement_group():
    asked = request(count=4, spot=True, max_price="2.5", volume_gib=50, idle_minutes=30)
    tags = {plan.TAG_CLUSTER: "exp1", "Name": "kiln-exp1"}
    params = plan.controller_request(asked, ami="ami-0123456789abcdef0", group_id="sg-1", tags=tags,
                                     profile_name="kiln-exp1-us-east-1-controller", client_token="t")
    assert params["MinCount"] == params["MaxCount"] == 1 and params["InstanceType"] == plan.CONTROLLER_TYPE
    assert params["IamInstanceProfile"] == {"Name": "kiln-exp1-us-east-1-controller"}
    assert "Placement" not in params and "InstanceMarketOptions" not in params and "UserData" not in params
    assert "InstanceInitiatedShutdownBehavior" not in params
    assert params["MetadataOptions"] == {"HttpTokens": "required", "HttpEndpoint": "enabled",
                                         "HttpPutResponseHopLimit": 1}
    assert params["SecurityGroupIds"] == ["sg-1"] and params["KeyName"] == "kiln-demo"
    assert params["BlockDeviceMappings"][0]["Ebs"]["Encrypted"] is True
    for spec in params["TagSpecifications"]:
        assert plan.tags_of(spec) == {**tags, plan.TAG_ROLE: plan.CONTROLLER}
    assert plan.controller_request(asked, ami="ami-0123456789abcdef0", group_id="sg-1", tags=tags,
                                   profile_name="p", instance_type="c7i.xlarge")["InstanceType"] == "c7i.xlarge"


def test_a_profile_ec2_cannot_see_yet_is_told_from_other_refusals():
    assert plan.profile_not_seen_yet("InvalidParameterValue", "Value (kiln-q-us-east-1-controller) for parameter "
                                     "iamInstanceProfile.name is invalid. Invalid IAM Instance Profile name")
    assert not plan.profile_not_seen_yet("InvalidParameterValue", "Invalid value 'x' for instanceType")
    assert not plan.profile_not_seen_yet("UnauthorizedOperation", "iam instance profile: not authorized")


def test_a_queues_cluster_launches_its_first_machines_alone_or_none():
    queue = plan.validate_request("q", 4, "g5.xlarge", ssh_cidr="203.0.113.7/32", start=0)
    assert (queue.count, queue.start, plan.launched_now(queue)) == (4, 0, None)
    some = plan.validate_request("q", 4, "g5.xlarge", ssh_cidr="203.0.113.7/32", start=1)
    assert plan.launched_now(some).count == 1 and plan.launched_now(some).instance_type == "g5.xlarge"
    whole = plan.validate_request("q", 4, "g5.xlarge", ssh_cidr="203.0.113.7/32")
    assert plan.launched_now(whole) == whole


@pytest.mark.parametrize("start", [-1, 5, True, "1", 1.5])
def test_a_queues_first_machines_are_a_whole_number_up_to_its_most(start):
    with pytest.raises(UsageError, match=r"a queue's first nodes .*: a whole number from 0 to 4"):
        plan.validate_request("q", 4, "g5.xlarge", ssh_cidr="203.0.113.7/32", start=start)

"""Exact output of the pure EFA planning in bootstrap.providers.aws.plan: interfaces per network card, the subnet,
the security group's egress rule, the Elastic IPs."""

import pytest

from bootstrap.providers import catalog
from bootstrap.providers.aws import efa as efa_plan
from bootstrap.providers.aws import plan

TAGS = {"kiln:cluster": "demo", "kiln:owner": "arn:aws:iam::1:user/me", "kiln:expires": "2025-03-02T12:00:00Z",
        "Name": "kiln-demo"}
TAG_LIST = [{"Key": "kiln:cluster", "Value": "demo"}, {"Key": "kiln:owner", "Value": "arn:aws:iam::1:user/me"},
            {"Key": "kiln:expires", "Value": "2025-03-02T12:00:00Z"}, {"Key": "Name", "Value": "kiln-demo"}]
EFA_TYPES = ["interface", "efa", "efa-only"]


def network_info(cards: int, efa: bool = True, interface_types=EFA_TYPES) -> dict:
    """DescribeInstanceTypes' NetworkInfo, shaped as EC2 (and moto, which carries EC2's data) answers it."""
    info = {"NetworkPerformance": "3200 Gigabit" if efa else "Up to 25 Gigabit", "MaximumNetworkInterfaces": 2 * cards,
            "MaximumNetworkCards": cards, "DefaultNetworkCardIndex": 0,
            "NetworkCards": [{"NetworkCardIndex": index, "NetworkPerformance": "100 Gigabit",
                              "MaximumNetworkInterfaces": 2, "BaselineBandwidthInGbps": 100.0,
                              "PeakBandwidthInGbps": 100.0, "DefaultEnaQueueCountPerInterface": 32,
                              "InterfaceTypes": list(interface_types)} for index in range(cards)],
            "Ipv4AddressesPerInterface": 50, "Ipv6AddressesPerInterface": 50, "Ipv6Supported": True,
            "EnaSupport": "required", "EfaSupported": efa, "EncryptionInTransitSupported": True,
            "EnaSrdSupported": efa}
    if efa:
        info["EfaInfo"] = {"MaximumEfaInterfaces": cards}
    return info


def request(instance_type: str, count: int = 2):
    return plan.validate_request("demo", count, instance_type, ssh_cidr="203.0.113.7")


def efa(cards: tuple[str, ...]) -> efa_plan.Efa:
    return efa_plan.Efa("subnet-1", "us-east-1a", cards)


def interface(card: int, kind: str) -> dict:
    return {"NetworkCardIndex": card, "DeviceIndex": 0 if card == 0 else 1, "InterfaceType": kind,
            "SubnetId": "subnet-1", "Groups": ["sg-1"], "DeleteOnTermination": True}


def test_p5_gets_an_efa_interface_on_card_0_and_efa_only_on_the_other_31():
    cards = efa_plan.efa_cards(network_info(32))
    assert cards == ("efa",) + ("efa-only",) * 31
    params = plan.run_instances_request(request("p5.48xlarge"), ami="ami-1", group_id="sg-1", tags=TAGS,
                                        efa=efa(cards))
    assert params["NetworkInterfaces"] == [interface(0, "efa"), *(interface(card, "efa-only") for card in range(1, 32))]
    assert "SecurityGroupIds" not in params  # EC2 refuses groups both on the request and on its interfaces
    plain = plan.run_instances_request(request("p5.48xlarge"), ami="ami-1", group_id="sg-1", tags=TAGS)
    assert {k: v for k, v in params.items() if k != "NetworkInterfaces"} == \
        {k: v for k, v in plain.items() if k != "SecurityGroupIds"}


def test_p4d_gets_four_interfaces():
    cards = efa_plan.efa_cards(network_info(4))
    assert efa_plan.network_interfaces(efa(cards), "sg-1") == [
        interface(0, "efa"), interface(1, "efa-only"), interface(2, "efa-only"), interface(3, "efa-only")]


def test_a_card_that_does_not_offer_efa_only_gets_efa():
    assert efa_plan.efa_cards(network_info(2, interface_types=["interface", "efa"])) == ("efa", "efa")


def test_a_type_without_efa_gets_no_interfaces_and_todays_request():
    assert efa_plan.efa_cards(network_info(1, efa=False, interface_types=["interface"])) == ()
    assert efa_plan.efa_cards({}) == ()
    params = plan.run_instances_request(request("g4dn.xlarge"), ami="ami-1", group_id="sg-1", tags=TAGS)
    assert params["SecurityGroupIds"] == ["sg-1"] and "NetworkInterfaces" not in params


def test_efa_lets_all_traffic_out_to_the_group_itself_and_nothing_else():
    assert efa_plan.egress_permissions("sg-1") == [
        {"IpProtocol": "-1",
         "UserIdGroupPairs": [{"GroupId": "sg-1", "Description": "kiln: EFA traffic to cluster members"}]}]


def test_an_efa_plan_adds_the_egress_rule_and_an_elastic_ip_per_instance():
    steps = plan.plan_cluster(request("p4d.24xlarge"), tags=TAGS, ami="ami-1", public_key="ssh-ed25519 AAAA",
                              group_id="sg-1", efa=efa(("efa", "efa-only")))
    assert [name for name, _ in steps.steps()] == [
        "ImportKeyPair", "CreateSecurityGroup", "AuthorizeSecurityGroupIngress", "AuthorizeSecurityGroupEgress",
        "CreatePlacementGroup", "RunInstances", "AllocateAddress", "AssociateAddress"]
    assert steps.authorize_egress == {"GroupId": "sg-1", "IpPermissions": efa_plan.egress_permissions("sg-1")}
    assert steps.allocate_address == {"Domain": "vpc",
                                      "TagSpecifications": [{"ResourceType": "elastic-ip", "Tags": TAG_LIST}]}
    assert steps.authorize_ingress["IpPermissions"] == plan.ingress_permissions("sg-1", "203.0.113.7/32")
    plain = plan.plan_cluster(request("g4dn.xlarge"), tags=TAGS, ami="ami-1", public_key="k", group_id="sg-1")
    assert plain.authorize_egress is None and plain.allocate_address is None


def subnet(subnet_id: str, zone: str, default: bool = True, state: str = "available") -> dict:
    return {"SubnetId": subnet_id, "AvailabilityZone": zone, "DefaultForAz": default, "State": state,
            "VpcId": "vpc-1", "CidrBlock": "172.31.0.0/20", "MapPublicIpOnLaunch": True}


def test_the_subnet_is_the_default_one_of_the_first_zone_that_offers_the_type():
    subnets = [subnet("subnet-f", "us-east-1f"), subnet("subnet-b", "us-east-1b"),
               subnet("subnet-a", "us-east-1a"), subnet("subnet-mine", "us-east-1a", default=False),
               subnet("subnet-c", "us-east-1c", state="pending")]
    assert efa_plan.default_subnet(subnets, ["us-east-1f", "us-east-1b"])["SubnetId"] == "subnet-b"
    assert efa_plan.default_subnet(subnets, ["us-east-1a", "us-east-1b"])["SubnetId"] == "subnet-a"
    assert efa_plan.default_subnet(subnets, ["us-east-1c", "us-east-1d"]) is None  # pending; no subnet in d
    assert efa_plan.default_subnet([], ["us-east-1a"]) is None


def test_the_elastic_ip_goes_on_the_card_0_device_0_interface():
    instance = {"InstanceId": "i-1", "NetworkInterfaces": [
        {"NetworkInterfaceId": "eni-2", "Attachment": {"DeviceIndex": 1, "NetworkCardIndex": 1}},
        {"NetworkInterfaceId": "eni-3", "Attachment": {"DeviceIndex": 0, "NetworkCardIndex": 1}},
        {"NetworkInterfaceId": "eni-1", "Attachment": {"DeviceIndex": 0, "NetworkCardIndex": 0}}]}
    assert efa_plan.primary_interface(instance) == "eni-1"
    assert efa_plan.primary_interface({"NetworkInterfaces": [{"NetworkInterfaceId": "eni-9",
                                                          "Attachment": {"DeviceIndex": 0}}]}) == "eni-9"
    assert efa_plan.primary_interface({"InstanceId": "i-2"}) is None


def test_a_replaced_nodes_elastic_ip_is_found_by_its_address():
    addresses = [{"AllocationId": "eipalloc-1", "PublicIp": "198.51.100.1"},
                 {"AllocationId": "eipalloc-2", "PublicIp": "198.51.100.2"}]
    assert efa_plan.addresses_at(addresses, "198.51.100.2") == ["eipalloc-2"]
    assert efa_plan.addresses_at(addresses, "10.0.0.1") == []


def test_elastic_ips_are_released_after_the_instances_and_before_the_groups():
    resources = [plan.Resource(kind, kind, {}) for kind in ("security-group", "elastic-ip", "instance")]
    assert [r.kind for r in plan.teardown_order(resources)] == ["instance", "elastic-ip", "security-group"]


@pytest.mark.parametrize("machine", [m for m in catalog.of_cloud("aws") if "EFA" in m.notes],
                         ids=lambda m: m.instance_type)
def test_the_dry_run_knows_the_cards_of_every_efa_type_of_the_catalog(machine):
    expected = efa_plan.expected_efa(machine.instance_type)
    assert expected is not None and len(expected.cards) == efa_plan.EFA_NETWORK_CARDS[machine.instance_type]
    assert expected.cards[0] == "efa" and set(expected.cards[1:]) == {"efa-only"}


def test_the_dry_run_says_how_many_efa_interfaces_and_that_each_instance_gets_an_elastic_ip():
    note = efa_plan.efa_note(efa_plan.expected_efa("p5.48xlarge"))
    assert note.startswith("EFA: 32 interface(s) per instance, one per network card (card 0 efa at device 0; cards "
                           "1-31 efa-only at device 1), in <default subnet of a zone that offers p5.48xlarge>")
    assert "Elastic IP" in note
    assert efa_plan.expected_efa("g4dn.xlarge") is None


def test_kiln_up_dry_run_shows_the_efa_interfaces_the_egress_rule_and_the_elastic_ip_steps(tmp_path, monkeypatch):
    from bootstrap import providers

    monkeypatch.setenv("KILN_HOME", str(tmp_path))
    aws = providers.named("aws")
    lines = aws.plan(aws.request("ef", 2, {"ssh_cidr": "203.0.113.7/32", "instance_type": "p5.48xlarge",
                                           "ssh_wait": 300}, None))
    assert lines[1] == efa_plan.efa_note(efa_plan.expected_efa("p5.48xlarge"))
    actions = [line.split(" ", 1)[0] for line in lines[2:-1]]
    assert actions == ["ImportKeyPair", "CreateSecurityGroup", "AuthorizeSecurityGroupIngress",
                       "AuthorizeSecurityGroupEgress", "CreatePlacementGroup", "RunInstances", "AllocateAddress",
                       "AssociateAddress"]
    [run] = [line for line in lines if line.startswith("RunInstances ")]
    assert run.count('"InterfaceType": "efa-only"') == 31 and "SecurityGroupIds" not in run
    plain = aws.plan(aws.request("pl", 2, {"ssh_cidr": "203.0.113.7/32", "instance_type": "g4dn.xlarge",
                                           "ssh_wait": 300}, None))
    assert not any(line.startswith(("EFA:", "AuthorizeSecurityGroupEgress", "AllocateAddress")) for line in plain)


def test_an_efa_cluster_that_the_elastic_ip_quota_cannot_hold_is_named_before_launch():
    assert efa_plan.addresses_short(5, 3, 2) is None
    assert efa_plan.addresses_short(5, 4, 2) == (
        "2 EFA node(s) need 2 Elastic IP(s), and the account holds 4 of its 5 (EC2-VPC Elastic IPs, L-0263D0A3: ask "
        "Service Quotas for more, or release some)")
    assert efa_plan.addresses_short(5, 0, 6) is not None

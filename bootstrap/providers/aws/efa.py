"""EFA on AWS (pure): how an instance type with EFA is launched (one interface per network card, all in one
subnet), the security group rule EFA needs, and how the instances get their public addresses. The I/O is
bootstrap.providers.aws.cloud's (efa_network, give_addresses)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

SUBNET_PLACEHOLDER = "<default subnet of a zone that offers {instance_type}>"
ZONE_PLACEHOLDER = "<a zone that offers {instance_type}>"
ALLOCATION_PLACEHOLDER = "<its Elastic IP's allocation id>"
INTERFACE_PLACEHOLDER = "<its card-0 (efa) network interface>"

# The network cards of the catalog's EFA types (DescribeInstanceTypes' MaximumNetworkCards; every card offers
# "efa-only"), for the dry run alone, which asks AWS nothing: `kiln up` reads each type's cards from EC2 itself.
EFA_NETWORK_CARDS = {"p4d.24xlarge": 4, "p4de.24xlarge": 4, "p5.48xlarge": 32, "p5e.48xlarge": 32,
                     "p5en.48xlarge": 16, "p6-b200.48xlarge": 8}
@dataclass(frozen=True)
class Efa:
    """How an instance type with EFA is launched: every interface in one subnet (`subnet_id`, in `zone`: the
    cluster placement group is one zone), one interface per network card, `cards[i]` the InterfaceType of card i's
    ("efa" or "efa-only")."""

    subnet_id: str
    zone: str
    cards: tuple[str, ...]


def egress_permissions(group_id: str) -> list[dict]:
    """All traffic out to the cluster's members: EFA needs its security group to let all traffic in from and out to
    itself (the ingress rule is ingress_permissions'); nothing more is opened."""
    return [{"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group_id,
                                                       "Description": "kiln: EFA traffic to cluster members"}]}]


def efa_cards(network_info: dict) -> tuple[str, ...]:
    """The InterfaceType of each network card's interface, in card order, from DescribeInstanceTypes' NetworkInfo;
    empty for a type without EFA. Card 0's is "efa" (it carries the instance's IP address); every other card's is
    "efa-only" (no IP address, so the OS routes nothing over it) where the card offers that, else "efa"."""
    if not network_info.get("EfaSupported"):
        return ()
    offered = {card.get("NetworkCardIndex", 0): card.get("InterfaceTypes") or []
               for card in network_info.get("NetworkCards") or []}
    count = max(int(network_info.get("MaximumNetworkCards") or 1), max(offered, default=0) + 1)
    return tuple("efa-only" if index and "efa-only" in offered.get(index, ()) else "efa" for index in range(count))


def network_interfaces(efa: Efa, group_id: str) -> list[dict]:
    """RunInstances' NetworkInterfaces: card 0's at device 0, every other card's at device 1 (the first device of
    its own card), all in one subnet and the cluster's security group, deleted with the instance."""
    return [{"NetworkCardIndex": index, "DeviceIndex": 0 if index == 0 else 1, "InterfaceType": kind,
             "SubnetId": efa.subnet_id, "Groups": [group_id], "DeleteOnTermination": True}
            for index, kind in enumerate(efa.cards)]


def default_subnet(subnets: Iterable[dict], zones: Iterable[str]) -> dict | None:
    """The default subnet (DescribeSubnets, default-for-az) of the first zone, by name, among those that offer the
    type (DescribeInstanceTypeOfferings by availability-zone); None where there is none. An EFA launch names its
    subnet (EC2 picks none for interfaces given one by one); a stable choice makes a retry pick the same zone."""
    offered = set(zones)
    usable = [s for s in subnets if s.get("DefaultForAz") and s.get("AvailabilityZone") in offered
              and s.get("State", "available") == "available"]
    return min(usable, key=lambda s: (s["AvailabilityZone"], s["SubnetId"]), default=None)


def expected_efa(instance_type: str) -> Efa | None:
    """What the dry run shows of EFA: the catalog's EFA types' cards (EFA_NETWORK_CARDS), placeholders for the
    subnet `up` looks up."""
    count = EFA_NETWORK_CARDS.get(instance_type)
    if not count:
        return None
    return Efa(SUBNET_PLACEHOLDER.format(instance_type=instance_type),
               ZONE_PLACEHOLDER.format(instance_type=instance_type), ("efa",) + ("efa-only",) * (count - 1))


def efa_note(efa: Efa) -> str:
    """The dry run's line on an EFA launch."""
    others = sorted(set(efa.cards[1:]))
    cards = f"card 0 efa at device 0; cards 1-{len(efa.cards) - 1} {'/'.join(others)} at device 1" \
        if len(efa.cards) > 1 else "card 0 efa at device 0"
    return (f"EFA: {len(efa.cards)} interface(s) per instance, one per network card ({cards}), in {efa.subnet_id}; "
            "the security group lets all traffic in from and out to itself; EC2 gives no public IPv4 address to an "
            "instance with several interfaces, so each instance gets an Elastic IP (AllocateAddress, "
            "AssociateAddress: once per instance), released by kiln down")


def primary_interface(instance: dict) -> str | None:
    """The id of an instance's card-0, device-0 interface (DescribeInstances), where its Elastic IP goes."""
    return next((n["NetworkInterfaceId"] for n in instance.get("NetworkInterfaces") or []
                 if (n.get("Attachment") or {}).get("DeviceIndex") == 0
                 and (n.get("Attachment") or {}).get("NetworkCardIndex", 0) == 0), None)


def addresses_at(addresses: Iterable[dict], public_ip: str) -> list[str]:
    """The allocation ids of the Elastic IPs (DescribeAddresses) with that public address."""
    return [a["AllocationId"] for a in addresses if a.get("PublicIp") == public_ip and a.get("AllocationId")]


# The Service Quotas code of the quota an EFA cluster's Elastic IPs count against (5 per region by default).
ADDRESS_QUOTA = "EC2-VPC Elastic IPs, L-0263D0A3"


def addresses_short(limit: int, used: int, wanted: int) -> str | None:
    """What is wrong where `wanted` more Elastic IPs (one per EFA node) do not fit the account's `limit` with `used`
    taken; None where they fit."""
    if used + wanted <= limit:
        return None
    return (f"{wanted} EFA node(s) need {wanted} Elastic IP(s), and the account holds {used} of its {limit} "
            f"({ADDRESS_QUOTA}: ask Service Quotas for more, or release some)")

"""Where each cloud offers each type (bootstrap.providers.offerings): each cloud's answer parsed, in the shapes
the clouds document (the examples of AWS's describe-instance-type-offerings reference, GCE's
machineTypes.aggregatedList reference and ARM's Resource Skus - List reference), the record kept, and the places
an up with no place named tries."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from bootstrap.providers import catalog
from bootstrap.providers import offerings as offered

NOW = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)

# aws ec2 describe-instance-type-offerings --location-type availability-zone --region us-east-2 (its rows)
EC2_ROWS = [
    {"InstanceType": "p5.48xlarge", "LocationType": "availability-zone", "Location": "us-east-2b"},
    {"InstanceType": "p5.48xlarge", "LocationType": "availability-zone", "Location": "us-east-2a"},
    {"InstanceType": "g6.xlarge", "LocationType": "availability-zone", "Location": "us-east-2c"},
]

# GET .../aggregated/machineTypes?filter=name = "a3-highgpu-8g" (items: a zone without it carries a warning)
GCE_ITEMS = {
    "zones/us-central1-a": {"machineTypes": [{"kind": "compute#machineType", "name": "a3-highgpu-8g",
                                              "zone": "us-central1-a", "guestCpus": 208}]},
    "zones/us-central1-f": {"warning": {"code": "NO_RESULTS_ON_PAGE", "message": "There are no results for scope "
                                        "'zones/us-central1-f' on this page.",
                                        "data": [{"key": "scope", "value": "zones/us-central1-f"}]}},
    "zones/europe-west4-c": {"machineTypes": [{"kind": "compute#machineType", "name": "a3-highgpu-8g",
                                               "zone": "europe-west4-c", "guestCpus": 208}]},
}

# GET /subscriptions/{id}/providers/Microsoft.Compute/skus (value[]): a size in two locations, one closed to the
# subscription, one of whose zones is closed; another resource type; another size
ARM_SKUS = [
    {"resourceType": "virtualMachines", "name": "Standard_ND96isr_H100_v5", "tier": "Standard",
     "size": "ND96isr_H100_v5", "family": "standardNDSH100v5Family", "locations": ["EastUS", "westeurope"],
     "locationInfo": [{"location": "EastUS", "zones": ["1", "2", "3"], "zoneDetails": []},
                      {"location": "westeurope", "zones": ["2", "1"], "zoneDetails": []}],
     "capabilities": [{"name": "GPUs", "value": "8"}],
     "restrictions": [{"type": "Zone", "values": ["EastUS"],
                       "restrictionInfo": {"locations": ["EastUS"], "zones": ["3"]},
                       "reasonCode": "NotAvailableForSubscription"},
                      {"type": "Location", "values": ["westeurope"],
                       "restrictionInfo": {"locations": ["westeurope"]}, "reasonCode": "NotAvailableForSubscription"}]},
    {"resourceType": "disks", "name": "Premium_LRS", "locations": ["eastus"], "restrictions": []},
    {"resourceType": "virtualMachines", "name": "Standard_B2s", "locations": ["eastus"], "restrictions": []},
]


def record(cloud: str, rows: list[offered.Offering], **changes) -> offered.Record:
    fields = {"account": "", "read_at": NOW.isoformat(), "source": "its API",
              "types": tuple(dict.fromkeys(o.instance_type for o in rows)), **changes}
    return offered.Record(cloud, fields["account"], fields["read_at"], fields["source"], fields["types"], tuple(rows))


def test_ec2_offerings_are_a_region_per_type_with_the_zones_that_have_it():
    assert offered.aws_offerings("us-east-2", EC2_ROWS) == [
        offered.Offering("g6.xlarge", "us-east-2", ("us-east-2c",)),
        offered.Offering("p5.48xlarge", "us-east-2", ("us-east-2a", "us-east-2b"))]
    assert offered.aws_offerings("us-east-2", []) == []


def test_gce_offerings_are_the_zones_whose_scope_lists_the_type():
    assert offered.gcp_offerings(GCE_ITEMS) == [
        offered.Offering("a3-highgpu-8g", "europe-west4-c", ("europe-west4-c",)),
        offered.Offering("a3-highgpu-8g", "us-central1-a", ("us-central1-a",))]
    assert offered.gcp_offerings({"regions/us-central1": {"machineTypes": [{"name": "x"}]}}) == []


def test_arm_offerings_keep_the_reason_a_location_is_closed_and_leave_out_closed_zones():
    assert offered.azure_offerings(ARM_SKUS, ["standard_nd96isr_h100_v5"]) == [
        offered.Offering("Standard_ND96isr_H100_v5", "eastus", ("1", "2")),
        offered.Offering("Standard_ND96isr_H100_v5", "westeurope", ("1", "2"), "NotAvailableForSubscription")]
    assert offered.azure_offerings(ARM_SKUS, ["Premium_LRS"]) == []  # a disk is no VM size


def test_places_go_preferred_type_first_then_most_zones_then_by_name_and_the_settings_place_first():
    rows = [offered.Offering("a3-megagpu-8g", "us-east4-a", ("us-east4-a",)),
            offered.Offering("a3-highgpu-8g", "us-west1-b", ("us-west1-b",)),
            offered.Offering("a3-highgpu-8g", "europe-west4-c", ("europe-west4-c",)),
            offered.Offering("a3-highgpu-8g", "asia-east1-a", ("asia-east1-a",), "closed")]
    kept = record("gcp", rows)
    assert offered.places_of(kept, ["a3-highgpu-8g", "a3-megagpu-8g"]) == ["europe-west4-c", "us-west1-b",
                                                                           "us-east4-a"]
    assert offered.places_of(kept, ["a3-megagpu-8g", "a3-highgpu-8g"])[0] == "us-east4-a"
    assert offered.places_of(kept, ["a3-highgpu-8g"], first="us-west1-b") == ["us-west1-b", "europe-west4-c"]
    assert offered.places_of(kept, ["a3-highgpu-8g"], first="asia-east1-a")[0] == "europe-west4-c"  # closed
    aws = record("aws", [offered.Offering("p5.48xlarge", "us-west-2", ("us-west-2a",)),
                         offered.Offering("p5.48xlarge", "us-east-1", ("us-east-1a", "us-east-1b"))])
    assert offered.places_of(aws, ["p5.48xlarge"]) == ["us-east-1", "us-west-2"]
    # a price known puts the cheaper place first; a place without one goes after the priced ones
    cheap = replace(aws, offerings=tuple(offered.priced(aws.offerings, {("P5.48xlarge", "us-west-2"): 55.04})))
    assert offered.places_of(cheap, ["p5.48xlarge"]) == ["us-west-2", "us-east-1"]
    assert offered.price_of(cheap, "us-west-2", "p5.48xlarge") == 55.04
    assert offered.price_of(cheap, "us-east-1", "p5.48xlarge") is None
    assert offered.price_of(cheap, "eu-west-1", "p5.48xlarge") is None


def test_what_is_not_to_be_tried_and_why():
    kept = record("azure", offered.azure_offerings(ARM_SKUS, ["Standard_ND96isr_H100_v5"]))
    assert offered.missing(kept, "EastUS", "Standard_ND96isr_H100_v5") == ""
    assert offered.missing(kept, "westeurope", "Standard_ND96isr_H100_v5") == (
        "Standard_ND96isr_H100_v5 in westeurope is not open to this account (NotAvailableForSubscription)")
    assert offered.missing(kept, "japaneast", "Standard_ND96isr_H100_v5") == (
        "azure does not offer Standard_ND96isr_H100_v5 in japaneast")
    assert offered.closed(kept, ["Standard_ND96isr_H100_v5"]) == [
        "westeurope Standard_ND96isr_H100_v5 (NotAvailableForSubscription)"]


def test_summary_counts_the_open_regions_and_zones():
    gcp = record("gcp", offered.gcp_offerings(GCE_ITEMS) + [offered.Offering("a3-highgpu-8g", "us-central1-b",
                                                                             ("us-central1-b",))])
    assert offered.summary(gcp, ["a3-highgpu-8g"]) == (2, 3)  # us-central1 twice
    azure = record("azure", offered.azure_offerings(ARM_SKUS, ["Standard_ND96isr_H100_v5", "Standard_B2s"]))
    assert offered.summary(azure, ["Standard_ND96isr_H100_v5"]) == (1, 2)
    assert offered.summary(azure, ["Standard_B2s"]) == (1, 1)  # a location without zones counts as one
    assert offered.summary(azure, ["Standard_NC6"]) == (0, 0)


def test_a_kept_record_answers_for_its_account_and_types_for_a_day():
    kept = record("aws", offered.aws_offerings("us-east-2", EC2_ROWS), account="work")
    assert kept.answers("work", ["p5.48xlarge"], NOW + timedelta(hours=23))
    assert not kept.answers("work", ["p5.48xlarge"], NOW + timedelta(hours=24))
    assert not kept.answers("home", ["p5.48xlarge"], NOW)
    assert not kept.answers("work", ["p4d.24xlarge"], NOW)
    assert not kept.answers("work", ["p5.48xlarge"], NOW - timedelta(hours=1))  # read in the future: a wrong clock
    assert offered.Record.from_json(kept.to_json()) == kept
    priced = replace(kept, offerings=tuple(offered.priced(kept.offerings, {("p5.48xlarge", "us-east-2"): 98.32})),
                     priced_from="a price list", unread=("eu-west-1 (denied)",))
    assert offered.Record.from_json(priced.to_json()) == priced
    assert offered.describe(priced).endswith("; prices: a price list; not read: eu-west-1 (denied)")
    assert offered.Record.from_json({"cloud": "aws"}) is None
    assert offered.Record.from_json({**kept.to_json(), "offerings": [None]}) is None
    assert not record("aws", [], read_at="yesterday").answers("", [], NOW)


def test_the_catalog_table_shows_where_each_type_is_offered_where_it_is_known():
    kept = {"aws": record("aws", offered.aws_offerings("us-east-2", EC2_ROWS), source="EC2's offerings")}
    lines = catalog.table("aws", kept)
    assert lines[0].endswith("where offered: EC2's offerings, read 2026-11-30 08:00 UTC")
    by_type = {line.split()[1]: line for line in lines[1:]}
    assert by_type["p5.48xlarge"].endswith("[1 region(s), 2 zone(s)]")
    kept = {"aws": replace(kept["aws"], offerings=tuple(offered.priced(kept["aws"].offerings,
                                                                        {("p5.48xlarge", "us-east-2"): 98.32})))}
    by_type = {line.split()[1]: line for line in catalog.table("aws", kept)[1:]}
    assert by_type["p5.48xlarge"].endswith("[1 region(s), 2 zone(s); from $98.32/h on demand (us-east-2)]")
    assert offered.cheapest(kept["aws"], "g6.xlarge") is None
    assert by_type["p4d.24xlarge"].endswith("[offered nowhere to you]")
    assert "region(s)" not in "".join(catalog.table("aws"))

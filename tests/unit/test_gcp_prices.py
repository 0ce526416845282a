"""A machine type's price from the Cloud Billing Catalog (bootstrap.providers.gcp.prices): parsed from a recorded
public answer of the Catalog (tests/unit/data/gcp/SOURCES.md), and from SKUs in the forms the Catalog lists."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bootstrap.providers import offerings as offered
from bootstrap.providers.gcp import prices

RECORDED = json.loads((Path(__file__).parent / "data" / "gcp" / "billing-catalog-skus-opencost.json").read_text())
A2_1G = prices.Shape(12, 85.0, (("nvidia-tesla-a100", 1),))  # machineTypes: 12 vCPUs, 87040 MB, one A100


def sku(description: str, usd: float, regions=("us-central1",), *, usage_type="OnDemand", unit="h",
        currency="USD") -> dict:
    units = int(usd)
    return {"description": description, "category": {"resourceFamily": "Compute", "usageType": usage_type},
            "serviceRegions": list(regions),
            "pricingInfo": [{"pricingExpression": {"usageUnit": unit, "tieredRates": [
                {"startUsageAmount": 0, "unitPrice": {"currencyCode": currency, "units": str(units),
                                                      "nanos": round((usd - units) * 1e9)}}]}}]}


def test_the_recorded_page_gives_an_a2_highgpu_1g_googles_published_price():
    """12 vCPUs at 0.031611, 85 GiB at 0.004237 and an A100 at 2.933908: 3.673385 USD an hour, Google's price for
    a2-highgpu-1g in us-central1."""
    rated = prices.rates(RECORDED["skus"])
    assert rated[("gpu", "a100", False, "us-central1")] == pytest.approx(2.933908)
    assert rated[("core", "a2", False, "us-east1")] == pytest.approx(0.031611)
    assert rated[("ram", "a2", False, "us-west1")] == pytest.approx(0.004237)
    assert prices.machine_price("a2-highgpu-1g", A2_1G, "us-central1", rated) == 3.673385
    assert prices.machine_price("a2-highgpu-1g", A2_1G, "europe-west4", rated) is None  # no SKU names that region


def test_prices_in_another_currency_are_left_out():
    """The page's E2 and T2D SKUs are in IDR: no rate, so no price, rather than one 16,000 times too high."""
    rated = prices.rates(RECORDED["skus"])
    assert not [key for key in rated if key[1] in ("e2", "t2d")]
    assert prices.machine_price("e2-standard-4", prices.Shape(4, 16.0), "us-central1", rated) is None
    assert prices.unit_price(sku("E2 Instance Core running in Americas", 0.02, currency="EUR")) is None


def test_a_machine_type_takes_the_rates_of_its_series_and_its_own_gpus():
    """n1's SKUs say Predefined, t2d's AMD; a3-megagpu's series is A3Plus and its GPU "H100 80GB Plus" (not the
    plain H100 of a3-highgpu); a GPU's name matches in either form (nvidia-tesla-a100 / Tesla A100)."""
    rated = prices.rates([
        sku("N1 Predefined Instance Core running in Americas", 0.031611),
        sku("N1 Predefined Instance Ram running in Americas", 0.004237, unit="GiBy.h"),
        sku("Nvidia Tesla T4 GPU running in Americas", 0.35),
        sku("A3 Instance Core running in Americas", 0.029563),
        sku("A3 Instance Ram running in Americas", 0.002965, unit="GiBy.h"),
        sku("A3Plus Instance Core running in Americas", 0.026924),
        sku("A3Plus Instance Ram running in Americas", 0.002344, unit="GiBy.h"),
        sku("Nvidia H100 80GB GPU running in Americas", 9.796551),
        sku("Nvidia H100 80GB Plus GPU running in Americas", 10.344276),
    ])
    assert prices.machine_price("n1-standard-8", prices.Shape(8, 30.0, (("nvidia-tesla-t4", 2),)), "us-central1",
                                rated) == round(8 * 0.031611 + 30 * 0.004237 + 2 * 0.35, 6)
    high = prices.machine_price("a3-highgpu-8g", prices.Shape(208, 1872.0, (("nvidia-h100-80gb", 8),)),
                                "us-central1", rated)
    mega = prices.machine_price("a3-megagpu-8g", prices.Shape(208, 1872.0, (("nvidia-h100-mega-80gb", 8),)),
                                "us-central1", rated)
    assert high == round(208 * 0.029563 + 1872 * 0.002965 + 8 * 9.796551, 6)
    assert mega == round(208 * 0.026924 + 1872 * 0.002344 + 8 * 10.344276, 6)
    assert prices.machine_price("g2-standard-4", prices.Shape(4, 16.0, (("nvidia-l4", 1),)), "us-central1",
                                rated) is None  # no G2 or L4 rate: no price, never a part of one


def test_only_on_demand_and_spot_rates_are_read():
    """Commitments, reservations, Calendar Mode, DWS and premiums are listed beside the rates (some under the same
    usage type) and are never one; Spot's SKUs are spot whatever their usage type (a GPU's says "attached to Spot
    Preemptible VMs", a vCPU's begins "Spot Preemptible "); a SKU in another unit is left out."""
    rated = prices.rates([
        sku("Nvidia H100 80GB Plus GPU running in Americas", 10.344276),
        sku("Reserved Nvidia H100 80GB Mega GPU in Americas in Calendar Mode", 4.841121),
        sku("Nvidia H100 Mega 80GB GPU attached to DWS Defined Duration VMs running in Americas", 4.423936),
        sku("Commitment v1: A3Plus Core in Americas for 1 Year", 0.01, usage_type="Commit1Yr"),
        sku("Nvidia Tesla A100 GPU running in Americas", 1.0, usage_type="Commit1Yr"),
        sku("Committed Use Discount Premium for E2 Custom Instance Core running in Americas", 0.001),
        sku("Nvidia H100 80GB Mega GPU attached to Spot Preemptible VMs running in Tokyo", 3.2, ["asia-northeast1"],
            usage_type="Preemptible"),
        sku("Nvidia L4 GPU attached to Spot Preemptible VMs running in Virginia", 0.2, ["us-east4"]),
        sku("Spot Preemptible A2 Instance Ram running in Americas", 0.0013, unit="GiBy.h", usage_type="Preemptible"),
        sku("Preemptible Nvidia Tesla T4 GPU running in Americas", 0.11, usage_type="Preemptible"),
        sku("A3Plus Instance Ram running in Americas", 0.002344, unit="GiBy.mo"),
    ])
    assert rated == {("gpu", "80gb h100 mega", False, "us-central1"): pytest.approx(10.344276),
                     ("gpu", "80gb h100 mega", True, "asia-northeast1"): pytest.approx(3.2),
                     ("gpu", "l4", True, "us-east4"): pytest.approx(0.2),
                     ("ram", "a2", True, "us-central1"): pytest.approx(0.0013),
                     ("gpu", "t4", True, "us-central1"): pytest.approx(0.11)}


def test_newer_gpus_without_nvidia_in_their_name_and_rates_that_disagree():
    """The H200's SKU has no "Nvidia" (a3-ultragpu-8g, series A3Ultra); where two SKUs give one rate differently
    ("Plus" and "Mega" both name the H100 Mega), neither is taken."""
    rated = prices.rates([
        sku("H200 141GB GPU running in Americas", 10.5),
        sku("A3Ultra Instance Core running in Americas", 0.03),
        sku("A3Ultra Instance Ram running in Americas", 0.003, unit="GiBy.h"),
        sku("Nvidia H100 80GB Plus GPU running in Americas", 10.344276),
        sku("Nvidia H100 80GB Mega GPU running in Americas", 11.0),
        sku("Nvidia Tesla T4 GPU running in Americas", 0.35),
        sku("Nvidia Tesla T4 GPU running in Americas", 0.35),  # the same rate twice is that rate
    ])
    ultra = prices.Shape(224, 2952.0, (("nvidia-h200-141gb", 8),))
    assert prices.machine_price("a3-ultragpu-8g", ultra, "us-central1", rated) == \
        round(224 * 0.03 + 2952 * 0.003 + 8 * 10.5, 6)
    assert ("gpu", "80gb h100 mega", False, "us-central1") not in rated
    assert rated[("gpu", "t4", False, "us-central1")] == pytest.approx(0.35)


def test_zone_offerings_are_priced_by_their_region():
    rated = prices.rates(RECORDED["skus"])
    found = [offered.Offering("a2-highgpu-1g", "us-central1-a", ("us-central1-a",)),
             offered.Offering("a2-highgpu-1g", "europe-west4-a", ("europe-west4-a",)),
             offered.Offering("n2-standard-8", "us-central1-a", ("us-central1-a",))]
    assert prices.zone_prices(found, {"a2-highgpu-1g": A2_1G}, rated) == {("a2-highgpu-1g", "us-central1-a"): 3.673385}


def test_shapes_come_from_machine_types_aggregated_list():
    items = {"zones/us-central1-a": {"machineTypes": [
        {"name": "a2-highgpu-1g", "guestCpus": 12, "memoryMb": 87040,
         "accelerators": [{"guestAcceleratorType": "nvidia-tesla-a100", "guestAcceleratorCount": 1}]},
        {"name": "e2-standard-4", "guestCpus": 4, "memoryMb": 16384}]},
        "zones/us-central1-b": {"warning": {"code": "NO_RESULTS_ON_PAGE"}}}
    assert prices.shapes(items) == {"a2-highgpu-1g": A2_1G, "e2-standard-4": prices.Shape(4, 16.0)}

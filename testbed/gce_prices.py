"""The GCE stand-in's Cloud Billing Catalog (a mixin of testbed.gce.Gce): GET /v1/services/{service}/skus, as
cloudbilling.googleapis.com answers it (cloud.google.com/billing/docs/reference/rest/v1/services.skus/list):
Compute Engine's SKUs (service 6F81-5844-456A) in the currency asked (USD by default; another multiplies each price
by its conversion rate, as the API does), pages of `pageSize` (5000 by default) with a `nextPageToken`; 404 for a
service it does not know, 400 for a page token it did not give. Tests put SKUs in with `price_sku()` (the form the
Catalog lists: a description, its category, the regions it applies to, one tier's unit price); none by default."""

from __future__ import annotations

import base64
import hashlib

from google.cloud import billing_v1

from testbed.gce_rules import ApiError, invalid

SERVICE = "6F81-5844-456A"  # Compute Engine's
RATES = {"USD": 1.0, "EUR": 0.92, "IDR": 16000.0}  # the currencies it answers in, per USD
GROUPS = {"Core": "CPU", "Ram": "RAM", "GPU": "GPU"}


class PriceHandlers:
    """services.skus.list over the SKUs tests put in."""

    def price_sku(self, description: str, regions: list[str], usd: float, *, usage_type: str = "OnDemand") -> None:
        """A SKU as the Catalog lists one: its group and unit from its description (a vCPU or a GPU an hour, a GiB
        of memory an hour)."""
        group = next((g for word, g in GROUPS.items() if f" {word} " in f" {description} "), "N1Standard")
        unit, unit_name = ("GiBy.h", "gibibyte hour") if group == "RAM" else ("h", "hour")
        sku_id = hashlib.sha1(description.encode()).hexdigest()[:12].upper()
        sku_id = f"{sku_id[:4]}-{sku_id[4:8]}-{sku_id[8:]}"
        with self._lock:
            self._skus.append({
                "name": f"services/{SERVICE}/skus/{sku_id}", "skuId": sku_id, "description": description,
                "category": {"serviceDisplayName": "Compute Engine", "resourceFamily": "Compute",
                             "resourceGroup": group, "usageType": usage_type},
                "serviceRegions": list(regions), "serviceProviderName": "Google",
                "usd": usd, "unit": unit, "unitName": unit_name})

    def _skus_list(self, method, params, query, body):
        if params["service"] != SERVICE:
            raise ApiError(404, "notFound", f"Service not found: services/{params['service']}")
        currency = query.get("currencyCode") or "USD"
        if currency not in RATES:
            raise invalid("currencyCode", currency, "Unsupported currency code.")
        size = int(query["pageSize"]) if query.get("pageSize", "").isdigit() else 5000
        token = query.get("pageToken", "")
        try:
            start = int(base64.urlsafe_b64decode(token.encode()).decode()) if token else 0
        except ValueError:
            raise invalid("pageToken", token, "Invalid page token.") from None
        chosen = self._skus[start:start + (size or 5000)]
        end = start + len(chosen)
        rate = RATES[currency]
        skus = [billing_v1.Sku(
            name=sku["name"], sku_id=sku["skuId"], description=sku["description"],
            category=billing_v1.Category(service_display_name=sku["category"]["serviceDisplayName"],
                                         resource_family=sku["category"]["resourceFamily"],
                                         resource_group=sku["category"]["resourceGroup"],
                                         usage_type=sku["category"]["usageType"]),
            service_regions=sku["serviceRegions"], service_provider_name=sku["serviceProviderName"],
            pricing_info=[billing_v1.PricingInfo(
                pricing_expression=billing_v1.PricingExpression(
                    usage_unit=sku["unit"], usage_unit_description=sku["unitName"], base_unit="s",
                    display_quantity=1, tiered_rates=[billing_v1.PricingExpression.TierRate(
                        start_usage_amount=0, unit_price=money(sku["usd"] * rate, currency))]),
                currency_conversion_rate=rate)])
            for sku in chosen]
        more = base64.urlsafe_b64encode(str(end).encode()).decode() if end < len(self._skus) else ""
        return billing_v1.ListSkusResponse(skus=skus, next_page_token=more)


def money(amount: float, currency: str):
    """A google.type.Money: whole units and nanos."""
    from google.type import money_pb2

    units = int(amount)
    return money_pb2.Money(currency_code=currency, units=units, nanos=round((amount - units) * 1e9))

"""The ARM stand-in's Azure Retail Prices API (a mixin of testbed.arm.Arm): GET /api/retail/prices, no sign-in, as
prices.azure.com answers it (learn.microsoft.com, "Azure Retail Prices REST API overview"): an OData $filter of
`field eq 'value'` terms joined by `and` over the items' fields, pages of `page_size` items with a NextPageLink
carrying $skip, and 400 for a filter it cannot read or a field it does not know. Tests put meters in with
`price()`: each VM size gets the meters a real one has (pay-as-you-go, Spot and Low Priority; Linux and Windows)."""

from __future__ import annotations

import re
import uuid
from urllib.parse import urlencode

from testbed.arm_types import Reply, Request

PRICES_API = "2023-01-01-preview"
FIELDS = ("armRegionName", "location", "meterId", "meterName", "productId", "skuId", "productName", "skuName",
          "serviceName", "serviceId", "serviceFamily", "priceType", "armSkuName", "currencyCode")
_TERM = re.compile(r"\s*(\w+)\s+eq\s+'([^']*)'\s*")


def parse_filter(text: str) -> list[tuple[str, str]] | None:
    """The (field, value) terms of a filter of `eq` terms joined by `and`; None where it is not one."""
    terms = []
    for part in re.split(r"\s+and\s+", text.strip(), flags=re.IGNORECASE) if text.strip() else []:
        match = _TERM.fullmatch(part)
        if not match:
            return None
        terms.append((match.group(1), match.group(2)))
    return terms


def meters(location: str, size: str, spot: float | None, on_demand: float | None) -> list[dict]:
    """The meters of one VM size in one location, as the API lists them: Linux and Windows, pay-as-you-go, Spot
    and Low Priority (Windows' the dearer)."""
    short = size.removeprefix("Standard_").replace("_", " ")
    family = f"Virtual Machines {short.split()[0]} Series"
    found = []
    for os_name, extra in (("", 0.0), (" Windows", 0.5)):
        for kind, price in (("", on_demand), (" Spot", spot), (" Low Priority", spot)):
            if price is None:
                continue
            found.append({
                "currencyCode": "USD", "tierMinimumUnits": 0.0, "retailPrice": price + extra,
                "unitPrice": price + extra,
                "armRegionName": location, "location": location, "effectiveStartDate": "2026-10-01T00:00:00Z",
                "meterId": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{location}/{size}/{os_name}/{kind}")),
                "meterName": f"{short}{kind}", "productId": "DZH318Z0BQ4L",
                "skuId": "DZH318Z0BQ4L/00" + str(len(found)), "productName": f"{family}{os_name}",
                "skuName": f"{short}{kind}", "serviceName": "Virtual Machines", "serviceId": "DZH313Z7MMC8",
                "serviceFamily": "Compute", "unitOfMeasure": "1 Hour", "type": "Consumption",
                "isPrimaryMeterRegion": True, "armSkuName": size})
    return found


class PriceHandlers:
    """GET /api/retail/prices over the meters tests put in."""

    page_size = 1000

    def price(self, location: str, size: str, *, spot: float | None = None, on_demand: float | None = None) -> None:
        """Put in the meters of `size` in `location` (replacing its earlier ones)."""
        with self._lock:
            self._meters = [m for m in self._meters
                            if (m["armRegionName"], m["armSkuName"]) != (location, size)]
            self._meters += meters(location, size, spot, on_demand)

    def _prices_list(self, request: Request) -> Reply:
        self.prices_asked.append(dict(request.query))
        terms = parse_filter(request.query.get("$filter", ""))
        if terms is None or any(field not in (*FIELDS, "type") for field, _ in terms):
            return Reply(400, {"Error": {"Code": "InvalidFilter", "Message": "Invalid OData parameters supplied"}})
        wanted = [("type" if field == "priceType" else field, value.lower()) for field, value in terms]
        chosen = [m for m in self._meters
                  if all(str(m.get(field, "")).lower() == value for field, value in wanted)]
        skip = int(request.query.get("$skip") or 0)
        page = chosen[skip:skip + self.page_size]
        following = None
        if skip + self.page_size < len(chosen):
            query = {k: v for k, v in request.query.items() if k != "$skip"}
            following = f"{self.endpoint}/api/retail/prices?{urlencode({**query, '$skip': skip + self.page_size})}"
        return Reply(200, {"BillingCurrency": "USD", "CustomerEntityId": "Default", "CustomerEntityType": "Retail",
                           "Items": page, "NextPageLink": following, "Count": len(page)})

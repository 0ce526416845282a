"""What each cloud's errors mean, as the cloud documents them: one table per cloud, each row a code (and, where one
code says several things, as Azure's OperationNotAllowed and EC2's Unsupported do, the words of its message that
tell them apart) → a verdict, with the document it comes from. Pure; the one place these are decided.

Verdicts, and what `kiln up`'s failover does with each (bootstrap.providers.failover):
  capacity     the place has no such machines now: the next candidate; --retry-until-up tries it again later
  unavailable  the place does not offer the request at all (a type not in that zone): the next candidate, never
               again in a later round
  quota        the account is over a quota (which one, where the message names it): the rest of its region is
               skipped (the rest of the cloud, for a quota that holds in every region)
  transient    the cloud could not answer now (throttled, an internal error): stop; the SDK retried it already
  bad-request  the request is wrong wherever it goes: stop
A code no table has is a bad request: kiln does not go on from an error it cannot read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

VERDICTS = ("capacity", "unavailable", "quota", "transient", "bad-request")

EC2_ERRORS = "https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html"
EC2_CAPACITY = "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/troubleshooting-launch.html"
EC2_EIP = "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/elastic-ip-addresses-eip.html#using-instance-addressing-limit"
GCE_AVAILABILITY = "https://cloud.google.com/compute/docs/troubleshooting/troubleshooting-resource-availability"
GCE_QUOTAS = "https://cloud.google.com/compute/resource-usage"
GCE_API_ERRORS = "https://cloud.google.com/compute/docs/reference/rest/v1#error-codes"
AZURE_ALLOCATION = "https://learn.microsoft.com/troubleshoot/azure/virtual-machines/windows/allocation-failure"
AZURE_SKU = "https://learn.microsoft.com/azure/azure-resource-manager/troubleshooting/error-sku-not-available"
AZURE_QUOTA = "https://learn.microsoft.com/azure/azure-resource-manager/troubleshooting/error-resource-quota"
AZURE_THROTTLING = "https://learn.microsoft.com/azure/azure-resource-manager/management/request-limits-and-throttling"
AZURE_ERRORS = "https://learn.microsoft.com/azure/azure-resource-manager/troubleshooting/common-deployment-errors"
AZURE_SPOT = "https://learn.microsoft.com/azure/virtual-machines/error-codes-spot"


@dataclass(frozen=True)
class Row:
    """One row of a cloud's table: `code` means `verdict`, where its message matches `words` (a regular expression,
    searched case-insensitively; "" for any message). A quota row names its quota: `quota` itself, or the first group
    of `words` where that is empty. `everywhere`: the quota holds in every region (skipping the region is not
    enough)."""

    code: str
    verdict: str
    source: str
    words: str = ""
    quota: str = ""
    everywhere: bool = False


@dataclass(frozen=True)
class Meaning:
    """What one error means: its verdict, and for a quota which one and whether it holds in every region."""

    verdict: str
    code: str
    quota: str = ""
    everywhere: bool = False

    def said(self) -> str:
        """The verdict as kiln says it: `quota GPUS_ALL_REGIONS (every region)`, `capacity`."""
        if self.verdict != "quota":
            return self.verdict
        return f"quota {self.quota or self.code}" + (" (every region)" if self.everywhere else "")


def same_meaning(verdict: str, source: str, *codes: str) -> tuple[Row, ...]:
    """The rows of codes that all mean `verdict`, whatever their message says, as `source` documents them."""
    return tuple(Row(code, verdict, source) for code in codes)


def gce_quota_rows(code: str) -> tuple[Row, ...]:
    """A GCE quota code's rows: its message names the quota, and says `globally` where it holds everywhere."""
    named = r"quota '([A-Z0-9_]+)' exceeded"
    return (Row(code, "quota", GCE_QUOTAS, words=named + r".*\bglobally\b", everywhere=True),
            Row(code, "quota", GCE_QUOTAS, words=named), Row(code, "quota", GCE_QUOTAS))


TABLES: dict[str, tuple[Row, ...]] = {
    "aws": (
        Row("InsufficientInstanceCapacity", "capacity", EC2_CAPACITY),
        # SpotMaxPriceTooLow: the Spot price is above the most the user would pay here; another region's may not be
        *same_meaning("capacity", EC2_ERRORS, "InsufficientHostCapacity", "InsufficientCapacity",
                      "InsufficientReservedInstanceCapacity", "SpotMaxPriceTooLow"),
        # "Your requested instance type (p5.48xlarge) is not supported in your requested Availability Zone ..."
        Row("Unsupported", "unavailable", EC2_CAPACITY, words=r"not supported in your requested availability zone"),
        Row("Unsupported", "unavailable", EC2_ERRORS, words=r"instance type .* is not supported"),
        Row("Unsupported", "bad-request", EC2_ERRORS),  # an unsupported operation, wherever it is asked
        Row("VcpuLimitExceeded", "quota", EC2_ERRORS, quota="running On-Demand vCPUs of the instance family"),
        Row("InstanceLimitExceeded", "quota", EC2_ERRORS, quota="running instances"),
        Row("MaxSpotInstanceCountExceeded", "quota", EC2_ERRORS, quota="Spot instances (vCPUs)"),
        Row("AddressLimitExceeded", "quota", EC2_EIP, quota="Elastic IP addresses"),
        *same_meaning("transient", EC2_ERRORS, "RequestLimitExceeded", "InternalError", "ServiceUnavailable",
                      "Unavailable"),
    ),
    "gcp": (
        *same_meaning("capacity", GCE_AVAILABILITY, "ZONE_RESOURCE_POOL_EXHAUSTED",
                      "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "RESOURCE_POOL_EXHAUSTED"),
        Row("UNSUPPORTED_OPERATION_ZONE_NOT_AVAILABLE", "unavailable", GCE_AVAILABILITY),
        # an operation's error (QUOTA_EXCEEDED) and a refused call's reason (quotaExceeded, HTTP 403) say the same:
        # "Quota 'GPUS_ALL_REGIONS' exceeded. Limit: 0.0 globally." holds everywhere; "... in region us-central1."
        *gce_quota_rows("QUOTA_EXCEEDED"),
        *gce_quota_rows("quotaExceeded"),
        *same_meaning("transient", GCE_API_ERRORS, "rateLimitExceeded", "userRateLimitExceeded", "backendError",
                      "internalError"),
    ),
    "azure": (
        *same_meaning("capacity", AZURE_ALLOCATION, "AllocationFailed", "ZonalAllocationFailed",
                      "OverconstrainedAllocationRequest", "OverconstrainedZonalAllocationRequest"),
        # "The requested size for resource '...' is currently not available in location 'eastus' ..."
        Row("SkuNotAvailable", "capacity", AZURE_SKU),
        # the Spot price here is above --max-price, as EC2's SpotMaxPriceTooLow: another region's may not be
        Row("SpotPriceGreaterThanProvidedMaxPrice", "capacity", AZURE_SPOT),
        Row("QuotaExceeded", "quota", AZURE_QUOTA, words=r"exceeding approved (\S+) (?:cores )?quota"),
        Row("QuotaExceeded", "quota", AZURE_QUOTA),
        # Azure's code for a core quota ("Operation could not be completed as it results in exceeding approved
        # standardNDSH100v5Family Cores quota ...") and for many refusals that are no quota at all (an RDMA size
        # outside one placement group, a change to a VM in a state that forbids it): the message tells them apart
        Row("OperationNotAllowed", "quota", AZURE_QUOTA, words=r"exceeding approved (\S+) (?:cores )?quota"),
        Row("OperationNotAllowed", "quota", AZURE_QUOTA, words=r"\bquota\b"),
        Row("OperationNotAllowed", "bad-request", AZURE_ERRORS),
        *same_meaning("transient", AZURE_THROTTLING, "TooManyRequests", "RetryableError"),
        Row("InternalServerError", "transient", AZURE_ERRORS),
    ),
    "local": (
        Row("NoLocalCapacity", "capacity", "localcloud's `exhaust`: a zone that preemption emptied"),
    ),
}


def meaning(cloud: str, code: str, message: str = "") -> Meaning:
    """What error `code` (with its `message`) means on `cloud`: the first row of its table that matches; a bad
    request where none does."""
    text = " ".join(str(message).split())
    for row in TABLES.get(cloud, ()):
        if row.code != code:
            continue
        found = re.search(row.words, text, re.IGNORECASE) if row.words else None
        if row.words and not found:
            continue
        named = row.quota or (found.group(1) if found and found.groups() else "")
        return Meaning(row.verdict, code, named, row.everywhere)
    return Meaning("bad-request", code)

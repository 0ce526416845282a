"""bootstrap.providers.meanings: every row of each cloud's table, from error bodies as the clouds send them, parsed by
each cloud's own SDK (botocore's EC2 parser, google-api-core's, azure-core's), read by kiln's error_code and
describe_error, and judged by the table."""

from __future__ import annotations

import json

import pytest

from bootstrap.providers import failover, meanings

EC2_UNSUPPORTED_ZONE = ("Your requested instance type (p5.48xlarge) is not supported in your requested Availability "
                        "Zone (us-east-1e). Please retry your request by not specifying an Availability Zone or "
                        "choosing us-east-1a, us-east-1b, us-east-1c.")
AZURE_CORE_QUOTA = ("Operation could not be completed as it results in exceeding approved standardNDSH100v5Family "
                    "Cores quota. Additional details - Deployment Model: Resource Manager, Location: eastus, Current "
                    "Limit: 0, Current Usage: 0, Additional Required: 96, (Minimum) New Limit Required: 96.")


def ec2_error(code: str, message: str, status: int = 400):
    """A ClientError as botocore makes it from EC2's XML error body."""
    import botocore.parsers
    import botocore.session
    from botocore.exceptions import ClientError

    body = (f'<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>{code}</Code><Message>{message}'
            f'</Message></Error></Errors><RequestID>0f6b3c1e</RequestID></Response>').encode()
    model = botocore.session.get_session().get_service_model("ec2").operation_model("RunInstances")
    parsed = botocore.parsers.create_parser("ec2").parse({"status_code": status, "headers": {}, "body": body},
                                                         model.output_shape)
    return ClientError(parsed, "RunInstances")


def gce_error(reason: str, message: str, status: int = 403):
    """The exception google-api-core makes of a refused Compute Engine call (its JSON error body)."""
    import requests
    from google.api_core import exceptions

    response = requests.Response()
    response.status_code = status
    response._content = json.dumps({"error": {"code": status, "message": message, "errors": [
        {"message": message, "domain": "usageLimits", "reason": reason}]}}).encode()
    response.request = requests.Request("POST", "https://compute.googleapis.com/compute/v1/projects/p/zones/"
                                                "us-central1-a/instances").prepare()
    return exceptions.from_http_response(response)


class ArmResponse:
    """An HTTP answer of Resource Manager as azure-core reads it."""

    headers: dict = {}
    request = None
    content_type = "application/json"

    def __init__(self, status: int, body: str):
        self.status_code, self.reason, self._body = status, "refused", body

    def text(self, encoding=None) -> str:
        return self._body

    def body(self) -> bytes:
        return self._body.encode()


def arm_error(code: str, message: str, status: int = 409):
    from azure.core.exceptions import HttpResponseError

    return HttpResponseError(response=ArmResponse(status, json.dumps({"error": {"code": code, "message": message}})))


def read(cloud: str, error) -> meanings.Meaning:
    """What kiln makes of an SDK's error: its code and its one line, through the cloud module's own readers."""
    if cloud == "aws":
        from bootstrap.providers.aws import cloud as module
    elif cloud == "gcp":
        from bootstrap.providers.gcp import cloud as module
    else:
        from bootstrap.providers.azure import cloud as module
    return meanings.meaning(cloud, module.error_code(error), module.describe_error(error))


@pytest.mark.parametrize(("code", "message", "status", "said"), [
    ("InsufficientInstanceCapacity", "We currently do not have sufficient p5.48xlarge capacity in the Availability "
     "Zone you requested (us-east-1a).", 500, "capacity"),
    ("InsufficientHostCapacity", "There is not enough capacity to fulfill your Dedicated Host request.", 500,
     "capacity"),
    ("InsufficientCapacity", "There is not enough capacity to fulfill your import instance request.", 500,
     "capacity"),
    ("InsufficientReservedInstanceCapacity", "There is not enough capacity for the reservation.", 500, "capacity"),
    ("SpotMaxPriceTooLow", "Your Spot request price of 0.5 is lower than the minimum required Spot request "
     "fulfillment price of 12.2.", 400, "capacity"),
    ("Unsupported", EC2_UNSUPPORTED_ZONE, 400, "unavailable"),
    ("Unsupported", "The instance type p5.48xlarge is not supported in this Region.", 400, "unavailable"),
    ("Unsupported", "The requested configuration is currently not supported. Please check the documentation for "
     "supported configurations.", 400, "bad-request"),
    ("VcpuLimitExceeded", "You have requested more vCPU capacity than your current vCPU limit of 0 allows for the "
     "instance bucket that the specified instance type belongs to.", 400,
     "quota running On-Demand vCPUs of the instance family"),
    ("InstanceLimitExceeded", "You have requested more instances (21) than your current instance limit of 20 allows "
     "for the specified instance type.", 400, "quota running instances"),
    ("MaxSpotInstanceCountExceeded", "Max spot instance count exceeded", 400, "quota Spot instances (vCPUs)"),
    ("AddressLimitExceeded", "The maximum number of addresses has been reached.", 400,
     "quota Elastic IP addresses"),
    ("RequestLimitExceeded", "Request limit exceeded.", 503, "transient"),
    ("InternalError", "An internal error has occurred.", 500, "transient"),
    ("ServiceUnavailable", "The request has failed due to a temporary failure of the server.", 503, "transient"),
    ("Unavailable", "The server is overloaded and can't handle the request.", 503, "transient"),
    ("InvalidAMIID.NotFound", "The image id '[ami-1]' does not exist", 400, "bad-request"),
    ("UnauthorizedOperation", "You are not authorized to perform this operation.", 403, "bad-request"),
])
def test_each_ec2_error_reads_as_its_row_says(code, message, status, said):
    assert read("aws", ec2_error(code, message, status)).said() == said


@pytest.mark.parametrize(("reason", "message", "said"), [
    ("quotaExceeded", "Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 0.0 globally.", "quota GPUS_ALL_REGIONS (every "
     "region)"),
    ("quotaExceeded", "Quota 'NVIDIA_H100_GPUS' exceeded.  Limit: 8.0 in region us-central1.",
     "quota NVIDIA_H100_GPUS"),
    ("quotaExceeded", "Quota exceeded for quota metric 'Queries' of service 'compute.googleapis.com'.",
     "quota quotaExceeded"),
    ("rateLimitExceeded", "Rate Limit Exceeded", "transient"),
    ("userRateLimitExceeded", "User Rate Limit Exceeded", "transient"),
    ("backendError", "Backend Error", "transient"),
    ("internalError", "Internal Error", "transient"),
    ("forbidden", "Required 'compute.instances.create' permission for 'projects/p/zones/z/instances/x'",
     "bad-request"),
])
def test_each_refused_compute_engine_call_reads_as_its_row_says(reason, message, said):
    assert read("gcp", gce_error(reason, message)).said() == said


@pytest.mark.parametrize(("code", "message", "said"), [
    ("ZONE_RESOURCE_POOL_EXHAUSTED", "The zone 'projects/p/zones/us-central1-a' does not have enough resources "
     "available to fulfill the request. Try a different zone, or try again later.", "capacity"),
    ("ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "The zone 'projects/p/zones/us-central1-a' does not have enough "
     "resources available to fulfill the request. '(resource type:compute)'.", "capacity"),
    ("RESOURCE_POOL_EXHAUSTED", "The zone does not have enough resources available.", "capacity"),
    ("UNSUPPORTED_OPERATION_ZONE_NOT_AVAILABLE", "The zone is not available for this operation.", "unavailable"),
    ("QUOTA_EXCEEDED", "Quota 'NVIDIA_L4_GPUS' exceeded.  Limit: 0.0 in region us-central1.",
     "quota NVIDIA_L4_GPUS"),
    ("QUOTA_EXCEEDED", "Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 0.0 globally.",
     "quota GPUS_ALL_REGIONS (every region)"),
    ("QUOTA_EXCEEDED", "Quota exceeded.", "quota QUOTA_EXCEEDED"),
    ("RESOURCE_NOT_FOUND", "The resource 'projects/p/global/images/x' was not found", "bad-request"),
])
def test_each_compute_engine_operation_error_reads_as_its_row_says(code, message, said):
    """An operation's errors come as records (code, message) inside the finished operation, not as an exception."""
    assert meanings.meaning("gcp", code, message).said() == said


@pytest.mark.parametrize(("code", "message", "said"), [
    ("AllocationFailed", "Allocation failed. We do not have sufficient capacity for the requested VM size in this "
     "region.", "capacity"),
    ("ZonalAllocationFailed", "Allocation failed. We do not have sufficient capacity for the requested VM size in "
     "this zone.", "capacity"),
    ("OverconstrainedAllocationRequest", "Allocation failed. VM(s) with the following constraints cannot be "
     "allocated, because the condition is too restrictive.", "capacity"),
    ("OverconstrainedZonalAllocationRequest", "Allocation failed. VM(s) with the following constraints cannot be "
     "allocated in this zone.", "capacity"),
    ("SkuNotAvailable", "The requested size for resource '/subscriptions/s/resourceGroups/g/providers/"
     "Microsoft.Compute/virtualMachines/v' is currently not available in location 'eastus' zones '' for "
     "subscription 's'.", "capacity"),
    ("SpotPriceGreaterThanProvidedMaxPrice", "Unable to perform operation 'Create VM' since the provided maximum "
     "price '2 USD' is lower than the current spot price '3.2 USD' for Azure Spot VM size "
     "'Standard_ND96isr_H100_v5'.", "capacity"),
    ("QuotaExceeded", AZURE_CORE_QUOTA, "quota standardNDSH100v5Family"),
    ("QuotaExceeded", "Quota exceeded.", "quota QuotaExceeded"),
    ("OperationNotAllowed", AZURE_CORE_QUOTA, "quota standardNDSH100v5Family"),
    ("OperationNotAllowed", "Operation results in exceeding quota limits of Core. Maximum allowed: 10, Current in "
     "use: 10, Additional requested: 96.", "quota OperationNotAllowed"),
    ("OperationNotAllowed", "A VM of an RDMA size joins a scale set with a single placement group only.",
     "bad-request"),
    ("OperationNotAllowed", "Disk kiln-x-data-0 is attached to VM kiln-x-0.", "bad-request"),
    ("TooManyRequests", "The request is being throttled.", "transient"),
    ("RetryableError", "A retryable error occurred.", "transient"),
    ("InternalServerError", "An unexpected error occurred.", "transient"),
    ("InvalidParameter", "The value of parameter imageReference is invalid.", "bad-request"),
])
def test_each_resource_manager_error_reads_as_its_row_says(code, message, said):
    assert read("azure", arm_error(code, message)).said() == said


def test_every_row_is_a_known_verdict_with_a_source_and_is_reached():
    """No row is shadowed by one before it (each is the first match of some code and message)."""
    for cloud, rows in meanings.TABLES.items():
        for index, row in enumerate(rows):
            assert row.verdict in meanings.VERDICTS and row.source, (cloud, row)
            earlier = [r for r in rows[:index] if r.code == row.code]
            assert all(r.words for r in earlier), f"{cloud} {row.code}: row {index} follows one that takes any message"


def test_one_clouds_code_means_nothing_on_another():
    assert meanings.meaning("gcp", "InsufficientInstanceCapacity").verdict == "bad-request"
    assert meanings.meaning("aws", "").verdict == "bad-request"


def test_a_quota_of_every_region_skips_every_region_of_its_cloud_and_a_regional_one_only_its_region():
    order = [failover.Candidate("gcp", zone, "g2-standard-4", False)
             for zone in ("us-central1-a", "us-east1-b", "europe-west4-a")]
    order.append(failover.Candidate("aws", "us-east-1", "g6.xlarge", False))
    asked, said = [], []

    def attempt(candidate):
        asked.append(candidate.place)
        if candidate.cloud == "gcp":
            raise failover.CloudError("Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 0.0 globally.",
                                      code="QUOTA_EXCEEDED")
        return "up"

    assert failover.first_fit(order, attempt, said.append)[1] == order[-1]
    assert asked == ["us-central1-a", "us-east-1"]
    assert ("up: gcp us-central1: over a quota (QUOTA_EXCEEDED: GPUS_ALL_REGIONS): skipping every region of gcp"
            in said)

"""A fault-injecting HTTP hop in front of an EC2 endpoint (moto's server, in the tests): every request goes on to
the endpoint as it came, except those of an action a test names, in the region it names (and of the instance type,
or only spot or on-demand requests, where given), which the hop answers itself with EC2's own error response: the
Query API's XML error document, at the HTTP status EC2 sends (500 for the capacity errors, which EC2 lists as
server errors; 400 for the client errors such as the vCPU quota's). Nothing of a refused request reaches the
endpoint, as nothing is made by EC2. It also answers DescribeSpotPriceHistory in a region where a test set prices
(`price()`), as EC2's Query API does (moto gives every type one price), so that prices can order candidates, and
Service Quotas' GetServiceQuota for an EC2 quota a test set in a region (`quota()`), as that JSON API does (moto
serves VPC quotas alone), and the Price List's GetProducts from the on-demand prices a test set (`on_demand()`;
moto has no Price List); everything else, Service Quotas' other calls included, goes on to the endpoint. With `machines`
(testbed.ec2_machines), the instances launched in its region are real machines.

    with Ec2Faults(moto_endpoint) as hop:
        hop.fail("RunInstances", "us-east-1", "InsufficientInstanceCapacity")
        ... KILN_AWS_ENDPOINT_URL=hop.endpoint ...

The region is the one the request is signed for (its SigV4 credential scope), the action and instance type the
form fields boto3 sends.
"""

from __future__ import annotations

import http.client
import json
import re
import threading
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

from localcloud.guest import Served

if TYPE_CHECKING:
    from testbed.ec2_machines import Machines

SIGNER = re.compile(r"Credential=([^/]+)/")  # the access key id a request was signed with
SCOPE = re.compile(r"Credential=[^/]+/\d{8}/([a-z0-9-]+)/[a-z0-9-]+/aws4_request")
# EC2's messages for the errors tests ask for most (from its error code reference); others get a generic one.
MESSAGES = {
    "InsufficientInstanceCapacity": "We currently do not have sufficient {type} capacity in the Availability Zone "
                                    "you requested. Our system will be working on provisioning additional "
                                    "capacity. You can currently get {type} capacity by not specifying an "
                                    "Availability Zone in your request or choosing a different Availability Zone.",
    "VcpuLimitExceeded": "You have requested more vCPU capacity than your current vCPU limit of 0 allows for the "
                         "instance bucket that the specified instance type belongs to. Please visit "
                         "http://aws.amazon.com/contact-us/ec2-request to request an adjustment to this limit.",
}
SERVER_ERRORS = {"InsufficientInstanceCapacity", "InsufficientHostCapacity", "InsufficientCapacity",
                 "InsufficientReservedInstanceCapacity", "InternalError", "Unavailable"}


@dataclass
class Fault:
    action: str
    region: str
    code: str
    instance_type: str | None
    spot: bool | None  # only spot requests (True), only on-demand ones (False), or both
    message: str | None
    times: int | None = None  # how many more requests it answers (None: until clear())


class Ec2Faults(Served):
    def __init__(self, upstream: str, host: str = "127.0.0.1", machines: Machines | None = None):
        parts = urlsplit(upstream)
        self.machines = machines
        self.upstream = (parts.hostname, parts.port)
        self.faults: list[Fault] = []
        self.refused: list[tuple[str, str, str]] = []  # (action, region, code) of each request answered here
        self.prices: dict[str, list[tuple[str, str, float, datetime]]] = {}  # region -> (type, zone, USD, time)
        self.answered: list[tuple[str, str]] = []  # (action, region) of each request the hop answered itself
        self.launches: list[tuple[str, str]] = []  # (region, ClientToken or "") of every RunInstances that came
        self.signers: list[tuple[str, str]] = []  # (action, access key id) of every EC2 request that came
        self.quotas: dict[tuple[str, str], tuple[str, float]] = {}  # (region, code) -> (name, value): EC2's quotas
        self.list_prices: dict[tuple[str, str], float] = {}  # (region, type) -> USD an hour on demand
        self._lock = threading.Lock()
        server = ThreadingHTTPServer((host, 0), _handler(self))
        server.daemon_threads = True
        self.serve(server)

    def fail(self, action: str, region: str, code: str, *, instance_type: str | None = None,
             spot: bool | None = None, message: str | None = None, times: int | None = None) -> None:
        """Answer every `action` signed for `region` (of `instance_type`, and only for spot or on-demand machines,
        where given) with EC2's error `code` until clear(), or the first `times` of them."""
        with self._lock:
            self.faults.append(Fault(action, region, code, instance_type, spot, message, times))

    def price(self, region: str, instance_type: str, usd: float, zone: str | None = None,
              at: datetime | None = None) -> None:
        """Answer DescribeSpotPriceHistory in `region` itself from now on, with this entry among those given (one
        entry per zone and time, as EC2 keeps them; the zone defaults to the region's zone a)."""
        with self._lock:
            self.prices.setdefault(region, []).append(
                (instance_type, zone or f"{region}a", usd, at or datetime.now(UTC).replace(microsecond=0)))

    def on_demand(self, region: str, instance_type: str, usd: float) -> None:
        """Answer the Price List's GetProducts itself from now on, with this type's Linux on-demand price in
        `region` among those given."""
        with self._lock:
            self.list_prices[(region, instance_type)] = usd

    def price_list(self, body: bytes) -> bytes | None:
        """The Price List Query API's GetProducts answer (JSON 1.1) from the on-demand prices given (None: none
        given, the request goes on): the products matching its TERM_MATCH filters, each a JSON document in
        PriceList, as that API documents them; a filter on an attribute a product lacks matches none."""
        asked = json.loads(body or b"{}")
        with self._lock:
            given = dict(self.list_prices)
        if not given:
            return None
        terms = {f["Field"]: f["Value"] for f in asked.get("Filters", []) if f.get("Type") == "TERM_MATCH"}
        listed = []
        for (region, kind), usd in sorted(given.items()):
            attributes = {"instanceType": kind, "regionCode": region, "locationType": "AWS Region",
                          "operatingSystem": "Linux", "tenancy": "Shared", "preInstalledSw": "NA",
                          "licenseModel": "No License required", "capacitystatus": "Used", "marketoption": "OnDemand",
                          "servicecode": "AmazonEC2"}
            if asked.get("ServiceCode") != "AmazonEC2" or any(attributes.get(k) != v for k, v in terms.items()):
                continue
            sku = uuid.uuid5(uuid.NAMESPACE_URL, f"{region}/{kind}").hex[:16].upper()
            listed.append(json.dumps({
                "product": {"productFamily": "Compute Instance", "attributes": attributes, "sku": sku},
                "serviceCode": "AmazonEC2", "version": "20261101000000", "publicationDate": "2026-11-01T00:00:00Z",
                "terms": {"OnDemand": {f"{sku}.JRTCKXETXF": {
                    "offerTermCode": "JRTCKXETXF", "sku": sku, "effectiveDate": "2026-11-01T00:00:00Z",
                    "priceDimensions": {f"{sku}.JRTCKXETXF.6YS6EN2CT7": {
                        "unit": "Hrs", "endRange": "Inf", "beginRange": "0", "appliesTo": [],
                        "rateCode": f"{sku}.JRTCKXETXF.6YS6EN2CT7", "pricePerUnit": {"USD": f"{usd:.10f}"},
                        "description": f"${usd} per On Demand Linux {kind} Instance Hour"}},
                    "termAttributes": {}}}}}))
        with self._lock:
            self.answered.append(("GetProducts", terms.get("regionCode", "")))
        return json.dumps({"FormatVersion": asked.get("FormatVersion", "aws_v1"), "PriceList": listed}).encode()

    def quota(self, region: str, code: str, name: str, value: float) -> None:
        """Answer GetServiceQuota for EC2's quota `code` in `region` itself from now on: `value` (vCPUs)."""
        with self._lock:
            self.quotas[(region, code)] = (name, value)

    def service_quota(self, region: str, body: bytes) -> bytes | None:
        """Service Quotas' GetServiceQuota answer for a quota given in `region` (None: none given, it goes on)."""
        asked = json.loads(body or b"{}")
        with self._lock:
            found = self.quotas.get((region, asked.get("QuotaCode", ""))) if asked.get("ServiceCode") == "ec2" \
                else None
        if found is None:
            return None
        self.answered.append(("GetServiceQuota", region))
        name, value = found
        return json.dumps({"Quota": {
            "ServiceCode": "ec2", "ServiceName": "Amazon Elastic Compute Cloud (Amazon EC2)",
            "QuotaArn": f"arn:aws:servicequotas:{region}:123456789012:ec2/{asked['QuotaCode']}",
            "QuotaCode": asked["QuotaCode"], "QuotaName": name, "Value": value, "Unit": "None", "Adjustable": True,
            "GlobalQuota": False}}).encode()

    def clear(self) -> None:
        with self._lock:
            self.faults.clear()
            self.prices.clear()
            self.quotas.clear()
            self.list_prices.clear()
            self.answered.clear()

    def price_history(self, region: str, fields: dict[str, list[str]]) -> bytes | None:
        """EC2's DescribeSpotPriceHistory answer from the prices given for `region` (None: none given, the request
        goes on), filtered by the request's InstanceType.N and AvailabilityZone."""
        with self._lock:
            entries = list(self.prices.get(region, ()))
        if not entries:
            return None
        kinds = {v[0] for k, v in fields.items() if k.startswith("InstanceType.")}
        zone = (fields.get("AvailabilityZone") or [None])[0]
        items = "".join(
            f"<item><instanceType>{kind}</instanceType><productDescription>Linux/UNIX</productDescription>"
            f"<spotPrice>{usd:.6f}</spotPrice><timestamp>{at.strftime('%Y-%m-%dT%H:%M:%S.000Z')}</timestamp>"
            f"<availabilityZone>{where}</availabilityZone></item>"
            for kind, where, usd, at in entries if (not kinds or kind in kinds) and zone in (None, where))
        self.answered.append(("DescribeSpotPriceHistory", region))
        return (f'<?xml version="1.0" encoding="UTF-8"?>\n<DescribeSpotPriceHistoryResponse '
                f'xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>{uuid.uuid4()}</requestId>'
                f"<spotPriceHistorySet>{items}</spotPriceHistorySet><nextToken/></DescribeSpotPriceHistoryResponse>"
                ).encode()

    def fault_for(self, action: str, region: str, instance_type: str | None, spot: bool) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if (fault.action, fault.region) == (action, region) and \
                        fault.instance_type in (None, instance_type) and fault.spot in (None, spot):
                    self.refused.append((action, region, fault.code))
                    if fault.times is not None:
                        fault.times -= 1
                        if fault.times <= 0:
                            self.faults.remove(fault)
                    return fault
        return None



def error_document(code: str, message: str) -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>{code}</Code><Message>'
            f"{message}</Message></Error></Errors><RequestID>{uuid.uuid4()}</RequestID></Response>").encode()


def _handler(hop: Ec2Faults) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            self._serve()

        def do_GET(self) -> None:  # noqa: N802
            self._serve()

        def _serve(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            fields = parse_qs(body.decode(errors="replace")) if self.command == "POST" else {}
            scope = SCOPE.search(self.headers.get("Authorization", ""))
            action, region = (fields.get("Action") or [""])[0], scope.group(1) if scope else ""
            signer = SIGNER.search(self.headers.get("Authorization", ""))
            if action:
                with hop._lock:
                    hop.signers.append((action, signer.group(1) if signer else ""))
            if action == "RunInstances":
                with hop._lock:
                    hop.launches.append((region, (fields.get("ClientToken") or [""])[0]))
            machines = hop.machines
            if machines and action == "ImportKeyPair":
                machines.imported(region, fields)
            if machines and action == "RunInstances" and machines.short(region, fields):
                kind = (fields.get("InstanceType") or ["the"])[0]
                self._answer(500, {"Content-Type": "text/xml"}, error_document(
                    "InsufficientInstanceCapacity", MESSAGES["InsufficientInstanceCapacity"].format(type=kind)))
                return
            console = machines.console(region, fields) if machines and action == "GetConsoleOutput" else None
            if console is not None:
                self._answer(200, {"Content-Type": "text/xml;charset=UTF-8"}, console)
                return
            if self.headers.get("X-Amz-Target") == "ServiceQuotasV20190624.GetServiceQuota":
                quota = hop.service_quota(region, body)
                if quota is not None:
                    self._answer(200, {"Content-Type": "application/x-amz-json-1.1"}, quota)
                    return
            if self.headers.get("X-Amz-Target") == "AWSPriceListService.GetProducts":
                listed = hop.price_list(body)
                if listed is not None:
                    self._answer(200, {"Content-Type": "application/x-amz-json-1.1"}, listed)
                    return
            history = hop.price_history(region, fields) if action == "DescribeSpotPriceHistory" else None
            if history is not None:
                self._answer(200, {"Content-Type": "text/xml;charset=UTF-8"}, history)
                return
            fault = hop.fault_for(action, region, (fields.get("InstanceType") or [None])[0],
                                  (fields.get("InstanceMarketOptions.MarketType") or [""])[0] == "spot")
            if fault:
                message = fault.message or MESSAGES.get(fault.code, f"{fault.code} (from the test's fault hop)")
                kind = (fields.get("InstanceType") or ["the"])[0]
                self._answer(500 if fault.code in SERVER_ERRORS else 400, {"Content-Type": "text/xml"},
                             error_document(fault.code, message.format(type=kind)))
                return
            connection = http.client.HTTPConnection(*hop.upstream, timeout=120)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "host")}
                connection.request(self.command, self.path, body=body, headers=headers)
                answer = connection.getresponse()
                payload = answer.read()
                if machines and answer.status == 200:
                    if action == "RunInstances":
                        machines.launched(region, fields, payload)
                    elif action == "TerminateInstances":
                        machines.terminated(region, fields)
                    payload = machines.rewritten(payload)
                self._answer(answer.status, {k: v for k, v in answer.getheaders()
                                             if k.lower() not in ("connection", "transfer-encoding", "content-length")},
                             payload)
            finally:
                connection.close()

        def _answer(self, status: int, headers: dict[str, str], payload: bytes) -> None:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    return Handler

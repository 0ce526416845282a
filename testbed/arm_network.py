"""The ARM stand-in's Microsoft.Network handlers: virtual networks and their subnets, network security groups, public
IP addresses and network interfaces (a mixin of testbed.arm.Arm, which holds the state and the route table)."""

from __future__ import annotations

import copy
import ipaddress
import uuid

from azure.mgmt.network import models as network_models

from testbed import next_free
from testbed.arm_rules import (
    ArmError,
    ResourceId,
    address_space,
    check_name,
    default_security_rules,
    id_of,
    invalid_parameter,
    next_private_address,
    security_rules,
    subnet_network,
)
from testbed.arm_types import NIC, NSG, PIP, PUBLIC_RANGE, SUBNET, VNET, Reply, Request


class NetworkHandlers:
    """Microsoft.Network, as the network resource provider answers."""


    def _network_put(self, rid: ResourceId, stored: dict, old: dict | None) -> Reply:
        stored["properties"]["resourceGuid"] = (old or {}).get("properties", {}).get("resourceGuid") or \
            str(uuid.uuid4())
        stored["etag"] = f'W/"{uuid.uuid4()}"'
        op, status = self._store(rid, stored, old, "network", state="Updating")  # NRP says Updating for a create too
        return Reply(status, self._view(rid.key), self._op_headers(op, location=False))

    def _vnet_put(self, request: Request) -> Reply:
        rid, body, old = self._put_prologue(request, network_models.VirtualNetwork)
        props = body.get("properties") or {}
        space = address_space((props.get("addressSpace") or {}).get("addressPrefixes"), str(rid))
        subnets, taken = [], []
        for given in props.get("subnets") or []:
            name = given.get("name") or ""
            check_name(SUBNET, name)
            if any(name.lower() == other.lower() for other, _ in taken):
                raise ArmError(400, "InvalidRequestFormat", f"Subnet name {name} is used twice in {rid}.")
            network = subnet_network(given, space, rid.name, taken)
            taken.append((name, network))
            subnets.append(self._subnet_body(rid.child("subnets", name), given, network, body["location"]))
        for subnet in (old or {}).get("properties", {}).get("subnets", []):
            kept = next((s for s in subnets if self._same(s["id"], subnet["id"])), None)
            if kept is None:
                self._check_subnet_unused(subnet)
            elif kept["properties"]["addressPrefix"] != subnet["properties"]["addressPrefix"]:
                self._check_subnet_unused(subnet, "InUseSubnetCannotBeUpdated")
        stored = self._tracked(rid, body["location"], body["tags"], {
            **props, "addressSpace": {"addressPrefixes": [str(n) for n in space]}, "subnets": subnets,
            "virtualNetworkPeerings": props.get("virtualNetworkPeerings") or [],
            "enableDdosProtection": bool(props.get("enableDdosProtection"))})
        return self._network_put(rid, stored, old)

    def _subnet_body(self, rid: ResourceId, given: dict, network, location: str) -> dict:
        props = dict(given.get("properties") or {})
        nsg = id_of(props.get("networkSecurityGroup"))
        if nsg:
            props["networkSecurityGroup"] = {"id": self._reference(nsg, NSG, rid, location)["id"]}
        props.pop("addressPrefixes", None)
        props.update(addressPrefix=str(network), provisioningState="Succeeded",
                     privateEndpointNetworkPolicies=props.get("privateEndpointNetworkPolicies") or "Disabled",
                     privateLinkServiceNetworkPolicies=props.get("privateLinkServiceNetworkPolicies") or "Enabled")
        return {"name": rid.name, "id": str(rid), "etag": f'W/"{uuid.uuid4()}"', "type": SUBNET, "properties": props}

    def _check_subnet_unused(self, subnet: dict, code: str = "InUseSubnetCannotBeDeleted") -> None:
        users = self._ipconfigs(lambda c: self._same(id_of(c.get("subnet")), subnet["id"]))
        if users:
            verb = "deleted" if code.endswith("Deleted") else "updated"
            raise ArmError(400, code, f"Subnet {subnet['name']} is in use by {users[0]} and cannot be {verb}. In "
                                      "order to delete the subnet, delete all the resources within the subnet. See "
                                      "aka.ms/deletesubnet.")

    def _vnet_of(self, request: Request) -> tuple[ResourceId, dict]:
        self._group(request.params["group"])
        vnet_id = self._id(request.params["group"], VNET, request.params["n1"])
        if vnet_id.key not in self._resources:
            raise self._missing(vnet_id)
        return vnet_id, self._resources[vnet_id.key]

    def _subnet_put(self, request: Request) -> Reply:
        self._group(request.params["group"], live=True)
        vnet_id, vnet = self._vnet_of(request)
        rid = vnet_id.child("subnets", request.params["n2"])
        check_name(SUBNET, rid.name)
        given = {**self._parse(network_models.Subnet, request.body), "name": rid.name}
        subnets = vnet["properties"]["subnets"]
        old = next((s for s in subnets if self._same(s["id"], rid)), None)
        space = [ipaddress.ip_network(p) for p in vnet["properties"]["addressSpace"]["addressPrefixes"]]
        taken = [(s["name"], ipaddress.ip_network(s["properties"]["addressPrefix"])) for s in subnets if s is not old]
        subnet = self._subnet_body(rid, given, subnet_network(given, space, vnet_id.name, taken), vnet["location"])
        if old and old["properties"]["addressPrefix"] != subnet["properties"]["addressPrefix"]:
            self._check_subnet_unused(old, "InUseSubnetCannotBeUpdated")
        before = list(subnets)
        vnet["properties"]["subnets"] = [s for s in subnets if s is not old] + [subnet]
        subnet["properties"]["provisioningState"] = "Updating"

        def undo() -> None:
            vnet["properties"]["subnets"] = before

        op = self._begin("network", vnet["location"], lambda: subnet["properties"].update(
            provisioningState="Succeeded"), undo)
        return Reply(200 if old else 201, self._subnet_view(copy.deepcopy(subnet)),
                      self._op_headers(op, location=False))

    def _subnet_get(self, request: Request) -> Reply:
        vnet_id, vnet = self._vnet_of(request)
        rid = vnet_id.child("subnets", request.params["n2"])
        subnet = next((s for s in vnet["properties"]["subnets"] if self._same(s["id"], rid)), None)
        if subnet is None:
            raise self._missing(rid)
        return Reply(200, self._subnet_view(copy.deepcopy(subnet)))

    def _subnet_list(self, request: Request) -> Reply:
        _, vnet = self._vnet_of(request)
        return self._paged(request, [self._subnet_view(copy.deepcopy(s)) for s in vnet["properties"]["subnets"]])

    def _subnet_delete(self, request: Request) -> Reply:
        vnet_id, vnet = self._vnet_of(request)
        rid = vnet_id.child("subnets", request.params["n2"])
        subnet = next((s for s in vnet["properties"]["subnets"] if self._same(s["id"], rid)), None)
        if subnet is None:
            return Reply(204)
        self._check_subnet_unused(subnet)
        subnet["properties"]["provisioningState"] = "Deleting"

        def finish() -> None:
            vnet["properties"]["subnets"] = [s for s in vnet["properties"]["subnets"] if s is not subnet]

        op = self._begin("network", vnet["location"], finish,
                         lambda: subnet["properties"].update(provisioningState="Succeeded"))
        return Reply(202, None, self._op_headers(op))

    def _nsg_put(self, request: Request) -> Reply:
        rid, body, old = self._put_prologue(request, network_models.NetworkSecurityGroup)
        props = body.get("properties") or {}
        stored = self._tracked(rid, body["location"], body["tags"], {
            **props, "securityRules": security_rules(props.get("securityRules"), str(rid)),
            "defaultSecurityRules": default_security_rules(str(rid))})
        return self._network_put(rid, stored, old)

    def _pip_put(self, request: Request) -> Reply:
        rid, body, old = self._put_prologue(request, network_models.PublicIPAddress)
        sku = body.get("sku") or {}
        if (sku.get("name") or "Standard") != "Standard":
            raise invalid_parameter(f"Public IP address {rid}: this stand-in serves the Standard SKU only (Basic SKU "
                                    "public IP addresses were retired on 30 September 2025).", "sku")
        props = body.get("properties") or {}
        if (props.get("publicIPAllocationMethod") or "Static") != "Static":
            raise ArmError(400, "StandardSkuPublicIPAddressesMustBeStatic",
                           f"Standard sku publicIp {rid} must have AllocationMethod set to Static.")
        if (props.get("publicIPAddressVersion") or "IPv4") != "IPv4":
            raise invalid_parameter("This stand-in serves IPv4 public IP addresses only.", "publicIPAddressVersion")
        address = (old or {}).get("properties", {}).get("ipAddress") or self._public_address()
        stored = self._tracked(rid, body["location"], body["tags"], {
            **props, "publicIPAllocationMethod": "Static", "publicIPAddressVersion": "IPv4", "ipAddress": address,
            "idleTimeoutInMinutes": props.get("idleTimeoutInMinutes") or 4, "ipTags": props.get("ipTags") or [],
            "ddosSettings": props.get("ddosSettings") or {"protectionMode": "VirtualNetworkInherited"}},
            sku={"name": "Standard", "tier": sku.get("tier") or "Regional"},
            **({"zones": body["zones"]} if body.get("zones") else {}))
        return self._network_put(rid, stored, old)

    def _public_address(self) -> str:
        """The next free address of PUBLIC_RANGE, round robin (a deleted address is not handed out at once)."""
        used = {p["properties"]["ipAddress"] for _, p in self._of_type(PIP)}
        found = next_free([str(host) for host in PUBLIC_RANGE.hosts()], used, self._next_public)
        if found is None:
            raise ArmError(409, "PublicIPCountLimitReached", "Cannot create more than 254 public IP addresses for "
                                                             "this subscription in this region.")
        address, self._next_public = found
        return address

    def _nic_put(self, request: Request) -> Reply:
        rid, body, old = self._put_prologue(request, network_models.NetworkInterface)
        location, props = body["location"], body.get("properties") or {}
        configs = props.get("ipConfigurations") or []
        if not configs:
            raise ArmError(400, "InvalidRequestFormat", f"Network interface {rid} must have one or more IP "
                                                        "configurations.")
        if len(configs) > 1 and sum(bool((c.get("properties") or {}).get("primary")) for c in configs) != 1:
            raise ArmError(400, "InvalidRequestFormat", f"Network interface {rid} must have exactly one primary IP "
                                                        "configuration.")
        nsg = id_of(props.get("networkSecurityGroup"))
        others = [c for k, nic in self._of_type(NIC) if k != rid.key for c in nic["properties"]["ipConfigurations"]]
        used = {c["properties"]["privateIPAddress"] for c in others}
        former = {c["name"].lower(): c["properties"] for c in (old or {}).get("properties", {}).get(
            "ipConfigurations", [])}
        kept = []
        for index, config in enumerate(configs):
            name = config.get("name") or f"ipconfig{index + 1}"
            if any(name.lower() == k["name"].lower() for k in kept):
                raise ArmError(400, "InvalidRequestFormat", f"IP configuration name {name} is used twice in {rid}.")
            given = config.get("properties") or {}
            config_id = f"{rid}/ipConfigurations/{name}"
            subnet = self._subnet_of(id_of(given.get("subnet")), rid, location)
            network = ipaddress.ip_network(subnet["properties"]["addressPrefix"])
            method = given.get("privateIPAllocationMethod") or "Dynamic"
            before = former.get(name.lower(), {})
            if method == "Static":
                address = given.get("privateIPAddress") or ""
                try:
                    inside = ipaddress.ip_address(address) in network
                except ValueError:
                    inside = False
                if not inside:
                    raise ArmError(400, "PrivateIPAddressNotInSubnet",
                                   f"IP configuration {config_id} is referencing private IP address {address} which "
                                   f"does not belong to subnet {subnet['id']}.")
                if address in used:
                    raise ArmError(400, "PrivateIPAddressInUse",
                                   f"IP configuration {config_id} is using the private IP address {address} which "
                                   "is already allocated to another resource.")
            elif self._same(id_of(before.get("subnet")), subnet["id"]):
                address = before["privateIPAddress"]
            else:
                address = next_private_address(network, used)
            used.add(address)
            stored_config = {**given, "privateIPAddress": address, "privateIPAllocationMethod": method,
                             "privateIPAddressVersion": "IPv4", "subnet": {"id": subnet["id"]},
                             "primary": len(configs) == 1 or bool(given.get("primary")),
                             "provisioningState": "Succeeded"}
            public = id_of(given.get("publicIPAddress"))
            if public:
                stored_config["publicIPAddress"] = {"id": self._reference(public, PIP, rid, location)["id"]}
                holder = next((c["id"] for c in others
                               if self._same(id_of(c["properties"].get("publicIPAddress")), public)), None)
                if holder:
                    raise ArmError(400, "PublicIPAddressInUse",
                                   f"Resource {public} is referenced by resource {holder}. A public IP address can "
                                   "be associated with one IP configuration only.")
            kept.append({"name": name, "id": config_id, "etag": f'W/"{uuid.uuid4()}"',
                         "type": "Microsoft.Network/networkInterfaces/ipConfigurations", "properties": stored_config})
        nic_props = {**props, "ipConfigurations": kept, "dnsSettings": props.get("dnsSettings") or {
            "dnsServers": [], "appliedDnsServers": []}, "enableAcceleratedNetworking": bool(
            props.get("enableAcceleratedNetworking")), "enableIPForwarding": bool(props.get("enableIPForwarding")),
            "nicType": "Standard", "hostedWorkloads": [], "tapConfigurations": [], "disableTcpStateTracking": False,
            "vnetEncryptionSupported": False, "auxiliaryMode": "None", "auxiliarySku": "None"}
        if nsg:
            nic_props["networkSecurityGroup"] = {"id": self._reference(nsg, NSG, rid, location)["id"]}
        return self._network_put(rid, self._tracked(rid, location, body["tags"], nic_props), old)

"""Who may do what in the ARM stand-in (testbed.arm): VMs' system-assigned managed identities and the tokens the
metadata service gives them, role assignments, and the check Azure RBAC makes on every call.

As Azure does it:
- A VM whose `identity.type` is SystemAssigned has a service principal (principalId, tenantId) for as long as it
  has that identity; a token for it comes from the VM's metadata service (localcloud.imds asks `token_for`).
- A role assignment (`Microsoft.Authorization/roleAssignments/{GUID}` under any scope, api-version 2022-04-01)
  grants a role definition's actions to a principal at a scope and every resource below it. ARM refuses a name
  that is not a GUID (InvalidRoleAssignmentId), a role it does not know (RoleDefinitionDoesNotExist), a principal
  the directory does not have (PrincipalNotFound: a new identity's principal reaches the directory only
  `principal_delay` seconds after it is made), and a second assignment of the same role to the same principal
  at the same scope (RoleAssignmentExists). An assignment outlives its principal and its scope: deleting a VM or
  a group leaves its assignments behind, granting nothing ("Identity not found" in the portal), until deleted.
- A call made with a managed identity's token is allowed only what an assignment of that principal grants: the
  operation's action (`Microsoft.Compute/virtualMachines/deallocate/action`) matched against the role's actions
  (wildcards as Azure writes them), else 403 AuthorizationFailed; the status of an operation it started is its
  own to poll. The operator's token may do everything, except
  what a test refuses it (`deny`), as a Contributor who may not assign roles is refused.

Only the built-in roles below are known, with their published actions.
"""

from __future__ import annotations

import re
import secrets
import time
import uuid
from dataclasses import dataclass, field

from testbed.arm_rules import ArmError

AUTHORIZATION_API = "2022-04-01"
TENANT = "8c5d3a3e-1f2b-4c6d-9e8f-0a1b2c3d4e5f"
OPERATOR = "3f6a0c2e-5b7d-4e9f-8a1c-2d3e4f5a6b7c"  # the object id of whoever holds the operator's token
ROLES = {
    # published built-in roles, with the actions the stand-in can be asked about
    "9980e02c-c2be-4d73-94e8-173b1dc7cf3c": ("Virtual Machine Contributor", (
        "Microsoft.Authorization/*/read", "Microsoft.Compute/availabilitySets/*", "Microsoft.Compute/locations/*",
        "Microsoft.Compute/virtualMachines/*", "Microsoft.Compute/virtualMachineScaleSets/*",
        "Microsoft.Compute/disks/write", "Microsoft.Compute/disks/read", "Microsoft.Compute/disks/delete",
        "Microsoft.Network/networkInterfaces/*", "Microsoft.Network/publicIPAddresses/read",
        "Microsoft.Resources/subscriptions/resourceGroups/read")),
    "40c5ff49-9181-41f8-ae61-143b0e78555e": ("Desktop Virtualization Power On Off Contributor", (
        "Microsoft.Compute/virtualMachines/start/action", "Microsoft.Compute/virtualMachines/read",
        "Microsoft.Compute/virtualMachines/instanceView/read", "Microsoft.Compute/virtualMachines/deallocate/action",
        "Microsoft.Compute/virtualMachines/restart/action", "Microsoft.Compute/virtualMachines/powerOff/action",
        "Microsoft.Insights/eventtypes/values/read", "Microsoft.Authorization/*/read",
        "Microsoft.Insights/alertRules/*", "Microsoft.Resources/deployments/*",
        "Microsoft.Resources/subscriptions/resourceGroups/read",
        "Microsoft.DesktopVirtualization/hostpools/read", "Microsoft.DesktopVirtualization/hostpools/write",
        "Microsoft.DesktopVirtualization/hostpools/sessionhosts/read",
        "Microsoft.DesktopVirtualization/hostpools/sessionhosts/write")),
    "acdd72a7-3385-48ef-bd42-f606fba81ae7": ("Reader", ("*/read",)),
}
ACTIONS = {  # the action an operation needs, where it is not the type's read, write or delete
    "virtualMachines.deallocate": "Microsoft.Compute/virtualMachines/deallocate/action",
    "virtualMachines.powerOff": "Microsoft.Compute/virtualMachines/powerOff/action",
    "virtualMachines.start": "Microsoft.Compute/virtualMachines/start/action",
    "virtualMachines.retrieveBootDiagnosticsData":
        "Microsoft.Compute/virtualMachines/retrieveBootDiagnosticsData/action",
    "virtualMachines.instanceView": "Microsoft.Compute/virtualMachines/instanceView/read",
    "computeOperations.get": "Microsoft.Compute/locations/operations/read",
    "diskOperations.get": "Microsoft.Compute/locations/DiskOperations/read",
    "resourceGroups.list": "Microsoft.Resources/subscriptions/resourceGroups/read",
    "resourceGroups.get": "Microsoft.Resources/subscriptions/resourceGroups/read",
    "resourceGroups.checkExistence": "Microsoft.Resources/subscriptions/resourceGroups/read",
    "resourceGroups.createOrUpdate": "Microsoft.Resources/subscriptions/resourceGroups/write",
    "resourceGroups.delete": "Microsoft.Resources/subscriptions/resourceGroups/delete",
}
# the status and result URLs of long-running operations: Azure lets the caller that started one poll it
OPERATION_POLLS = frozenset({"computeOperations.get", "diskOperations.get", "networkOperations.get",
                             "networkOperationResults.get", "operationResults.get"})
VERBS = {"GET": "read", "HEAD": "read", "PUT": "write", "PATCH": "write", "DELETE": "delete", "POST": "action"}
GUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.IGNORECASE)
ROLE_ID = re.compile(r"/subscriptions/(?P<sub>[^/]+)/providers/Microsoft\.Authorization/roleDefinitions/"
                     r"(?P<role>[^/]+)", re.IGNORECASE)
ASSIGNMENT_FIELDS = {"roleDefinitionId", "principalId", "principalType", "description", "condition",
                     "conditionVersion", "delegatedManagedIdentityResourceId"}


def action_of(operation: str, verb: str, path: str) -> str:
    """The action a call needs: named for actions and reads of a part, else the resource type's verb."""
    if operation in ACTIONS:
        return ACTIONS[operation]
    at = path.lower().rfind("/providers/")
    if at < 0:
        return f"Microsoft.Resources/subscriptions/{VERBS[verb]}"
    namespace, *parts = path[at + len("/providers/"):].split("/")
    return f"{namespace}/{'/'.join(parts[0::2])}/{VERBS[verb]}"  # type, name, child type, name...


def grants(patterns: tuple[str, ...], action: str) -> bool:
    """Whether one of a role's actions (with `*` wildcards, case-insensitive) covers `action`."""
    return any(re.fullmatch(".*".join(map(re.escape, p.split("*"))), action, re.IGNORECASE) for p in patterns)


def within(scope: str, target: str) -> bool:
    """Whether `target` is `scope` or below it."""
    scope, target = scope.rstrip("/").lower(), target.rstrip("/").lower()
    return target == scope or target.startswith(scope + "/")


def authorization_failed(who: str, action: str, scope: str) -> ArmError:
    return ArmError(403, "AuthorizationFailed",
                    f"The client '{who}' with object id '{who}' does not have authorization to perform action "
                    f"'{action}' over scope '{scope}' or the scope is invalid. If access was recently granted, "
                    "please refresh your credentials.")


@dataclass
class Access:
    """The directory and the role assignments of the stand-in's one subscription (the caller holds its lock)."""

    subscription: str
    principals: dict[str, str] = field(default_factory=dict)  # principal id -> the id of the VM that has it
    tokens: dict[str, str] = field(default_factory=dict)  # token -> principal id
    assignments: dict[str, dict] = field(default_factory=dict)  # assignment id (lower case) -> as ARM shows it
    denied: set[str] = field(default_factory=set)  # actions refused to the operator
    principal_delay: float = 0.0  # seconds before a new principal is in the directory
    born: dict[str, float] = field(default_factory=dict)  # principal id -> when it was made (monotonic)

    # ---------------------------------------------------------------------------- identities

    def identity(self, vm_id: str, given: dict | None, kept: dict | None) -> dict | None:
        """A VM's identity as ARM keeps it, from the one a PUT gives and the one the VM had: SystemAssigned keeps
        (or makes) its principal; None or type None drops it."""
        kind = (given or {}).get("type") or ("None" if given is not None else None)
        if kind is None:
            return kept
        if kind == "None":
            self.forget(vm_id)
            return None
        if kind != "SystemAssigned":
            raise ArmError(400, "InvalidParameter", f"Identity type '{kind}' is not served by the stand-in: only "
                                                    "SystemAssigned or None.", "identity.type")
        principal = (kept or {}).get("principalId") or str(uuid.uuid4())
        self.principals[principal] = vm_id
        self.born.setdefault(principal, time.monotonic())
        return {"type": "SystemAssigned", "principalId": principal, "tenantId": TENANT}

    def forget(self, vm_id: str) -> None:
        """The VM's identity goes (the VM is deleted, or its identity removed): its principal and tokens too."""
        gone = {p for p, vm in self.principals.items() if vm.lower() == vm_id.lower()}
        for principal in gone:
            self.principals.pop(principal)
            self.born.pop(principal, None)
        for token in [t for t, p in self.tokens.items() if p in gone]:
            self.tokens.pop(token)

    def token_for(self, vm_id: str) -> str | None:
        """A token for the VM's managed identity, as its metadata service gives it; None if it has none."""
        principal = next((p for p, vm in self.principals.items() if vm.lower() == vm_id.lower()), None)
        if principal is None:
            return None
        token = secrets.token_urlsafe(32)
        self.tokens[token] = principal
        return token

    # ---------------------------------------------------------------------------- the check

    def check(self, principal: str | None, operation: str, verb: str, path: str) -> None:
        """Raise 403 unless the caller (None: the operator) may make this call."""
        action = action_of(operation, verb, path)
        if principal is None:
            if action in self.denied:
                raise authorization_failed(OPERATOR, action, path)
            return
        for assignment in self.assignments.values():
            props = assignment["properties"]
            if props["principalId"] != principal or not within(props["scope"], path):
                continue
            role = ROLE_ID.fullmatch(props["roleDefinitionId"])["role"].lower()
            if grants(ROLES[role][1], action):
                return
        raise authorization_failed(principal, action, path)

    # ---------------------------------------------------------------------------- role assignments

    def assignment_id(self, scope: str, name: str) -> str:
        return f"{scope.rstrip('/')}/providers/Microsoft.Authorization/roleAssignments/{name}"

    def put(self, scope: str, name: str, body: object) -> tuple[int, dict]:
        """Create a role assignment (ARM does not update one): its status and body."""
        if not GUID.fullmatch(name):
            raise ArmError(400, "InvalidRoleAssignmentId", f"The role assignment ID '{name}' is not valid. The role "
                                                           "assignment ID must be a GUID.")
        props = body.get("properties") if isinstance(body, dict) else None
        if not isinstance(props, dict) or set(body) - {"properties"}:
            raise ArmError(400, "InvalidRequestContent", "The request content was invalid and could not be "
                                                         "deserialized: 'properties' is required, and alone.")
        unknown = set(props) - ASSIGNMENT_FIELDS
        if unknown:
            raise ArmError(400, "InvalidRequestContent", f"The request content was invalid and could not be "
                                                         f"deserialized: could not find member '{sorted(unknown)[0]}'")
        role = ROLE_ID.fullmatch(str(props.get("roleDefinitionId") or ""))
        if not role or role["sub"] != self.subscription or role["role"].lower() not in ROLES:
            raise ArmError(400, "RoleDefinitionDoesNotExist", f"The specified role definition with ID "
                                                              f"'{props.get('roleDefinitionId')}' does not exist.")
        principal = str(props.get("principalId") or "")
        if principal not in self.principals or time.monotonic() - self.born[principal] < self.principal_delay:
            raise ArmError(400, "PrincipalNotFound", f"Principal {principal.replace('-', '')} does not exist in the "
                                                     f"directory {TENANT}. Check that you have the correct principal "
                                                     "ID.")
        if props.get("principalType") not in (None, "ServicePrincipal"):
            raise ArmError(400, "PrincipalTypeNotSupported", f"Principal {principal} is a ServicePrincipal, not a "
                                                             f"{props['principalType']}.")
        key = self.assignment_id(scope, name)
        wanted = {"roleDefinitionId": props["roleDefinitionId"], "principalId": principal, "scope": scope}
        old = self.assignments.get(key.lower())
        if old:
            if {k: old["properties"][k] for k in wanted} != wanted:
                raise ArmError(409, "RoleAssignmentUpdateNotPermitted", "Tenant ID, application ID, principal ID, "
                                                                        "and scope are not allowed to be updated.")
            return 201, old
        if any({k: a["properties"][k] for k in wanted} == wanted for a in self.assignments.values()):
            raise ArmError(409, "RoleAssignmentExists", "The role assignment already exists.")
        made = {"id": key, "type": "Microsoft.Authorization/roleAssignments", "name": name, "properties": {
            **wanted, "principalType": "ServicePrincipal", "createdBy": OPERATOR, "updatedBy": OPERATOR,
            **({"description": props["description"]} if props.get("description") else {})}}
        self.assignments[key.lower()] = made
        return 201, made

    def get(self, scope: str, name: str) -> dict:
        found = self.assignments.get(self.assignment_id(scope, name).lower())
        if found is None:
            raise ArmError(404, "RoleAssignmentNotFound", f"The role assignment '{name}' is not found.")
        return found

    def delete(self, scope: str, name: str) -> dict | None:
        return self.assignments.pop(self.assignment_id(scope, name).lower(), None)


"""The ARM stand-in's virtual machine scale sets (a mixin of testbed.arm.Arm, which holds the state and the route
table): Microsoft.Compute/virtualMachineScaleSets made, read, listed and deleted, and the rules a VM meets when it
names one (properties.virtualMachineScaleSet), as CRP answers them.

The stand-in makes no instances from a scale set's profile: a set is made with a capacity of 0 (or none), and VMs
join a Flexible one by naming it, as `kiln up` makes them. Where each rule comes from:

- ORCHESTRATION: learn.microsoft.com/azure/virtual-machine-scale-sets/virtual-machine-scale-sets-orchestration-modes
  (the mode is set at creation and cannot change; Flexible: single placement group "optional ... set based on
  first VM deployed", null lets the platform choose; InfiniBand in a scale set: one placement group only).
- FAULT_DOMAINS: .../virtual-machine-scale-sets-manage-fault-domains (Flexible, regional: 1, 2 or 3, default 1).
- ATTACH: .../virtual-machine-scale-sets-attach-detach-vm (VMs join Flexible sets only, in the set's resource
  group; its error table: a set that is not Flexible, an id that changes, a size that needs a single placement
  group, RDMA sizes attached or detached after creation, a VM in a placement group attached later).
- SINGLE_PLACEMENT: learn.microsoft.com/azure/virtual-machines/setup-infiniband ("in a virtual machine scale set,
  ... limit the deployment to a single placement group for InfiniBand communication", applies to Flexible sets),
  Azure/azure-cli#21834 (CRP: Flexible sets with such sizes "can only use VM Size X, if single placement group on
  such Virtual Machine Scale Sets is set to true", OperationNotAllowed), and the REST reference of
  singlePlacementGroup (false may not become true).
- PLACEMENT_GROUP: .../virtual-machine-scale-sets/proximity-placement-groups (set the group on the scale set rather
  than on its VMs) and the orchestration modes' table (Flexible: "Cannot be changed after deployment").

Stricter than Azure, knowingly: a scale set with VMs in it cannot be deleted (409; the docs do not say what a
Flexible set's delete does to its VMs, so the stand-in makes the caller delete them first), and a VM naming another
placement group than its scale set's is refused (400; the rule availability sets have).
"""

from __future__ import annotations

import uuid

from azure.mgmt.compute import models as compute_models

from testbed.arm_rules import ArmError, ResourceId, VmSize, id_of, invalid_parameter
from testbed.arm_types import PPG, VM, VMSS, Reply, Request

MODES = ("Uniform", "Flexible")
FLEXIBLE_FAULT_DOMAINS = (1, 2, 3)  # FAULT_DOMAINS, a regional set


def not_allowed(message: str, target: str | None = None) -> ArmError:
    return ArmError(409, "OperationNotAllowed", message, target)


def change_not_allowed(name: str) -> ArmError:
    return ArmError(409, "PropertyChangeNotAllowed", f"Changing property '{name}' is not allowed.", name)


class ScaleSetHandlers:
    """Microsoft.Compute virtual machine scale sets, as CRP answers; the rules of a VM that joins one."""

    def _vmss_put(self, request: Request) -> Reply:
        rid, body, old = self._put_prologue(request, compute_models.VirtualMachineScaleSet)
        props = body.get("properties") or {}
        mode = props.get("orchestrationMode") or "Uniform"  # the REST API's default
        if mode not in MODES:
            raise invalid_parameter(f"The value '{mode}' of parameter 'orchestrationMode' is not allowed. Allowed "
                                    f"values are {', '.join(MODES)}.", "orchestrationMode")
        kept = old["properties"] if old else {}
        if old and mode != kept["orchestrationMode"]:  # ORCHESTRATION
            raise change_not_allowed("orchestrationMode")
        if mode == "Uniform" and not props.get("virtualMachineProfile"):
            raise invalid_parameter("Required parameter 'virtualMachineProfile' is missing (null).",
                                    "virtualMachineProfile")
        if ((body.get("sku") or {}).get("capacity") or 0) != 0:
            raise invalid_parameter("This stand-in makes no scale set instances: give sku.capacity 0, and make VMs "
                                    "that name the (Flexible) scale set.", "sku.capacity")
        domains = props.get("platformFaultDomainCount")
        if mode == "Flexible":
            domains = 1 if domains is None else domains
            if domains not in FLEXIBLE_FAULT_DOMAINS:
                raise invalid_parameter(f"The value {domains} of parameter 'platformFaultDomainCount' is invalid: a "
                                        "regional Flexible scale set takes 1, 2 or 3.", "platformFaultDomainCount")
        if old and domains != kept.get("platformFaultDomainCount"):
            raise change_not_allowed("platformFaultDomainCount")
        single = props.get("singlePlacementGroup", kept.get("singlePlacementGroup"))
        if old and kept.get("singlePlacementGroup") is False and single:  # SINGLE_PLACEMENT
            raise invalid_parameter("singlePlacementGroup that is false may not be changed to true.",
                                    "singlePlacementGroup")
        ppg = self._placement_group(props, body["location"], "virtual machine scale set")
        if old and ppg != id_of(kept.get("proximityPlacementGroup")) and (
                ppg or kept.get("proximityPlacementGroup")):  # PLACEMENT_GROUP
            raise change_not_allowed("proximityPlacementGroup")
        stored_props = {k: v for k, v in props.items() if v is not None}
        stored_props.update(orchestrationMode=mode, singlePlacementGroup=single,
                            uniqueId=kept.get("uniqueId") or str(uuid.uuid4()),
                            timeCreated=kept.get("timeCreated") or self._now())
        if domains is not None:
            stored_props["platformFaultDomainCount"] = domains
        if ppg:
            stored_props["proximityPlacementGroup"] = {"id": ppg}
        if single is None:
            stored_props.pop("singlePlacementGroup")
        extra = {k: body[k] for k in ("sku", "zones") if body.get(k)}
        stored = self._tracked(rid, body["location"], body["tags"], stored_props, **extra)
        op, status = self._store(rid, stored, old, "compute", state="Updating" if old else "Creating")
        return Reply(status, self._view(rid.key), self._op_headers(op, location=False))

    def _placement_group(self, props: dict, location: str, holder: str) -> str:
        """The id of the proximity placement group a VM or a scale set (`holder`) names ("" for none): 404 where it
        does not exist, 400 where it is in another location."""
        ref = id_of(props.get("proximityPlacementGroup"))
        if not ref:
            return ""
        _, stored = self._stored_as(ref, PPG)
        if stored is None:
            raise ArmError(404, "NotFound", f"The Resource '{ref}' was not found.", "proximityPlacementGroup")
        if stored["location"] != location:
            raise invalid_parameter(f"Proximity placement group {ref} is in location '{stored['location']}', not in "
                                    f"the {holder}'s '{location}'.", "proximityPlacementGroup")
        return stored["id"]

    def _vmss_members(self, key: str) -> list[str]:
        """The ids of the VMs that name the scale set."""
        return [vm["id"] for _, vm in self._of_type(VM)
                if self._same(id_of(vm["properties"].get("virtualMachineScaleSet")), key)]

    def _vm_scale_set(self, props: dict, old: dict | None, rid: ResourceId, location: str, size_name: str,
                      size: VmSize, ppg: str) -> dict | None:
        """The scale set a VM's PUT names, as the VM keeps it ({"id": ...}, or None); 4xx where CRP refuses it
        (ATTACH, SINGLE_PLACEMENT, PLACEMENT_GROUP)."""
        ref = id_of(props.get("virtualMachineScaleSet"))
        before = id_of((old or {}).get("properties", {}).get("virtualMachineScaleSet"))
        if before and ref and not self._same(ref, before):
            raise change_not_allowed("virtualMachineScaleSet.id")
        if before and not ref:  # detached
            stored = self._resources.get(before.lower())
            if size.rdma:
                raise not_allowed(f"Virtual Machine Scale Set does not support detaching RDMA capable VM Sizes such "
                                  f"as {size_name}. Please see https://aka.ms/vmo/attachdetach for more "
                                  "information.")
            if stored and stored["properties"].get("singlePlacementGroup"):
                raise not_allowed(f"Virtual Machine Scale Set '{stored['name']}' does not support detaching Virtual "
                                  "Machine from it because the Virtual Machine Scale Set has single placement group "
                                  "set to true. Please see https://aka.ms/vmo/attachdetach for more information.")
            return None
        if not ref:
            return None
        set_id, stored = self._stored_as(ref, VMSS)
        if stored is None:
            raise ArmError(404, "NotFound", f"The Virtual Machine Scale Set '{ref}' referenced by the Virtual Machine "
                                            "does not exist.", "virtualMachineScaleSet")
        kept = stored["properties"]
        if kept["orchestrationMode"] != "Flexible":
            raise not_allowed(f"This operation is not allowed because referenced Virtual Machine Scale Set "
                              f"'{stored['name']}' does not have orchestration mode set to 'Flexible'.")
        if set_id.group.lower() != rid.group.lower():
            raise invalid_parameter(f"The virtual machine {rid.name} and the Virtual Machine Scale Set "
                                    f"{stored['name']} it references must be in the same resource group.",
                                    "virtualMachineScaleSet")
        if stored["location"] != location:
            raise invalid_parameter(f"Virtual Machine Scale Set {stored['id']} is in location '{stored['location']}', "
                                    f"not in the virtual machine's '{location}'.", "virtualMachineScaleSet")
        set_ppg = id_of(kept.get("proximityPlacementGroup"))
        if ppg and set_ppg and not self._same(ppg, set_ppg):
            raise invalid_parameter(f"The proximity placement group {ppg} of virtual machine {rid.name} is not the "
                                    f"one of its Virtual Machine Scale Set, {set_ppg}.", "proximityPlacementGroup")
        single = kept.get("singlePlacementGroup")
        if old and not before:  # an existing VM attached
            if size.rdma:
                raise not_allowed(f"Virtual Machine Scale Set does not support attaching RDMA capable VM Sizes such "
                                  f"as {size_name}. Please see https://aka.ms/vmo/attachdetach for more "
                                  "information.")
            if single is not False:
                raise ArmError(409, "VmssDoesNotSupportAttachingWithSpg", f"Virtual Machine Scale Set "
                               f"'{stored['name']}' does not support attaching an existing Virtual Machine to it "
                               "because the Virtual Machine Scale Set has single placement group set to true or does "
                               "not have single placement group explicitly set to false. Please see "
                               "https://aka.ms/vmo/attachdetach for more information.")
            if id_of(old["properties"].get("proximityPlacementGroup")):
                raise ArmError(409, "VmssDoesNotSupportAttachingPPGVM", f"Referenced Virtual Machine '{rid.name}' "
                               "belongs to a proximity placement group (PPG) and attaching to a Virtual Machine Scale "
                               "Set is not supported. For more information, see https://aka.ms/vmo/attachdetach.")
            if kept.get("platformFaultDomainCount", 1) > 1:
                raise ArmError(409, "VmssDoesNotSupportAttachingExistingVMMultiFD", f"Referenced Virtual Machine "
                               f"Scale Set '{stored['name']}' does not support attaching an existing Virtual Machine "
                               "to it because the Virtual Machine Scale Set has more than 1 fault domains. For more "
                               "information, see https://aka.ms/vmo/attachdetach.")
        if size.rdma and single is False:
            raise not_allowed(f"Virtual Machine Scale Set does not support attaching Virtual Machine {rid.name} "
                              f"because it uses VM Size {size_name} which can only be used with a single placement "
                              "group enabled Virtual Machine Scale Set. Please see https://aka.ms/vmo/attachdetach "
                              "for more information.")
        return {"id": stored["id"]}

    def _vmss_first_member(self, scale_set: dict, size: VmSize) -> None:
        """A Flexible set whose single placement group was not given takes it from its first VM (ORCHESTRATION):
        true for an RDMA size."""
        self._resources[scale_set["id"].lower()]["properties"].setdefault("singlePlacementGroup", size.rdma)

    def _check_scale_set_deletable(self, rid: ResourceId) -> None:
        if rid.type == VMSS and (members := self._vmss_members(rid.key)):
            raise not_allowed(f"Virtual Machine Scale Set {rid.name} cannot be deleted while Virtual Machines are "
                              f"in it: {', '.join(members)}. Delete them first.")

"""The ARM stand-in's disk and placement handlers: managed disks, snapshots and proximity placement groups (a mixin
of testbed.arm.Arm, which holds the state and the route table)."""

from __future__ import annotations

import copy
import uuid

from azure.mgmt.compute import models as compute_models

from testbed.arm_rules import (
    ArmError,
    ResourceId,
    invalid_parameter,
    parse_id,
)
from testbed.arm_types import DISK, SNAPSHOT, Reply, Request


class DiskHandlers:
    """Microsoft.Compute disks, snapshots and proximity placement groups, as DiskRP and CRP answer."""

    # -------------------------------------------------------------------------------------------- disks

    def _disk_body(self, rid: ResourceId, location: str, tags: dict, sku: str, size_gb: int, creation: dict,
                   extra: dict | None = None) -> dict:
        props = {**(extra or {}), "creationData": creation, "diskSizeGB": size_gb, "diskSizeBytes": size_gb * 2**30,
                 "uniqueId": str(uuid.uuid4()), "timeCreated": self._now(), "provisioningState": "Succeeded",
                 "encryption": {"type": "EncryptionAtRestWithPlatformKey"}, "networkAccessPolicy": "AllowAll",
                 "publicNetworkAccess": "Enabled"}
        if rid.type == DISK:
            props.update(diskIOPSReadWrite=500, diskMBpsReadWrite=100)
        tier = "Premium" if sku.startswith("Premium") else "Standard"
        return self._tracked(rid, location, tags, props, sku={"name": sku, "tier": tier})

    def _source(self, ref: str, types: tuple[str, ...], location: str) -> dict:
        rid = parse_id(ref)
        if not rid or rid.type not in types:
            raise invalid_parameter(f"The value '{ref}' of parameter 'creationData.sourceResourceId' is not a "
                                    f"{' or '.join(t.split('/')[-1][:-1] for t in types)} id.",
                                    "creationData.sourceResourceId")
        stored = self._resources.get(rid.key)
        if stored is None:
            raise self._missing(rid)
        if stored["location"] != location:
            raise invalid_parameter(f"The source {ref} is in location '{stored['location']}', not in '{location}'.",
                                    "creationData.sourceResourceId")
        return stored

    def _disk_put(self, request: Request) -> Reply:
        rid, body, old = self._put_prologue(request, compute_models.Disk)
        props = body.get("properties") or {}
        creation = dict(props.get("creationData") or {})
        option = creation.get("createOption")
        size = props.get("diskSizeGB")
        extra = {k: v for k, v in props.items() if k not in ("creationData", "diskSizeGB")}
        if old:
            former = old["properties"]["creationData"]
            if option != former["createOption"] or (creation.get("sourceResourceId") or "").lower() != (
                    former.get("sourceResourceId") or "").lower():
                raise ArmError(409, "PropertyChangeNotAllowed", "Changing property 'creationData' is not allowed.",
                               "creationData")
            size = size or old["properties"]["diskSizeGB"]
            if size != old["properties"]["diskSizeGB"] and self._disk_user(rid.key):
                raise ArmError(409, "OperationNotAllowed", f"Disk {rid.name} is attached to VM "
                                                           f"{self._disk_user(rid.key)}: it can be resized only when "
                                                           "unattached or its VM is deallocated.")
            if size < old["properties"]["diskSizeGB"]:
                raise ArmError(400, "BadRequest", f"Disk {rid.name}: shrinking a disk is not supported.")
            stored = copy.deepcopy(old)
            stored.update(tags=body["tags"])
            stored["properties"].update(diskSizeGB=size, diskSizeBytes=size * 2**30)
        elif option == "Empty":
            if not isinstance(size, int) or not 1 <= size <= 32767:
                raise invalid_parameter("Required parameter 'diskSizeGB' is missing (null) or not between 1 and "
                                        "32767.", "diskSizeGB")
            stored = self._disk_body(rid, body["location"], body["tags"], self._sku(body), size, creation, extra)
        elif option == "Copy":
            source = self._source(creation.get("sourceResourceId"), (SNAPSHOT, DISK), body["location"])
            size = size or source["properties"]["diskSizeGB"]
            if size < source["properties"]["diskSizeGB"]:
                raise invalid_parameter(f"The disk size {size} GB is smaller than the source's "
                                        f"{source['properties']['diskSizeGB']} GB.", "diskSizeGB")
            creation.update(sourceResourceId=source["id"], sourceUniqueId=source["properties"]["uniqueId"])
            for key in ("osType", "hyperVGeneration"):
                if key in source["properties"]:
                    extra.setdefault(key, source["properties"][key])
            stored = self._disk_body(rid, body["location"], body["tags"], self._sku(body), size, creation, extra)
        else:
            raise invalid_parameter(f"The value '{option}' of parameter 'creationData.createOption' is not served: "
                                    "this stand-in makes disks Empty or as a Copy.", "creationData.createOption")
        if body.get("zones"):
            stored["zones"] = body["zones"]
        op, _ = self._store(rid, stored, old, "disk", state="Updating")
        return Reply(202, self._view(rid.key), self._op_headers(op))  # DiskRP answers 202 to a PUT

    @staticmethod
    def _sku(body: dict) -> str:
        sku = (body.get("sku") or {}).get("name") or "Standard_LRS"
        known = ("Standard_LRS", "Premium_LRS", "StandardSSD_LRS", "UltraSSD_LRS", "Premium_ZRS", "StandardSSD_ZRS",
                 "PremiumV2_LRS")
        if sku not in known:
            raise invalid_parameter(f"The value '{sku}' of parameter 'sku.name' is invalid. Allowed values are "
                                    f"{', '.join(known)}.", "sku.name")
        return sku

    def _snapshot_put(self, request: Request) -> Reply:
        rid, body, old = self._put_prologue(request, compute_models.Snapshot)
        props = body.get("properties") or {}
        creation = dict(props.get("creationData") or {})
        if old:
            stored = copy.deepcopy(old)
            stored["tags"] = body["tags"]
        else:
            if creation.get("createOption") != "Copy":
                raise invalid_parameter(f"The value '{creation.get('createOption')}' of parameter "
                                        "'creationData.createOption' is not served: this stand-in makes snapshots "
                                        "as a Copy of a disk or snapshot.", "creationData.createOption")
            source = self._source(creation.get("sourceResourceId"), (DISK, SNAPSHOT), body["location"])
            creation.update(sourceResourceId=source["id"], sourceUniqueId=source["properties"]["uniqueId"])
            extra = {k: v for k, v in props.items() if k not in ("creationData", "diskSizeGB")}
            extra.setdefault("incremental", False)
            for key in ("osType", "hyperVGeneration"):
                if key in source["properties"]:
                    extra.setdefault(key, source["properties"][key])
            sku = (body.get("sku") or {}).get("name") or "Standard_LRS"
            stored = self._disk_body(rid, body["location"], body["tags"], sku, source["properties"]["diskSizeGB"],
                                     creation, extra)
        op, _ = self._store(rid, stored, old, "disk", state="Updating")
        return Reply(202, self._view(rid.key), self._op_headers(op))

    # -------------------------------------------------------------------------------------------- placement groups

    def _ppg_put(self, request: Request) -> Reply:
        rid, body, old = self._put_prologue(request, compute_models.ProximityPlacementGroup)
        props = body.get("properties") or {}
        kind = props.get("proximityPlacementGroupType") or "Standard"
        if kind not in ("Standard", "Ultra"):
            raise invalid_parameter(f"The value '{kind}' of parameter 'proximityPlacementGroupType' is invalid.",
                                    "proximityPlacementGroupType")
        stored = self._tracked(rid, body["location"], body["tags"], {**props, "proximityPlacementGroupType": kind},
                               **({"zones": body["zones"]} if body.get("zones") else {}))
        self._resources[rid.key] = stored  # CRP makes placement groups at once; they carry no provisioningState
        return Reply(200 if old else 201, self._view(rid.key))

    def _ppg_delete(self, request: Request) -> Reply:
        self._group(request.params["group"])
        rid = self._rid(request)
        if rid.key in self._resources:
            view = self._view(rid.key)["properties"]
            users = view["virtualMachines"] + view["virtualMachineScaleSets"]
            if users:
                raise ArmError(409, "OperationNotAllowed", f"Proximity placement group {rid.name} cannot be deleted "
                                                           f"while it is used by {users[0]['id']}.")
            self._resources.pop(rid.key)
        return Reply(200)

"""The ARM stand-in's virtual machines: the guest inside each (host keys, power, serial console) and the handlers of
Microsoft.Compute/virtualMachines, VM sizes and images (a mixin of testbed.arm.Arm, which holds the state and the
route table)."""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime

from azure.mgmt.compute import models as compute_models

from localcloud.guest import cloud_init_host_keys, make_host_keys
from testbed.arm_rules import (
    IMAGE_DISK_GB,
    VM_SIZES,
    ArmError,
    ResourceId,
    VmSize,
    invalid_parameter,
    linux_os_profile,
    marketplace_version,
    offered,
    parse_id,
    sku_document,
    spot_settings,
    version_key,
    vm_size,
)
from testbed.arm_types import DISK, GALLERY_VERSION, NIC, POWER_TEXT, Reply, Request


def boot_log(host: str, keys: list[str], boot: int, when: datetime) -> tuple[str, str]:
    """The serial console of an Ubuntu 24.04 Azure VM's boot: the kernel's part, then cloud-init's with its keys."""
    early = ("[    0.000000] Linux version 6.8.0-1027-azure (buildd@lcy02-amd64-044) (x86_64-linux-gnu-gcc-13) "
             "#32-Ubuntu SMP Tue Apr 22 18:27:34 UTC 2025\n"
             "[    0.000000] Command line: BOOT_IMAGE=/vmlinuz-6.8.0-1027-azure root=PARTUUID=5a1e2b4c-01 ro "
             "console=tty1 console=ttyS0 earlyprintk=ttyS0 panic=-1\n"
             "[    0.000000] DMI: Microsoft Corporation Virtual Machine/Virtual Machine, BIOS Hyper-V UEFI Release "
             "v4.1 08/23/2024\n[    0.000000] Hypervisor detected: Microsoft Hyper-V\n"
             f"[    3.412871] systemd[1]: Hostname set to <{host}>.\n"
             f"[    6.204417] cloud-init[716]: Cloud-init v. 24.4.1-0ubuntu0~24.04.3 running 'init' (boot {boot}).\n")
    late = "\n".join([*cloud_init_host_keys(host, keys, when),
                      "[   12.902114] cloud-init[1021]: Cloud-init v. 24.4.1-0ubuntu0~24.04.3 finished. Datasource "
                      "DataSourceAzure [seed=/dev/sr0].", f"\nUbuntu 24.04.2 LTS {host} ttyS0\n\n{host} login: "])
    return early, late + "\n"


@dataclass
class Guest:
    """What runs inside a VM: its host keys, its power state, its console, the SAS signatures of its blobs."""

    keys: list[str]
    host: str
    power: str = "starting"
    boots: list[tuple[str, str, float]] = field(default_factory=list)  # (kernel part, cloud-init part, ready at)
    signatures: dict[str, float] = field(default_factory=dict)  # sig -> expiry (time.time())

    def serial(self, now: float) -> str:
        return "".join(early + (late if now >= ready else "") for early, late, ready in self.boots)




class VmHandlers:
    """Microsoft.Compute virtual machines, as CRP answers."""


    def _vm_put(self, request: Request) -> Reply:
        rid, body, old = self._put_prologue(request, compute_models.VirtualMachine)
        location, props = body["location"], body.get("properties") or {}
        size_name, size = self._size_here((props.get("hardwareProfile") or {}).get("vmSize"), location)
        storage = props.get("storageProfile") or {}
        spot = spot_settings(props)
        if spot["priority"] == "Spot" and not size.spot:
            raise invalid_parameter(f"The VM size '{size_name}' cannot be used with priority 'Spot'.", "priority")
        if old:
            os_profile, image, os_disk = self._vm_unchanged(old, props, spot)
        else:
            os_profile = linux_os_profile(props.get("osProfile"), rid.name)
            image, image_gb = self._image_for(storage.get("imageReference"), location)
        nics = self._vm_nics(props, rid, location)
        if not size.accelerated_networking and any(
                self._resources[n["id"].lower()]["properties"].get("enableAcceleratedNetworking") for n in nics):
            raise ArmError(400, "VMSizeIsNotPermittedToEnableAcceleratedNetworking",
                           f"VM size {size_name} is not compatible with enabling Accelerated Networking on network "
                           f"interface(s) on the VM. Compatible VM sizes: "
                           f"{', '.join(n for n, v in VM_SIZES.items() if v.accelerated_networking)}.")
        ppg = self._placement_group(props, location, "virtual machine")
        scale_set = self._vm_scale_set(props, old, rid, location, size_name, size, ppg)
        data_disks, new_disks = self._vm_data_disks(storage.get("dataDisks") or [], rid, location)
        made = []
        if not old:
            os_disk, disk_body = self._vm_os_disk(storage.get("osDisk") or {}, rid, location, image, image_gb)
            made.append(disk_body)
        made += new_disks
        stored_props = {k: v for k, v in props.items() if k not in ("userData", "evictionPolicy", "billingProfile")}
        stored_props.update(
            hardwareProfile={**(props.get("hardwareProfile") or {}), "vmSize": size_name},
            storageProfile={**storage, "imageReference": image, "osDisk": os_disk, "dataDisks": data_disks,
                            "diskControllerType": storage.get("diskControllerType") or "SCSI"},
            osProfile=os_profile, networkProfile={"networkInterfaces": nics}, **spot,
            vmId=old["properties"]["vmId"] if old else str(uuid.uuid4()),
            timeCreated=old["properties"]["timeCreated"] if old else self._now())
        if ppg:
            stored_props["proximityPlacementGroup"] = {"id": ppg}
        stored_props.pop("virtualMachineScaleSet", None)
        if scale_set:
            stored_props["virtualMachineScaleSet"] = scale_set
            # A VM made in a Flexible set is placed by the set's proximity placement group
            # (virtual-machine-scale-sets/proximity-placement-groups.md: set it on the scale set).
            set_ppg = self._resources[scale_set["id"].lower()]["properties"].get("proximityPlacementGroup")
            if set_ppg and not ppg:
                stored_props["proximityPlacementGroup"] = dict(set_ppg)
        identity = self._access.identity(str(rid), body.get("identity"), (old or {}).get("identity"))
        extra = {"zones": body["zones"]} if body.get("zones") else {}
        stored = self._tracked(rid, location, body["tags"], stored_props, **extra,
                               **({"identity": identity} if identity else {}))
        for disk in made:
            self._resources[disk["id"].lower()] = disk
        if scale_set:
            self._vmss_first_member(scale_set, size)
        if not old:
            self._guests[rid.key] = Guest(make_host_keys(), os_profile["computerName"])

        def finish() -> None:
            guest = self._guests.get(rid.key)
            if guest and guest.power == "starting":
                self._boot(rid.key)

        def undo() -> None:
            for disk in made:
                self._resources.pop(disk["id"].lower(), None)
            if not old:
                self._guests.pop(rid.key, None)
                self._access.forget(str(rid))
            elif old.get("identity") != identity:
                self._access.identity(str(rid), old.get("identity") or {"type": "None"}, old.get("identity"))

        context = {"size": size_name, "cores": size.vcpus, "family": size.family, "location": location}
        op, status = self._store(rid, stored, old, "compute", state="Updating" if old else "Creating",
                                 finish=finish, undo=undo, context=context)
        return Reply(status, self._view(rid.key), self._op_headers(op, location=False))

    def _vm_unchanged(self, old: dict, props: dict, spot: dict) -> tuple[dict, dict, dict]:
        """The parts an update keeps (osProfile, image, OS disk); 409 PropertyChangeNotAllowed where it changes
        one that cannot change."""
        kept = old["properties"]
        given = props.get("osProfile") or {}
        for name in ("computerName", "adminUsername"):
            if given.get(name) and given[name] != kept["osProfile"][name]:
                raise ArmError(409, "PropertyChangeNotAllowed", f"Changing property 'osProfile.{name}' is not "
                                                                "allowed.", f"osProfile.{name}")
        if spot["priority"] != kept["priority"]:
            raise ArmError(409, "PropertyChangeNotAllowed", "Changing property 'priority' is not allowed.", "priority")
        image = (props.get("storageProfile") or {}).get("imageReference")
        if image and {k: str(v).lower() for k, v in image.items() if k != "exactVersion"} != {
                k: str(v).lower() for k, v in kept["storageProfile"]["imageReference"].items() if k != "exactVersion"}:
            raise ArmError(409, "PropertyChangeNotAllowed", "Changing property 'imageReference' is not allowed.",
                           "imageReference")
        os_disk = dict(kept["storageProfile"]["osDisk"])
        delete_option = ((props.get("storageProfile") or {}).get("osDisk") or {}).get("deleteOption")
        if delete_option:
            os_disk["deleteOption"] = delete_option
        return kept["osProfile"], kept["storageProfile"]["imageReference"], os_disk

    def _image_for(self, ref: dict | None, location: str) -> tuple[dict, int]:
        """The imageReference as CRP keeps it and the image's OS disk size; 404 as CRP answers for an image it
        cannot find in the VM's location."""
        if not ref:
            raise invalid_parameter("Required parameter 'imageReference' is missing (null).", "imageReference")
        if not ref.get("id"):
            if ref.get("sharedGalleryImageId") or ref.get("communityGalleryImageId"):
                raise invalid_parameter("This stand-in serves managed images, gallery images of this subscription "
                                        "and Canonical's Ubuntu 24.04 only.", "imageReference")
            exact = marketplace_version(ref)
            reference = {k: ref[k] for k in ("publisher", "offer", "sku", "version")} | {"exactVersion": exact}
            return reference, IMAGE_DISK_GB
        rid = parse_id(ref["id"])
        types = tuple(t.lower() for t in rid.types) if rid and rid.namespace.lower() == "microsoft.compute" else ()
        if types == ("images",):
            image = self._resources.get(rid.key)
            if image is None or image["location"] != location:
                raise ArmError(404, "NotFound", f"The Image '{ref['id']}' cannot be found in '{location}' region.",
                               "imageReference")
            return {"id": image["id"]}, image["properties"]["storageProfile"]["osDisk"]["diskSizeGB"]
        if types in (("galleries", "images"), ("galleries", "images", "versions")):
            version = self._gallery_version(rid, location)
            return {"id": ref["id"]}, version["properties"]["storageProfile"]["osDiskImage"]["sizeInGB"]
        raise invalid_parameter(f"The value '{ref['id']}' of parameter 'imageReference.id' is invalid.",
                                "imageReference.id")

    def _gallery_version(self, rid: ResourceId, location: str) -> dict:
        """The gallery image version an image id names (a definition or `versions/latest`: its newest one not
        excluded from latest), replicated to `location`; 404 GalleryImageNotFound otherwise."""
        whole = len(rid.types) == 2 or rid.name.lower() == "latest"
        definition = rid if len(rid.types) == 2 else rid.parent
        versions = [v for k, v in self._of_type(GALLERY_VERSION) if parse_id(k).parent.key == definition.key
                    and (not whole or not v["properties"]["publishingProfile"]["excludeFromLatest"])
                    and (whole or k == rid.key)
                    and location in {t["name"].replace(" ", "").lower()
                                     for t in v["properties"]["publishingProfile"]["targetRegions"]}]
        if not versions:
            raise ArmError(404, "GalleryImageNotFound",
                           f"The gallery image {rid} is not available in {location} region. Please contact image "
                           "owner to replicate to this region, or change your requested region.", "imageReference")
        return max(versions, key=lambda v: version_key(v["name"]))

    def _vm_os_disk(self, given: dict, rid: ResourceId, location: str, image: dict,
                    image_gb: int) -> tuple[dict, dict]:
        """The OS disk entry of a new VM and the disk it makes from its image."""
        if (given.get("createOption") or "FromImage") != "FromImage":
            raise invalid_parameter("This stand-in makes OS disks FromImage only.", "osDisk.createOption")
        name = given.get("name") or f"{rid.name}_OsDisk_1_{uuid.uuid4().hex}"
        disk_id = self._id(rid.group, DISK, name)
        if disk_id.key in self._resources:
            raise ArmError(409, "ConflictingUserInput",
                           f"A disk with name {name} already exists in Resource Group {rid.group.upper()}. 'Name' is "
                           "an optional property for a disk and a unique name will be generated if not provided.",
                           "/disks/" + name)
        size = given.get("diskSizeGB") or image_gb
        if size < image_gb:
            raise invalid_parameter(f"The specified disk size {size} GB is smaller than the size of the "
                                    f"corresponding disk in the VM image: {image_gb} GB.", "osDisk.diskSizeGB")
        sku = (given.get("managedDisk") or {}).get("storageAccountType") or "Premium_LRS"
        source = {"imageReference": {"id": image["id"]}} if "id" in image else {"imageReference": {
            "id": f"/Subscriptions/{self.subscription}/Providers/Microsoft.Compute/Locations/{location}/Publishers/"
                  f"{image['publisher']}/ArtifactTypes/VMImage/Offers/{image['offer']}/Skus/{image['sku']}/"
                  f"Versions/{image['exactVersion']}"}}
        disk = self._disk_body(disk_id, location, {}, sku, size, {"createOption": "FromImage", **source},
                               {"osType": "Linux", "hyperVGeneration": "V2"})
        entry = {"osType": "Linux", "name": name, "createOption": "FromImage",
                 "caching": given.get("caching") or "ReadWrite", "writeAcceleratorEnabled": False,
                 "managedDisk": {"storageAccountType": sku, "id": disk["id"]},
                 "deleteOption": given.get("deleteOption") or "Detach", "diskSizeGB": size}
        return entry, disk

    def _vm_data_disks(self, given: list, rid: ResourceId, location: str) -> tuple[list, list]:
        """The data disk entries of a VM and the new disks they make; 400/404/409 where CRP refuses one."""
        entries, made, luns = [], [], set()
        for disk in given:
            lun = disk.get("lun")
            if not isinstance(lun, int) or not 0 <= lun <= 63:
                raise invalid_parameter(f"The value {lun} of parameter 'dataDisk.lun' is invalid: 0 to 63.",
                                        "dataDisks.lun")
            if lun in luns:
                raise invalid_parameter(f"A disk at LUN {lun} already exists.", "dataDisks")
            luns.add(lun)
            ref = (disk.get("managedDisk") or {}).get("id")
            option = disk.get("createOption")
            entry = {"lun": lun, "caching": disk.get("caching") or "None", "writeAcceleratorEnabled": False,
                     "deleteOption": disk.get("deleteOption") or "Detach", "toBeDetached": False}
            if ref:
                disk_id, stored = self._stored_as(ref, DISK)
                if stored is None:
                    raise ArmError(404, "NotFound", f"Disk {disk_id.name if disk_id else ref} is not found.",
                                   "dataDisks.managedDisk.id")
                user = self._disk_user(disk_id.key)
                if user and user.lower() != rid.key:
                    raise ArmError(409, "OperationNotAllowed", f"Disk {stored['name']} is already attached to VM "
                                                               f"{user}.", "dataDisks")
                if stored["location"] != location:
                    raise invalid_parameter(f"Disk {stored['id']} is in location '{stored['location']}'; it can be "
                                            f"attached to a virtual machine in that location only, not in "
                                            f"'{location}'.", "dataDisks")
                entries.append({**entry, "name": stored["name"], "createOption": option or "Attach",
                                "managedDisk": {"storageAccountType": stored["sku"]["name"], "id": stored["id"]},
                                "diskSizeGB": stored["properties"]["diskSizeGB"]})
            elif option == "Empty":
                size = disk.get("diskSizeGB")
                if not isinstance(size, int) or size < 1:
                    raise invalid_parameter("Required parameter 'dataDisk.diskSizeGB' is missing (null).",
                                            "dataDisks.diskSizeGB")
                name = disk.get("name") or f"{rid.name}_disk{lun + 2}_{uuid.uuid4().hex}"
                disk_id = self._id(rid.group, DISK, name)
                if disk_id.key in self._resources or any(m["id"].lower() == disk_id.key for m in made):
                    raise ArmError(409, "ConflictingUserInput", f"A disk with name {name} already exists in Resource "
                                                                f"Group {rid.group.upper()}.", "/disks/" + name)
                sku = (disk.get("managedDisk") or {}).get("storageAccountType") or "Premium_LRS"
                made.append(self._disk_body(disk_id, location, {}, sku, size, {"createOption": "Empty"}))
                entries.append({**entry, "name": name, "createOption": "Empty", "diskSizeGB": size,
                                "managedDisk": {"storageAccountType": sku, "id": made[-1]["id"]}})
            else:
                raise invalid_parameter(f"The value '{option}' of parameter 'dataDisk.createOption' is not served: "
                                        "Attach (with managedDisk.id) or Empty.", "dataDisks.createOption")
        return entries, made

    def _vm_nics(self, props: dict, rid: ResourceId, location: str) -> list[dict]:
        network = props.get("networkProfile") or {}
        if network.get("networkInterfaceConfigurations"):
            raise invalid_parameter("This stand-in attaches existing network interfaces only.",
                                    "networkProfile.networkInterfaceConfigurations")
        refs = network.get("networkInterfaces") or []
        if not refs:
            raise invalid_parameter("Required parameter 'networkProfile' is missing (null).", "networkProfile")
        entries = []
        for ref in refs:
            nic_id, nic = self._stored_as(ref.get("id"), NIC)
            if nic is None:
                raise ArmError(404, "NotFound", f"Resource {ref.get('id')} not found.", "networkProfile")
            if nic["location"] != location:
                raise invalid_parameter(f"Network interface {nic['id']} is in location '{nic['location']}'; a "
                                        f"virtual machine in '{location}' cannot use it.", "networkProfile")
            user = self._nic_user(nic_id.key)
            if user and user.lower() != rid.key:
                raise ArmError(400, "NicInUse", f"Network Interface {nic['id']} is used by existing resource {user}. "
                                                "A network interface can be attached to one virtual machine only.")
            given = ref.get("properties") or {}
            entries.append({"id": nic["id"], "properties": {
                **given, "deleteOption": given.get("deleteOption") or "Detach"}})
        if len(entries) > 1 and sum(bool(e["properties"].get("primary")) for e in entries) != 1:
            raise invalid_parameter(f"Virtual machine {rid.name} must have one network interface set as the "
                                    "primary.", "networkProfile.networkInterfaces")
        return entries

    def _boot(self, key: str) -> None:
        """The VM boots: running, a new boot on its serial console."""
        guest = self._guests[key]
        guest.power = "running"
        early, late = boot_log(guest.host, guest.keys, len(guest.boots), datetime.now(UTC))
        guest.boots.append((early, late, time.monotonic() + self.boot_delay))

    def _remove_vm(self, key: str) -> None:
        """The VM goes, and with it the OS disk, data disks and NICs whose deleteOption says Delete."""
        vm = self._resources.pop(key, None)
        self._guests.pop(key, None)
        if vm is None:
            return
        self._access.forget(vm["id"])
        storage = vm["properties"]["storageProfile"]
        for disk in [storage["osDisk"], *storage["dataDisks"]]:
            if disk.get("deleteOption") == "Delete":
                self._resources.pop(disk["managedDisk"]["id"].lower(), None)
        for nic in vm["properties"]["networkProfile"]["networkInterfaces"]:
            if nic["properties"].get("deleteOption") == "Delete":
                self._resources.pop(nic["id"].lower(), None)

    def _size_here(self, name: object, location: str) -> tuple[str, VmSize]:
        """A VM size offered in `location` and open to this subscription: 400 as vm_size where it is not offered,
        409 SkuNotAvailable where it is restricted."""
        size_name, size = vm_size(name)
        if not offered(size, location):
            raise invalid_parameter(f"The requested VM size {size_name} is not available in the current region. "
                                    "Find out more on the available VM sizes in each region at "
                                    "https://aka.ms/azure-regions.", "vmSize")
        if (size_name, location) in self._restricted:
            raise ArmError(409, "SkuNotAvailable",
                           f"The requested VM size for resource 'Following SKUs have failed for Capacity Restrictions: "
                           f"{size_name}' is currently not available in location '{location}'. Please try another "
                           "size or deploy to a different location or different zone. See "
                           "https://aka.ms/azureskunotavailable for details.")
        return size_name, size

    def _skus_list(self, request: Request) -> Reply:
        wanted = request.query.get("$filter")
        found = re.fullmatch(r"location eq '([^']*)'", wanted or "")
        if wanted and not found:
            raise ArmError(400, "InvalidFilterInQueryString", f"Invalid $filter '{wanted}': only location eq "
                                                              "'<location>' is supported.")
        places = [found[1]] if found else list(self.locations)
        return self._paged(request, [sku_document(name, size, place, self._restricted.get((name, place), ""))
                                     for place in places for name, size in VM_SIZES.items()
                                     if offered(size, place) and place in self.locations])

    def _vm_get(self, request: Request) -> Reply:
        rid = self._existing(request)
        expand = request.query.get("$expand", "")
        if expand not in ("", "instanceView", "userData", "resiliencyPolicy"):
            raise invalid_parameter(f"The value '{expand}' of parameter '$expand' is invalid.", "$expand")
        return Reply(200, self._view(rid.key, expand=expand == "instanceView"))

    def _vm_instance_view(self, request: Request) -> Reply:
        return Reply(200, self._instance_view(self._existing(request).key))

    def _instance_view(self, key: str) -> dict:
        vm, guest = self._resources[key], self._guests[key]
        state = vm["properties"]["provisioningState"]
        when = self._now()
        statuses = [{"code": f"ProvisioningState/{state.lower()}", "level": "Info",
                     "displayStatus": f"Provisioning {state.lower()}", "time": when},
                    {"code": f"PowerState/{guest.power}", "level": "Info", "displayStatus": POWER_TEXT[guest.power]}]
        storage = vm["properties"]["storageProfile"]
        view = {"computerName": guest.host, "osName": "ubuntu", "osVersion": "24.04", "hyperVGeneration": "V2",
                "disks": [{"name": d["name"], "statuses": [{"code": "ProvisioningState/succeeded", "level": "Info",
                                                            "displayStatus": "Provisioning succeeded", "time": when}]}
                          for d in [storage["osDisk"], *storage["dataDisks"]]],
                "statuses": statuses}
        if guest.power == "running":
            view["vmAgent"] = {"vmAgentVersion": "2.13.1.1", "statuses": [{
                "code": "ProvisioningState/succeeded", "level": "Info", "displayStatus": "Ready",
                "message": "Guest Agent is running", "time": when}]}
        return view

    def _vm_power(self, request: Request) -> Reply:
        rid = self._existing(request)
        vm, guest = self._resources[rid.key], self._guests[rid.key]
        action = request.op.split(".")[1]
        state = vm["properties"]["provisioningState"]
        if state in ("Creating", "Deleting"):
            raise ArmError(409, "OperationNotAllowed", f"Operation '{action}' is not allowed on VM '{rid.name}' since "
                                                       f"the VM is being {state.lower()[:-3]}ed.")
        target, passing = {"powerOff": ("stopped", "stopping"), "deallocate": ("deallocated", "deallocating"),
                           "start": ("running", "starting")}[action]
        before = guest.power
        if before == "deallocated" and target == "stopped":
            target = passing = before  # a deallocated VM stays deallocated
        if before != target:
            guest.power = passing
        vm["properties"]["provisioningState"] = "Updating"

        def finish() -> None:
            if self._guests.get(rid.key) is guest and guest.power == passing:
                if target == "running":
                    self._boot(rid.key)
                else:
                    guest.power = target
            vm["properties"]["provisioningState"] = "Succeeded"

        def undo() -> None:
            guest.power = before
            vm["properties"]["provisioningState"] = state

        context = self._fault_context(vm)
        op = self._begin("compute", vm["location"], finish, undo, context)
        return Reply(202, None, self._op_headers(op))

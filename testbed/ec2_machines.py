"""EC2 instances that are machines: each instance moto launches in a region the test names is a real sshd node of a
local cluster (localcloud), booted as the launch is answered and taken away when it is terminated, so kiln's AWS
provider reaches it over SSH as it would a VM (the plug-in of testbed.ec2_faults' hop: `Ec2Faults(moto, machines=
Machines("awsm", "us-east-1"))`).

What kiln sees is EC2's own API, as moto answers it, with these differences a VM would make too:
- the instance's addresses (moto's made-up public and private IPv4 addresses) are its node's, in every answer;
- its console (GetConsoleOutput) is what cloud-init prints at boot: the node's real host keys between its markers;
- the public key of the launch's key pair (as ImportKeyPair brought it) is in the node's root authorized_keys, as
  cloud-init puts it in the image's user's: log in as root (`--user root`);
- a launch of more instances than the local cluster has free slots is refused, before moto makes anything, with
  EC2's InsufficientInstanceCapacity;
- a launch with an instance profile (given `moto`, the endpoint to ask IAM and STS) gives its machine the profile's
  role: temporary credentials of it (moto's AssumeRole) that the node's metadata service serves as EC2's does (the
  local cluster made with `metadata=True`), so a program there reaches AWS as the instance's role alone.

The local cluster is made by the test with its nodes as slots (`make_cluster(name, N, start=0, metadata=True)`), as
a queue's are.
"""

from __future__ import annotations

import base64
import json
import re
import threading
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime

from localcloud import cluster as local
from localcloud import netns
from localcloud.guest import cloud_init_host_keys

INSTANCE_ID = re.compile(rb"<instanceId>(i-[0-9a-f]+)</instanceId>")
ADDRESS = re.compile(rb"<(privateIpAddress|ipAddress)>([0-9.]+)</")
ITEM_END = b"</item>"


@dataclass
class Machine:
    node: netns.Node
    keys: list[str]  # its host keys, `type base64`
    moto: set[bytes] = field(default_factory=set)  # the addresses moto gave the instance, as its answers spell them


class Machines:
    def __init__(self, cluster: str, region: str, moto: str | None = None):
        self.cluster, self.region, self.moto = cluster, region, moto
        self.key_pairs: dict[str, str] = {}  # key pair name -> its public key (ImportKeyPair's)
        self.running: dict[str, Machine] = {}  # instance id -> its machine
        self.ended: list[list[str]] = []  # the instances of each TerminateInstances that ended machines, in turn
        self._lock = threading.Lock()

    def free(self) -> list[netns.Node]:
        entries = local.load_nodes(self.cluster)
        taken = {machine.node.name for machine in self.running.values()}
        return [node for node, entry in zip(netns.cluster_from_nodes(self.cluster, entries).nodes, entries, strict=True)
                if node.name not in taken and not entry.get("up", True)]

    def imported(self, region: str, fields: dict[str, list[str]]) -> None:
        """Keep the public key of an ImportKeyPair that came (a cloud-init puts it on the machines launched with it)."""
        if region == self.region and fields.get("KeyName") and fields.get("PublicKeyMaterial"):
            with self._lock:
                self.key_pairs[fields["KeyName"][0]] = base64.b64decode(fields["PublicKeyMaterial"][0]).decode()

    def short(self, region: str, fields: dict[str, list[str]]) -> bool:
        """Whether a RunInstances asks for more instances than there are free machines."""
        if region != self.region:
            return False
        with self._lock:
            return int((fields.get("MinCount") or ["1"])[0]) > len(self.free())

    def launched(self, region: str, fields: dict[str, list[str]], answer: bytes) -> None:
        """Boot a machine for each instance moto's RunInstances answer names."""
        if region != self.region:
            return
        ids = list(dict.fromkeys(m.group(1).decode() for m in INSTANCE_ID.finditer(answer)))
        with self._lock:
            nodes = self.free()[:len(ids)]
            booted = local.add_nodes(self.cluster, nodes)
            key = self.key_pairs.get((fields.get("KeyName") or [""])[0])
            for instance_id, node in zip(ids, nodes, strict=False):
                if key:
                    authorized = netns.STATE_ROOT / self.cluster / node.name / "ssh" / "authorized_keys"
                    authorized.write_text(authorized.read_text().rstrip("\n") + "\n" + key.strip() + "\n")
                keys = [" ".join(line.split()[1:3]) for line in booted[node.name]]
                self.running[instance_id] = Machine(node, keys)
                held = self.identity(fields, instance_id)
                if held:
                    (netns.STATE_ROOT / self.cluster / node.name / netns.IAM_FILE).write_text(json.dumps(held))
        self.learn(answer)

    def identity(self, fields: dict[str, list[str]], instance_id: str) -> dict | None:
        """The role of the launch's instance profile and temporary credentials of it (moto's IAM and STS), as the
        machine's metadata service serves them; None without a profile (or an endpoint to ask)."""
        named = (fields.get("IamInstanceProfile.Name") or fields.get("IamInstanceProfile.Arn") or [""])[0]
        if not named or not self.moto:
            return None
        import boto3

        iam, sts = (boto3.client(service, endpoint_url=self.moto, region_name=self.region)
                    for service in ("iam", "sts"))
        [role] = iam.get_instance_profile(InstanceProfileName=named.rsplit("/", 1)[-1])["InstanceProfile"]["Roles"]
        given = sts.assume_role(RoleArn=role["Arn"], RoleSessionName=instance_id)["Credentials"]
        return {"role": role["RoleName"], "AccessKeyId": given["AccessKeyId"],
                "SecretAccessKey": given["SecretAccessKey"], "Token": given["SessionToken"],
                "Expiration": given["Expiration"].strftime("%Y-%m-%dT%H:%M:%SZ"),
                "issued": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}

    def learn(self, answer: bytes) -> None:
        """Note the addresses moto gives each running instance in an answer (RunInstances', DescribeInstances'), so
        that every later answer says its machine's instead."""
        with self._lock:
            if not self.running:
                return
            for item in instance_items(answer):
                found = INSTANCE_ID.search(item)
                machine = self.running.get(found.group(1).decode()) if found else None
                if machine:
                    machine.moto |= {m.group(2) for m in ADDRESS.finditer(item)}

    def rewritten(self, answer: bytes) -> bytes:
        """An answer with every address moto gave an instance replaced by its machine's."""
        self.learn(answer)
        with self._lock:
            swaps = {old: machine.node.ip.encode() for machine in self.running.values() for old in machine.moto}
        if not swaps:
            return answer
        return re.sub(rb">(" + b"|".join(re.escape(old) for old in swaps) + rb")<",
                      lambda m: b">" + swaps[m.group(1)] + b"<", answer)

    def console(self, region: str, fields: dict[str, list[str]]) -> bytes | None:
        """GetConsoleOutput of a machine: cloud-init's lines with its host keys (None: not one of these)."""
        instance_id = (fields.get("InstanceId") or [""])[0]
        with self._lock:
            machine = self.running.get(instance_id) if region == self.region else None
        if machine is None:
            return None
        now = datetime.now(UTC)
        text = "\n".join(cloud_init_host_keys(f"ip-{machine.node.ip.replace('.', '-')}", machine.keys, now)) + "\n"
        return (f'<?xml version="1.0" encoding="UTF-8"?>\n<GetConsoleOutputResponse '
                f'xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>{uuid.uuid4()}</requestId>'
                f"<instanceId>{instance_id}</instanceId><timestamp>{now.strftime('%Y-%m-%dT%H:%M:%S.000Z')}"
                f"</timestamp><output>{base64.b64encode(text.encode()).decode()}</output></GetConsoleOutputResponse>"
                ).encode()

    def terminated(self, region: str, fields: dict[str, list[str]]) -> None:
        """Take away the machines of the instances a TerminateInstances named."""
        if region != self.region:
            return
        with self._lock:
            gone = [self.running.pop(v[0]) for k, v in fields.items()
                    if k.startswith("InstanceId.") and v[0] in self.running]
            if gone:
                self.ended.append([v[0] for k, v in fields.items() if k.startswith("InstanceId.")])
                local.remove_nodes(self.cluster, [machine.node for machine in gone])

    def close(self) -> None:
        with self._lock:
            if self.running:
                local.remove_nodes(self.cluster, [machine.node for machine in self.running.values()])
            self.running.clear()


def instance_items(answer: bytes) -> list[bytes]:
    """Each instance's part of an EC2 answer: from its <instanceId> to the end of its <item> (nested items, its
    interfaces', included: their addresses are the instance's too)."""
    starts = [m.start() for m in INSTANCE_ID.finditer(answer)]
    return [answer[start:(starts[i + 1] if i + 1 < len(starts) else len(answer))] for i, start in enumerate(starts)]

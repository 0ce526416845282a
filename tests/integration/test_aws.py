"""cluster.up/down/list/sweep against a moto server on loopback (real HTTP through boto3's endpoint_url).

moto 5.2 has no placement groups (its server answers 500 to CreatePlacementGroup), so `placement_group_stand_in`
registers the three calls kiln makes into the running server's EC2 handler, with AWS's behaviour: tag
specifications and tag filters, duplicate and unknown-name errors, RunInstances refusing an unknown group and
DeletePlacementGroup refusing while a live instance is in the group.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")

from bootstrap import state  # noqa: E402
from bootstrap.cluster import Cluster  # noqa: E402
from bootstrap.commands import SshOptions  # noqa: E402
from bootstrap.errors import KilnError, UsageError  # noqa: E402
from bootstrap.providers import provision  # noqa: E402
from bootstrap.providers.aws import cloud as aws  # noqa: E402
from bootstrap.providers.aws import efa as efa_plan  # noqa: E402
from bootstrap.providers.aws import identity, plan  # noqa: E402
from bootstrap.recovery import Recovery  # noqa: E402
from kiln import sshwait as reach  # noqa: E402

CIDR = "203.0.113.7/32"


def up(name: str, count: int, instance_type: str, *, ssh_wait_s: float, connected: aws.Aws | None = None,
       now: datetime | None = None, **options) -> provision.Up:
    """aws.up of a request checked as `kiln up` checks it (plan.validate_request)."""
    return aws.up(plan.validate_request(name, count, instance_type, **options), ssh_wait_s=ssh_wait_s, aws=connected,
                  now=now)
REPO = Path(__file__).resolve().parents[2]
FAB = REPO / ".venv" / "bin" / "fab"
CONSOLE = """[   12.345678] cloud-init[1017]: Cloud-init v. 23.4.4 running 'modules:config' at Tue, 04 Jun 2024.
<14>Jun  4 10:01:03 ec2:
<14>Jun  4 10:01:03 ec2: #############################################################
<14>Jun  4 10:01:03 ec2: -----BEGIN SSH HOST KEY FINGERPRINTS-----
<14>Jun  4 10:01:03 ec2: 256 SHA256:3Zk0mFq1J7u8x1sGQ2oR9ZrQk5c4w0Yw1vXh0r8l1aE root@ip-172-31-5-9 (ECDSA)
<14>Jun  4 10:01:03 ec2: 256 SHA256:Qm9vYmFyYmF6cXV4cXV1eHF1dXpxdXV4cXV1eHF1dQ root@ip-172-31-5-9 (ED25519)
<14>Jun  4 10:01:03 ec2: -----END SSH HOST KEY FINGERPRINTS-----
<14>Jun  4 10:01:03 ec2: #############################################################
-----BEGIN SSH HOST KEY KEYS-----
ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBEx4mple= root@ip-172-31-5-9
ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIK1ex4mpleKeyMaterialForTests root@ip-172-31-5-9
-----END SSH HOST KEY KEYS-----
[   13.000001] cloud-init[1017]: Cloud-init v. 23.4.4 finished at Tue, 04 Jun 2024 10:01:04 +0000.

Ubuntu 22.04.4 LTS ip-172-31-5-9 ttyS0

ip-172-31-5-9 login: """
CONSOLE_KEYS = ["ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBEx4mple=",
                "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIK1ex4mpleKeyMaterialForTests"]
FAKE_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                    "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def placement_group_stand_in() -> None:
    """Add CreatePlacementGroup, DescribePlacementGroups and DeletePlacementGroup to moto's EC2 handler."""
    from moto.core.responses import ActionResult
    from moto.ec2.exceptions import EC2ClientError
    from moto.ec2.responses import EC2Response

    if getattr(EC2Response, "kiln_placement_groups", None) is not None:
        return
    groups: dict[tuple, dict] = {}
    members: dict[tuple, set] = {}
    lock = threading.Lock()

    def key(self, name):
        return (self.current_account, self.region, name)

    def create_placement_group(self):
        name, strategy = self._get_param("GroupName"), self._get_param("Strategy")
        if strategy not in ("cluster", "spread", "partition"):
            raise EC2ClientError("InvalidParameterValue", f"Invalid strategy: {strategy}")
        tags = self._parse_tag_specification().get("placement-group", {})
        with lock:
            if key(self, name) in groups:
                raise EC2ClientError("InvalidPlacementGroup.Duplicate", f"The Placement Group '{name}' already exists.")
            group = {"GroupName": name, "State": "available", "Strategy": strategy,
                     "GroupId": f"pg-{len(groups):017x}", "Tags": plan.tag_list(tags)}
            groups[key(self, name)] = group
        return ActionResult({"PlacementGroup": group})

    def describe_placement_groups(self):
        filters = self._filters_from_querystring()
        names = self._get_param("GroupNames", [])
        with lock:
            found = [g for (account, region, _), g in groups.items()
                     if account == self.current_account and region == self.region]
        for name in names:
            if name not in {g["GroupName"] for g in found}:
                raise EC2ClientError("InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown.")

        def matches(group):
            tags = plan.tags_of(group)
            for field, values in filters.items():
                if field == "tag-key" and not set(values) & set(tags):
                    return False
                if field.startswith("tag:") and tags.get(field[4:]) not in values:
                    return False
                if field == "group-name" and group["GroupName"] not in values:
                    return False
            return not names or group["GroupName"] in names
        return ActionResult({"PlacementGroups": [g for g in found if matches(g)]})

    def delete_placement_group(self):
        name = self._get_param("GroupName")
        with lock:
            if key(self, name) not in groups:
                raise EC2ClientError("InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown.")
            live = [i for i in members.get(key(self, name), ()) if i.state not in ("terminated",)]
            if live:
                raise EC2ClientError("InvalidPlacementGroup.InUse", f"The placement group '{name}' is in use.")
            del groups[key(self, name)]
            members.pop(key(self, name), None)
        return ActionResult({})

    original_run = EC2Response.run_instances

    def run_instances(self):
        name = (self._get_param("Placement") or {}).get("GroupName")
        if name and key(self, name) not in groups:
            raise EC2ClientError("InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown.")
        before = {i.id for i in self.ec2_backend.all_instances()}
        result = original_run(self)
        if name:
            with lock:
                members.setdefault(key(self, name), set()).update(
                    i for i in self.ec2_backend.all_instances() if i.id not in before)
        return result

    EC2Response.create_placement_group = create_placement_group
    EC2Response.describe_placement_groups = describe_placement_groups
    EC2Response.delete_placement_group = delete_placement_group
    EC2Response.run_instances = run_instances
    EC2Response.kiln_placement_groups = groups


@pytest.fixture(scope="module")
def server():
    """moto's server in this process, without the public AMIs (and their snapshots) it otherwise makes in every
    region it is asked about: kiln looks for its own images by tag, and each describe_snapshots filtered every
    one of those thousands (a fifth of the module's CPU)."""
    placement_group_stand_in()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
        started = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        started.start()
        host, port = started.get_host_and_port()
        yield f"http://{host}:{port}"
        started.stop()


@pytest.fixture
def env(server, monkeypatch, tmp_path):
    for name, value in FAKE_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv(aws.ENDPOINT_ENV, server)
    monkeypatch.setenv("KILN_HOME", str(tmp_path / "kiln"))
    return tmp_path


@pytest.fixture
def ec2(env):
    return aws.connect().ec2


@pytest.fixture
def image(ec2):
    """A kiln-baked AMI tagged as the image build tags it, and one of another profile that must not be chosen."""
    made = {}
    for profile in ("cpu", "gpu"):
        image_id = ec2.register_image(Name=f"kiln-{profile}", RootDeviceName=plan.ROOT_DEVICE, BlockDeviceMappings=[
            {"DeviceName": plan.ROOT_DEVICE, "Ebs": {"VolumeSize": 8}}])["ImageId"]
        ec2.create_tags(Resources=[image_id], Tags=[{"Key": plan.TAG_PROFILE, "Value": profile}])
        made[profile] = image_id
    yield made["gpu"]
    for summary in aws.list_clusters():  # a failed test must not leak into the next one
        aws.down(summary.name)
    for snapshot in aws.list_snapshots():
        ec2.delete_snapshot(SnapshotId=snapshot.id)
    for image_id in made.values():
        ec2.deregister_image(ImageId=image_id)


def leftovers(ec2, name: str | None = None, snapshots: bool = True) -> list[str]:
    """Every kiln-tagged resource of any kind (data snapshots too, unless told), looked up independently of
    kiln's own code."""
    tag = [{"Name": "tag-key", "Values": [plan.TAG_CLUSTER]}] if name is None else \
        [{"Name": f"tag:{plan.TAG_CLUSTER}", "Values": [name]}]
    prefix = "kiln-" if name is None else f"kiln-{name}"
    found = [f"instance {i['InstanceId']}" for r in ec2.describe_instances(Filters=tag)["Reservations"]
             for i in r["Instances"] if i["State"]["Name"] != "terminated"]
    found += [f"volume {v['VolumeId']}" for v in ec2.describe_volumes(Filters=tag)["Volumes"]]
    found += [f"security-group {g['GroupId']}" for g in ec2.describe_security_groups(Filters=tag)["SecurityGroups"]]
    found += [f"security-group {g['GroupId']}" for g in ec2.describe_security_groups()["SecurityGroups"]
              if g["GroupName"].startswith(prefix) and f"security-group {g['GroupId']}" not in found]
    found += [f"key-pair {k['KeyName']}" for k in ec2.describe_key_pairs()["KeyPairs"]
              if k["KeyName"].startswith(prefix)]
    found += [f"placement-group {g['GroupName']}" for g in ec2.describe_placement_groups()["PlacementGroups"]
              if g["GroupName"].startswith(prefix)]
    found += [f"elastic-ip {a['AllocationId']}" for a in ec2.describe_addresses(Filters=tag)["Addresses"]]
    if snapshots:
        found += snapshots_of(ec2, name)
    return found


def snapshots_of(ec2, name: str | None = None) -> list[str]:
    tag = [{"Name": "tag-key", "Values": [plan.TAG_CLUSTER]}] if name is None else \
        [{"Name": f"tag:{plan.TAG_CLUSTER}", "Values": [name]}]
    return [f"snapshot {s['SnapshotId']}" for s in ec2.describe_snapshots(OwnerIds=["self"], Filters=tag)["Snapshots"]]


def instances_of(ec2, name: str) -> list[dict]:
    return [i for r in ec2.describe_instances(Filters=[{"Name": f"tag:{plan.TAG_CLUSTER}", "Values": [name]}])[
        "Reservations"] for i in r["Instances"] if i["State"]["Name"] != "terminated"]


def test_up_then_down_leaves_nothing(env, ec2, image):
    made = up("alpha", 2, "g4dn.xlarge", ssh_cidr=CIDR, ttl_hours=2, ssh_wait_s=0)
    assert made.image == image
    saved = state.load_cluster("alpha")
    assert [h.user for h in saved.hosts] == ["ubuntu", "ubuntu"]
    assert saved.ssh.identity == str(env / "kiln" / "clusters" / "alpha" / "id_ed25519")
    assert oct((env / "kiln" / "clusters" / "alpha" / "id_ed25519").stat().st_mode & 0o777) == "0o600"
    instances = instances_of(ec2, "alpha")
    assert len(instances) == 2
    assert {i["MetadataOptions"]["HttpTokens"] for i in instances} == {"required"}
    assert {i["MetadataOptions"]["HttpPutResponseHopLimit"] for i in instances} == {plan.IMDS_HOP_LIMIT}
    assert {i["Placement"]["GroupName"] for i in instances} <= {"kiln-alpha", ""}
    volumes = ec2.describe_volumes(Filters=[{"Name": "attachment.instance-id",
                                             "Values": [i["InstanceId"] for i in instances]}])["Volumes"]
    assert volumes and all(v["Encrypted"] for v in volumes)
    tags = plan.tags_of(instances[0])
    expires = plan.parse_time(tags[plan.TAG_EXPIRES])
    assert timedelta(hours=1.9) < expires - datetime.now(UTC) <= timedelta(hours=2)
    assert tags[plan.TAG_OWNER].startswith("arn:aws:")
    group = ec2.describe_security_groups(GroupNames=["kiln-alpha"])["SecurityGroups"][0]
    ranges = [r["CidrIp"] for p in group["IpPermissions"] for r in p.get("IpRanges", [])]
    ranges += [r["CidrIpv6"] for p in group["IpPermissions"] for r in p.get("Ipv6Ranges", [])]
    assert ranges == [CIDR] and "0.0.0.0/0" not in ranges and "::/0" not in ranges
    assert any(pair["GroupId"] == group["GroupId"] for p in group["IpPermissions"] if p["IpProtocol"] == "-1"
               for pair in p.get("UserIdGroupPairs", []))
    assert [g["Strategy"] for g in ec2.describe_placement_groups(GroupNames=["kiln-alpha"])["PlacementGroups"]] \
        == ["cluster"]
    assert [s.name for s in aws.list_clusters()] == ["alpha"]

    removed = aws.down("alpha")
    assert {r.split()[0] for r in removed} >= {"instance", "security-group", "key-pair", "placement-group"}
    assert leftovers(ec2) == []
    assert state.load_cluster("alpha") is None
    assert aws.down("alpha") == []


def test_down_finds_the_cluster_by_tags_without_its_file(env, ec2, image):
    up("lost", 1, "g5.xlarge", ssh_cidr=CIDR, ssh_wait_s=0)
    (env / "kiln" / "clusters" / "lost" / "cluster.json").unlink()
    (env / "kiln" / "clusters" / "lost" / "aws.json").unlink()
    assert aws.down("lost")
    assert leftovers(ec2) == []


def test_an_up_that_loses_a_race_for_the_name_leaves_the_winners_resources(env, ec2, image):
    """Two ups of one name: the other one's resources appear after this up checked the name was free (a second
    operator's up, at the same moment); this up's key pair import is refused as a duplicate, and its undo removes
    what it made alone: the winner's key pair, group and instances stay."""
    connected = aws.connect()

    class Race:
        def __init__(self, client):
            self.client = client

        def __getattr__(self, attribute):
            value = getattr(self.client, attribute)
            if attribute != "import_key_pair":
                return value

            def import_key_pair(**kwargs):
                up("race", 1, "g4dn.xlarge", ssh_cidr=CIDR, ssh_wait_s=0, connected=aws.connect())  # the winner
                return value(**kwargs)
            return import_key_pair

    try:
        connected.ec2 = Race(connected.ec2)
        with pytest.raises(aws.AwsError, match="could not import the key pair: InvalidKeyPair.Duplicate"):
            up("race", 1, "g4dn.xlarge", ssh_cidr=CIDR, ssh_wait_s=0, connected=connected)
        kinds = sorted(line.split()[0] for line in leftovers(ec2, "race"))
        assert kinds == ["instance", "key-pair", "placement-group", "security-group", "volume"], kinds
        assert len(instances_of(ec2, "race")) == 1
    finally:
        with contextlib.suppress(KilnError):
            aws.down("race")
    assert leftovers(ec2) == []


def test_spot_request_carries_market_options(env, ec2, image):
    up("spotty", 1, "g4dn.xlarge", spot=True, max_price="0.91", ssh_cidr=CIDR, ssh_wait_s=0)
    try:
        [instance] = instances_of(ec2, "spotty")
        assert instance.get("InstanceLifecycle") == "spot"
        requests = ec2.describe_spot_instance_requests()["SpotInstanceRequests"]
        assert [r["SpotPrice"] for r in requests if r.get("InstanceId") == instance["InstanceId"]] in ([], ["0.91"])
    finally:
        aws.down("spotty")
    assert leftovers(ec2) == []


class FailOn:
    """An EC2 client that raises on the nth call of one API: a fault at the API boundary."""

    def __init__(self, client, api: str, error: BaseException, nth: int = 1):
        self.client, self.api, self.error, self.nth, self.calls = client, api, error, nth, 0

    def __getattr__(self, attribute):
        value = getattr(self.client, attribute)
        if attribute != self.api:
            return value

        def call(*args, **kwargs):
            self.calls += 1
            if self.calls == self.nth:
                raise self.error
            return value(*args, **kwargs)
        return call


def capacity_error(operation: str):
    from botocore.exceptions import ClientError

    return ClientError({"Error": {"Code": "InsufficientInstanceCapacity", "Message": "no capacity"}}, operation)


def test_a_look_before_anything_is_made_that_aws_refuses_is_its_error_not_a_traceback(env, ec2, image):
    """An organisation's policy that denies the region its images (the caller's identity still answers): AWS's own
    error, its code for the failover's verdict, and nothing made."""
    from botocore.exceptions import ClientError

    connected = aws.connect()
    denied = ClientError({"Error": {"Code": "UnauthorizedOperation", "Message": "You are not authorized to perform "
                                    "this operation."}}, "DescribeImages")
    connected.ec2 = FailOn(connected.ec2, "describe_images", denied)
    with pytest.raises(aws.AwsError, match="^cluster.up denied: UnauthorizedOperation: You are not") as raised:
        up("denied", 1, "g4dn.xlarge", ssh_cidr=CIDR, connected=connected, ssh_wait_s=0)
    assert raised.value.code == "UnauthorizedOperation" and "nothing was created" in str(raised.value)
    assert leftovers(ec2) == []


@pytest.mark.parametrize(("api", "nth", "step", "instance_type"), [
    ("import_key_pair", 1, "import the key pair", "g4dn.xlarge"),
    ("create_security_group", 1, "create the security group", "g4dn.xlarge"),
    ("authorize_security_group_ingress", 1, "allow SSH and cluster traffic", "g4dn.xlarge"),
    ("create_placement_group", 1, "create the placement group", "g4dn.xlarge"),
    ("run_instances", 1, "run the instances", "g4dn.xlarge"),
    ("get_waiter", 1, "wait until the instances run", "g4dn.xlarge"),
    ("get_console_output", 1, "read the host keys from the consoles", "g4dn.xlarge"),
    # an EFA type's launch: its Elastic IPs are released too
    ("authorize_security_group_egress", 1, "allow EFA traffic out to the security group", "p4d.24xlarge"),
    ("associate_address", 2, "give each instance an Elastic IP", "p4d.24xlarge"),
])
def test_failure_at_each_step_rolls_everything_back(env, ec2, image, api, nth, step, instance_type):
    connected = aws.connect()
    connected.ec2 = FailOn(connected.ec2, api, capacity_error(api), nth)
    with pytest.raises(aws.AwsError, match=f"^cluster.up broken: could not {step}.*: InsufficientInstanceCapacity: "
                                           "no capacity; everything it had created was removed$"):
        up("broken", 2, instance_type, ssh_cidr=CIDR, connected=connected, ssh_wait_s=0)
    assert leftovers(ec2) == [] and addresses_of(ec2, "broken") == []
    assert not (env / "kiln" / "clusters" / "broken" / "id_ed25519").exists()


def test_ctrl_c_during_run_instances_rolls_back(env, ec2, image):
    connected = aws.connect()
    real_run = connected.ec2.run_instances

    class Interrupting(FailOn):
        def __getattr__(self, attribute):
            if attribute == "run_instances":
                def call(**kwargs):
                    real_run(**kwargs)  # the instances exist, then the operator presses Ctrl-C
                    raise KeyboardInterrupt
                return call
            return getattr(self.client, attribute)

    connected.ec2 = Interrupting(connected.ec2, "", KeyboardInterrupt())
    with pytest.raises(aws.AwsError, match="could not run the instances: interrupted"):
        up("ctrlc", 2, "g4dn.xlarge", ssh_cidr=CIDR, connected=connected, ssh_wait_s=0)
    assert leftovers(ec2) == []


def test_a_second_ctrl_c_during_the_undo_does_not_skip_it(env, ec2, image, capfd):
    """Ctrl-C after the instances were launched starts the undo; a second one, pressed (a real SIGINT) as the undo
    terminates them, is told that the undo goes on, and nothing is left."""
    connected = aws.connect()
    real = connected.ec2

    class Operator:
        def __getattr__(self, attribute):
            value = getattr(real, attribute)
            if attribute == "run_instances":
                def launch(**kwargs):
                    value(**kwargs)
                    raise KeyboardInterrupt
                return launch
            if attribute == "terminate_instances":
                def terminate(**kwargs):
                    os.kill(os.getpid(), signal.SIGINT)  # impatient
                    return value(**kwargs)
                return terminate
            return value

    connected.ec2 = Operator()
    with pytest.raises(aws.AwsError, match="could not run the instances: interrupted; everything it had created "
                                           "was removed$"):
        up("twice", 2, "g4dn.xlarge", ssh_cidr=CIDR, connected=connected, ssh_wait_s=0)
    assert "kiln: undoing what cluster.up twice made; Ctrl-C again stops it" in capfd.readouterr().err
    assert leftovers(ec2) == []


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"instance_type": "huge"}, "--instance-type 'huge' is not an EC2 instance type like g6.xlarge"),
    ({"count": 0}, "--count 0: a cluster needs at least 1 instance"),
    ({"ssh_cidr": None}, "give --ssh-cidr"),
    ({"ssh_cidr": "0.0.0.0/0"}, "too broad"),
    ({"ami": "ami-0123456789abcdef0"}, "AMI ami-0123456789abcdef0 does not exist in us-east-1"),
    ({"image_tags": "kiln:fingerprint=nope"},
     "no available AMI tagged kiln:profile=gpu, kiln:fingerprint=nope in us-east-1"),
])
def test_bad_input_is_one_clear_error_and_creates_nothing(env, ec2, image, kwargs, message):
    arguments = {"count": 1, "instance_type": "g4dn.xlarge", "ssh_cidr": CIDR, "ssh_wait_s": 0, **kwargs}
    with pytest.raises(UsageError) as raised:
        up("bad", **arguments)
    assert message in str(raised.value) and "\n" not in str(raised.value)
    assert leftovers(ec2) == []
    assert not (env / "kiln" / "clusters" / "bad").exists()


def test_a_taken_name_is_refused(env, ec2, image):
    up("taken", 1, "g4dn.xlarge", ssh_cidr=CIDR, ssh_wait_s=0)
    try:
        before = leftovers(ec2)
        with pytest.raises(UsageError, match="cluster name 'taken' is taken"):
            up("taken", 1, "g4dn.xlarge", ssh_cidr=CIDR, ssh_wait_s=0)
        assert leftovers(ec2) == before
    finally:
        aws.down("taken")


def test_no_credentials_is_one_clear_error(env, ec2, image, monkeypatch):
    for name in FAKE_CREDENTIALS:
        if name != "AWS_DEFAULT_REGION":
            monkeypatch.delenv(name)
    with pytest.raises(UsageError, match="^no AWS credentials: "):
        up("nocreds", 1, "g4dn.xlarge", ssh_cidr=CIDR, ssh_wait_s=0)
    for name, value in FAKE_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    assert leftovers(ec2) == []


def test_sweep_removes_expired_clusters_only(env, ec2, image):
    past = datetime.now(UTC) - timedelta(hours=3)
    up("old", 1, "g4dn.xlarge", ssh_cidr=CIDR, ttl_hours=1, now=past, ssh_wait_s=0)
    up("fresh", 1, "g4dn.xlarge", ssh_cidr=CIDR, ttl_hours=1, ssh_wait_s=0)
    try:
        assert [s.name for s in aws.sweep(dry_run=True)] == ["old"]
        assert leftovers(ec2, "old")
        assert [s.name for s in aws.sweep()] == ["old"]
        assert leftovers(ec2, "old") == []
        assert leftovers(ec2, "fresh")
    finally:
        aws.down("fresh")
    assert leftovers(ec2) == []


def test_errors_are_kiln_errors(env):
    assert issubclass(aws.AwsError, KilnError) and os.environ[aws.ENDPOINT_ENV].startswith("http://127.0.0.1:")


@pytest.fixture
def listeners():
    """On 127.0.0.1: a port whose server sends an OpenSSH banner, one with nothing listening, one that accepts
    and never speaks."""
    stop = threading.Event()
    sockets, accepted = [], []

    def listen() -> socket.socket:
        made = socket.create_server(("127.0.0.1", 0))
        made.settimeout(0.1)
        sockets.append(made)
        return made

    def serve(server: socket.socket, banner: bytes | None) -> None:
        while not stop.is_set():
            try:
                connection, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            accepted.append(connection)
            if banner:
                connection.sendall(banner)

    speaking, silent = listen(), listen()
    with socket.create_server(("127.0.0.1", 0)) as closed:
        nothing = closed.getsockname()[1]
    threads = [threading.Thread(target=serve, args=(speaking, b"SSH-2.0-OpenSSH_9.2\r\n"), daemon=True),
               threading.Thread(target=serve, args=(silent, None), daemon=True)]
    for thread in threads:
        thread.start()
    yield {"ssh": ("127.0.0.1", speaking.getsockname()[1]), "nothing": ("127.0.0.1", nothing),
           "silent": ("127.0.0.1", silent.getsockname()[1])}
    stop.set()
    for thread in threads:
        thread.join(timeout=2)
    for opened in sockets + accepted:
        opened.close()


def test_ssh_wait_returns_when_the_banner_comes(listeners):
    assert reach.probe_ssh(*listeners["ssh"], 2) == "SSH-2.0-OpenSSH_9.2"
    started = time.monotonic()
    assert reach.wait_for_ssh([listeners["ssh"]], 10) == []
    assert time.monotonic() - started < 2


def test_ssh_wait_names_the_ports_that_never_answer_within_the_timeout(listeners):
    endpoints = [listeners["ssh"], listeners["nothing"], listeners["silent"]]
    started, answered = time.monotonic(), []
    silent = reach.wait_for_ssh(endpoints, 1.5, attempt_timeout_s=0.5, retry_s=0.1, answered=answered.append)
    assert silent == [f"127.0.0.1:{listeners['nothing'][1]}", f"127.0.0.1:{listeners['silent'][1]}"]
    assert answered == [f"127.0.0.1:{listeners['ssh'][1]}"]  # as it answered: kiln up's progress line
    assert 1.5 <= time.monotonic() - started < 3


def test_unreachable_instances_roll_back_and_are_named(env, ec2, image):
    with pytest.raises(aws.AwsError) as raised:
        up("mute", 2, "g4dn.xlarge", ssh_cidr=CIDR, ssh_wait_s=0.5)
    message = str(raised.value)
    assert message.startswith("cluster.up mute: could not wait until SSH answers: no SSH answer within 0.5s "
                              "from 2 instance(s): i-")
    assert message.endswith("; everything it had created was removed") and message.count("(") == 3
    assert leftovers(ec2) == []
    assert not (env / "kiln" / "clusters" / "mute" / "id_ed25519").exists()


class Consoles:
    """An EC2 client whose first instance's console shows cloud-init's host keys (moto's console is fixed)."""

    def __init__(self, client):
        self.client, self.with_keys = client, None

    def __getattr__(self, attribute):
        return getattr(self.client, attribute)

    def get_console_output(self, InstanceId):  # noqa: N803 - boto3's name
        self.with_keys = self.with_keys or InstanceId
        answer = self.client.get_console_output(InstanceId=InstanceId)
        return {**answer, "Output": CONSOLE} if InstanceId == self.with_keys else answer


def test_console_host_keys_are_pinned_where_ssh_for_the_cluster_looks(env, ec2, image):
    connected = aws.connect()
    connected.ec2 = Consoles(connected.ec2)
    made = up("keys", 2, "g4dn.xlarge", ssh_cidr=CIDR, ssh_wait_s=0, connected=connected)
    saved = state.load_cluster("keys")
    first, second = saved.instances
    assert first.id == connected.ec2.with_keys
    assert [first.host_keys, second.host_keys] == ["console", "first-contact"]
    assert made.host_keys == {first.address: "console", second.address: "first-contact"}
    assert [h.address for h in saved.hosts] == [first.address, second.address]
    assert saved.user == "ubuntu" and saved.region == "us-east-1"
    known_hosts = state.cluster_dir("keys") / "known_hosts"
    assert known_hosts.read_text() == "".join(f"{first.address} {key}\n" for key in CONSOLE_KEYS)
    group = Cluster.connect("keys", saved.hosts, SshOptions(identity=saved.ssh.identity), python="python3",
                            fanout=4, timeout=10)
    assert group.remote.options.known_hosts == (str(known_hosts),)
    aws.down("keys")
    assert not known_hosts.exists() and leftovers(ec2) == []


def fab(env_dir: Path, *args: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "KILN_HOME": str(env_dir / "kiln")}
    return subprocess.run([str(FAB), *args], cwd=REPO, env=environment, capture_output=True, text=True, timeout=60)


def test_train_dry_run_on_the_cluster_is_the_plan_for_its_hosts(env, ec2, image):
    made = fab(env, "cluster.up", "--name", "train", "--count", "2", "--instance-type", "g4dn.xlarge",
               "--ssh-cidr", CIDR, "--ssh-wait", "0")
    assert made.returncode == 0, made.stderr
    assert "not waiting for SSH to answer (--ssh-wait 0)" in made.stdout
    assert "recorded as first-contact; kiln mesh --cluster train --accept-new-host-keys " \
           "(or kiln train --cluster train --accept-new-host-keys)" in made.stdout
    saved = json.loads((env / "kiln" / "clusters" / "train" / "cluster.json").read_text())
    assert {i["host_keys"] for i in saved["instances"]} == {"first-contact"}
    assert (env / "kiln" / "clusters" / "train" / "known_hosts").read_text() == ""
    hosts = ",".join(f"ubuntu@{i['address']}" for i in saved["instances"])

    by_name = fab(env, "cluster.train", "--cluster", "train", "--dry-run", "--run-id", "same-run")
    by_hosts = fab(env, "-H", hosts, "-i", saved["ssh"]["identity"], "cluster.train", "--dry-run",
                   "--run-id", "same-run", "--python", saved["python"])
    assert by_name.returncode == 0 and by_hosts.returncode == 0, by_name.stderr + by_hosts.stderr
    assert by_name.stdout == by_hosts.stdout
    assert all(i["address"] in by_name.stdout for i in saved["instances"])


class KeyedConsoles:
    """An EC2 client on which every instance's console shows cloud-init's host keys (moto's console is fixed)."""

    def __init__(self, client):
        self.client = client

    def __getattr__(self, attribute):
        return getattr(self.client, attribute)

    def get_console_output(self, InstanceId):  # noqa: N803 - boto3's name
        return {**self.client.get_console_output(InstanceId=InstanceId), "Output": CONSOLE}


def test_a_node_is_replaced_by_an_instance_launched_as_the_cluster_was(env, ec2, image):
    connected = aws.connect()
    connected.ec2 = KeyedConsoles(connected.ec2)
    up("swap", 2, "g5.xlarge", spot=True, max_price="0.91", ssh_cidr=CIDR, ssh_wait_s=0, connected=connected)
    first, second = state.load_cluster("swap").instances
    host, keys = aws.replace("swap", second.address, aws=connected, ssh_wait_s=0)
    assert keys == CONSOLE_KEYS
    running = {i["InstanceId"]: i for i in instances_of(ec2, "swap")}
    assert first.id in running and second.id not in running and len(running) == 2
    [new] = [i for i in running.values() if i["InstanceId"] != first.id]
    old = running[first.id]
    assert new["PrivateIpAddress"] == host.address or new.get("PublicIpAddress") == host.address
    for same in ("InstanceType", "ImageId", "KeyName", "InstanceLifecycle"):
        assert new.get(same) == old.get(same), same
    assert new["MetadataOptions"]["HttpTokens"] == "required"
    assert [g["GroupId"] for g in new["SecurityGroups"]] == [g["GroupId"] for g in old["SecurityGroups"]]
    assert plan.tags_of(new) == plan.tags_of(old)
    saved = state.load_cluster("swap")
    assert [i.id for i in saved.instances] == [first.id, new["InstanceId"]]
    assert [h.address for h in saved.hosts] == [first.address, host.address] and saved.provider == "aws"
    assert saved.instances[1].host_keys == "console"
    # the instances are the cluster file's alone: aws.json keeps how they are launched
    kept = json.loads((env / "kiln" / "clusters" / "swap" / "aws.json").read_text())
    assert {"instances", "host_keys"}.isdisjoint(kept)
    aws.down("swap")
    assert leftovers(ec2) == []


@pytest.mark.parametrize(("fault", "step"), [
    ("capacity", "could not run the instance: InsufficientInstanceCapacity"),
    ("no console keys", "could not read its host keys from the console"),
])
def test_a_replacement_that_cannot_be_made_leaves_the_cluster_as_it_was(env, ec2, image, fault, step):
    connected = aws.connect()
    connected.ec2 = KeyedConsoles(connected.ec2)
    up("keep", 2, "g5.xlarge", ssh_cidr=CIDR, ssh_wait_s=0, connected=connected)
    before = state.load_cluster("keep")
    ids = {i.id for i in before.instances}
    if fault == "capacity":
        connected.ec2 = FailOn(connected.ec2, "run_instances", capacity_error("RunInstances"))
    else:
        class Mute(KeyedConsoles):
            def get_console_output(self, InstanceId):  # noqa: N803 - boto3's name
                return self.client.get_console_output(InstanceId=InstanceId) if InstanceId not in ids else \
                    {**self.client.get_console_output(InstanceId=InstanceId), "Output": CONSOLE}
        connected.ec2 = Mute(connected.ec2.client)
    with pytest.raises(aws.AwsError) as raised:
        aws.replace("keep", before.instances[1].address, aws=connected, ssh_wait_s=0)
    message = str(raised.value)
    assert message.startswith(f"cluster keep: could not replace {before.instances[1].address} "
                              f"({before.instances[1].id}): {step}"), message
    assert message.endswith("; nothing new is left running"), message
    assert {i["InstanceId"] for i in instances_of(ec2, "keep")} == ids  # the old ones run, nothing new does
    assert state.load_cluster("keep") == before
    aws.down("keep")
    assert leftovers(ec2) == []


class Recording:
    """An EC2 client that keeps the parameters of every call kiln makes through it: what EC2 was sent (moto keeps
    no EFA interfaces: it makes plain ones, whatever the request asks for)."""

    def __init__(self, client):
        self.client, self.calls = client, []

    def __getattr__(self, attribute):
        value = getattr(self.client, attribute)
        if not callable(value) or attribute.startswith("get_"):
            return value

        def call(**kwargs):
            self.calls.append((attribute, kwargs))
            return value(**kwargs)
        return call

    def sent(self, api: str) -> list[dict]:
        return [kwargs for attribute, kwargs in self.calls if attribute == api]


def addresses_of(ec2, name: str) -> list[dict]:
    return ec2.describe_addresses(Filters=[{"Name": f"tag:{plan.TAG_CLUSTER}", "Values": [name]}])["Addresses"]


def efa_interfaces_of(run: dict) -> list[tuple[int, int, str]]:
    return [(i["NetworkCardIndex"], i["DeviceIndex"], i["InterfaceType"]) for i in run["NetworkInterfaces"]]


P5_INTERFACES = [(0, 0, "efa"), *((card, 1, "efa-only") for card in range(1, 32))]


def test_an_efa_type_gets_an_interface_per_network_card_and_elastic_ips_that_down_releases(env, ec2, image):
    """p5.48xlarge (32 network cards in EC2's data, which moto serves): 32 EFA interfaces per instance in one
    default subnet of a zone that offers the type, the group letting all traffic out to itself, an Elastic IP per
    instance as its public address; a replacement gets the same interfaces and an address of its own (the old one
    is released); down releases every address."""
    connected = aws.connect()
    connected.ec2 = sent = Recording(KeyedConsoles(connected.ec2))
    made = up("efa", 2, "p5.48xlarge", ssh_cidr=CIDR, ssh_wait_s=0, connected=connected)

    [run] = sent.sent("run_instances")
    group = ec2.describe_security_groups(GroupNames=["kiln-efa"])["SecurityGroups"][0]
    assert "SecurityGroupIds" not in run and run["Placement"] == {"GroupName": "kiln-efa"}
    assert efa_interfaces_of(run) == P5_INTERFACES
    assert all(i["Groups"] == [group["GroupId"]] and i["DeleteOnTermination"] for i in run["NetworkInterfaces"])
    [subnet_id] = {i["SubnetId"] for i in run["NetworkInterfaces"]}
    [subnet] = ec2.describe_subnets(SubnetIds=[subnet_id])["Subnets"]
    offered = {o["Location"] for o in ec2.describe_instance_type_offerings(LocationType="availability-zone", Filters=[
        {"Name": "instance-type", "Values": ["p5.48xlarge"]}])["InstanceTypeOfferings"]}
    assert subnet["DefaultForAz"] and subnet["AvailabilityZone"] in offered

    assert sent.sent("authorize_security_group_egress") == [{"GroupId": group["GroupId"], "IpPermissions": [
        {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group["GroupId"],
                                                   "Description": "kiln: EFA traffic to cluster members"}]}]}]
    assert any(pair["GroupId"] == group["GroupId"] for p in group["IpPermissionsEgress"] if p["IpProtocol"] == "-1"
               for pair in p.get("UserIdGroupPairs", []))
    ranges = [r["CidrIp"] for p in group["IpPermissions"] for r in p.get("IpRanges", [])]
    assert ranges == [CIDR]  # nothing more opened from outside

    addresses = {a["PublicIp"]: a for a in addresses_of(ec2, "efa")}
    instances = {i["InstanceId"]: i for i in instances_of(ec2, "efa")}
    saved = state.load_cluster("efa")
    assert sorted(addresses) == sorted(h.address for h in saved.hosts) and len(addresses) == 2
    for node in saved.instances:
        address = addresses[node.address]
        assert instances[node.id]["PublicIpAddress"] == node.address
        assert address["NetworkInterfaceId"] == efa_plan.primary_interface(instances[node.id])
        assert plan.tags_of(address)[plan.TAG_CLUSTER] == "efa" and address["Domain"] == "vpc"
    assert [a["TagSpecifications"] for a in sent.sent("allocate_address")] == [
        plan.tag_specifications(plan.tags_of(instances[made.ids[0]]), "elastic-ip")] * 2

    lost = saved.instances[1]
    host, _ = aws.replace("efa", lost.address, aws=connected, ssh_wait_s=0)
    _, again = sent.sent("run_instances")
    assert again["MinCount"] == 1 and efa_interfaces_of(again) == P5_INTERFACES
    assert {i["SubnetId"] for i in again["NetworkInterfaces"]} == {subnet_id}
    after = {a["PublicIp"]: a for a in addresses_of(ec2, "efa")}
    assert sorted(after) == sorted([saved.instances[0].address, host.address]) and lost.address not in after
    [new] = [i for i in instances_of(ec2, "efa") if i["InstanceId"] not in instances]
    assert new["PublicIpAddress"] == host.address

    removed = aws.down("efa")
    assert sum(line.startswith("elastic-ip ") for line in removed) == 2
    assert addresses_of(ec2, "efa") == [] and leftovers(ec2) == []


def test_launch_removes_everything_when_the_run_cannot_start(env, ec2, image):
    """moto's instances have no sshd behind their addresses: the train step fails, and launch still downs."""
    done = fab(env, "cluster.launch", "--name", "once", "--count", "2", "--instance-type", "g5.xlarge",
               "--ssh-cidr", CIDR, "--ssh-wait", "0", "--accept-new-host-keys")
    assert done.returncode != 0, done.stdout + done.stderr
    assert "cluster once is running" in done.stdout and "launch: removing cluster once" in done.stdout
    assert "connect failed on 2 host(s)" in done.stderr, done.stderr
    assert "cluster once: removed" in done.stdout, done.stdout
    assert leftovers(ec2) == []
    assert not (env / "kiln" / "clusters" / "once" / "cluster.json").exists()


def data_volumes_of(ec2, name: str) -> dict[str, dict]:
    """The cluster's data volumes by node index, with what they are attached to."""
    volumes = ec2.describe_volumes(Filters=[{"Name": f"tag:{plan.TAG_CLUSTER}", "Values": [name]},
                                            {"Name": "tag-key", "Values": [plan.TAG_DATA]}])["Volumes"]
    return {plan.tags_of(v)[plan.TAG_DATA]: v for v in volumes}


def user_data_of(ec2, instance_id: str) -> str:
    import base64

    value = ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")["UserData"]["Value"]
    return base64.b64decode(value).decode()


def test_data_volumes_outlive_the_cluster_as_snapshots_and_come_back(env, ec2, image):
    made = up("keeper", 2, "g5.xlarge", ssh_cidr=CIDR, ssh_wait_s=0, volume_gib=20)
    assert made.restore_note == "cluster keeper: no snapshot of its data volumes: each node gets an empty volume"
    instances = {i["InstanceId"]: i for i in instances_of(ec2, "keeper")}
    volumes = data_volumes_of(ec2, "keeper")
    assert sorted(volumes) == ["0", "1"]
    assert [volumes[str(n)]["VolumeId"] for n in range(2)] == list(made.volumes)
    for index, instance_id in enumerate(made.ids):
        volume = volumes[str(index)]
        assert (volume["Size"], volume["Encrypted"], volume["VolumeType"]) == (20, True, "gp3")
        assert [(a["InstanceId"], a["Device"]) for a in volume["Attachments"]] == [(instance_id, plan.DATA_DEVICE)]
        assert volume["AvailabilityZone"] == instances[instance_id]["Placement"]["AvailabilityZone"]
        settings = user_data_of(ec2, instance_id)
        assert settings.startswith("#cloud-config\n")
        [written] = json.loads(settings.split("\n", 1)[1])["write_files"]
        assert written["path"] == plan.DATA_SETTINGS
        assert json.loads(written["content"]) == {"label": plan.DATA_LABEL, "mount": plan.DATA_MOUNT,
                                                  "owner": "ubuntu", "size_bytes": 20 * 2**30}

    later = datetime.now(UTC) + timedelta(minutes=5)
    done = aws.down_with_snapshots("keeper", ttl_days=7, now=later)
    assert done.kept == [] and leftovers(ec2, "keeper", snapshots=False) == []
    assert [(s.index, s.state, s.gigabytes, s.taken_at) for s in done.snapshots] == [
        (0, "completed", 20, plan.format_time(later)), (1, "completed", 20, plan.format_time(later))]
    assert {s.tags[plan.TAG_OWNER] for s in done.snapshots} == {plan.tags_of(next(iter(instances.values())))[
        plan.TAG_OWNER]}
    assert timedelta(days=6.9) < done.snapshots[0].expires - datetime.now(UTC) <= timedelta(days=7, minutes=5)
    assert sorted(snapshots_of(ec2, "keeper")) == sorted(f"snapshot {s.id}" for s in done.snapshots)
    assert state.load_cluster("keeper") is None
    listed = fab(env, "cluster.list")
    assert listed.returncode == 0, listed.stderr
    assert "data snapshots:" in listed.stdout and f"keeper node 1 {done.snapshots[1].id}: 20 GiB" in listed.stdout

    again = up("keeper", 3, "g5.xlarge", ssh_cidr=CIDR, ssh_wait_s=0, volume_gib=10)
    first, second = done.snapshots
    assert again.restore_note == (
        f"cluster keeper: data volumes restored from the snapshots of {plan.format_time(later)} (node 0: {first.id}, "
        f"node 1: {second.id}); node(s) 2 had no snapshot and get an empty volume")
    volumes = data_volumes_of(ec2, "keeper")
    assert [(volumes[str(n)].get("SnapshotId") or None, volumes[str(n)]["Size"]) for n in range(3)] == [
        (first.id, 20), (second.id, 20), (None, 10)]  # never smaller than the snapshot
    aws.down("keeper")
    assert leftovers(ec2, snapshots=False) == [] and len(snapshots_of(ec2, "keeper")) == 2  # down keeps snapshots

    assert aws.sweep_snapshots(now=datetime.now(UTC) + timedelta(days=6)) == []
    expired = aws.sweep_snapshots(now=datetime.now(UTC) + timedelta(days=8), dry_run=True)
    assert [s.id for s in expired] == [first.id, second.id] and len(snapshots_of(ec2, "keeper")) == 2
    assert [s.id for s in aws.sweep_snapshots(now=datetime.now(UTC) + timedelta(days=8))] == [first.id, second.id]
    assert leftovers(ec2) == []


def test_sweep_removes_only_expired_snapshots(env, ec2, image):
    up("old", 1, "g5.xlarge", ssh_cidr=CIDR, ssh_wait_s=0, volume_gib=1)
    up("new", 1, "g5.xlarge", ssh_cidr=CIDR, ssh_wait_s=0, volume_gib=1)
    [old] = aws.down_with_snapshots("old", ttl_days=1, now=datetime.now(UTC) - timedelta(days=2)).snapshots
    [new] = aws.down_with_snapshots("new", ttl_days=1).snapshots
    swept = fab(env, "cluster.sweep")
    assert swept.returncode == 0, swept.stderr
    assert f"removed snapshot {old.id} of old node 0" in swept.stdout and new.id not in swept.stdout
    assert snapshots_of(ec2) == [f"snapshot {new.id}"]


def test_a_snapshot_that_fails_keeps_its_volume(env, ec2, image):
    from botocore.exceptions import ClientError

    up("fragile", 2, "g5.xlarge", ssh_cidr=CIDR, ssh_wait_s=0, volume_gib=5)
    volumes = data_volumes_of(ec2, "fragile")
    connected = aws.connect()
    connected.ec2 = FailOn(connected.ec2, "create_snapshot", ClientError(
        {"Error": {"Code": "SnapshotCreationPerVolumeRateExceeded", "Message": "slow down"}}, "CreateSnapshot"))
    first = datetime.now(UTC) - timedelta(minutes=1)
    done = aws.down_with_snapshots("fragile", aws=connected, now=first)
    assert done.kept == [(volumes["0"]["VolumeId"], "0", "SnapshotCreationPerVolumeRateExceeded: slow down")]
    assert [s.index for s in done.snapshots] == [1]
    assert leftovers(ec2, "fragile", snapshots=False) == [f"volume {volumes['0']['VolumeId']}"]  # the data is kept

    cli = fab(env, "cluster.down", "fragile", "--snapshot")  # again: the kept volume is snapshotted, then deleted
    assert cli.returncode == 0, cli.stderr
    assert "node 0's data volume kept as snap-" in cli.stdout
    assert leftovers(ec2, "fragile", snapshots=False) == []
    assert len(snapshots_of(ec2, "fragile")) == 2
    again = up("fragile", 2, "g5.xlarge", ssh_cidr=CIDR, ssh_wait_s=0, volume_gib=5)  # the retry completed the set
    assert again.restore_note.startswith(f"cluster fragile: data volumes restored from the snapshots of "
                                            f"{plan.format_time(first)} (node 0: snap-"), again.restore_note
    assert "node 1: snap-" in again.restore_note and "empty" not in again.restore_note
    aws.down("fragile")


def test_a_failed_snapshot_is_named_by_the_cli_with_a_nonzero_exit(env, ec2, image):
    up("named", 1, "g5.xlarge", ssh_cidr=CIDR, ssh_wait_s=0, volume_gib=5)
    [volume] = data_volumes_of(ec2, "named").values()
    connected = aws.connect()
    connected.ec2 = FailOn(connected.ec2, "get_waiter", capacity_error("DescribeSnapshots"), nth=2)
    done = aws.down_with_snapshots("named", aws=connected)  # the 1st waiter: instances; the 2nd: the snapshot
    assert [(v, n) for v, n, _ in done.kept] == [(volume["VolumeId"], "0")] and done.snapshots == []
    assert done.kept[0][2].startswith("snapshot snap-") and done.kept[0][2].endswith("InsufficientInstanceCapacity: "
                                                                                     "no capacity")
    assert leftovers(ec2, "named", snapshots=False) == [f"volume {volume['VolumeId']}"]
    aws.down("named")
    assert leftovers(ec2, snapshots=False) == []


def test_autostop_armed_later_makes_a_shutdown_terminate(env, ec2, image):
    up("later", 2, "g5.xlarge", ssh_cidr=CIDR, ssh_wait_s=0)
    ids = aws.arm_autostop("later")
    assert sorted(ids) == sorted(i["InstanceId"] for i in instances_of(ec2, "later"))
    for instance_id in ids:
        assert ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="instanceInitiatedShutdownBehavior")[
            "InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"
    aws.down("later")
    assert leftovers(ec2) == []


def test_a_bad_snapshot_ttl_is_refused_before_anything_is_removed(env, ec2, image):
    up("careful", 1, "g5.xlarge", ssh_cidr=CIDR, ssh_wait_s=0, volume_gib=5)
    before = leftovers(ec2, "careful")
    done = fab(env, "cluster.down", "careful", "--snapshot", "--snapshot-ttl-days", "0")
    assert done.returncode != 0 and "--snapshot-ttl-days 0: give more than 0" in done.stderr, done.stderr
    assert leftovers(ec2, "careful") == before and state.load_cluster("careful") is not None
    aws.down("careful")
    assert leftovers(ec2) == []


@pytest.mark.parametrize(("api", "nth", "step"), [
    ("create_volume", 2, "create the data volumes"),
    ("attach_volume", 2, "create the data volumes"),
])
def test_a_failure_around_the_data_volumes_rolls_everything_back(env, ec2, image, api, nth, step):
    connected = aws.connect()
    connected.ec2 = FailOn(connected.ec2, api, capacity_error(api), nth)
    with pytest.raises(aws.AwsError) as raised:
        up("halfway", 2, "g5.xlarge", ssh_cidr=CIDR, connected=connected, ssh_wait_s=0, volume_gib=5)
    assert str(raised.value).startswith(f"cluster.up halfway: could not {step}: InsufficientInstanceCapacity")
    assert str(raised.value).endswith("everything it had created was removed")
    assert leftovers(ec2) == []


def test_a_replacement_gets_the_lost_nodes_data_volume(env, ec2, image):
    connected = aws.connect()
    connected.ec2 = KeyedConsoles(connected.ec2)
    up("heal", 2, "g5.xlarge", spot=True, ssh_cidr=CIDR, ssh_wait_s=0, volume_gib=8, connected=connected)
    before = data_volumes_of(ec2, "heal")
    lost = state.load_cluster("heal").instances[1]
    aws.replace("heal", lost.address, aws=connected, ssh_wait_s=0)
    new_id = state.load_cluster("heal").instances[1].id
    after = data_volumes_of(ec2, "heal")
    assert {k: v["VolumeId"] for k, v in after.items()} == {k: v["VolumeId"] for k, v in before.items()}
    assert [(a["InstanceId"], a["Device"]) for a in after["1"]["Attachments"]] == [(new_id, plan.DATA_DEVICE)]
    assert new_id != lost.id and plan.DATA_SETTINGS in user_data_of(ec2, new_id)
    aws.down("heal")
    assert leftovers(ec2) == []


@pytest.fixture
def west(server):
    """us-west-2's EC2, with a kiln image there (removed after the test)."""
    client = boto3.client("ec2", region_name="us-west-2", endpoint_url=server)
    made = client.register_image(Name="kiln-gpu", RootDeviceName=plan.ROOT_DEVICE, BlockDeviceMappings=[
        {"DeviceName": plan.ROOT_DEVICE, "Ebs": {"VolumeSize": 8}}])["ImageId"]
    client.create_tags(Resources=[made], Tags=[{"Key": plan.TAG_PROFILE, "Value": "gpu"}])
    yield client
    client.deregister_image(ImageId=made)


def test_down_and_list_find_a_cluster_where_it_came_up_not_where_the_shell_points(env, ec2, image, west):
    """kiln up --region us-west-2 from a shell whose default region is us-east-1: kiln list shows it, kiln down with
    no region removes it there (its cluster file says where it is), and a --region that says otherwise is refused.
    Nothing is left in either region."""
    try:
        made = fab(env, "cluster.up", "--name", "trw", "--region", "us-west-2", "--instance-type", "g4dn.xlarge",
                   "--ssh-cidr", CIDR, "--ssh-wait", "0")
        assert made.returncode == 0, made.stdout + made.stderr
        assert state.load_cluster("trw").where == {"region": "us-west-2"}
        listed = fab(env, "cluster.list")
        assert listed.returncode == 0, listed.stderr
        assert "aws region us-west-2:\n  trw: 1 instance(s)" in listed.stdout, listed.stdout
        refused = fab(env, "cluster.down", "trw", "--region", "us-east-1")
        assert refused.returncode == 2 and refused.stderr.strip().endswith(
            "--region us-east-1: cluster trw is in region us-west-2 (its cluster file says so); leave --region out"), \
            refused.stderr
        gone = fab(env, "cluster.down", "trw")
        assert gone.returncode == 0, gone.stdout + gone.stderr
        assert gone.stdout.startswith("cluster trw: removed ") and "instance i-" in gone.stdout
        assert leftovers(west, "trw") == [] and leftovers(ec2, "trw") == []
        assert state.load_cluster("trw") is None
    finally:
        aws.down("trw", region="us-west-2")


def test_a_cluster_that_is_not_where_its_file_says_is_never_forgotten(env, ec2, image, west):
    """Everything of a cluster removed behind kiln's back (the console): kiln down finds nothing where its cluster
    file says it is, says where it looked, exits 1 and keeps the key and files; --forget then removes them."""
    try:
        assert fab(env, "cluster.up", "--name", "gone", "--region", "us-west-2", "--instance-type", "g4dn.xlarge",
                   "--ssh-cidr", CIDR, "--ssh-wait", "0").returncode == 0
        key = env / "kiln" / "clusters" / "gone" / "id_ed25519"
        assert key.exists()
        there = aws.connect("us-west-2")
        aws.remove(there, aws.find_resources(there, "gone"))  # by its tags, as someone in the console would
        assert leftovers(west, "gone") == []
        kept = fab(env, "cluster.down", "gone")
        assert kept.returncode == 1, kept.stdout + kept.stderr
        assert "cluster gone: nothing of it is in region us-west-2, where its cluster file says it is" in kept.stderr
        assert "kiln down gone --forget" in kept.stderr
        assert key.exists() and state.load_cluster("gone") is not None
        forgot = fab(env, "cluster.down", "gone", "--forget")
        assert forgot.returncode == 0, forgot.stderr
        assert "nothing of it is in region us-west-2; kiln's files of it are removed" in forgot.stdout
        assert not key.exists() and state.load_cluster("gone") is None
    finally:
        with contextlib.suppress(KilnError):
            aws.down("gone", region="us-west-2")


def fab_through(hop, server: str, monkeypatch, env, *argv: str) -> subprocess.CompletedProcess:
    """`fab` with every AWS call through the fault hop (testbed.ec2_faults), then aimed at moto again."""
    monkeypatch.setenv(aws.ENDPOINT_ENV, hop.endpoint)
    try:
        return fab(env, *argv)
    finally:
        monkeypatch.setenv(aws.ENDPOINT_ENV, server)


def test_a_region_without_capacity_moves_the_cluster_to_the_next_and_leaves_nothing_there(env, ec2, image, server,
                                                                                          west, monkeypatch):
    """--regions A,B,C: A does not offer the type (EC2's offerings, as moto has them: no p5.48xlarge in eu-west-1),
    so nothing is made there; B is out of it (EC2's InsufficientInstanceCapacity, answered by a real HTTP hop in
    front of moto, testbed.ec2_faults): the try in B is undone whole, and the cluster comes up in C."""
    from testbed.ec2_faults import Ec2Faults

    try:
        with Ec2Faults(server) as hop:
            hop.fail("RunInstances", "us-east-1", "InsufficientInstanceCapacity", instance_type="p5.48xlarge")
            made = fab_through(hop, server, monkeypatch, env, "cluster.up", "--name", "fo", "--gpus", "H100:8",
                               "--count", "2", "--regions", "eu-west-1,us-east-1,us-west-2", "--ssh-cidr", CIDR,
                               "--ssh-wait", "0")
        assert made.returncode == 0, made.stdout + made.stderr
        assert ("up: aws eu-west-1 p5.48xlarge on-demand: --instance-type p5.48xlarge: not offered in eu-west-1; "
                "nothing was made") in made.stdout
        assert "up: trying aws us-east-1 p5.48xlarge on-demand (2 of 3)" in made.stdout
        assert ("up: aws us-east-1 p5.48xlarge on-demand: no capacity (InsufficientInstanceCapacity); nothing of it "
                "is left") in made.stdout
        # one RunInstances in us-east-1 (the SDK did not send it again behind kiln's back), one in us-west-2, each
        # with a ClientToken of its own
        assert hop.refused == [("RunInstances", "us-east-1", "InsufficientInstanceCapacity")]
        assert [region for region, _ in hop.launches] == ["us-east-1", "us-west-2"]
        tokens = [token for _, token in hop.launches]
        assert all(token.startswith("kiln-fo-") for token in tokens) and len(set(tokens)) == 2, tokens
        assert leftovers(ec2) == []  # nothing of the try in us-east-1
        saved = state.load_cluster("fo")
        assert saved.region == "us-west-2" and saved.node_type == "p5.48xlarge"
        running = [i for r in west.describe_instances(Filters=[{"Name": f"tag:{plan.TAG_CLUSTER}", "Values": ["fo"]}])[
            "Reservations"] for i in r["Instances"] if i["State"]["Name"] == "running"]
        assert sorted(i["InstanceType"] for i in running) == ["p5.48xlarge"] * 2
    finally:
        monkeypatch.setenv(aws.ENDPOINT_ENV, server)
        aws.down("fo", region="us-west-2")


def test_a_cluster_the_vcpu_quota_cannot_hold_skips_the_region_before_anything_is_launched(env, ec2, image, server,
                                                                                            west, monkeypatch):
    """Service Quotas (the hop answers for EC2's quotas; moto serves VPC's alone) says the account may run 12
    vCPUs of G instances on demand in us-east-1, where a g6.xlarge (4 vCPUs) already runs: three more (12 vCPUs)
    do not fit the 8 left, so kiln names the quota with its numbers and comes up in us-west-2 (its quota 64)
    without launching anything in us-east-1."""
    from testbed.ec2_faults import Ec2Faults

    running = ec2.run_instances(ImageId=image, InstanceType="g6.xlarge", MinCount=1, MaxCount=1)["Instances"][0]
    try:
        with Ec2Faults(server) as hop:
            on_demand = plan.VCPU_QUOTAS[("G", False)]
            hop.quota("us-east-1", on_demand.code, on_demand.name, 12.0)
            hop.quota("us-west-2", on_demand.code, on_demand.name, 64.0)
            made = fab_through(hop, server, monkeypatch, env, "cluster.up", "--name", "vq", "--gpus", "L4:1",
                               "--count", "3", "--regions", "us-east-1,us-west-2", "--ssh-cidr", CIDR,
                               "--ssh-wait", "0")
        assert made.returncode == 0, made.stdout + made.stderr
        assert ("up: aws us-east-1: over a quota (VcpuLimitExceeded: running On-Demand vCPUs of the instance "
                "family): skipping the region (3 g6.xlarge need 12 vCPUs of the quota 'Running On-Demand G and VT "
                "instances' (L-DB2E81BA), which is 12 here with 4 in use: ask Service Quotas for more)\n"
                ) in made.stdout, made.stdout
        assert [region for region, _ in hop.launches] == ["us-west-2"]
        assert {("GetServiceQuota", "us-east-1"), ("GetServiceQuota", "us-west-2")} <= set(hop.answered)
        assert state.load_cluster("vq").region == "us-west-2"
    finally:
        monkeypatch.setenv(aws.ENDPOINT_ENV, server)
        aws.down("vq", region="us-west-2")
        ec2.terminate_instances(InstanceIds=[running["InstanceId"]])


def test_an_efa_cluster_the_elastic_ip_quota_cannot_hold_skips_the_region_before_anything_is_made(env, ec2, image,
                                                                                                     west):
    """Four of the region's five Elastic IPs (moto's vpc-max-elastic-ips, as EC2's default quota) taken in us-east-1:
    two p5 nodes need two, so kiln says which quota and moves to us-west-2 without launching anything in
    us-east-1; a failed association releases the address it had allocated."""
    taken = [ec2.allocate_address(Domain="vpc")["AllocationId"] for _ in range(4)]
    try:
        made = fab(env, "cluster.up", "--name", "eip", "--gpus", "H100:8", "--count", "2", "--regions",
                   "us-east-1,us-west-2", "--ssh-cidr", CIDR, "--ssh-wait", "0")
        assert made.returncode == 0, made.stdout + made.stderr
        assert ("up: aws us-east-1: over a quota (AddressLimitExceeded: Elastic IP addresses): skipping the region"
                in made.stdout), made.stdout
        assert leftovers(ec2, "eip") == [] and state.load_cluster("eip").region == "us-west-2"
    finally:
        aws.down("eip", region="us-west-2")
        for allocation in taken:
            ec2.release_address(AllocationId=allocation)
    connected = aws.connect()
    connected.ec2 = FailOn(connected.ec2, "associate_address", capacity_error("AssociateAddress"))
    instance = {"InstanceId": "i-0", "NetworkInterfaces": [{"NetworkInterfaceId": "eni-0", "Attachment": {
        "NetworkCardIndex": 0, "DeviceIndex": 0}}]}
    with pytest.raises(Exception, match="InsufficientInstanceCapacity"):
        aws.give_addresses(connected, [instance], {plan.TAG_CLUSTER: "eip"})
    assert ec2.describe_addresses()["Addresses"] == []


def test_by_price_tries_the_region_whose_spot_price_is_lowest_now_first(env, ec2, image, server, west,
                                                                       monkeypatch):
    """--by-price reads each region's spot price history (answered by the hop, since moto gives every type one
    price): the newest price of each zone, the lowest of those; the cluster comes up in the cheapest region, and a
    region without a price is tried last."""
    from testbed.ec2_faults import Ec2Faults

    earlier = datetime.now(UTC) - timedelta(hours=1)
    try:
        with Ec2Faults(server) as hop:
            hop.price("us-east-1", "p5.48xlarge", 40.0)
            hop.price("us-west-2", "p5.48xlarge", 10.0, zone="us-west-2a", at=earlier)  # since gone up to 32
            hop.price("us-west-2", "p5.48xlarge", 32.0, zone="us-west-2a")
            hop.price("us-west-2", "p5.48xlarge", 30.0, zone="us-west-2b")
            made = fab_through(hop, server, monkeypatch, env, "cluster.up", "--name", "bp", "--gpus", "H100:8",
                               "--spot", "--by-price", "--regions", "eu-west-1,us-east-1,us-west-2", "--ssh-cidr",
                               CIDR, "--ssh-wait", "0")
        assert made.returncode == 0, made.stdout + made.stderr
        assert ("candidates, in the order kiln tries them (3):\n  1. aws us-west-2 p5.48xlarge spot ($30/h now)\n"
                "  2. aws us-east-1 p5.48xlarge spot ($40/h now)\n  3. aws eu-west-1 p5.48xlarge spot\n") in made.stdout
        assert "up: trying aws us-west-2 p5.48xlarge spot (1 of 3)" in made.stdout
        assert set(hop.answered) == {("DescribeSpotPriceHistory", "us-east-1"),
                                     ("DescribeSpotPriceHistory", "us-west-2")}
        assert state.load_cluster("bp").region == "us-west-2"
    finally:
        monkeypatch.setenv(aws.ENDPOINT_ENV, server)
        aws.down("bp", region="us-west-2")


def test_no_spot_capacity_falls_back_to_on_demand_and_an_empty_aws_to_gcp(env, ec2, image, server, monkeypatch):
    """--spot --on-demand-fallback with EC2 out of spot p5.48xlarge: the on-demand try comes up. Then --provider
    aws,gcp with EC2 out of g6.xlarge: the cluster comes up on Compute Engine (its stand-in, testbed.gce), and
    nothing of the EC2 try is left."""
    from bootstrap.providers.gcp import cloud as gcp_cloud
    from testbed.ec2_faults import Ec2Faults
    from testbed.gce import Gce

    with Ec2Faults(server) as hop, Gce(project="kiln-test", zones=("us-central1-a",)) as gce:
        gce.add_image("kiln-gpu-1", family="kiln-gpu", labels={"kiln-profile": "gpu"})
        monkeypatch.setenv(aws.ENDPOINT_ENV, hop.endpoint)
        monkeypatch.setenv(gcp_cloud.ENDPOINT_ENV, gce.endpoint)
        hop.fail("RunInstances", "us-east-1", "InsufficientInstanceCapacity", spot=True)
        spot = fab(env, "cluster.up", "--name", "od", "--gpus", "H100:8", "--spot", "--on-demand-fallback",
                   "--ssh-cidr", CIDR, "--ssh-wait", "0")
        hop.clear()
        hop.fail("RunInstances", "us-east-1", "InsufficientInstanceCapacity", instance_type="g6.xlarge")
        other = fab(env, "cluster.up", "--name", "xc", "--provider", "aws,gcp", "--gpus", "L4:1", "--count", "2",
                    "--project", "kiln-test", "--zone", "us-central1-a", "--ssh-cidr", CIDR, "--ssh-wait", "0")
        gcp_made = gcp_cloud.list_clusters(gce=gcp_cloud.connect("kiln-test"))
        monkeypatch.setenv(aws.ENDPOINT_ENV, server)
        if other.returncode == 0:
            gcp_cloud.down("xc", gce=gcp_cloud.connect("kiln-test"))
    assert spot.returncode == 0, spot.stdout + spot.stderr
    assert "up: aws (its default place) p5.48xlarge spot: no capacity (InsufficientInstanceCapacity)" in spot.stdout
    instances = [i for r in ec2.describe_instances(Filters=[{"Name": f"tag:{plan.TAG_CLUSTER}", "Values": ["od"]}])[
        "Reservations"] for i in r["Instances"] if i["State"]["Name"] == "running"]
    assert instances and all("InstanceLifecycle" not in i for i in instances), instances  # on demand
    aws.down("od")
    assert other.returncode == 0, other.stdout + other.stderr
    assert "up: aws (its default place) g6.xlarge on-demand: no capacity (InsufficientInstanceCapacity)" in other.stdout
    assert "up: trying gcp us-central1-a g2-standard-4 on-demand (2 of 2)" in other.stdout
    assert [summary.name for summary in gcp_made] == ["xc"] and state.load_cluster("xc") is None  # down removed it
    assert leftovers(ec2) == []


def managed_move(name: str) -> Recovery:
    """A managed run's recovery of cluster `name` as `kiln train --managed --relocate` makes it, with the real
    bring-up of the task (placement.up_again); moto's machines are records, not machines, so the new cluster is
    not reached (`reopen`: the one step a cloud test cannot take)."""
    from bootstrap import providers
    from bootstrap.launch import RunSpec
    from bootstrap.providers import placement

    record = state.load_cluster(name)
    group = Cluster.connect(name, record.hosts, SshOptions(), python="python3", fanout=4, timeout=30)

    def unreachable():
        raise KilnError("moto's machines answer no ssh")

    spec = RunSpec("moved", "tf-config", ("node1", "node2"), (None, None), "python3", "/home/ubuntu/kiln")
    return Recovery(group, providers.for_cluster(record, name), spec, None, None, None,
                    up_again=lambda capacity: placement.up_again(name, capacity, print).describe(),
                    reopen=unreachable)


def test_a_managed_move_comes_up_at_the_other_place_and_a_cluster_with_data_volumes_stays(env, ec2, image, west):
    """A managed run's move on EC2 (its place has no capacity for a replacement): a cluster whose up named
    us-east-1 and us-west-2 and came up in us-east-1 goes down there, leaving nothing, and comes up in us-west-2,
    the other place its up named. A cluster with data volumes (whose up could name one place only: the snapshots
    and the image live in one region) is not taken down: its machines and volumes stay as they are."""
    made = fab(env, "cluster.up", "--name", "mv", "--gpus", "L4:1", "--count", "2", "--regions",
               "us-east-1,us-west-2", "--ssh-cidr", CIDR, "--ssh-wait", "0")
    assert made.returncode == 0, made.stdout + made.stderr
    assert state.load_cluster("mv").region == "us-east-1"
    try:
        with pytest.raises(KilnError) as unreached:
            managed_move("mv").move(state.load_cluster("mv").hosts)
        assert "cluster mv is up again at aws us-west-2 g6.xlarge on-demand" in str(unreached.value)
        assert leftovers(ec2, "mv") == []
        assert state.load_cluster("mv").region == "us-west-2"
        assert [item.split()[0] for item in leftovers(west, "mv")].count("instance") == 2
    finally:
        for region in ("us-east-1", "us-west-2"):
            with contextlib.suppress(KilnError):
                aws.down("mv", region=region)

    made = fab(env, "cluster.up", "--name", "stay", "--gpus", "L4:1", "--count", "2", "--volume", "20",
               "--ssh-cidr", CIDR, "--ssh-wait", "0")
    assert made.returncode == 0, made.stdout + made.stderr
    try:
        before = leftovers(ec2, "stay")
        with pytest.raises(KilnError, match=r"has no place to move to but aws \(its default place\) g6.xlarge"):
            managed_move("stay").move(state.load_cluster("stay").hosts)
        assert leftovers(ec2, "stay") == before
        assert [item.split()[0] for item in before].count("volume") == 4  # two root volumes, two data volumes
    finally:
        aws.down("stay")


def regions_offering(instance_type: str, regions: list[str]) -> dict[str, set[str]]:
    """Where moto's copy of EC2's offerings (the data its DescribeInstanceTypeOfferings answers from) has the
    type, read from its files: region -> zones."""
    import gzip

    folder = Path(moto_server.__file__).parent / "ec2" / "resources" / "instance_type_offerings" / "availability-zone"
    found = {}
    for region in regions:
        if not (folder / f"{region}.json.gz").is_file():  # a region moto has no offerings of answers none
            continue
        rows = json.loads(gzip.decompress((folder / f"{region}.json.gz").read_bytes()))
        zones = {row["Location"] for row in rows if row["InstanceType"] == instance_type}
        if zones:
            found[region] = zones
    return found


def test_with_no_region_given_or_configured_every_region_that_offers_the_type_is_a_candidate(env, ec2, monkeypatch):
    """--gpus H100:8 with no region given and none configured: kiln asks EC2 where p5.48xlarge is (DescribeRegions,
    then DescribeInstanceTypeOfferings in each) and plans a candidate in each region that has it and no other,
    those with the most zones first; the answer is kept a day (the next up reads no offerings), and kiln gpus shows
    how many regions and zones offer each type."""
    expected = regions_offering("p5.48xlarge", [r["RegionName"] for r in ec2.describe_regions()["Regions"]])
    assert len(expected) > 2 and "us-east-1" in expected
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    planned = fab(env, "cluster.up", "--name", "np", "--gpus", "H100:8", "--count", "2", "--ssh-cidr", CIDR,
                  "--dry-run")
    assert planned.returncode == 0, planned.stdout + planned.stderr
    zones = sum(len(z) for z in expected.values())
    assert (f"aws: no --region named: every region that offers p5.48xlarge to this account, {len(expected)} "
            f"({len(expected)} region(s), {zones} zone(s); EC2's DescribeInstanceTypeOfferings, read ") \
        in planned.stdout
    listed = [line.split()[2] for line in planned.stdout.splitlines() if line.strip().endswith("p5.48xlarge on-demand")
              and line.strip()[0].isdigit()]
    assert sorted(listed) == sorted(expected), planned.stdout
    assert listed == sorted(expected, key=lambda region: (-len(expected[region]), region))
    kept = env / "kiln" / "offerings" / "aws.json"
    read_at = json.loads(kept.read_text())["read_at"]
    again = fab(env, "cluster.up", "--name", "np", "--gpus", "H100:8", "--ssh-cidr", CIDR, "--dry-run")
    assert again.returncode == 0 and json.loads(kept.read_text())["read_at"] == read_at
    shown = fab(env, "cluster.gpus", "--provider", "aws")
    assert shown.returncode == 0, shown.stderr
    assert f"p5.48xlarge                 8 H100, 80 GB each, NVLink, EFA  [{len(expected)} region(s), {zones} " \
           "zone(s)]" in shown.stdout, shown.stdout
    configured = fab(env, "cluster.up", "--name", "np", "--gpus", "H100:8", "--ssh-cidr", CIDR, "--dry-run",
                     "--region", "us-west-2")
    assert configured.returncode == 0 and "no --region named" not in configured.stdout
    assert "candidates, in the order" not in configured.stdout  # the region named is the one place
    assert not (env / "kiln" / "clusters" / "np" / "capacity.json").exists()


def test_a_queue_grows_the_cluster_by_instances_launched_as_its_own_and_shrinks_it_all_or_nothing(env, ec2, image):
    """What a queue's resume and suspend ask of EC2 (the provider's grow and shrink): instances launched as the
    cluster's were, their console keys pinned and the cluster file extended; a grow whose second launch fails
    terminates the first and leaves the cluster as it was; a shrink terminates the instances it names and takes
    them out of the cluster file and its pins."""
    from bootstrap import providers

    connected = aws.connect()
    connected.ec2 = KeyedConsoles(connected.ec2)
    up("q", 1, "g5.xlarge", ssh_cidr=CIDR, ssh_wait_s=0, connected=connected)
    before = state.load_cluster("q")
    grown = aws.grow("q", 2, aws=connected, ssh_wait_s=0)
    assert [keys for _, _, keys in grown] == [CONSOLE_KEYS] * 2
    running = {i["InstanceId"]: i for i in instances_of(ec2, "q")}
    old = running[before.instances[0].id]
    assert len(running) == 3 and {new_id for new_id, _, _ in grown} <= set(running)
    for new_id, _, _ in grown:
        for same in ("InstanceType", "ImageId", "KeyName"):
            assert running[new_id].get(same) == old.get(same), same
        assert plan.tags_of(running[new_id]) == plan.tags_of(old)
        assert running[new_id]["MetadataOptions"]["HttpTokens"] == "required"
    after = state.load_cluster("q")
    assert [i.id for i in after.instances] == [before.instances[0].id, *(new_id for new_id, _, _ in grown)]
    assert [i.host_keys for i in after.instances[1:]] == ["console", "console"]
    pins = state.read_known_hosts("q")
    assert all(host.address in pins for _, host, _ in grown)

    connected.ec2 = FailOn(connected.ec2, "run_instances", capacity_error("RunInstances"), nth=2)
    with pytest.raises(aws.AwsError) as raised:
        aws.grow("q", 2, aws=connected, ssh_wait_s=0)
    assert str(raised.value).startswith("cluster q: could not add 2 instance(s): could not run the instance: ")
    assert str(raised.value).endswith("; nothing new is left running") and raised.value.code == \
        "InsufficientInstanceCapacity"
    assert set(i["InstanceId"] for i in instances_of(ec2, "q")) == set(running)
    assert state.load_cluster("q") == after and state.read_known_hosts("q") == pins

    provider = providers.for_cluster(state.load_cluster("q"), "q")
    provider.shrink("q", [host for _, host, _ in grown])
    assert [i["InstanceId"] for i in instances_of(ec2, "q")] == [before.instances[0].id]
    assert state.load_cluster("q") == before
    assert not any(host.address in state.read_known_hosts("q") for _, host, _ in grown)
    aws.down("q")
    assert leftovers(ec2) == []


@pytest.fixture
def machines(server):
    """The hop in front of moto whose us-east-1 instances are real machines (testbed.ec2_machines): the three
    slots of a local cluster, booted as instances launch (each with its metadata service, which serves its instance
    profile's credentials) and taken away as they terminate."""
    from localcloud import cluster as local
    from testbed.ec2_faults import Ec2Faults
    from testbed.ec2_machines import Machines

    local.preflight()
    cluster = local.make_cluster("awsm", 3, start=0, metadata=True)
    made = Machines("awsm", "us-east-1", moto=server)
    try:  # on the cluster's bridge: a machine reaches EC2 there as this machine does (a queue's controller)
        with Ec2Faults(server, host=cluster.gateway, machines=made) as hop:
            yield hop
    finally:
        made.close()
        local.teardown("awsm")


def test_an_aws_cluster_of_machines_is_reached_over_the_host_keys_its_consoles_show(env, machines, ec2, image,
                                                                                    monkeypatch):
    """kiln up on AWS where each instance is a machine (testbed.ec2_machines): kiln waits until SSH answers on each,
    pins the host keys its console shows, and kiln run reaches every node over them; kiln down terminates the
    instances and their machines go. A launch larger than the capacity left is EC2's capacity error, nothing
    made."""
    from localcloud import cluster as local

    monkeypatch.setenv(aws.ENDPOINT_ENV, machines.endpoint)
    made = fab(env, "cluster.up", "--name", "real", "--count", "2", "--instance-type", "g5.xlarge", "--user", "root",
               "--ssh-cidr", CIDR)
    assert made.returncode == 0, made.stdout + made.stderr
    record = state.load_cluster("real")
    booted = {machine.node.ip: machine for machine in machines.machines.running.values()}
    assert sorted(host.address for host in record.hosts) == sorted(booted) and len(booted) == 2
    assert [instance.host_keys for instance in record.instances] == ["console", "console"]
    pins = state.read_known_hosts("real")
    for address, machine in booted.items():
        pinned = {" ".join(line.split()[1:3]) for line in pins.splitlines() if address in line.split()[0].split(",")}
        assert pinned == set(machine.keys), address

    ran = subprocess.run([str(REPO / ".venv" / "bin" / "kiln"), "run", "--cluster", "real", "--run-id", "where",
                          "--", "hostname"], cwd=env, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "KILN_HOME": str(env / "kiln")})
    assert ran.returncode == 0, ran.stdout + ran.stderr
    names = {machine.node.name for machine in booted.values()}
    assert all(name in ran.stdout for name in names), ran.stdout  # each node's hostname, as its facts said it

    more = fab(env, "cluster.up", "--name", "more", "--count", "2", "--instance-type", "g5.xlarge", "--user", "root",
               "--ssh-cidr", CIDR)
    assert more.returncode != 0 and "InsufficientInstanceCapacity" in more.stderr, more.stdout + more.stderr
    assert instances_of(ec2, "more") == []

    # the queue's controller machine: its profile is one EC2 does not see at once (IAM's new profiles reach EC2
    # seconds later: RunInstances is asked again)
    machines.fail("RunInstances", "us-east-1", "InvalidParameterValue", times=1, message=(
        "Value (kiln-real-us-east-1-controller) for parameter iamInstanceProfile.name is invalid. Invalid IAM "
        "Instance Profile name"))
    connected = aws.connect()
    host, keys = aws.make_controller("real", aws=connected, identity_poll_s=0.2)
    record = state.load_cluster("real")
    [controller] = [i for i in instances_of(ec2, "real") if plan.tags_of(i).get(plan.TAG_ROLE) == "controller"]
    assert record.controller == state.Instance(controller["InstanceId"], host.address, "console")
    assert host.address not in {h.address for h in record.hosts} and controller["InstanceType"] == "m7i.large"
    assert controller["IamInstanceProfile"]["Arn"].endswith("/kiln/us-east-1/kiln-real-us-east-1-controller")
    assert sorted(keys) == sorted(machines.machines.running[controller["InstanceId"]].keys)
    assert machines.refused == [("RunInstances", "us-east-1", "InvalidParameterValue")]  # asked once more
    reached = subprocess.run(["ssh", "-i", str(state.cluster_dir("real") / "id_ed25519"), "-o", "IdentitiesOnly=yes",
                              "-o", f"UserKnownHostsFile={state.known_hosts_path('real')}", "-o",
                              "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", f"root@{host.address}",
                              "hostname"], capture_output=True, text=True, timeout=60)
    assert reached.returncode == 0 and reached.stdout.strip() == \
        machines.machines.running[controller["InstanceId"]].node.name, reached.stderr

    gone = fab(env, "cluster.down", "real")
    assert gone.returncode == 0, gone.stdout + gone.stderr
    assert "iam-role kiln-real-us-east-1-controller" in gone.stdout, gone.stdout
    assert machines.machines.ended[0] == [controller["InstanceId"]]  # first: it launches nothing once it is gone
    assert machines.machines.running == {} and leftovers(ec2) == [] and identities_left(connected.iam) == []
    assert not any(local.node_is_up("awsm", machine.node) for machine in booted.values())


def test_a_queue_on_aws_runs_slurm_on_its_controller_whose_kiln_makes_and_removes_the_nodes(env, machines, ec2,
                                                                                            image, monkeypatch):
    """kiln queue up --provider aws: the cluster with no node, its controller machine, kiln shipped there and the
    queue started on it (its MUNGE key made there). A job submitted on the controller (its login shell reaches the
    queue) waits while slurmctld runs kiln's resume there, which launches a node as the controller's own role (the
    credentials its metadata service gives), pins the node's console keys and joins it; the job runs on that node,
    which is removed once idle past SuspendTime. kiln queue status reaches the queue through the controller; kiln
    down ends the controller first and leaves nothing. A Ctrl-C while the controller is set up removes it all."""
    monkeypatch.setenv(aws.ENDPOINT_ENV, machines.endpoint)

    def kiln(*argv: str, timeout: float = 300, cwd: Path = env) -> subprocess.CompletedProcess:
        return subprocess.run([str(REPO / ".venv" / "bin" / "kiln"), *argv], cwd=cwd, capture_output=True, text=True,
                              timeout=timeout, env={**os.environ, "KILN_HOME": str(env / "kiln"),
                                                    "KILN_RUNS": str(env / "runs")})

    argv = ["queue", "up", "awq", "--provider", "aws", "--region", "us-east-1", "--instance-type", "g5.xlarge",
            "--user", "root", "--ssh-cidr", CIDR, "--max-nodes", "1", "--idle-minutes", "0.5"]
    # a Ctrl-C once the controller machine runs (while kiln is set up there) removes all of it
    with subprocess.Popen([str(REPO / ".venv" / "bin" / "kiln"), *argv], cwd=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env={**os.environ, "KILN_HOME": str(env / "kiln")}) as up:
        deadline = time.monotonic() + 120
        while not machines.machines.running and up.poll() is None:
            assert time.monotonic() < deadline, "no controller machine"
            time.sleep(0.1)
        time.sleep(1)
        up.send_signal(signal.SIGINT)
        out, err = up.communicate(timeout=300)
    assert up.returncode == 1 and "Traceback" not in err, out + err
    said = err.strip().splitlines()[-1]  # the queue's undo, or the controller's own where it was being made
    assert said == "kiln: queue awq: interrupted; everything it had made was removed" or (
        said.startswith("kiln: cluster awq: could not make its queue controller: could not ") and
        said.endswith(": interrupted; nothing of it is left")), out + err
    assert machines.machines.running == {} and leftovers(ec2) == [] and identities_left(aws.connect().iam) == []
    assert not state.cluster_dir("awq").exists()

    ended = len(machines.machines.ended)  # the interrupted controller's

    made = kiln(*argv)
    assert made.returncode == 0, made.stdout + made.stderr
    assert "slurmctld on its controller" in made.stdout and "boto3" in made.stdout, made.stdout
    [controller] = [i for i in instances_of(ec2, "awq") if plan.tags_of(i).get(plan.TAG_ROLE) == "controller"]
    running = machines.machines.running
    assert list(running) == [controller["InstanceId"]]  # no node yet
    machine = running[controller["InstanceId"]]
    shown = kiln("queue", "status", "awq")
    assert shown.returncode == 0 and "awq-cpu-0" in shown.stdout and "cpu" in shown.stdout, shown.stdout + shown.stderr
    key = state.cluster_dir("awq") / "id_ed25519"

    def on_controller(command: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(["ssh", "-i", str(key), "-o", "IdentitiesOnly=yes", "-o",
                               f"UserKnownHostsFile={state.known_hosts_path('awq')}", "-o", "StrictHostKeyChecking=yes",
                               "-o", "BatchMode=yes", f"root@{machine.node.ip}", command], capture_output=True,
                              text=True, timeout=timeout)

    # kiln submit from a project: its folder goes to the node made for it and what the node wrote comes back
    project = env / "project"
    project.mkdir()
    (project / "where.py").write_text("import os, socket\nopen(os.path.join(os.environ['KILN_OUTPUT_DIR'], "
                                      "'where.txt'), 'w').write(socket.gethostname())\nprint('written')\n")
    done = kiln("submit", "awq", "--wait", "--python", "python3", "--", "python3", "where.py", cwd=project,
                timeout=600)
    logs = "/root/kiln/controller/home/clusters/awq/queue/{resume,job-start,job-end}.log"
    assert done.returncode == 0, done.stdout + done.stderr + on_controller(f"tail -5 {logs}").stdout
    [node] = [m for i, m in running.items() if i != controller["InstanceId"]]
    job = done.stdout.split()[1]
    fetched = kiln("queue", "fetch", "awq", "--job", job)
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    [where] = (env / "runs").glob("*/output/node-0/where.txt")
    assert where.read_text() == node.node.name and "written" in done.stdout, done.stdout
    # Slurm's own tools on the controller, as its login user: a step on the node up
    ran = on_controller("bash -lc 'srun --nodes 1 --chdir /tmp hostname'", timeout=400)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.strip() == node.node.name
    role = json.loads((node_state(machine) / "iam.json").read_text())
    assert role["role"] == "kiln-awq-us-east-1-controller"
    assert ("RunInstances", role["AccessKeyId"]) in machines.signers  # the node: launched as the controller's role
    assert not on_controller("ls /run/munge/kiln-awq.key").returncode  # the key is the controller's
    assert not (state.cluster_dir("awq") / "queue").exists()  # and none of the queue's is here
    deadline = time.monotonic() + 120
    while len(running) > 1:  # idle past SuspendTime: kiln's suspend on the controller removes it
        assert time.monotonic() < deadline, on_controller(
            "tail -5 /root/kiln/controller/home/clusters/awq/queue/suspend.log").stdout
        time.sleep(1)

    gone = kiln("down", "awq")
    assert gone.returncode == 0, gone.stdout + gone.stderr
    [node_id] = machines.machines.ended[ended]
    assert machines.machines.ended[ended:] == [[node_id], [controller["InstanceId"]]]  # by suspend, then down
    assert machines.machines.running == {} and leftovers(ec2) == []
    assert identities_left(aws.connect().iam) == [] and not state.cluster_dir("awq").exists()


def node_state(machine) -> Path:
    """Where the local cluster keeps a machine's files (its metadata service's identity among them)."""
    from localcloud import netns

    return netns.STATE_ROOT / "awsm" / machine.node.name


def identities_left(iam) -> list[str]:
    """Every role and instance profile under kiln's IAM path, looked up independently of kiln's own code."""
    return [*(f"iam-role {r['RoleName']}" for r in iam.list_roles(PathPrefix=identity.PATH_ROOT)["Roles"]),
            *(f"instance-profile {p['InstanceProfileName']}" for p in iam.list_instance_profiles()["InstanceProfiles"]
              if p["Path"].startswith(identity.PATH_ROOT))]


def launch_fits(document: dict, params: dict, cluster: str) -> list[str]:
    """Where a RunInstances request falls outside the controller's policy: its image, security group, key pair and
    placement group not the ones the policy names, or a resource type the policy conditions on its tag not tagged
    with the cluster at launch."""
    statements = {s["Sid"]: s for s in document["Statement"]}
    parts = statements["LaunchFromTheClustersOwnParts"]["Resource"]
    groups = params.get("SecurityGroupIds") or [g for i in params.get("NetworkInterfaces", []) for g in i["Groups"]]
    named = [("image", params["ImageId"]), *(("security-group", g) for g in groups),
             ("key-pair", params["KeyName"]), ("placement-group", params["Placement"]["GroupName"])]
    wrong = [f"{kind} {name}" for kind, name in named if not any(r.endswith(f"{kind}/{name}") for r in parts)]
    if statements["LaunchOnlyTheClustersNodes"]["Condition"]["StringEquals"]["ec2:InstanceType"] != \
            params["InstanceType"]:
        wrong.append(f"type {params['InstanceType']}")
    if "InstanceMarketOptions" in params and not any(":spot-instances-request/" in r for r in parts):
        wrong.append("spot request")
    tagged = {spec["ResourceType"] for spec in params.get("TagSpecifications", [])
              if plan.tags_of(spec).get(plan.TAG_CLUSTER) == cluster}
    conditioned = {r.rsplit(":", 1)[1].split("/")[0] for sid in ("LaunchOnlyWhatCarriesTheClustersTag",
                                                                 "LaunchOnlyTheClustersNodes")
                   for r in [statements[sid]["Resource"]] for r in ([r] if isinstance(r, str) else r)}
    return wrong + [f"{kind} not tagged at launch" for kind in sorted(conditioned - tagged)]


@pytest.mark.parametrize(("instance_type", "spot"), [("g5.xlarge", False), ("p4d.24xlarge", False),
                                                     ("g5.xlarge", True)])
def test_a_queue_controllers_identity_allows_what_a_grow_and_shrink_ask_and_kiln_down_removes_it(
        env, ec2, image, instance_type, spot):
    """The IAM role and instance profile a queue's controller machine holds (aws.make_controller_identity): under
    kiln's path, tagged with the cluster, the role in the profile, ec2.amazonaws.com alone may assume it; every EC2
    action a grow and a shrink then call is one its policy allows (an EFA type's Elastic IPs too), and each launch
    uses the parts the policy names and tags at launch what it conditions on the cluster's tag. kiln list counts
    them with the cluster, kiln down removes them."""
    connected = aws.connect()
    connected.ec2 = KeyedConsoles(connected.ec2)
    up("qc", 1, instance_type, ssh_cidr=CIDR, ssh_wait_s=0, connected=connected, spot=spot)
    own = aws.make_controller_identity("qc", aws=connected)
    iam = connected.iam
    assert own == "kiln-qc-us-east-1-controller"
    role = iam.get_role(RoleName=own)["Role"]
    assert role["Path"] == "/kiln/us-east-1/" and plan.tags_of(role)[plan.TAG_CLUSTER] == "qc"
    trust = role["AssumeRolePolicyDocument"]
    assert (json.loads(trust) if isinstance(trust, str) else trust) == identity.TRUST
    held = iam.get_instance_profile(InstanceProfileName=own)["InstanceProfile"]
    assert [r["RoleName"] for r in held["Roles"]] == [own] and held["Path"] == role["Path"]
    document = iam.get_role_policy(RoleName=own, PolicyName=identity.POLICY_NAME)["PolicyDocument"]
    document = json.loads(document) if isinstance(document, str) else document
    assert document == identity.policy("qc", region="us-east-1", account=identity.account_of(aws.caller(connected)),
                                       ami=image, group_id=aws.Record.of_cluster("qc")[1].security_group,
                                       efa=instance_type.startswith("p4d"), instance_type=instance_type, spot=spot)

    called: list[tuple[str, dict]] = []
    connected.ec2.meta.events.register("before-parameter-build.ec2", lambda params, model, **_: called.append(
        (model.name, dict(params))))
    grown = aws.grow("qc", 1, aws=connected, ssh_wait_s=0)
    aws.shrink("qc", [host.address for _, host, _ in grown], aws=connected)
    asked = {f"ec2:{name}" for name, _ in called}
    assert "ec2:RunInstances" in asked and "ec2:TerminateInstances" in asked
    assert ("ec2:AllocateAddress" in asked) == instance_type.startswith("p4d")
    assert asked <= identity.actions(document), asked - identity.actions(document)
    launches = [params for name, params in called if name == "RunInstances"]
    assert [launch_fits(document, params, "qc") for params in launches] == [[]]
    [launch] = launches
    assert launch["InstanceType"] == instance_type and ("InstanceMarketOptions" in launch) == spot
    for name, params in called:
        if name == "AllocateAddress":
            assert [plan.tags_of(spec)[plan.TAG_CLUSTER] for spec in params["TagSpecifications"]] == ["qc"]

    listed = fab(env, "cluster.list")
    assert listed.returncode == 0 and "qc: 1 instance(s), " in listed.stdout, listed.stdout + listed.stderr
    gone = fab(env, "cluster.down", "qc")
    assert gone.returncode == 0, gone.stdout + gone.stderr
    assert f"iam-role {own}" in gone.stdout and f"instance-profile {own}" in gone.stdout, gone.stdout
    assert identities_left(iam) == [] and leftovers(ec2) == []


@pytest.mark.parametrize(("api", "step"), [
    ("create_role", "create the role"), ("put_role_policy", "give the role its policy"),
    ("create_instance_profile", "create the instance profile"),
    ("add_role_to_instance_profile", "put the role in the instance profile")])
def test_a_controller_identity_that_cannot_be_made_leaves_none_of_it(env, ec2, image, api, step):
    from botocore.exceptions import ClientError

    connected = aws.connect()
    up("qi", 1, "g5.xlarge", ssh_cidr=CIDR, ssh_wait_s=0, connected=connected)
    refused = ClientError({"Error": {"Code": "LimitExceeded", "Message": "Cannot exceed quota"}}, api)
    connected.iam = FailOn(connected.iam, api, refused)
    with pytest.raises(aws.AwsError) as raised:
        aws.make_controller_identity("qi", aws=connected)
    assert str(raised.value) == (f"cluster qi: could not {step} of its queue controller: LimitExceeded: Cannot "
                                 "exceed quota; nothing of it is left") and raised.value.code == "LimitExceeded"
    assert identities_left(connected.iam.client) == []
    assert len(instances_of(ec2, "qi")) == 1  # the cluster itself is left as it was
    aws.down("qi")
    assert leftovers(ec2) == []


def test_a_controller_that_cannot_be_made_leaves_neither_its_machine_nor_its_identity(env, ec2, image, server,
                                                                                      monkeypatch):
    from testbed.ec2_faults import Ec2Faults

    up("qm", 1, "g5.xlarge", ssh_cidr=CIDR, ssh_wait_s=0)
    with Ec2Faults(server) as hop, monkeypatch.context() as patched:
        patched.setenv(aws.ENDPOINT_ENV, hop.endpoint)
        hop.fail("RunInstances", "us-east-1", "InsufficientInstanceCapacity", instance_type="m7i.large")
        with pytest.raises(aws.AwsError) as raised:
            aws.make_controller("qm", ssh_wait_s=0)
        assert str(raised.value).startswith("cluster qm: could not make its queue controller: could not run the "
                                            "instance: InsufficientInstanceCapacity: ")
        assert str(raised.value).endswith("; nothing of it is left")
        assert identities_left(aws.connect().iam) == [] and len(instances_of(ec2, "qm")) == 1
        hop.clear()
        with pytest.raises(aws.AwsError, match="shows no host keys on its console"):
            aws.make_controller("qm", ssh_wait_s=0)  # moto's console shows none
        assert identities_left(aws.connect().iam) == [] and len(instances_of(ec2, "qm")) == 1
        assert state.load_cluster("qm").controller is None
        # an identity that is there already (an earlier controller's) is refused and left as it is
        own = aws.make_controller_identity("qm")
        with pytest.raises(UsageError, match=f"^cluster qm: could not create the role of its queue controller: {own} "
                                             "exists already"):
            aws.make_controller("qm", ssh_wait_s=0)
        assert identities_left(aws.connect().iam) == [f"iam-role {own}", f"instance-profile {own}"]
    aws.down("qm")
    assert leftovers(ec2) == []


def test_credentials_that_may_not_read_iam_still_list_and_remove_a_cluster(env, ec2, image):
    """Most clusters have no controller identity; a caller IAM refuses (AccessDenied) sees none and goes on."""
    from botocore.exceptions import ClientError

    connected = aws.connect()
    up("qd", 1, "g5.xlarge", ssh_cidr=CIDR, ssh_wait_s=0, connected=connected)
    denied = ClientError({"Error": {"Code": "AccessDenied", "Message": "not authorized to perform: iam:GetRole"}},
                         "GetRole")

    class Denying:  # every IAM call, as IAM answers a caller without its rights
        def __getattr__(self, attribute):
            def refuse(*_, **__):
                raise denied
            return refuse

    connected.iam = Denying()
    assert [s.name for s in aws.list_clusters(aws=connected)] == ["qd"]
    assert aws.down("qd", aws=connected) and leftovers(ec2) == []


def test_with_no_region_named_by_price_orders_every_offering_region_by_its_on_demand_price(env, ec2, server,
                                                                                          monkeypatch):
    """--gpus H100:8 --by-price with no region: the regions that offer p5.48xlarge (DescribeInstanceTypeOfferings),
    ordered by the on-demand price the Price List gives for each (GetProducts, answered by the hop: moto has no
    Price List), the cheapest first; the regions without a price follow in their own order."""
    from testbed.ec2_faults import Ec2Faults

    offered = regions_offering("p5.48xlarge", [r["RegionName"] for r in ec2.describe_regions()["Regions"]])
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    with Ec2Faults(server) as hop:
        hop.on_demand("us-east-1", "p5.48xlarge", 98.32)
        hop.on_demand("us-west-2", "p5.48xlarge", 55.04)
        hop.on_demand("ap-south-1", "p5.48xlarge", 70.0)
        hop.on_demand("us-west-2", "g6.xlarge", 0.8)  # another type: not this up's
        by_offerings = fab_through(hop, server, monkeypatch, env, "cluster.up", "--name", "bp", "--gpus", "H100:8",
                                   "--ssh-cidr", CIDR, "--dry-run")
        hop.answered.clear()
        planned = fab_through(hop, server, monkeypatch, env, "cluster.up", "--name", "bp", "--gpus", "H100:8",
                              "--by-price", "--ssh-cidr", CIDR, "--dry-run")
        asked = [region for action, region in hop.answered if action == "GetProducts"]
    assert by_offerings.returncode == 0, by_offerings.stdout + by_offerings.stderr
    # with no --by-price, the offerings' own prices (the Price List of every region, read with them) order them
    assert ("aws: no --region named: every region that offers p5.48xlarge to this account, the cheapest first, "
            f"{len(offered)} (") in by_offerings.stdout, by_offerings.stdout
    assert "prices: AWS's Price List, on demand" in by_offerings.stdout
    assert [line.strip() for line in by_offerings.stdout.splitlines() if line.startswith("  ")][:3] == [
        "1. aws us-west-2 p5.48xlarge on-demand ($55.04/h)", "2. aws ap-south-1 p5.48xlarge on-demand ($70/h)",
        "3. aws us-east-1 p5.48xlarge on-demand ($98.32/h)"], by_offerings.stdout
    assert planned.returncode == 0, planned.stdout + planned.stderr
    listed = [line.strip() for line in planned.stdout.splitlines() if line.startswith("  ") and "p5.48xlarge" in line]
    assert listed[:3] == ["1. aws us-west-2 p5.48xlarge on-demand ($55.04/h)",
                          "2. aws ap-south-1 p5.48xlarge on-demand ($70/h)",
                          "3. aws us-east-1 p5.48xlarge on-demand ($98.32/h)"], planned.stdout
    rest = [line.split()[2] for line in listed[3:]]
    assert rest == sorted(set(offered) - {"us-west-2", "ap-south-1", "us-east-1"},
                          key=lambda region: (-len(offered[region]), region))
    assert all("$" not in line for line in listed[3:])
    assert asked == [""]  # one GetProducts for the type, every region's price at once


def test_with_no_region_named_the_cheapest_region_with_the_image_takes_the_cluster(env, ec2, image, server,
                                                                                  monkeypatch):
    """A real up with no region named: the regions go cheapest first (the Price List, from the hop); the two
    cheaper ones have no kiln image (an AMI lives in the region it was baked in), so each is passed over before
    anything is made there, not counted as a try, and the cluster comes up in us-east-1, where the image is."""
    from testbed.ec2_faults import Ec2Faults

    monkeypatch.delenv("AWS_DEFAULT_REGION")
    with Ec2Faults(server) as hop:
        hop.on_demand("us-west-2", "p5.48xlarge", 55.04)
        hop.on_demand("ap-south-1", "p5.48xlarge", 70.0)
        hop.on_demand("us-east-1", "p5.48xlarge", 98.32)
        made = fab_through(hop, server, monkeypatch, env, "cluster.up", "--name", "cheap", "--gpus", "H100:8",
                           "--ssh-cidr", CIDR, "--ssh-wait", "0", "--max-attempts", "1")
        launched = [region for region, _ in hop.launches]
    try:
        assert made.returncode == 0, made.stdout + made.stderr
        for region in ("us-west-2", "ap-south-1"):
            assert (f"up: aws {region} p5.48xlarge on-demand: no available AMI tagged kiln:profile=gpu in {region}: "
                    "bake one, or give --ami; nothing was made") in made.stdout, made.stdout
        assert "up: trying aws us-east-1 p5.48xlarge on-demand (3 of " in made.stdout
        assert launched == ["us-east-1"]  # RunInstances nowhere else
        assert state.load_cluster("cheap").region == "us-east-1"
        record = json.loads((env / "kiln" / "clusters" / "cheap" / "capacity.json").read_text())
        assert [(t["place"], t["code"]) for t in record["tried"]] == [("us-west-2", "NoImageHere"),
                                                                      ("ap-south-1", "NoImageHere")]
    finally:
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")  # the fixtures' teardown looks there
        aws.down("cheap", region="us-east-1")
    assert leftovers(ec2) == []

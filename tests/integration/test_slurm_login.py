"""`kiln queue attach` and `kiln submit` against a Slurm cluster kiln did not make, reached through its login node,
as a user who is not root, through the CLI.

The cluster is a site's, set up here by hand as an administrator would (not by kiln's queue code): two local nodes
(network namespaces, each with its own sshd and host keys), Debian's munged on each with a key made here,
slurmctld on the first (the login node) and slurmd on both, from a slurm.conf written here, that the user's
login profile names (as a site's profile.d does). The user, `kilnjob`, has a home that every node sees (this
machine's /home, as a cluster's shared home) and logs in with a key of its own; kiln pins the login node's host
keys on the first contact and checks them on every later call."""

from __future__ import annotations

import base64
import json
import os
import pwd
import secrets
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from conftest import KILN, can_make_namespaces, local_cluster_command, needs_slurm

CLUSTER = "ksl"  # the local cluster that stands for the site's machines
NAME = "site"  # what kiln calls the attached queue
USER = "kilnjob"
SITE = Path("/srv/kiln-test-slurm") / CLUSTER  # the site's Slurm configuration, readable by every user
pytestmark = [
    pytest.mark.integration, pytest.mark.timeout(600),
    needs_slurm(),
    pytest.mark.in_written_order("attach first, forget last"),
]
PROGRAM = """\
import getpass, json, os, socket, sys
with open(os.path.join(os.environ["KILN_OUTPUT_DIR"], "who.json"), "w") as out:
    json.dump({"user": getpass.getuser(), "host": socket.gethostname(), "rank": os.environ["KILN_NODE_RANK"],
               "nodes": os.environ["KILN_NUM_NODES"], "argv": sys.argv[1:], "cwd": os.getcwd()}, out)
print("hello from", socket.gethostname(), "as", getpass.getuser())
"""


def slurm_conf(nodes: list[dict]) -> str:
    """A site's own slurm.conf: every node up from the start, the daemons' files on each node's own disk (each
    slurmd's spool, where its jobs' scripts are, in a folder of its own that users can reach)."""
    first = nodes[0]
    lines = [f"ClusterName={CLUSTER}", f"SlurmctldHost={first['name']}({first['ip']})", "SlurmUser=root",
             "AuthType=auth/munge", "CredType=cred/munge", "StateSaveLocation=/root/kiln/slurmctld",
             "SlurmctldPidFile=/root/kiln/slurmctld.pid", "SlurmctldLogFile=/root/kiln/slurmctld.log",
             f"SlurmdSpoolDir={SITE}/spool/%n", "SlurmdPidFile=/root/kiln/slurmd.pid",
             "SlurmdLogFile=/root/kiln/slurmd.log", "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
             "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "MpiDefault=none", "ReturnToService=2",
             "SlurmdTimeout=60"]
    lines += [f"NodeName={node['name']} NodeAddr={node['ip']} CPUs=1 State=UNKNOWN" for node in nodes]
    lines.append(f"PartitionName=batch Nodes={','.join(node['name'] for node in nodes)} Default=YES "
                 "MaxTime=INFINITE State=UP")
    lines.append("PartitionName=small Nodes=" + nodes[-1]["name"] + " MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def node_script(conf: Path, controller: bool) -> str:
    """What the administrator runs on a node as root: its munged with the site's key (stdin, base64), slurmctld on
    the login node, slurmd."""
    munge = ("runuser -u munge -- munged --key-file=/run/munge/site.key --socket=/run/munge/munge.socket.2 "
             "--pid-file=/run/munge/munged.pid --log-file=/run/munge/munged.log --seed-file=/run/munge/munged.seed")
    return "\n".join([
        "set -e",
        "install -d -o munge -g munge -m 755 /run/munge",
        "(umask 077; base64 -d > /run/munge/site.key)",
        "chown munge:munge /run/munge/site.key && chmod 400 /run/munge/site.key",
        f"{munge} </dev/null >/dev/null 2>&1",
        f"mkdir -p /root/kiln/slurmctld {SITE}/spool/$(hostname)",
        *([f"slurmctld -f {conf} </dev/null >/dev/null 2>&1"] if controller else []),
        f"slurmd -f {conf} </dev/null >/dev/null 2>&1",
    ]) + "\n"


class Site:
    def __init__(self, state: Path, nodes: list[dict], home: Path, key: Path, runs: Path):
        self.state, self.nodes, self.key = state, nodes, key
        self.login = f"{USER}@{nodes[0]['ip']}"
        self.env = {**os.environ, "KILN_HOME": str(home), "KILN_RUNS": str(runs), "HOME": str(home)}

    def as_root(self, node: dict, script: str, stdin: bytes = b"") -> subprocess.CompletedProcess:
        return subprocess.run(["ssh", "-F", str(self.state / "ssh_config"), node["name"], script], input=stdin,
                              capture_output=True, timeout=120)

    def kiln(self, *args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([str(KILN), "-i", str(self.key), *args], cwd=cwd or self.state, env=self.env,
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def sinfo(self) -> str:
        done = self.as_root(self.nodes[0], f"SLURM_CONF={SITE}/slurm.conf sinfo --noheader --format='%D %t'")
        return done.stdout.decode().strip()


def make_user(key: Path) -> Path:
    """The site's user: a home of its own that every node sees, a login key, and a profile naming Slurm's
    configuration; no password, and not a locked account (sshd refuses those without PAM)."""
    try:
        pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", USER], check=True, timeout=60)
    subprocess.run(["usermod", "-p", "*", USER], check=True, timeout=60)
    home = Path(pwd.getpwnam(USER).pw_dir)
    ssh = home / ".ssh"
    ssh.mkdir(mode=0o700, exist_ok=True)
    (ssh / "authorized_keys").write_text(key.with_suffix(".pub").read_text())
    profile = home / ".profile"
    text = profile.read_text() if profile.is_file() else ""
    line = f"export SLURM_CONF={SITE}/slurm.conf\n"
    if line not in text:
        profile.write_text(text + line)
    shutil.rmtree(home / "kiln-jobs", ignore_errors=True)
    subprocess.run(["chown", "-R", f"{USER}:{USER}", str(home)], check=True, timeout=60)
    (ssh / "authorized_keys").chmod(0o600)
    return home


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    reason = can_make_namespaces()
    if reason:
        pytest.skip(reason)
    tmp = tmp_path_factory.mktemp("site")
    key = tmp / "user_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True, timeout=30)
    local_cluster_command("down", "--name", CLUSTER)
    try:
        up = local_cluster_command("up", "2", "--name", CLUSTER)
        assert up.returncode == 0, up.stdout + up.stderr
        state = Path("/run/kiln/local") / CLUSTER
        nodes = json.loads((state / "nodes.json").read_text())
        nodes = nodes["nodes"] if isinstance(nodes, dict) else nodes
        make_user(key)
        SITE.mkdir(parents=True, exist_ok=True)
        SITE.chmod(0o755)
        (SITE / "slurm.conf").write_text(slurm_conf(nodes))
        made = Site(state, nodes, tmp / "kiln-home", key, tmp / "runs")
        munge_key = base64.b64encode(secrets.token_bytes(1024))
        for index, node in enumerate(nodes):
            done = made.as_root(node, node_script(SITE / "slurm.conf", controller=index == 0), munge_key)
            assert done.returncode == 0, done.stderr.decode()
        deadline = time.monotonic() + 90
        while made.sinfo() != "2 idle":
            assert time.monotonic() < deadline, f"the site's Slurm did not come up: {made.sinfo()!r}"
            time.sleep(1)
        yield made
    finally:
        local_cluster_command("down", "--name", CLUSTER)  # the nodes' daemons go with them
        shutil.rmtree(SITE, ignore_errors=True)


def project(tmp_path: Path) -> Path:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "who.py").write_text(PROGRAM)
    (folder / ".venv").mkdir()  # left out, as kiln sync leaves it out
    (folder / ".venv" / "big").write_text("x")
    (folder / ".gitignore").write_text("data/\n")  # left out as kiln sync leaves it out
    (folder / "data").mkdir()
    (folder / "data" / "raw.bin").write_text("x")
    return folder


def test_an_unknown_login_node_key_is_refused_without_leave_to_trust_it(site):
    done = site.kiln("queue", "attach", NAME, "--login", site.login)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"kiln: --login {site.login}: host key unknown: pin it (ssh-keyscan after checking it) or pass "
        "--accept-new-host-keys (kiln trusts the keys in your known_hosts; --accept-new-host-keys trusts the one it "
        "sees now)"), done.stderr
    assert not (Path(site.env["KILN_HOME"]) / "clusters" / NAME / "login.json").exists()


def test_attach_pins_the_login_nodes_host_keys_and_reads_the_partitions(site, tmp_path):
    done = site.kiln("queue", "attach", NAME, "--login", site.login, "--accept-new-host-keys")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"through {site.login} as {USER}" in done.stdout and "partitions batch (2 nodes), small (1 node)" in \
        done.stdout, done.stdout
    pinned = (Path(site.env["KILN_HOME"]) / "clusters" / NAME / "known_hosts").read_text().splitlines()
    first = site.nodes[0]
    node_keys = site.as_root(first, "cat /etc/ssh/ssh_host_*_key.pub").stdout.decode().splitlines()
    assert sorted(pinned) == sorted(f"{first['ip']} {' '.join(line.split()[:2])}" for line in node_keys)
    code = project(tmp_path)
    planned = site.kiln("submit", NAME, "--nodes", "2", "--dry-run", "--", "python", "who.py", cwd=code)
    assert planned.returncode == 0, planned.stderr
    assert "#SBATCH --partition=batch\n#SBATCH --nodes=2\n" in planned.stdout, planned.stdout
    assert f"the job's folder would be {pwd.getpwnam(USER).pw_dir}/kiln-jobs/" in planned.stdout, planned.stdout
    assert "python3 who.py" in planned.stdout, planned.stdout
    assert not Path(site.env["KILN_RUNS"]).exists() and not (Path(pwd.getpwnam(USER).pw_dir) / "kiln-jobs").exists()
    again = site.kiln("queue", "attach", NAME, "--login", site.login, "--accept-new-host-keys")
    assert again.returncode == 2 and "already known here" in again.stderr, again.stderr
    for argv in (("queue", "up", NAME), ("up", NAME, "--provider", "local", "--dry-run")):
        taken = site.kiln(*argv)
        assert taken.returncode == 2 and taken.stderr.strip() == (
            f"kiln: cluster {NAME} is a Slurm cluster reached through {site.login} (kiln down {NAME} forgets it); "
            "give another name"), taken.stderr


def test_a_job_runs_on_both_nodes_as_the_user_and_its_folder_comes_back(site, tmp_path):
    code = project(tmp_path)
    done = site.kiln("submit", NAME, "--nodes", "2", "--wait", "--", "python", "who.py", "one", cwd=code)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    job, run_id = done.stdout.split()[1], done.stdout.split("(run ")[1].split(")")[0]
    assert done.stdout.count("hello from node") == 2 and f"as {USER}" in done.stdout, done.stdout
    remote = Path(pwd.getpwnam(USER).pw_dir) / "kiln-jobs" / run_id
    assert not (remote / "code" / ".venv").exists() and (remote / "code" / "who.py").is_file()
    assert not (remote / "code" / "data").exists()
    assert remote.stat().st_uid == pwd.getpwnam(USER).pw_uid  # made by the user, not by root

    fetched = site.kiln("queue", "fetch", NAME, "--job", job)
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    local = Path(site.env["KILN_RUNS"]) / run_id
    results = [json.loads(path.read_text()) for path in sorted(local.glob("output/node-*/who.json"))]
    assert [(r["user"], r["rank"], r["nodes"], r["argv"]) for r in results] == [(USER, "0", "2", ["one"]),
                                                                                (USER, "1", "2", ["one"])], results
    assert sorted(r["host"] for r in results) == sorted(node["name"] for node in site.nodes)
    assert all(r["cwd"] == f"{remote}/code" for r in results), results
    assert not (local / "code").exists()  # the code is not fetched back
    logs = site.kiln("queue", "logs", NAME, "--job", job)
    assert logs.returncode == 0 and logs.stdout == (local / f"slurm-{job}.out").read_text(), logs.stdout


def test_a_job_of_another_partition_status_and_cancel(site, tmp_path):
    code = project(tmp_path)
    (code / "sleep.py").write_text("import time\nprint('sleeping', flush=True)\ntime.sleep(600)\n")
    done = site.kiln("submit", NAME, "--partition", "small", "--", "python", "sleep.py", cwd=code)
    assert done.returncode == 0, done.stdout + done.stderr
    job = done.stdout.split()[1]
    deadline = time.monotonic() + 120
    while "sleeping" not in site.kiln("queue", "logs", NAME, "--job", job).stdout:
        assert time.monotonic() < deadline, site.kiln("queue", "status", NAME).stdout
        time.sleep(1)
    status = site.kiln("queue", "status", NAME)
    assert status.returncode == 0 and f"{job} " in status.stdout and "RUNNING 1 node2" in status.stdout, status.stdout
    assert site.kiln("queue", "cancel", NAME, "--job", job).stdout == f"job {job} of queue {NAME} cancelled\n"
    deadline = time.monotonic() + 60
    while (said := site.kiln("queue", "cancel", NAME, "--job", job).stdout) != \
            f"job {job} of queue {NAME} had already ended\n":
        assert time.monotonic() < deadline, said
        time.sleep(1)
    refused = site.kiln("submit", NAME, "--partition", "small", "--nodes", "2", "--", "python", "who.py", cwd=code)
    assert refused.returncode == 2 and refused.stderr.strip() == (
        f"kiln: --nodes 2: partition small of queue {NAME} runs 1 to 1"), refused.stderr
    refused = site.kiln("submit", NAME, "--image", "registry:5000/team/image:1", "--", "python", "who.py", cwd=code)
    assert refused.returncode == 2 and refused.stderr.strip().startswith(
        f"kiln: kiln submit {NAME} --image: a cluster reached through its login node runs containers through its "
        "site's own runtime"), refused.stderr


def test_a_login_node_whose_host_key_changed_is_refused(site, tmp_path):
    pinned = Path(site.env["KILN_HOME"]) / "clusters" / NAME / "known_hosts"
    kept = pinned.read_text()
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True, timeout=30)
    pinned.write_text(f"{site.nodes[0]['ip']} {' '.join(other.with_suffix('.pub').read_text().split()[:2])}\n")
    try:
        done = site.kiln("queue", "status", NAME)
        assert done.returncode == 1 and done.stderr.strip() == (
            f"kiln: queue {NAME}: login node {site.login}: host key verification failed: the node's key is not the "
            "pinned one"), done.stderr
    finally:
        pinned.write_text(kept)


def test_down_forgets_the_cluster_and_leaves_it_running(site):
    done = site.kiln("down", NAME)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == (f"queue {NAME}: forgotten here; the Slurm cluster of {site.login} and its jobs are left "
                           "as they are\n")
    assert not (Path(site.env["KILN_HOME"]) / "clusters" / NAME).exists()
    assert site.sinfo() == "2 idle"
    gone = site.kiln("queue", "status", NAME)
    assert gone.returncode == 2 and gone.stderr.startswith(f"kiln: cluster {NAME} has no queue"), gone.stderr


def test_bad_input_is_one_line_naming_it(tmp_path):
    for argv, named in ((("queue", "attach", NAME), "--login"),
                        (("queue", "attach", NAME, "--login", "ada@"), "--login"),
                        (("queue", "attach", "Bad_Name", "--login", "ada@login1"), "Bad_Name"),
                        (("queue", "attach", NAME, "--login", "ada@login1", "--folder", "my jobs"), "--folder"),
                        (("queue", "fetch", NAME, "--job", "3"), f"cluster {NAME} has no queue"),
                        (("queue", "env", NAME), f"cluster {NAME} has no queue"),
                        (("submit", NAME, "--", "python", "x.py"), "kiln queue attach")):
        done = subprocess.run([str(KILN), *argv], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "KILN_HOME": str(tmp_path)}, stdin=subprocess.DEVNULL)
        assert done.returncode == 2 and named in done.stderr and "Traceback" not in done.stderr, (argv, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr

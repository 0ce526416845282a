"""A queue's controller machine on a cloud (bootstrap/controller.py): what it must have, what kiln ships there, the
cluster file it keeps, and slurmctld's programs' entry (bootstrap/programs.py)."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bootstrap import controller, state
from bootstrap.controller import (
    ControllerError,
    closure,
    compiled,
    controller_record,
    marker_environment,
    parse_probe,
    required,
    settings_of,
    shipped,
    stage,
    with_profile_line,
)
from bootstrap.errors import UsageError
from bootstrap.hosts import Host

LINUX_311 = marker_environment("3.11.2", "x86_64")
PROBED = "python=3.11.2\nmachine=x86_64\nhostname=ip-10-0-0-5\nslurm=slurm-wlm 22.05.8\nhome=/home/ubuntu/\n"


def test_the_probe_says_the_controllers_python_machine_name_and_slurm():
    probed = parse_probe(PROBED, "203.0.113.9")
    assert (probed.python, probed.machine, probed.hostname, probed.slurm, probed.home) == (
        "3.11.2", "x86_64", "ip-10-0-0-5", "22.05.8", "/home/ubuntu")


@pytest.mark.parametrize(("said", "named"), [
    ("python=3.9.2\nmachine=x86_64\n", "python3 of 3.11 or later (3.9.2)"),
    ("machine=x86_64\n", "python3 of 3.11 or later (none)"),
    (PROBED + "missing=slurmctld\nmissing=munged\n", "lacks slurmctld, munged: is it a kiln image"),
    (PROBED.replace("home=/home/ubuntu/", "home=/home/a b"), "home /home/a b cannot hold the jobs' folders"),
])
def test_a_controller_without_what_kiln_runs_there_is_refused_naming_it(said, named):
    with pytest.raises(ControllerError, match="203.0.113.9") as refused:
        parse_probe(said, "203.0.113.9")
    assert named in str(refused.value)


def test_requirements_count_where_their_markers_hold_on_the_controller_and_no_extra():
    lines = ["botocore (<1.45.0,>=1.44.5)", "urllib3<1.27; python_version < '3.10'",
             "urllib3!=2.2.0,<3; python_version >= '3.10'", "awscrt ==0.38.0 ; extra == 'crt'",
             "colorama; sys_platform == 'win32'", "typing_extensions>=4; python_version < '3.11'"]
    assert required(lines, LINUX_311) == ["botocore", "urllib3"]
    assert required(lines, marker_environment("3.9.18", "x86_64")) == ["botocore", "urllib3", "typing-extensions"]
    assert required(None, LINUX_311) == []


def test_the_closure_follows_each_requirement_once_in_the_order_met():
    graph = {"boto3": ["botocore (>=1)", "jmespath", "s3transfer"], "botocore": ["jmespath", "python-dateutil"],
             "s3transfer": ["botocore"], "python-dateutil": ["six >=1.5"], "jmespath": None, "six": None}
    assert closure(["boto3", "Rich"], lambda name: graph.get(name, []), LINUX_311) == [
        "boto3", "rich", "botocore", "jmespath", "s3transfer", "python-dateutil", "six"]


def test_parts_built_for_one_machine_are_found_and_bytecode_and_scripts_are_not_shipped():
    files = ["pkg/__init__.py", "pkg/_speed.cpython-311-x86_64-linux-gnu.so", "pkg.libs/libz.so.1.2",
             "pkg/__pycache__/x.cpython-311.pyc", "../../bin/tool", "pkg-1.0.dist-info/METADATA"]
    assert compiled(files) == ["pkg/_speed.cpython-311-x86_64-linux-gnu.so", "pkg.libs/libz.so.1.2"]
    assert shipped(files) == ["pkg/__init__.py", "pkg/_speed.cpython-311-x86_64-linux-gnu.so",
                              "pkg.libs/libz.so.1.2", "pkg-1.0.dist-info/METADATA"]


def test_the_controller_keeps_the_cluster_file_with_the_key_in_its_own_folder_and_no_operator_settings():
    record = state.ClusterRecord("q", (Host("10.0.0.7", user="ubuntu"),), "python3",
                                 state.SshSettings("/home/me/.ssh/config", "/home/me/.kiln/clusters/q/id_ed25519", 20),
                                 region="us-east-1", provider="aws")
    kept = controller_record(record, "/root/kiln/controller/home")
    assert kept.ssh == state.SshSettings(None, "/root/kiln/controller/home/clusters/q/id_ed25519", 20)
    assert (kept.hosts, kept.region, kept.provider) == (record.hosts, "us-east-1", "aws")


def test_only_where_each_clouds_api_is_goes_to_the_controller_never_a_credential():
    environ = {"KILN_AWS_ENDPOINT_URL": "http://10.1.0.1:4566", "AWS_ACCESS_KEY_ID": "AKIA...",
               "AWS_SECRET_ACCESS_KEY": "x", "AWS_SESSION_TOKEN": "y", "KILN_HOME": "/home/me/.kiln"}
    assert settings_of(environ) == {"KILN_AWS_ENDPOINT_URL": "http://10.1.0.1:4566"}
    assert settings_of({"KILN_AWS_ENDPOINT_URL": ""}) == {}


def test_the_login_profile_points_slurm_at_the_queue_once_keeping_the_users_lines():
    once = with_profile_line("# ~/.profile\nPATH=$HOME/bin:$PATH\n", "q", "/run/kiln/queues/q/slurm.conf")
    assert once == ("# ~/.profile\nPATH=$HOME/bin:$PATH\n"
                    "export SLURM_CONF=/run/kiln/queues/q/slurm.conf  # kiln queue q\n")
    assert with_profile_line(once, "q", "/run/kiln/queues/q/slurm.conf") == once
    other = with_profile_line(once, "r", "/run/kiln/queues/r/slurm.conf")
    assert other.count("SLURM_CONF") == 2 and other.endswith("# kiln queue r\n")


def test_kiln_ships_itself_and_the_sdk_pure_and_whole_and_they_import_there(tmp_path):
    """What `stage` copies runs on a bare Python: kiln's programs, boto3 and what it requires (nothing of this
    venv's site folder on the path, no bytecode)."""
    names = stage("aws", marker_environment("3.11.2", "x86_64"), tmp_path)
    assert names[:2] == ["boto3", "rich"] and {"botocore", "s3transfer", "jmespath", "urllib3"} <= set(names)
    assert "packaging" not in names and not list(tmp_path.rglob("*.pyc"))
    assert (tmp_path / "bootstrap" / "programs.py").is_file() and (tmp_path / "kiln" / "shield.py").is_file()
    assert (tmp_path / f"boto3-{importlib.metadata.version('boto3')}.dist-info" / "METADATA").is_file()
    script = ("import sys, boto3, botocore.session, bootstrap.programs, bootstrap.providers.aws.cloud\n"
              "assert all(not p.endswith('site-packages') for p in sys.path), sys.path\n"
              "print(boto3.__file__)")
    done = subprocess.run([sys.executable, "-I", "-S", "-c", f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n"
                           + script], capture_output=True, text=True, timeout=60, cwd="/")
    assert done.returncode == 0 and done.stdout.startswith(str(tmp_path)), done.stderr


def test_a_cloud_without_a_controller_is_refused_by_name(tmp_path):
    with pytest.raises(UsageError, match="--provider gcp: a queue's controller machine runs on aws"):
        stage("gcp", marker_environment("3.11.2", "x86_64"), tmp_path)


def test_the_controllers_verbs_are_one_line_each_and_bad_input_exits_2(capsys):
    assert controller.main(["start"]) == 2
    assert "usage: python3 -m bootstrap.controller VERB CLUSTER" in capsys.readouterr().err


def test_slurmctlds_programs_start_without_fabric_and_say_a_missing_queue_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-c", "import sys, runpy; sys.argv = ['programs', 'resume', 'nq', 'x']\n"
                           "try:\n runpy.run_module('bootstrap.programs', run_name='__main__')\n"
                           "except SystemExit as end:\n"
                           " print(sorted(m for m in sys.modules if m.split('.')[0] in ('fabric', 'invoke')))\n"
                           " raise"], capture_output=True, text=True, timeout=60,
                          env={"KILN_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}, cwd=Path(__file__).parents[2])
    assert done.returncode == 2 and done.stdout.strip() == "[]", done.stdout + done.stderr
    assert done.stderr.strip() == "kiln: cluster nq has no queue (kiln queue up nq makes one)"


def test_the_ec2_metadata_stand_in_gives_the_instance_profiles_credentials_as_botocore_reads_them(tmp_path):
    """botocore's own metadata fetcher (IMDSv2) reads the role's credentials; without a profile it finds none."""
    import botocore.utils

    from localcloud.imds import Imds

    held = tmp_path / "iam.json"
    with Imds("i-0kiln", iam_file=held) as served:
        fetcher = botocore.utils.InstanceMetadataFetcher(timeout=5, num_attempts=1, base_url=served.endpoint)
        assert fetcher.retrieve_iam_role_credentials() == {}
        held.write_text(json.dumps({"role": "kiln-q-us-east-1-controller", "AccessKeyId": "ASIAKILN",
                                    "SecretAccessKey": "s", "Token": "t", "Expiration": "2099-01-01T00:00:00Z",
                                    "issued": "2026-12-01T00:00:00Z"}))
        got = fetcher.retrieve_iam_role_credentials()
        assert (got["role_name"], got["access_key"], got["token"]) == ("kiln-q-us-east-1-controller", "ASIAKILN", "t")
        assert ("GET", "/latest/meta-data/iam/security-credentials/", 200) in served.requests

"""The spot interruption watcher (bootstrap/shim/interruption.py) against the metadata stand-in (EC2's IMDSv2 and
GCE's metadata server) over real HTTP."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from bootstrap.shim import interruption
from bootstrap.shim.interruption import GceMetadata, Metadata, MetadataError, parse_notice
from localcloud.imds import Imds

EC2 = {"source": "ec2", "grace_s": 90}


@pytest.fixture
def imds():
    with Imds("i-0kiln") as served:
        yield served


def test_every_read_carries_a_session_token(imds):
    metadata = Metadata(imds.endpoint)
    assert metadata.get("latest/meta-data/instance-id") == "i-0kiln"
    assert metadata.get("latest/meta-data/instance-id") == "i-0kiln"
    assert [r[:2] for r in imds.requests] == [("PUT", "/latest/api/token"),
                                              ("GET", "/latest/meta-data/instance-id"),
                                              ("GET", "/latest/meta-data/instance-id")]


def test_a_plain_get_is_refused_as_imdsv2_requires(imds):
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{imds.endpoint}/latest/meta-data/instance-id", timeout=2)
    assert refused.value.code == 401


def test_a_refused_token_is_fetched_again_once(imds):
    metadata = Metadata(imds.endpoint)
    metadata.get("latest/meta-data/instance-id")
    imds.expire_tokens()
    assert metadata.get("latest/meta-data/instance-id") == "i-0kiln"
    assert [r for r in imds.requests if r[0] == "PUT"] == [("PUT", "/latest/api/token", 200)] * 2


def test_no_notice_until_one_is_posted(imds):
    metadata = Metadata(imds.endpoint)
    assert parse_notice(metadata.get(interruption.NOTICE_PATH)) is None
    posted = imds.interrupt("terminate")
    assert parse_notice(metadata.get(interruption.NOTICE_PATH)) == posted


def test_the_watcher_returns_when_the_notice_comes(imds):
    metadata = Metadata(imds.endpoint)
    assert interruption.wait_for_notice(metadata, 0.05, deadline=time.monotonic() + 0.3) is None
    imds.interrupt("stop")
    notice = interruption.wait_for_notice(metadata, 0.05, deadline=time.monotonic() + 5)
    assert notice["action"] == "stop" and notice["seen"] <= time.time()


def test_the_watcher_as_a_process(imds):
    script = interruption.__file__
    once = subprocess.run([sys.executable, script, "--endpoint", imds.endpoint, "--once"], capture_output=True,
                          text=True, timeout=30)
    assert (once.returncode, json.loads(once.stdout)) == (0, {"action": None})
    watcher = subprocess.Popen([sys.executable, script, "--endpoint", imds.endpoint, "--interval", "0.1"],
                               stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)
        assert watcher.poll() is None
        posted = imds.interrupt("terminate")
        out, _ = watcher.communicate(timeout=30)
    finally:
        watcher.kill()
    assert watcher.returncode == 0
    assert {k: v for k, v in json.loads(out).items() if k != "seen"} == {**posted, **EC2}


def test_an_unreachable_service_is_named():
    metadata = Metadata("http://127.0.0.1:9", timeout=0.5)
    with pytest.raises(MetadataError, match="http://127.0.0.1:9 is not answering"):
        metadata.get(interruption.NOTICE_PATH)
    once = subprocess.run([sys.executable, interruption.__file__, "--endpoint", "http://127.0.0.1:9", "--once"],
                          capture_output=True, text=True, timeout=30)
    assert once.returncode == 1 and "is not answering" in once.stderr


def test_an_unknown_action_is_an_error():
    with pytest.raises(MetadataError, match="unexpected instance-action"):
        parse_notice('{"action": "reboot"}')


def test_with_a_run_dir_the_notice_is_written_and_the_watcher_becomes_the_command(imds, tmp_path):
    done = tmp_path / "then"
    watcher = subprocess.Popen([sys.executable, interruption.__file__, "--endpoint", imds.endpoint, "--interval",
                                "0.1", "--run-dir", str(tmp_path), "--", "sh", "-c", f"echo $$ $0 > {done}"],
                               stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)
        assert watcher.poll() is None and not (tmp_path / "notice.json").exists()
        posted = imds.interrupt("terminate")
        watcher.communicate(timeout=30)
    finally:
        watcher.kill()
    assert watcher.returncode == 0
    written = json.loads((tmp_path / "notice.json").read_text())
    assert {k: v for k, v in written.items() if k != "seen"} == {**posted, **EC2}
    # exec'd: the command runs as the watcher's own process, with EC2's grace as its last argument
    assert done.read_text().split() == [str(watcher.pid), "90"]


def test_where_no_metadata_service_answers_the_run_watcher_stops_at_once(tmp_path):
    quiet = subprocess.run([sys.executable, interruption.__file__, "--endpoint", "http://127.0.0.1:9",
                            "--run-dir", str(tmp_path), "--", "touch", str(tmp_path / "then")],
                           capture_output=True, text=True, timeout=30)
    assert quiet.returncode == 0 and "not watching" in quiet.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_run_watcher_gives_up_after_its_timeout(imds, tmp_path):
    gave_up = subprocess.run([sys.executable, interruption.__file__, "--endpoint", imds.endpoint, "--interval",
                              "0.05", "--timeout", "0.3", "--run-dir", str(tmp_path), "--", "false"],
                             capture_output=True, text=True, timeout=30)
    assert (gave_up.returncode, gave_up.stdout.strip()) == (0, "null")
    assert list(tmp_path.iterdir()) == []


def test_the_run_watcher_ends_once_the_nodes_tasks_have_exited(imds, tmp_path):
    watcher = subprocess.Popen([sys.executable, interruption.__file__, "--endpoint", imds.endpoint, "--interval",
                                "0.05", "--timeout", "600", "--run-dir", str(tmp_path), "--until-exited",
                                "worker-0,ps-0", "--", "false"], stdout=subprocess.PIPE, text=True)
    try:
        (tmp_path / "worker-0.exit").write_text("0")
        time.sleep(0.5)
        assert watcher.poll() is None  # ps-0 still runs
        (tmp_path / "ps-0.exit").write_text("143")
        out, _ = watcher.communicate(timeout=30)
    finally:
        watcher.kill()
    assert (watcher.returncode, out.strip()) == (0, "null")
    assert not (tmp_path / "notice.json").exists()


def test_gce_reads_are_flavored_and_a_plain_or_forwarded_one_is_refused(imds):
    metadata = GceMetadata(imds.endpoint)
    assert metadata.get("computeMetadata/v1/instance/name") == "i-0kiln"
    for headers in ({}, {"Metadata-Flavor": "Google", "X-Forwarded-For": "10.0.0.1"}):
        request = urllib.request.Request(f"{imds.endpoint}/computeMetadata/v1/instance/preempted", headers=headers)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=2)
        assert refused.value.code == 403


def test_a_gce_preemption_is_a_notice_with_gces_shorter_grace(imds):
    metadata = GceMetadata(imds.endpoint)
    assert metadata.look() is None
    imds.preempt()
    notice = interruption.wait_for_notice(metadata, 0.05, deadline=time.monotonic() + 5)
    assert notice["action"] == "preempt" and notice["source"] == "gce"
    assert notice["grace_s"] == 20 < interruption.SOURCES["gce"][0] == 30


def test_an_ec2_service_is_not_taken_for_gces():
    """Where EC2's service alone answers (GCE's and Azure's paths are not there), a watcher of any source keeps
    EC2's, and one told to watch GCE's finds nothing to watch."""
    with Imds("i-0kiln") as both:
        ec2_only = both._answer  # the stand-in serves both: make it EC2's alone for this test

        def answer(method, path, headers):
            if path.startswith(("/computeMetadata/", "/metadata/")):
                return 404, "Not Found"
            return ec2_only(method, path, headers)

        both._answer = answer
        kept, why = interruption.answering(interruption.services("any", both.endpoint))
        assert [service.source for service in kept] == ["ec2"]
        assert [line.split(":")[0] for line in why] == ["gce", "azure"]
        gce = subprocess.run([sys.executable, interruption.__file__, "--source", "gce", "--endpoint", both.endpoint,
                              "--once"], capture_output=True, text=True, timeout=30)
    assert gce.returncode == 1 and "gce: GET /computeMetadata/v1/: HTTP 404" in gce.stderr, gce.stderr


def test_the_run_watcher_stops_the_run_within_gces_notice(imds, tmp_path):
    """A GCE preemption: the watcher writes the notice and becomes the stop command with GCE's grace."""
    done = tmp_path / "then"
    watcher = subprocess.Popen([sys.executable, interruption.__file__, "--source", "gce", "--endpoint",
                                imds.endpoint, "--interval", "0.1", "--run-dir", str(tmp_path), "--", "sh", "-c",
                                f"echo $0 > {done}"], stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)
        assert watcher.poll() is None
        imds.preempt()
        watcher.communicate(timeout=30)
    finally:
        watcher.kill()
    written = json.loads((tmp_path / "notice.json").read_text())
    assert (written["source"], written["action"]) == ("gce", "preempt")
    assert done.read_text().strip() == "20"


def test_azure_reads_carry_the_metadata_header_and_a_plain_one_is_refused(imds):
    metadata = interruption.AzureMetadata(imds.endpoint)
    metadata.probe()
    assert metadata.name == "i-0kiln" and metadata.look() is None
    request = urllib.request.Request(f"{imds.endpoint}/{interruption.AZURE_EVENTS}")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=2)
    assert refused.value.code == 400


def test_an_azure_preempt_event_naming_this_vm_is_a_notice_with_azures_grace(imds):
    metadata = interruption.AzureMetadata(imds.endpoint)
    metadata.probe()
    imds.evict()
    notice = interruption.wait_for_notice(metadata, 0.05, deadline=time.monotonic() + 5)
    assert (notice["action"], notice["source"], notice["grace_s"]) == ("preempt", "azure", 20)
    assert notice["time"].endswith("Z")
    metadata.name = "another-vm"  # an event for the other VMs of its set is not this one's
    assert metadata.look() is None


def test_a_watcher_of_any_source_finds_every_cloud_the_stand_in_plays(imds):
    kept, why = interruption.answering(interruption.services("any", imds.endpoint))
    assert [service.source for service in kept] == ["ec2", "gce", "azure"] and why == []

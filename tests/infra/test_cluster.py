"""What a node needs to train with the others: its name resolves to a routable address of its own
(Gloo binds to it), its clock is in sync, sshd listens. A captured image has no network identity."""

from __future__ import annotations

import pytest
from kiln_infra import run_checked

pytestmark = pytest.mark.cluster


@pytest.fixture(autouse=True)
def booted(captured):
    if captured:
        pytest.skip("a captured image has not booted: it has no name, clock or sockets to check")


def test_hostname_resolves_to_a_routable_address_of_this_host(host):
    name = run_checked(host, "hostname").stdout.strip()
    resolved = run_checked(host, f"getent ahostsv4 {name} | awk '{{print $1}}' | sort -u").stdout.split()
    assert resolved, f"{name} does not resolve"
    loopback = [a for a in resolved if a.startswith("127.")]
    assert not loopback, f"{name} resolves to loopback {loopback}: Gloo would bind there and peers cannot reach it"
    own = run_checked(host, "ip -o -4 addr show | awk '{print $4}' | cut -d/ -f1").stdout.split()
    assert set(resolved) & set(own), f"{name} resolves to {resolved}, none of them this host's ({own})"


def test_clock_is_synchronised(host):
    result = host.run("timedatectl show --property=NTPSynchronized --value")
    tracking = host.run("chronyc -n tracking")
    synced = result.stdout.strip() == "yes" or "Leap status     : Normal" in tracking.stdout
    assert synced, f"the clock is not in sync:\n{result.stdout}{result.stderr}\n{tracking.stdout}{tracking.stderr}"


def test_sshd_listens(host):
    assert host.socket("tcp://0.0.0.0:22").is_listening or host.socket("tcp://:::22").is_listening, (
        "sshd does not listen on port 22")

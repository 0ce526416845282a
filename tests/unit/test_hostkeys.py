"""kiln.hostkeys: the one reader of cloud-init's console keys and the one writer of known_hosts lines."""

from __future__ import annotations

import pytest

from kiln.hostkeys import console_host_keys, host_pattern, known_hosts_lines, public_key, without_hosts

ED = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB8i"
EC = "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTY="


def block(*keys: str) -> str:
    lines = "".join(f"{key} root@vm\n" for key in keys)
    return f"-----BEGIN SSH HOST KEY KEYS-----\n{lines}-----END SSH HOST KEY KEYS-----\n"


def test_console_keys_come_without_comments_from_the_last_complete_block():
    old = "ssh-ed25519 AAAAOLDKEYfromthefirstboot"
    console = f"[  1.0] boot\n{block(old)}[ 30.2] reboot\n{block(ED, EC)}ci-info: done\n"
    assert console_host_keys(console) == [ED, EC]


def test_a_block_still_being_printed_is_not_read():
    assert console_host_keys("boot\n-----BEGIN SSH HOST KEY KEYS-----\n" + ED + " root@vm\n") == []
    assert console_host_keys(block(ED) + "-----BEGIN SSH HOST KEY KEYS-----\nssh-rsa AAAA") == [ED]
    assert console_host_keys("") == []


def test_lines_of_other_kinds_inside_the_block_are_ignored():
    assert console_host_keys(block("ssh-dss AAAAB3NzaC1kc3M", ED)) == [ED]


def test_known_hosts_lines_pin_every_key_under_every_name_once():
    assert known_hosts_lines(["node1", "10.0.0.2", "node1"], [ED + " root@node1\n", EC]) == [
        f"node1,10.0.0.2 {ED}\n", f"node1,10.0.0.2 {EC}\n"]


def test_a_port_other_than_22_is_bracketed():
    assert host_pattern("127.0.0.1", 2222) == "[127.0.0.1]:2222"
    assert host_pattern("node1", 22) == host_pattern("node1") == "node1"
    assert known_hosts_lines(["127.0.0.1"], [ED], port=2222) == [f"[127.0.0.1]:2222 {ED}\n"]


def test_a_line_that_is_no_public_key_is_refused():
    with pytest.raises(ValueError, match="not an SSH public key"):
        public_key("hello world")


def test_host_keys_come_from_cloud_init_console_output():
    console = ("boot...\n-----BEGIN SSH HOST KEY KEYS-----\necdsa-sha2-nistp256 AAAAE2 root@ip-10-0-0-1\n"
               "ssh-ed25519 AAAAC3 root@ip-10-0-0-1\n-----END SSH HOST KEY KEYS-----\nlogin:")
    assert console_host_keys(console) == ["ecdsa-sha2-nistp256 AAAAE2", "ssh-ed25519 AAAAC3"]
    assert known_hosts_lines(["198.51.100.1"], ["ssh-ed25519 AAAAC3"]) == ["198.51.100.1 ssh-ed25519 AAAAC3\n"]
    assert console_host_keys("no keys here") == []


def test_host_keys_come_from_a_real_cloud_init_console():
    console = (
        "[   10.1] cloud-init[1017]: Cloud-init v. 23.4.4 running 'modules:final'\n"
        "<14>Jun  4 10:01:03 ec2: -----BEGIN SSH HOST KEY FINGERPRINTS-----\n"
        "<14>Jun  4 10:01:03 ec2: 256 SHA256:3Zk0mFq1J7u8x1sGQ2oR9ZrQk5c4w0Yw1vXh0r8l1aE root@ip-172-31-5-9 (ED25519)\n"
        "<14>Jun  4 10:01:03 ec2: -----END SSH HOST KEY FINGERPRINTS-----\n"
        "-----BEGIN SSH HOST KEY KEYS-----\r\n"
        "ecdsa-sha2-nistp256 AAAAE2VjZHNh root@ip-172-31-5-9\r\n"
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5 root@ip-172-31-5-9\r\n"
        "ssh-rsa AAAAB3NzaC1yc2E root@ip-172-31-5-9\r\n"
        "-----END SSH HOST KEY KEYS-----\r\n"
        "ip-172-31-5-9 login: ")
    assert console_host_keys(console) == ["ecdsa-sha2-nistp256 AAAAE2VjZHNh",
                                               "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5", "ssh-rsa AAAAB3NzaC1yc2E"]


def test_a_replaced_machine_loses_its_old_lines_and_only_those():
    text = ("# pinned by kiln\n"
            "node1,10.9.0.2 ssh-ed25519 AAAA1\n"
            "node2,10.9.0.3 ssh-ed25519 AAAA2\n"
            "node2,10.9.0.3 ecdsa-sha2-nistp256 BBBB2\n"
            "node20,10.9.0.21 ssh-ed25519 AAAA20\n"
            "[10.9.0.3]:2222 ssh-ed25519 CCCC\n")
    kept = without_hosts(text, ["node2", "10.9.0.3"])
    assert kept == ("# pinned by kiln\nnode1,10.9.0.2 ssh-ed25519 AAAA1\n"
                    "node20,10.9.0.21 ssh-ed25519 AAAA20\n[10.9.0.3]:2222 ssh-ed25519 CCCC\n")
    assert without_hosts(text, ["10.9.0.3"], port=2222).count("CCCC") == 0
    assert without_hosts(text, ["node9"]) == text

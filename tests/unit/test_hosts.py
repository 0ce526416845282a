import pytest

from bootstrap.errors import HostListError
from bootstrap.hosts import Host, format_hostfile, parse_host_list, parse_hostfile, with_slots


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("h1", [Host("h1")]),
        ("h1,h2,h3", [Host("h1"), Host("h2"), Host("h3")]),
        (" h1 , h2 ", [Host("h1"), Host("h2")]),
        ("ubuntu@h1:2222", [Host("h1", 2222, "ubuntu")]),
        ("10.0.0.5:22,10.0.0.6", [Host("10.0.0.5", 22), Host("10.0.0.6")]),
        ("[fe80::1]:2200,[::1]", [Host("fe80::1", 2200), Host("::1")]),
        ("root@[2001:db8::7]:22", [Host("2001:db8::7", 22, "root")]),
        ("node1.example.com", [Host("node1.example.com")]),
        ("h1:22,h1:2222", [Host("h1", 22), Host("h1", 2222)]),
    ],
)
def test_host_list_forms(text, expected):
    assert parse_host_list(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "the host list is empty"),
        ("h1,,h2", "host list item 2: empty host item"),
        ("h1,", "host list item 2: empty host item"),
        ("h1:0", "host list item 1: 'h1:0': port '0' is not a number from 1 to 65535"),
        ("h1:70000", "host list item 1: 'h1:70000': port '70000' is not a number from 1 to 65535"),
        ("h1:ssh", "host list item 1: 'h1:ssh': port 'ssh' is not a number from 1 to 65535"),
        ("h1:\u00b2", "host list item 1: 'h1:\u00b2': port '\u00b2' is not a number from 1 to 65535"),
        ("h1:", "host list item 1: 'h1:': empty port after ':'"),
        ("fe80::1", "host list item 1: 'fe80::1': write IPv6 addresses in brackets, e.g. [fe80::1]:22"),
        ("[fe80::1", "host list item 1: '[fe80::1': missing ']' after IPv6 address"),
        ("[nothex]:22", "host list item 1: '[nothex]:22': 'nothex' is not an IPv6 address"),
        ("[::1]x", "host list item 1: '[::1]x': unexpected 'x' after ']'"),
        ("h1,bad host", "host list item 2: 'bad host': whitespace inside a host item"),
        ("h_1,-bad", "host list item 2: '-bad': '-bad' is not a valid host name or address"),
        ("b@d@h1", "host list item 1: 'b@d@h1': bad user name 'b@d'"),
        ("@h1", "host list item 1: '@h1': bad user name ''"),
        ("h1,H1", "duplicate host 'H1' (also given as 'h1')"),
        ("a@h1:22,b@h1:22", "duplicate host 'b@h1:22' (also given as 'a@h1:22')"),
    ],
)
def test_malformed_host_list_names_the_bad_item(text, message):
    with pytest.raises(HostListError) as error:
        parse_host_list(text)
    assert str(error.value) == message


def test_hostfile_with_slots_comments_and_blank_lines():
    text = "# the cluster\nnode1 slots=4\n\n  ubuntu@node2:2222   slots=2  # GPU box\n[::1]\n"
    assert parse_hostfile(text, source="hosts.txt") == [
        Host("node1", slots=4),
        Host("node2", 2222, "ubuntu", 2),
        Host("::1"),
    ]
    assert parse_hostfile("node1\n")[0].slots is None, "no slots=N: the node's GPUs decide"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("node1 slots=0\n", "hosts.txt:1: slots must be at least 1, got 0"),
        ("node1\nnode2 cpus=2\n", "hosts.txt:2: unknown option 'cpus=2' (expected slots=N)"),
        ("node1\n\nnode1 slots=2\n", "duplicate host 'node1' (also given as 'node1')"),
        ("# nothing\n\n", "hosts.txt: no hosts in the file"),
        ("node1\nfe80::2 slots=1\n", "hosts.txt:2: 'fe80::2': write IPv6 addresses in brackets, e.g. [fe80::2]:22"),
    ],
)
def test_malformed_hostfile_names_file_and_line(text, message):
    with pytest.raises(HostListError) as error:
        parse_hostfile(text, source="hosts.txt")
    assert str(error.value) == message


def test_labels_and_round_trip_through_a_hostfile():
    hosts = [Host("fe80::1", 22, "root", 2), Host("node2")]
    assert [h.label for h in hosts] == ["[fe80::1]:22", "node2"]
    assert format_hostfile(hosts) == "root@[fe80::1]:22 slots=2\nnode2\n"  # node2's GPUs decide its slots
    assert parse_hostfile(format_hostfile(hosts)) == hosts


def test_with_slots_sets_every_host_and_refuses_zero():
    assert with_slots([Host("a"), Host("b", 2222)], 3) == [Host("a", slots=3), Host("b", 2222, slots=3)]
    with pytest.raises(HostListError, match="slots must be at least 1, got 0"):
        with_slots([Host("a")], 0)

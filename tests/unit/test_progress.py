"""Progress on long steps: the bytes of a `docker pull` read from what it prints on a terminal (captured from
Docker 20.10 pulling a 77 MB layer from a registry, tests/unit/data/docker-pull-tty.txt), those of an rsync from
its --info=progress2 (captured from rsync 3.5.0 copying a 50 MB and a 1 kB file at 20 MB/s,
tests/unit/data/rsync-progress2.txt), and the report that shows them, a line at a time where the output is not a
terminal."""

from __future__ import annotations

import io
import subprocess
import time
from pathlib import Path

import pytest

from bootstrap.errors import UsageError
from bootstrap.progress import PullBytes, Report, RsyncBytes, line_of, line_seconds
from kiln import proc

CAPTURED = (Path(__file__).parent / "data" / "docker-pull-tty.txt").read_text()
RSYNC = (Path(__file__).parent / "data" / "rsync-progress2.txt").read_text()


def fed(counted, text: str, step: int) -> list[tuple[int, int]]:
    """Feed `text` to a counter `step` characters at a time: (done, total) after each."""
    seen = []
    for at in range(0, len(text), step):
        counted.feed(text[at:at + step])
        seen.append((counted.done, counted.total))
    return seen


@pytest.mark.parametrize("step", [1, 13, 200, len(CAPTURED)])
def test_a_pulls_bytes_are_read_from_its_terminal_output_however_it_arrives(step):
    counted = PullBytes()
    seen = fed(counted, CAPTURED, step)
    assert counted.total == 77_200_000 and counted.done == 77_200_000
    assert all(a <= b for (a, _), (b, _) in zip(seen, seen[1:], strict=False)), "the count went back"
    assert "Status: Downloaded newer image" in counted.text and "\x1b" not in counted.text


def test_a_layer_downloaded_is_half_done_and_one_already_there_counts_for_nothing():
    counted = PullBytes()
    counted.feed("aaaaaaaaaaaa: Already exists\r\nbbbbbbbbbbbb: Downloading  50MB/100MB\r\n")
    assert (counted.done, counted.total) == (25_000_000, 100_000_000)
    counted.feed("bbbbbbbbbbbb: Download complete \r\ncccccccccccc: Downloading [=>   ]  1.5kB/2GB\r\n")
    assert (counted.done, counted.total) == (50_000_750, 2_100_000_000)
    counted.feed("bbbbbbbbbbbb: Pull complete\r\n")
    assert counted.done == 100_000_750


def test_without_a_terminal_a_line_at_most_every_so_often():
    now = [0.0]
    out = io.StringIO()
    with Report("pulling img:1", ["node1", "node2"], stream=out, every=30, clock=lambda: now[0]) as report:
        report.update("node1", 10**9, 3 * 10**9)
        now[0] = 31.0
        report.update("node1", 1_500_000_000, 3 * 10**9)
        now[0] = 40.0
        report.update("node2", 10**6, 0)
    lines = out.getvalue().splitlines()
    assert lines == ["pulling img:1 on node1, node2",
                     "pulling img:1: node1 1.5 GB of 3.0 GB, node2 0 bytes (31 s, 48.4 MB/s)"]


def test_the_line_names_each_node_and_the_overall_rate():
    assert line_of("x", {"a": (2000, 4000), "b": (0, 0)}, 2.0) == "x: a 2.0 kB of 4.0 kB, b 0 bytes (2 s, 1.0 kB/s)"


def test_on_a_terminal_bars_and_no_lines():
    out = io.StringIO()
    with Report("pulling img:1", ["node1"], stream=out, terminal=True) as report:
        report.update("node1", 10**6, 2 * 10**6)
    assert "pulling img:1 node1" in out.getvalue() and "pulling img:1 on" not in out.getvalue()


def test_how_often_a_line_comes_is_a_setting(monkeypatch):
    monkeypatch.setenv("KILN_PROGRESS_SECONDS", "5")
    assert line_seconds() == 5.0
    for bad in ("soon", "0", "-3"):
        monkeypatch.setenv("KILN_PROGRESS_SECONDS", bad)
        with pytest.raises(UsageError, match="KILN_PROGRESS_SECONDS"):
            line_seconds()


def test_chunks_come_as_written_and_a_deadline_ends_the_wait():
    done = subprocess.Popen(["sh", "-c", "printf a; sleep 0.2; printf b"], stdout=subprocess.PIPE)
    assert b"".join(proc.chunks(done.stdout, deadline=time.monotonic() + 10)) == b"ab"
    done.wait()
    stuck = subprocess.Popen(["sleep", "30"], stdout=subprocess.PIPE)
    try:
        with pytest.raises(TimeoutError):
            list(proc.chunks(stuck.stdout, deadline=time.monotonic() + 0.3))
    finally:
        stuck.kill()
        stuck.wait()
        stuck.stdout.close()


@pytest.mark.parametrize("step", [1, 7, 64, len(RSYNC)])
def test_an_rsyncs_bytes_and_whole_are_read_from_its_progress2_however_they_arrive(step):
    counted = RsyncBytes()
    seen = fed(counted, RSYNC, step)
    assert (counted.done, counted.total) == (50_001_000, 50_001_000)
    assert all(a <= b for (a, _), (b, _) in zip(seen, seen[1:], strict=False)), "the count went back"
    # the whole is known from the first share over 0% (21,823,488 bytes at 43%), within that share's rounding
    first = next(total for done, total in seen if total)
    assert 50_001_000 <= first <= 50_001_000 * 44 // 43


def test_an_rsync_at_0_percent_has_no_whole_yet():
    counted = RsyncBytes()
    counted.feed("\r         32,768   0%    0.00kB/s    0:00:00  \r")
    assert (counted.done, counted.total) == (32_768, 0)


def test_a_quiet_report_says_nothing_of_a_short_step_and_lines_without_its_opening_of_a_long_one():
    now = [0.0]
    out = io.StringIO()
    with Report("syncing /p", ["node1"], stream=out, every=30, clock=lambda: now[0], quiet_s=2) as report:
        now[0] = 1.0
        report.update("node1", 10**6, 10**6)
    assert out.getvalue() == "" and not report.shown
    with Report("syncing /p", ["node1"], stream=out, every=30, clock=lambda: now[0], quiet_s=2) as report:
        now[0] = 32.0
        report.update("node1", 10**9, 2 * 10**9)
    assert out.getvalue().splitlines() == ["syncing /p: node1 1.0 GB of 2.0 GB (31 s, 32.3 MB/s)"] and report.shown


def test_a_quiet_report_on_a_terminal_shows_its_bars_only_past_its_quiet_start():
    now = [0.0]
    out = io.StringIO()
    with Report("syncing /p", ["node1"], stream=out, terminal=True, clock=lambda: now[0], quiet_s=2) as report:
        report.update("node1", 10**6, 2 * 10**6)
    assert out.getvalue() == ""
    with Report("syncing /p", ["node1"], stream=out, terminal=True, clock=lambda: now[0], quiet_s=2) as report:
        now[0] = 5.0
        report.update("node1", 10**6, 2 * 10**6)
    assert "syncing /p node1" in out.getvalue()


def test_chunks_end_when_nothing_comes_for_the_idle_time_however_far_the_deadline():
    slow = subprocess.Popen(["sh", "-c", "printf a; sleep 0.3; printf b; sleep 30"], stdout=subprocess.PIPE)
    got = []
    try:
        with pytest.raises(TimeoutError, match="nothing came for 1 s"):
            for chunk in proc.chunks(slow.stdout, deadline=float("inf"), idle=1):
                got.append(chunk)
    finally:
        slow.kill()
        slow.wait()
        slow.stdout.close()
    assert b"".join(got) == b"ab"

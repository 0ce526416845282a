"""kiln.proc and kiln.errors: bounded commands whose failures read as one message, caught once at the edge."""

from __future__ import annotations

import sys

import pytest

from kiln import proc
from kiln.errors import KilnError, UsageError, run_main


def test_output_comes_back_as_text():
    assert proc.run([sys.executable, "-c", "print('hello')"], timeout=30).stdout == "hello\n"


def test_a_failure_names_the_command_its_exit_code_and_its_last_lines():
    script = "import sys; print('\\n'.join(map(str, range(20))), file=sys.stderr); sys.exit(3)"
    with pytest.raises(KilnError) as error:
        proc.run([sys.executable, "-c", script], timeout=30, tail_lines=2)
    message = str(error.value)
    assert "exited 3: 18\n19" in message and message.startswith(sys.executable)


def test_a_command_that_hangs_is_stopped_at_its_timeout():
    with pytest.raises(KilnError, match=r"timed out after 0.5 s"):
        proc.run([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.5)


def test_a_missing_program_is_named():
    with pytest.raises(KilnError, match="no-such-program-kiln could not start"):
        proc.run(["no-such-program-kiln"], timeout=5)


def test_unchecked_failures_return_the_result():
    assert proc.run([sys.executable, "-c", "raise SystemExit(4)"], timeout=30, check=False).returncode == 4


def test_the_edge_prints_one_line_and_exits_with_the_errors_code(capsys):
    def bad_input():
        raise UsageError("--count 0: a cluster needs at least 1 node")

    assert run_main("kiln", bad_input) == 2
    assert capsys.readouterr().err == "kiln: --count 0: a cluster needs at least 1 node\n"
    assert run_main("kiln", lambda: None) == 0
    assert KilnError("x", exit_code=7).exit_code == 7

"""`make matrix-check`'s reading of package indexes (pure): a pin against what an index lists."""

from __future__ import annotations

from bake.matrix_check import Row, compare, debian_upstream, format_rows, packages_versions

INDEX = """Package: libnccl2
Version: 2.27.7-1+cuda12.9

Package: libnccl2
Version: 2.28.3-1+cuda13.0

Package: libnccl-dev
Version: 2.29.0-1+cuda13.0

Package: nvidia-driver-580-open
Version: 580.159.04-0ubuntu1

Package: nvidia-driver-580-open
Version: 580.172.01-0ubuntu1

Package: nvidia-driver-590-open
Version: 590.44.01-0ubuntu1

Package: nvidia-driver-580
Version: 580.999.01-0ubuntu1
"""


def test_the_newest_of_the_pins_line_and_overall_are_found():
    row = compare("tensorflow_version", "2.21.0", ["2.18.1", "2.21.0", "2.21.2", "2.22.0", "2.23.0rc1"])
    assert row == Row("tensorflow_version", "2.21.0", "2.21.2", "2.22.0")  # release candidates left out


def test_a_driver_pin_keeps_to_its_branch():
    versions = [debian_upstream(v, 3) for v in packages_versions(INDEX, r"nvidia-driver-\d+-open")]
    assert versions == ["580.159.04", "580.172.01", "590.44.01"]  # the proprietary package is not counted
    assert compare("nvidia_driver_version", "580.159.04", versions) == Row(
        "nvidia_driver_version", "580.159.04", "580.172.01", "590.44.01")


def test_debian_versions_read_as_the_matrix_writes_them():
    assert debian_upstream("1:4.2.3-1", 3) == "4.2.3"
    assert debian_upstream("2.27.7-1+cuda12.9", 3) == "2.27.7"
    assert debian_upstream("9.3.0.75-1", 4) == "9.3.0.75"
    assert debian_upstream("12.5.1-1", 3) == "12.5.1"
    assert packages_versions(INDEX, "libnccl2") == ["2.27.7-1+cuda12.9", "2.28.3-1+cuda13.0"]


def test_nothing_listed_or_no_answer_is_said_not_guessed():
    assert compare("cuda_version", "12.5.1", []).note == "no releases found"
    table = format_rows([Row("cuda_version", "12.5.1", None, None, "https://x is out of reach: timed out"),
                         Row("tensorflow_version", "2.21.0", "2.21.0", "2.22.0")])
    assert "cuda_version: https://x is out of reach: timed out" in table
    assert "tensorflow_version: 2.22.0 is out (pinned 2.21.0)" in table
    assert table.splitlines()[0].split() == ["pin", "pinned", "newest", "in", "its", "line", "newest"]

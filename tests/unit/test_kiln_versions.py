"""The image's version reader (ansible/roles/image_manifest/files/kiln-versions.py): an installer's record."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "ansible/roles/image_manifest/files/kiln-versions.py"
spec = importlib.util.spec_from_file_location("kiln_versions", SCRIPT)
kiln_versions = importlib.util.module_from_spec(spec)
spec.loader.exec_module(kiln_versions)

PREFIX = "# EFA installer version: "


def test_the_efa_installer_s_version_is_read_from_its_record(tmp_path):
    record = tmp_path / "efa_installed_packages"
    record.write_text("# EFA installer version: 1.47.0\n# Debug packages installed: no\n# Packages installed:\n"
                      "libfabric1-aws_2.1.0amzn5.0_amd64 efa_2.17.1-1_amd64\n")
    assert kiln_versions.record_version(str(record), PREFIX) == "1.47.0"
    record.write_text("# Packages installed:\n")
    assert kiln_versions.record_version(str(record), PREFIX) is None, "a record that names no version"
    assert kiln_versions.record_version(str(tmp_path / "missing"), PREFIX) is None, "no installer ran"

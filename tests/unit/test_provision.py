"""bake.provision's playbook settings, run for real against this machine (Ansible's local connection)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bake.provision import mitogen_strategy

# Two tasks print the process that ran them: Ansible's own strategy starts a new interpreter for each task,
# Mitogen's keeps one for the play.
PLAY = """
- hosts: all
  gather_facts: false
  tasks:
    - ansible.builtin.command: python3 -c "import os; print(os.getppid())"
      register: first
      changed_when: false
    - ansible.builtin.command: python3 -c "import os; print(os.getppid())"
      register: second
      changed_when: false
    - ansible.builtin.debug:
        msg: "runners {{ first.stdout }} {{ second.stdout }}"
"""


def runners(tmp_path: Path, settings: dict[str, str]) -> set[str]:
    (tmp_path / "play.yml").write_text(PLAY)
    argv = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,", "-c", "local",
            "-e", f"ansible_python_interpreter={sys.executable}", str(tmp_path / "play.yml")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env={**os.environ, **settings})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    [line] = [line for line in done.stdout.splitlines() if '"runners ' in line]
    return set(line.split('"runners ')[1].rstrip('"').split())


def test_mitogen_runs_the_plays_tasks_in_one_interpreter(tmp_path):
    assert len(runners(tmp_path, mitogen_strategy())) == 1
    assert len(runners(tmp_path, {})) == 2, "Ansible's own strategy ran both tasks in one process: this proves nothing"

"""A bake says how far it is: Ansible's tasks in packer's output, against the last bake's packer.log."""

from __future__ import annotations

import os
import sys
import time

from bake import image
from bake.progress import BakeProgress, last_log, logged_tasks, task_of

# The shape of a bake's packer.log, as image.run_packer writes it (lines of a docker bake's, shortened)
LOG = """\
[     0.4] docker.container: output will be in this color.
[     4.5]     docker.container: TASK [Gathering Facts] *********************************************************
[     5.7]     docker.container: TASK [Check the image profile] *************************************************
[    60.2]     docker.container: TASK [apt_source : Add the repository key] ************************************
[   150.0]     docker.container: TASK [apt_source : Add the repository key] ************************************
[   190.9]     docker.container: TASK [image_cleanup : Truncate the logs] ***************************************
[   285.1] Build 'docker.container' finished after 4 minutes 44 seconds.
"""


def test_the_tasks_and_the_seconds_are_read_from_a_bakes_log():
    assert task_of("    qemu.local: TASK [kiln_frameworks : Install torch] *****") == "kiln_frameworks : Install torch"
    assert task_of("    qemu.local: ok: [default]") is None
    tasks, seconds = logged_tasks(LOG.splitlines())
    assert seconds == 285.1
    assert [name for _, name in tasks] == ["Gathering Facts", "Check the image profile",
                                           "apt_source : Add the repository key", "apt_source : Add the repository key",
                                           "image_cleanup : Truncate the logs"]


def test_a_bake_under_way_says_its_task_of_about_how_many_and_the_time_left_as_the_last_bake_went():
    progress = BakeProgress(*logged_tasks(LOG.splitlines()))
    assert progress.line(2) == "bake: 2 s, no Ansible task yet"
    for task in ("Gathering Facts", "Check the image profile", "apt_source : Add the repository key"):
        progress.feed(f"    docker.container: TASK [{task}] ****")
    assert progress.line(75) == ("bake: task 3 of about 5 (apt_source : Add the repository key), 1 min 15 s, "
                                 "about 3 min 44 s left as the last bake went")
    progress.feed("    docker.container: TASK [apt_source : Add the repository key] ****")  # the role's second run
    assert progress.left() == 285.1 - 150.0
    progress.feed("    docker.container: TASK [A task the last bake had not] ****")
    assert progress.line(200) == "bake: task 5 of about 5 (A task the last bake had not), 3 min 20 s"
    assert BakeProgress().line(30) == "bake: 30 s, no Ansible task yet"


def test_the_last_log_is_the_newest_bake_of_the_same_provider_and_profile(tmp_path):
    for name, age in (("docker-cpu-aaa", 100), ("docker-cpu-bbb", 10), ("local-cpu-ccc", 0), ("docker-gpu-ddd", 0)):
        (tmp_path / name).mkdir()
        log = tmp_path / name / "packer.log"
        log.write_text(LOG)
        os.utime(log, (time.time() - age, time.time() - age))
    (tmp_path / ".docker-cpu-eee.tmp").mkdir()  # a bake under way
    (tmp_path / ".docker-cpu-eee.tmp" / "packer.log").write_text("")
    assert last_log(tmp_path, "docker", "cpu") == tmp_path / "docker-cpu-bbb" / "packer.log"
    assert last_log(tmp_path, "azure", "cpu") is None


def test_run_packer_says_how_far_the_bake_is_while_a_task_is_silent(tmp_path, capfd, monkeypatch):
    """run_packer runs whatever argv it is given: here a program that prints a bake's tasks, the last one silent
    for a while."""
    before = tmp_path / "before.log"
    before.write_text(LOG)
    script = ("import time\n"
              "for task in ('Gathering Facts', 'Check the image profile', 'apt_source : Add the repository key'):\n"
              "    print(f'    docker.container: TASK [{task}] ****', flush=True)\n"
              "    time.sleep(0.1)\n"
              "time.sleep(1.5)\n")  # a long task that prints nothing
    monkeypatch.setenv("KILN_PROGRESS_SECONDS", "0.2")
    image.run_packer([sys.executable, "-c", script], tmp_path / "packer.log", 60, before)
    said = capfd.readouterr().out.splitlines()
    progress = [line for line in said if line.startswith("bake: task ")]
    assert progress, said
    assert progress[-1].startswith("bake: task 3 of about 5 (apt_source : Add the repository key), ")
    assert progress[-1].endswith(" left as the last bake went")
    stamped = (tmp_path / "packer.log").read_text().splitlines()
    assert len(stamped) == 3 and all(line.startswith("[") for line in stamped)

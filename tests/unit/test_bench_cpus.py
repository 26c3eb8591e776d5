"""bench.cpus: a process tree pinned to one CPU and given back every CPU it had."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from bench.cpus import _descendants, pinned

pytestmark = pytest.mark.unit


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to pin to one")
def test_a_process_its_children_and_this_process_are_pinned_and_then_set_free() -> None:
    every = os.sched_getaffinity(0)
    child_code = "import subprocess, time; subprocess.Popen(['sleep', '60']); time.sleep(60)"
    root = subprocess.Popen([sys.executable, "-c", child_code])
    try:
        deadline = time.monotonic() + 30
        while len(_descendants(root.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        tree = _descendants(root.pid)
        assert len(tree) == 2, tree
        one = {min(every)}
        with pinned(root.pid, one):
            for pid in (*tree, os.getpid()):
                for thread in os.listdir(f"/proc/{pid}/task"):
                    assert _affinity(int(thread)) in (one, None), (pid, thread)
        for pid in (*tree, os.getpid()):
            assert os.sched_getaffinity(pid) == every, pid
    finally:
        for pid in _descendants(root.pid):
            os.kill(pid, 9)
        root.wait()


def _affinity(thread: int) -> set[int] | None:
    """A thread's CPUs, or None when it ended between listing and asking (this process's
    own threads come and go: pytest's, the Kafka and Spark clients' of earlier tests)."""
    try:
        return os.sched_getaffinity(thread)
    except ProcessLookupError:
        return None

"""An actor process exits as soon as the Ray node process that started it is gone (workers/pool.py
`watch_parent`, `exit_with_node`), so a SIGKILLed driver's leftover central actor frees the run's writer lock
at once and `qbatch resume` is not refused as if another run were writing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.faults.conftest import wait_for
from workers.pool import exit_with_node

REPO = Path(__file__).resolve().parents[2]


def _gone(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status")
    try:
        return "zombie" in status.read_text()
    except FileNotFoundError:
        return True


def test_a_process_whose_parent_dies_exits_within_a_check(tmp_path):
    log = tmp_path / "child.err"
    child = (f"import sys, time; sys.path.insert(0, {str(REPO)!r}); from workers.pool import watch_parent; "
             "watch_parent('test actor', 0.1); print('ready', flush=True); time.sleep(120)")
    parent = ("import subprocess, sys, time; "
              f"p = subprocess.Popen([sys.executable, '-c', {child!r}], stdout=subprocess.PIPE, "
              f"stderr=open({str(log)!r}, 'w')); assert p.stdout.readline().strip() == b'ready'; "
              "print(p.pid, flush=True); time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE)
    try:
        pid = int(proc.stdout.readline())
        time.sleep(0.5)
        assert not _gone(pid), "the watch must not end a process whose parent is alive"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    killed = time.time()
    try:
        wait_for(lambda: _gone(pid), 10, "the orphaned process to exit", period=0.05)
    finally:
        if not _gone(pid):
            os.kill(pid, signal.SIGKILL)
    assert time.time() - killed < 3  # checks every 0.1 s; before, Ray's own checks took seconds to a minute
    assert "the Ray node that ran the test actor is gone; the test actor exits" in log.read_text()


def test_outside_an_actor_nothing_is_watched():
    assert exit_with_node("driver") is False

"""Process plumbing of the evaluation sandboxes: the kernel's pieces a sandbox child and its Ray worker need.

ARCHITECTURE.md "The path of one evaluation", steps 3 and 6: an evaluation's child process dies with its
worker, takes what the objective started with it, and leaves no zombie behind; a hung one says where it hung
before it is killed. Here: the C library (prctl), the parent-death signal, the guard of a sandbox's process
group, the group kill, reaping, the worker as the subreaper of its sandboxes' orphans, and the Python stacks a
child writes on `STACK_SIGNAL`. The sandbox (workers/sandbox.py) uses them; none runs objective code. Linux;
elsewhere each one does what it can (no prctl, no pidfd) and the evaluation runs without it.
"""

from __future__ import annotations

import functools
import os
import select
import signal
import threading
import time
from typing import Any

__all__ = [
    "STACK_SIGNAL",
    "STACK_WAIT_S",
    "adopt_orphans",
    "die_with_parent",
    "guard_group",
    "kill_group",
    "libc",
    "reap",
    "reap_orphans",
    "stacks_of",
    "track_sandbox",
]

#: the signal on which a sandbox child writes the Python stacks of its threads (faulthandler), sent to a child
#: that ran past its timeout just before it is killed, so the record says where the objective hung
STACK_SIGNAL = signal.SIGUSR2
#: how long a timed-out child is given to write its stacks (it may be stopped, or its objective took the
#: signal)
STACK_WAIT_S = 1.0
#: the most of a stack dump read back (many deep threads); the record keeps its head and tail (`cap`), and so
#: the main thread, which faulthandler writes last
_MAX_STACK_BYTES = 4_000_000
#: prctl option: the orphaned descendants of this process are re-parented to it instead of to PID 1
_PR_SET_CHILD_SUBREAPER = 36


@functools.cache
def libc() -> Any:
    """The C library, loaded once in the worker (so a forked child need not load it)."""
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def die_with_parent(parent_pid: int) -> None:
    """Linux: have the kernel SIGKILL this child when the Ray worker that forked it dies.

    Otherwise an orphaned evaluation keeps the worker's sockets open and Ray notices the lost worker late.
    """
    try:
        PR_SET_PDEATHSIG = 1
        libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except Exception:  # pragma: no cover - not Linux
        return
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


class _Adoption:
    """This process's part as the subreaper of its sandboxes' orphans (`adopt_orphans`)."""

    def __init__(self) -> None:
        #: whether this process is a subreaper: None until `adopt_orphans` has decided, once per process
        self.subreaper: bool | None = None
        #: pids of the sandboxes this worker forked as a subreaper: its only children it must not reap
        #: (multiprocessing waits for them); every other zombie child is an adopted orphan
        self.sandbox_pids: set[int] = set()
        self.lock = threading.Lock()

    def forget_in_child(self) -> None:
        """In a forked child: the kernel does not pass the subreaper flag on, and `lock` may have been held by
        another thread at the fork (an objective that itself calls `evaluate_once` would hang on it).
        A child never becomes a subreaper itself: a sandbox runs objective code, whose own children (a `Popen`
        it waits for) `reap_orphans` would reap."""
        self.lock = threading.Lock()
        self.subreaper = False
        self.sandbox_pids.clear()


_ADOPTION = _Adoption()
os.register_at_fork(after_in_child=_ADOPTION.forget_in_child)


def adopt_orphans() -> bool:
    """Make this Ray evaluation worker (`evaluation_runtime_env` marks it) the subreaper of its sandboxes'
    orphans.

    A sandbox's guard (`guard_group`) and what its group kill ends are orphans: re-parented to PID 1, they
    stay zombies for good where PID 1 reaps nothing (a container whose entrypoint is the driver, `docker run
    img qbatch run ...`): one per timeout, crash or new objective, until the container runs out of pids (31
    after 400 evaluations). Adopted here, `reap_orphans` collects them, and so every orphan below the worker
    (a helper the objective started in a session of its own too). Once per process; elsewhere (library use of
    `evaluate_once`) the caller's process is left as it is. A dying worker's orphans still go to PID 1: with
    no init there, run containers with one (`docker run --init`, README)."""
    if _ADOPTION.subreaper is None:
        _ADOPTION.subreaper = False
        # a process-isolated evaluation worker only: one for thread-isolated evaluations runs objective code
        # (which may itself call `evaluate_once`), whose own children a sweep would reap
        if os.environ.get("QBATCH_EVALUATION_WORKER") == "process":
            try:
                _ADOPTION.subreaper = libc().prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
            except Exception:  # pragma: no cover - not Linux
                pass
    return _ADOPTION.subreaper


def track_sandbox(pid: int) -> None:
    """Count the sandbox `pid`, which this subreaper worker just forked, among the children `reap_orphans`
    leaves alone (multiprocessing waits for it)."""
    with _ADOPTION.lock:
        _ADOPTION.sandbox_pids.add(pid)


def _children() -> list[int]:
    """The pids of this process's children (Linux /proc)."""
    if not os.path.exists(f"/proc/self/task/{threading.get_native_id()}/children"):
        # a kernel without the children files: scan every process's parent
        me = os.getpid()
        return [int(n) for n in os.listdir("/proc")
                if n.isdigit() and (stat := _proc_stat(int(n))) is not None and stat[1] == me]
    pids: list[int] = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                pids.extend(int(p) for p in f.read().split())
        except OSError:  # the thread ended meanwhile
            pass
    return pids


def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, process group) of `pid` from /proc/<pid>/stat; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[0].decode(), int(fields[1]), int(fields[2])
    except (OSError, IndexError, ValueError):
        return None


def reap_orphans() -> None:
    """Reap the zombies among this subreaper worker's children that are not its sandboxes: the orphans it
    adopted (the sandboxes' guards, what a group kill ended, a helper the objective started in a session of
    its own, which otherwise stay zombies). In a process-isolated worker no objective code runs, so a child
    that is not a sandbox is one of them. A sandbox is forgotten once it is no longer a child here."""
    if not _ADOPTION.subreaper:
        return
    with _ADOPTION.lock:
        sandboxes = set(_ADOPTION.sandbox_pids)
    children = _children()
    for pid in children:
        if pid in sandboxes:
            continue
        stat = _proc_stat(pid)
        if stat is not None and stat[0] == "Z":
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
    with _ADOPTION.lock:  # those seen at the start that are gone (a sandbox forked since then stays)
        _ADOPTION.sandbox_pids.difference_update(sandboxes - set(children))


def guard_group() -> None:
    """Start a guard that SIGKILLs this process group once the calling sandbox child has ended, however it
    ends.

    The kernel kills the sandbox with its Ray worker (`die_with_parent`), but not what the objective started
    in the sandbox's group (a simulator's processes, a Pool): re-parented to init, those would run on beside
    the evaluations of a resumed run. The guard is a separate process because the sandbox itself may be
    SIGKILLed, or stuck in C code where no Python signal handler or thread would run. It is forked twice, so
    that it is not the sandbox's child (an objective that reaps all its children, `os.wait()` until none is
    left, would wait for it forever), and it watches the sandbox through a pidfd, so that no signal the
    objective sends its group can wake it; it ignores the catchable ones. Linux 5.3+ (pidfd); none elsewhere.
    """
    try:
        pidfd = os.pidfd_open(os.getpid())
    except (AttributeError, OSError):  # pragma: no cover - no pidfd here: run without the guard
        return
    try:
        middle = os.fork()
    except OSError:  # pragma: no cover - out of processes: run without the guard
        os.close(pidfd)
        return
    if middle:
        os.close(pidfd)
        os.waitpid(middle, 0)
        return
    # the middle process: fork the guard and leave (the objective has not run: one thread, nothing locked)
    try:
        if os.fork() == 0:
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
                        signal.SIGUSR2):
                signal.signal(sig, signal.SIG_IGN)
            os.closerange(3, pidfd)  # hold none of the worker's sockets or the sandbox's pipe open
            os.closerange(pidfd + 1, 1 << 20)
            while not select.select([pidfd], [], [])[0]:  # readable once the sandbox has ended
                pass
            os.killpg(0, signal.SIGKILL)  # the group, this guard included
    finally:
        os._exit(0)


def stacks_of(pid: int, stack_file: Any) -> str:
    """The Python stacks of the sandbox child `pid`, which it writes to `stack_file` on `STACK_SIGNAL`
    (workers/sandbox.py); "" when none came within `STACK_WAIT_S` (a stopped child, an objective that took the
    signal for itself, a child that is gone)."""
    if stack_file is None:
        return ""
    fd = stack_file.fileno()
    try:
        os.ftruncate(fd, 0)  # a dump for an earlier SIGUSR2 (a profiler's, the objective's) is not this one
        os.kill(pid, STACK_SIGNAL)
    except OSError:
        return ""
    deadline, size, still = time.monotonic() + STACK_WAIT_S, 0, 0
    while time.monotonic() < deadline:
        time.sleep(0.02)
        now = os.fstat(fd).st_size
        still = still + 1 if now and now == size else 0
        if still >= 3:  # written, and no longer growing for 60 ms (faulthandler writes in many small pieces)
            break
        size = now
    text = os.pread(fd, _MAX_STACK_BYTES, 0).decode("utf-8", "backslashreplace").strip()
    return f"\n\nits Python stacks when it was killed:\n{text}" if text else ""


def kill_group(pid: int) -> None:
    """SIGKILL the sandbox child `pid` and its process group (what the objective started: the sandbox makes
    the child a group leader); the child alone if it has not become one yet."""
    # a group with the child's pid as its id can only be the child's own (Linux reuses no pid while a group of
    # that id exists), even when the child was reaped already and only what it started is left in it
    try:
        os.killpg(pid, signal.SIGKILL)
        return
    except (ProcessLookupError, PermissionError):
        pass
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def reap(proc: Any, grace_s: float = 10.0) -> None:
    """Wait for a child that was told to exit (or killed); kill it if it lingers."""
    proc.join(timeout=grace_s)
    if proc.is_alive():
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.join()

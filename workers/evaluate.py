"""One evaluation of an objective as a Ray task: resources, timeout, retries, failures as records.

ARCHITECTURE.md "The path of one evaluation", step 3. Each
evaluation runs the objective in a child process of the Ray worker (``isolate="process"``), so a hang
past `timeout_s` is killed and a crash of the objective (``os.abort``, a segfault) cannot take the
worker down. The child (the worker's "sandbox") is forked once per objective and serves the worker's
evaluations one after another, as Ray reuses its workers; a killed or crashed one is replaced. ``isolate="thread"`` runs it in a thread instead (no fork; a hung thread is abandoned,
not killed). Whatever happens - an exception, a NaN, inf, None, a string, an array, a timeout, a crash -
the task returns one plain record (a dict); only the loss of the Ray worker or node itself surfaces as a
Ray error, which Ray retries (`max_retries`) and the central actor records as "worker-lost". A result is
never recorded twice: the actor ingests exactly once per trial id.

A timeout's traceback holds where the objective hung: the child's Python stacks, which it writes (faulthandler,
on `STACK_SIGNAL`) just before it is killed, or the abandoned thread's stack.

Record keys: trial_id, status ("completed" | "failed"), value, error (reason), message, traceback, metrics,
node_id, pid (the Ray worker), child_pid, started_at, ended_at (seconds since the epoch, around the
objective call), and metrics_dropped (a note per metric the log cannot hold) when there are any.
"""

from __future__ import annotations

import decimal
import faulthandler
import gc
import json
import math
import multiprocessing
import numbers
import os
import select
import signal
import sys
import tempfile
import threading
import time
import traceback as tb_module
from typing import Any, Callable, Mapping

import numpy as np

from objectives.base import EvalResult, Objective, Resources, is_json_data
from workers.records import (
    MAX_METRIC_CHARS,
    MAX_TIMEOUT_S,
    MAX_TRACEBACK_CHARS,
    cap,
    classify_value,
    describe_exception,
    format_exception_traceback,
    printable,
)

def evaluation_runtime_env(isolate: str = "process") -> dict[str, Any]:
    """The runtime environment of evaluation tasks: Ray workers of their own (`task_options`), apart by
    isolation mode too (a thread-isolated objective runs torch in the worker itself).

    `RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=1`: an evaluation sees the GPUs its objective asks for and no others.
    Ray (2.60 here) no longer empties it for a task that asks for no GPU: the task keeps the node's CUDA_VISIBLE_DEVICES (all its GPUs), so on a GPU node every CPU-only evaluation of a torch objective trained on GPU 0, beside the
    evaluations Ray had given it to (seen on an H100: `benchmarks/gpu.py`'s CPU run had `used_gpu` 1)."""
    return {"env_vars": {"QBATCH_EVALUATION_WORKER": isolate, "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "1"}}

__all__ = [
    "evaluate_once",
    "evaluation_task",
    "submit_evaluation",
    "task_options",
]


def _finite_float(v: Any) -> float | None:
    """`v` as a finite float, or None (NaN, inf, or an int beyond the float range)."""
    try:
        x = float(v)
    except Exception:  # noqa: BLE001 - beyond the float range, or a number type of user code that raises
        return None
    return x if math.isfinite(x) else None


#: the signal on which a sandbox child writes the Python stacks of its threads (faulthandler), sent to a child
#: that ran past its timeout just before it is killed, so the record says where the objective hung
STACK_SIGNAL = signal.SIGUSR2
#: how long a timed-out child is given to write its stacks (it may be stopped, or its objective took the signal)
STACK_WAIT_S = 1.0
#: the most of a stack dump read back (many deep threads); the record keeps its head and tail (`cap`), and so
#: the main thread, which faulthandler writes last
_MAX_STACK_BYTES = 4_000_000


_INT64 = 2**63
#: notes `metrics_dropped` keeps at most (the rest are counted in one more)
MAX_DROPPED_NOTES = 20
#: most metrics one record keeps, and most characters of them all together (names and values, JSON-encoded):
#: every read of the log and every row of trials.csv holds them; the ones past either cap are dropped, in the
#: objective's order, and named in `metrics_dropped`
MAX_METRICS = 1_000
MAX_METRICS_BYTES = 200_000


def _is_tensor(v: Any) -> bool:
    torch = sys.modules.get("torch")  # a tensor exists only where torch was imported
    return torch is not None and isinstance(v, torch.Tensor)


def _metric_value(v: Any) -> tuple[bool, Any]:
    """`(True, v as JSON data)`, or `(False, None)` for a value the log cannot hold as it is."""
    if v is None or isinstance(v, (bool, np.bool_)):
        return True, None if v is None else bool(v)
    if isinstance(v, np.generic) or ((_is_tensor(v) or isinstance(v, np.ndarray)) and v.ndim == 0):
        try:  # a NumPy scalar, a 0-d array or tensor (`metrics={"loss": loss}`): its one number
            item = v.item()
        except Exception:  # noqa: BLE001 - a 0-d object array of user code
            return False, None
        if isinstance(item, np.floating):  # np.longdouble's item() is itself
            item = float(item)
        return (False, None) if isinstance(item, (np.generic, np.ndarray)) else _metric_value(item)
    if isinstance(v, int):  # exact within int64 (an id, a count); beyond it a float, as the log's readers expect
        if -_INT64 <= v < _INT64:
            return True, int(v)
        x = _finite_float(v)
        return x is not None, x
    if isinstance(v, (numbers.Real, decimal.Decimal)):  # a float, Fraction, Decimal; NaN and inf too: a diverged loss is worth keeping
        try:
            return True, float(v)
        except Exception:  # noqa: BLE001 - a number type of user code whose conversion raises
            return False, None
    if isinstance(v, str):
        return True, cap(str(v), MAX_METRIC_CHARS)
    if isinstance(v, (list, tuple, Mapping)):  # small JSON data (a per-epoch curve, a config dict), kept whole
        try:
            if not is_json_data(v, tuples=True):  # numpy/torch inside, a non-string key (JSON would rename it), a set
                return False, None
            text = json.dumps(v, allow_nan=True, separators=(",", ":"))
        except (TypeError, ValueError, RecursionError):  # a cycle, nesting too deep
            return False, None
        return (True, json.loads(text)) if len(text) <= MAX_METRIC_CHARS else (False, None)
    return False, None


def _clean_metrics(metrics: Any) -> tuple[dict[str, Any], list[str]]:
    """The metrics the log keeps, and a note for each one it cannot keep (the record's `metrics_dropped`).

    Kept: None, bools, numbers (NumPy scalars and 0-d arrays or tensors by their value; ints exact within
    int64; Fraction and Decimal as floats; NaN and inf as they are), strings (capped), and lists/dicts of plain
    JSON data (string keys) up to `MAX_METRIC_CHARS` encoded. Keys are strings (`str(key)`, capped); a key that
    repeats one already kept is dropped, as is anything else. At most `MAX_DROPPED_NOTES` notes, then a count.
    """
    if metrics is None:
        return {}, []
    if not isinstance(metrics, Mapping):
        return {}, [f"metrics: a {type(metrics).__name__}, not a mapping of name to value"]
    out: dict[str, Any] = {}
    dropped: list[str] = []
    size = 2  # the encoded dict's braces
    over: list[str] = []  # names of the metrics past the count or size cap
    for k, v in metrics.items():
        key = cap(str(k), MAX_METRIC_CHARS)
        if over or len(out) >= MAX_METRICS:
            over.append(key)
            continue
        try:
            ok, value = _metric_value(v)
        except Exception:  # noqa: BLE001 - a value of user code that breaks a check: that metric alone goes
            ok, value = False, None
        if key in out:
            dropped.append(f"{key[:80]!r}: the same name as another metric's")
        elif ok:
            item = len(json.dumps({key: value}, allow_nan=True, separators=(",", ":"))) - 1  # '"k":v' and a comma
            if size + item > MAX_METRICS_BYTES:
                over.append(key)
                continue
            out[key] = value
            size += item
        else:
            what = f"a {type(v).__name__}" if not isinstance(v, (list, tuple, Mapping)) else \
                f"a {type(v).__name__} that is not plain JSON data (string keys) of at most {MAX_METRIC_CHARS} characters"
            dropped.append(f"{key[:80]!r}: {what}")
    if over:
        names = ", ".join(repr(n[:80]) for n in over[:5]) + (", ..." if len(over) > 5 else "")
        dropped.insert(0, f"{len(over)} metrics past the first {len(out)} kept (at most {MAX_METRICS} metrics and "
                          f"{MAX_METRICS_BYTES} characters of them in a record): {names}")
    if len(dropped) > MAX_DROPPED_NOTES:
        dropped = dropped[:MAX_DROPPED_NOTES] + [f"... and {len(dropped) - MAX_DROPPED_NOTES} more"]
    return out, dropped


# --------------------------------------------------------------------------- objective loading
_OBJECTIVE_CACHE: dict[str, Objective] = {}


def _spec_key(spec: tuple[str, Mapping[str, Any]]) -> str:
    name, options = spec
    return json.dumps([name, dict(options or {})], sort_keys=True, default=str)


def _load_spec(spec: tuple[str, Mapping[str, Any]]) -> Objective:
    from objectives.registry import load_objective

    name, options = spec
    return load_objective(name, options)


def _resolve_objective(objective: Objective | tuple[str, Mapping[str, Any]]) -> Objective:
    """An `Objective`, or a `(name, options)` spec loaded once per worker process and cached."""
    if isinstance(objective, Objective):
        return objective
    key = _spec_key(objective)
    if key not in _OBJECTIVE_CACHE:
        _OBJECTIVE_CACHE[key] = _load_spec(objective)
    return _OBJECTIVE_CACHE[key]


def _failed(
    error: str, message: str, traceback: str, started: float, ended: float | None = None,
    metrics: dict[str, Any] | None = None, **extra: Any,
) -> dict[str, Any]:
    """The payload of a failed evaluation's record (`extra`: e.g. `child_pid`); `ended` defaults to now."""
    return {"status": "failed", "value": None, "error": error, "traceback": traceback, "message": message,
            "started_at": started, "ended_at": time.time() if ended is None else ended, "metrics": metrics or {},
            **extra}


def _load_failure(exc: BaseException, started: float) -> dict[str, Any]:
    """The record payload of an evaluation whose objective could not be built (a failed trial, as when the
    worker raised it: the actor records a task's exception the same way)."""
    return _failed("exception", f"loading the objective failed: {describe_exception(exc)}",
                   format_exception_traceback(exc), started)


def _call(objective: Objective, params: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """Run the objective here; return the payload of a record (no process/timing bookkeeping)."""
    started = time.time()
    try:
        raw = objective(dict(params), seed)
    except BaseException as exc:  # noqa: BLE001 - any exception of user code is a failed trial
        ended = time.time()
        return _failed("exception", describe_exception(exc), format_exception_traceback(exc), started, ended)
    ended = time.time()
    try:
        value, reason, message = classify_value(raw)
    except Exception as exc:  # noqa: BLE001 - a returned object whose conversion raises is a failed trial
        value, reason, message = None, "non-numeric", \
            f"the objective's return value could not be read: {describe_exception(exc)}"
    try:
        metrics, dropped = _clean_metrics(raw.metrics) if isinstance(raw, EvalResult) else ({}, [])
    except Exception as exc:  # noqa: BLE001 - a mapping of user code whose items() raises: the value stands
        metrics, dropped = {}, [f"metrics: could not be read ({describe_exception(exc)})"]
    extra = {"metrics_dropped": dropped} if dropped else {}
    if reason is not None:
        return _failed(reason, message, message, started, ended, metrics, **extra)
    return {
        "status": "completed",
        "value": value,
        "error": None,
        "traceback": None,
        "message": None,
        "started_at": started,
        "ended_at": ended,
        "metrics": metrics,
        **extra,
    }


_LIBC: Any = None


def _libc() -> Any:
    """The C library, loaded once in the worker (so a forked child need not load it)."""
    global _LIBC
    if _LIBC is None:
        import ctypes

        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC


def _die_with_parent(parent_pid: int) -> None:
    """Linux: have the kernel SIGKILL this child when the Ray worker that forked it dies.

    Otherwise an orphaned evaluation keeps the worker's sockets open and Ray notices the lost worker late.
    """
    try:
        PR_SET_PDEATHSIG = 1
        _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except Exception:  # pragma: no cover - not Linux
        return
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


#: prctl option: the orphaned descendants of this process are re-parented to it instead of to PID 1
_PR_SET_CHILD_SUBREAPER = 36
#: pids of the sandboxes this worker forked as a subreaper: its only children it must not reap (multiprocessing
#: waits for them); every other zombie child is an adopted orphan
_SANDBOX_PIDS: set[int] = set()
_ADOPT_LOCK = threading.Lock()
_SUBREAPER: bool | None = None


def _forget_adoption_in_child() -> None:
    """In a forked child: the kernel does not pass the subreaper flag on, and `_ADOPT_LOCK` may have been held by
    another thread at the fork (an objective that itself calls `evaluate_once` would hang on it).
    A child never becomes a subreaper itself: a sandbox runs objective code, whose own children (a `Popen` it
    waits for) `_reap_orphans` would reap."""
    global _ADOPT_LOCK, _SUBREAPER
    _ADOPT_LOCK = threading.Lock()
    _SUBREAPER = False
    _SANDBOX_PIDS.clear()


os.register_at_fork(after_in_child=_forget_adoption_in_child)


def _adopt_orphans() -> bool:
    """Make this Ray evaluation worker (`evaluation_runtime_env` marks it) the subreaper of its sandboxes' orphans.

    A sandbox's guard (`_guard_group`) and what its group kill ends are orphans: re-parented to PID 1, they stay
    zombies for good where PID 1 reaps nothing (a container whose entrypoint is the driver, `docker run img qbatch
    run ...`): one per timeout, crash or new objective, until the container runs out of pids (31 after 400
    evaluations). Adopted here, `_reap_orphans` collects them, and so every orphan below the worker
    (a helper the objective started in a session of its own too). Once per process; elsewhere (library use of
    `evaluate_once`) the caller's process is left as it is. A dying worker's orphans still go to PID 1: with no
    init there, run containers with one (`docker run --init`, README)."""
    global _SUBREAPER
    if _SUBREAPER is None:
        _SUBREAPER = False
        # a process-isolated evaluation worker only: one for thread-isolated evaluations runs objective code
        # (which may itself call `evaluate_once`), whose own children a sweep would reap
        if os.environ.get("QBATCH_EVALUATION_WORKER") == "process":
            try:
                _SUBREAPER = _libc().prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
            except Exception:  # pragma: no cover - not Linux
                pass
    return _SUBREAPER


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


def _reap_orphans() -> None:
    """Reap the zombies among this subreaper worker's children that are not its sandboxes: the orphans it adopted
    (the sandboxes' guards, what a group kill ended, a helper the objective started in a session of its own,
    which otherwise stay zombies). In a process-isolated worker no objective code runs, so a child
    that is not a sandbox is one of them. A sandbox is forgotten once it is no longer a child here."""
    if not _SUBREAPER:
        return
    with _ADOPT_LOCK:
        sandboxes = set(_SANDBOX_PIDS)
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
    with _ADOPT_LOCK:  # those seen at the start that are gone (a sandbox forked since then stays)
        _SANDBOX_PIDS.difference_update(sandboxes - set(children))


def _guard_group() -> None:
    """Start a guard that SIGKILLs this process group once the calling sandbox child has ended, however it ends.

    The kernel kills the sandbox with its Ray worker (`_die_with_parent`), but not what the objective started
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
    try:  # the middle process: fork the guard and leave (the objective has not run: one thread, nothing locked)
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


def _sandbox_main(
    conn: Any, parent_end: Any, objective: Objective | tuple[str, Mapping[str, Any]], parent_pid: int,
    stack_fd: int | None = None,
) -> None:
    """The sandbox child's loop: evaluate each `(params, seed)` received, answer with its payload.

    A `(name, options)` spec is imported and built here, in the child, which answers first ("imported", then
    "built", or "failed" with the failure's payload): the worker then never runs objective code (not even a
    module's top level) before it forks, which matters because GNU OpenMP (torch's CPU thread pool) is not
    fork-safe: a child forked from a process that ran a multi-threaded torch op deadlocks at its own first one
    (a user objective that warms up a model in its constructor would time out at every evaluation)."""
    try:
        parent_end.close()  # else the worker closing its end would never reach this child as EOF
        # multiprocessing marks this child daemonic (so the worker never waits for it at exit) and refuses
        # daemonic processes children; the objective may start a Pool or a DataLoader with workers. Here, in
        # the child, the flag only gates that refusal: `_die_with_parent` and `_kill_group` do the cleanup
        multiprocessing.current_process().daemon = False
        _die_with_parent(parent_pid)
        if stack_fd is not None:  # where the worker reads this child's stacks when it runs past its timeout
            faulthandler.register(STACK_SIGNAL, file=stack_fd, all_threads=True, chain=False)
        # its own process group: a timeout kills the whole group, so an external simulator the objective
        # started (a subprocess still running) dies with it instead of living on beside the next evaluation
        try:
            os.setpgid(0, 0)
        except OSError:  # pragma: no cover - not permitted here: the kill below falls back to the child alone
            pass
        else:
            _guard_group()
        if not isinstance(objective, Objective):
            from objectives.registry import import_objective_module

            started = time.time()
            try:
                import_objective_module(objective[0])  # not timed by the worker (the actor's backstop bounds it)
                conn.send(("imported", None))
                objective = _load_spec(objective)  # timed: timeout_s of its own
            except BaseException as exc:  # noqa: BLE001 - user code: its failure is the evaluation's record
                conn.send(("failed", _load_failure(exc, started)))
                return
            conn.send(("built", None))
        while True:
            try:
                params, seed = conn.recv()
            except (EOFError, OSError):  # the worker closed the pipe or exited
                break
            payload = _call(objective, params, seed)
            try:
                conn.send(payload)
            except Exception as exc:  # an unpicklable metric or message
                conn.send({**payload, "metrics": {}, "message": f"result not transferable: {exc}"})
    finally:
        os._exit(0)


def _stacks_of(pid: int, stack_file: Any) -> str:
    """The Python stacks of the sandbox child `pid`, which it writes to `stack_file` on `STACK_SIGNAL`
    (`_sandbox_main`); "" when none came within `STACK_WAIT_S` (a stopped child, an objective that took the
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


def _kill_group(pid: int) -> None:
    """SIGKILL the sandbox child `pid` and its process group (what the objective started: `_sandbox_main` makes
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


class _Sandbox:
    """A child process of this worker that runs its evaluations one at a time (``isolate="process"``).

    The child is forked when first needed and again whenever the objective changes. An `Objective` object is
    inherited without pickling (user objectives may hold closures, models, open datasets); a `(name, options)`
    spec, what the central actor sends, is built in the child (see `_sandbox_main`). The child then
    serves evaluation after evaluation: no fork per evaluation, whose cost in a worker with torch loaded
    (copying page tables, then copy-on-write faults in the child) delays every result by milliseconds.
    A hang past the timeout kills it and a crash ends it; the next evaluation forks a fresh one.
    """

    def __init__(self) -> None:
        self.proc: Any = None
        self.conn: Any = None
        self.stack_file: Any = None  # where the child writes its stacks on STACK_SIGNAL (`_stacks_of`)
        self.objective: Objective | None = None  # held, so `id` identifies it while the child lives
        self.spec_key: str | None = None  # or the spec the child built its objective from
        self.devices: tuple[str | None, ...] | None = None  # the accelerators the child was forked with
        self.lock = threading.Lock()

    def _serves(self, objective: Objective | tuple[str, Mapping[str, Any]]) -> bool:
        if self.devices != _visible_devices():  # Ray gave this task other accelerators than the child has
            return False
        if isinstance(objective, Objective):
            return self.objective is objective
        return self.spec_key is not None and self.spec_key == _spec_key(objective)

    def _fork(
        self, objective: Objective | tuple[str, Mapping[str, Any]], build_timeout_s: float = MAX_TIMEOUT_S,
        on_progress: Callable[[], None] | None = None,
    ) -> dict[str, Any] | None:
        """Start a child for `objective`. For a spec, wait until the child has imported its module (not timed
        here), then built it (at most `build_timeout_s`), calling `on_progress` after each step; return the
        failure payload if it could not (the child is then gone), else None."""
        self.close()
        try:
            _libc()
        except Exception:  # pragma: no cover - not Linux
            pass
        ctx = multiprocessing.get_context("fork")
        self.devices = _visible_devices()
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        try:
            self.stack_file = tempfile.TemporaryFile()  # unlinked: gone with the last of the two processes
        except OSError:  # no writable temporary directory: timeouts then come without the stacks
            self.stack_file = None
        stack_fd = None if self.stack_file is None else self.stack_file.fileno()
        proc = ctx.Process(target=_sandbox_main, args=(child_conn, parent_conn, objective, os.getpid(), stack_fd),
                           daemon=True)
        # the child inherits the worker's objects frozen: its garbage collector then never walks (and so never
        # copies on write) the worker's heap
        adopt = _adopt_orphans()
        gc.freeze()
        try:
            proc.start()  # not under `_ADOPT_LOCK`: the child would inherit it held
        finally:
            gc.unfreeze()
        if adopt:  # (a sandbox dead before this line could be reaped by another thread's `_reap_orphans`; its
            with _ADOPT_LOCK:  # exit code would then be lost: it would have to die within microseconds of its fork)
                _SANDBOX_PIDS.add(proc.pid)
        child_conn.close()
        if isinstance(objective, Objective):
            self.proc, self.conn, self.objective = proc, parent_conn, objective
            return None
        # spec_key is set once the child is ready: until then this sandbox serves nothing (set earlier, an
        # interrupted wait would leave it claiming the spec, and the next evaluation would read the late "ready"
        # as its result)
        self.proc, self.conn = proc, parent_conn
        started = time.time()
        try:
            step, failure = parent_conn.recv()  # the import; a child that dies meanwhile ends the wait (EOF)
            if step == "imported":
                if on_progress is not None:
                    on_progress()
                # the build has a limit of its own (unbounded, a hung constructor is cut only by the actor's
                # backstop, as a "frozen" worker, at every trial)
                if not parent_conn.poll(build_timeout_s):
                    stacks = _stacks_of(proc.pid, self.stack_file)
                    self.close(kill=True, wait=True)
                    text = cap(f"building the objective took longer than timeout_s={build_timeout_s:g} s and was "
                               f"killed (pid {proc.pid}); a constructor that needs longer needs a larger timeout_s"
                               f"{stacks}", MAX_TRACEBACK_CHARS)
                    return _failed("timeout", f"timeout after {build_timeout_s:g} s while building the objective",
                                   text, started, child_pid=proc.pid)
                step, failure = parent_conn.recv()
        except (EOFError, OSError):
            self.close(kill=True, wait=True)
            died = RuntimeError(f"the sandbox process died while building the objective (exit code {proc.exitcode})")
            return {**_load_failure(died, started), "child_pid": proc.pid}
        except BaseException:  # interrupted (KeyboardInterrupt in a library call): no child half-built left
            self.close(kill=True, wait=True)
            raise
        if step == "failed":
            self.close(wait=True)
            failure["child_pid"] = proc.pid
            return failure
        self.spec_key = _spec_key(objective)
        if on_progress is not None:
            on_progress()
        return None

    def close(self, kill: bool = False, wait: bool = False) -> None:
        """End the child: close its pipe (it exits) or kill it; reaped here (`wait`) or beside."""
        proc, conn, stack_file = self.proc, self.conn, self.stack_file
        self.proc = self.conn = self.objective = self.spec_key = self.stack_file = None
        if conn is not None:
            conn.close()
        if stack_file is not None:
            stack_file.close()
        if proc is not None:
            if kill:
                _kill_group(proc.pid)
            if wait:
                _reap(proc)
            else:
                threading.Thread(target=_reap, args=(proc,), name="qbatch-reap", daemon=True).start()

    def run(
        self, objective: Objective | tuple[str, Mapping[str, Any]], params: Mapping[str, Any], seed: int,
        timeout_s: float, on_progress: Callable[[], None] | None = None,
    ) -> dict[str, Any]:
        """Evaluate in the child (forked first if needed). A spec's build gets `timeout_s` of its own, then the
        evaluation its full `timeout_s`; `on_progress` is called after a new child's import and after its build
        (the task re-reports its start each time, so the central actor's backstop deadline counts from there)."""
        if self.proc is None or not self._serves(objective) or not self.proc.is_alive():
            failure = self._fork(objective, timeout_s, on_progress)
            if failure is not None:
                return failure
        proc = self.proc
        started = time.time()
        try:
            self.conn.send((dict(params), seed))
            _reap_orphans()  # while the child evaluates: what earlier sandboxes and evaluations left behind
            answered = self.conn.poll(timeout_s)
        except (BrokenPipeError, EOFError, OSError):  # died between evaluations: read as a crash below
            answered = True
        except BaseException:  # interrupted: a child still busy with this evaluation must not serve the next
            self.close(kill=True, wait=True)
            raise
        if not answered:
            stacks = _stacks_of(proc.pid, self.stack_file)
            self.close(kill=True, wait=True)
            return _failed("timeout", f"timeout after {timeout_s:g} s",
                           cap(f"the evaluation ran past timeout_s={timeout_s:g} s and was killed (pid {proc.pid})"
                               f"{stacks}", MAX_TRACEBACK_CHARS), started, child_pid=proc.pid)
        try:
            payload = self.conn.recv()
        except (EOFError, OSError):
            payload = None
        except BaseException:
            self.close(kill=True, wait=True)
            raise
        if payload is not None:
            payload["child_pid"] = proc.pid
            return payload
        # no answer: the child died first (os.abort, a segfault, killed)
        self.close(kill=True, wait=True)
        code = proc.exitcode
        what = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
        return _failed("crash", f"crash ({what})",
                       f"the evaluation process (pid {proc.pid}) died with {what} before returning a result", started,
                       child_pid=proc.pid)


#: what Ray sets per task to give it its GPUs (and other accelerators); a child keeps the value it was forked with
_DEVICE_VARIABLES = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


def _visible_devices() -> tuple[str | None, ...]:
    """The accelerators Ray assigned to the current task. A kept sandbox child forked for an earlier task would
    run on that task's GPU while this one's stays idle, so a change forks a new child."""
    return tuple(os.environ.get(k) for k in _DEVICE_VARIABLES)


_SANDBOX = _Sandbox()


def _run_in_child(
    objective: Objective | tuple[str, Mapping[str, Any]], params: Mapping[str, Any], seed: int, timeout_s: float,
    on_progress: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Evaluate in this worker's sandbox child (a private one if another thread is using it)."""
    if _SANDBOX.lock.acquire(blocking=False):
        try:
            return _SANDBOX.run(objective, params, seed, timeout_s, on_progress)
        finally:
            _SANDBOX.lock.release()
    private = _Sandbox()
    try:
        return private.run(objective, params, seed, timeout_s, on_progress)
    finally:
        private.close()


def _reap(proc: Any, grace_s: float = 10.0) -> None:
    """Wait for a child that was told to exit (or killed); kill it if it lingers."""
    proc.join(timeout=grace_s)
    if proc.is_alive():
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.join()


def _run_in_thread(objective: Objective, params: Mapping[str, Any], seed: int, timeout_s: float) -> dict[str, Any]:
    box: list[dict[str, Any]] = []
    started = time.time()
    thread = threading.Thread(target=lambda: box.append(_call(objective, params, seed)), daemon=True)
    thread.start()
    thread.join(timeout_s)
    if box:
        return box[0]
    frame = sys._current_frames().get(thread.ident)  # where it hangs: the record says so, as a process's does
    stack = "" if frame is None else printable("".join(tb_module.format_stack(frame)))
    stack = f"\n\nits stack when it was abandoned:\n{stack}" if stack else ""
    return _failed("timeout", f"timeout after {timeout_s:g} s",
                   cap(f"the evaluation ran past timeout_s={timeout_s:g} s; its thread was abandoned "
                       f"(isolate='thread'){stack}", MAX_TRACEBACK_CHARS), started)


def evaluate_once(
    objective: Objective | tuple[str, Mapping[str, Any]],
    trial_id: str,
    params: Mapping[str, Any],
    seed: int,
    timeout_s: float = 600.0,
    isolate: str = "process",
    on_progress: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Evaluate one trial in this process (no Ray needed) and return its record.

    Args:
        objective: an `Objective`, or a `(name, options)` spec for `objectives.registry.load_objective`.
        trial_id: the trial's unique id, copied into the record.
        params: parameter name -> value.
        seed: the evaluation's random seed.
        timeout_s: seconds before the evaluation is killed (process) or abandoned (thread).
        isolate: "process" (forked child, killable) or "thread".
        on_progress: called when a new sandbox child has imported a `(name, options)` spec's module (not timed)
            and when it has built the objective (`timeout_s` of its own, before the evaluation's).

    Returns:
        The record dict described in the module docstring.
    """
    if isolate not in ("process", "thread"):
        raise ValueError(f"isolate must be 'process' or 'thread'; got {isolate!r}")
    if not (isinstance(timeout_s, (int, float)) and 0 < timeout_s <= MAX_TIMEOUT_S):
        raise ValueError(f"timeout_s must be a number in (0, {MAX_TIMEOUT_S:g}]; got {timeout_s!r}")
    if isolate == "process":  # a spec is built in the sandbox child (`_sandbox_main` says why)
        record = _run_in_child(objective, params, int(seed), float(timeout_s), on_progress)
    else:
        record = _run_in_thread(_resolve_objective(objective), params, int(seed), float(timeout_s))
    record.setdefault("child_pid", None)
    record.update(trial_id=trial_id, pid=os.getpid(), node_id=_node_id())
    return record


def _node_id() -> str | None:
    try:
        import ray

        if ray.is_initialized():
            return ray.get_runtime_context().get_node_id()
    except Exception:  # pragma: no cover - outside Ray
        pass
    return None


def _evaluation_task(
    objective: Objective | tuple[str, Mapping[str, Any]],
    trial_id: str,
    params: Mapping[str, Any],
    seed: int,
    timeout_s: float,
    isolate: str,
    report_start: Any = None,
) -> dict[str, Any]:
    def report() -> None:
        if report_start is not None:  # the pool's handle: tell it when this attempt starts (it may have been queued)
            try:
                report_start.started.remote(trial_id, time.time())
            except Exception:  # noqa: BLE001 - the pool is gone: its owner sees that on the ref, not here
                pass

    report()
    # again once a new sandbox has imported and built the objective: the actor's backstop counts from there
    return evaluate_once(objective, trial_id, params, seed, timeout_s, isolate, on_progress=report)


def task_options(resources: Resources, max_retries: int = 1, isolate: str = "process") -> dict[str, Any]:
    """Ray task options for one evaluation: the objective's resources plus retries of a lost worker/node.

    `retry_exceptions` stays False: an exception of the objective is a result (a failed trial), not a
    reason to run it again; only the death of the worker process or its node makes Ray retry.

    The runtime environment (one marker variable, merged into the job's) gives evaluations Ray workers of
    their own: Ray reuses a worker only for tasks of the same runtime environment, so no evaluation lands in a
    worker where the user's other tasks ran multi-threaded torch, which would deadlock the sandbox forked from
    it (GNU OpenMP is not fork-safe; this happens through the library API too). Thread-isolated evaluations,
    which run the objective in the worker itself, get workers apart from the process-isolated ones.
    """
    if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
        raise ValueError(f"max_retries must be an integer >= 0; got {max_retries!r}")
    opts = resources.to_ray_options()
    opts.update(max_retries=max_retries, retry_exceptions=False, runtime_env=evaluation_runtime_env(isolate))
    return opts


_REMOTE: Any = None


def evaluation_task() -> Any:
    """The `ray.remote` function behind `submit_evaluation` (created on first use)."""
    global _REMOTE
    if _REMOTE is None:
        import ray

        _REMOTE = ray.remote(_evaluation_task)
    return _REMOTE


def submit_evaluation(
    objective: Any,
    trial_id: str,
    params: Mapping[str, Any],
    seed: int,
    *,
    resources: Resources,
    timeout_s: float = 600.0,
    max_retries: int = 1,
    isolate: str = "process",
    report_start: Any = None,
) -> Any:
    """Launch one evaluation as a Ray task; returns its `ObjectRef` (resolves to the record).

    Args:
        objective: an `Objective`, a `(name, options)` spec, or an `ObjectRef` of either (`ray.put` once).
        trial_id, params, seed, timeout_s, isolate: as in `evaluate_once`.
        resources: the objective's `Resources` (num_cpus, num_gpus, memory, custom).
        max_retries: Ray retries when the worker process or node dies.
        report_start: an actor handle whose `started(trial_id, time)` each attempt calls when it starts
            (the `EvaluationPool`: a task may wait in Ray's queue long after it was submitted).
    """
    return evaluation_task().options(**task_options(resources, max_retries, isolate)).remote(
        objective, trial_id, dict(params), int(seed), float(timeout_s), isolate, report_start
    )

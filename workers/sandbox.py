"""The sandbox: the child process of a Ray worker that runs its evaluations (``isolate="process"``), one after
another, killable at its timeout and unable to take the worker down with it.

ARCHITECTURE.md "The path of one evaluation", step 3. The child is forked once per objective (and per set of
accelerators Ray gives the task) and serves the worker's evaluations as Ray reuses the worker; a killed or
crashed one is replaced. A `(name, options)` spec is imported and built in the child, and a `ByValue`
objective (workers/by_value.py) unpickled there, so the worker never runs objective code. The child is the
leader of its own process group, which a guard and a timeout kill end whole, and it writes its Python stacks
on `STACK_SIGNAL` before a timeout kills it. The kernel-facing pieces are in
workers/processes.py; the task that uses `run_in_child` is workers/evaluate.py.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import gc
import multiprocessing
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from objectives.base import Objective
from workers.by_value import ByValue
from workers.call import call_objective, load_failure, spec_key
from workers.processes import (
    STACK_SIGNAL,
    adopt_orphans,
    die_with_parent,
    guard_group,
    kill_group,
    libc,
    reap,
    reap_orphans,
    stacks_of,
    track_sandbox,
)
from workers.records import MAX_TIMEOUT_S, MAX_TRACEBACK_CHARS, TrialResult, cap

__all__ = ["run_in_child"]


def _sandbox_main(
    conn: Any, parent_end: Any, objective: Objective | tuple[str, Mapping[str, Any]] | ByValue,
    parent_pid: int, stack_fd: int | None = None,
) -> None:
    """The sandbox child's loop: evaluate each `(params, seed)` received, answer with its `TrialResult`.

    A `(name, options)` spec is imported and built here, in the child, which answers first ("imported", then
    "built", or "failed" with the failure's result): the worker then never runs objective code (not even a
    module's top level) before it forks, which matters because GNU OpenMP (torch's CPU thread pool) is not
    fork-safe: a child forked from a process that ran a multi-threaded torch op deadlocks at its own first one
    (a user objective that warms up a model in its constructor would time out at every evaluation)."""
    try:
        parent_end.close()  # else the worker closing its end would never reach this child as EOF
        # multiprocessing marks this child daemonic (so the worker never waits for it at exit) and refuses
        # daemonic processes children; the objective may start a Pool or a DataLoader with workers. Here, in
        # the child, the flag only gates that refusal: `die_with_parent` and `kill_group` do the cleanup
        multiprocessing.current_process().daemon = False
        die_with_parent(parent_pid)
        if stack_fd is not None:  # where the worker reads this child's stacks when it runs past its timeout
            faulthandler.register(STACK_SIGNAL, file=stack_fd, all_threads=True, chain=False)
        # its own process group: a timeout kills the whole group, so an external simulator the objective
        # started (a subprocess still running) dies with it instead of living on beside the next evaluation
        try:
            os.setpgid(0, 0)
        except OSError:  # pragma: no cover - not permitted here: the kill below falls back to the child alone
            pass
        else:
            guard_group()
        if isinstance(objective, ByValue):
            started = time.time()
            try:
                # unpickling imports what the callable names: untimed, as a spec's import (nothing left to
                # build)
                objective = objective.load()
            except BaseException as exc:  # noqa: BLE001 - user code: its failure is the evaluation's record
                conn.send(("failed", load_failure(exc, started)))
                return
            conn.send(("imported", None))
            conn.send(("built", None))
        elif not isinstance(objective, Objective):
            from objectives.registry import import_objective_module, load_objective

            started = time.time()
            try:
                # not timed by the worker (the actor's backstop bounds it)
                import_objective_module(objective[0])
                conn.send(("imported", None))
                name, options = objective
                objective = load_objective(name, options)  # timed: timeout_s of its own
            except BaseException as exc:  # noqa: BLE001 - user code: its failure is the evaluation's record
                conn.send(("failed", load_failure(exc, started)))
                return
            conn.send(("built", None))
        while True:
            try:
                params, seed = conn.recv()
            except (EOFError, OSError):  # the worker closed the pipe or exited
                break
            result = call_objective(objective, params, seed)
            try:
                conn.send(result)
            except Exception as exc:  # an unpicklable metric or message
                conn.send(dataclasses.replace(result, metrics={}, message=f"result not transferable: {exc}"))
    finally:
        os._exit(0)


class _Sandbox:
    """A child process of this worker that runs its evaluations one at a time (``isolate="process"``).

    The child is forked when first needed and again whenever the objective changes. An `Objective` object is
    inherited without pickling (user objectives may hold closures, models, open datasets); a `(name, options)`
    spec, what the central actor sends, is built in the child (see `_sandbox_main`), and a `ByValue` objective
    (a callable of `qbatch.optimize`) is unpickled there. The child then
    serves evaluation after evaluation: no fork per evaluation, whose cost in a worker with torch loaded
    (copying page tables, then copy-on-write faults in the child) delays every result by milliseconds.
    A hang past the timeout kills it and a crash ends it; the next evaluation forks a fresh one.
    """

    def __init__(self) -> None:
        self.proc: Any = None
        self.conn: Any = None
        self.stack_file: Any = None  # where the child writes its stacks on STACK_SIGNAL (`stacks_of`)
        self.objective: Objective | None = None  # held, so `id` identifies it while the child lives
        self.spec_key: str | None = None  # or the spec the child built its objective from
        self.devices: tuple[str | None, ...] | None = None  # the accelerators the child was forked with
        self.lock = threading.Lock()

    def _serves(self, objective: Objective | tuple[str, Mapping[str, Any]] | ByValue) -> bool:
        if self.devices != _visible_devices():  # Ray gave this task other accelerators than the child has
            return False
        if isinstance(objective, Objective):
            return self.objective is objective
        return self.spec_key is not None and self.spec_key == spec_key(objective)

    def _fork(
        self, objective: Objective | tuple[str, Mapping[str, Any]] | ByValue,
        build_timeout_s: float = MAX_TIMEOUT_S, on_progress: Callable[[], None] | None = None,
    ) -> TrialResult | None:
        """Start a child for `objective`. For a spec, wait until the child has imported its module (not timed
        here), then built it (at most `build_timeout_s`), calling `on_progress` after each step; return the
        failed result if it could not (the child is then gone), else None."""
        self.close()
        try:
            libc()
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
        proc = ctx.Process(
            target=_sandbox_main,
            args=(child_conn, parent_conn, objective, os.getpid(), stack_fd),
            daemon=True,
        )
        # the child inherits the worker's objects frozen: its garbage collector then never walks (and so never
        # copies on write) the worker's heap
        adopt = adopt_orphans()
        gc.freeze()
        try:
            proc.start()  # not under the adoption lock: the child would inherit it held
        finally:
            gc.unfreeze()
        if adopt:  # (a sandbox dead before this line could be reaped by another thread's `reap_orphans`; its
            # exit code would then be lost: it would have to die within microseconds of its fork)
            track_sandbox(proc.pid)
        child_conn.close()
        if isinstance(objective, Objective):
            self.proc, self.conn, self.objective = proc, parent_conn, objective
            return None
        # spec_key is set once the child is ready: until then this sandbox serves nothing (set earlier, an
        # interrupted wait would leave it claiming the spec, and the next evaluation would read the late
        # "ready" as its result)
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
                    stacks = stacks_of(proc.pid, self.stack_file)
                    self.close(kill=True, wait=True)
                    text = cap(f"building the objective took longer than timeout_s={build_timeout_s:g} s and "
                               f"was killed (pid {proc.pid}); a constructor that needs longer needs a larger "
                               f"timeout_s{stacks}", MAX_TRACEBACK_CHARS)
                    message = f"timeout after {build_timeout_s:g} s while building the objective"
                    return TrialResult.failure("timeout", message, text, started, child_pid=proc.pid)
                step, failure = parent_conn.recv()
        except (EOFError, OSError):
            self.close(kill=True, wait=True)
            died = RuntimeError("the sandbox process died while building the objective (exit code "
                                f"{proc.exitcode})")
            return dataclasses.replace(load_failure(died, started), child_pid=proc.pid)
        except BaseException:  # interrupted (KeyboardInterrupt in a library call): no child half-built left
            self.close(kill=True, wait=True)
            raise
        if step == "failed":
            self.close(wait=True)
            failure.child_pid = proc.pid
            return failure
        self.spec_key = spec_key(objective)
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
                kill_group(proc.pid)
            if wait:
                reap(proc)
            else:
                threading.Thread(target=reap, args=(proc,), name="qbatch-reap", daemon=True).start()

    def run(
        self,
        objective: Objective | tuple[str, Mapping[str, Any]] | ByValue,
        params: Mapping[str, Any],
        seed: int,
        timeout_s: float,
        on_progress: Callable[[], None] | None = None,
    ) -> TrialResult:
        """Evaluate in the child (forked first if needed). A spec's build gets `timeout_s` of its own, then
        the evaluation its full `timeout_s`; `on_progress` is called after a new child's import and after its
        build (the task re-reports its start each time, so the central actor's backstop deadline counts from
        there)."""
        if self.proc is None or not self._serves(objective) or not self.proc.is_alive():
            failure = self._fork(objective, timeout_s, on_progress)
            if failure is not None:
                return failure
        proc = self.proc
        started = time.time()
        try:
            self.conn.send((dict(params), seed))
            reap_orphans()  # while the child evaluates: what earlier sandboxes and evaluations left behind
            answered = self.conn.poll(timeout_s)
        except (BrokenPipeError, EOFError, OSError):  # died between evaluations: read as a crash below
            answered = True
        except BaseException:  # interrupted: a child still busy with this evaluation must not serve the next
            self.close(kill=True, wait=True)
            raise
        if not answered:
            stacks = stacks_of(proc.pid, self.stack_file)
            self.close(kill=True, wait=True)
            return TrialResult.failure(
                "timeout", f"timeout after {timeout_s:g} s",
                cap(f"the evaluation ran past timeout_s={timeout_s:g} s and was killed (pid "
                    f"{proc.pid}){stacks}",
                    MAX_TRACEBACK_CHARS), started, child_pid=proc.pid)
        try:
            result = self.conn.recv()
        except (EOFError, OSError):
            result = None
        except BaseException:
            self.close(kill=True, wait=True)
            raise
        if result is not None:
            result.child_pid = proc.pid
            return result
        # no answer: the child died first (os.abort, a segfault, killed)
        self.close(kill=True, wait=True)
        code = proc.exitcode
        what = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else ("exit code "
                                                                                             f"{code}")
        return TrialResult.failure(
            "crash", f"crash ({what})",
            f"the evaluation process (pid {proc.pid}) died with {what} before returning a result", started,
            child_pid=proc.pid)


#: what Ray sets per task to give it its GPUs (and other accelerators); a child keeps the value it was forked
#: with
_DEVICE_VARIABLES = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


def _visible_devices() -> tuple[str | None, ...]:
    """The accelerators Ray assigned to the current task. A kept sandbox child forked for an earlier task
    would run on that task's GPU while this one's stays idle, so a change forks a new child."""
    return tuple(os.environ.get(k) for k in _DEVICE_VARIABLES)


_SANDBOX = _Sandbox()


def run_in_child(
    objective: Objective | tuple[str, Mapping[str, Any]] | ByValue, params: Mapping[str, Any], seed: int,
    timeout_s: float, on_progress: Callable[[], None] | None = None,
) -> TrialResult:
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

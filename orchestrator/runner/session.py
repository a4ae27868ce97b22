"""The Ray a run uses: the caller's, a cluster's by address, or a local one qbatch starts and shuts down.

ARCHITECTURE.md "The path of one evaluation", step 1: `ray_session` is one run's use of Ray, a context
manager. Where this process has initialized Ray already (a notebook's `ray.init`), that Ray is used as it is
and left running. Otherwise the run connects to `address` or starts a local Ray (`ray.init(num_cpus=...,
include_dashboard=False)`, bound to loopback), and that Ray is the process's own (`OwnRay`): runs of several
threads share it, and the last one to end shuts it down and puts back the SIGTERM handler from before
`ray.init`.

Ray puts the driver's working folder and its script's folder first on each worker's `sys.path`. Where one of
them holds a module named like a package of the library (a user's `objectives.py`), the Ray qbatch starts or
connects to gets a worker setup hook that binds those names to the installed packages first
(`_packages_first`).
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from orchestrator.errors import ConfigError, UsageError
from orchestrator.runner.address import (
    _TOKEN_SOURCES,
    _check_reachable,
    _connection_error_line,
    _other_ray,
    _token_refusal,
)
from orchestrator.runner.signals import _interrupts_held

logger = logging.getLogger(__name__)

#: the address a local Ray started by qbatch binds to
LOCAL_IP = "127.0.0.1"
#: the library's import packages (ARCHITECTURE.md "Layout"), top-level names a user's module can shadow
PACKAGES = ("objectives", "workers", "orchestrator")


class OwnRay:
    """The Ray that qbatch started or connected to in this process, and the runs that use it.

    Two threads' `run_experiment` calls share it, and the first to end must not shut it down under the other,
    whose thread would then die with a SystemExit: `acquire` counts a run in, `release` counts it out, and the
    last `release` shuts it down (interrupts held meanwhile, `_interrupts_held`).

    Attributes:
        runs: runs of this process that use this Ray (guarded by a lock).
        sigterm_before: the process's SIGTERM handler before `acquire` started or connected Ray (`ray.init`
            replaces it; the last `release` puts it back): a notebook or a script that ran qbatch would
            otherwise keep Ray's handler after its Ray is gone. None when none is pending.
    """

    def __init__(self) -> None:
        self.runs = 0
        self.sigterm_before: Any = None
        self._lock = threading.Lock()
        #: set to let the thread that started this Ray end (`_in_keeper_thread`); None when none waits
        self._keeper_stop: threading.Event | None = None

    def acquire(self, address: str | None, num_cpus: int | None) -> bool:
        """Connect to `address` or start a local Ray unless one is running; True when the Ray is qbatch's own
        (this call or another run of this process started or connected it): each True is paired with one
        `release`, which shuts it down when the last run using it ends."""
        import ray

        with self._lock:  # two threads' runs: one starts Ray, the other waits and shares it
            if self.runs and ray.is_initialized():
                _check_same_ray(address, num_cpus, shared=True)
                self.runs += 1
                return True
            started = self._acquire_unlocked(address, num_cpus)
            if started:
                self.runs = 1
            return started

    def _acquire_unlocked(self, address: str | None, num_cpus: int | None) -> bool:
        import ray

        # the caller's Ray (a notebook's `ray.init`): used as it is, and left running
        if ray.is_initialized():
            _check_same_ray(address, num_cpus)
            for path in _shadowing_modules():  # its workers cannot get the hook of `_worker_setup` any more
                print(f"qbatch: {path} is named like one of qbatch's packages and is first on the path of "
                      "this Ray's workers (Ray puts the driver's folders there), where it can break the run; "
                      "rename it, or let qbatch start Ray (no ray.init before the "
                      "run)", file=sys.stderr, flush=True)
            return False
        if threading.current_thread() is threading.main_thread():
            # ray.init puts its own handler there. One still pending is the process's own: a shared Ray that
            # another thread shut down could not put it back (signals are set in the main thread only), and
            # the handler now would be Ray's from then
            if self.sigterm_before is None:
                self.sigterm_before = signal.getsignal(signal.SIGTERM)
        # Ray's processes die with the thread that started them: a thread of their own, kept until shutdown
        else:
            self._in_keeper_thread(_start_ray, address, num_cpus)
            return True
        _start_ray(address, num_cpus)
        return True

    def _in_keeper_thread(self, fn: Any, *args: Any) -> None:
        """Run `fn(*args)` in a daemon thread that then waits until `_shutdown`. A local Ray started in a
        caller's thread (`run_experiment` from a thread pool) would lose its GCS when that thread ends,
        because Ray sets its
        processes to be killed with the thread that forked them: another thread's run sharing that Ray would
        then die."""
        stop, ready, failed = threading.Event(), threading.Event(), []

        def keep() -> None:
            try:
                fn(*args)
            except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread below
                failed.append(exc)
            ready.set()
            if not failed:
                stop.wait()

        threading.Thread(target=keep, name="qbatch-ray-keeper", daemon=True).start()
        ready.wait()
        if failed:
            raise failed[0]
        self._keeper_stop = stop

    def release(self) -> None:
        """End one run's use of this Ray; the last one shuts it down (interrupts held meanwhile,
        `_interrupts_held`) and puts back the SIGTERM handler from before."""
        import ray

        with self._lock:
            self.runs = max(0, self.runs - 1)
            if self.runs:
                return
            self._shutdown(ray)

    def _shutdown(self, ray: Any) -> None:
        with _interrupts_held():
            ray.shutdown()
        if self._keeper_stop is not None:
            self._keeper_stop.set()
            self._keeper_stop = None
        if self.sigterm_before is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self.sigterm_before)
            self.sigterm_before = None


#: the process's one `OwnRay`. A module global because Ray is one per process: `ray.init` joins the whole
#: process to one Ray, so the runs of every thread must count against the same object
OWN_RAY = OwnRay()


@contextlib.contextmanager
def ray_session(address: str | None, num_cpus: int | None) -> Iterator[bool]:
    """One run's use of Ray for the block: `OWN_RAY.acquire` on entry, and, when that gave the process's own
    Ray (the value yielded), `OWN_RAY.release` on exit however the block ends (an error, a Ctrl-C); a Ray the
    caller started stays up."""
    own = OWN_RAY
    started = own.acquire(address, num_cpus)
    try:
        yield started
    finally:
        if started:
            own.release()


def _start_ray(address: str | None, num_cpus: int | None) -> None:
    import ray

    if address:
        _check_reachable(address)
        try:
            ray.init(
                address=address, include_dashboard=False if address == "local" else None, **_worker_setup()
            )
        except ValueError as exc:  # e.g. "Invalid address format"
            raise ConfigError(f"`--address` {address!r}: {str(exc).splitlines()[0]}") from None
        except ConnectionError as exc:  # "auto" with no Ray running on this machine; a token refused
            raise UsageError(_token_refusal(address, exc) or f"`--address` {address!r}: "
                                                             f"{_connection_error_line(exc)}"
                             ) from None
        except Exception as exc:
            if type(exc).__name__ != "AuthenticationError":  # ray.exceptions' (Ray >= 2.52)
                raise
            # RAY_AUTH_MODE=token and no token in this process: Ray's message, then where the token goes
            reason = str(getattr(exc, "message", exc)).strip().splitlines()[0].rstrip(".")
            raise UsageError(f"`--address` {address!r}: {reason}; put the cluster's token in "
                             f"{_TOKEN_SOURCES}") from None
    else:
        _init_local_ray(num_cpus)


def _check_same_ray(address: str | None, num_cpus: int | None, shared: bool = False) -> None:
    """With Ray already initialized in this process: refuse an `address` naming another Ray; say that
    `num_cpus` is ignored. `shared`: the Ray another run of this process started, which it still uses."""
    import ray

    try:
        current = ray.get_runtime_context().gcs_address
    except Exception:  # noqa: BLE001 -- e.g. a Ray client connection: nothing to compare with
        current = None
    if current and address and _other_ray(address, current):
        # refused: the run would go to the local Ray without a word, not to the cluster asked for
        first = ("wait for this process's other qbatch runs on it to end" if shared else "call "
                                                                                         "ray.shutdown() "
                                                                                         "first")
        raise UsageError(f"`address` {address!r}: this process is already connected to the Ray at {current}; "
                         f"{first} to use another, or leave `address` out to use that one")
    if num_cpus is not None:
        logger.warning(
            "qbatch: `num_cpus` %s ignored: the Ray this process connected to before %skeeps its "
            "own CPUs; limit the run with `max_concurrent`",
            num_cpus,
            f"({current}) " if current else "",
        )


def _init_local_ray(num_cpus: int | None) -> None:
    """Start a new local Ray that listens on loopback only.

    `address="local"` starts a fresh instance even when RAY_ADDRESS or a `ray start` on this machine names
    another cluster (a local run never sends the user's objective elsewhere). Ray resolves a node IP of
    127.0.0.1 to the machine's reachable address unless multi-node clusters are disabled, which is exactly
    what a local run is; the switch is set while Ray's processes start (they inherit it) and then restored.
    """
    import ray
    from ray._private import ray_constants

    env_key = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
    saved_env, saved_const = os.environ.get(env_key), getattr(ray_constants, "ENABLE_RAY_CLUSTER", None)
    os.environ[env_key] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, _node_ip_address=LOCAL_IP,
                 **_worker_setup())
    finally:
        if saved_env is None:
            os.environ.pop(env_key, None)
        else:
            os.environ[env_key] = saved_env
        if saved_const is not None:
            ray_constants.ENABLE_RAY_CLUSTER = saved_const


def _shadowing_modules() -> list[str]:
    """The modules of the driver's working folder and script folder (what Ray puts first on its workers'
    `sys.path`) that are named like one of `PACKAGES` and are not that package."""
    folders = [os.path.abspath(os.curdir)]
    if sys.argv and sys.argv[0]:
        folders.append(os.path.dirname(os.path.realpath(sys.argv[0])))
    found = []
    for name in PACKAGES:
        ours = {os.path.realpath(p) for p in getattr(sys.modules.get(name), "__path__", None) or []}
        for folder in dict.fromkeys(folders):
            package = os.path.join(folder, name)
            if os.path.isfile(os.path.join(package, "__init__.py")) and os.path.realpath(package) not in ours:
                found.append(package)
            found += [package + suffix for suffix in importlib.machinery.all_suffixes()
                      if os.path.isfile(package + suffix)]
    return found


def _worker_setup() -> dict[str, Any]:
    """`ray.init`'s keyword arguments for this driver's workers: a `runtime_env` with the setup hook of
    `_packages_first` where a module of the driver's folders shadows one of `PACKAGES` (`_shadowing_modules`),
    else none (the job's runtime environment stays the default)."""
    if not _shadowing_modules():
        return {}
    return {"runtime_env": {"worker_process_setup_hook": _packages_first(PACKAGES)}}


def _packages_first(names: tuple[str, ...]) -> Callable[[], None]:
    """A Ray `worker_process_setup_hook` that binds `names` to the installed packages in each worker. The hook
    runs before Ray puts the driver's folders on the worker's `sys.path`: what `find_spec` finds then is the
    installation, and a finder first on `sys.meta_path` keeps it so (the names' submodules follow from the
    package's `__path__`). Made inside a function, so that cloudpickle sends it by value: imported by name,
    this module would load the whole runner (torch, the actor) in every worker."""

    def bind() -> None:
        import importlib.util
        import sys

        where = {}
        for name in names:
            spec = importlib.util.find_spec(name)
            if spec is not None and spec.origin and spec.submodule_search_locations:
                where[name] = (spec.origin, list(spec.submodule_search_locations))

        class InstalledPackages:
            @staticmethod
            def find_spec(fullname: str, path: Any = None, target: Any = None) -> Any:
                if fullname not in where:
                    return None
                origin, locations = where[fullname]
                return importlib.util.spec_from_file_location(
                    fullname, origin, submodule_search_locations=locations
                )

        sys.meta_path.insert(0, InstalledPackages)

    return bind

"""Drive one experiment on Ray: validate, connect, create the run directory and the central actor, show progress.

ARCHITECTURE.md "The path of one evaluation", step 1. `run_experiment` is what
`qbatch run` calls and `resume_experiment` what `qbatch resume` calls. The config is validated, the
objective built and the search space checked *before* Ray starts or a run directory is made. A local Ray
starts with `ray.init(num_cpus=..., include_dashboard=False)`; `address` connects to a running cluster
instead. Run tests and local runs inside `scripts/loopback` so a local Ray binds to loopback only.

The central actor (orchestrator/actor.py) is created with `max_restarts`: if it dies it is restarted,
rebuilds its state from the event log and the driver simply calls `run` again. The evaluation tasks are
owned by a separate `EvaluationPool` actor (workers/pool.py) that the driver creates, so they keep running
through such a restart and their results wait for the new actor. If the driver itself dies,
`resume_experiment(run_dir)` replays the log and re-dispatches every trial that was proposed or started but
never finished; completed results are never repeated (ingestion is exactly-once by trial id).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import signal
import socket
import sys
import threading
import time
from typing import Any, Iterator, Mapping, TextIO

from orchestrator.actor import CentralActor, RunAbortedError, default_max_concurrent
from orchestrator.errors import ConfigError, QbatchError, UsageError
from workers.pool import EvaluationPool
from workers.records import cap

__all__ = ["NAMESPACE", "RunAbortedError", "actor_name", "resume_experiment", "run_experiment"]

#: Ray namespace of the central actors; each is named after its run directory (`actor_name`)
NAMESPACE = "qbatch"
#: restarts of a crashed central actor before the run gives up (each restart replays the log)
ACTOR_RESTARTS = 3
#: the address a local Ray started by qbatch binds to
LOCAL_IP = "127.0.0.1"


def actor_name(run_dir: str) -> str:
    """Name of the central actor of `run_dir` (find it with `ray.get_actor(actor_name(d), namespace=NAMESPACE)`)."""
    return "qbatch:" + os.path.abspath(run_dir) if "://" not in run_dir else "qbatch:" + run_dir


def pool_name(run_dir: str) -> str:
    """Name of the evaluation pool of `run_dir`, in `NAMESPACE`. Its own prefix: a suffix
    (`actor_name(d) + ":pool"`) would make the pool of `d` the central actor of a run directory `d:pool`."""
    return "qbatch-pool:" + actor_name(run_dir)[len("qbatch:"):]


def _name_taken(name: str, run_dir: str, new_run: bool) -> UsageError:
    """A run whose actor's name another actor on this Ray holds (the same run directory path, e.g. from another
    machine or container sharing the cluster): one line, and a new run, which recorded nothing, leaves no run
    directory behind (rather than a Ray traceback and a rerun refused as "already holds a run")."""
    from orchestrator.store import RunStore

    if not new_run:
        return UsageError(f"an actor named {name!r} (namespace {NAMESPACE!r}) is already on this Ray: a qbatch run "
                          f"with the run directory path {run_dir} goes on there (from another machine or container?); "
                          "resume this run once that one has ended, or on another Ray")
    then = ""
    if RunStore.discard_unstarted(run_dir):
        then = "; nothing was recorded and the run directory was cleared"
    return UsageError(f"an actor named {name!r} (namespace {NAMESPACE!r}) is already on this Ray: another qbatch "
                      f"run uses the run directory path {run_dir} (from another machine or container?); choose "
                      f"another --run-dir{then}")


def _with_absolute_paths(cfg: Any, objective: Any) -> Any:
    """`cfg` with the objective's path options (`Objective.path_options`, e.g. the laser's `csv_path`) made
    absolute against the current directory, `~` expanded: the run stores this config, and the actor, the workers
    and `qbatch resume` rebuild the objective from it wherever they run."""
    import dataclasses
    from types import MappingProxyType

    options = dict(cfg.objective.options)
    for key in getattr(objective, "path_options", ()):
        if isinstance(options.get(key), (str, os.PathLike)):
            options[key] = os.path.abspath(os.path.expanduser(os.fspath(options[key])))
    if options == dict(cfg.objective.options):
        return cfg
    return dataclasses.replace(cfg, objective=dataclasses.replace(cfg.objective, options=MappingProxyType(options)))


def _check_objective(cfg: Any) -> Any:
    """Build the objective, the (overridden) space, the model and the proposer before Ray starts; errors name
    the config key."""
    from objectives.registry import inspect_objective

    module, sep, attr = str(cfg.objective.name).partition(":")
    if sep and module == "__main__":  # the driver imports it; the central actor and the workers never can
        raise ConfigError(
            f"`objective.name` {cfg.objective.name!r} is defined in __main__ (a script or notebook), which the "
            f"central actor and the evaluation workers cannot import: put it in a module file (e.g. "
            f"my_objective.py beside the script) and name it 'my_objective:{attr}'")
    try:
        objective = inspect_objective(cfg.objective.name, dict(cfg.objective.options))
    except ValueError as exc:  # chained: a library user sees the objective's own traceback
        # cut: an objective's message echoes the bad value, which may be megabytes long
        raise ConfigError(f"`objective`: {_cut(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)}") from exc
    except Exception as exc:  # an option the objective does not check (a type, a size), or its own bug
        msg = str(exc).splitlines()[0] if str(exc) else ""
        options = dict(cfg.objective.options)
        what = (f"`objective.options` of {cfg.objective.name!r} ({options}) were refused" if options else
                f"`objective` {cfg.objective.name!r} failed to build (no options given)")  # not "options refused"
        raise ConfigError(f"{what}: {type(exc).__name__}: {msg}"[:600]) from exc
    if sep:  # a user objective: the central actor and every worker build it again, and must get this space
        _check_same_space(cfg, objective)
    cfg.build_space(objective.space)
    cfg.resolve_direction(objective.direction)
    # build the model and the proposer once here: a bad option of either is a ConfigError naming it now,
    # not an actor that fails to start (or a refit that fails) after Ray is up and the run directory exists
    from orchestrator.ask_tell import AskTellOptimizer

    AskTellOptimizer.from_config(cfg, objective)  # its constructor checks the model, proposer and calibrator
    return objective


def _check_same_space(cfg: Any, objective: Any) -> None:
    """Build the user objective a second time and raise `ConfigError` naming the first parameter whose
    declared space differs: a constructor that draws its space at random gives the central actor another
    space than the one the run pinned, which surfaced as an error about a `space.<name>` the user never wrote."""
    from objectives.registry import inspect_objective

    try:
        again = inspect_objective(cfg.objective.name, dict(cfg.objective.options))
    except Exception:  # noqa: BLE001 - it built once: a second failure is the actor's to report
        return
    first, second = dict(objective.space), dict(again.space)
    for name in sorted(set(first) | set(second), key=str):
        a, b = first.get(name), second.get(name)
        if a != b:
            raise ConfigError(
                f"`objective` {cfg.objective.name!r} declares a different search space each time it is built "
                f"(parameter {name!r}: {_cut(repr(a), 120)}, then {_cut(repr(b), 120)}); the central actor and the "
                "workers build it again, so its space must not change between builds (draw it from a fixed seed)")


#: longest message of an objective a config error quotes (head and tail kept)
MAX_QUOTED_CHARS = 600


def _cut(text: str, limit: int = MAX_QUOTED_CHARS) -> str:
    """`text` on one line, its middle cut (and the cut counted) when it is longer than `limit`."""
    return cap(" ".join(text.split()), limit, head=limit * 2 // 3, sep=" ")


#: seconds with evaluations waiting in Ray's queue and none running before the driver says so (`_QueueWatch`)
STARVED_WARN_S = 60.0
#: how often the driver asks the evaluation pool how many of its evaluations have started
POOL_POLL_S = 2.0
#: how long the driver waits at the run's end for the central actor's last notices (`_ActorNotices.flush`)
NOTICE_FLUSH_S = 10.0
#: `actor_options` keys `run_experiment` / `resume_experiment` pass on to `CentralActor`
ACTOR_OPTIONS = ("queue_low", "refit_interval_s", "isolate", "max_refit_failures")


def _check_run_args(max_concurrent: Any, num_cpus: Any, actor_options: Mapping[str, Any] | None) -> dict[str, Any]:
    """Check the keyword arguments of `run_experiment` / `resume_experiment` before Ray starts or the run
    directory is made (a bad one would fail in the actor, leaving a run dir that blocks a rerun)."""
    for key, v in (("max_concurrent", max_concurrent), ("num_cpus", num_cpus)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ConfigError(f"`{key}` must be None or an integer >= 1; got {v!r}")
    opts = dict(actor_options or {})
    unknown = sorted(set(opts) - set(ACTOR_OPTIONS))
    if unknown:
        raise ConfigError(f"unknown `actor_options` {unknown}; valid: {list(ACTOR_OPTIONS)}")
    if opts.get("isolate", "process") not in ("process", "thread"):
        raise ConfigError(f"`actor_options.isolate` must be 'process' or 'thread'; got {opts['isolate']!r}")
    q = opts.get("queue_low")
    if q is not None and (isinstance(q, bool) or not isinstance(q, int) or q < 0):
        raise ConfigError(f"`actor_options.queue_low` must be None or an integer >= 0; got {q!r}")
    r = opts.get("refit_interval_s", 0.5)
    if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 <= r < float("inf"):
        raise ConfigError(f"`actor_options.refit_interval_s` must be a finite number >= 0; got {r!r}")
    m = opts.get("max_refit_failures", 5)
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:  # the actor's own check, before Ray starts
        raise ConfigError(f"`actor_options.max_refit_failures` must be an integer >= 1; got {m!r}")
    return opts


def _host_port(address: str) -> tuple[set[str], int] | None:
    """The IP addresses and port of a "host:port" address ("[::1]:6379" too), or None when it is not one."""
    text = address.strip().rstrip("/")
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        return None
    host = host.strip("[]")
    try:
        ips = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except (OSError, UnicodeError):
        return None
    return ips, int(port)


def _other_ray(address: str, current: str) -> bool:
    """Whether `address` certainly names another Ray than the one at `current` (its GCS "ip:port"): a "ray://"
    address (a client connection, where this process is a driver of `current`), or a "host:port" whose host
    resolves to none of `current`'s addresses or whose port differs ("localhost:6379" is "127.0.0.1:6379").
    "auto", "local" and what cannot be resolved are not refused."""
    if address in ("auto", "local"):
        return False
    if address.startswith("ray://"):
        return True
    asked, here = _host_port(address), _host_port(current)
    if asked is None or here is None:
        return False
    return asked[1] != here[1] or not (asked[0] & here[0])


def _ensure_ray(address: str | None, num_cpus: int | None) -> bool:
    """Connect to `address` or start a local Ray unless one is running; True when the Ray is qbatch's own (this
    call or another run of this process started or connected it): each True is paired with one
    `_shutdown_local_ray`, which shuts it down when the last run using it ends."""
    global _OWN_RAY_RUNS
    import ray

    with _OWN_RAY_LOCK:  # two threads' runs: one starts Ray, the other waits and shares it
        if _OWN_RAY_RUNS and ray.is_initialized():
            _check_same_ray(address, num_cpus, shared=True)
            _OWN_RAY_RUNS += 1
            return True
        started = _ensure_ray_unlocked(address, num_cpus)
        if started:
            _OWN_RAY_RUNS = 1
        return started


def _ensure_ray_unlocked(address: str | None, num_cpus: int | None) -> bool:
    import ray

    if ray.is_initialized():  # the caller's Ray (a notebook's `ray.init`): used as it is, and left running
        _check_same_ray(address, num_cpus)
        return False
    global _SIGTERM_BEFORE_RAY
    if threading.current_thread() is threading.main_thread():
        # ray.init puts its own handler there. One still pending is the process's own: a shared Ray that another
        # thread shut down could not put it back (signals are set in the main thread only), and the handler
        # now would be Ray's from then
        if _SIGTERM_BEFORE_RAY is None:
            _SIGTERM_BEFORE_RAY = signal.getsignal(signal.SIGTERM)
    else:  # Ray's processes die with the thread that started them: a thread of their own, kept until shutdown
        _in_keeper_thread(_start_ray, address, num_cpus)
        return True
    _start_ray(address, num_cpus)
    return True


def _in_keeper_thread(fn: Any, *args: Any) -> None:
    """Run `fn(*args)` in a daemon thread that then waits until `_shutdown_ray_unlocked`. A local Ray started in
    a caller's thread (`run_experiment` from a thread pool) would lose its GCS when that thread ends, because Ray
    sets its processes to be killed with the thread that forked them: another thread's run sharing that Ray would
    then die."""
    global _KEEPER_STOP
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
    _KEEPER_STOP = stop


def _start_ray(address: str | None, num_cpus: int | None) -> None:
    import ray

    if address:
        _check_reachable(address)
        try:
            ray.init(address=address, include_dashboard=False if address == "local" else None)
        except ValueError as exc:  # e.g. "Invalid address format"
            raise ConfigError(f"`--address` {address!r}: {str(exc).splitlines()[0]}") from None
        except ConnectionError as exc:  # "auto" with no Ray running on this machine
            raise UsageError(f"`--address` {address!r}: {_connection_error_line(exc)}") from None
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
        first = ("wait for this process's other qbatch runs on it to end" if shared else "call ray.shutdown() first")
        raise UsageError(f"`address` {address!r}: this process is already connected to the Ray at {current}; "
                         f"{first} to use another, or leave `address` out to use that one")
    if num_cpus is not None:
        print(f"qbatch: `num_cpus` {num_cpus} ignored: the Ray this process connected to before "
              f"{'(' + current + ') ' if current else ''}keeps its own CPUs; limit the run with `max_concurrent`",
              file=sys.stderr, flush=True)


def _connection_error_line(exc: BaseException) -> str:
    """The first line of Ray's connection error, with the first line of each cause it chains that says more
    (a cluster with token authentication fails as "Failed to connect to Ray cluster at ...", and only the
    cause, an AuthenticationError, names RAY_AUTH_MODE)."""
    lines = [(str(exc).strip().splitlines() or [type(exc).__name__])[0]]
    cause, seen = exc.__cause__ or exc.__context__, {id(exc)}
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        first = (str(cause).strip().splitlines() or [""])[0]
        if first and all(first not in line for line in lines):
            lines.append(f"{type(cause).__name__}: {first}")
        cause = cause.__cause__ or cause.__context__
    return "; ".join(lines)[:600]


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Refuse a ``host:port`` (or ``ray://host:port``) address where nothing accepts a connection.

    Ray itself retries such an address for minutes (its GCS client) before it fails with a timeout; one TCP
    connect tells the user at once. "auto" is checked at the address Ray resolves it to (`_auto_ray_address`): a
    driver killed before it shut its local Ray down leaves its record behind, and a Ray in another network
    namespace shows its GCS process; "auto" then hung for minutes (found in a full test run). "local" is Ray's; a malformed
    address is left to Ray's parser, whose error the caller reports.
    """
    if address == "auto":
        found = _auto_ray_address()
        if found:
            try:
                _check_reachable(found, timeout_s)
            except UsageError:
                raise UsageError(
                    f"`--address` 'auto': the Ray it finds ({found}: RAY_ADDRESS, the address the last Ray on this "
                    "machine recorded, or a running GCS process) does not answer; is that Ray gone (a run killed "
                    "before it shut its Ray down leaves its record), or in another network namespace? Start one "
                    "with `ray start --head`, or leave --address out for a local Ray") from None
        return
    if address == "local":
        return
    target = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit():
        return
    host = host.strip("[]")
    if not 0 < int(port) < 65536:
        raise UsageError(f"`--address` {address!r}: port {port} is not in 1-65535")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as conn:
            speaks_http1 = _answers_http1(conn, timeout_s)
    except OSError as exc:  # refused, unreachable, unknown host, timeout
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise UsageError(
            f"`--address` {address!r}: nothing answers at {host}:{port} ({reason}); is the cluster's head "
            "running (`ray start --head`), and is this its address?"
        ) from None
    if speaks_http1:
        raise UsageError(
            f"`--address` {address!r}: {host}:{port} answers as a web server (HTTP/1) does, such as Ray's dashboard ("
            "the address `ray job submit` takes), not Ray's GCS; give the address `ray start --head` printed "
            "(port 6379 by default), or 'auto' on a node of the cluster")


#: the HTTP/2 connection preface and an empty SETTINGS frame (RFC 9113 §3.4): what a gRPC client sends first
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def _answers_http1(conn: socket.socket, timeout_s: float) -> bool:
    """Whether the server on `conn` answers a gRPC client's first bytes in text, as an HTTP/1 server does ("HTTP/1.1
    400 ...", or an HTML error page). Ray's GCS and client server speak gRPC (HTTP/2) and answer with a binary
    SETTINGS frame (a TLS server with a binary alert). The dashboard's port (8265, which the README's
    `ray job submit` uses) passes the connect check, and `ray.init` then waits 14 minutes. No answer,
    or a reset, counts as not HTTP/1: Ray decides."""
    try:
        conn.settimeout(min(timeout_s, 2.0))
        conn.sendall(_HTTP2_PREFACE)
        head = conn.recv(16)[:4]
    except OSError:
        return False
    return bool(head) and all(32 <= b < 127 or b in (9, 10, 13) for b in head)


def _auto_ray_address() -> str | None:
    """The address `ray.init("auto")` would connect to (RAY_ADDRESS, the one the last Ray on this machine
    recorded, or a running GCS process's), or None when there is none (Ray then says so itself)."""
    try:
        from ray._private.services import get_ray_address_from_environment

        found = get_ray_address_from_environment("auto", None)
    except Exception:  # noqa: BLE001 - none found (Ray's ConnectionError), or a private Ray API that moved
        return None
    return found if isinstance(found, str) and found not in ("auto", "local", "") else None


#: the process's SIGTERM handler before `_ensure_ray` started or connected Ray (`ray.init` replaces it;
#: `_shutdown_local_ray` puts it back): a notebook or a script that ran qbatch would otherwise keep Ray's
#: handler after its Ray is gone
_SIGTERM_BEFORE_RAY: Any = None
#: runs of this process that use the Ray `_ensure_ray` started or connected to (guarded by `_OWN_RAY_LOCK`):
#: two threads' `run_experiment` calls share it, and the first to end must not shut it down under the other,
#: whose thread would then die with a SystemExit
_OWN_RAY_RUNS = 0
_OWN_RAY_LOCK = threading.Lock()
#: set to let the thread that started the process's own Ray end (`_in_keeper_thread`); None when none waits
_KEEPER_STOP: threading.Event | None = None


def _shutdown_local_ray() -> None:
    """End one run's use of the Ray `_ensure_ray` started or connected to; the last one shuts it down
    (interrupts held meanwhile, `_interrupts_held`) and puts back the SIGTERM handler from before."""
    global _OWN_RAY_RUNS
    import ray

    with _OWN_RAY_LOCK:
        _OWN_RAY_RUNS = max(0, _OWN_RAY_RUNS - 1)
        if _OWN_RAY_RUNS:
            return
        _shutdown_ray_unlocked(ray)


def _shutdown_ray_unlocked(ray: Any) -> None:
    global _SIGTERM_BEFORE_RAY, _KEEPER_STOP
    with _interrupts_held():
        ray.shutdown()
    if _KEEPER_STOP is not None:
        _KEEPER_STOP.set()
        _KEEPER_STOP = None
    if _SIGTERM_BEFORE_RAY is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _SIGTERM_BEFORE_RAY)
        _SIGTERM_BEFORE_RAY = None


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
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, _node_ip_address=LOCAL_IP)
    finally:
        if saved_env is None:
            os.environ.pop(env_key, None)
        else:
            os.environ[env_key] = saved_env
        if saved_const is not None:
            ray_constants.ENABLE_RAY_CLUSTER = saved_const


def _wait_for_actor(actor: Any, timeout_s: float = 600.0) -> int:
    """Wait until the central actor answers again (after a restart it has replayed the log); its pid.

    Raises the actor's error when it is dead for good (restarts exhausted) or still unreachable after `timeout_s`.
    """
    import ray

    t0 = time.time()
    while True:
        try:
            return ray.get(actor.pid.remote(), timeout=60)
        except (ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError):
            if time.time() - t0 > timeout_s:
                raise
            time.sleep(0.5)


def _actor_pid(actor: Any, run_dir: str, after_error: bool = False, new_run: bool = False) -> int:
    """The central actor's pid: at its start, or `after_error` once it answers again (`_wait_for_actor`). An actor
    that could not start, or died for good (its restarts used up), is a `QbatchError` of one line naming the
    cause and how to continue, not Ray's traceback. A `new_run` whose actor could not start has recorded
    nothing: its run directory is cleared (`RunStore.discard_unstarted`), so that the same command runs again
    once the cause is fixed (a cluster that cannot import the user's objective would otherwise leave a run
    directory that refuses the rerun, and a resume that fails the same way)."""
    import ray

    try:
        return _wait_for_actor(actor) if after_error else ray.get(actor.pid.remote())
    except ray.exceptions.RayActorError as exc:
        line = _error_line(exc)
        if not after_error and "is being written by another run" in line:
            # lost the writer lock to a run or resume started at the same moment: refused as before Ray starts
            # (exit 2), without the resume hint that would be refused the same way
            raise UsageError(f"the central actor of {run_dir} could not start: {line}") from None
        hint = ""
        if re.search(r"cannot import module|ModuleNotFoundError|No module named", line):
            hint = (" (the driver imported the objective, the central actor's Ray worker could not: on a cluster, "
                    "start its nodes with the module on their PYTHONPATH, or submit the run with `ray job submit "
                    "--working-dir`)")
        what = "died for good (its restarts are used up)" if after_error else "could not start"
        then = f"every recorded result is in the log, `qbatch resume {run_dir}` continues the run"
        if not after_error and new_run and _discard_when_released(actor, run_dir):
            then = "nothing was recorded and the run directory was cleared: run the same command again once that " \
                "is fixed"
        raise QbatchError(f"the central actor of {run_dir} {what}: {line}{hint}; {then}") from None


def _discard_when_released(actor: Any, run_dir: str, wait_s: float = 15.0) -> bool:
    """`RunStore.discard_unstarted` once the failed actor's process has let go of the writer lock (it took the
    lock before it failed, and its worker exits a moment after Ray reports the failure)."""
    import ray

    from orchestrator.store import RunStore

    try:
        ray.kill(actor)
    except Exception:  # noqa: BLE001 -- already gone
        pass
    deadline = time.monotonic() + wait_s
    while RunStore.is_being_written(run_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    return RunStore.discard_unstarted(run_dir)


def _error_line(exc: BaseException) -> str:
    """The last `SomeError: message` line of an exception's text (Ray wraps the cause's traceback), else its first."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    causes = [ln for ln in lines if re.match(r"^[\w.]+(Error|Exception|Exit)\b.*:", ln)]
    return (causes or lines or [type(exc).__name__])[-1 if causes else 0][:400]


def _absolute(run_dir: str) -> str:
    """Local run directories are made absolute (the actor's worker process has another working directory), a
    leading `~` expanded as a shell would (not a folder named `~` in the working directory)."""
    return run_dir if "://" in run_dir else os.path.abspath(os.path.expanduser(run_dir))


@contextlib.contextmanager
def _signal_handlers(handlers: Mapping[int, Any]) -> Iterator[None]:
    """Install `handlers` (signal -> handler) for the block and put the previous ones back afterwards (the
    default where there was none); outside the main thread, where Python cannot set handlers, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def _sigterm_interrupts() -> Any:
    """While a run is driven, SIGTERM (what `timeout`, SLURM and systemd send) interrupts it as Ctrl-C does: a
    `KeyboardInterrupt` in the main thread, so `qbatch` exits 130 with the resume hint. Ray's driver handler
    (`sys.exit`) and its C++ failure handler (a stack dump) would make it exit 1, "the run stopped with an
    error"."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum} (SIGTERM)")

    return _signal_handlers({signal.SIGTERM: interrupt})


def _interrupts_held() -> Any:
    """SIGINT and SIGTERM are ignored while the local Ray shuts down (a few seconds): a second Ctrl-C that cut
    `ray.shutdown()` short would make the process exit 1, "the run stopped with an error", and leave Ray's agents
    running (3 tries in 10)."""
    return _signal_handlers({signal.SIGINT: signal.SIG_IGN, signal.SIGTERM: signal.SIG_IGN})


def _drive_and_release(started_ray: bool, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """`_drive` (SIGTERM interrupting it like Ctrl-C), then shut down the local Ray this call started (a Ray
    the caller started stays up)."""
    try:
        with _sigterm_interrupts():
            return _drive(*args, **kwargs)
    finally:
        if started_ray:
            _shutdown_local_ray()


def _check_feasible(started_ray: bool, resources: Any) -> None:
    """Raise `QbatchError` (one line, naming the request) when no alive node can run one evaluation.

    The central actor makes the same check when it is built, but there it surfaces as a Ray traceback and comes
    after the run directory is created, which then blocks a rerun with the same `run_dir`.
    """
    try:
        default_max_concurrent(resources)
    except BaseException:  # a Ctrl-C, or `ray.nodes()` failing, too: this run's share of Ray must not leak
        if started_ray:
            _shutdown_local_ray()
        raise


def run_experiment(
    config: str | os.PathLike | Mapping[str, Any] | Any,
    address: str | None = None,
    run_dir: str | None = None,
    *,
    num_cpus: int | None = None,
    max_concurrent: int | None = None,
    progress: bool = True,
    out: TextIO | None = None,
    actor_options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Run an experiment from a YAML path, a dict or an `ExperimentConfig` to its budget.

    Args:
        config: the experiment config (orchestrator/config.py).
        address: a Ray cluster address ("auto", "ray://...", "host:port"); None starts a local Ray. Where this
            process has initialized Ray already (a notebook's `ray.init`), that Ray is used and left running,
            and an address naming another ("ray://" included) is refused.
        run_dir: overrides the config's `run_dir`.
        num_cpus: CPUs of a local Ray (None: all cores).
        max_concurrent: overrides the config's `max_concurrent`.
        progress: show a live progress bar (best value, evaluations/s, utilization).
        out: where the final lines go (default stdout).
        actor_options: extra keyword arguments of `CentralActor` (`ACTOR_OPTIONS`: queue_low, refit_interval_s,
            isolate, max_refit_failures); checked, with `max_concurrent` and `num_cpus`, before Ray starts.

    Returns:
        The actor's final summary (counts, best, utilization, run_dir).

    Raises:
        ConfigError: a bad config, before Ray starts and before a run directory exists.
        RunAbortedError: the failure-rate guard stopped the run.
    """
    from orchestrator.config import load_config
    from orchestrator.store import RunStore, StoreError

    actor_options = _check_run_args(max_concurrent, num_cpus, actor_options)
    cfg = load_config(config)
    try:
        objective = _check_objective(cfg)
        cfg = _with_absolute_paths(cfg, objective)
    except ConfigError as exc:  # name the file, as the config's own checks do
        if isinstance(config, (str, os.PathLike)):
            raise ConfigError(f"{os.fspath(config)}: {exc}") from exc.__cause__  # the objective's own error
        raise
    rd = _absolute(cfg.resolve_run_dir(run_dir))
    if RunStore.exists(rd):
        raise ConfigError(f"`run_dir` {rd!r} already holds a run; use `qbatch resume {rd}` or choose another run_dir")
    try:
        RunStore.check_new(rd)  # before Ray starts: never write a run among a folder's other files
    except StoreError as exc:
        raise ConfigError(str(exc)) from None
    started = _ensure_ray(address, num_cpus)
    _check_feasible(started, objective.resources)  # before the run directory exists: a rerun is not blocked
    # the direction and the space as resolved (the objective's own where the config leaves them out): `status`
    # and `report` read the direction from the run's config, and cannot always import a user objective to ask
    # it; the space is pinned, so a resume maps the logged points the same way whatever changes in between
    # (the objective's defaults, or how an override is read)
    try:
        RunStore.create(rd, {**cfg.to_dict(), "direction": cfg.resolve_direction(objective.direction),
                             "space": cfg.build_space(objective.space).describe()})
    except BaseException:
        if started:
            _shutdown_local_ray()
        raise
    return _drive_and_release(started, rd, cfg, objective.resources, max_concurrent, progress, out, actor_options,
                              new_run=True)


def resume_experiment(
    run_dir: str,
    address: str | None = None,
    *,
    num_cpus: int | None = None,
    max_concurrent: int | None = None,
    progress: bool = True,
    out: TextIO | None = None,
    actor_options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Finish an interrupted run: replay its log, re-dispatch unfinished trials, run to the budget.

    Args and Returns as in `run_experiment`; the config is the one stored in `run_dir`.

    Raises:
        RunDirError: (a `UsageError`, before Ray starts) no run at `run_dir`, its config.yaml is not YAML, or
            another process is writing it.
    """
    from orchestrator.config import load_config
    from orchestrator.store import RunStore

    actor_options = _check_run_args(max_concurrent, num_cpus, actor_options)
    store = RunStore.open(run_dir)
    RunStore.check_writer_free(run_dir)  # before Ray starts; the central actor takes the lock itself
    out = out or sys.stdout
    for line in store.damage:
        print(f"qbatch: damaged log in {run_dir}: {line}", file=out)
    try:
        cfg = load_config(store.config)
    except ConfigError as exc:  # the stored config was edited by hand: say which file holds the bad key
        raise ConfigError(f"{os.path.join(store.run_dir, 'config.yaml')}: {exc}") from None
    try:
        objective = _check_objective(cfg)
        _check_log_matches_space(store.events(), cfg.build_space(objective.space))
    except ConfigError as exc:
        raise ConfigError(f"{os.path.join(store.run_dir, 'config.yaml')}: {exc}") from exc.__cause__
    started = _ensure_ray(address, num_cpus)
    _check_feasible(started, objective.resources)
    return _drive_and_release(
        started, _absolute(run_dir), cfg, objective.resources, max_concurrent, progress, out, actor_options
    )


def _check_log_matches_space(events: Any, space: Any) -> None:
    """Raise `ConfigError` naming the parameter when a logged proposal's unit coordinates no longer map to its
    logged parameters under `space`: the space was edited in config.yaml since the run began, and a resume
    would train the model on relabelled points."""
    import math

    from objectives.base import is_choice
    from orchestrator.store import _plain  # the log's JSON form of a value

    for ev in events:
        if ev.kind != "proposed" or not ev.params or not ev.x:
            continue
        if sorted(ev.params) != sorted(space.names) or len(ev.x) != space.dim:
            raise ConfigError(f"`space`: the run's logged trials have the parameters {sorted(ev.params)}, this "
                              f"space has {sorted(space.names)}; the space of a started run cannot change")
        for p, u in zip(space.params, ev.x):
            logged, now = ev.params[p.name], _plain(p.from_unit(float(u)), p.name)
            if isinstance(now, float) and isinstance(logged, (int, float)) and not isinstance(logged, bool):
                same = math.isclose(logged, now, rel_tol=1e-9, abs_tol=1e-12)
            else:  # an int or a choice: the same value (a bool matches only a bool)
                same = is_choice(logged, (now,))
            if not same:
                raise ConfigError(
                    f"`space.{p.name}` no longer matches the run's log: trial {ev.trial_id} was logged with "
                    f"{p.name}={logged!r} at unit coordinate {float(u):.6g}, which this space reads as {now!r}; "
                    "the space of a started run cannot change (start a new run for a new space)")


def _drive(
    run_dir: str,
    cfg: Any,
    resources: Any,
    max_concurrent: int | None,
    progress: bool,
    out: TextIO | None,
    actor_options: Mapping[str, Any] | None,
    new_run: bool = False,
) -> dict[str, Any]:
    import ray

    out = out or sys.stdout
    actor_options = dict(actor_options or {})
    # the driver owns the evaluation tasks' owner, so evaluations survive a crash of the central actor; both
    # actors go to the driver's node (the head, in the README's cluster recipe), so the model's refits do not
    # compete with evaluations on a worker. Hard affinity: Ray's soft one placed a 0-CPU actor elsewhere 7 times
    # in 8 (three-node Cluster); the node cannot be lost without the driver, whose run then ends anyway.
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    try:
        here: Any = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    except Exception:  # no node of its own to name (e.g. a Ray client): Ray's default placement
        here = "DEFAULT"
    pname = pool_name(run_dir)  # the central actor finds the pool by name (CentralActor's `pool`)
    try:
        pool = ray.remote(EvaluationPool).options(
            num_cpus=0, max_restarts=-1, name=pname, namespace=NAMESPACE, scheduling_strategy=here
        ).remote(
            (cfg.objective.name, dict(cfg.objective.options)), resources, timeout_s=cfg.timeout_s,
            max_retries=cfg.max_retries, isolate=actor_options.get("isolate", "process"),
        )
    except ValueError as exc:  # ActorAlreadyExistsError (a ValueError; Ray's older versions raise ValueError)
        if "already taken" not in str(exc):
            raise
        raise _name_taken(pname, run_dir, new_run) from None
    Actor = ray.remote(CentralActor)
    try:
        actor = Actor.options(
            num_cpus=0, max_concurrency=4, max_restarts=ACTOR_RESTARTS, name=actor_name(run_dir),
            namespace=NAMESPACE, scheduling_strategy=here,
        ).remote(
            run_dir, max_concurrent=max_concurrent if max_concurrent is not None else cfg.max_concurrent,
            pool=(NAMESPACE, pname), **actor_options
        )
    except ValueError as exc:
        with contextlib.suppress(Exception):
            ray.kill(pool)
        if "already taken" not in str(exc):
            raise
        raise _name_taken(actor_name(run_dir), run_dir, new_run) from None
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=cfg.budget, desc=cfg.name, unit="eval", file=sys.stderr, dynamic_ncols=True)
    notices = _ActorNotices(actor, bar)
    restarts = 0
    summary: dict[str, Any] | None = None
    try:
        # inside the try: an actor that cannot start must not leave the evaluation pool alive under its name
        # (found by a test: a rerun on the same Ray, e.g. a cluster by address, failed "already taken")
        actor_pid = _actor_pid(actor, run_dir, new_run=new_run)
        ref = actor.run.remote()
        watch = _QueueWatch(pool, resources, out, bar)
        while summary is None:
            ready, _ = ray.wait([ref], timeout=0.5)
            watch.poll(time.time())
            notices.poll()
            if bar is not None:
                try:
                    st = ray.get(actor.status.remote(), timeout=30)
                    if watch.counts is not None:
                        st = {**st, "running": watch.counts[0], "waiting": watch.counts[1]}
                    _show(bar, st)
                except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                    pass
            if not ready:
                continue
            try:
                summary = ray.get(ref)
                if summary.get("status") == "running":  # a call after an error waited on the live loop: again
                    summary, ref = None, actor.run.remote()
            except ray.exceptions.RayActorError:
                # the actor crashed (Ray restarts it: it replays the log) or was unreachable for a moment;
                # a restart is a new process, so compare pids rather than count errors
                pid = _actor_pid(actor, run_dir, after_error=True)
                if pid != actor_pid:
                    restarts, actor_pid = restarts + 1, pid
                ref = actor.run.remote()
        notices.flush(NOTICE_FLUSH_S)  # what the run's end had to say (the final fit's warnings)
        if bar is not None:
            _show(bar, summary)
    finally:
        if summary is None:  # interrupted, or failed: end the actor's loop by a direct call before `ray.kill`,
            # a request to the GCS, which a signal to the whole process group (SLURM's scancel) stops too: the
            # actor would go on proposing and starting evaluations until its raylet drained.
            # First of all: once the stop returns the actor dispatches nothing more (`CentralActor.stop`)
            try:
                ray.get(actor.stop.remote(), timeout=15)
            except Exception:  # noqa: BLE001 - dead, or never started: nothing to stop
                pass
            notices.flush(NOTICE_FLUSH_S / 5)
        if bar is not None:
            bar.close()
        for handle in (actor, pool):
            try:
                ray.kill(handle)
            except Exception:
                pass
    summary["actor_restarts"] = restarts
    summary["report_dir"], metrics = _write_report(run_dir, out)
    if metrics is not None:
        # the live figure spans this session up to the final refit; the report's (what summary.csv says) spans
        # the whole run from the first evaluation start to the last end: one number for one run
        summary["utilization_live"] = summary["utilization"]
        summary["utilization"] = metrics.utilization
    _report(summary, out)
    if summary["status"] == "aborted":
        raise RunAbortedError(summary["message"])
    return summary


class _ActorNotices:
    """The central actor's lines for the user and its process's warnings (`CentralActor.notices`), printed to
    stderr one to a line: above the progress bar, which is redrawn below them (Ray forwards what an actor's
    process prints as it comes: after the actor's pid, on the bar's line, a warning with its source line).

    One call is in flight at a time, and the run's loop never waits on it: lines a call took from the actor are
    printed whenever it returns, never dropped because the driver stopped waiting."""

    def __init__(self, actor: Any, bar: Any = None) -> None:
        self._actor, self._bar = actor, bar
        self._ref: Any = None

    def poll(self, wait_s: float = 0.0) -> bool:
        """Start a call unless one is in flight, wait up to `wait_s` for it and print the lines it returned;
        whether it returned."""
        import ray

        try:
            if self._ref is None:
                self._ref = self._actor.notices.remote()
            ready, _ = ray.wait([self._ref], timeout=wait_s)
            if not ready:
                return False
            ref, self._ref = self._ref, None
            lines = ray.get(ref)
        except Exception:  # noqa: BLE001 - the actor restarted or is gone: its process's lines went with it
            self._ref = None
            return True
        for line in lines:
            if self._bar is not None:
                self._bar.write(line, file=sys.stderr)
            else:
                print(line, file=sys.stderr, flush=True)
        return True

    def flush(self, wait_s: float) -> None:
        """At the run's end: the call in flight, then one more for the lines since, each waited on `wait_s`."""
        if self._ref is not None and not self.poll(wait_s):
            return
        self.poll(wait_s)


class _QueueWatch:
    """The driver's view of the evaluation pool: how many dispatched evaluations run and how many wait in Ray's
    queue, and one warning (until one runs again) when some have waited `STARVED_WARN_S` with none running.

    Ray queues a task whose resources are taken (the user's own actors or tasks hold the CPUs) without a word:
    the run would wait forever, and the progress bar would show every dispatched evaluation as running."""

    def __init__(self, pool: Any, resources: Any, out: TextIO, bar: Any = None, warn_s: float | None = None) -> None:
        self._pool, self._resources, self._out, self._bar = pool, resources, out, bar
        self._warn_s = STARVED_WARN_S if warn_s is None else warn_s
        self._asked = -math.inf
        self._since: float | None = None  # when the pool was first seen with evaluations and none running
        self._warned = False
        #: (running, waiting in Ray's queue) at the last answer; None before it
        self.counts: tuple[int, int] | None = None

    def poll(self, now: float) -> None:
        """Ask the pool (at most every `POOL_POLL_S`; a pool restarting is asked again next time) and warn."""
        import ray

        if now - self._asked < POOL_POLL_S:
            return
        self._asked = now
        try:
            held, started = ray.get(self._pool.counts.remote(), timeout=5)
        except Exception:  # noqa: BLE001 - restarting or gone: the loop sees the run end on its own
            return
        self.counts = (started, held - started)
        if started or not held:
            self._since, self._warned = None, False
            return
        if self._since is None:
            self._since = now
        elif not self._warned and now - self._since >= self._warn_s:
            self._warned = True
            line = f"qbatch: warning: {self._starved(held, now - self._since)}"
            if self._bar is not None:  # above the progress bar, which is redrawn below it
                self._bar.write(line, file=self._out)
            else:
                print(line, file=self._out, flush=True)

    def _starved(self, waiting: int, for_s: float) -> str:
        import ray

        from orchestrator.actor import resource_request

        request = resource_request(self._resources)
        keys = [k for k, v in request.items() if v > 0]
        asks = ", ".join(f"{k} {request[k]:g}" for k in keys) or "no resources"
        why = "Other tasks or actors on this Ray may hold those resources; the run goes on when they are freed"
        try:
            free, total = ray.available_resources(), ray.cluster_resources()
            shown = keys or ["CPU"]
            have = ("; the cluster has " + ", ".join(f"{k} {free.get(k, 0.0):g} free of {total.get(k, 0.0):g}"
                                                     for k in shown))
            if all(free.get(k, 0.0) >= request[k] for k in keys):  # free now: the wait is elsewhere
                why = ("Ray has them free now, summed over its nodes: no single node may have them all, its worker "
                       "processes may be slow to start (a large runtime_env or container image), or the "
                       "resources were freed a moment ago")
        except Exception:  # noqa: BLE001 - the warning stands without the figures
            have = ""
        return (f"no evaluation has run for {for_s:.0f} s: {waiting} wait in Ray's queue, each asking for {asks}"
                f"{have}. {why}")


def progress_fields(st: Mapping[str, Any]) -> dict[str, Any]:
    """The progress bar's fields from the actor's progress summary. The best single observation (`best_y`)
    and the recommendation's predicted tau-level (`rec`, from the last fit; "-" before it) are shown apart,
    as `qbatch status` does: for a noisy objective the first is mostly noise and the second is the figure that
    counts, and one field switching from the first to the second would seem to fall when the model arrives.
    `running` counts the evaluations that have started (the pool's start reports, `running`/`waiting` in `st`
    where the driver has them) and `waiting` those still in Ray's queue; without the reports, every dispatched
    one counts as running."""
    observed, predicted = st.get("best_observed"), st.get("best_predicted")
    return {
        "best_y": "-" if observed is None else f"{observed['value']:.4g}",
        "rec": "-" if predicted is None else f"{predicted['value']:.4g}",
        "evals_s": f"{st['evals_per_s']:.2f}",
        "util": f"{st['utilization']:.2f}",
        "running": st.get("running", st["inflight"]),
        **({"waiting": st["waiting"]} if st.get("waiting") else {}),
        "failed": st["failed"],
    }


def _show(bar: Any, st: Mapping[str, Any]) -> None:
    fields = progress_fields(st)
    if bar.total and st["done"] > bar.total:  # a budget lowered below the results: reached, not "42/30"
        bar.n = bar.total
        fields = {"budget": "reached", "done": st["done"], **fields}
    else:
        bar.n = st["done"]
    bar.set_postfix(fields, refresh=False)
    bar.refresh()


def _write_report(run_dir: str, out: TextIO) -> tuple[str | None, Any]:
    """Plots and summary tables of the finished run (what `qbatch report` writes) and its `RunMetrics`; a failure
    here loses nothing (then `(None, None)`)."""
    from orchestrator.report import write_report

    try:
        metrics, paths = write_report(run_dir)
    except Exception as exc:  # the results are in the log; the report can be redone with `qbatch report`
        print(f"qbatch: could not write the report ({type(exc).__name__}: {exc}); run `qbatch report {run_dir}`", file=out)
        return None, None
    return (os.path.dirname(next(iter(paths.values()))) if paths else None), metrics


def _report(summary: Mapping[str, Any], out: TextIO) -> None:
    best = summary.get("best_predicted")
    label = "best point (the best posterior mean of the target among observed points)"
    if best is None:
        best, label = summary.get("best_observed"), "best observed point"
    print(
        f"qbatch: {summary['status']}: {summary['done']} evaluations ({summary['completed']} completed, "
        f"{summary['failed']} failed), utilization {summary['utilization']:.2f}",
        file=out,
    )
    if summary.get("message") and summary["status"] != "aborted":  # an abort's message is its exception's: once
        print(f"qbatch: {summary['message']}", file=out)
    if best is not None:
        print(f"qbatch: {label}: value {best['value']:.6g} at {best['params']}", file=out)
    print(f"qbatch: results in {_absolute(summary['run_dir'])}", file=out)
    if summary.get("report_dir"):
        print(f"qbatch: plots and summary tables in {summary['report_dir']}", file=out)

"""Bounded torch threads for qbatch's own model work: a fit or a proposal runs with at most a few intra-op
threads, and the caller's setting is restored when it ends.

torch starts one intra-op thread per core. GP algebra at qbatch's sizes gains little from more than one
thread, and on a machine whose cores other work keeps busy, OpenMP's spinning barriers make each parallel
region wait for a
thread that has no core: the README's library loop took 394 s for its first model `ask(100)` with torch's
default threads and 17 s with one (benchmarks/threads.py measures it). `bounded_threads(threads)` is the scope
that `AskTellOptimizer.fit` and `ask` run in, so the library and the central actor, which calls them, are
bounded alike.

`threads` is "auto" (the default: at most `DEFAULT_THREADS`, never more than the caller's own setting) or an
integer, used as given. The config key `threads` and `AskTellOptimizer(threads=...)` take either. The BLAS of
numpy and scipy (OpenBLAS: the k-means of the inducing points, SciPy's L-BFGS-B) is bounded alike, through
threadpoolctl: it starts one thread per core too, whose threads spin as OpenMP's do.

Threads. torch's setting is partly per thread and partly per process. With torch's OpenMP backend, each
thread's parallel regions use that thread's own OpenMP thread count (fixed at its first parallel region from
the process default, and changed only by `torch.set_num_threads` in that thread), while
`torch.set_num_threads` also sets the process default (for threads that have not run a parallel region yet)
and MKL's thread count, which is process-wide. So while any bounded call runs, MKL everywhere in the process,
and torch in threads that start their first parallel region then, use the bound too; so do numpy's and scipy's
BLAS, whose thread count is process-wide (the first concurrent call's count). Each thread's own count is
restored when its call ends; the process-wide settings (the first concurrent call's caller's) when the last
concurrent call ends.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

from orchestrator.checks import is_int, refuse
from orchestrator.errors import ConfigError

__all__ = ["DEFAULT_THREADS", "MAX_THREADS", "bounded_threads", "check_threads", "default_threads",
           "resolve_threads"]

#: the most intra-op threads of a fit or a proposal with `threads: auto`. One: on 2 cores shared with other
#: work, the README's library loop ran its first model `ask(100)` in 17 s on one thread and in 394 s on
#: torch's default two (benchmarks/threads.py times the loop); a machine whose cores are free for the run may
#: set more (`threads`)
DEFAULT_THREADS = 1
#: the largest `threads` accepted
MAX_THREADS = 1024

_lock = threading.Lock()
_inside = 0  # bounded blocks running now, in every thread of the process
_outer: int | None = None  # the caller's setting when the first of the blocks running now began
_openmp: Any = None  # threadpoolctl's controller of the loaded OpenMP runtimes (`_set_own_openmp`)
_blas: Any = None  # threadpoolctl's limits on the BLAS libraries while blocks run (`_limit_blas`)


def check_threads(name: str, value: Any, error: type[Exception] = ConfigError) -> str | int:
    """`value` if it is "auto" or an integer in [1, `MAX_THREADS`] (as a Python int); else `error` naming
    `name`."""
    if isinstance(value, str) and value == "auto":
        return value
    if is_int(value) and 1 <= int(value) <= MAX_THREADS:
        return int(value)
    raise refuse(name, f"'auto' or an integer in [1, {MAX_THREADS}]", value, error)


def default_threads() -> int:
    """The bound of "auto": `DEFAULT_THREADS`, or fewer where the process may use fewer CPUs."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(DEFAULT_THREADS, cpus))


def resolve_threads(threads: str | int, current: int) -> int:
    """The intra-op threads of a bounded call: `threads` itself when it is an integer; for "auto", the smaller
    of `default_threads()` and `current`, the caller's own setting (a caller that chose fewer keeps them)."""
    if threads == "auto":
        return max(1, min(default_threads(), current))
    return int(threads)


@contextlib.contextmanager
def bounded_threads(threads: str | int = "auto") -> Iterator[int]:
    """Run the block with torch's intra-op threads set by `threads` (`resolve_threads`); yields that count.

    Blocks nest (an `ask` that fits runs one inside the other) and may run in several threads at once: the
    module docstring says what the other threads of the process see meanwhile.
    """
    import torch

    global _inside, _outer, _blas
    own = torch.get_num_threads()  # this thread's count (OpenMP's is per thread)
    n = resolve_threads(threads, own)
    with _lock:
        if _inside == 0:
            _outer = own
            _blas = _limit_blas(n)
        _inside += 1
        if n != own:
            torch.set_num_threads(n)
    try:
        yield n
    finally:
        with _lock:
            _inside -= 1
            if _inside == 0:
                outer, _outer = _outer, None
                if outer is not None and (n != own or torch.get_num_threads() != outer):
                    torch.set_num_threads(outer)  # the process default and MKL's, and this thread's
                blas, _blas = _blas, None
                if blas is not None:
                    blas.restore_original_limits()
            if torch.get_num_threads() != own:
                _set_own_openmp(own)  # this thread's own count only: the others' calls still run bounded


def _limit_blas(n: int) -> Any:
    """Limit the loaded BLAS libraries (numpy's and scipy's OpenBLAS; process-wide) to `n` threads; returns
    threadpoolctl's limiter, whose `restore_original_limits` puts them back, or None where it cannot."""
    try:
        from threadpoolctl import threadpool_limits

        return threadpool_limits(limits=n, user_api="blas")
    except Exception:  # noqa: BLE001 - no threadpoolctl view of the BLAS: torch's bound stands alone
        return None


def _set_own_openmp(n: int) -> None:
    """Set the calling thread's OpenMP thread count (`omp_set_num_threads`, per thread) without torch's
    process-wide setting; through threadpoolctl, which finds the OpenMP runtime torch loaded."""
    global _openmp
    try:
        if _openmp is None:
            from threadpoolctl import ThreadpoolController

            _openmp = ThreadpoolController().select(user_api="openmp")
        _openmp.limit(limits=n)
    except Exception:  # noqa: BLE001 - no OpenMP runtime found: torch's own setter, process-wide
        import torch

        torch.set_num_threads(n)

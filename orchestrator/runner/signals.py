"""SIGINT and SIGTERM while a run is driven and while its local Ray shuts down.

ARCHITECTURE.md "The path of one evaluation", step 6: a driver stopped by Ctrl-C or by SIGTERM (what
`timeout`, SLURM and systemd send) exits 130 with the resume hint, and a second Ctrl-C does not cut the
shutdown of the local Ray short. Handlers are set in the main thread only (Python's rule); elsewhere nothing
changes.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator, Mapping
from typing import Any


@contextlib.contextmanager
def _signal_handlers(handlers: Mapping[int, Any]) -> Iterator[None]:
    """Install `handlers` (signal -> handler) for the block and put the previous ones back afterwards (the
    default where there was none); outside the main thread, where Python cannot set handlers, nothing
    changes."""
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
    `ray.shutdown()` short would make the process exit 1, "the run stopped with an error", and leave Ray's
    agents running (3 tries in 10)."""
    return _signal_handlers({signal.SIGINT: signal.SIG_IGN, signal.SIGTERM: signal.SIG_IGN})

"""The virtual clock of a simulated cluster: real time while the central actor computes, a jump while it
waits.

A simulated cluster (`orchestrator.sim`) runs the real central actor against virtual slots. Its clock reads
the wall clock's elapsed seconds plus the idle stretches it skipped: while the actor's threads compute (a fit,
a proposal, the dispatch loop's tells and log writes) virtual time passes exactly as real time does, so slow
actor work shows up as idle slots as it would on a cluster; while every thread of the actor waits for the
next evaluation to end, the clock jumps to that moment (`advance_to`) instead of sleeping through it.
"""

from __future__ import annotations

import threading
import time

__all__ = ["VirtualClock"]


class VirtualClock:
    """Seconds since the epoch in virtual time; call it as `time.time` is called.

    Args:
        start: the virtual time at creation (default: the wall clock's `time.time()`, so the run's log holds
            ordinary timestamps).

    Attributes:
        skipped: virtual seconds jumped over so far (`advance_to`); the clock reads
            `start + real seconds elapsed + skipped`, never decreasing.
    """

    def __init__(self, start: float | None = None) -> None:
        self._origin = time.time() if start is None else float(start)
        self._t0 = time.perf_counter()
        self._lock = threading.Lock()
        self.skipped = 0.0

    def __call__(self) -> float:
        return self._origin + (time.perf_counter() - self._t0) + self.skipped

    @property
    def real_s(self) -> float:
        """Real seconds since the clock was created."""
        return time.perf_counter() - self._t0

    def advance_to(self, t: float) -> float:
        """Jump forward to virtual time `t` (nothing when it is already past); returns the time now."""
        with self._lock:
            gap = t - self()
            if gap > 0:
                self.skipped += gap
            return self()

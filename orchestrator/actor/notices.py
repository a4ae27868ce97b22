"""What the central actor has to tell the user: its own lines and the Python warnings of its process.

In a Ray actor they are held for the driver, which takes them with `CentralActor.notices` and prints one to a
line above its progress bar (orchestrator/runner/progress.py); outside Ray its lines are logged at once (a
warning of this module's logger, which the CLI and Python's default both write to stderr).
"""

from __future__ import annotations

import collections
import logging
import os
from typing import Any

from workers.records import cap

__all__ = ["MAX_NOTICES", "MAX_NOTICE_CHARS", "Notices", "in_ray_actor", "warning_line"]

logger = logging.getLogger(__name__)

#: the most lines the actor holds for the driver (`CentralActor.notices`); past it the oldest are dropped
MAX_NOTICES = 200
#: the most characters of one such line (a longer one keeps its head and tail)
MAX_NOTICE_CHARS = 2000


def in_ray_actor() -> bool:
    """Whether this process runs a Ray actor (its stderr reaches the driver through Ray's log forwarding)."""
    try:
        import ray

        return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None
    except Exception:  # noqa: BLE001 - no Ray, or no runtime context: a plain process
        return False


def warning_line(message: Warning | str, category: type[Warning], filename: str, lineno: int) -> str:
    """One line for a Python warning: ``qbatch: warning: Category: message``, without the source line Python
    prints under it, with the newlines of the message folded, and with its origin (``file:line``) when it
    comes from outside qbatch (a library's warning; qbatch's own name what to change)."""
    text = " ".join(str(message).split())
    if not str(getattr(category, "__module__", "")).startswith("orchestrator"):
        text = f"{text} ({os.path.basename(filename)}:{lineno})"
    return cap(f"qbatch: warning: {category.__name__}: {text}", MAX_NOTICE_CHARS, sep=" ")


class Notices:
    """What the central actor has to tell the user: its lines and the Python warnings raised in its process.

    In a Ray actor (`forward`) they are held for the driver, which takes them with `CentralActor.notices` and
    prints each on a line of its own above the progress bar: Ray forwards an actor's stderr to the driver's
    terminal as it comes, after the actor's pid and on the bar's line, and Python prints a warning with the
    source line of its `warnings.warn`. Outside Ray (an actor object in the caller's process) a line is
    logged at once (`logging`, a warning) and warnings are left to Python.

    The hook is the process's `warnings.showwarning`: a `warnings.catch_warnings` in a library (BoTorch's
    fits record their warnings so) replaces it while it lasts, as it does Python's own.
    """

    def __init__(self, forward: bool) -> None:
        self.forward = forward
        self._lines: collections.deque[str] = collections.deque(maxlen=MAX_NOTICES)

    def say(self, line: str) -> None:
        if self.forward:
            self._lines.append(cap(line, MAX_NOTICE_CHARS, sep=" "))
        else:
            logger.warning("%s", line)

    def show_warning(self, message: Warning | str, category: type[Warning], filename: str, lineno: int,
                     file: Any = None, line: str | None = None) -> None:
        """`warnings.showwarning` of the actor's process (the filters still decide what is shown)."""
        self._lines.append(warning_line(message, category, filename, lineno))

    def take(self) -> list[str]:
        """The lines held, oldest first, and forget them."""
        out = []
        while True:
            try:
                out.append(self._lines.popleft())
            except IndexError:
                return out

"""The store's errors, and the one-line form of an exception that its messages quote.

`StoreError`: a run directory, an event or a checkpoint cannot be used as given; the message names the field
or the file. `RunDirError`: the run directory itself cannot be used as asked, found before anything is written
or started; as a `UsageError` it ends a command with exit status 2, before Ray starts (ARCHITECTURE.md "The
path of one evaluation", step 1).
"""

from __future__ import annotations

from orchestrator.errors import QbatchError, UsageError


class StoreError(QbatchError):
    """A run directory is missing, already used, or an event/checkpoint cannot be stored as given."""


class RunDirError(StoreError, UsageError):
    """The run directory cannot be used as asked: no run there, not new, busy, or its config.yaml unreadable.
    Raised before anything is written or started."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__

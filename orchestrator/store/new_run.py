"""A new run directory: whether a folder can take a run, the claim of its `config.yaml`, and the undo of a
`create` that failed.

docs/event-log.md (the run directory's layout) and ARCHITECTURE.md "The path of one evaluation", step 1: a new
run never writes among other files, and the folder is checked before Ray starts. Of two runs started together
on one new folder exactly one claims it: `config.yaml` is made only where none exists.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Sequence
from typing import Any

from orchestrator.store.errors import RunDirError, StoreError
from orchestrator.store.filesystems import _Local, _makedirs, _remove_empty


def _check_new(backend: Any, shown: str) -> None:
    """Raise `RunDirError` unless the run directory on `backend` (`shown` in messages) is absent or an empty
    folder; a local one that is absent must be creatable."""
    if backend.exists("") and not backend.isdir(""):
        raise RunDirError(f"`run_dir` {shown} is a file, not a folder")
    if backend.exists("config.yaml") or backend.listdir("events"):
        raise RunDirError(f"`run_dir` {shown} already holds a run; resume it or choose another run_dir")
    if isinstance(backend, _Local) and not backend.exists(""):
        # can it be created? (checked now, before Ray starts; the probe folder and any parents it made are
        # removed again, best effort: a refused run leaves nothing behind, and a sibling run being created
        # at the same time under the same new parent keeps it)
        missing, p = [], os.path.abspath(backend.root)
        while not os.path.lexists(p) and os.path.dirname(p) != p:
            missing.append(p)
            p = os.path.dirname(p)
        try:
            _makedirs(backend.root)
        except OSError as exc:
            _remove_empty(missing)
            raise RunDirError(f"`run_dir` {shown} cannot be created: {exc.strerror or exc}") from None
        _remove_empty(missing)
    # empty `events/` and `checkpoints/` are what a `create` that died before writing config.yaml leaves
    # behind
    others = [n for n in backend.listdir("")
              if not (n in ("events", "checkpoints") and backend.isdir(n) and not backend.listdir(n))]
    if others:
        shown_files = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        raise RunDirError(
            f"`run_dir` {shown} is a folder that already holds other files ({shown_files}); "
            "a new run needs a new or empty folder"
        )


class _ClaimedElsewhere(RunDirError):
    """Another process wrote the config.yaml of the run directory a `create` was to claim."""


def _missing_folders(backend: Any) -> list[str]:
    """The folders of a local run directory that do not exist yet, deepest first (empty for other stores)."""
    if not isinstance(backend, _Local):
        return []
    missing, p = [], backend.root
    while not os.path.lexists(p) and os.path.dirname(p) != p:
        missing.append(p)
        p = os.path.dirname(p)
    return missing


def _undo_create(backend: Any, made: Sequence[str]) -> None:
    """Remove what a failed `create` wrote in a local run directory: its empty subfolders and the folders it
    made (best effort; a folder another run wrote into meanwhile is kept)."""
    if not isinstance(backend, _Local):
        return
    if not backend.exists("config.yaml"):
        for name in ("events", "checkpoints"):
            if backend.isdir(name) and not backend.listdir(name):
                _remove_empty([backend.path(name)])
    _remove_empty(list(made))



def _claim(backend: Any, shown: str, config_text: bytes) -> None:
    """Write config.yaml where none exists yet; `_ClaimedElsewhere` naming the writer of the one that does."""
    header = f"# written by qbatch run, pid {os.getpid()} on {socket.gethostname()}\n".encode()
    try:
        backend.write_atomic("config.yaml", header + config_text, exclusive=True)
    except StoreError:  # the name exists: another run linked its config.yaml first
        raise _ClaimedElsewhere(f"`run_dir` {shown} was claimed a moment ago by another run "
                                f"({_claimant(backend)}); choose another run_dir") from None


def _claimant(backend: Any) -> str:
    """Who wrote config.yaml, as its first line says ("pid N on HOST", or "unknown")."""
    try:
        first = backend.read("config.yaml").decode(errors="replace").split("\n", 1)[0]
    except OSError:
        return "unknown"
    m = re.match(r"^# written by qbatch run, (pid \d+ on \S+)$", first)
    return m.group(1)[:200] if m else "unknown"

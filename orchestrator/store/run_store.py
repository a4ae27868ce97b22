"""`RunStore`, the facade of a run directory: its config, its event log and its checkpoints.

ARCHITECTURE.md "The path of one evaluation", steps 4 and 6: a result is written to the log, durable, before
it is acknowledged, and a run resumes from its log. docs/event-log.md describes the run directory; the parts
live beside this module: `filesystems` (where it is), `new_run` (creating one), `lock` (one writer),
`segments` and `damage` (the log), `checkpoints`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow.fs as pafs
import yaml

from orchestrator.store.checkpoints import checkpoint_names, load_checkpoint, save_checkpoint
from orchestrator.store.errors import RunDirError, StoreError, _first_line
from orchestrator.store.filesystems import _backend
from orchestrator.store.lock import _WRITER_LOCK, WriterLock
from orchestrator.store.new_run import _check_new, _claim, _ClaimedElsewhere, _missing_folders, _undo_create
from orchestrator.store.schema import Event, _plain
from orchestrator.store.segments import _COMPACT_FILES, SegmentLog

logger = logging.getLogger(__name__)


class RunStore:
    """A run directory: `config.yaml`, the event log under `events/`, checkpoints under `checkpoints/`.

    Use `RunStore.create` for a new run and `RunStore.open` for an existing one; do not call the constructor.
    One process writes a run at a time (the central actor); any number may read it.

    Attributes:
        run_dir: the run directory as given (local path made absolute, or the URI).
        config: the config dict stored in `config.yaml`.
        damage: one line per damaged segment, naming the sequence numbers of the events dropped when the
            log was last read (empty if the log is intact).
        compact_files: auto-compaction merges the small segments once this many exist.
    """

    def __init__(self, backend: Any, run_dir: str, config: dict) -> None:
        self._fs = backend
        self._lock = WriterLock(backend, run_dir)
        self._log = SegmentLog(backend)
        self.run_dir = run_dir
        self.config = config
        self.compact_files = _COMPACT_FILES

    @property
    def damage(self) -> list[str]:
        """One line per damaged segment when the log was last read (empty if the log is intact)."""
        return self._log.damage

    # ------------------------------------------------------------------ construction
    @classmethod
    def create(cls, run_dir: str, config: Any, filesystem: pafs.FileSystem | None = None) -> RunStore:
        """Create a run directory holding `config` (a dict or an object with `to_dict()`).

        Args:
            run_dir: a local path or a pyarrow filesystem URI (``file:///...``, ``s3://...``).
            config: the experiment config, written as `config.yaml`.
            filesystem: an explicit pyarrow filesystem in which `run_dir` is a path (optional).

        Raises:
            StoreError: the folder already holds a run (a `config.yaml` or an event log).
        """
        if hasattr(config, "to_dict"):
            config = config.to_dict()
        if not isinstance(config, Mapping):
            raise StoreError(f"config must be a dict; got {type(config).__name__}")
        backend, shown = _backend(run_dir, filesystem)
        _check_new(backend, shown)
        try:
            text = yaml.safe_dump(_plain(dict(config), "config"), sort_keys=False)
        except yaml.YAMLError as exc:
            raise StoreError(f"config cannot be written as YAML: {exc}") from None
        made = _missing_folders(backend)
        store = cls(backend, shown, yaml.safe_load(text))
        try:
            backend.makedirs("events")
            backend.makedirs("checkpoints")
            # the claim: config.yaml is made only where none exists (a link, which fails on an existing name),
            # so of two runs started together on one new folder exactly one writes it, and each process's
            # actor reads back its own config
            _claim(backend, shown, text.encode())
        except _ClaimedElsewhere:  # the folder is the other run's now: nothing of it is undone
            raise
        except OSError as exc:  # a full or read-only disk: one line naming the folder, nothing left behind
            _undo_create(backend, made)
            raise RunDirError(f"cannot create the run directory {shown}: {exc.strerror or exc}") from None
        return store

    @classmethod
    def open(cls, run_dir: str, filesystem: pafs.FileSystem | None = None) -> RunStore:
        """Open an existing run directory and read its log once (filling `damage`).

        Raises:
            StoreError: there is no run (no `config.yaml`) at `run_dir`, or its config is not YAML.
        """
        backend, shown = _backend(run_dir, filesystem)
        if not backend.exists("config.yaml"):
            raise RunDirError(f"no run at {shown}: config.yaml not found")
        try:
            config = yaml.safe_load(backend.read("config.yaml").decode())
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise RunDirError(f"{shown}/config.yaml is not valid YAML: {str(exc).splitlines()[0]}") from None
        if not isinstance(config, dict):
            raise RunDirError(f"{shown}/config.yaml must hold a mapping; got {type(config).__name__}")
        if not backend.exists("events"):  # `create` makes events/ before config.yaml: the log was removed
            raise RunDirError(f"{shown}/events/ is missing: the run's log is gone, so it cannot be shown or "
                              "resumed (restore the folder from a backup, or start a new run)")
        store = cls(backend, shown, config)
        store.events()
        return store

    @staticmethod
    def check_new(run_dir: str, filesystem: pafs.FileSystem | None = None) -> None:
        """Raise `StoreError` unless `run_dir` is absent or an empty folder (a new run never writes among
        other files: `run_dir: .` or a home folder is refused, and an existing run is resumed, not
        re-created)."""
        backend, shown = _backend(run_dir, filesystem)
        _check_new(backend, shown)

    @staticmethod
    def exists(run_dir: str, filesystem: pafs.FileSystem | None = None) -> bool:
        """Whether `run_dir` holds a run (a `config.yaml`)."""
        backend, _ = _backend(run_dir, filesystem)
        return backend.exists("config.yaml")

    # ------------------------------------------------------------------ one writer
    def lock_writer(self) -> None:
        """Take the run's writer lock (a local folder: an exclusive `flock` on `writer.lock`, which the OS
        frees when this process ends, a crash included); held until `unlock_writer` or the process's end.

        Two writers of one log would each number their segments on from what they had read, and a reader keeps
        one of two events with the same number: a second `qbatch resume` of a running run would lose results
        silently. On another pyarrow filesystem there is no lock (one writer at a time is then the user's to
        keep).

        Raises:
            StoreError: another process holds the lock; the message names its pid and host.
        """
        self._lock.acquire()

    def unlock_writer(self) -> None:
        """Release the writer lock (if held)."""
        self._lock.release()

    @staticmethod
    def check_writer_free(run_dir: str, filesystem: pafs.FileSystem | None = None) -> None:
        """Raise `StoreError` if another process holds `run_dir`'s writer lock (see `lock_writer`)."""
        lock = WriterLock(*_backend(run_dir, filesystem))
        lock.acquire()
        lock.release()

    @staticmethod
    def discard_unstarted(run_dir: str, filesystem: pafs.FileSystem | None = None) -> bool:
        """Remove what `create` wrote (config.yaml, and the writer lock file) when the run recorded nothing:
        no event, no checkpoint, and no process writing it. Then a run whose central actor could not start
        does not block a rerun with the same `run_dir` (the folder and its empty `events/`, `checkpoints/`
        stay, as `create` accepts them). Returns whether it removed the run."""
        backend, _ = _backend(run_dir, filesystem)
        if not backend.exists("config.yaml") or backend.listdir("events") or backend.listdir("checkpoints"):
            return False
        if RunStore.is_being_written(run_dir, filesystem):
            return False
        for name in ("config.yaml", _WRITER_LOCK):
            if backend.exists(name):
                backend.delete(name)
        return True

    @staticmethod
    def is_being_written(run_dir: str, filesystem: pafs.FileSystem | None = None) -> bool | None:
        """Whether a process holds `run_dir`'s writer lock now (a run going, or its central actor): True or
        False for a local folder; None where it cannot tell (another pyarrow filesystem, no flock). Reads
        only: a shared `flock` taken and dropped at once (a writer taking the lock in that instant tries
        again, `lock_writer`)."""
        backend, _ = _backend(run_dir, filesystem)
        return WriterLock.is_held(backend)

    def has_segments(self) -> bool:
        """Whether events/ holds at least one file named as a log segment (`seg-<first>-<last>.parquet`)."""
        return self._log.has_segments()

    @property
    def durable_fsync(self) -> bool:
        """True for local folders (fsync of file and folder); False for other pyarrow filesystems."""
        return self._fs.durable

    # ------------------------------------------------------------------ the event log
    def append(self, events: Sequence[Event]) -> None:
        """Append `events` as one segment; durable (written, fsynced, renamed, folder fsynced) on return.

        Raises:
            StoreError: an event field has the wrong type (the message names it); nothing is written then.
        """
        events = list(events)
        if not events:
            return
        self._log.append(events)
        # the events are durable now: a failed compaction (an optimisation, tried again at the next append)
        # must not come out of `append` as if they were not (the actor would report them unrecorded, a retry
        # would write them twice)
        try:
            self._auto_compact()
        except Exception as exc:  # noqa: BLE001 -- the segments stay as they are, every event readable
            logger.warning("qbatch: compacting the log of %s failed (%s: %s); its segments stay as they are",
                           self.run_dir, type(exc).__name__, _first_line(exc))

    def _auto_compact(self) -> None:
        small = self._log.small_segments()
        if len(small) >= self.compact_files:
            # another writer wrote over this one's numbers: re-read (finds the
            if self._log.foreign_overlap():
                self.events()                # conflict, which is then never merged) before compacting
                small = self._log.small_segments()
            self.compact(small)

    def compact(self, names: Sequence[str] | None = None) -> int:
        """Merge segments (default: all intact ones) into one; returns how many files were merged.

        Crash-safe: the merged segment is written atomically before the old ones are deleted, and readers
        drop rows whose sequence number they have already read. Damaged segments are left in place.
        """
        return self._log.compact(names)

    def events(self, kinds: Iterable[str] | None = None) -> list[Event]:
        """All intact events in append order (optionally only the given kinds); refreshes `damage`."""
        return self._log.events(kinds)

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, name: str, state: dict) -> None:
        """Save `state` atomically: `torch.save` if it holds tensors (or int keys, tuples), JSON otherwise.

        Only tensors, dicts with string keys, lists, tuples, str, int, float, bool and None are accepted,
        which is exactly what `torch.load(weights_only=True)` reads back without unpickling code.

        Raises:
            StoreError: a bad name, or a value of another type (the message names its key path).
        """
        save_checkpoint(self._fs, name, state)

    def load_checkpoint(self, name: str) -> dict | None:
        """The state saved under `name`, or None if there is none. Never unpickles code.

        Raises:
            StoreError: the file exists but cannot be read safely (corrupt, or holds non-weights objects).
        """
        return load_checkpoint(self._fs, name)

    def checkpoints(self) -> list[str]:
        """Names of the saved checkpoints."""
        return checkpoint_names(self._fs)

    def __repr__(self) -> str:
        return f"RunStore({self.run_dir!r}, segments={self._log.segment_count}, damage={len(self.damage)})"

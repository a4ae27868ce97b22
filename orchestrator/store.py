"""Run directory: the config, an append-only Parquet event log, and model checkpoints (ARCHITECTURE.md).

ARCHITECTURE.md "The path of one evaluation", step 4. Layout of a run directory::

    config.yaml                      the validated experiment config (plain YAML)
    events/seg-<first>-<last>.parquet  segments of the event log; <first>/<last> are 12-digit sequence numbers
    checkpoints/<name>.pt | .json    state dicts (torch.save, loaded with weights_only=True) or plain JSON

Every event gets a global sequence number ``seq``. `RunStore.append` writes one segment to a temporary
name, fsyncs it, renames it into place and fsyncs the folder before it returns, so a segment is complete
or absent. Compaction merges small segments into one; it is crash-safe because readers drop rows whose
``seq`` they have already seen. A segment that cannot be read (torn, corrupted) loses only the rows that
cannot be decoded: the rest of its row groups are kept, and `RunStore.damage` lists exactly which
sequence numbers were dropped (known from the segment's name). Nothing in a run directory is unpickled.
"""

from __future__ import annotations

import errno
import io
import json
import os
import re
import socket
import sys
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import yaml

from orchestrator.errors import QbatchError, UsageError
from workers.records import printable

__all__ = [
    "EVENT_KINDS",
    "Event",
    "RunDirError",
    "RunStore",
    "StoreError",
    "TrialRecord",
    "status_counts",
    "trials_table",
]

#: the kinds of events the log accepts
EVENT_KINDS = ("proposed", "started", "completed", "failed", "refit")
#: auto-compaction: once this many segments hold fewer than `_SMALL_ROWS` events each, merge them
_COMPACT_FILES = 64
#: the run's writer lock file (`RunStore.lock_writer`)
_WRITER_LOCK = "writer.lock"
#: takes of the writer lock before a writer is refused, and the pause between them (`lock_writer`)
LOCK_TRIES = 10
LOCK_RETRY_S = 0.02
#: the errnos of a `flock` that another holder of the lock refused
_LOCK_BUSY = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
_SMALL_ROWS = 1024
#: rows per Parquet row group: a damaged row group loses at most this many events
_ROW_GROUP = 256

_SEGMENT_RE = re.compile(r"^seg-(\d{12})-(\d{12})\.parquet$")
_CHECKPOINT_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")

_SCHEMA = pa.schema(
    [
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("trial_id", pa.string(), nullable=False),
        pa.field("time", pa.float64(), nullable=False),
        pa.field("batch_id", pa.int64()),
        pa.field("params", pa.string()),  # JSON
        pa.field("x", pa.list_(pa.float64())),
        pa.field("value", pa.float64()),
        pa.field("forecast", pa.string()),  # JSON
        pa.field("node_id", pa.string()),
        pa.field("pid", pa.int64()),
        pa.field("started_at", pa.float64()),
        pa.field("ended_at", pa.float64()),
        pa.field("attempt", pa.int64(), nullable=False),
        pa.field("error", pa.string()),
        pa.field("traceback", pa.string()),
        pa.field("info", pa.string()),  # JSON
    ]
)
_JSON_FIELDS = ("params", "forecast", "info")


class StoreError(QbatchError):
    """A run directory is missing, already used, or an event/checkpoint cannot be stored as given."""


class RunDirError(StoreError, UsageError):
    """The run directory cannot be used as asked: no run there, not new, busy, or its config.yaml unreadable.
    Raised before anything is written or started."""


@dataclass
class Event:
    """One record of the event log. Dict fields are stored as JSON, `x` as a list column."""

    kind: str
    trial_id: str = ""
    time: float = field(default_factory=time.time)
    batch_id: int | None = None
    params: dict | None = None
    x: list[float] | None = None
    value: float | None = None
    forecast: dict | None = None
    node_id: str | None = None
    pid: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    attempt: int = 0
    error: str | None = None
    traceback: str | None = None
    info: dict | None = None


_EVENT_FIELDS = tuple(f.name for f in fields(Event))


# ---------------------------------------------------------------------------------------- encoding
def _plain(value: Any, where: str) -> Any:
    """Turn numpy/torch scalars and arrays into plain JSON data; raise StoreError naming `where` otherwise."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if type(value).__module__.startswith("torch") and hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise StoreError(f"{where} has a non-string key {k!r}; JSON fields need string keys")
            out[k] = _plain(v, f"{where}[{k!r}]")
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    raise StoreError(f"{where} holds a {type(value).__name__} ({value!r:.60}), which is not JSON data")


def _to_json(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise StoreError(f"{where} must be a dict or None; got {type(value).__name__}")
    return json.dumps(_plain(value, where), allow_nan=True, separators=(",", ":"))


def _opt_number(value: Any, where: str, kind: type) -> Any:
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise StoreError(f"{where} must be a number or None; got {value!r:.60}")
    if kind is int:
        if isinstance(value, (float, np.floating)) and not float(value).is_integer():
            raise StoreError(f"{where} must be an integer or None; got {value!r}")
        if not -(2**63) <= value < 2**63:  # the column is int64 (pyarrow raised a bare OverflowError)
            raise StoreError(f"{where} must fit in a signed 64-bit integer; got {value!r}")
        return int(value)
    return float(value)


def _encode(events: Sequence[Event], first_seq: int) -> pa.Table:
    cols: dict[str, list[Any]] = {name: [] for name in _SCHEMA.names}
    for i, ev in enumerate(events):
        if not isinstance(ev, Event):
            raise StoreError(f"events[{i}] must be an Event; got {type(ev).__name__}")
        w = f"events[{i}]"
        if ev.kind not in EVENT_KINDS:
            raise StoreError(f"{w}.kind must be one of {list(EVENT_KINDS)}; got {ev.kind!r}")
        if not isinstance(ev.trial_id, str):
            raise StoreError(f"{w}.trial_id must be a string; got {ev.trial_id!r}")
        if printable(ev.trial_id) != ev.trial_id:  # an id must come back as written (a lone surrogate would not)
            raise StoreError(f"{w}.trial_id must be UTF-8 text; got {ev.trial_id!r}")
        if ev.kind != "refit" and not ev.trial_id:
            raise StoreError(f"{w}.trial_id must be non-empty for a {ev.kind!r} event")
        t = _opt_number(ev.time, f"{w}.time", float)
        if t is None:
            raise StoreError(f"{w}.time must be a number; got None")
        cols["seq"].append(first_seq + i)
        cols["kind"].append(ev.kind)
        cols["trial_id"].append(ev.trial_id)
        cols["time"].append(t)
        cols["batch_id"].append(_opt_number(ev.batch_id, f"{w}.batch_id", int))
        for name in _JSON_FIELDS:
            cols[name].append(_to_json(getattr(ev, name), f"{w}.{name}"))
        x = ev.x
        if x is not None:
            x = _plain(x, f"{w}.x")
            if not isinstance(x, list):
                x = [x]
            x = [_opt_number(v, f"{w}.x[{j}]", float) for j, v in enumerate(x)]
        cols["x"].append(x)
        cols["value"].append(_opt_number(ev.value, f"{w}.value", float))
        for name in ("node_id", "error", "traceback"):
            v = getattr(ev, name)
            if v is not None and not isinstance(v, str):
                raise StoreError(f"{w}.{name} must be a string or None; got {v!r:.60}")
            # lone surrogates (an undecodable file name in a message) are not UTF-8: Parquet refused the whole
            # segment, and with it the other results of the batch, on every resume again
            cols[name].append(None if v is None else printable(v))
        cols["pid"].append(_opt_number(ev.pid, f"{w}.pid", int))
        cols["started_at"].append(_opt_number(ev.started_at, f"{w}.started_at", float))
        cols["ended_at"].append(_opt_number(ev.ended_at, f"{w}.ended_at", float))
        attempt = _opt_number(ev.attempt, f"{w}.attempt", int)
        cols["attempt"].append(0 if attempt is None else attempt)
    return pa.Table.from_pydict(cols, schema=_SCHEMA)


def _decode(table: pa.Table) -> tuple[list[tuple[int, Event]], list[str]]:
    """The rows of `table` as events, and one note per row left out: a JSON field (`params`, `forecast`,
    `info`) that is not valid JSON or not a JSON object, which every reader of the log would trip on (`.get`
    of a list). Such a row is damage of that row alone; the others of its row group are kept."""
    out: list[tuple[int, Event]] = []
    bad: list[str] = []
    for r in table.to_pylist():
        seq = r.pop("seq")
        problem = None
        for name in _JSON_FIELDS:
            if r[name] is None:
                continue
            try:
                r[name] = json.loads(r[name])
            except ValueError as exc:
                problem = f"`{name}` is not valid JSON ({_first_line(exc)[:80]})"
                break
            if not isinstance(r[name], dict):
                problem = f"`{name}` holds a JSON {_json_kind(r[name])}, not an object"
                break
        if problem is not None:
            bad.append(f"the {r['kind']!r} event with sequence number {seq}: {problem}")
            continue
        out.append((seq, Event(**{k: r[k] for k in _EVENT_FIELDS})))
    return out, bad


def _json_kind(value: Any) -> str:
    """The JSON name of a decoded value's type ("array", "string", ...)."""
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    return "number"


def _parquet_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=_ROW_GROUP, compression="zstd", write_page_checksum=True)
    return sink.getvalue().to_pybytes()


def _holes(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The numbers from 0 to the last span's end that no (first, last) span holds, as (a, b) ranges: the log's
    sequence numbers have none unless a segment file was deleted."""
    holes, expected = [], 0
    for first, last in sorted(spans):
        if first > expected:
            holes.append((expected, first - 1))
        expected = max(expected, last + 1)
    return holes


def _ranges(seqs: Iterable[int]) -> str:
    """Compact text of a set of integers: '3-7, 12'."""
    s = sorted(seqs)
    parts: list[str] = []
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[j] + 1:
            j += 1
        parts.append(str(s[i]) if i == j else f"{s[i]}-{s[j]}")
        i = j + 1
    return ", ".join(parts)


# ---------------------------------------------------------------------------------------- file systems
class _Local:
    """A local folder: atomic writes with fsync of the file and of its folder."""

    durable = True

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)

    def path(self, rel: str) -> str:
        return os.path.join(self.root, rel) if rel else self.root

    def exists(self, rel: str) -> bool:
        return os.path.exists(self.path(rel))

    def isdir(self, rel: str) -> bool:
        return os.path.isdir(self.path(rel))

    def makedirs(self, rel: str) -> None:
        """Make the folder and its missing parents, each made one fsynced into its parent (top down: `runs/` as
        well as the run directory): without that a power loss could take a new run directory, and the events
        acknowledged in it, away."""
        path = self.path(rel)
        missing = []
        while not os.path.isdir(path) and os.path.dirname(path) != path:
            missing.append(path)
            path = os.path.dirname(path)
        _makedirs(self.path(rel))
        for made in reversed(missing):
            _fsync_folder(os.path.dirname(made))

    def listdir(self, rel: str) -> list[str]:
        path = self.path(rel)
        try:
            return sorted(os.listdir(path))
        except FileNotFoundError:
            return []
        except NotADirectoryError:
            # a file above it (`--run-dir /dev/null/x`): nothing there, as for a missing folder (creating the run
            # then fails with its reason); a file in the folder's place (`events` a file) is damage to name
            if not os.path.lexists(path):
                return []
            raise RunDirError(f"{path} is a file where the run directory needs a folder") from None

    def read(self, rel: str) -> bytes:
        with open(self.path(rel), "rb") as f:
            return f.read()

    def _fsync_dir(self, rel_dir: str) -> None:
        _fsync_folder(self.path(rel_dir))

    def write_atomic(self, rel: str, data: bytes, exclusive: bool = False) -> None:
        folder = os.path.dirname(rel)
        tmp = os.path.join(folder, f".tmp-{uuid.uuid4().hex}")
        fd = os.open(self.path(tmp), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            try:
                view = memoryview(data)
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
                os.fsync(fd)
            finally:
                os.close(fd)
            if exclusive:
                try:  # link fails if the target exists: a second writer can never overwrite a segment
                    os.link(self.path(tmp), self.path(rel))
                except FileExistsError:
                    raise StoreError(f"{self.path(rel)} already exists: is another process writing this run?") from None
                except OSError as exc:
                    if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
                        raise
                    if os.path.exists(self.path(rel)):
                        raise StoreError(f"{self.path(rel)} already exists: is another process writing this run?") from None
                    os.replace(self.path(tmp), self.path(rel))
            else:
                os.replace(self.path(tmp), self.path(rel))
        finally:
            if os.path.exists(self.path(tmp)):
                os.unlink(self.path(tmp))
        self._fsync_dir(folder)

    def delete(self, rel: str) -> None:
        try:
            os.unlink(self.path(rel))
        except FileNotFoundError:
            pass

    def sync_dir(self, rel: str) -> None:
        self._fsync_dir(rel)


class _Arrow:
    """Any pyarrow filesystem: write to a temporary name, then move (one PUT on object stores).

    pyarrow exposes no fsync; durability is the filesystem's (object stores acknowledge a PUT once stored).
    """

    durable = False

    def __init__(self, fs: pafs.FileSystem, root: str) -> None:
        self.fs = fs
        self.root = root.rstrip("/") or "/"

    def path(self, rel: str) -> str:
        return f"{self.root}/{rel}" if rel else self.root

    def _info(self, rel: str) -> pafs.FileInfo:
        return self.fs.get_file_info(self.path(rel))

    def exists(self, rel: str) -> bool:
        return self._info(rel).type != pafs.FileType.NotFound

    def isdir(self, rel: str) -> bool:
        return self._info(rel).type == pafs.FileType.Directory

    def makedirs(self, rel: str) -> None:
        self.fs.create_dir(self.path(rel), recursive=True)

    def listdir(self, rel: str) -> list[str]:
        if not self.isdir(rel):
            return []
        infos = self.fs.get_file_info(pafs.FileSelector(self.path(rel), recursive=False))
        return sorted(i.base_name for i in infos)

    def read(self, rel: str) -> bytes:
        with self.fs.open_input_stream(self.path(rel)) as f:
            return f.read()

    def write_atomic(self, rel: str, data: bytes, exclusive: bool = False) -> None:
        if exclusive and self.exists(rel):
            raise StoreError(f"{self.path(rel)} already exists: is another process writing this run?")
        tmp = f"{os.path.dirname(rel)}/.tmp-{uuid.uuid4().hex}".lstrip("/")
        with self.fs.open_output_stream(self.path(tmp)) as f:
            f.write(data)
        self.fs.move(self.path(tmp), self.path(rel))

    def delete(self, rel: str) -> None:
        try:
            self.fs.delete_file(self.path(rel))
        except FileNotFoundError:
            pass

    def sync_dir(self, rel: str) -> None:
        pass


#: how long a gs:// run directory's requests are retried (a URI's own `retry_limit_seconds` wins): pyarrow's default,
#: google-cloud-cpp's 15 minutes, would leave `qbatch run/status/resume` of an unreachable bucket silent that long
GCS_RETRY_LIMIT_S = 60.0


def _backend(run_dir: str, filesystem: pafs.FileSystem | None) -> tuple[Any, str]:
    if not isinstance(run_dir, str) or not run_dir or "\x00" in run_dir:
        raise RunDirError(f"run_dir must be a non-empty path or URI; got {run_dir!r}")
    if filesystem is not None:
        if isinstance(filesystem, pafs.LocalFileSystem):
            return _Local(run_dir), os.path.abspath(run_dir)
        return _Arrow(filesystem, run_dir), run_dir
    if "://" not in run_dir:
        return _Local(run_dir), os.path.abspath(run_dir)
    uri = run_dir
    if run_dir.split("://", 1)[0].lower() in ("gs", "gcs") and "retry_limit_seconds=" not in run_dir:
        uri += ("&" if "?" in run_dir else "?") + f"retry_limit_seconds={GCS_RETRY_LIMIT_S:g}"
    try:
        fs, path = pafs.FileSystem.from_uri(uri)
    except (pa.ArrowException, ValueError, OSError) as exc:
        raise RunDirError(f"cannot open run_dir {run_dir!r}: {exc}") from None
    if isinstance(fs, pafs.LocalFileSystem):
        return _Local(path), run_dir
    try:  # reach it once here: an unreachable bucket is one line naming the URI, not a traceback at its first read
        fs.get_file_info(path)
    except (pa.ArrowException, OSError) as exc:
        raise RunDirError(f"cannot reach run_dir {run_dir!r}: {str(exc).splitlines()[0][:400]}") from None
    return _Arrow(fs, path), run_dir


# ---------------------------------------------------------------------------------------- the store

def _fsync_folder(path: str) -> None:
    """fsync a folder, so the entries made in it are durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _makedirs(path: str) -> None:
    """`os.makedirs(path, exist_ok=True)`, retried when a parent vanishes meanwhile (another run's
    `_check_new` probe removing the new parent they share)."""
    for attempt in range(5):
        try:
            os.makedirs(path, exist_ok=True)
            return
        except FileNotFoundError:
            if attempt == 4:
                raise


def _remove_empty(paths: Sequence[str]) -> None:
    """Remove each folder of `paths` (deepest first) that is still empty; others are left alone."""
    for made in paths:
        try:
            os.rmdir(made)
        except OSError:  # not empty (a sibling's run), already gone, or never made
            pass


def _check_new(backend: Any, shown: str) -> None:
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
    # empty `events/` and `checkpoints/` are what a `create` that died before writing config.yaml leaves behind
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


class RunStore:
    """A run directory: `config.yaml`, the event log under `events/`, checkpoints under `checkpoints/`.

    Use `RunStore.create` for a new run and `RunStore.open` for an existing one; do not call the constructor.
    One process writes a run at a time (the central actor); any number may read it.

    Attributes:
        run_dir: the run directory as given (local path made absolute, or the URI).
        config: the config dict stored in `config.yaml`.
        damage: one line per damaged segment, naming the sequence numbers of the events dropped when the
            log was last read (empty if the log is intact).
    """

    def __init__(self, backend: Any, run_dir: str, config: dict) -> None:
        self._fs = backend
        self._writer_lock: Any = None  # the open lock file while this store holds the writer lock
        self.run_dir = run_dir
        self.config = config
        self.damage: list[str] = []
        self.compact_files = _COMPACT_FILES
        self._next_seq = 0
        self._damaged: set[str] = set()
        self._segments: dict[str, tuple[int, int, int]] = {}  # name -> (first, last, rows)

    # ------------------------------------------------------------------ construction
    @classmethod
    def create(cls, run_dir: str, config: Any, filesystem: pafs.FileSystem | None = None) -> "RunStore":
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
            store._claim(text.encode())
        except _ClaimedElsewhere:  # the folder is the other run's now: nothing of it is undone
            raise
        except OSError as exc:  # a full or read-only disk: one line naming the folder, nothing left behind
            _undo_create(backend, made)
            raise RunDirError(f"cannot create the run directory {shown}: {exc.strerror or exc}") from None
        return store

    def _claim(self, config_text: bytes) -> None:
        """Write config.yaml where none exists yet; `_ClaimedElsewhere` naming the writer of the one that does."""
        header = f"# written by qbatch run, pid {os.getpid()} on {socket.gethostname()}\n".encode()
        try:
            self._fs.write_atomic("config.yaml", header + config_text, exclusive=True)
        except StoreError:  # the name exists: another run linked its config.yaml first
            raise _ClaimedElsewhere(f"`run_dir` {self.run_dir} was claimed a moment ago by another run "
                                    f"({self._claimant()}); choose another run_dir") from None

    def _claimant(self) -> str:
        """Who wrote config.yaml, as its first line says ("pid N on HOST", or "unknown")."""
        try:
            first = self._fs.read("config.yaml").decode(errors="replace").split("\n", 1)[0]
        except OSError:
            return "unknown"
        m = re.match(r"^# written by qbatch run, (pid \d+ on \S+)$", first)
        return m.group(1)[:200] if m else "unknown"

    @classmethod
    def open(cls, run_dir: str, filesystem: pafs.FileSystem | None = None) -> "RunStore":
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
            raise RunDirError(f"{shown}/events/ is missing: the run's log is gone, so it cannot be shown or resumed "
                              "(restore the folder from a backup, or start a new run)")
        store = cls(backend, shown, config)
        store.events()
        return store

    @staticmethod
    def check_new(run_dir: str, filesystem: pafs.FileSystem | None = None) -> None:
        """Raise `StoreError` unless `run_dir` is absent or an empty folder (a new run never writes among
        other files: `run_dir: .` or a home folder is refused, and an existing run is resumed, not re-created)."""
        backend, shown = _backend(run_dir, filesystem)
        _check_new(backend, shown)

    @staticmethod
    def exists(run_dir: str, filesystem: pafs.FileSystem | None = None) -> bool:
        """Whether `run_dir` holds a run (a `config.yaml`)."""
        backend, _ = _backend(run_dir, filesystem)
        return backend.exists("config.yaml")

    # ------------------------------------------------------------------ one writer
    def lock_writer(self) -> None:
        """Take the run's writer lock (a local folder: an exclusive `flock` on `writer.lock`, which the OS frees
        when this process ends, a crash included); held until `unlock_writer` or the process's end.

        Two writers of one log would each number their segments on from what they had read, and a reader keeps
        one of two events with the same number: a second `qbatch resume` of a running run would lose results silently.
        On another pyarrow filesystem there is no lock (one writer at a time is then the user's to keep).

        Raises:
            StoreError: another process holds the lock; the message names its pid and host.
        """
        if self._writer_lock is not None or not isinstance(self._fs, _Local):
            return
        try:
            import fcntl
        except ImportError:  # not POSIX
            return
        try:
            f = open(self._fs.path(_WRITER_LOCK), "a+")
        except OSError as exc:  # a read-only or full filesystem, a folder in its place
            raise RunDirError(f"cannot write the run directory {self.run_dir}: {_WRITER_LOCK}: "
                              f"{exc.strerror or exc}") from None
        try:
            # a few tries: `is_being_written` (status, report) holds a shared lock for an instant, and a writer
            # refused then would fail to start (with one try, 2 of 2000 takes under a loop of probes)
            for attempt in range(LOCK_TRIES):
                try:
                    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in _LOCK_BUSY or attempt == LOCK_TRIES - 1:
                        raise
                    time.sleep(LOCK_RETRY_S)
        except OSError as exc:
            if exc.errno not in _LOCK_BUSY:
                # a filesystem without flock (Lustre mounted without -o flock: ENOSYS): no lock, as on other
                # pyarrow filesystems, rather than refusing every run as if another were writing
                f.close()
                print(f"qbatch: no writer lock on the filesystem of {self.run_dir} (flock: "
                      f"{errno.errorcode.get(exc.errno, exc.errno)}); keep to one writer of this run at a time",
                      file=sys.stderr, flush=True)
                return
            f.seek(0)
            holder = f.read().strip() or "unknown"
            f.close()
            raise RunDirError(f"{self.run_dir} is being written by another run ({holder}); wait for it to end or "
                             "stop it before resuming (the central actor of a run whose driver was killed ends "
                             "within seconds)") from None
        try:
            f.seek(0)
            f.truncate()
            f.write(f"pid {os.getpid()} on {socket.gethostname()}")
            f.flush()
        except OSError as exc:  # a full disk
            f.close()
            raise RunDirError(f"cannot write the run directory {self.run_dir}: {_WRITER_LOCK}: "
                              f"{exc.strerror or exc}") from None
        self._writer_lock = f
        # the only writer now: temporary files of writes a crash cut short are nobody's (left, they would stay
        # in events/ for good)
        for folder in ("", "events", "checkpoints"):
            for name in self._fs.listdir(folder):
                if name.startswith(".tmp-"):
                    try:
                        os.remove(self._fs.path(os.path.join(folder, name)))
                    except OSError:
                        pass

    def unlock_writer(self) -> None:
        """Release the writer lock (if held)."""
        f, self._writer_lock = self._writer_lock, None
        if f is not None:
            f.close()  # closing the file frees the flock

    @staticmethod
    def check_writer_free(run_dir: str, filesystem: pafs.FileSystem | None = None) -> None:
        """Raise `StoreError` if another process holds `run_dir`'s writer lock (see `lock_writer`)."""
        store = RunStore(*_backend(run_dir, filesystem), {})
        store.lock_writer()
        store.unlock_writer()

    @staticmethod
    def discard_unstarted(run_dir: str, filesystem: pafs.FileSystem | None = None) -> bool:
        """Remove what `create` wrote (config.yaml, and the writer lock file) when the run recorded nothing: no
        event, no checkpoint, and no process writing it. Then a run whose central actor could not start does
        not block a rerun with the same `run_dir` (the folder and its empty `events/`, `checkpoints/` stay, as
        `create` accepts them). Returns whether it removed the run."""
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
        only: a shared `flock` taken and dropped at once (a writer taking the lock in that instant tries again,
        `lock_writer`)."""
        store = RunStore(*_backend(run_dir, filesystem), {})
        if not isinstance(store._fs, _Local):
            return None
        try:
            import fcntl
        except ImportError:  # not POSIX
            return None
        try:
            f = open(store._fs.path(_WRITER_LOCK), "r")
        except FileNotFoundError:  # never written by a version with the lock, or not yet started
            return False
        except OSError:
            return None
        with f:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError as exc:
                return True if exc.errno in _LOCK_BUSY else None
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
            return False

    def has_segments(self) -> bool:
        """Whether events/ holds at least one file named as a log segment (`seg-<first>-<last>.parquet`)."""
        return any(_SEGMENT_RE.match(n) for n in self._fs.listdir("events"))

    @property
    def durable_fsync(self) -> bool:
        """True for local folders (fsync of file and folder); False for other pyarrow filesystems."""
        return self._fs.durable

    # ------------------------------------------------------------------ writing
    def append(self, events: Sequence[Event]) -> None:
        """Append `events` as one segment; durable (written, fsynced, renamed, folder fsynced) on return.

        Raises:
            StoreError: an event field has the wrong type (the message names it); nothing is written then.
        """
        events = list(events)
        if not events:
            return
        first = self._next_seq
        table = _encode(events, first)  # validates before anything touches the disk
        last = first + len(events) - 1
        name = f"seg-{first:012d}-{last:012d}.parquet"
        self._fs.write_atomic(f"events/{name}", _parquet_bytes(table), exclusive=True)
        self._segments[name] = (first, last, len(events))
        self._next_seq = last + 1
        # the events are durable now: a failed compaction (an optimisation, tried again at the next append) must
        # not come out of `append` as if they were not (the actor would report them unrecorded, a retry would
        # write them twice)
        try:
            self._auto_compact()
        except Exception as exc:  # noqa: BLE001 -- the segments stay as they are, every event readable
            print(f"qbatch: compacting the log of {self.run_dir} failed ({type(exc).__name__}: {_first_line(exc)}); "
                  "its segments stay as they are", file=sys.stderr, flush=True)

    def _small_segments(self) -> list[str]:
        """Segments worth merging: small, and neither damaged nor in conflict (`compact` skips those, and
        counting them would make every append compact once 64 exist)."""
        return [n for n, (_, _, rows) in self._segments.items() if rows < _SMALL_ROWS and n not in self._damaged]

    def _auto_compact(self) -> None:
        small = self._small_segments()
        if len(small) >= self.compact_files:
            if self._foreign_overlap():  # another writer wrote over this one's numbers: re-read (finds the
                self.events()            # conflict, which is then never merged) before compacting
                small = self._small_segments()
            self.compact(small)

    def _hole_free_groups(self, names: list[str]) -> list[list[str]]:
        """`names` (sorted by first sequence number) cut where some number between two of them is held by no
        segment at all: a merge spanning it would be named for events it does not hold, and the hole (reported
        as missing events) would then read as that intact merge being short of rows."""
        holes = _holes((first, last) for first, last, _ in self._segments.values())
        groups: list[list[str]] = []
        for n in names:
            if groups and not any(self._segments[groups[-1][-1]][1] < a and b < self._segments[n][0]
                                  for a, b in holes):
                groups[-1].append(n)
            else:
                groups.append([n])
        return groups

    def _foreign_overlap(self) -> bool:
        """Whether a segment this store has not read overlaps the sequence numbers of one it has (one listing,
        no reads: the cheap test before an auto-compaction)."""
        known = [(first, last) for first, last, _ in self._segments.values()]
        for name in self._fs.listdir("events"):
            m = _SEGMENT_RE.match(name)
            if m is None or name in self._segments:
                continue
            first, last = int(m.group(1)), int(m.group(2))
            if any(first <= k_last and k_first <= last for k_first, k_last in known):
                return True
        return False

    def compact(self, names: Sequence[str] | None = None) -> int:
        """Merge segments (default: all intact ones) into one; returns how many files were merged.

        Crash-safe: the merged segment is written atomically before the old ones are deleted, and readers
        drop rows whose sequence number they have already read. Damaged segments are left in place.
        """
        if names is None:
            self.events()  # refresh the segment table and the list of damaged segments
        names = sorted(self._segments if names is None else names)
        names = [n for n in names if n in self._segments and n not in self._damaged]
        groups = self._hole_free_groups(names)
        if len(groups) > 1:  # a merge across a hole (a deleted segment) would claim its numbers
            return sum(self.compact(g) for g in groups if len(g) > 1)
        if len(names) < 2:
            return 0
        first, last = min(self._segments[n][0] for n in names), max(self._segments[n][1] for n in names)
        merged = f"seg-{first:012d}-{last:012d}.parquet"
        if merged not in names and merged in self._segments and merged not in self._damaged:
            # a merge of these segments written before a crash (it is no longer small, so auto-compaction did
            # not pick it): merge it in, or the new merge would collide with it and drop the rows only it holds
            names.append(merged)
        tables, readable = [], []
        for n in names:
            try:
                pf = pq.ParquetFile(io.BytesIO(self._fs.read(f"events/{n}")), page_checksum_verification=True)
                tables.append(pf.read().cast(_SCHEMA))
                readable.append(n)
            except Exception:  # noqa: BLE001 -- damaged since it was last read: leave it for the reader to report
                continue
        names = readable
        if len(names) < 2:
            return 0
        table = pa.concat_tables(tables).sort_by("seq")
        seqs = table.column("seq").to_pylist()
        keep = np.ones(len(seqs), dtype=bool)
        seen: set[int] = set()
        for i, s in enumerate(seqs):
            if s in seen:
                keep[i] = False
            seen.add(s)
        table = table.filter(pa.array(keep))
        first, last = min(self._segments[n][0] for n in names), max(self._segments[n][1] for n in names)
        merged = f"seg-{first:012d}-{last:012d}.parquet"
        # `merged` is among `names` only after a crash between writing a merge and deleting its sources:
        # the new table is a superset of it, so replacing it atomically is safe.
        self._fs.write_atomic(f"events/{merged}", _parquet_bytes(table), exclusive=merged not in names)
        for n in names:
            if n != merged:
                self._fs.delete(f"events/{n}")
            self._segments.pop(n, None)
        self._fs.sync_dir("events")
        self._segments[merged] = (first, last, table.num_rows)
        return len(names)

    # ------------------------------------------------------------------ reading
    def events(self, kinds: Iterable[str] | None = None) -> list[Event]:
        """All intact events in append order (optionally only the given kinds); refreshes `damage`."""
        for _ in range(5):
            try:
                pairs = self._read_all()
                break
            except FileNotFoundError:  # a segment vanished under a concurrent compaction: list again
                continue
        else:
            pairs = self._read_all()
        wanted = None if kinds is None else set(kinds)
        return [ev for _, ev in pairs if wanted is None or ev.kind in wanted]

    def _read_all(self) -> list[tuple[int, Event]]:
        # sorted: where segments overlap (a compaction that died before deleting its inputs) the same
        # segment wins on every read
        names = sorted(n for n in self._fs.listdir("events") if _SEGMENT_RE.match(n))
        segments: dict[str, tuple[int, int, int]] = {}
        damaged: dict[str, tuple[int, int, str]] = {}
        rows: dict[int, Event] = {}
        source: dict[int, str] = {}
        conflicts: dict[str, dict[str, list[int]]] = {}  # segment -> the segment whose rows won -> seqs
        for name in names:
            m = _SEGMENT_RE.match(name)
            first, last = int(m.group(1)), int(m.group(2))
            decoded, problem = self._read_segment(name)
            for seq, ev in decoded:
                if not first <= seq <= last:
                    continue
                if seq not in rows:
                    rows[seq], source[seq] = ev, name
                elif repr(rows[seq]) != repr(ev):  # overlaps must repeat a row exactly: else two writers
                    conflicts.setdefault(name, {}).setdefault(source[seq], []).append(seq)
            if problem is not None:
                damaged[name] = (first, last, problem)
            segments[name] = (first, last, len(decoded))
        # A segment that reads without error but lacks rows its name promises (e.g. a damaged footer that
        # still parses) is damaged too; a missing row is reported once, by a damaged segment covering it.
        covered: set[int] = set()
        for name, (first, last, _) in damaged.items():
            covered.update(range(first, last + 1))
        for name, (first, last, _) in segments.items():
            if name not in damaged and any(s not in rows and s not in covered for s in range(first, last + 1)):
                damaged[name] = (first, last, "fewer rows than its name says")
                covered.update(range(first, last + 1))
        self.damage = []
        # sequence numbers run from 0 without holes (`append` takes the next only once a segment is written):
        # a hole no segment's name covers is a segment file deleted, whose results a resume would run again
        # (unchecked, it reads as an intact log)
        holes = _holes((first, last) for first, last, _ in segments.values())
        if holes:
            n = sum(b - a + 1 for a, b in holes)
            spans = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in holes)
            self.damage.append(f"events/: no segment holds {n} event(s) with sequence number(s) {spans} (a segment "
                               "file deleted?); their results are not in the log")
        for name, (first, last, problem) in sorted(damaged.items()):
            lost = [s for s in range(first, last + 1) if s not in rows]
            self.damage.append(
                f"events/{name}: {problem}; dropped {len(lost)} event(s)"
                + (f" with sequence number(s) {_ranges(lost)}" if lost else "")
                + f", kept {last - first + 1 - len(lost)}"
            )
        for name, by_winner in sorted(conflicts.items()):
            for winner, seqs in sorted(by_winner.items()):
                self.damage.append(
                    f"events/{name}: {len(seqs)} event(s) with sequence number(s) {_ranges(seqs)} differ from "
                    f"those in events/{winner} (two writers on one run?); kept events/{winner}'s"
                )
        # a conflicting segment is never compacted: compaction would drop its rows without a trace;
        # nor is the segment that won: renamed by a merge, it could sort after the loser and stop winning
        self._damaged = set(damaged) | set(conflicts) | {w for by in conflicts.values() for w in by}
        self._segments = segments
        all_last = [last for first, last, _ in segments.values()]
        self._next_seq = max([self._next_seq - 1, *all_last]) + 1 if all_last else self._next_seq
        return sorted(rows.items())

    def _read_segment(self, name: str) -> tuple[list[tuple[int, Event]], str | None]:
        """Decoded rows of one segment and a description of its damage (None if intact)."""
        try:
            data = self._fs.read(f"events/{name}")
        except (IsADirectoryError, NotADirectoryError) as exc:  # no file to read: damage, not the log's failure
            return [], f"unreadable ({type(exc).__name__}: {_first_line(exc)})"
        # any other OSError (merged away meanwhile: the caller lists again; a transient EIO, ESTALE, EMFILE) is
        # raised: read as damage, its results would be dropped and a resume would run their trials again
        try:
            pf = pq.ParquetFile(io.BytesIO(data), page_checksum_verification=True)
        except Exception as exc:  # noqa: BLE001 -- any decoding failure means the footer is unusable
            return [], f"unreadable ({type(exc).__name__}: {_first_line(exc)}; {len(data)} bytes)"
        out: list[tuple[int, Event]] = []
        bad: list[str] = []
        for i in range(pf.num_row_groups):
            try:
                table = pf.read_row_group(i)
                if not table.schema.equals(_SCHEMA, check_metadata=False):
                    table = table.cast(_SCHEMA)
                rows, bad_rows = _decode(table)
                out.extend(rows)
                bad.extend(bad_rows)
            except Exception as exc:  # noqa: BLE001 -- a corrupt row group: keep the others
                bad.append(f"row group {i}: {type(exc).__name__}: {_first_line(exc)}")
        return out, ("; ".join(bad) if bad else None)

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, name: str, state: dict) -> None:
        """Save `state` atomically: `torch.save` if it holds tensors (or int keys, tuples), JSON otherwise.

        Only tensors, dicts with string keys, lists, tuples, str, int, float, bool and None are accepted,
        which is exactly what `torch.load(weights_only=True)` reads back without unpickling code.

        Raises:
            StoreError: a bad name, or a value of another type (the message names its key path).
        """
        _check_checkpoint_name(name)
        if not isinstance(state, Mapping):
            raise StoreError(f"checkpoint {name!r} must be a dict; got {type(state).__name__}")
        if _check_state(state, f"checkpoint {name!r}"):  # tensors, int keys or tuples: JSON would not keep them
            import torch

            buf = io.BytesIO()
            torch.save(dict(state), buf)
            new, old, data = "pt", "json", buf.getvalue()
        else:
            new, old, data = "json", "pt", json.dumps(state, allow_nan=True).encode()
        # the other format's file goes first: `load_checkpoint` prefers .pt, so a crash between the two steps
        # must leave no checkpoint (a cold start) rather than a stale one that would be loaded as current
        self._fs.delete(f"checkpoints/{name}.{old}")
        self._fs.write_atomic(f"checkpoints/{name}.{new}", data)

    def load_checkpoint(self, name: str) -> dict | None:
        """The state saved under `name`, or None if there is none. Never unpickles code.

        Raises:
            StoreError: the file exists but cannot be read safely (corrupt, or holds non-weights objects).
        """
        _check_checkpoint_name(name)
        if self._fs.exists(f"checkpoints/{name}.pt"):
            import torch

            data = self._fs.read(f"checkpoints/{name}.pt")
            try:
                state = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
            except Exception as exc:  # noqa: BLE001 -- UnpicklingError, RuntimeError of a torn zip, ...
                raise StoreError(
                    f"checkpoint {name!r} cannot be loaded safely ({type(exc).__name__}: {_first_line(exc)})"
                ) from None
        elif self._fs.exists(f"checkpoints/{name}.json"):
            try:
                state = json.loads(self._fs.read(f"checkpoints/{name}.json"))
            except (ValueError, UnicodeDecodeError) as exc:
                raise StoreError(f"checkpoint {name!r} is not valid JSON: {_first_line(exc)}") from None
        else:
            return None
        if not isinstance(state, dict):
            raise StoreError(f"checkpoint {name!r} holds a {type(state).__name__}, not a dict")
        return state

    def checkpoints(self) -> list[str]:
        """Names of the saved checkpoints."""
        names = {os.path.splitext(n)[0] for n in self._fs.listdir("checkpoints") if n.endswith((".pt", ".json"))}
        return sorted(n for n in names if not n.startswith("."))

    def __repr__(self) -> str:
        return f"RunStore({self.run_dir!r}, segments={len(self._segments)}, damage={len(self.damage)})"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


def _check_checkpoint_name(name: Any) -> None:
    if not isinstance(name, str) or not _CHECKPOINT_NAME_RE.match(name):
        raise StoreError(
            f"checkpoint name must be 1-128 characters of letters, digits, '_', '.', '-' (not starting with "
            f"'.' or '-'); got {name!r}"
        )


def _check_state(value: Any, where: str) -> bool:
    """Raise StoreError if `value` holds a type weights_only cannot load; return whether JSON would not keep it
    as it is: it holds tensors, or non-str keys or tuples, which JSON turns into strings and lists (a checkpoint
    would come back changed, and keys 1 and "1" would merge into one)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return False
    if type(value).__module__.startswith("torch"):
        import torch

        if isinstance(value, torch.Tensor):
            return True
    if isinstance(value, Mapping):
        found = False
        for k, v in value.items():
            if not isinstance(k, (str, int)):
                raise StoreError(f"{where} has a key {k!r} of type {type(k).__name__}; use str or int keys")
            found = _check_state(v, f"{where}[{k!r}]") or not isinstance(k, str) or found
        if not isinstance(value, dict):
            raise StoreError(f"{where} is a {type(value).__name__}; use a plain dict")
        return found
    if isinstance(value, (list, tuple)):
        found = isinstance(value, tuple)
        for i, v in enumerate(value):
            found = _check_state(v, f"{where}[{i}]") or found
        return found
    raise StoreError(
        f"{where} is a {type(value).__name__}; checkpoints hold only tensors, dicts, lists, tuples, str, int, "
        "float, bool and None (convert numpy arrays with torch.as_tensor)"
    )


# ---------------------------------------------------------------------------------------- replay
@dataclass
class TrialRecord:
    """One trial as replayed from the log (exactly-once: the first completed/failed event wins).

    `status` is "proposed" (not started), "running" (started, no result), "completed" or "failed".
    `duplicates` counts completed/failed events after the first one (ignored by the replay).
    """

    trial_id: str
    status: str
    batch_id: int | None = None
    params: dict | None = None
    x: list[float] | None = None
    value: float | None = None
    forecast: dict | None = None
    error: str | None = None
    traceback: str | None = None
    node_id: str | None = None
    pid: int | None = None
    attempt: int = 0
    proposed_at: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    info: dict | None = None
    duplicates: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def trials_table(events: Iterable[Event]) -> list[TrialRecord]:
    """One `TrialRecord` per trial_id, in order of first appearance (refit events are skipped).

    The first completed/failed event of a trial fixes its outcome; later ones only increase `duplicates`.
    Params, x, batch and forecast are taken from the first event that carries them (normally "proposed").
    """
    trials: dict[str, TrialRecord] = {}
    for ev in events:
        if ev.kind == "refit" or not ev.trial_id:
            continue
        rec = trials.get(ev.trial_id)
        if rec is None:
            rec = trials[ev.trial_id] = TrialRecord(trial_id=ev.trial_id, status="proposed")
        for name in ("batch_id", "params", "x", "forecast"):
            if getattr(rec, name) is None and getattr(ev, name) is not None:
                setattr(rec, name, getattr(ev, name))
        terminal = rec.status in ("completed", "failed")
        if ev.kind == "proposed":
            if rec.proposed_at is None:
                rec.proposed_at = ev.time
        elif ev.kind == "started":
            if not terminal:
                rec.status = "running"
                rec.started_at = ev.started_at if ev.started_at is not None else ev.time
                rec.node_id, rec.pid, rec.attempt = ev.node_id, ev.pid, ev.attempt
        else:  # completed | failed
            if terminal:
                rec.duplicates += 1
                continue
            rec.status = ev.kind
            rec.value = ev.value if ev.kind == "completed" else None
            rec.error, rec.traceback = ev.error, ev.traceback
            rec.started_at = ev.started_at if ev.started_at is not None else rec.started_at
            rec.ended_at = ev.ended_at if ev.ended_at is not None else ev.time
            rec.node_id = ev.node_id if ev.node_id is not None else rec.node_id
            rec.pid = ev.pid if ev.pid is not None else rec.pid
            rec.attempt = ev.attempt
            rec.info = ev.info
    return list(trials.values())


def status_counts(trials: Sequence[TrialRecord]) -> dict[str, int]:
    """How many trials are in each status (all four keys present)."""
    c = Counter(t.status for t in trials)
    return {k: c.get(k, 0) for k in ("proposed", "running", "completed", "failed")}


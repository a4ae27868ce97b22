"""Where a run directory lives: a local folder or any pyarrow filesystem, behind one small interface.

docs/event-log.md "How the log is written": a write goes to a temporary name and is moved into place, so a
file is complete or absent. `_Local` fsyncs the file and its folder before a write returns (a new folder is
fsynced into its parents too); `_Arrow` leaves durability to the filesystem (an object store acknowledges a
PUT once stored). `_backend` picks one for a run directory's path or URI.
"""

from __future__ import annotations

import errno
import os
import uuid
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from orchestrator.store.errors import RunDirError, StoreError


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
        """Make the folder and its missing parents, each made one fsynced into its parent (top down: `runs/`
        as well as the run directory): without that a power loss could take a new run directory, and the
        events acknowledged in it, away."""
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
            # a file above it (`--run-dir /dev/null/x`): nothing there, as for a missing folder (creating the
            # run then fails with its reason); a file in the folder's place (`events` a file) is damage to
            # name
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
                    raise StoreError(f"{self.path(rel)} already exists: is another process writing this "
                                     "run?") from None
                except OSError as exc:
                    if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
                        raise
                    if os.path.exists(self.path(rel)):
                        raise StoreError(f"{self.path(rel)} already exists: is another process writing this "
                                         "run?") from None
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


#: how long a gs:// run directory's requests are retried (a URI's own `retry_limit_seconds` wins): pyarrow's
#: default, google-cloud-cpp's 15 minutes, would leave `qbatch run/status/resume` of an unreachable bucket
#: silent that long
GCS_RETRY_LIMIT_S = 60.0


def _backend(run_dir: str, filesystem: pafs.FileSystem | None) -> tuple[Any, str]:
    """The backend that holds `run_dir`, and `run_dir` as messages show it (a local path made absolute)."""
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
    # reach it once here: an unreachable bucket is one line naming the URI, not a traceback at its first read
    try:
        fs.get_file_info(path)
    except (pa.ArrowException, OSError) as exc:
        raise RunDirError(f"cannot reach run_dir {run_dir!r}: {str(exc).splitlines()[0][:400]}") from None
    return _Arrow(fs, path), run_dir


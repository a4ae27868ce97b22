"""The writer lock of a run directory: one process writes a run at a time, any number read it.

docs/event-log.md "How the log is written": two writers of one log would each number their segments on from
what they had read, and a reader keeps one of two events with the same number. A local folder's lock is an
exclusive `flock` on `writer.lock`, which the OS frees when the process ends (a crash included); the file
names the holder's pid and host. Other pyarrow filesystems have no lock (one writer at a time is then the
user's to keep), nor has a filesystem without `flock`, which says so once.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import time
from typing import Any

from orchestrator.store.errors import RunDirError
from orchestrator.store.filesystems import _Local

logger = logging.getLogger(__name__)

#: the run's writer lock file (`WriterLock`)
_WRITER_LOCK = "writer.lock"
#: takes of the writer lock before a writer is refused, and the pause between them (`WriterLock.acquire`)
LOCK_TRIES = 10
LOCK_RETRY_S = 0.02
#: the errnos of a `flock` that another holder of the lock refused
_LOCK_BUSY = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)


class WriterLock:
    """The writer lock of the run directory on `backend`; `run_dir` is the directory as messages show it."""

    def __init__(self, backend: Any, run_dir: str) -> None:
        self._fs = backend
        self._run_dir = run_dir
        self._file: Any = None  # the open lock file while the lock is held

    def acquire(self) -> None:
        """Take the lock (a no-op when held already, or where there is no lock); held until `release` or
        the process's end. Once held, the temporary files of writes a crash cut short are removed: they are
        nobody's.

        Raises:
            RunDirError: another process holds the lock (the message names its pid and host), or the lock file
                cannot be written.
        """
        if self._file is not None or not isinstance(self._fs, _Local):
            return
        try:
            import fcntl
        except ImportError:  # not POSIX
            return
        try:
            f = open(self._fs.path(_WRITER_LOCK), "a+")
        except OSError as exc:  # a read-only or full filesystem, a folder in its place
            raise RunDirError(f"cannot write the run directory {self._run_dir}: {_WRITER_LOCK}: "
                              f"{exc.strerror or exc}") from None
        try:
            # a few tries: `is_held` (status, report) holds a shared lock for an instant, and a writer
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
                logger.warning(
                    "qbatch: no writer lock on the filesystem of %s (flock: %s); keep to one "
                    "writer of this run at a time",
                    self._run_dir,
                    errno.errorcode.get(exc.errno, exc.errno),
                )
                return
            f.seek(0)
            holder = f.read().strip() or "unknown"
            f.close()
            raise RunDirError(f"{self._run_dir} is being written by another run ({holder}); wait for it to "
                             "end or stop it before resuming (the central actor of a run whose driver was "
                             "killed ends within seconds)") from None
        try:
            f.seek(0)
            f.truncate()
            f.write(f"pid {os.getpid()} on {socket.gethostname()}")
            f.flush()
        except OSError as exc:  # a full disk
            f.close()
            raise RunDirError(f"cannot write the run directory {self._run_dir}: {_WRITER_LOCK}: "
                              f"{exc.strerror or exc}") from None
        self._file = f
        _remove_temporaries(self._fs)

    def release(self) -> None:
        """Release the lock (if held)."""
        f, self._file = self._file, None
        if f is not None:
            f.close()  # closing the file frees the flock

    @staticmethod
    def is_held(backend: Any) -> bool | None:
        """Whether a process holds the lock of the run directory on `backend` now: True or False for a local
        folder; None where it cannot tell (another pyarrow filesystem, no flock). Reads only: a shared `flock`
        taken and dropped at once (a writer taking the lock in that instant tries again, `acquire`)."""
        if not isinstance(backend, _Local):
            return None
        try:
            import fcntl
        except ImportError:  # not POSIX
            return None
        try:
            f = open(backend.path(_WRITER_LOCK))
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


def _remove_temporaries(backend: Any) -> None:
    """Remove the temporary files (`.tmp-*`) of writes a crash cut short, which only the writer may do: left,
    they would stay in events/ for good."""
    for folder in ("", "events", "checkpoints"):
        for name in backend.listdir(folder):
            if name.startswith(".tmp-"):
                try:
                    os.remove(backend.path(os.path.join(folder, name)))
                except OSError:
                    pass

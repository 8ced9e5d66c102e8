"""One server per data file: an exclusive `flock` on `<data_path>.lock`, held for the whole run.

Two supervisors on one database would both recover and serve the same jobs, running each one
twice. The supervisor takes this lock before it starts any child and keeps the descriptor open
until it exits; the kernel drops a `flock` lock when its last descriptor closes, so a
supervisor killed with SIGKILL never leaves a lock behind. The lock file holds the PID of its
holder, for the refusal message; it is never deleted (deleting a lock file lets two processes
lock two different inodes under one name).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from shardq.runtime.supervisor._preflight import StartupError

__all__ = ["DataLock", "lock_path"]


def lock_path(data_path: Path) -> Path:
    """The lock file of the database at `data_path`: beside it, named after it. Symbolic
    links are resolved first, so two spellings of one database share one lock."""
    real = data_path.resolve()
    return real.with_name(real.name + ".lock")


class DataLock:
    """The held lock of one data path; `release()` (or process exit) gives it up.

    The descriptor is not inheritable (Python's default), so no child keeps the lock alive
    after the supervisor is gone.
    """

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, data_path: Path, pid: int) -> DataLock:
        """Lock `data_path`'s lock file and write `pid` into it.

        Raises `StartupError` naming the path and the holder's PID if another process holds
        it, or naming the path and the reason if the file cannot be opened.
        """
        path = lock_path(data_path)
        try:
            # No O_TRUNC: until we hold the lock, the PID in the file is the holder's.
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise StartupError(f"cannot open the lock file {path}: {e.strerror or e}") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            raise StartupError(
                f"data_path {data_path} is in use by another shardq server (PID {holder}, "
                f"lock file {path}); stop it first or choose another data_path"
            ) from None
        except OSError as e:
            os.close(fd)
            raise StartupError(f"cannot lock {path}: {e.strerror or e}") from e
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{pid}\n".encode(), 0)
        return cls(path, fd)

    def release(self) -> None:
        """Unlock and close; safe to call twice. The file stays (see the module docstring)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)  # a stale PID would name an unrelated process later
            os.close(fd)


def _read_pid(fd: int) -> str:
    """The PID the holder wrote, or "unknown" if it has not written it yet."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return "unknown"
    return text if text.isdigit() else "unknown"

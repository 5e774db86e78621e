"""One training process per run directory: an advisory lock on ``RUN_DIR/.lock``.

``fcntl.flock`` on the lock file, held for the whole run: the kernel drops it when the process
ends, however it ends (SIGKILL included), so a crashed run never leaves a stale lock. The file
holds the holder's pid and host, which a second process names in its error. (``filelock`` offers
the same lock but no place for the holder's name, which the error needs.)
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import platform
from pathlib import Path

LOCK_FILE = ".lock"


class RunLockedError(RuntimeError):
    """Another process is training in the run directory."""


def check_unlocked(run_dir: Path) -> None:
    """Raise :class:`RunLockedError` if a process holds ``run_dir``'s lock (creates nothing).

    For a clear error before reading a run that another process is changing; the lock itself
    is :class:`RunLock`'s.
    """
    with contextlib.suppress(FileNotFoundError):  # no lock file: never locked
        RunLock(run_dir, create=False).release()


class RunLock:
    """An exclusive lock on a run directory, taken by the constructor.

    Args:
        run_dir: an existing run directory.
        create: create the lock file if it is missing (else ``FileNotFoundError``).

    Raises:
        RunLockedError: another process holds it (the message names its pid and host).
        OSError: the lock file cannot be created.
    """

    def __init__(self, run_dir: Path, create: bool = True) -> None:
        path = Path(run_dir) / LOCK_FILE
        flags = (os.O_RDWR | os.O_CREAT if create else os.O_RDONLY) | os.O_NOFOLLOW
        try:
            self._fd: int | None = os.open(path, flags, 0o644)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            raise OSError(
                exc.errno,
                "is a symbolic link; the lock is the run's own file (through a link the run "
                "would write elsewhere): remove it",
                str(path),
            ) from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(self._fd, 200).decode(errors="replace").strip() or "unknown process"
            self.release()
            raise RunLockedError(
                f"run directory {run_dir} is in use by another training process ({holder}); "
                "wait for it to end or stop it first"
            ) from None
        if create:
            os.ftruncate(self._fd, 0)
            os.write(self._fd, f"pid {os.getpid()} on {platform.node()}\n".encode())

    def release(self) -> None:
        """Drop the lock (closing the file releases it); idempotent."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

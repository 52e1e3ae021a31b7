"""One process per run directory: ``run.lock``, held by the running ``primaldual fit``.

The lock is an OS file lock (``flock``) on ``<run_dir>/run.lock``: the kernel releases it when the process exits,
however it exits (SIGKILL included), so a crashed run never blocks the next one. The file records the holder's PID,
host, start time and command, for the message a second process gets. A lock file left by a process that is gone
(a stale lock: its PID no longer runs, and nothing holds the OS lock) is simply taken over; a live holder makes
:meth:`RunLock.acquire` raise :class:`RunLockedError` naming its PID. ``--fresh`` takes the lock before deleting
anything, so it too refuses while a live process holds it. On platforms without ``fcntl`` (Windows) runs are not
locked.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import stat
import sys
import time
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["LOCK_NAME", "LockFileError", "RunLock", "RunLockedError"]

LOCK_NAME = "run.lock"


class LockFileError(ValueError):
    """``run.lock`` exists but is not a regular file (a symlink, a FIFO): refused, never followed or replaced."""


class RunLockedError(FileExistsError):
    """The run directory is in use by another live process; the message names its PID."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except OSError:
        return False
    return True


class RunLock:
    """``with RunLock(run_dir): ...`` holds ``run_dir/run.lock`` for the block (see the module docstring).

    Args:
        run_dir: the run directory (created if missing).
        purpose: what the holder does, for the message (e.g. ``"primaldual fit"``).
    """

    def __init__(self, run_dir: str | os.PathLike, purpose: str = "primaldual fit") -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self.purpose = purpose
        self._fd: int | None = None
        self._created = False

    # -- inspection ---------------------------------------------------------------------------------------------

    def _read(self, fd: int) -> dict[str, Any]:
        for _ in range(20):  # the holder may be between truncate and write
            os.lseek(fd, 0, os.SEEK_SET)
            raw = os.read(fd, 1 << 16)
            with contextlib.suppress(ValueError):
                info = json.loads(raw.decode("utf-8", "replace"))
                if isinstance(info, dict):
                    return info
            time.sleep(0.01)
        return {}

    def holder(self) -> dict[str, Any] | None:
        """The live holder's record (``pid``, ``host``, ``started``, ``command``), or None when nobody holds it."""
        if fcntl is None or not self.path.is_file():
            return None
        if self._fd is not None:
            return self._record()
        try:
            fd = self._open(os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return self._read(fd)
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            os.close(fd)

    def _open(self, flags: int) -> int:
        """Open the lock file without following a symlink or blocking on a FIFO; anything but a regular file (a
        symlink, a FIFO, a directory) is refused, so the lock never writes into a file that is not its own."""
        extra = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
        try:
            fd = os.open(self.path, flags | extra, 0o644)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                raise LockFileError(self._not_a_file()) from None
            raise
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise LockFileError(self._not_a_file())
        return fd

    def _not_a_file(self) -> str:
        return (
            f"{self.path} is not a regular file (a symlink, a FIFO or a directory): primaldual writes its lock record "
            "into that name and will not follow or replace something it did not create; remove it, or pass another "
            "--run-dir"
        )

    def _message(self, info: dict[str, Any], action: str) -> str:
        pid = info.get("pid", "unknown")
        where = f" on {info['host']}" if info.get("host") not in (None, socket.gethostname()) else ""
        since = f", started {info['started']}" if info.get("started") else ""
        gone = ""
        if isinstance(pid, int) and not where and not _pid_alive(pid):
            gone = " (that process has exited; a child of it still holds the lock, retry in a few seconds)"
        return (
            f"{action}: run directory {self.run_dir} is in use by process {pid}{where} "
            f"({info.get('purpose', 'primaldual fit')}{since}){gone}; wait for it to finish or stop it "
            f"(kill {pid}); two processes in one run directory would overwrite each other's checkpoints"
        )

    def check_free(self, action: str = "refused") -> None:
        """Raise :class:`RunLockedError` if a live process holds the lock (without taking it)."""
        info = self.holder()
        if info is not None and self._fd is None:
            raise RunLockedError(self._message(info, action))

    # -- holding ------------------------------------------------------------------------------------------------

    def _record(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "purpose": self.purpose,
            "command": " ".join(sys.argv),
        }

    def acquire(self, action: str = "refused") -> RunLock:
        """Take the lock (creating the run directory), or raise :class:`RunLockedError` naming the holder's PID."""
        if self._fd is not None:
            raise RuntimeError(f"{self.path} is already held by this RunLock")
        self._created = not self.run_dir.exists()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if fcntl is None:  # pragma: no cover - Windows
            return self
        for _ in range(10):
            fd = self._open(os.O_RDWR | os.O_CREAT)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                info = self._read(fd)
                os.close(fd)
                raise RunLockedError(self._message(info, action)) from None
            try:  # the file we locked must still be the one at the path (a releasing holder unlinks it)
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, (json.dumps(self._record()) + "\n").encode())
            os.fsync(fd)
            self._fd = fd
            return self
        raise RunLockedError(f"{action}: could not take {self.path}: it keeps being replaced by another process")

    def release(self) -> None:
        """Remove the lock file and let go of the lock (a no-op when not held); remove the run directory too when
        this lock created it and it is empty."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            if os.fstat(fd).st_ino == os.stat(self.path).st_ino:
                os.unlink(self.path)
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
        if self._created:  # a directory this lock created and nothing filled (the run failed before writing)
            with contextlib.suppress(OSError):
                self.run_dir.rmdir()

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> RunLock:
        return self.acquire() if self._fd is None else self

    def __exit__(self, *exc: object) -> None:
        self.release()

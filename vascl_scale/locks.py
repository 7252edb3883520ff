"""Advisory locks on folders: one process at a time writes into a run directory or a data
directory.

An exclusive, non-blocking ``flock`` ends with the process holding it, however it ends (SIGKILL
included), so a dead holder never blocks anyone; the lock file keeps the holder's pid, host
and start time for the message another process gets.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO


class FolderLock:
    """An exclusive, non-blocking ``flock`` on ``lock_file``, held until :meth:`release` (or the end
    of the ``with`` block) or until the process ends: the kernel drops it however the process
    ends, SIGKILL included, so a dead holder never blocks anyone. The file keeps the holder's pid,
    host and start time; ``in_use(owner)`` is the one-line error another process gets."""

    def __init__(self, lock_file: Path, in_use: Callable[[str], str]) -> None:
        self.path = Path(lock_file)
        self.in_use = in_use
        self._handle: IO[str] | None = None

    def acquire(self) -> FolderLock:
        """Take the lock or raise ``ValueError(in_use(owner))``."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = self.path.open("a+", encoding="utf-8")  # "a+": never truncates the holder's owner line
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            owner = handle.read().strip() or "another process"
            handle.close()
            raise ValueError(self.in_use(owner)) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        handle.flush()
        self._handle = handle
        return self

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()  # closing the only descriptor drops the flock
            self._handle = None

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc_info) -> None:
        self.release()

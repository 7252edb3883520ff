"""The file system, written so that a process killed at any moment leaves a usable state.

Files and directories appear whole or not at all. A file is written under a staging name beside
it and renamed over it (:func:`replace_file`, :func:`written_atomically`). A directory is written
under a staging name beside its target and renamed into place (:func:`staging_directory`,
:func:`replace_directory`); the directory it replaces (or one being deleted) is first renamed
away to a ``.trash-*`` name, so a kill leaves the old complete directory, the new complete one,
or neither, and never a half-written or half-deleted one under the target's name. Leftover
``.tmp-*`` / ``.trash-*`` directories are removed by :func:`staging_directory`. A write that
meets a full disk is told apart from other failures by :func:`full_disk`, for one line that
says so.

Locks are advisory ``flock`` locks: the kernel drops one however its process ends (SIGKILL
included), so a dead holder never blocks anyone. :class:`FolderLock` gives one process at a time
a folder (a run directory, a data directory, a sweep cell); :func:`locked_staging_directory`
gives each of several concurrent writers into one folder its own staging directory, and removes
those of writers that were killed.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO

logger = logging.getLogger(__name__)

# The errors of a file system without flock (e.g. Lustre mounted without it).
NO_FLOCK = (errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# --- files and directories that appear whole ---


@contextmanager
def written_atomically(path: Path) -> Iterator[Path]:
    """Yield a staging path (``.tmp-<name>`` beside ``path``) for the caller to write; once the
    block ends it is renamed over ``path``, so a kill leaves the old file or the new one, never a
    half-written one. On an error the staging file is removed and ``path`` left as it was."""
    path = Path(path)
    staging = path.with_name(f".tmp-{path.name}")
    try:
        yield staging
    except BaseException:
        staging.unlink(missing_ok=True)
        raise
    os.replace(staging, path)


def replace_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (:func:`written_atomically`); a full disk is a
    ValueError naming the file (:func:`full_disk`), which every command reports in one line."""
    try:
        with written_atomically(path) as staging:
            staging.write_text(text, encoding="utf-8")
    except OSError as err:
        problem = full_disk(err, path)
        if problem is None:
            raise
        raise ValueError(
            f"could not write {path}: {problem}; free space there (or write elsewhere) and run the command again"
        ) from err


def staging_directory(target: Path) -> Path:
    """A fresh, empty ``.tmp-<name>`` beside ``target`` (what a killed writer left is removed)."""
    target = Path(target)
    for stale in [*target.parent.glob(f".tmp-{target.name}"), *target.parent.glob(f".trash-{target.name}-*")]:
        shutil.rmtree(stale, ignore_errors=True)
    staging = target.parent / f".tmp-{target.name}"
    staging.mkdir(parents=True)
    return staging


def remove_directory(directory: Path) -> None:
    """Delete ``directory``: renamed away first, so a kill mid-delete leaves nothing under its name."""
    trash = directory.parent / f".trash-{directory.name}-{uuid.uuid4().hex[:8]}"
    directory.rename(trash)
    shutil.rmtree(trash)


def replace_directory(staging: Path, target: Path) -> None:
    """Make the complete ``staging`` directory ``target``, replacing any previous one."""
    if target.exists():
        remove_directory(target)
    staging.rename(target)


# --- a full disk ---

# A write that failed on a file system left with less than this many free bytes is taken for a
# full disk: torch's own writer (torch.save) reports one without an errno ("unexpected pos ...").
FULL_DISK_BYTES = 1 << 20
FULL_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT)  # no space left; the user's quota used up


def free_bytes(path: Path) -> int:
    """Bytes this user may still write on the file system of ``path`` (or of its nearest existing parent)."""
    path = Path(path).absolute()
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def _errors_within(err: BaseException) -> Iterator[BaseException]:
    """``err``, the errors it was raised from, and each rank's error inside a DCP
    ``CheckpointException`` (its ``failures``: rank -> (error, traceback))."""
    pending, seen = [err], set()
    while pending:
        error = pending.pop()
        if error is None or id(error) in seen:
            continue
        seen.add(id(error))
        yield error
        pending += [error.__cause__, error.__context__]
        failures = getattr(error, "failures", None)
        if isinstance(failures, dict):
            pending += [failure[0] for failure in failures.values() if isinstance(failure, tuple) and failure]


def full_disk(err: BaseException, path: Path) -> str | None:
    """What was full, when ``err``, raised while writing under ``path``, came from a full disk
    (errno ENOSPC or EDQUOT anywhere in it, or any failed write on a file system left with under
    :data:`FULL_DISK_BYTES`); None for any other error."""
    errors = [error for error in _errors_within(err) if isinstance(error, Exception)]
    if not errors:  # an interrupt or a signal, not a failed write
        return None
    codes = {error.errno for error in errors if isinstance(error, OSError)} & set(FULL_DISK_ERRNOS)
    free = free_bytes(path)
    if not codes and free >= FULL_DISK_BYTES:
        return None
    what = "the disk quota is used up" if errno.EDQUOT in codes else "the disk is full (no space left on device)"
    return f"{what}: {free / 2**20:.1f} MiB free on the file system of {path}"


# --- locks ---


class FolderLock:
    """An exclusive, non-blocking ``flock`` on ``lock_file``, held until :meth:`release` (or the end
    of the ``with`` block) or until the process ends: the kernel drops it however the process
    ends, SIGKILL included, so a dead holder never blocks anyone. The file keeps the holder's pid,
    host and start time; ``in_use(owner)`` is the one-line error another process gets.

    ``if_unsupported``: on a file system without flock, log this warning and go on unlocked
    (the descriptor is still held, e.g. to pass on to commands); None: raise the ``OSError``.
    """

    def __init__(self, lock_file: Path, in_use: Callable[[str], str], if_unsupported: str | None = None) -> None:
        self.path = Path(lock_file)
        self.in_use = in_use
        self.if_unsupported = if_unsupported
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
        except OSError as err:
            if self.if_unsupported is None or err.errno not in NO_FLOCK:
                handle.close()
                raise
            logger.warning("cannot lock %s (%s): %s", self.path, err, self.if_unsupported)
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        handle.flush()
        self._handle = handle
        return self

    def fileno(self) -> int:
        """The descriptor that holds the lock (while held)."""
        assert self._handle is not None, "the lock is not held"
        return self._handle.fileno()

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()  # closing the only descriptor drops the flock
            self._handle = None

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc_info) -> None:
        self.release()


def _lock_of(staging: Path) -> Path:
    return staging.with_name(staging.name + ".lock")


def _held(lock: Path, remove_if_free: bool = False) -> bool:
    """Whether a live process holds the flock on ``lock`` (False when there is no such file).
    ``remove_if_free``: a lock no process holds is removed while it is locked here, so a writer
    that created it and is about to lock it sees it gone (:func:`_new_lock`)."""
    try:
        descriptor = os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if remove_if_free:
            lock.unlink(missing_ok=True)
    except OSError:  # held; or a file system without flock, where nothing can be judged stale: keep it
        return True
    finally:
        os.close(descriptor)
    return False


def _new_lock(folder: Path, prefix: str) -> tuple[int, Path]:
    """A new ``<prefix>XXXX.lock`` in ``folder`` and its descriptor, flocked by this process.
    Another writer may remove the file as an orphan between its creation and the flock: then
    the path no longer names the locked file, and another is made."""
    while True:
        descriptor, name = tempfile.mkstemp(prefix=prefix, suffix=".lock", dir=folder)
        with suppress(OSError):  # no flock on this file system: then no staging is judged stale
            fcntl.flock(descriptor, fcntl.LOCK_EX)
        with suppress(FileNotFoundError):
            if os.stat(name).st_ino == os.fstat(descriptor).st_ino:
                return descriptor, Path(name)
        os.close(descriptor)


@contextmanager
def locked_staging_directory(folder: Path, prefix: str, writers: str) -> Iterator[Path]:
    """A new, empty ``<prefix>XXXX`` directory in ``folder`` for this writer; removed afterwards.

    Beside it, ``<prefix>XXXX.lock`` is flocked by this process from before the directory
    exists until after its lock file is gone, so a staging directory whose lock no process
    holds (or that has none, as written before locks) was left by a writer killed where no
    cleanup could run (SIGKILL, a lost node). Those are removed here, each named (``writers``
    says whose they were, e.g. "`data prepare`"), and so is a lock file that no process holds
    and whose directory was never made (a writer killed in between); a concurrent writer's
    live ones never are.
    """
    descriptor, lock = _new_lock(folder, prefix)
    staging = lock.with_name(lock.name.removesuffix(".lock"))
    try:
        left = sorted(folder.glob(prefix + "*"))
        orphans = [
            path
            for path in left
            if path.name.endswith(".lock")
            and path != lock
            and not path.with_name(path.name.removesuffix(".lock")).exists()
            and not _held(path, remove_if_free=True)
        ]
        stale = [path for path in left if path.is_dir() and not _held(_lock_of(path))]
        for path in stale:
            shutil.rmtree(path, ignore_errors=True)
            _lock_of(path).unlink(missing_ok=True)
        if stale or orphans:
            removed = [f"{len(stale)} staging directories"] if stale else []
            removed += [f"{len(orphans)} lock files without their directory"] if orphans else []
            logger.info(
                "removed %s left by interrupted %s runs: %s",
                " and ".join(removed),
                writers,
                ", ".join(str(path) for path in stale + orphans),
            )
        staging.mkdir()
        yield staging
    finally:
        lock.unlink(missing_ok=True)  # first: a staging directory without its lock is stale
        shutil.rmtree(staging, ignore_errors=True)
        os.close(descriptor)

"""Checking where a command will write, before it does any work.

A command that computes for minutes and then fails to write its result (a folder named by a
file, a read-only disk) loses the work; each output option is checked up front by one of these
two functions, which raise ``ValueError`` naming the option, the path and what is in the way.
An output file that already exists is replaced when the command finishes: the check logs that
up front, with when the file was written, so that a run's earlier results are not lost unseen
(and can still be kept, by stopping and choosing another path).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)


def _nearest_existing(path: Path) -> Path:
    """``path`` or its closest ancestor that exists (the folder a ``mkdir -p`` would start from)."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _check_writable_folder(folder: Path, option: str, target: Path) -> None:
    existing = _nearest_existing(folder)
    if not existing.is_dir():
        raise ValueError(f"{option} {target}: {existing} is a file, not a folder; choose another path")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"{option} {target}: {existing} is not writable; choose another path")


def check_output_file(path: str | Path, option: str) -> Path:
    """``path`` can be written as a file: it is not a folder, and its folder exists or can be made.
    A file already there is logged as the one this command will replace."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{option} {path}: is a folder; name a file inside it")
    _check_writable_folder(path.parent, option, path)
    if path.is_file():
        written = dt.datetime.fromtimestamp(path.stat().st_mtime).isoformat(sep=" ", timespec="seconds")
        logger.warning(
            "%s %s: this run will replace the file written %s (pass another %s to keep it)",
            option,
            path,
            written,
            option,
        )
    return path


def check_output_dir(path: str | Path, option: str) -> Path:
    """``path`` is a folder, or one can be made there."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{option} {path}: is a file, not a folder; choose another path")
    _check_writable_folder(path, option, path)
    return path

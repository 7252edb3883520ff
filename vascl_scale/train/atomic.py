"""Directories that appear whole or not at all: checkpoints, ``best/``, ``last/``, ``final/``;
and files rewritten in place (:func:`replace_file`).

A directory is written under a staging name beside its target and renamed into place; the
directory it replaces (or one being deleted) is first renamed away to a ``.trash-*`` name, so
a process killed at any moment leaves the old complete directory, the new complete one, or
neither, and never a half-written or half-deleted one under the target's name. Leftover
``.tmp-*`` / ``.trash-*`` directories are removed by :func:`staging_directory`.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path


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


def replace_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a staging file renamed over it: a kill leaves the old
    file or the new one, never a half-written one."""
    path = Path(path)
    staging = path.with_name(f".tmp-{path.name}")
    staging.write_text(text, encoding="utf-8")
    os.replace(staging, path)

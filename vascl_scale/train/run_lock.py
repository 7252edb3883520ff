"""One run per run directory: an advisory lock that ends with the processes holding it.

Two runs writing checkpoints into one directory corrupt each other (one deletes the other's
staging directory). The process that starts a run (the launcher, or the one process that
trains in place) takes an exclusive ``flock`` on ``<run>/.run.lock`` and keeps it until it
exits; the kernel releases it however the process ends, SIGKILL included, so a dead run
never holds a directory. A launcher also checks the directory once (reuse, resume
compatibility) before its workers start; they find ``VASCL_RUN_HELD`` in their environment
and neither lock nor check again. Workers started by another launcher (torchrun, srun) take
the lock on global rank 0 and check the directory themselves (see
:func:`vascl_scale.train.trainer.build_trainer`).
"""

from __future__ import annotations

from pathlib import Path

from vascl_scale.locks import FolderLock

LOCK_FILE = ".run.lock"
HELD_ENV = "VASCL_RUN_HELD"  # set for the workers of a launcher that holds and checked the run directory


class RunDirectoryLock(FolderLock):
    """An exclusive, non-blocking lock on a run directory, held until :meth:`release` or exit."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        super().__init__(
            self.run_dir / LOCK_FILE,
            lambda owner: (
                f"run directory {self.run_dir} is in use by another run ({owner}); wait for it to end "
                "or stop it, or pass another --output (the lock is released when that run's processes exit)"
            ),
        )

"""One run per run directory: an advisory lock that ends with the processes holding it.

Two runs writing checkpoints into one directory corrupt each other (one deletes the other's
staging directory). The process that starts a run (the launcher, or the one process that
trains in place) takes an exclusive ``flock`` on ``<run>/.run.lock`` and keeps it until it
exits; the kernel releases it however the process ends, SIGKILL included, so a dead run
never holds a directory. The process that makes the run plan takes it, before it checks the
directory (reuse, resume compatibility; :func:`vascl_scale.train.plan.make_plan`); workers
started by another launcher (torchrun, srun) take it on global rank 0 (see
:func:`vascl_scale.train.trainer.build_trainer`).
"""

from __future__ import annotations

from pathlib import Path

from vascl_scale.fs import FolderLock

LOCK_FILE = ".run.lock"


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

"""Run sweep cells through the real ``vascl-scale train`` and ``vascl-scale eval`` commands.

Each cell is a subprocess running exactly what a user would type (distributed settings
included), so a sweep measures the same code path as a single run, and one failing cell
cannot take the sweep down. A cell's directory holds:

    cells/<name>/run/          the training run directory (checkpoints, best/, final/)
    cells/<name>/train.log     the training command's output
    cells/<name>/eval.json     the evaluation report (``vascl-scale eval ... --output``)
    cells/<name>/status.json   {"state": "done" | "failed" | "interrupted", "error", "wall_seconds", ...}
    cells/<name>.lock          locked while a sweep (or a command it started) runs the cell

A cell whose status is "done" is skipped when the sweep runs again; any other cell is run
from scratch (a partial run directory is removed first, so every row of the table comes
from one uninterrupted run), unless its lock is held: then it is refused, never deleted.

SIGINT or SIGTERM to the sweep stops the running command's whole process group (the command
runs in a session of its own, so a terminal's Ctrl-C reaches only the sweep), records the
cell as "interrupted" and raises :class:`Interrupted` (see :func:`_run_logged`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from vascl_scale.fs import FolderLock, replace_file
from vascl_scale.sweep.grid import Cell, SweepPlan

logger = logging.getLogger(__name__)

DONE, FAILED, INTERRUPTED = "done", "failed", "interrupted"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
STOP_GRACE_SECONDS = 30.0  # how long a stopped command may take (e.g. to finish a checkpoint)


class Interrupted(BaseException):
    """SIGINT or SIGTERM stopped the sweep. A BaseException, like KeyboardInterrupt, so that
    no ``except Exception`` on the way up can swallow it."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


class _Stopper:
    """The sweep's SIGINT/SIGTERM handler. It remembers the first signal and raises it as
    :class:`Interrupted` only while :func:`_run_logged` waits for a command, which then stops
    that command; a signal at any other moment (say, while a command is being started) is
    raised by the next :meth:`check`, so no command can start unseen and be left running."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.waiting = False

    def __call__(self, signum: int, frame: object) -> None:
        self.signum = self.signum or signum
        if self.waiting:
            raise Interrupted(signum)

    def check(self) -> None:
        if self.signum is not None:
            raise Interrupted(self.signum)


_STOPPER = _Stopper()


@contextmanager
def _stop_signals() -> Iterator[None]:
    """Route SIGINT/SIGTERM to :data:`_STOPPER` in this block (a no-op when already routed, as
    for :func:`run_cell` inside :func:`run_sweep`)."""
    if signal.getsignal(signal.SIGINT) is _STOPPER:
        yield
        return
    _STOPPER.signum = None
    previous = {signum: signal.signal(signum, _STOPPER) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def cell_dir(sweep_dir: Path, cell: Cell) -> Path:
    return Path(sweep_dir) / "cells" / cell.name


def read_status(sweep_dir: Path, cell: Cell) -> dict[str, Any]:
    path = cell_dir(sweep_dir, cell) / "status.json"
    if not path.is_file():
        return {"state": "pending"}
    return json.loads(path.read_text(encoding="utf-8"))


def _write_status(directory: Path, status: dict[str, Any]) -> None:
    replace_file(directory / "status.json", json.dumps(status, indent=1) + "\n")


def _cell_lock(directory: Path) -> FolderLock:
    """The exclusive lock on ``<cell directory>.lock``, to be taken with ``with``.

    The lock sits beside the directory, which a run deletes and recreates. Its descriptor is
    also handed to the cell's commands, so the lock lasts as long as the last of them even
    when the sweep itself is killed (SIGKILL, a lost node) and cannot stop them.
    """
    return FolderLock(
        directory.with_name(directory.name + ".lock"),
        lambda owner: (
            f"cell {directory.name} is still being run by another sweep or by the training it "
            f"started; let it finish or stop it (see {directory / 'train.log'}), then rerun"
        ),
        if_unsupported="nothing stops a second sweep from rerunning this cell",
    )


def _stop_group(proc: subprocess.Popen, signum: int) -> None:
    """Send ``signum`` to the command's process group, give it STOP_GRACE_SECONDS to exit,
    then SIGKILL whatever of the group is left (all of it, or workers its launcher left)."""
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signum)
    try:
        proc.wait(timeout=STOP_GRACE_SECONDS)
    except (subprocess.TimeoutExpired, Interrupted):  # too slow, or asked again: stop waiting
        pass
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _run_logged(command: list[str], log_path: Path, env: dict[str, str], lock_fd: int) -> tuple[int, float]:
    """Run ``command`` with output appended to ``log_path``; (exit code, peak RSS in MiB).

    The command leads a new session (and so a process group of its own), which the sweep
    stops as a whole on SIGINT/SIGTERM before raising :class:`Interrupted`; ``lock_fd`` (the
    cell's lock) stays open in it. The peak RSS comes from wait4 on the child, which covers
    its whole process tree (every launcher worker it waited for): Linux reports the largest
    resident set among them.
    """
    _STOPPER.check()  # stopped between two commands: start no more
    with log_path.open("a", encoding="utf-8") as log:
        log.write(f"$ {' '.join(command)}\n")
        log.flush()
        proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, pass_fds=(lock_fd,)
        )
        try:
            _STOPPER.waiting = True
            _STOPPER.check()  # a signal that came while the command started
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
        except Interrupted as stop:
            _stop_group(proc, stop.signum)
            raise
        finally:
            _STOPPER.waiting = False
    return proc.returncode, usage.ru_maxrss / 1024.0  # ru_maxrss is in KiB on Linux


def _last_lines(path: Path, count: int = 15) -> str:
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    return "\n".join(lines[-count:])


def train_command(plan: SweepPlan, cell: Cell, run_dir: Path) -> list[str]:
    command = [sys.executable, "-m", "vascl_scale", "train", "--config", plan.base_config]
    for assignment in [*plan.overrides, *cell.assignments()]:
        command += ["--set", assignment]
    command += ["--output", str(run_dir), "--num-processes", str(plan.num_processes)]
    if plan.deepspeed:
        command += ["--deepspeed", plan.deepspeed]
    return command


def eval_command(plan: SweepPlan, run_dir: Path, report: Path) -> list[str]:
    command = [
        sys.executable,
        "-m",
        "vascl_scale",
        "eval",
        plan.eval_tasks,
        "--model",
        str(run_dir),
        "--output",
        str(report),
    ]
    if plan.data_dir:
        command += ["--data-dir", plan.data_dir]
    return command + list(plan.eval_args)


def run_cell(sweep_dir: Path, plan: SweepPlan, cell: Cell) -> dict[str, Any]:
    """Train and evaluate one cell; never raises for a failure of the cell itself.

    Raises ValueError when another process holds the cell (see :func:`_cell_lock`), and
    :class:`Interrupted` (after recording the cell as interrupted) on SIGINT/SIGTERM.
    """
    directory = cell_dir(sweep_dir, cell)
    run_dir, log_path = directory / "run", directory / "train.log"
    with _stop_signals(), _cell_lock(directory) as lock:
        if directory.exists():
            shutil.rmtree(directory)
        directory.mkdir(parents=True)
        env = dict(os.environ)
        started = time.perf_counter()
        status: dict[str, Any] = {"cell": cell.name, "variant": cell.variant, "values": cell.values, "seed": cell.seed}
        try:
            code, peak_rss_mb = _run_logged(train_command(plan, cell, run_dir), log_path, env, lock.fileno())
            status["train_seconds"] = time.perf_counter() - started
            status["peak_rss_mb"] = peak_rss_mb
            if code != 0:
                status.update(state=FAILED, error=f"training exited with {code}:\n{_last_lines(log_path)}")
            elif plan.eval_tasks != "none":
                eval_started = time.perf_counter()
                eval_log = directory / "eval.log"
                code, _ = _run_logged(
                    eval_command(plan, run_dir, directory / "eval.json"), eval_log, env, lock.fileno()
                )
                status["eval_seconds"] = time.perf_counter() - eval_started
                if code != 0:
                    status.update(state=FAILED, error=f"evaluation exited with {code}:\n{_last_lines(eval_log)}")
            status.setdefault("state", DONE)
        except Interrupted as stop:
            status.update(state=INTERRUPTED, error=f"{stop}; the next run of the sweep runs this cell again")
            raise
        finally:
            if "state" in status:  # an unexpected error leaves no status: the cell stays pending
                status["wall_seconds"] = time.perf_counter() - started
                _write_status(directory, status)
    return status


def run_sweep(sweep_dir: Path, plan: SweepPlan) -> dict[str, int]:
    """Run every cell that is not done yet, one after another; count what happened.

    Raises :class:`Interrupted` on SIGINT/SIGTERM and ValueError for a cell another process
    holds, as :func:`run_cell` does.
    """
    from vascl_scale.log import LoopProgress

    counts = {"skipped": 0, DONE: 0, FAILED: 0}
    # Cells done by an earlier invocation count as done from the start, not in this one's rate.
    finished = sum(read_status(sweep_dir, cell).get("state") == DONE for cell in plan.cells)
    with _stop_signals(), LoopProgress("sweep", len(plan.cells), "cells", completed=finished) as progress:
        for cell in plan.cells:
            _STOPPER.check()  # stopped between cells
            if read_status(sweep_dir, cell).get("state") == DONE:
                counts["skipped"] += 1
                continue
            progress.update(finished, note=f"cell {cell.index + 1}: {cell.name}")
            status = run_cell(sweep_dir, plan, cell)
            counts[status["state"]] += 1
            if status["state"] == FAILED:
                logger.warning("cell %s failed (recorded; the sweep goes on):\n%s", cell.name, status["error"])
            finished += 1
            progress.update(finished)
    return counts

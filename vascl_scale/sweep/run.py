"""Run sweep cells through the real ``vascl-scale train`` and ``vascl-scale eval`` commands.

Each cell is a subprocess running exactly what a user would type (distributed settings
included), so a sweep measures the same code path as a single run, and one failing cell
cannot take the sweep down. A cell's directory holds:

    cells/<name>/run/          the training run directory (checkpoints, best/, final/)
    cells/<name>/train.log     the training command's output
    cells/<name>/eval.json     the evaluation report (``vascl-scale eval ... --output``)
    cells/<name>/status.json   {"state": "done" | "failed", "error", "wall_seconds", "peak_rss_mb", ...}

A cell whose status is "done" is skipped when the sweep runs again; any other cell is run
from scratch (a partial run directory is removed first, so every row of the table comes
from one uninterrupted run).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from vascl_scale.sweep.grid import Cell, SweepPlan

logger = logging.getLogger(__name__)

DONE, FAILED = "done", "failed"


def cell_dir(sweep_dir: Path, cell: Cell) -> Path:
    return Path(sweep_dir) / "cells" / cell.name


def read_status(sweep_dir: Path, cell: Cell) -> dict[str, Any]:
    path = cell_dir(sweep_dir, cell) / "status.json"
    if not path.is_file():
        return {"state": "pending"}
    return json.loads(path.read_text(encoding="utf-8"))


def _write_status(directory: Path, status: dict[str, Any]) -> None:
    tmp = directory / "status.json.tmp"
    tmp.write_text(json.dumps(status, indent=1) + "\n", encoding="utf-8")
    tmp.replace(directory / "status.json")


def _run_logged(command: list[str], log_path: Path, env: dict[str, str]) -> tuple[int, float]:
    """Run ``command`` with output appended to ``log_path``; (exit code, peak RSS in MiB).

    The peak RSS comes from wait4 on the child, which covers its whole process tree (every
    launcher worker it waited for): Linux reports the largest resident set among them.
    """
    with log_path.open("a", encoding="utf-8") as log:
        log.write(f"$ {' '.join(command)}\n")
        log.flush()
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
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
    command = [sys.executable, "-m", "vascl_scale", "eval", plan.eval_tasks, "--model", str(run_dir), "--output", str(report)]
    if plan.data_dir:
        command += ["--data-dir", plan.data_dir]
    return command + list(plan.eval_args)


def run_cell(sweep_dir: Path, plan: SweepPlan, cell: Cell) -> dict[str, Any]:
    """Train and evaluate one cell; never raises for a failure of the cell itself."""
    directory = cell_dir(sweep_dir, cell)
    run_dir, log_path = directory / "run", directory / "train.log"
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    env = dict(os.environ)
    started = time.perf_counter()
    status: dict[str, Any] = {"cell": cell.name, "variant": cell.variant, "values": cell.values, "seed": cell.seed}

    code, peak_rss_mb = _run_logged(train_command(plan, cell, run_dir), log_path, env)
    status["train_seconds"] = time.perf_counter() - started
    status["peak_rss_mb"] = peak_rss_mb
    if code != 0:
        status.update(state=FAILED, error=f"training exited with {code}:\n{_last_lines(log_path)}")
    elif plan.eval_tasks != "none":
        eval_started = time.perf_counter()
        code, _ = _run_logged(eval_command(plan, run_dir, directory / "eval.json"), directory / "eval.log", env)
        status["eval_seconds"] = time.perf_counter() - eval_started
        if code != 0:
            status.update(state=FAILED, error=f"evaluation exited with {code}:\n{_last_lines(directory / 'eval.log')}")
    status.setdefault("state", DONE)
    status["wall_seconds"] = time.perf_counter() - started
    _write_status(directory, status)
    return status


def run_sweep(sweep_dir: Path, plan: SweepPlan) -> dict[str, int]:
    """Run every cell that is not done yet, one after another; count what happened."""
    from vascl_scale.log import console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    counts = {"skipped": 0, DONE: 0, FAILED: 0}
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
    ) as progress:
        task = progress.add_task("sweep", total=len(plan.cells))
        for cell in plan.cells:
            if read_status(sweep_dir, cell).get("state") == DONE:
                counts["skipped"] += 1
                progress.advance(task)
                continue
            progress.update(task, description=f"cell {cell.index + 1}: {cell.name}")
            status = run_cell(sweep_dir, plan, cell)
            counts[status["state"]] += 1
            if status["state"] == FAILED:
                logger.warning("cell %s failed (recorded; the sweep goes on):\n%s", cell.name, status["error"])
            progress.advance(task)
    return counts

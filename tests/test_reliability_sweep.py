"""Sweep reliability: stopping a sweep stops its cell, a live cell is never deleted, and values
written into the SLURM script cannot inject lines.

The cell's training command is a stand-in (a Python process that starts a "worker" of its own
and sleeps), so these tests exercise the sweep's process handling without training anything.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vascl_scale import fs
from vascl_scale.cli import app
from vascl_scale.sweep import run

# Writes [its pid, its worker's pid] to argv[1] once both run, then sleeps. With argv[2] ==
# "stubborn" both ignore SIGTERM (SIG_IGN survives exec), as a hung process would.
STAND_IN = """
import json, os, signal, subprocess, sys, time
pids_path, mode = sys.argv[1], sys.argv[2]
if mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(pids_path + ".tmp", "w") as handle:
    json.dump([os.getpid(), worker.pid], handle)
os.replace(pids_path + ".tmp", pids_path)
time.sleep(600)
"""

# The sweep parent: the real CLI with the stand-in as every cell's training command.
DRIVER = """
import sys
from vascl_scale.sweep import run
stand_in, pids_path, mode = sys.argv[1:4]
run.STOP_GRACE_SECONDS = 2.0
run.train_command = lambda plan, cell, run_dir: [sys.executable, stand_in, pids_path, mode]
from vascl_scale.cli import app
app(["sweep", *sys.argv[4:]], prog_name="vascl-scale")
"""

CELL = "loss.k-2__seed-0"


@pytest.fixture()
def sweep_args(tmp_path: Path) -> list[str]:
    """A two-cell sweep over a config that validates (nothing reads its paths here)."""
    config = tmp_path / "base.yaml"
    config.write_text("model: {path: tiny}\ndata: {train: train.txt}\ntrain: {global_batch_size: 8}\n")
    return ["--config", str(config), "--grid", "loss.k=2,3", "--output", str(tmp_path / "sweep"), "--eval", "none"]


def _flat(text: str) -> str:
    """Terminal output with rich's line wrapping undone."""
    return " ".join(text.split())


def _alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (nobody may reap orphans in a container) is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _start_sweep(tmp_path: Path, mode: str, sweep_args: list[str]) -> tuple[subprocess.Popen, list[int]]:
    """Start the sweep parent in its own session; return it and the stand-in's pids once running."""
    stand_in, pids_path = tmp_path / "stand_in.py", tmp_path / "pids.json"
    stand_in.write_text(STAND_IN)
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(stand_in), str(pids_path), mode, *sweep_args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 180
    while not pids_path.exists():
        if driver.poll() is not None or time.monotonic() > deadline:
            driver.kill()
            pytest.fail(f"the stand-in never started:\n{driver.communicate()[0]}")
        time.sleep(0.2)
    return driver, json.loads(pids_path.read_text())


def _kill(pids: list[int]) -> None:
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def _wait_gone(pids: list[int], seconds: float = 10.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while any(map(_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [pid for pid in pids if _alive(pid)]


def _quick_train(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every cell's training command succeed at once (in this process)."""
    monkeypatch.setattr(run, "train_command", lambda plan, cell, run_dir: [sys.executable, "-c", "pass"])


@pytest.mark.e2e
@pytest.mark.parametrize(
    "signum, mode, code",
    [(signal.SIGINT, "cooperative", 130), (signal.SIGTERM, "stubborn", 143)],
    ids=["sigint", "sigterm-ignored-by-the-child"],
)
def test_a_stopped_sweep_stops_its_cell_and_records_it_as_interrupted(
    tmp_path: Path, sweep_args: list[str], monkeypatch: pytest.MonkeyPatch, signum: int, mode: str, code: int
) -> None:
    driver, pids = _start_sweep(tmp_path, mode, sweep_args)
    try:
        os.kill(driver.pid, signum)  # the sweep parent alone, as `kill PID` does
        output = driver.communicate(timeout=60)[0]
        assert driver.returncode == code, output
        assert _wait_gone(pids) == [], "the cell's training (or its worker) outlived the sweep"
    finally:
        _kill(pids)
    out = tmp_path / "sweep"
    status = json.loads((out / "cells" / CELL / "status.json").read_text())
    assert status["state"] == "interrupted" and signal.Signals(signum).name in status["error"]
    assert not (out / "cells" / "loss.k-3__seed-0").exists()  # the sweep started nothing after it
    assert "rerun the same command to resume" in _flat(output)

    collected = CliRunner().invoke(app, ["sweep", "collect", str(out)])
    assert collected.exit_code == 0 and "1 interrupted, 1 pending" in _flat(collected.output)
    record = json.loads((out / "results.json").read_text())
    assert [cell["state"] for cell in record["cells"]] == ["interrupted", "pending"]

    _quick_train(monkeypatch)  # the rerun runs the interrupted cell again
    rerun = CliRunner().invoke(app, ["sweep", *sweep_args], catch_exceptions=False)
    assert rerun.exit_code == 0, rerun.output
    assert [json.loads(p.read_text())["state"] for p in sorted(out.glob("cells/*/status.json"))] == ["done", "done"]


@pytest.mark.e2e
def test_a_rerun_refuses_a_cell_whose_training_still_runs(
    tmp_path: Path, sweep_args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    driver, pids = _start_sweep(tmp_path, "cooperative", sweep_args)
    cell = tmp_path / "sweep" / "cells" / CELL
    try:
        driver.kill()  # SIGKILL: the sweep cannot stop its child, which keeps writing the cell
        driver.communicate(timeout=60)
        assert _alive(pids[0])
        _quick_train(monkeypatch)
        refused = CliRunner().invoke(app, ["sweep", *sweep_args], catch_exceptions=False)
        assert refused.exit_code == 2, refused.output
        assert f"cell {CELL} is still being run" in _flat(refused.output)
        assert (cell / "train.log").is_file()  # left alone
    finally:
        _kill(pids)
    assert _wait_gone(pids) == []
    again = CliRunner().invoke(app, ["sweep", *sweep_args], catch_exceptions=False)
    assert again.exit_code == 0, again.output  # the lock went with the last process holding it
    assert json.loads((cell / "status.json").read_text())["state"] == "done"


def test_slurm_script_quotes_the_output_path_and_refuses_what_sbatch_cannot_hold(
    tmp_path: Path, sweep_args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def sweep(output: Path, *extra: str):
        args = [*sweep_args[:-4], "--output", str(output), "--eval", "none", *extra]
        return CliRunner().invoke(app, ["sweep", *args], catch_exceptions=False)

    spaced = tmp_path / "my sweeps" / "batch k"
    result = sweep(spaced, "--launcher", "slurm")
    assert result.exit_code == 0, result.output
    lines = (spaced / "sweep.sbatch").read_text().splitlines()
    assert f'#SBATCH --output="{spaced}/slurm-%A_%a.out"' in lines  # sbatch reads "..." as one value
    assert "#SBATCH --job-name=vascl-sweep-batch_k" in lines

    for name, message in (
        ("nl\ntouch X", "control character"),
        ("tab\tname", "control character"),
        ("100%", "cannot hold %"),
        ("a#b", "cannot hold #"),
        ('q"uote', 'cannot hold "'),
    ):
        refused = sweep(tmp_path / name, "--launcher", "slurm")
        assert refused.exit_code == 2 and message in _flat(refused.output), (name, refused.output)
        assert not (tmp_path / name).exists()  # refused before anything was written
    for option in ("--partition=gpu\rtouch X", "partition=gpu"):
        refused = sweep(tmp_path / "opts", "--launcher", "slurm", "--sbatch", option)
        assert refused.exit_code == 2 and "--sbatch" in _flat(refused.output), refused.output
        assert not (tmp_path / "opts").exists()

    _quick_train(monkeypatch)  # a local sweep refuses a control character in its directory too
    refused = sweep(tmp_path / "nl\nlocal")
    assert refused.exit_code == 2 and "control character" in _flat(refused.output)
    assert not (tmp_path / "nl\nlocal").exists()


def test_a_file_system_without_flock_runs_the_cell_unlocked(
    tmp_path: Path, sweep_args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_flock(fd: int, operation: int) -> None:
        raise OSError(errno.ENOSYS, "Function not implemented")  # as Lustre mounted without flock

    monkeypatch.setattr(fs.fcntl, "flock", no_flock)
    _quick_train(monkeypatch)
    result = CliRunner().invoke(app, ["sweep", *sweep_args], catch_exceptions=False)
    assert result.exit_code == 0 and "cannot lock" in _flat(result.output), result.output
    assert [json.loads(p.read_text())["state"] for p in sorted((tmp_path / "sweep").glob("cells/*/status.json"))] == [
        "done",
        "done",
    ]


@pytest.mark.parametrize("launcher", ["local", "slurm"])
def test_an_output_that_is_a_file_is_refused_before_anything_is_planned(
    tmp_path: Path, sweep_args: list[str], monkeypatch: pytest.MonkeyPatch, launcher: str
) -> None:
    _quick_train(monkeypatch)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    arguments = [*sweep_args, "--launcher", launcher]
    for target, what in (
        (blocker, f"{blocker}: is a file"),
        (blocker / "sweep", f"{blocker / 'sweep'}: {blocker} is a file"),
    ):
        arguments[arguments.index("--output") + 1] = str(target)
        result = CliRunner().invoke(app, ["sweep", *arguments])
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert result.exit_code == 2 and lines == [f"error: --output {what}, not a folder; choose another path"], (
            result.output
        )
    assert blocker.read_text() == ""

"""The launcher scripts' own behaviour (what they run is tested through the CLI elsewhere)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# The scripts run as a user runs them, in subprocesses: the e2e tier.
pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]


def test_the_demo_refuses_to_replace_a_directory_it_did_not_make(tmp_path: Path) -> None:
    corpus = tmp_path / "data" / "corpus" / "wiki1m.txt.gz"
    corpus.parent.mkdir(parents=True)
    corpus.write_bytes(gzip.compress(b"one sentence here\n"))
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "keep.txt").write_text("someone's results")
    env = {**os.environ, "VASCL_DATA": str(tmp_path / "data"), "DEMO_OUT": str(theirs)}
    result = subprocess.run(
        ["bash", "launchers/cpu_demo.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2, result.stderr
    assert "was not made by this demo" in result.stderr
    assert (theirs / "keep.txt").read_text() == "someone's results"


def test_the_demo_without_data_says_how_to_get_it(tmp_path: Path) -> None:
    env = {**os.environ, "VASCL_DATA": str(tmp_path / "nowhere")}
    result = subprocess.run(
        ["bash", "launchers/cpu_demo.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and "vascl-scale data download --to data" in result.stderr


def _gpu_proof(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "OUT": str(tmp_path / "out"), "PYTHON": sys.executable, **env}
    return subprocess.run(
        ["bash", "launchers/gpu_proof.sh", *args],
        cwd=REPO,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_failing_gpu_proof_stage_fails_the_dry_run_and_the_later_stages_still_run(tmp_path: Path) -> None:
    # PEAK_TFLOPS=-1 is refused by the env stage; pytest_gpu, after it, does not need the peak.
    result = _gpu_proof(tmp_path, "--dry-run", "--only", "env,pytest_gpu", PEAK_TFLOPS="-1")
    assert result.returncode == 1, result.stdout + result.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert not summary["ok"] and summary["failed"] == ["env"] and summary["dry_run"] is True
    statuses = {s["stage"]: s["status"] for s in summary["stages"]}
    assert statuses == {"env": "failed", "pytest_gpu": "ok"}
    assert "PEAK_TFLOPS must be a number >= 0" in summary["stages"][0]["note"]
    assert summary["stages"][1]["figures"]["failures"] == 0
    assert "gpu proof: FAILED: env" in result.stdout


def test_the_gpu_proof_refuses_unknown_stages_and_a_missing_carry_saying_how_to_pack_one(tmp_path: Path) -> None:
    unknown = _gpu_proof(tmp_path, "--dry-run", "--only", "train,nope")
    assert unknown.returncode == 2 and "unknown stage nope; the stages: install env" in unknown.stderr
    no_carry = _gpu_proof(tmp_path, GPU_CARRY=str(tmp_path / "nowhere"))
    assert no_carry.returncode == 2 and "pack it with bash launchers/gpu_carry.sh" in no_carry.stderr

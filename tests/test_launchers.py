"""The launcher scripts' own behaviour (what they run is tested through the CLI elsewhere)."""

from __future__ import annotations

import gzip
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_demo_refuses_to_replace_a_directory_it_did_not_make(tmp_path: Path) -> None:
    corpus = tmp_path / "data" / "corpus" / "wiki1m.txt.gz"
    corpus.parent.mkdir(parents=True)
    corpus.write_bytes(gzip.compress(b"one sentence here\n"))
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "keep.txt").write_text("someone's results")
    env = {**os.environ, "VASCL_DATA": str(tmp_path / "data"), "DEMO_OUT": str(theirs)}
    result = subprocess.run(["bash", "launchers/cpu_demo.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "was not made by this demo" in result.stderr
    assert (theirs / "keep.txt").read_text() == "someone's results"


def test_the_demo_without_data_says_how_to_get_it(tmp_path: Path) -> None:
    env = {**os.environ, "VASCL_DATA": str(tmp_path / "nowhere")}
    result = subprocess.run(["bash", "launchers/cpu_demo.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "vascl-scale data download --to data" in result.stderr

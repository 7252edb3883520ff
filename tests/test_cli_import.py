"""The command line starts light: help and usage errors load no torch, transformers or DeepSpeed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "deepspeed", "accelerate", "webdataset", "scipy", "sklearn", "matplotlib")


@pytest.mark.parametrize("args", [["--help"], ["train", "--help"], ["eval", "--help"], ["data", "download", "--help"], ["sweep"]])
def test_help_imports_no_heavy_library(args: list[str]) -> None:
    probe = (
        "import json, sys\n"
        "from vascl_scale.cli import app\n"
        "try:\n"
        f"    app({args!r}, prog_name='vascl-scale')\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == [], result.stdout


def test_loading_a_config_imports_no_heavy_library() -> None:
    """The config reads the objectives' declarations (vascl_scale.losses.spec), not their maths."""
    probe = (
        "import json, sys\n"
        "from vascl_scale.config import load_config\n"
        "config = load_config('configs/cpu-demo.yaml', ['objective=simcse'])\n"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == [], result.stdout

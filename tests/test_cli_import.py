"""The command line starts light: help and usage errors load no torch, transformers or DeepSpeed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "deepspeed", "accelerate", "webdataset", "scipy", "sklearn", "matplotlib", "mteb")


def _heavy_modules_after(code: str) -> list[str]:
    """The modules of HEAVY that a fresh interpreter has imported after running ``code``."""
    probe = f"import json, sys\n{code}print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["train", "--help"],
        ["eval", "--help"],
        ["eval", "mteb", "--help"],
        ["data", "download", "--help"],
        ["data", "mine", "--help"],
        ["sweep"],
    ],
)
def test_help_imports_no_heavy_library(args: list[str]) -> None:
    code = f"from vascl_scale.cli import app\ntry:\n    app({args!r}, prog_name='vascl-scale')\nexcept SystemExit:\n    pass\n"
    assert _heavy_modules_after(code) == []


def test_loading_a_config_imports_no_heavy_library() -> None:
    """The config reads the objectives' declarations (vascl_scale.losses.spec), not their maths."""
    assert (
        _heavy_modules_after(
            "from vascl_scale.config import load_config\nload_config('configs/cpu-demo.yaml', ['objective=simcse'])\n"
        )
        == []
    )

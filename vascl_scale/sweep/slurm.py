"""``--launcher slurm``: one SLURM array task per sweep cell, instead of running them here."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from vascl_scale.sweep.grid import SweepPlan, slug

# What an #SBATCH value cannot hold as itself, even inside the double quotes written around
# the output path: sbatch reads '"' and '\' as quoting, '#' as the start of a comment (inside
# quotes too, in older Slurm), and its filename patterns read '%' as a placeholder.
SBATCH_UNSAFE = '"\\#%'


def refuse_control_characters(value: str, option: str) -> None:
    """ValueError for a value with a control (or other non-printing) character: in a script
    a newline or carriage return would end the line and start a command of its own."""
    found = sorted({repr(c) for c in value if not c.isprintable()})
    if found:
        raise ValueError(f"{option} {value!r} holds the control character(s) {', '.join(found)}; remove them")


def _sbatch_output(sweep_dir: Path) -> str:
    """The quoted ``--output`` value of the script, or ValueError naming what to change."""
    text = str(sweep_dir)
    refuse_control_characters(text, "--output")
    unsafe = [c for c in SBATCH_UNSAFE if c in text]
    if unsafe:
        raise ValueError(
            f"--output {text!r}: an #SBATCH line cannot hold {' '.join(unsafe)} in a path; "
            "choose a sweep directory without them"
        )
    return f'"{text}/slurm-%A_%a.out"'  # sbatch reads "..." as one value, spaces included


def write_array_script(sweep_dir: Path, plan: SweepPlan, sbatch_options: list[str]) -> Path:
    """Write ``sweep.sbatch``: task i runs ``vascl-scale sweep run-cell DIR --index i``.

    ``sbatch_options`` are extra ``#SBATCH`` lines (e.g. ``--partition=gpu``,
    ``--gpus-per-node=8``, ``--time=04:00:00``). After the array finishes,
    ``vascl-scale sweep collect DIR`` builds the tables and plots. Every value is checked
    before anything is written, so a refused one (ValueError) leaves no directory behind.
    """
    sweep_dir = Path(sweep_dir).resolve()
    last = len(plan.cells) - 1
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name=vascl-sweep-{slug(sweep_dir.name)}",  # letters, digits, . + - _ only
        f"#SBATCH --array=0-{last}",
        f"#SBATCH --output={_sbatch_output(sweep_dir)}",
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks-per-node=1",
    ]
    for option in sbatch_options:
        refuse_control_characters(option, "--sbatch")
        option = option.strip()
        if not option.startswith("--"):
            raise ValueError(f"--sbatch expects one sbatch option such as --partition=gpu; got {option!r}")
        lines.append(f"#SBATCH {option}")
    lines += [
        "set -euo pipefail",
        f"# {len(plan.cells)} cells; each task trains and evaluates one (finished cells are skipped).",
        f"{shlex.quote(sys.executable)} -m vascl_scale sweep run-cell {shlex.quote(str(sweep_dir))} "
        '--index "$SLURM_ARRAY_TASK_ID"',
        "",
    ]
    sweep_dir.mkdir(parents=True, exist_ok=True)
    path = sweep_dir / "sweep.sbatch"
    path.write_text("\n".join(lines), encoding="utf-8")
    path.chmod(0o755)
    return path

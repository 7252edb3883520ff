"""``--launcher slurm``: one SLURM array task per sweep cell, instead of running them here."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from vascl_scale.sweep.grid import SweepPlan


def write_array_script(sweep_dir: Path, plan: SweepPlan, sbatch_options: list[str]) -> Path:
    """Write ``sweep.sbatch``: task i runs ``vascl-scale sweep run-cell DIR --index i``.

    ``sbatch_options`` are extra ``#SBATCH`` lines (e.g. ``--partition=gpu``,
    ``--gpus-per-node=8``, ``--time=04:00:00``). After the array finishes,
    ``vascl-scale sweep collect DIR`` builds the tables and plots.
    """
    sweep_dir = Path(sweep_dir).resolve()
    last = len(plan.cells) - 1
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name=vascl-sweep-{sweep_dir.name}",
        f"#SBATCH --array=0-{last}",
        f"#SBATCH --output={sweep_dir}/slurm-%A_%a.out",
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks-per-node=1",
    ]
    for option in sbatch_options:
        option = option.strip()
        if not option.startswith("--") or "\n" in option:
            raise ValueError(f"--sbatch expects one sbatch option such as --partition=gpu; got {option!r}")
        lines.append(f"#SBATCH {option}")
    lines += [
        "set -euo pipefail",
        f"# {len(plan.cells)} cells; each task trains and evaluates one (finished cells are skipped).",
        f"{shlex.quote(sys.executable)} -m vascl_scale sweep run-cell {shlex.quote(str(sweep_dir))} "
        '--index "$SLURM_ARRAY_TASK_ID"',
        "",
    ]
    path = sweep_dir / "sweep.sbatch"
    path.write_text("\n".join(lines), encoding="utf-8")
    path.chmod(0o755)
    return path

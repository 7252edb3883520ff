"""Sweep plans: named variants x a grid of config overrides x seeds, expanded into cells and
validated up front.

A grid axis sets one key to each of its values (the cartesian product over axes); a variant is
a named bundle of settings (e.g. ``simcse`` = objective simcse, ``rel-0.5`` = relative strength
0.5 for eps and xi), for studies whose rows are not a product of axes.

A plan is saved as ``sweep.json`` in the sweep directory, so ``run-cell`` (a SLURM array
task), a resumed local sweep and ``sweep collect`` all read the same list of cells.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vascl_scale.config import apply_override, load_config

PLAN_FILE = "sweep.json"


@dataclass
class Cell:
    """One training run of the sweep: the grid values it sets and its seed."""

    index: int
    name: str  # directory name under cells/, readable and unique
    values: dict[str, Any]  # dotted config key -> value, in grid order
    seed: int
    variant: str | None = None  # name of the cell's variant, if the sweep has variants
    variant_values: dict[str, Any] = field(default_factory=dict)  # that variant's settings
    derived: dict[str, Any] = field(default_factory=dict)  # set per cell by the plan (train.max_steps)

    def assignments(self) -> list[str]:
        """``--set`` arguments of this cell (values as JSON, which YAML reads back unchanged);
        grid values come after the variant's, so an axis may vary a key a variant sets."""
        settings = [*self.variant_values.items(), *self.values.items(), *self.derived.items()]
        return [f"{key}={json.dumps(value)}" for key, value in settings] + [f"train.seed={self.seed}"]


@dataclass
class SweepPlan:
    """Everything needed to run, resume or collect a sweep."""

    base_config: str
    grid: dict[str, list[Any]]
    seeds: list[int]
    overrides: list[str] = field(default_factory=list)  # --set applied to every cell
    num_processes: int = 1
    deepspeed: str | None = None
    eval_tasks: str = "sts"  # an ``vascl-scale eval`` sub-command, or "none"
    data_dir: str | None = None
    cells: list[Cell] = field(default_factory=list)
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> settings, in order
    eval_args: list[str] = field(default_factory=list)  # extra options of the eval command
    # --sentences-per-cell: every cell trains on this many sentences (its max_steps follows).
    sentences_per_cell: int | None = None
    skipped: dict[str, str] = field(default_factory=dict)  # --skip-invalid: cell name -> why it was dropped

    @property
    def columns(self) -> list[str]:
        """What tells the cells of one seed apart: "variant" (if any), then the grid keys."""
        return (["variant"] if self.variants else []) + list(self.grid)

    def save(self, sweep_dir: Path) -> None:
        sweep_dir.mkdir(parents=True, exist_ok=True)
        (sweep_dir / PLAN_FILE).write_text(json.dumps(asdict(self), indent=1) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, sweep_dir: Path) -> SweepPlan:
        path = Path(sweep_dir) / PLAN_FILE
        if not path.is_file():
            raise ValueError(f"{sweep_dir} is not a sweep directory (no {PLAN_FILE}); start it with vascl-scale sweep")
        record = json.loads(path.read_text(encoding="utf-8"))
        record["cells"] = [Cell(**cell) for cell in record["cells"]]
        return cls(**record)


def parse_grid_axis(text: str) -> tuple[str, list[Any]]:
    """``loss.k=4,16,64`` -> ("loss.k", [4, 16, 64]); each value parsed as YAML."""
    if "=" not in text:
        raise ValueError(f"--grid expects key=v1,v2,... (e.g. loss.k=4,16,64); got {text!r}")
    key, raw = text.split("=", 1)
    key = key.strip()
    values = [yaml.safe_load(v) for v in raw.split(",") if v.strip()]
    if not key or not values:
        raise ValueError(f"--grid {text!r} needs a key and at least one value")
    if len(set(map(json.dumps, values))) != len(values):
        raise ValueError(f"--grid {key} repeats a value: {values}")
    # Reject unknown keys now, with the config's own message.
    apply_override({}, f"{key}={json.dumps(values[0])}")
    return key, values


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    """``rel-0.5:loss.eps_mode=relative,loss.eps=0.5`` -> ("rel-0.5", {...}); values as YAML."""
    name, sep, body = text.partition(":")
    name = name.strip()
    if not sep or not name or not body.strip():
        raise ValueError(f"--variant expects NAME:key=value,key=value (e.g. simcse:objective=simcse); got {text!r}")
    if slug(name) != name:
        raise ValueError(f"--variant name {name!r} may use letters, digits and . + - only (it names directories)")
    settings: dict[str, Any] = {}
    for assignment in body.split(","):
        key, eq, raw = assignment.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ValueError(f"--variant {name}: expected key=value, got {assignment!r}")
        if key in settings:
            raise ValueError(f"--variant {name} sets {key} twice")
        settings[key] = yaml.safe_load(raw)
        apply_override({}, f"{key}={json.dumps(settings[key])}")  # unknown keys fail here
    return name, settings


def slug(value: Any) -> str:
    """``value`` as a name for directories and job names: letters, digits and . + - only, else _."""
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", str(value))


def expand(
    grid: dict[str, list[Any]], seeds: list[int], variants: dict[str, dict[str, Any]] | None = None
) -> list[Cell]:
    """Each variant (in the order given) x the cartesian product of the grid axes x the seeds."""
    if not seeds:
        raise ValueError("--seeds needs at least one seed")
    cells = []
    keys = list(grid)
    for variant in list(variants or {}) or [None]:
        settings = (variants or {}).get(variant, {})
        for combo in itertools.product(*(grid[k] for k in keys)):
            for seed in seeds:
                values = dict(zip(keys, combo))
                parts = ([f"variant-{variant}"] if variant else []) + [f"{k}-{slug(v)}" for k, v in values.items()]
                name = "__".join(parts + [f"seed-{seed}"])
                cells.append(Cell(len(cells), name, values, seed, variant, dict(settings)))
    return cells


def drop_cells(plan: SweepPlan, dropped: list[tuple[Cell, str]]) -> None:
    """Remove ``dropped`` from the plan (recorded in ``plan.skipped``) and renumber the rest."""
    names = {cell.name for cell, _ in dropped}
    plan.skipped.update({cell.name: reason for cell, reason in dropped})
    kept = [cell for cell in plan.cells if cell.name not in names]
    for index, cell in enumerate(kept):
        cell.index = index
    plan.cells = kept


def set_training_length(plan: SweepPlan) -> None:
    """``train.max_steps`` of every cell from ``plan.sentences_per_cell``: sentences / (B x A)."""
    sentences = plan.sentences_per_cell
    assert sentences is not None
    for cell in plan.cells:
        train = load_config(plan.base_config, [*plan.overrides, *cell.assignments()]).train
        per_update = train.global_batch_size * train.grad_accum_steps
        if sentences % per_update:
            raise ValueError(
                f"--sentences-per-cell {sentences} is not a multiple of cell {cell.name}'s {per_update} sentences "
                f"per optimiser step (global batch x accumulation); choose a multiple of every cell's"
            )
        cell.derived["train.max_steps"] = sentences // per_update


def invalid_cells(plan: SweepPlan, world_size: int) -> list[tuple[Cell, str]]:
    """Each cell whose config does not validate (e.g. k >= global batch - 1), with the reason."""
    problems = []
    for cell in plan.cells:
        try:
            config = load_config(plan.base_config, [*plan.overrides, *cell.assignments()])
            config.per_device_batch_size(world_size)
        except ValueError as err:
            problems.append((cell, str(err)))
    return problems

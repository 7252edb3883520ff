"""``vascl-scale sweep``: scaling studies over the global batch, K and anything else in the config."""

from __future__ import annotations

import json
import logging
import shlex
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from vascl_scale.log import console, fail, print_table

if TYPE_CHECKING:
    from vascl_scale.sweep.run import Interrupted

# The sweep's modules load the config tree (and with it torch) when a command runs, not at
# import: `vascl-scale --help` stays instant.

logger = logging.getLogger(__name__)

app = typer.Typer(
    help="Run a grid of training runs (e.g. global batch x K x objective x seeds), evaluate each, "
    "and collect one table with plots. Rerunning skips finished cells.",
    invoke_without_command=True,
    no_args_is_help=True,
)

EVAL_CHOICES = ("sts", "clustering", "intent", "retrieval", "all", "none")


def _stopped(stop: Interrupted, resume: str) -> None:
    """Exit as a shell reports a command ended by the signal: 128 + its number (130, 143)."""
    logger.error("%s; %s", stop, resume)
    raise typer.Exit(128 + stop.signum)


def _parse_seeds(text: str) -> list[int]:
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError as err:
        raise ValueError(f"--seeds expects integers separated by commas, e.g. 0,1,2; got {text!r}") from err


def _print_summary(result: dict, sweep_dir: Path) -> None:
    from vascl_scale.sweep.grid import SweepPlan
    from vascl_scale.sweep.report import format_cell

    metrics, plan = result["headline"], SweepPlan.load(sweep_dir)
    table = Table(title=f"sweep {sweep_dir.name}: mean ± std over seeds (every metric in results.md)")
    for column in [*plan.columns, "seeds", *metrics]:
        table.add_column(column.split(".")[-1], justify="right")
    for entry in result["entries"]:
        cells = [str(entry[k]) for k in plan.columns] + [str(entry["seeds"])]
        for metric in metrics:
            value = entry.get(metric)
            std = entry.get(f"{metric}_std")
            text = "" if value is None else format_cell(value) + ("" if std is None else f" ± {format_cell(std)}")
            cells.append(text)
        table.add_row(*cells)
    print_table(table)
    counts = result["counts"]
    console.print(
        f"{counts['done']} done, {counts['failed']} failed, {counts['interrupted']} interrupted, "
        f"{counts['pending']} pending; "
        f"tables: {sweep_dir / 'results.md'} (.csv, .json); plots: {sweep_dir / 'plots'}"
    )


@app.callback()
def sweep(
    ctx: typer.Context,
    config: Path | None = typer.Option(None, "--config", help="Base training config (YAML)."),
    grid: list[str] = typer.Option(
        [], "--grid", help="One axis, e.g. train.global_batch_size=256,512,1024 (repeatable)."
    ),
    variant: list[str] = typer.Option(
        [],
        "--variant",
        help="A named bundle of settings, e.g. simcse:objective=simcse (repeatable; crossed with --grid).",
    ),
    seeds: str = typer.Option("0", "--seeds", help="Seeds per grid point, e.g. 0,1,2."),
    output: Path | None = typer.Option(None, "--output", help="Sweep directory, e.g. sweeps/batch-k."),
    launcher: str = typer.Option("local", "--launcher", help="local (run the cells here, one after another) or slurm."),
    eval_tasks: str = typer.Option(
        "sts", "--eval", help="Evaluation per cell: sts, clustering, intent, retrieval, all or none."
    ),
    data_dir: str | None = typer.Option(None, "--data-dir", help="Evaluation data (default $VASCL_DATA)."),
    eval_args: str = typer.Option(
        "", "--eval-args", help="Extra options of each cell's vascl-scale eval, e.g. '--task stsb --task stsb-dev'."
    ),
    overrides: list[str] = typer.Option([], "--set", help="Override applied to every cell (repeatable)."),
    num_processes: int = typer.Option(1, "--num-processes", help="Processes per cell (as vascl-scale train)."),
    deepspeed: str | None = typer.Option(None, "--deepspeed", help="DeepSpeed JSON for every cell."),
    max_steps: int | None = typer.Option(None, "--max-steps", help="Same as --set train.max_steps=S."),
    sentences_per_cell: int | None = typer.Option(
        None,
        "--sentences-per-cell",
        help="Train every cell on N sentences: max_steps = N / (global batch x accumulation).",
    ),
    skip_invalid: bool = typer.Option(
        False,
        "--skip-invalid",
        help="Drop cells whose config is invalid (e.g. k >= batch - 1), listing them, instead of refusing.",
    ),
    sbatch: list[str] = typer.Option([], "--sbatch", help="Extra #SBATCH option for --launcher slurm (repeatable)."),
) -> None:
    if ctx.invoked_subcommand is not None:
        return
    from vascl_scale.paths import check_output_dir
    from vascl_scale.sweep.grid import (
        SweepPlan,
        drop_cells,
        expand,
        invalid_cells,
        parse_grid_axis,
        parse_variant,
        set_training_length,
    )
    from vascl_scale.sweep.report import collect
    from vascl_scale.sweep.run import Interrupted, run_sweep
    from vascl_scale.sweep.slurm import refuse_control_characters, write_array_script

    try:
        if config is None or output is None or not (grid or variant):
            raise ValueError("vascl-scale sweep needs --config, --output and at least one --grid or --variant")
        paths = {"--config": config, "--output": output, "--deepspeed": deepspeed, "--data-dir": data_dir}
        for option, path in paths.items():
            if path is not None:  # a newline in a path would break every script and log line naming it
                refuse_control_characters(str(path), option)
        check_output_dir(output, "--output")  # before the cells are expanded and validated
        if launcher not in ("local", "slurm"):
            raise ValueError(f"--launcher must be local or slurm; got {launcher!r}")
        if eval_tasks not in EVAL_CHOICES:
            raise ValueError(f"--eval must be one of {', '.join(EVAL_CHOICES)}; got {eval_tasks!r}")
        if num_processes < 1:
            raise ValueError(f"--num-processes must be >= 1; got {num_processes}")
        axes = dict(parse_grid_axis(axis) for axis in grid)
        if len(axes) != len(grid):
            raise ValueError("--grid names the same key twice; give each key one axis with all its values")
        variants = dict(parse_variant(text) for text in variant)
        if len(variants) != len(variant):
            raise ValueError("two --variant options share a name; give each variant its own name")
        if sentences_per_cell is not None and (max_steps is not None or sentences_per_cell < 1):
            raise ValueError("--sentences-per-cell takes a positive number and replaces --max-steps; give one of them")
        fixed = list(overrides) + ([f"train.max_steps={max_steps}"] if max_steps is not None else [])
        plan = SweepPlan(
            base_config=str(config.resolve()),
            grid=axes,
            seeds=_parse_seeds(seeds),
            overrides=fixed,
            num_processes=num_processes,
            deepspeed=str(Path(deepspeed).resolve()) if deepspeed else None,
            eval_tasks=eval_tasks,
            data_dir=data_dir,
            variants=variants,
            eval_args=shlex.split(eval_args),
            sentences_per_cell=sentences_per_cell,
        )
        if plan.eval_args and eval_tasks == "none":
            raise ValueError("--eval-args needs an evaluation; drop it or choose --eval sts/clustering/intent/all")
        plan.cells = expand(plan.grid, plan.seeds, plan.variants)
        problems = invalid_cells(plan, world_size=num_processes)
        if problems:
            verdict = "skipped (--skip-invalid)" if skip_invalid else "nothing was run"
            table = Table(title=f"{len(problems)} of {len(plan.cells)} cells are invalid; {verdict}")
            table.add_column("cell")
            table.add_column("reason")
            for cell, reason in problems:
                table.add_row(cell.name, reason)
            print_table(table)
            if not skip_invalid:
                raise ValueError(
                    "fix or drop the invalid grid values above (e.g. keep loss.k < global batch - 1), or pass --skip-invalid"
                )
            if len(problems) == len(plan.cells):
                raise ValueError("every cell is invalid; nothing to run")
            drop_cells(plan, problems)
        if sentences_per_cell is not None:
            set_training_length(plan)
        existing = output / "sweep.json"
        if existing.is_file():
            previous = SweepPlan.load(output)
            if json.dumps(asdict(previous), sort_keys=True) != json.dumps(asdict(plan), sort_keys=True):
                raise ValueError(
                    f"{output} holds a different sweep (other config, grid, seeds or settings); "
                    "rerun with the same options to resume it, or choose a new --output"
                )
        if launcher == "slurm":  # before the plan, so that a refused script leaves nothing behind
            script = write_array_script(output, plan, sbatch)
        plan.save(output)
    except ValueError as err:
        fail(err)

    if launcher == "slurm":
        quoted = shlex.quote(str(script))
        console.print(f"wrote {script} ({len(plan.cells)} array tasks). Submit it with: sbatch {quoted}")
        console.print(f"then gather the results with: vascl-scale sweep collect {shlex.quote(str(output))}")
        return
    try:
        counts = run_sweep(output, plan)
    except ValueError as err:
        fail(err)
    except Interrupted as stop:
        _stopped(stop, "rerun the same command to resume (done cells are skipped, interrupted ones rerun)")
    logger.info(
        "cells: %d run, %d failed, %d skipped (done before)", counts["done"], counts["failed"], counts["skipped"]
    )
    _print_summary(collect(output), output)
    if counts["failed"]:
        raise typer.Exit(1)


@app.command("collect")
def collect_command(
    sweep_dir: Path = typer.Argument(..., help="A sweep directory (holds sweep.json)."),
    metric: list[str] = typer.Option(
        [], "--metric", help="A metric of the summary table and overview plot, e.g. sts/stsb-dev (repeatable)."
    ),
) -> None:
    """Gather every cell's results into results.{csv,json,md} and plots/ (e.g. after SLURM)."""
    from vascl_scale.sweep.report import collect

    try:
        result = collect(sweep_dir, metric or None)
    except ValueError as err:
        fail(err)
    _print_summary(result, sweep_dir)


@app.command("run-cell")
def run_cell_command(
    sweep_dir: Path = typer.Argument(..., help="A sweep directory (holds sweep.json)."),
    index: int = typer.Option(..., "--index", help="Cell index (the SLURM array task id)."),
) -> None:
    """Train and evaluate one cell of a planned sweep (what each SLURM array task runs)."""
    from vascl_scale.sweep.grid import SweepPlan
    from vascl_scale.sweep.run import Interrupted, read_status, run_cell

    try:
        plan = SweepPlan.load(sweep_dir)
        if not 0 <= index < len(plan.cells):
            raise ValueError(f"--index must be in [0, {len(plan.cells) - 1}]; got {index}")
    except ValueError as err:
        fail(err)
    cell = plan.cells[index]
    if read_status(sweep_dir, cell).get("state") == "done":
        logger.info("cell %s is done already; skipped", cell.name)
        return
    try:
        status = run_cell(sweep_dir, plan, cell)
    except ValueError as err:
        fail(err)
    except Interrupted as stop:
        _stopped(stop, "the cell is recorded as interrupted; rerun this command (or its array task) to resume")
    if status["state"] != "done":
        logger.error("cell %s failed:\n%s", cell.name, status["error"])
        raise typer.Exit(1)

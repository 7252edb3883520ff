"""Logging for every entry point: rich output on rank 0, quiet elsewhere.

Library code logs through ``logging.getLogger(__name__)``; only the CLI calls
:func:`setup_logging`. Ranks other than 0 log warnings and errors only, so a
many-rank run prints one progress stream, not one per process. Tables are printed with
:func:`print_table`, which never cuts a cell to fit the console.
"""

from __future__ import annotations

import logging
import os
from copy import copy
from typing import NoReturn

from rich.console import Console
from rich.logging import RichHandler
from rich.measure import Measurement
from rich.table import Table

# One console for tables and progress bars; stderr keeps stdout clean for piping results.
console = Console(stderr=True)


def print_table(table: Table) -> None:
    """Print ``table`` on the console at its natural width, never narrower.

    Rich fits a table to the console, 80 columns when the output is a file or a pipe, by cutting
    cells ("64.…"); a table of scores must keep every digit, so it is printed as wide as its
    widest cells and uncropped (a narrower terminal wraps its lines instead).
    """
    natural = Measurement.get(console, console.options.update_width(1 << 16), table).maximum  # unbounded
    wide = copy(table)  # shallow: the caller's table keeps its own width setting
    wide.width = natural
    console.print(wide, crop=False)


def process_rank() -> int:
    """Global rank from the launcher's environment (before torch.distributed starts)."""
    for name in ("RANK", "SLURM_PROCID", "PMI_RANK", "OMPI_COMM_WORLD_RANK"):
        value = os.environ.get(name)
        if value is not None and value.isdigit():
            return int(value)
    return 0


def setup_logging(level: str = "INFO", all_ranks: bool = False) -> None:
    """Route the ``vascl_scale`` loggers to rich; non-zero ranks log warnings only."""
    rank = process_rank()
    chosen = getattr(logging, level.upper(), None)
    if not isinstance(chosen, int):
        raise ValueError(f"log level must be one of DEBUG, INFO, WARNING, ERROR; got {level!r}")
    if rank != 0 and not all_ranks:
        chosen = max(chosen, logging.WARNING)
    handler = RichHandler(console=console, show_path=False, rich_tracebacks=False, markup=False)
    fmt = "%(message)s" if rank == 0 else f"[rank {rank}] %(message)s"
    handler.setFormatter(logging.Formatter(fmt))
    root = logging.getLogger("vascl_scale")
    root.handlers[:] = [handler]
    root.setLevel(chosen)
    root.propagate = False


def fail(err: Exception) -> NoReturn:
    """The one way a command reports a user error: ``error: <message>`` and exit status 2."""
    import typer

    console.print(f"error: {err}", style="red", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(2) from err

"""Logging for every entry point: rich output on rank 0, quiet elsewhere.

Library code logs through ``logging.getLogger(__name__)``; only the CLI calls
:func:`setup_logging`. Ranks other than 0 log warnings and errors only, so a
many-rank run prints one progress stream, not one per process. Tables are printed with
:func:`print_table`, which never cuts a cell to fit the console; long loops report through
:class:`LoopProgress`, a bar on a terminal and plain lines in a log file.
"""

from __future__ import annotations

import logging
import os
import reprlib
import time
from copy import copy
from datetime import timedelta
from typing import Any, NoReturn

from rich.console import Console
from rich.logging import RichHandler
from rich.measure import Measurement
from rich.table import Table

# One console for tables and progress bars; stderr keeps stdout clean for piping results.
console = Console(stderr=True)

# Outside a terminal (a log file, a pipe, CI) a loop logs one plain progress line at most this often.
PLAIN_PROGRESS_SECONDS = 30.0

logger = logging.getLogger(__name__)


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
    fmt = "%(message)s" if rank == 0 else f"[rank {rank}] %(message)s"
    if console.is_terminal:
        handler: logging.Handler = RichHandler(console=console, show_path=False, rich_tracebacks=False, markup=False)
        handler.setFormatter(logging.Formatter(fmt))
    else:
        handler = _PlainLineHandler()
        handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s {fmt}", "%Y-%m-%d %H:%M:%S"))
    root = logging.getLogger("vascl_scale")
    root.handlers[:] = [handler]
    root.setLevel(chosen)
    root.propagate = False


class _PlainLineHandler(logging.Handler):
    """One line per record on the console, never wrapped: rich wraps log records at the 80 columns
    it assumes for a file, which splits a line that grep or a reader of the log wants whole."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            console.print(self.format(record), markup=False, highlight=False, soft_wrap=True)
        except Exception:  # logging's contract: a failing handler reports, never raises
            self.handleError(record)


class LoopProgress:
    """The progress of a long loop of ``total`` units (steps, texts, cells).

    On a terminal a rich bar (with ``note``, e.g. the latest losses, beside it). Elsewhere the bar,
    redrawn in place, would reach a log file only when it stops, cut to 80 columns, so a plain
    line is logged instead at most every PLAIN_PROGRESS_SECONDS: units done, rate, elapsed, time
    left and the note. Use as a context manager (or ``start`` / ``stop``); ``update`` takes the
    units done so far.
    """

    def __init__(self, label: str, total: int, unit: str, completed: int = 0, keep: bool = False) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.label, self.total, self.unit = label, total, unit
        self.first = completed  # a resumed loop's rate counts this invocation only
        self.note = ""
        self.plain = not console.is_terminal
        self.started = self.last_line = time.perf_counter()
        columns = (
            TextColumn(f"[bold]{label}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
        )
        # keep: the finished bar stays on the terminal (training's last losses); otherwise it goes.
        self.bar = Progress(*columns, console=console, transient=not keep, disable=self.plain)
        self.task = self.bar.add_task("", total=total, completed=completed)

    def start(self) -> LoopProgress:
        self.bar.start()
        self.started = self.last_line = time.perf_counter()
        return self

    def stop(self) -> None:
        self.bar.stop()

    def __enter__(self) -> LoopProgress:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def update(self, completed: int, note: str | None = None) -> None:
        if note is not None:
            self.note = note
        self.bar.update(self.task, completed=completed, description=self.note)
        now = time.perf_counter()
        if not self.plain or completed <= self.first or now - self.last_line < PLAIN_PROGRESS_SECONDS:
            return
        self.last_line = now
        elapsed = now - self.started
        rate = (completed - self.first) / elapsed
        left = timedelta(seconds=round((self.total - completed) / rate))
        line = f"{self.label}: {completed} of {self.total} {self.unit}, {rate:.3g} {self.unit}/s, "
        line += f"{timedelta(seconds=round(elapsed))} elapsed, about {left} left"
        logger.info(line + (f" | {self.note}" if self.note else ""))


# Messages quote a user's value through reprlib: a huge value (a long string, a nested list) is
# cut while it is written, never written out whole first.
_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = 200
_SHOWN.maxlist = _SHOWN.maxtuple = _SHOWN.maxdict = _SHOWN.maxset = 8
_SHOWN.maxlevel = 3


def shown(value: Any) -> str:
    """``repr(value)`` as an error message quotes it: at most about 200 characters."""
    return _SHOWN.repr(value)


def shown_name(name: object) -> str:
    """A name (a key, a field, a column) as a one-line message shows it: as it is, or quoted with
    escapes where it holds a line break, an invisible character or bytes that are not UTF-8."""
    text = str(name)
    return text if text.isprintable() else repr(text)


def fail(err: Exception, status: int = 2) -> NoReturn:
    """The one way a command reports an error: ``error: <message>`` and exit status 2 (a user
    error), or ``status`` (1: the command ran and produced nothing usable)."""
    import typer

    console.print(f"error: {err}", style="red", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(status) from err

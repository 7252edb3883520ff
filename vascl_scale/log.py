"""Logging for every entry point: rich output on rank 0, quiet elsewhere.

Library code logs through ``logging.getLogger(__name__)``; only the CLI calls
:func:`setup_logging`. Ranks other than 0 log warnings and errors only, so a
many-rank run prints one progress stream, not one per process.
"""

from __future__ import annotations

import logging
import os

from rich.console import Console
from rich.logging import RichHandler

# One console for tables and progress bars; stderr keeps stdout clean for piping results.
console = Console(stderr=True)


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

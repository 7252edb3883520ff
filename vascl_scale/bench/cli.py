"""``vascl-scale bench ...``: reproducible measurements (medians and ratios from one run)."""

from __future__ import annotations

import typer

app = typer.Typer(help="Benchmarks: data loading, training steps, communication.", no_args_is_help=True)

"""Command-line options shared by the commands that encode text (``eval ...``, ``data mine``):
how the encoder runs and where its embeddings are cached (:mod:`vascl_scale.encode`)."""

from __future__ import annotations

import os
from pathlib import Path

import typer

BATCH = typer.Option(64, "--batch-size", min=1, help="Texts per encoder forward.")
MAX_LENGTH = typer.Option(None, "--max-length", min=1, help="Tokens per text; default: the model's, else 256.")
POOLING = typer.Option(None, "--pooling", help="mean, cls or last_token; default: the model's, else mean.")
PROMPT = typer.Option(
    None,
    "--prompt",
    help="Put the model's prompt of this name (config_sentence_transformers.json, e.g. query) before every text; "
    "default: none.",
)
DEVICE = typer.Option(None, "--device", help="cpu, cuda, cuda:1 ...; default: cuda when available.")
CACHE = typer.Option(
    None, "--cache-dir", help="Embedding cache; default $VASCL_CACHE/embeddings or ~/.cache/vascl-scale."
)
PRECISION = typer.Option(
    "auto", "--precision", help="auto (bf16 where native, else float32), no (float32) or bf16; see docs/speed.md."
)
NO_CACHE = typer.Option(False, "--no-cache", help="Encode everything afresh and store nothing.")


def default_cache_dir() -> Path:
    """``$VASCL_CACHE/embeddings``, else ``~/.cache/vascl-scale/embeddings``."""
    root = os.environ.get("VASCL_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "vascl-scale") / "embeddings"


def embedding_cache(cache_dir: Path | None, no_cache: bool) -> Path | None:
    """The embedding cache folder (checked writable), or None with ``--no-cache``."""
    from vascl_scale.paths import check_output_dir

    return None if no_cache else check_output_dir(cache_dir or default_cache_dir(), "--cache-dir")

"""``vascl-scale data ...``: turn text corpora into WebDataset shards for streaming training."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from vascl_scale.data.prepare import PrepareOptions, prepare_shards, summary_table
from vascl_scale.log import fail, print_table

app = typer.Typer(help="Training data: prepare WebDataset shards.", no_args_is_help=True)


@app.command("prepare")
def prepare(
    inputs: List[Path] = typer.Argument(
        ..., help="Text (.txt[.gz]), JSONL, CSV/TSV, Parquet files or datasets directories."
    ),
    output: Path = typer.Option(..., "--output", "-o", help="Directory for shard-NNNNNN.tar and manifest.json."),
    shard_size: int = typer.Option(50_000, "--shard-size", help="Samples per shard."),
    fmt: str = typer.Option("auto", "--format", help="auto, txt, jsonl, csv, parquet or hf."),
    text_field: str = typer.Option("text", "--text-field", help="Field / column holding the text (not for txt)."),
    dedup: bool = typer.Option(False, "--dedup", help="Drop exact duplicates (after stripping whitespace)."),
    min_words: int = typer.Option(0, "--min-words", help="Drop lines with fewer whitespace-separated words."),
    max_chars: Optional[int] = typer.Option(None, "--max-chars", help="Drop lines longer than this many characters."),
    shuffle_seed: Optional[int] = typer.Option(
        None, "--shuffle-seed", help="Shuffle all lines (two-pass bucket scatter)."
    ),
    tokenizer: Optional[str] = typer.Option(
        None, "--tokenizer", help="Also store token ids from this tokenizer directory."
    ),
    max_length: int = typer.Option(32, "--max-length", help="Truncation length for stored token ids."),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Replace the shards in --output, once the new set is complete."
    ),
) -> None:
    """Write filtered text as WebDataset shards with a manifest of counts, hashes and drops."""
    try:
        options = PrepareOptions(
            shard_size=shard_size,
            fmt=fmt,
            text_field=text_field,
            dedup=dedup,
            min_words=min_words,
            max_chars=max_chars,
            shuffle_seed=shuffle_seed,
            tokenizer=tokenizer,
            max_length=max_length,
        )
        result = prepare_shards(list(inputs), output, options, overwrite=overwrite)
    except ValueError as err:
        fail(err)
    print_table(summary_table(result))

"""``vascl-scale data ...``: obtain the datasets; turn text corpora into WebDataset shards."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from vascl_scale.cli_options import BATCH, CACHE, DEVICE, MAX_LENGTH, NO_CACHE, POOLING, PRECISION, embedding_cache
from vascl_scale.log import fail, print_table

if TYPE_CHECKING:
    from rich.table import Table

app = typer.Typer(help="Data: download the datasets; prepare WebDataset shards for training.", no_args_is_help=True)


def _write_shard_set(write: Callable[[], Any], summary_table: Callable[[Any], Table]) -> None:
    """Run ``write`` (``data prepare`` or ``data mine``) and print its summary table. A set of no
    sample prints what was read and why it was dropped, and exits with 1; bad inputs or options
    exit with 2, the shard set in ``--output`` left as it was."""
    from vascl_scale.data.shard_writer import NothingWrittenError

    try:
        result = write()
    except NothingWrittenError as err:
        print_table(summary_table(err.result))
        fail(err, status=1)
    except ValueError as err:
        fail(err)
    print_table(summary_table(result))


@app.command("prepare")
def prepare(
    inputs: list[Path] = typer.Argument(
        ..., metavar="INPUTS...", help="Text (.txt[.gz]), JSONL, CSV/TSV, Parquet files or datasets directories."
    ),
    output: Path = typer.Option(..., "--output", "-o", help="Directory for shard-NNNNNN.tar and manifest.json."),
    shard_size: int = typer.Option(50_000, "--shard-size", help="Samples per shard."),
    fmt: str = typer.Option(
        "auto",
        "--format",
        help="auto, txt, jsonl, csv, parquet, hf, or nli (SimCSE's nli_for_simcse.csv, SNLI / "
        "MultiNLI JSONL: (premise, entailment, contradiction) triplets).",
    ),
    text_field: str = typer.Option(
        "text",
        "--text-field",
        metavar="A[,P,N1,...]",
        help="Field / column holding the text (not for txt); "
        "several, comma-separated, for anchor, positive and hard negatives in order.",
    ),
    label_field: str | None = typer.Option(
        None,
        "--label-field",
        metavar="NAME",
        help="Labelled pairs (PairSupCon): the field of each pair's label, 1 "
        "similar, 0 not; with two --text-field names, the anchor and the text paired with it.",
    ),
    score_field: str | None = typer.Option(
        None,
        "--score-field",
        metavar="NAME",
        help="A teacher's scores of each row's candidates (its positive, then each hard negative): "
        "a list of numbers per row, written as the scores column (distill_kl, margin_mse).",
    ),
    labelled_pairs: bool = typer.Option(
        False,
        "--labelled-pairs",
        help="Labelled pairs (PairSupCon) from triplets (--format nli or --text-field A,P,N): "
        "each (anchor, positive, 1) and (anchor, negative, 0); needs --shuffle-seed.",
    ),
    dedup: bool = typer.Option(False, "--dedup", help="Drop rows whose anchor was seen (after stripping whitespace)."),
    min_words: int = typer.Option(0, "--min-words", help="Drop rows with a text of fewer whitespace-separated words."),
    max_chars: int | None = typer.Option(
        None, "--max-chars", help="Drop rows with a text longer than this many characters."
    ),
    shuffle_seed: int | None = typer.Option(None, "--shuffle-seed", help="Shuffle all rows (two-pass bucket scatter)."),
    tokenizer: str | None = typer.Option(
        None, "--tokenizer", help="Also store token ids from this tokenizer directory."
    ),
    max_length: int = typer.Option(32, "--max-length", help="Truncation length for stored token ids."),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Replace the shards in --output, once the new set is complete."
    ),
) -> None:
    """Write filtered text, single or in columns (pairs, triplets, labelled pairs), as WebDataset shards with a manifest."""
    from vascl_scale.data.prepare import PrepareOptions, prepare_shards, summary_table

    def write():
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
            label_field=label_field,
            labelled_pairs=labelled_pairs,
            score_field=score_field,
        )
        return prepare_shards(list(inputs), output, options, overwrite=overwrite)

    _write_shard_set(write, summary_table)


@app.command("mine")
def mine(
    inputs: list[Path] = typer.Argument(
        ...,
        metavar="INPUTS...",
        help="(anchor, positive) pairs: JSONL, CSV/TSV, Parquet files or datasets directories.",
    ),
    model: str = typer.Option(
        ...,
        "--model",
        help="The encoder that scores candidates: run dir (best/, else final/), HF or sentence-transformers "
        "dir, package:MODULE/SUBDIR or a hub id, as the eval commands take it.",
    ),
    text_field: str = typer.Option(..., "--text-field", metavar="A,P", help="The anchor's and the positive's fields."),
    output: Path = typer.Option(..., "--output", "-o", help="Directory for the paired shards and manifest.json."),
    teacher: str | None = typer.Option(
        None,
        "--teacher",
        help="Also score each row's positive and negatives with this teacher, written as the scores column "
        "(distill_kl, margin_mse): a reranker (a cross-encoder directory: its logit) or an encoder (its cosine).",
    ),
    negatives: int = typer.Option(
        1, "--negatives", help="Hard negatives per row: columns negative_0 .. negative_{N-1}."
    ),
    rank_range: str = typer.Option(
        "0:50",
        "--range",
        metavar="LO:HI",
        help="Candidates ranked LO+1 .. HI by similarity (positives and copies of "
        "the row's texts left out first): 10:50 skips the 10 most similar and keeps the next 40, as "
        "sentence-transformers' range_min=10, range_max=50.",
    ),
    margin: str = typer.Option(
        "0.95",
        "--margin",
        help="Skip a candidate scoring above MARGIN x the cosine of the row's anchor and positive "
        "(sentence-transformers' relative_margin = 1 - MARGIN; applied after --range); none for no margin.",
    ),
    sampling: str = typer.Option(
        "top", "--sampling", help="top: the most similar survivors; random: a draw seeded by --seed and the row."
    ),
    seed: int = typer.Option(0, "--seed", help="Seeds --sampling random."),
    pool: list[Path] | None = typer.Option(
        None,
        "--pool",
        help="More candidates besides the inputs' positives (the default pool): text, one a line, or "
        "the input formats (repeatable).",
    ),
    pool_field: str = typer.Option(
        "text", "--pool-field", metavar="F[,G,...]", help="The --pool fields whose texts are candidates (not for txt)."
    ),
    fmt: str = typer.Option("auto", "--format", help="auto, jsonl, csv, parquet or hf: the inputs' format."),
    search: str = typer.Option("auto", "--search", help="auto (faiss when installed, else exact), exact or faiss."),
    chunk_size: int = typer.Option(
        1024,
        "--chunk-size",
        help="Anchors and pool rows per block of the exact search (memory ~ 40 x this squared bytes).",
    ),
    shard_size: int = typer.Option(50_000, "--shard-size", help="Samples per shard."),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Replace the shards in --output, once the new set is complete."
    ),
    batch_size: int = BATCH,
    max_length: int | None = MAX_LENGTH,
    pooling: str | None = POOLING,
    device: str | None = DEVICE,
    cache_dir: Path | None = CACHE,
    no_cache: bool = NO_CACHE,
    precision: str = PRECISION,
) -> None:
    """Add hard negatives to (anchor, positive) pairs, mined with an encoder: paired shards and a manifest."""
    from vascl_scale.data.mine import MineOptions, mine_shards, parse_margin, parse_range, summary_table
    from vascl_scale.encode import Embedder, model_fingerprint, resolve_model
    from vascl_scale.teacher import load_teacher

    def write():
        range_min, range_max = parse_range(rank_range)
        options = MineOptions(
            negatives=negatives,
            range_min=range_min,
            range_max=range_max,
            margin=parse_margin(margin),
            sampling=sampling,
            seed=seed,
            chunk_size=chunk_size,
            search=search,
            shard_size=shard_size,
            fmt=fmt,
            text_field=text_field,
            pool_field=pool_field,
        )
        cache = embedding_cache(cache_dir, no_cache)

        def embedder_of(name: str) -> Embedder:
            spec = resolve_model(name, pooling, max_length)
            return Embedder(spec, batch_size=batch_size, cache_dir=cache, device=device, precision=precision)

        def embed_with(name: str):
            embedder = embedder_of(name)
            return lambda texts: embedder.embed(texts)(texts)

        embedder = embedder_of(model)
        miner = {
            "model": embedder.spec.describe(),
            "fingerprint": model_fingerprint(embedder.spec),
            "precision": embedder.stats.precision,
            "device": embedder.device,
        }
        scorer = None
        if teacher is not None:
            scorer, miner["teacher"] = load_teacher(teacher, embed_with, batch_size, max_length, embedder.device)
        return mine_shards(
            list(inputs),
            output,
            options,
            lambda texts: embedder.embed(texts)(texts),
            miner,
            list(pool or []),
            overwrite,
            scorer,
        )

    _write_shard_set(write, summary_table)


@app.command("download")
def download(
    names: list[str] = typer.Argument(
        None,
        help="Datasets (wiki1m, nli, sts12, stsb, agnews, banking77, nanobeir-scifact, ...), families (corpus, sts, "
        "sts_senteval, clustering, intent, retrieval), groups (nanobeir: its 13 sets) or all (the default).",
    ),
    to: Path | None = typer.Option(None, "--to", help="The data directory to fill (default $VASCL_DATA)."),
    mirror: str | None = typer.Option(
        None,
        "--mirror",
        envvar="VASCL_MIRROR",
        help="A directory or http(s) URL holding the original files at <mirror>/<host>/<path> of their URLs.",
    ),
    force: bool = typer.Option(False, "--force", help="Fetch and convert again even what is already present."),
    timeout: float | None = typer.Option(
        None,
        "--timeout",
        metavar="SECONDS",
        help="The most one file's transfer may take (default one hour); its .part is kept for the next run to resume.",
    ),
    registry: Path | None = typer.Option(
        None, "--registry", envvar="VASCL_REGISTRY", help="A registry file instead of the one shipped."
    ),
    list_only: bool = typer.Option(False, "--list", help="Show the registry (source, licence, files) and exit."),
    markdown: bool = typer.Option(False, "--markdown", help="With --list: a Markdown table with every file's sha256."),
    urls: bool = typer.Option(
        False, "--urls", help="With --list: every original's URL, one a line (for `wget -x` to build a mirror)."
    ),
) -> None:
    """Fetch datasets from their public sources, convert them to the data layout, verify checksums."""
    from vascl_scale.data.download import (
        FILE_TIMEOUT_S,
        download_datasets,
        registry_markdown,
        registry_table,
        summary_table,
    )
    from vascl_scale.data.registry import load_registry

    try:
        chosen = load_registry(registry).select(list(names or []))
        if (markdown or urls) and not list_only:
            raise ValueError("--markdown and --urls go with --list")
        if markdown and urls:
            raise ValueError("--markdown and --urls: choose one")
        if list_only:
            if urls:
                originals = dict.fromkeys(source.url for dataset in chosen for source in dataset.sources)
                typer.echo("".join(f"{url}\n" for url in originals), nl=False)
            elif markdown:
                typer.echo(registry_markdown(chosen), nl=False)
            else:
                print_table(registry_table(chosen))
            return
        target = to or (Path(os.environ["VASCL_DATA"]) if os.environ.get("VASCL_DATA") else None)
        if target is None:
            raise ValueError("no data directory: pass --to DIR or set VASCL_DATA")
        outcomes = download_datasets(
            chosen, target, mirror=mirror, force=force, timeout=FILE_TIMEOUT_S if timeout is None else timeout
        )
    except ValueError as err:
        fail(err)
    print_table(summary_table(outcomes))
    if any(outcome.status == "failed" for outcome in outcomes):
        raise typer.Exit(1)

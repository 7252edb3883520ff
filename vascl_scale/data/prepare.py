"""``data prepare``: text inputs -> filtered, optionally shuffled WebDataset shards + manifest.

A row is one text (``--text-field NAME``, or plain text) or several: ``--text-field A,P,N1,...``
names the fields of the columns anchor, positive, negative_0, ... (:func:`vascl_scale.data.columns.columns_of`), and
``--format nli`` builds (anchor, positive, negative_0) triplets from NLI data
(:func:`~vascl_scale.data.inputs.pair_nli`). A row is dropped, and counted by reason in the
manifest's ``dropped``, when any of its texts is malformed, missing, not UTF-8, empty, or
outside ``--min-words`` / ``--max-chars``, and with ``--dedup`` when its anchor was seen before.
Every input record is counted once: ``lines_read`` = samples written + the drops (+ with NLI
JSONL, ``negative_lines``: the contradiction lines kept as another row's hard negative).

Labelled pairs (the columns anchor, paired, label: :data:`~vascl_scale.data.columns.LABELLED_PAIR`,
PairSupCon's data) come two ways. ``--text-field A,B --label-field Y`` reads them as they are,
the label from field Y (0 or 1, :func:`~vascl_scale.data.inputs.label_value`; any other value
drops the row as ``bad_label``). ``--labelled-pairs`` makes them from triplets (``--format nli``
or ``--text-field A,P,N``) as the PairSupCon README does from ``nli_for_simcse.csv``: each triplet
is two rows, (anchor, positive, 1) and (anchor, negative, 0), each filtered on its own and
counted in ``rows_read`` = ``lines_read`` + the triplets (= samples + drops + negative lines).
It needs ``--shuffle-seed``: the two rows of an anchor, side by side, would otherwise fall in one
batch, where the anchor's second copy is a negative of its first. (Pairs are made here, never in
the training step, for the same reason.) ``--dedup`` on labelled pairs drops a row whose
(anchor, paired) was seen before, so both rows of an anchor stay.

``--score-field S`` (with ``--text-field A,P[,N1,...]``) adds the column ``scores``: each row's
teacher scores of its candidates, its positive then each hard negative, as field S holds them
(a list of numbers; in CSV its JSON text), stored as ``<key>.scores.json`` for ``distill_kl`` and
``margin_mse``. A row without the field is dropped as ``missing_column``; a value that is not
one finite number per candidate (a NaN) stops the run with one line naming the file and record.

Memory stays constant in the number of lines (NLI JSONL pairing aside, see ``pair_nli``):
- without ``--shuffle-seed`` rows stream into the current shard (one shard of text in memory);
- ``--dedup`` keeps one 64-bit blake2b digest per kept anchor in a Python set of ints, about
  70 bytes per unique anchor (10M ~ 0.7 GB). Two distinct anchors collide with probability
  about n^2 / 2^65 (1e-7 at 10M), which would drop one of them as a duplicate;
- ``--shuffle-seed`` does a two-pass bucket scatter: pass 1 sends each kept row to one of
  ``SHUFFLE_BUCKETS`` temporary files chosen by a seeded RNG, pass 2 loads one bucket at a
  time, shuffles it with the same seed and writes it out. A random bucket per row followed by
  a uniform shuffle inside each bucket is a uniform random permutation of all rows; memory is
  one bucket (total text / 256) and temporary disk equals the kept text.

``--tokenizer DIR`` also stores each text's token ids (``ids``, one per column: little-endian
int32, truncated to ``--max-length`` with special tokens) and the tokenizer's fingerprint in
the manifest; the loader then skips tokenisation when its tokenizer and max length match.

Output bytes depend only on the inputs and options (fixed tar metadata, seeded RNG), so the
sha256 values in the manifest are reproducible.

The new set is written to a hidden staging directory inside ``--output`` and swapped in only
once complete (:func:`vascl_scale.data.shard_writer.write_shard_set`).
"""

from __future__ import annotations

import logging
import random
import struct
import tempfile
import time
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from vascl_scale.data.columns import LABELLED_PAIR, SCORES, columns_of
from vascl_scale.data.inputs import NLI_DROP_REASONS, ScoreError, open_input
from vascl_scale.data.manifest import Manifest
from vascl_scale.data.shard_writer import (
    DROP_REASONS,
    LABEL_DROP_REASONS,
    RowFilter,
    ShardSink,
    dropped_summary,
    write_shard_set,
)
from vascl_scale.data.shards import tokenizer_fingerprint
from vascl_scale.log import console

logger = logging.getLogger(__name__)

MAX_COLUMNS = 64  # an anchor, a positive and up to 62 hard negatives
SHUFFLE_BUCKETS = 256
_LENGTH = struct.Struct("<I")  # bucket file records: per text of a row, little-endian uint32 byte length + UTF-8


@dataclass(frozen=True)
class PrepareOptions:
    """What ``data prepare`` does to the text; recorded verbatim in the manifest."""

    shard_size: int = 50_000
    fmt: str = "auto"
    text_field: str = "text"  # comma-separated: the fields of anchor[, positive, negative_0, ...]
    dedup: bool = False
    min_words: int = 0
    max_chars: int | None = None
    shuffle_seed: int | None = None
    tokenizer: str | None = None
    max_length: int = 32
    label_field: str | None = None  # the field of each pair's label (0 or 1): labelled pairs as they are
    labelled_pairs: bool = False  # each triplet (anchor, positive, negative) -> two labelled pairs
    score_field: str | None = None  # the field of each row's teacher scores, one per candidate: the scores column

    def __post_init__(self) -> None:
        if self.shard_size < 1:
            raise ValueError(f"--shard-size must be >= 1; got {self.shard_size}")
        if self.min_words < 0:
            raise ValueError(f"--min-words must be >= 0; got {self.min_words}")
        if self.max_chars is not None and self.max_chars < 1:
            raise ValueError(f"--max-chars must be >= 1; got {self.max_chars}")
        if self.max_length < 2:
            raise ValueError(f"--max-length must be >= 2; got {self.max_length}")
        names = self.text_fields
        if "" in names:
            raise ValueError(
                f"--text-field {self.text_field!r} has an empty name; pass names separated by single commas, "
                "e.g. sent0,sent1,hard_neg"
            )
        twice = next((name for index, name in enumerate(names) if name in names[:index]), None)
        if twice is not None:
            raise ValueError(f"--text-field {self.text_field} names {twice!r} twice; give each column its own field")
        if len(names) > MAX_COLUMNS:
            raise ValueError(
                f"--text-field names {len(names)} fields; at most {MAX_COLUMNS} (an anchor, a positive and "
                f"{MAX_COLUMNS - 2} hard negatives)"
            )
        if self.fmt == "nli" and self.text_field != PrepareOptions.text_field:
            raise ValueError(
                f"--text-field {self.text_field} does not apply to --format nli, whose fields are fixed; leave it out"
            )
        self._check_labels()

    def _check_labels(self) -> None:
        """The rules of --label-field and --labelled-pairs (module docstring)."""
        label = self.label_field
        if self.score_field is not None and self.labelled:
            raise ValueError(
                f"--score-field {self.score_field} scores an anchor's candidates (distill_kl, margin_mse), and labelled "
                "pairs have none; pass it with --text-field anchor,positive[,negatives...] and no --label-field or "
                "--labelled-pairs"
            )
        if label is not None and self.labelled_pairs:
            raise ValueError(
                f"--label-field {label} reads labelled pairs and --labelled-pairs makes them from triplets; pass one of them"
            )
        if label is not None:
            if not label or "," in label:
                raise ValueError(f"--label-field takes one field name; got {label!r}")
            if self.fmt == "nli":
                raise ValueError(
                    f"--label-field {label} does not apply to --format nli, whose fields are fixed; pass --labelled-pairs "
                    "to make labelled pairs of its triplets"
                )
            if len(self.text_fields) != 2 or label in self.text_fields:
                raise ValueError(
                    f"--label-field {label} labels pairs: pass the pair's two texts with --text-field (e.g. "
                    f"--text-field sentence1,sentence2 --label-field {label}), neither of them the label; got "
                    f"--text-field {self.text_field}"
                )
        if self.labelled_pairs:
            if self.fmt != "nli" and len(self.text_fields) != 3:
                raise ValueError(
                    "--labelled-pairs makes two labelled pairs of each triplet: pass --format nli or three fields, "
                    f"--text-field ANCHOR,POSITIVE,NEGATIVE; got --text-field {self.text_field}"
                )
            if self.shuffle_seed is None:
                raise ValueError(
                    "--labelled-pairs writes each anchor twice, with its positive and with its negative; pass "
                    "--shuffle-seed N so that the two rows fall in different batches (side by side, the second "
                    "copy would be a negative of the first)"
                )

    @property
    def labelled(self) -> bool:
        """Whether the rows written are labelled pairs (:data:`~vascl_scale.data.columns.LABELLED_PAIR`)."""
        return self.label_field is not None or self.labelled_pairs

    @property
    def text_fields(self) -> tuple[str, ...]:
        return tuple(self.text_field.split(","))


@dataclass
class PrepareResult:
    output: Path
    columns: tuple[str, ...]
    shards: list[dict]
    dropped: dict[str, int]
    lines_read: int
    negative_lines: int | None  # None: no NLI JSONL input, which alone keeps lines as negatives
    seconds: float
    rows_read: int | None = None  # --labelled-pairs: two rows per triplet; None otherwise (one per line)

    @property
    def samples(self) -> int:
        return sum(shard["samples"] for shard in self.shards)


# What to change when the rows were dropped for a reason (data prepare's reasons; NLI records'
# reasons share one piece of advice).
_DROP_ADVICE = {
    "empty": "give texts that are not blank (or name the fields that hold them with --text-field)",
    "invalid_utf8": "convert the inputs to UTF-8 (e.g. iconv)",
    "malformed": "pass the inputs' --format",
    "missing_column": "name fields the records have with --text-field",
    "too_short": "lower --min-words",
    "too_long": "raise --max-chars",
    "duplicate": "drop --dedup",
    "bad_label": "give each pair a label of 0 or 1 in the --label-field",
}
_NLI_ADVICE = "give NLI records with an entailment and a contradiction for each premise"


def nothing_prepared(result: PrepareResult) -> str:
    """Why ``data prepare`` wrote no sample (every row dropped, or no row read) and what to change."""
    if result.lines_read == 0:
        return (
            f"no sample written to --output {result.output}: the inputs hold no records; give inputs with text in them"
        )
    read = f"{result.rows_read:,} rows" if result.rows_read is not None else f"{result.lines_read:,} lines"
    reasons = [reason for _, reason in sorted(((-c, r) for r, c in result.dropped.items() if c))]
    advice = list(dict.fromkeys(_DROP_ADVICE.get(reason, _NLI_ADVICE) for reason in reasons))
    return (
        f"no sample written to --output {result.output}: all {read} read were dropped ({dropped_summary(result.dropped)}); "
        f"{' or '.join(advice)}"
    )


def _labelled_pairs(record: object) -> list[object]:
    """A triplet record (anchor, positive, negative) -> its labelled pairs (anchor, positive, 1) and
    (anchor, negative, 0); any other record (a drop, an NLI negative line) as it is."""
    if not isinstance(record, tuple):
        return [record]
    anchor, positive, negative = record
    return [(anchor, positive, 1), (anchor, negative, 0)]


def _scatter(kept: Iterable[tuple[str, ...]], bucket_dir: Path, seed: int) -> list[Path]:
    """Pass 1 of the shuffle: append each row to a seeded-random bucket file."""
    rng = random.Random(seed)
    paths = [bucket_dir / f"bucket-{index:03d}.bin" for index in range(SHUFFLE_BUCKETS)]
    handles = [open(path, "wb", buffering=1 << 16) for path in paths]
    try:
        for row in kept:
            handle = handles[rng.randrange(SHUFFLE_BUCKETS)]
            for text in row:
                payload = text.encode("utf-8")
                handle.write(_LENGTH.pack(len(payload)))
                handle.write(payload)
    finally:
        for handle in handles:
            handle.close()
    return paths


def _gather(paths: list[Path], columns: int, seed: int) -> Iterator[tuple[str, ...]]:
    """Pass 2 of the shuffle: one bucket of ``columns``-text rows in memory at a time, shuffled, then deleted."""
    rng = random.Random(seed + 1)
    for path in paths:
        data = path.read_bytes()
        texts = []
        offset = 0
        while offset < len(data):
            (length,) = _LENGTH.unpack_from(data, offset)
            offset += _LENGTH.size
            texts.append(data[offset : offset + length].decode("utf-8"))
            offset += length
        path.unlink()
        rows = [tuple(texts[start : start + columns]) for start in range(0, len(texts), columns)]
        rng.shuffle(rows)
        yield from rows


def _load_tokenizer(name: str):
    from vascl_scale.tokenizer import load_tokenizer

    try:
        tokenizer = load_tokenizer(name)
    except (OSError, ValueError) as err:
        raise ValueError(f"--tokenizer {name}: cannot load a tokenizer there ({err})") from err
    if tokenizer_fingerprint(tokenizer) is None:
        raise ValueError(f"--tokenizer {name} has no fast (Rust) tokenizer; stored ids need one")
    return tokenizer


def prepare_shards(
    inputs: list[Path],
    output: Path,
    options: PrepareOptions,
    overwrite: bool = False,
    show_progress: bool = True,
) -> PrepareResult:
    """Read ``inputs`` in order, filter, optionally shuffle, write shards and ``manifest.json``.

    Raises ``ValueError`` for bad inputs or options and for a failed write (full or read-only
    disk), naming the path and the cause; on any failure ``output`` is left as it was.
    """
    if not inputs:
        raise ValueError("pass at least one input file or directory")
    readers = [
        open_input(Path(path), options.fmt, options.text_fields, options.label_field, options.score_field)
        for path in inputs
    ]

    def write(stage: Path) -> tuple[PrepareResult, Manifest]:
        tokenizer = _load_tokenizer(options.tokenizer) if options.tokenizer is not None else None
        return _write_set(readers, stage, options, tokenizer, show_progress)

    result = write_shard_set(output, overwrite, write, nothing_prepared)
    logger.info("wrote %d shards to %s in %.1f s", len(result.shards), output, result.seconds)
    return result


def _write_set(
    readers: list, stage: Path, options: PrepareOptions, tokenizer, show_progress: bool
) -> tuple[PrepareResult, Manifest]:
    """Write the shards and ``manifest.json`` of :func:`prepare_shards` into ``stage``."""
    counts = {reader.columns for reader in readers}
    assert len(counts) == 1, counts  # one --format and --text-field for every input; txt refuses several
    columns = LABELLED_PAIR if options.labelled else columns_of(counts.pop())
    if options.score_field is not None:
        columns = (*columns, SCORES)
    pairs_nli = any(reader.pairs_nli for reader in readers)
    reasons = (
        DROP_REASONS + (LABEL_DROP_REASONS if options.label_field else ()) + (NLI_DROP_REASONS if pairs_nli else ())
    )
    row_filter = RowFilter(
        options.labelled, options.dedup, options.min_words, options.max_chars, scored=options.score_field is not None
    )
    sink = ShardSink(stage, columns, options.shard_size, tokenizer, options.max_length)
    lines_read = rows_read = 0
    start = time.perf_counter()
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>5.1f}%  {task.fields[lines]:,} lines"),
        TimeElapsedColumn(),
        console=console,
        disable=not show_progress,
    )

    def kept_rows() -> Iterator[tuple[str, ...]]:
        nonlocal lines_read, rows_read
        for reader in readers:
            task = progress.add_task(f"read {reader.path.name}", total=None, lines=0)
            count = 0
            try:
                for record in reader.records():
                    count += 1
                    for item in _labelled_pairs(record) if options.labelled_pairs else (record,):
                        rows_read += 1
                        row = row_filter(item)
                        if row is not None:
                            yield row
                    if count % 16384 == 0:
                        progress.update(task, total=reader.total or None, completed=reader.position(), lines=count)
            except (OSError, EOFError, zlib.error) as err:  # a damaged file: truncated or corrupt gzip, I/O error
                raise ValueError(f"cannot read input {reader.path} after {count} records: {err}") from err
            except ScoreError as err:
                raise ValueError(
                    f"{reader.path}: record {count + 1}: --score-field {options.score_field} {err}; write one finite "
                    "teacher score per candidate, the positive's first"
                ) from err
            lines_read += count
            progress.update(task, total=max(reader.total, 1), completed=max(reader.total, 1), lines=count)

    with progress:
        if options.shuffle_seed is None:
            for row in kept_rows():
                sink.add(row)
        else:
            with tempfile.TemporaryDirectory(prefix=".shuffle-", dir=stage) as bucket_dir:
                buckets = _scatter(kept_rows(), Path(bucket_dir), options.shuffle_seed)
                for row in _gather(buckets, len(columns), options.shuffle_seed):
                    sink.add(row)
        sink.close()
    seconds = time.perf_counter() - start
    assert set(row_filter.dropped) <= set(reasons), row_filter.dropped  # a reason not in the manifest is lost
    dropped = {reason: row_filter.dropped.get(reason, 0) for reason in reasons}
    samples = sum(s["samples"] for s in sink.shards)
    assert sum(dropped.values()) + samples + row_filter.negative_lines == rows_read
    assert options.labelled_pairs or rows_read == lines_read
    negative_lines = row_filter.negative_lines if pairs_nli else None
    manifest = Manifest(
        columns=columns,
        shards=sink.shards,
        lines_read=lines_read,
        dropped=dropped,
        sources=[{"path": str(r.path), "format": r.fmt, "text_field": ",".join(r.fields)} for r in readers],
        options=asdict(options),
        token_ids=None
        if tokenizer is None
        else {"fingerprint": tokenizer_fingerprint(tokenizer), "max_length": options.max_length, "dtype": "<i4"},
        rows_read=rows_read if options.labelled_pairs else None,
        negative_lines=negative_lines,
    )
    rows = rows_read if options.labelled_pairs else None
    return PrepareResult(stage, columns, sink.shards, dropped, lines_read, negative_lines, seconds, rows), manifest


def summary_table(result: PrepareResult) -> Table:
    table = Table(title=f"data prepare -> {result.output}")
    table.add_column("what")
    table.add_column("count", justify="right")
    table.add_row("columns", ", ".join(result.columns))
    table.add_row("lines read", f"{result.lines_read:,}")
    if result.rows_read is not None:
        table.add_row("rows read (two labelled pairs per triplet)", f"{result.rows_read:,}")
    table.add_row("samples written", f"{result.samples:,}")
    if result.negative_lines is not None:
        table.add_row("lines kept as hard negatives", f"{result.negative_lines:,}")
    for reason, count in result.dropped.items():
        table.add_row(f"dropped: {reason}", f"{count:,}")
    table.add_row("shards", f"{len(result.shards)}")
    table.add_row("seconds", f"{result.seconds:.1f}")
    return table

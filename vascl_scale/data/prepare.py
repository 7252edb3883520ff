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
once complete: a failing input, a full or read-only disk or an interrupt leaves the old set
(``--overwrite``) as it was and nothing of the new one. ``--overwrite`` therefore needs room
for both sets until the swap. A prepare killed outright (SIGKILL) cannot clean up: the next one
into the same ``--output`` removes what it left (:func:`_staging_directory`).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import random
import shutil
import struct
import tempfile
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TypeVar

import numpy as np
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from vascl_scale.data.columns import LABELLED_PAIR, LABELS, columns_of, written_fields
from vascl_scale.data.inputs import MISSING, NEGATIVE, NLI_DROP_REASONS, Drop, column_problem, open_input
from vascl_scale.data.shards import (
    MANIFEST_FORMAT,
    MANIFEST_NAME,
    MANIFEST_VERSION,
    SHARD_PATTERN,
    file_sha256,
    tokenizer_fingerprint,
    write_shard,
)
from vascl_scale.log import console

logger = logging.getLogger(__name__)

# Why a row is dropped, every run; NLI JSONL inputs add inputs.NLI_DROP_REASONS.
DROP_REASONS = ("empty", "invalid_utf8", "malformed", "missing_column", "too_short", "too_long", "duplicate")
LABEL_DROP_REASONS = ("bad_label",)  # --label-field adds: a label that is neither 0 nor 1
MAX_COLUMNS = 64  # an anchor, a positive and up to 62 hard negatives
SHUFFLE_BUCKETS = 256
STAGING_PREFIX = ".prepare-"  # the staging directories (and their locks) of runs writing into --output
Written = TypeVar("Written")  # what the writer of a shard set returns
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


class NothingWrittenError(ValueError):
    """Every row read was dropped: no shard set is written (an empty one would fail only later,
    in the run that reads it) and ``--output`` is left as it was. ``result``: what was read and
    why each row was dropped, for the command's summary table."""

    def __init__(self, message: str, result: PrepareResult) -> None:
        super().__init__(message)
        self.result = result


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


def dropped_summary(dropped: dict[str, int]) -> str:
    """``reason count, ...`` for the reasons that dropped rows, most rows first."""
    counted = sorted(((count, reason) for reason, count in dropped.items() if count), key=lambda item: -item[0])
    return ", ".join(f"{reason} {count:,}" for count, reason in counted)


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


class _RowFilter:
    """Applies the options to one input record: returns the kept row (texts stripped) or counts why not.

    ``--min-words`` and ``--max-chars`` hold for every text of a row; ``--dedup`` looks at the
    anchor only (rows sharing an anchor are false negatives of each other in a batch), or, in
    labelled pairs, at (anchor, paired): an anchor's rows with its positive and its negative stay.
    A labelled pair's record ends with its label (:func:`~vascl_scale.data.inputs.label_value`),
    kept as its digits.
    """

    def __init__(self, options: PrepareOptions) -> None:
        self.options = options
        self.dropped: Counter[str] = Counter()
        self.negative_lines = 0
        self._seen: set[int] | None = set() if options.dedup else None

    def __call__(self, record: object) -> tuple[str, ...] | None:
        if record is NEGATIVE:
            self.negative_lines += 1
            return None
        if isinstance(record, Drop):
            return self._drop(record.reason)
        assert isinstance(record, tuple), record
        texts, label = (record[:-1], record[-1]) if self.options.labelled else (record, None)
        problem = column_problem(texts) or ("missing_column" if label is MISSING else None)
        if problem is not None:
            return self._drop(problem)
        if self.options.labelled and label not in LABELS:
            return self._drop("bad_label")
        row = tuple(value.strip() for value in texts)  # type: ignore[union-attr]
        if self.options.min_words and any(len(text.split()) < self.options.min_words for text in row):
            return self._drop("too_short")
        if self.options.max_chars is not None and any(len(text) > self.options.max_chars for text in row):
            return self._drop("too_long")
        if self._seen is not None:
            digest = _digest(row[:2] if self.options.labelled else row[:1])
            if digest in self._seen:
                return self._drop("duplicate")
            self._seen.add(digest)
        return row if label is None else (*row, str(label))

    def _drop(self, reason: str) -> None:
        self.dropped[reason] += 1
        return None


class _ShardSink:
    """Fills ``shard-NNNNNN.tar`` files of ``shard_size`` samples; keys are global sample indices."""

    def __init__(
        self, output: Path, columns: tuple[str, ...], shard_size: int, tokenizer=None, max_length: int = 32
    ) -> None:
        self.output = output
        self.fields = written_fields(columns)
        self.shard_size = shard_size
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.shards: list[dict] = []
        self._pending: list[tuple[str, ...]] = []
        self._written = 0

    def add(self, row: tuple[str, ...]) -> None:
        assert len(row) == len(self.fields), (row, self.fields)
        self._pending.append(row)
        if len(self._pending) == self.shard_size:
            self._flush()

    def close(self) -> None:
        if self._pending:
            self._flush()

    def _flush(self) -> None:
        name = SHARD_PATTERN.format(index=len(self.shards))
        path = self.output / name
        # token_ids[column][row]: each column tokenised as a list of its own
        token_ids = None
        if self.tokenizer is not None:
            token_ids = [
                None if ids_field is None else self._token_ids([row[column] for row in self._pending])
                for column, (_, ids_field) in enumerate(self.fields)
            ]

        def samples() -> Iterator[tuple[str, dict[str, bytes]]]:
            for offset, row in enumerate(self._pending):
                fields = {}
                for column, (value_field, ids_field) in enumerate(self.fields):
                    fields[value_field] = row[column].encode("utf-8")  # a text, or a label's digits
                    if token_ids is not None and ids_field is not None:
                        fields[ids_field] = token_ids[column][offset]
                yield f"{self._written + offset:012d}", fields

        write_shard(path, samples())
        entry = {"name": name, "samples": len(self._pending), "sha256": file_sha256(path), "bytes": path.stat().st_size}
        self.shards.append(entry)
        self._written += len(self._pending)
        self._pending = []

    def _token_ids(self, texts: list[str]) -> list[bytes]:
        """Token ids per text as little-endian int32 bytes, truncated to ``max_length`` (with specials).

        Tokenised 1024 texts at a time: a whole shard's encodings (offsets and all) would take
        hundreds of MB.
        """
        token_ids = []
        for start in range(0, len(texts), 1024):
            encoded = self.tokenizer(texts[start : start + 1024], truncation=True, max_length=self.max_length)
            token_ids.extend(np.asarray(ids, dtype="<i4").tobytes() for ids in encoded["input_ids"])
        return token_ids


def _digest(texts: tuple[str, ...]) -> int:
    """A 64-bit blake2b digest of ``texts``, each prefixed by its length (no two tuples share an encoding)."""
    digest = hashlib.blake2b(digest_size=8)
    for text in texts:
        payload = text.encode("utf-8")
        digest.update(_LENGTH.pack(len(payload)) + payload)
    return int.from_bytes(digest.digest(), "little")


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


def _check_output(output: Path, overwrite: bool) -> None:
    if output.exists() and not output.is_dir():
        raise ValueError(f"--output {output} exists and is not a directory")
    if (any(output.glob("shard-*.tar")) or (output / MANIFEST_NAME).exists()) and not overwrite:
        raise ValueError(f"--output {output} already holds shards or a manifest; pass --overwrite or another directory")


def _load_tokenizer(name: str):
    from vascl_scale.tokenizer import load_tokenizer

    try:
        tokenizer = load_tokenizer(name)
    except (OSError, ValueError) as err:
        raise ValueError(f"--tokenizer {name}: cannot load a tokenizer there ({err})") from err
    if tokenizer_fingerprint(tokenizer) is None:
        raise ValueError(f"--tokenizer {name} has no fast (Rust) tokenizer; stored ids need one")
    return tokenizer


def _swap_in(stage: Path, output: Path) -> None:
    """Replace the shard set in ``output`` by the complete one in ``stage`` (same file system).

    The old manifest goes first and the new one lands last, so a manifest never describes
    shards other than those beside it (a crash in between leaves no manifest, not a wrong one).
    """
    (output / MANIFEST_NAME).unlink(missing_ok=True)
    new = {path.name for path in stage.glob("shard-*.tar")}
    for path in output.glob("shard-*.tar"):
        if path.name not in new:
            path.unlink()
    for name in sorted(new):
        os.replace(stage / name, output / name)
    os.replace(stage / MANIFEST_NAME, output / MANIFEST_NAME)


def _lock_of(staging: Path) -> Path:
    return staging.with_name(staging.name + ".lock")


def _held(lock: Path, remove_if_free: bool = False) -> bool:
    """Whether a live process holds the flock on ``lock`` (False when there is no such file).
    ``remove_if_free``: a lock no process holds is removed while it is locked here, so a prepare
    that created it and is about to lock it sees it gone (:func:`_new_lock`)."""
    try:
        descriptor = os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if remove_if_free:
            lock.unlink(missing_ok=True)
    except OSError:  # held; or a file system without flock, where nothing can be judged stale: keep it
        return True
    finally:
        os.close(descriptor)
    return False


def _new_lock(output: Path) -> tuple[int, Path]:
    """A new ``.prepare-XXXX.lock`` in ``output`` and its descriptor, flocked by this process.
    Another prepare may remove the file as an orphan between its creation and the flock: then
    the path no longer names the locked file, and another is made."""
    while True:
        descriptor, name = tempfile.mkstemp(prefix=STAGING_PREFIX, suffix=".lock", dir=output)
        with suppress(OSError):  # no flock on this file system: then no staging is judged stale
            fcntl.flock(descriptor, fcntl.LOCK_EX)
        with suppress(FileNotFoundError):
            if os.stat(name).st_ino == os.fstat(descriptor).st_ino:
                return descriptor, Path(name)
        os.close(descriptor)


@contextmanager
def _staging_directory(output: Path) -> Iterator[Path]:
    """A new, empty ``.prepare-XXXX`` directory in ``output`` for this run; removed afterwards.

    Beside it, ``.prepare-XXXX.lock`` is flocked by this process from before the directory
    exists until after its lock file is gone, so a staging directory whose lock no process
    holds (or that has none, as written before locks) was left by a prepare killed where no
    cleanup could run (SIGKILL, a lost node), often with a whole shard set in it. Those are
    removed here, each named, and so is a lock file that no process holds and whose directory
    was never made (a prepare killed in between); a concurrent prepare's live ones never are.
    """
    descriptor, lock = _new_lock(output)
    staging = lock.with_name(lock.name.removesuffix(".lock"))
    try:
        left = sorted(output.glob(STAGING_PREFIX + "*"))
        orphans = [
            path
            for path in left
            if path.name.endswith(".lock")
            and path != lock
            and not path.with_name(path.name.removesuffix(".lock")).exists()
            and not _held(path, remove_if_free=True)
        ]
        stale = [path for path in left if path.is_dir() and not _held(_lock_of(path))]
        for path in stale:
            shutil.rmtree(path, ignore_errors=True)
            _lock_of(path).unlink(missing_ok=True)
        if stale or orphans:
            removed = [f"{len(stale)} staging directories"] if stale else []
            removed += [f"{len(orphans)} lock files without their directory"] if orphans else []
            logger.info(
                "removed %s left by interrupted `data prepare` runs: %s",
                " and ".join(removed),
                ", ".join(str(path) for path in stale + orphans),
            )
        staging.mkdir()
        yield staging
    finally:
        lock.unlink(missing_ok=True)  # first: a staging directory without its lock is stale
        shutil.rmtree(staging, ignore_errors=True)
        os.close(descriptor)


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
    readers = [open_input(Path(path), options.fmt, options.text_fields, options.label_field) for path in inputs]

    def write(stage: Path) -> PrepareResult:
        tokenizer = _load_tokenizer(options.tokenizer) if options.tokenizer is not None else None
        return _write_set(readers, stage, options, tokenizer, show_progress)

    result = write_shard_set(output, overwrite, write, nothing_prepared)
    logger.info("wrote %d shards to %s in %.1f s", len(result.shards), output, result.seconds)
    return result


def write_shard_set(
    output: Path, overwrite: bool, write: Callable[[Path], Written], nothing_written: Callable[[Written], str]
) -> Written:
    """Check ``output`` (a shard set in it needs ``overwrite``), then ``write(stage)`` fills a
    staging directory inside it with shards and ``manifest.json``; the complete set replaces the
    one in ``output`` (:func:`_swap_in`) and ``write``'s result is returned, its ``output`` set.
    A set of no sample is :class:`NothingWrittenError`, with ``nothing_written(result)`` as its
    message. On any failure ``output`` is left as it was (removed when this call made it), and an
    ``OSError`` of the output side becomes a ``ValueError`` naming ``--output``."""
    _check_output(output, overwrite)
    created = not output.exists()
    try:
        output.mkdir(parents=True, exist_ok=True)
        with _staging_directory(output) as staging:
            result = replace(write(staging), output=output)
            if result.samples == 0:
                raise NothingWrittenError(nothing_written(result), result)
            _swap_in(staging, output)
    except BaseException as err:
        if created:  # made by this call: nothing of the user's is in it
            shutil.rmtree(output, ignore_errors=True)
        if isinstance(err, OSError):  # input read errors are ValueErrors already: this is the output side
            raise ValueError(
                f"cannot write shards to --output {output}: {err.strerror or err}; free disk space, make it "
                "writable or pass another --output (nothing in it was changed)"
            ) from err
        raise
    return result


def _write_set(readers: list, stage: Path, options: PrepareOptions, tokenizer, show_progress: bool) -> PrepareResult:
    """Write the shards and ``manifest.json`` of :func:`prepare_shards` into ``stage``."""
    counts = {reader.columns for reader in readers}
    assert len(counts) == 1, counts  # one --format and --text-field for every input; txt refuses several
    columns = LABELLED_PAIR if options.labelled else columns_of(counts.pop())
    pairs_nli = any(reader.pairs_nli for reader in readers)
    reasons = (
        DROP_REASONS + (LABEL_DROP_REASONS if options.label_field else ()) + (NLI_DROP_REASONS if pairs_nli else ())
    )
    row_filter = _RowFilter(options)
    sink = _ShardSink(stage, columns, options.shard_size, tokenizer, options.max_length)
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
    manifest = {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "columns": list(columns),
        "fields": [
            name for pair in sink.fields for name in (pair if tokenizer is not None else pair[:1]) if name is not None
        ],
        "token_ids": None
        if tokenizer is None
        else {"fingerprint": tokenizer_fingerprint(tokenizer), "max_length": options.max_length, "dtype": "<i4"},
        "total_samples": samples,
        "lines_read": lines_read,
        **({"rows_read": rows_read} if options.labelled_pairs else {}),
        "dropped": dropped,
        **({} if negative_lines is None else {"negative_lines": negative_lines}),
        "sources": [{"path": str(r.path), "format": r.fmt, "text_field": ",".join(r.fields)} for r in readers],
        "options": asdict(options),
        "shards": sink.shards,
    }
    (stage / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    rows = rows_read if options.labelled_pairs else None
    return PrepareResult(stage, columns, sink.shards, dropped, lines_read, negative_lines, seconds, rows)


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

"""Writing a shard set: the row filter, the shard sink and the set's atomic swap into ``--output``,
shared by ``data prepare`` (:mod:`vascl_scale.data.prepare`) and ``data mine``
(:mod:`vascl_scale.data.mine`).

A writer reads its inputs' records through a :class:`RowFilter` (kept rows, and the drops
counted by reason), adds the rows to a :class:`ShardSink` (``shard-NNNNNN.tar`` files of
``shard_size`` samples, optionally with token ids) and describes them in a
:class:`~vascl_scale.data.manifest.Manifest`. :func:`write_shard_set` runs it in a staging
directory inside ``--output`` and swaps the complete set in only once it is written: a failing
input, a full or read-only disk or an interrupt leaves the old set (``--overwrite``) as it was
and nothing of the new one. ``--overwrite`` therefore needs room for both sets until the swap.
A writer killed outright (SIGKILL) cannot clean up: the next one into the same ``--output``
removes what it left (:func:`vascl_scale.fs.locked_staging_directory`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import numpy as np

from vascl_scale.data.columns import LABELS, written_fields
from vascl_scale.data.inputs import MISSING, NEGATIVE, Drop, column_problem
from vascl_scale.data.manifest import MANIFEST_NAME, Manifest
from vascl_scale.data.shards import SHARD_PATTERN, write_shard
from vascl_scale.fs import file_sha256, locked_staging_directory

# Why a row is dropped, every run; NLI JSONL inputs add inputs.NLI_DROP_REASONS.
DROP_REASONS = ("empty", "invalid_utf8", "malformed", "missing_column", "too_short", "too_long", "duplicate")
LABEL_DROP_REASONS = ("bad_label",)  # --label-field adds: a label that is neither 0 nor 1
STAGING_PREFIX = ".prepare-"  # the staging directories (and their locks) of runs writing into --output
Written = TypeVar("Written")  # what the writer of a shard set returns
_LENGTH = struct.Struct("<I")  # a text's UTF-8 byte length in a digest, little-endian uint32


class NothingWrittenError(ValueError):
    """Every row read was dropped: no shard set is written (an empty one would fail only later,
    in the run that reads it) and ``--output`` is left as it was. ``result``: what was read and
    why each row was dropped, for the command's summary table."""

    def __init__(self, message: str, result: object) -> None:
        super().__init__(message)
        self.result = result


def dropped_summary(dropped: dict[str, int]) -> str:
    """``reason count, ...`` for the reasons that dropped rows, most rows first."""
    counted = sorted(((count, reason) for reason, count in dropped.items() if count), key=lambda item: -item[0])
    return ", ".join(f"{reason} {count:,}" for count, reason in counted)


class RowFilter:
    """Applies the filters to one input record: returns the kept row (texts stripped) or counts why not.

    ``min_words`` and ``max_chars`` hold for every text of a row; ``dedup`` looks at the
    anchor only (rows sharing an anchor are false negatives of each other in a batch), or, in
    ``labelled`` pairs, at (anchor, paired): an anchor's rows with its positive and its negative
    stay. A labelled pair's record ends with its label (:func:`~vascl_scale.data.inputs.label_value`),
    kept as its digits; a ``scored`` row's with its teacher scores' JSON text
    (:func:`~vascl_scale.data.inputs.scores_value`), kept as it is.
    """

    def __init__(
        self,
        labelled: bool = False,
        dedup: bool = False,
        min_words: int = 0,
        max_chars: int | None = None,
        scored: bool = False,
    ) -> None:
        self.labelled = labelled
        self.scored = scored
        self.min_words = min_words
        self.max_chars = max_chars
        self.dropped: Counter[str] = Counter()
        self.negative_lines = 0
        self._seen: set[int] | None = set() if dedup else None

    def __call__(self, record: object) -> tuple[str, ...] | None:
        if record is NEGATIVE:
            self.negative_lines += 1
            return None
        if isinstance(record, Drop):
            return self._drop(record.reason)
        assert isinstance(record, tuple), record
        texts, label = (record[:-1], record[-1]) if self.labelled or self.scored else (record, None)
        problem = column_problem(texts) or ("missing_column" if label is MISSING else None)
        if problem is not None:
            return self._drop(problem)
        if self.labelled and label not in LABELS:
            return self._drop("bad_label")
        row = tuple(value.strip() for value in texts)  # type: ignore[union-attr]
        if self.min_words and any(len(text.split()) < self.min_words for text in row):
            return self._drop("too_short")
        if self.max_chars is not None and any(len(text) > self.max_chars for text in row):
            return self._drop("too_long")
        if self._seen is not None:
            digest = _digest(row[:2] if self.labelled else row[:1])
            if digest in self._seen:
                return self._drop("duplicate")
            self._seen.add(digest)
        return row if label is None else (*row, str(label))  # a label's digits, or the scores' JSON

    def _drop(self, reason: str) -> None:
        self.dropped[reason] += 1
        return None


def _digest(texts: tuple[str, ...]) -> int:
    """A 64-bit blake2b digest of ``texts``, each prefixed by its length (no two tuples share an encoding)."""
    digest = hashlib.blake2b(digest_size=8)
    for text in texts:
        payload = text.encode("utf-8")
        digest.update(_LENGTH.pack(len(payload)) + payload)
    return int.from_bytes(digest.digest(), "little")


class ShardSink:
    """Fills ``shard-NNNNNN.tar`` files of ``shard_size`` samples; keys are global sample indices.

    ``tokenizer``: also store each text's token ids (``<column>.ids``: little-endian int32,
    truncated to ``max_length`` with special tokens). :attr:`shards` holds the manifest entry of
    every shard written.
    """

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


def _check_output(output: Path, overwrite: bool) -> None:
    if output.exists() and not output.is_dir():
        raise ValueError(f"--output {output} exists and is not a directory")
    if (any(output.glob("shard-*.tar")) or (output / MANIFEST_NAME).exists()) and not overwrite:
        raise ValueError(f"--output {output} already holds shards or a manifest; pass --overwrite or another directory")


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


def write_shard_set(
    output: Path,
    overwrite: bool,
    write: Callable[[Path], tuple[Written, Manifest]],
    nothing_written: Callable[[Written], str],
) -> Written:
    """Check ``output`` (a shard set in it needs ``overwrite``), then ``write(stage)`` fills a
    staging directory inside it with shards and returns its result and the set's manifest; the
    manifest is written beside the shards, the complete set replaces the one in ``output``
    (:func:`_swap_in`) and ``write``'s result is returned, its ``output`` set. A set of no
    sample is :class:`NothingWrittenError`, with ``nothing_written(result)`` as its message. On
    any failure ``output`` is left as it was (removed when this call made it), and an
    ``OSError`` of the output side becomes a ``ValueError`` naming ``--output``."""
    _check_output(output, overwrite)
    created = not output.exists()
    try:
        output.mkdir(parents=True, exist_ok=True)
        with locked_staging_directory(output, STAGING_PREFIX, "`data prepare`") as staging:
            written, manifest = write(staging)
            result = replace(written, output=output)
            if result.samples == 0:
                raise NothingWrittenError(nothing_written(result), result)
            manifest.write(staging)
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

"""Readers for ``data prepare`` inputs: text, JSONL, CSV/TSV, Parquet and ``datasets`` directories.

Every reader streams (constant memory) and yields ``str | None`` per input record: the raw
text, or None where the record's bytes are not valid UTF-8. Text is decoded with
``surrogateescape`` and checked afterwards, so one bad line costs one record, not the file.
Readers also report progress as a position in their own unit (bytes read or rows).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

FORMATS = ("auto", "txt", "jsonl", "csv", "parquet", "hf")
# A record that is not a JSON object, or whose text field is not a string, is counted under this reason.
MALFORMED = object()
_BATCH_ROWS = 8192


def detect_format(path: Path) -> str:
    """The input format from the path: a directory is a ``datasets`` directory, else by suffix."""
    if path.is_dir():
        return "hf"
    name = path.name.lower()
    if name.endswith(".gz"):
        name = name[: -len(".gz")]
    for suffixes, fmt in (
        ((".txt", ".text"), "txt"),
        ((".jsonl", ".json", ".ndjson"), "jsonl"),
        ((".csv", ".tsv"), "csv"),
        ((".parquet",), "parquet"),
    ):
        if name.endswith(suffixes):
            return fmt
    raise ValueError(f"cannot tell the format of {path} from its name; pass --format txt|jsonl|csv|parquet|hf")


def _utf8_or_none(text: str) -> str | None:
    """``text`` when it was decoded from valid UTF-8, None when it holds escaped bad bytes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return text


@dataclass
class InputReader:
    """One input file: ``records()`` yields texts; ``position()``/``total`` drive the progress bar."""

    path: Path
    fmt: str
    text_field: str
    total: int = field(default=0, init=False)  # bytes of the file, or rows; 0 until reading starts
    _position: Callable[[], int] = field(default=lambda: 0, init=False, repr=False)

    def position(self) -> int:
        return self._position()

    def records(self) -> Iterator[object]:
        """Yield a ``str`` per record, None for invalid UTF-8, ``MALFORMED`` for unusable records."""
        return getattr(self, f"_read_{self.fmt}")()

    def _open_bytes(self) -> io.BufferedIOBase:
        try:
            raw = open(self.path, "rb")
        except OSError as err:
            raise ValueError(f"cannot read input {self.path}: {err}") from err
        self.total = self.path.stat().st_size
        # Progress in compressed bytes for .gz: the raw file's offset is cheap to read.
        self._position = raw.tell
        if self.path.name.lower().endswith(".gz"):
            return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
        return raw

    def _read_txt(self) -> Iterator[object]:
        with self._open_bytes() as handle:
            for line in handle:
                yield _utf8_or_none(line.decode("utf-8", "surrogateescape").rstrip("\r\n"))

    def _read_jsonl(self) -> Iterator[object]:
        with self._open_bytes() as handle:
            for number, line in enumerate(handle, start=1):
                text = line.decode("utf-8", "surrogateescape")
                if not text.strip():
                    yield ""
                    continue
                try:
                    record = json.loads(text)
                except json.JSONDecodeError:
                    yield MALFORMED
                    continue
                if not isinstance(record, dict):
                    yield MALFORMED
                    continue
                if self.text_field not in record:
                    raise ValueError(
                        f"{self.path}:{number}: no field {self.text_field!r} (fields: {sorted(record)}); "
                        "pass --text-field NAME"
                    )
                yield self._field_value(record[self.text_field])

    def _read_csv(self) -> Iterator[object]:
        delimiter = "\t" if ".tsv" in self.path.name.lower() else ","
        csv.field_size_limit(sys.maxsize)
        with self._open_bytes() as raw:
            handle = io.TextIOWrapper(raw, encoding="utf-8", errors="surrogateescape", newline="")
            reader = csv.DictReader(handle, delimiter=delimiter)
            if reader.fieldnames is None or self.text_field not in reader.fieldnames:
                raise ValueError(
                    f"{self.path}: no column {self.text_field!r} in the header {reader.fieldnames}; "
                    "pass --text-field NAME"
                )
            for row in reader:
                value = row[self.text_field]
                yield None if value is None else _utf8_or_none(value)

    def _read_parquet(self) -> Iterator[object]:
        import pyarrow.parquet as pq

        try:
            parquet = pq.ParquetFile(self.path)
        except (OSError, ValueError) as err:
            raise ValueError(f"cannot read Parquet input {self.path}: {err}") from err
        if self.text_field not in parquet.schema_arrow.names:
            raise ValueError(
                f"{self.path}: no column {self.text_field!r} (columns: {parquet.schema_arrow.names}); "
                "pass --text-field NAME"
            )
        self.total = parquet.metadata.num_rows
        done = 0
        self._position = lambda: done
        for batch in parquet.iter_batches(batch_size=_BATCH_ROWS, columns=[self.text_field]):
            for value in batch.column(0).to_pylist():
                yield self._field_value(value)
            done += batch.num_rows

    def _read_hf(self) -> Iterator[object]:
        import datasets

        try:
            dataset = datasets.load_from_disk(str(self.path))
        except (OSError, ValueError, FileNotFoundError) as err:
            raise ValueError(f"cannot read the datasets directory {self.path}: {err}") from err
        if isinstance(dataset, datasets.DatasetDict):
            raise ValueError(
                f"{self.path} holds the splits {list(dataset)}; pass one split's directory, "
                f"e.g. {self.path / next(iter(dataset))}"
            )
        if self.text_field not in dataset.column_names:
            raise ValueError(
                f"{self.path}: no column {self.text_field!r} (columns: {dataset.column_names}); "
                "pass --text-field NAME"
            )
        self.total = dataset.num_rows
        done = 0
        self._position = lambda: done
        # Arrow-backed and memory-mapped: batches stream from disk without loading the table.
        for batch in dataset.select_columns([self.text_field]).iter(batch_size=_BATCH_ROWS):
            for value in batch[self.text_field]:
                yield self._field_value(value)
            done += len(batch[self.text_field])

    @staticmethod
    def _field_value(value: object) -> object:
        if value is None:
            return ""
        if isinstance(value, bytes):
            return _utf8_or_none(value.decode("utf-8", "surrogateescape"))
        if not isinstance(value, str):
            return MALFORMED
        return _utf8_or_none(value)


def open_input(path: Path, fmt: str, text_field: str) -> InputReader:
    if fmt not in FORMATS:
        raise ValueError(f"--format must be one of {', '.join(FORMATS)}; got {fmt!r}")
    if not path.exists():
        raise ValueError(f"input {path} does not exist")
    return InputReader(path=path, fmt=detect_format(path) if fmt == "auto" else fmt, text_field=text_field)

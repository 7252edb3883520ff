"""Reading the evaluation data files, with errors that name the file, the line and the fix.

Every ``.tsv`` under the data directory has a header row and is written by a CSV writer with
minimal quoting, so it is parsed with :mod:`csv` (never ``line.split("\\t")``), by
:func:`read_tsv` alone: the STS, clustering and intent loaders all go through it, so each gets
its checks (a quote that merges lines, row widths, empty texts).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TextIO

from vascl_scale.log import shown_name

LAYOUT_HINT = (
    "expected the data layout (docs/data.md): sts/<task>/<split>.tsv, clustering/<name>.tsv, "
    "intent/<name>/<split>.tsv; `vascl-scale data download --to DIR` fetches it"
)


class MissingDataError(ValueError):
    """A dataset file is absent. ``eval all`` skips such a task; a single-family run fails."""

    def __init__(
        self, path: Path, hint: str = LAYOUT_HINT, what: str = "dataset file", problem: str = "not found"
    ) -> None:
        super().__init__(f"{what} {path} {problem}; {hint}")
        self.path = Path(path)


def require_file(path: Path, hint: str = LAYOUT_HINT) -> Path:
    path = Path(path)
    if not path.is_file():
        raise MissingDataError(path, hint)
    return path


# Characters a field may hold (csv's default limit): no text to embed comes near it, so a longer
# field is a file pasted into one, or a quote that ran on.
FIELD_LIMIT = 131072

# The fix of every quote that swallowed line breaks.
QUOTE_FIX = (
    'a text holds no line break, so this is a stray ": remove it, or quote the whole field and '
    'double each quote inside it ("")'
)


def _records(path: Path, handle: TextIO) -> Iterator[tuple[int, list[str]]]:
    """(physical line, fields) of each CSV record of an open TSV, the header first.

    A record spanning several lines means a ``"`` at the start of a field opened a quoted field
    that ran on to the next ``"`` of the file (many rows read as one text) or to the end of the
    file; either way it is reported at the line where the quote opened, naming the column.
    """
    # The limit is process-wide and `data prepare` raises it for its inputs: set the one this
    # reader's errors are written for (csv's default) every time.
    csv.field_size_limit(FIELD_LIMIT)
    reader = csv.reader(handle, delimiter="\t")
    header: list[str] = []
    end = 0  # the last physical line read so far
    while True:
        start = end + 1
        try:
            record = next(reader)
        except StopIteration:
            return
        except csv.Error as err:  # "field larger than field limit"
            if reader.line_num == start:  # within one line: a long field, not a quote that ran on
                raise ValueError(
                    f"{path}:{start}: a field on this line is longer than {FIELD_LIMIT} characters; "
                    "no text to embed is that long: check the line (a file pasted into one field?) or shorten it"
                ) from None
            raise ValueError(
                f"{path}:{start}: a quoted field opened on this line is still open on line {reader.line_num} "
                f"({err}); {QUOTE_FIX}"
            ) from None
        end = reader.line_num
        if end > start:
            i = next(i for i, value in enumerate(record) if "\n" in value or "\r" in value)
            column = repr(header[i]) if i < len(header) else f"number {i + 1}"
            raise ValueError(
                f"{path}:{start}: a quote opens column {column} on this line and is not closed before line "
                f"{end}, so lines {start} to {end} were read as one row; {QUOTE_FIX}"
            )
        if start == 1:
            header = record
        yield start, record


def read_tsv(
    path: Path, columns: Sequence[str], text_columns: Sequence[str] = (), optional: Sequence[str] = ()
) -> list[tuple[int, dict[str, str]]]:
    """(line number, row) for each row of a headed TSV; a row holds ``columns`` and those of
    ``optional`` that the header has.

    The one reader of every evaluation TSV. Raises ``ValueError`` naming the file and line for a
    quote that merges lines (see :func:`_records`), text that is not UTF-8, a missing column, a
    row with the wrong number of fields, or an empty value in one of ``text_columns``; and naming
    the file for one without rows. A UTF-8 byte order mark (as spreadsheet programs write) is
    skipped, so it does not become part of the first column's name.
    """
    path = require_file(path)
    data = path.read_bytes()  # whole: evaluation files are a few MB at most, and an error's offset is then a line
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise ValueError(
            f"{path}:{line}: not UTF-8 text (byte 0x{data[err.start]:02x}); save the file as UTF-8"
        ) from None
    with io.StringIO(text, newline="") as handle:
        records = _records(path, handle)
        _, header = next(records, (1, None))
        if header is None:
            raise ValueError(f"{path} is empty; expected a header row with columns {list(columns)}")
        absent = [name for name in columns if name not in header]
        if absent:
            raise ValueError(f"{path}:1: header {header} lacks columns {absent}; expected {list(columns)}")
        kept = list(columns) + [name for name in optional if name in header]
        where = [header.index(name) for name in kept]
        rows = []
        for line, record in records:
            if not record:
                continue  # a blank line carries no row
            if len(record) != len(header):
                raise ValueError(
                    f"{path}:{line}: malformed row with {len(record)} fields, expected {len(header)} "
                    f"({', '.join(map(shown_name, header))}); fix or remove this line"
                )
            row = {name: record[i] for name, i in zip(kept, where)}
            for name in text_columns:
                if not row[name].strip():
                    raise ValueError(f"{path}:{line}: empty text in column {name!r}; remove the row or fill it in")
            rows.append((line, row))
    if not rows:
        raise ValueError(f"{path} has a header but no rows; expected rows of {list(columns)}")
    return rows

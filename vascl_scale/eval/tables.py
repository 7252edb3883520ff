"""Reading the evaluation data files, with errors that name the file, the line and the fix.

Every ``.tsv`` under the data directory has a header row and is written by a CSV writer with
minimal quoting, so it is parsed with :mod:`csv` (never ``line.split("\\t")``).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Sequence

LAYOUT_HINT = (
    "expected the layout of ../shared/data (see its README): sts/<task>/<split>.tsv, "
    "clustering/<name>.tsv, intent/<name>/<split>.tsv"
)


class MissingDataError(ValueError):
    """A dataset file is absent. ``eval all`` skips such a task; a single-family run fails."""

    def __init__(self, path: Path, hint: str = LAYOUT_HINT) -> None:
        super().__init__(f"dataset file {path} not found; {hint}")
        self.path = Path(path)


def require_file(path: Path, hint: str = LAYOUT_HINT) -> Path:
    path = Path(path)
    if not path.is_file():
        raise MissingDataError(path, hint)
    return path


def read_tsv(
    path: Path, columns: Sequence[str], text_columns: Sequence[str] = ()
) -> list[tuple[int, dict[str, str]]]:
    """(line number, row) for each row of a headed TSV; a row holds ``columns`` only.

    Raises ``ValueError`` naming the file and line for a missing column, a row with the wrong
    number of fields, or an empty value in one of ``text_columns``.
    """
    path = require_file(path)
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle, delimiter="\t")
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{path} is empty; expected a header row with columns {list(columns)}")
        absent = [name for name in columns if name not in header]
        if absent:
            raise ValueError(f"{path}:1: header {header} lacks columns {absent}; expected {list(columns)}")
        where = [header.index(name) for name in columns]
        rows = []
        for record in reader:
            line = reader.line_num  # physical line where this record ends (1-based, header is 1)
            if not record:
                continue  # a blank line carries no row
            if len(record) != len(header):
                raise ValueError(
                    f"{path}:{line}: malformed row with {len(record)} fields, expected {len(header)} "
                    f"({', '.join(header)}); fix or remove this line"
                )
            row = {name: record[i] for name, i in zip(columns, where)}
            for name in text_columns:
                if not row[name].strip():
                    raise ValueError(f"{path}:{line}: empty text in column {name!r}; remove the row or fill it in")
            rows.append((line, row))
    return rows


def parse_float(value: str, path: Path, line: int, column: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{path}:{line}: {column} {value!r} is not a number") from None

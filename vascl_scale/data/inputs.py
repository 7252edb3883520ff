"""Readers for ``data prepare`` inputs: text, JSONL, CSV/TSV, Parquet, ``datasets`` directories, NLI.

Every reader streams (constant memory, except the NLI JSONL pairing: :func:`pair_nli`) and
yields one item per input record: a tuple of the record's values, one per field read, each a
``str``, None where its bytes are not valid UTF-8, ``MALFORMED`` where it is not a string or
``MISSING`` where the record lacks the field or holds none; with a label field (``--label-field``), last, the
label as :func:`label_value` reads it; or a :class:`Drop` naming why the record gives
no row (a line that is not a JSON object, an NLI line without a pair); or ``NEGATIVE`` for an
NLI line kept as another row's hard negative. Text is decoded with ``surrogateescape`` and
checked afterwards, so one bad line costs one record, not the file; a UTF-8 byte order mark at
the start of a text, JSONL or CSV file is skipped. Readers also report progress as a position
in their own unit (bytes read or rows).
"""

from __future__ import annotations

import codecs
import csv
import gzip
import io
import json
import sys
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from vascl_scale.data.columns import LABELS, checked_scores
from vascl_scale.log import shown, shown_name

FORMATS = ("auto", "txt", "jsonl", "csv", "parquet", "hf", "nli")
MALFORMED = object()  # a value that is not a string (or null)
MISSING = object()  # a field the record lacks (a JSONL key, the cells past a short CSV row's end)
NEGATIVE = object()  # an NLI line that is another row's hard negative, not a row of its own
_BLANK = object()  # a JSONL line of whitespace only: a row of empty texts
BAD_LABEL = object()  # a label field's value that is none of columns.LABELS


class ScoreError(ValueError):
    """A ``--score-field`` value that is not a list of numbers within +-``SCORE_LIMIT`` (finite),
    one per candidate: an error, not a drop (a teacher's scores with a NaN or a 1e300 are a
    broken file, not a noisy row)."""


# Fields --format nli reads: SimCSE's nli_for_simcse.csv is already (anchor, positive, hard negative).
NLI_CSV_FIELDS = ("sent0", "sent1", "hard_neg")
NLI_JSONL_FIELDS = ("sentence1", "sentence2", "gold_label")
NLI_DROP_REASONS = ("neutral", "no_gold_label", "no_contradiction", "no_entailment", "unused_contradiction")
_BATCH_ROWS = 8192


@dataclass(frozen=True)
class Drop:
    """An input record that gives no row, and why (a key of the manifest's ``dropped``)."""

    reason: str


def _format_of_name(path: Path) -> str | None:
    """The file format its name says (``.gz`` looked through), or None."""
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
    return None


def detect_format(path: Path) -> str:
    """The input format from the path: a directory is a ``datasets`` directory, else by suffix."""
    fmt = "hf" if path.is_dir() else _format_of_name(path)
    if fmt is None:
        raise ValueError(f"cannot tell the format of {path} from its name; pass --format txt|jsonl|csv|parquet|hf")
    return fmt


def _utf8_or_none(text: str) -> str | None:
    """``text`` when it was decoded from valid UTF-8, None when it holds escaped bad bytes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return text


def label_value(value: object) -> object:
    """A label field's value as a label of :data:`~vascl_scale.data.columns.LABELS`: an integer, a
    float or a numeric string equal to one of them (CSV cells are strings, pandas writes 1.0);
    ``MISSING`` where the record lacks the field or holds none; ``BAD_LABEL`` for anything else (a boolean,
    another number, text, null)."""
    if value is MISSING:
        return MISSING
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return BAD_LABEL
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value not in LABELS:
        return BAD_LABEL
    return int(value)


def scores_value(value: object, candidates: int) -> object:
    """A ``--score-field`` value as the JSON text of its list of ``candidates`` numbers, each
    within +-``SCORE_LIMIT`` (:func:`~vascl_scale.data.columns.checked_scores`; a JSON list, or in
    a CSV cell its JSON text); ``MISSING`` where the record lacks the field or holds none;
    :class:`ScoreError` naming what is wrong otherwise. A null or an empty cell is no value: ``MISSING``."""
    if value is MISSING or value is None or (isinstance(value, (str, bytes)) and not value.strip()):
        return MISSING
    if isinstance(value, (str, bytes)):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError) as err:  # ValueError: not JSON, or an integer of 4300+ digits
            raise ScoreError(f"holds {shown(value)}, not a JSON list of numbers ({err})") from err
    if hasattr(value, "tolist"):  # a Parquet / datasets list arrives as an array
        value = value.tolist()
    try:
        scores = checked_scores(value)
    except ValueError as err:
        raise ScoreError(str(err)) from None
    if len(scores) != candidates:
        raise ScoreError(
            f"holds {len(scores)} score(s) where the row has {candidates} candidate(s) (its positive, then each hard "
            "negative)"
        )
    return json.dumps(list(scores))


def column_problem(values: tuple[object, ...]) -> str | None:
    """Why a row of raw values cannot be kept (the first reason any value has), or None.

    Reasons in this order: ``malformed``, ``missing_column``, ``invalid_utf8``, ``empty`` (a
    value that is only whitespace).
    """
    for reason, bad in (
        ("malformed", lambda value: value is MALFORMED),
        ("missing_column", lambda value: value is MISSING),
        ("invalid_utf8", lambda value: value is None),
        ("empty", lambda value: not value.strip()),
    ):
        if any(bad(value) for value in values):
            return reason
    return None


def pair_nli(records: Iterable[object]) -> Iterator[object]:
    """SNLI / MultiNLI ``(sentence1, sentence2, gold_label)`` -> ``(premise, entailment, contradiction)``.

    The pairing, deterministic: the hypotheses of one input file are grouped by premise
    (``sentence1`` stripped of surrounding whitespace), premises in the order of their first
    line and hypotheses in file order. A premise with entailments e_0..e_(m-1) and contradictions c_0..c_(n-1), m, n >= 1,
    gives the m rows (premise, e_i, c_(i mod n)): every entailment is a positive once, and the
    contradictions are taken in turn as its hard negative (the triplets of SimCSE and
    PairSupCon: a premise, an entailment and a contradiction of that premise).

    Every line is accounted for: ``NEGATIVE`` for c_0..c_(min(m, n)-1), and a :class:`Drop`
    for the rest: ``neutral``; ``no_gold_label`` (``-``, annotators without a majority, or
    another value); ``no_contradiction`` / ``no_entailment`` (the entailments of a premise
    without a contradiction, the contradictions of one without an entailment);
    ``unused_contradiction`` (c_m..c_(n-1) when n > m); a line with a bad value as
    :func:`column_problem` says.

    Memory: every premise and its entailment and contradiction hypotheses, for the whole file
    (about 200 MB for SNLI + MultiNLI train), since MultiNLI lists a premise's hypotheses far
    apart.
    """
    groups: dict[str, tuple[list[str], list[str]]] = {}
    for record in records:
        if isinstance(record, Drop):
            yield record
            continue
        problem = column_problem(record)  # type: ignore[arg-type]
        if problem is not None:
            yield Drop(problem)
            continue
        premise, hypothesis, label = (value.strip() for value in record)  # type: ignore[union-attr]
        if label == "neutral":
            yield Drop("neutral")
        elif label not in ("entailment", "contradiction"):
            yield Drop("no_gold_label")
        else:
            entailments, contradictions = groups.setdefault(premise, ([], []))
            (entailments if label == "entailment" else contradictions).append(hypothesis)
    for premise, (entailments, contradictions) in groups.items():
        if not contradictions:
            yield from [Drop("no_contradiction")] * len(entailments)
        elif not entailments:
            yield from [Drop("no_entailment")] * len(contradictions)
        else:
            for index, entailment in enumerate(entailments):
                yield premise, entailment, contradictions[index % len(contradictions)]
            yield from [NEGATIVE] * min(len(entailments), len(contradictions))
            yield from [Drop("unused_contradiction")] * max(len(contradictions) - len(entailments), 0)


@dataclass
class InputReader:
    """One input file: ``records()`` yields rows; ``position()``/``total`` drive the progress bar.

    ``fields`` are the names of the texts read from each record; ``option`` is the command-line
    option that chose them, named in errors. ``label_field`` (``--label-field``): a field read
    after them, as a label (:func:`label_value`); ``score_field`` (``--score-field``): one read
    last, a teacher's scores of the row's candidates (:func:`scores_value`).
    """

    path: Path
    fmt: str
    fields: tuple[str, ...]
    option: str
    label_field: str | None = None
    score_field: str | None = None
    total: int = field(default=0, init=False)  # bytes of the file, or rows; 0 until reading starts
    _position: Callable[[], int] = field(default=lambda: 0, init=False, repr=False)

    @property
    def columns(self) -> int:
        """Texts per row: one per text field (NLI JSONL: premise, hypothesis, label -> three texts)."""
        return len(self.fields)

    @property
    def _read(self) -> tuple[str, ...]:
        """Every field read from a record: the texts, then the label field, then the score field."""
        return self.fields + tuple(name for name in (self.label_field, self.score_field) if name is not None)

    def _record(self, raw: Iterable[object]) -> tuple[object, ...]:
        """One record's values of :attr:`_read`, raw (``MISSING`` for an absent field): the texts
        as :meth:`_field_value` reads them, the label as :func:`label_value` does, the scores as
        :func:`scores_value` does (one per text after the anchor)."""
        values = list(raw)
        scores = () if self.score_field is None else (scores_value(values.pop(), len(self.fields) - 1),)
        label = () if self.label_field is None else (label_value(values.pop()),)
        return (*map(self._field_value, values), *label, *scores)

    @property
    def pairs_nli(self) -> bool:
        """Whether rows come from :func:`pair_nli` (NLI JSONL), with its drop reasons and ``NEGATIVE`` lines."""
        return self.fmt == "nli" and self.fields == NLI_JSONL_FIELDS

    @property
    def _layout(self) -> str:
        """How the file is parsed: ``--format nli`` reads a CSV or a JSONL file."""
        if self.fmt == "nli":
            return "jsonl" if self.pairs_nli else "csv"
        return self.fmt

    def position(self) -> int:
        return self._position()

    def records(self) -> Iterator[object]:
        """Yield one item per input record (see the module docstring)."""
        records = getattr(self, f"_read_{self._layout}")()
        return pair_nli(records) if self.pairs_nli else records

    def check_fields(self) -> None:
        """Raise ``ValueError`` before any work when the input lacks a field read (JSONL: its first object)."""
        if self._layout == "txt":
            return
        if self._layout == "parquet":
            self._require(self._parquet().schema_arrow.names, "column")
        elif self._layout == "hf":
            self._require(self._dataset().column_names, "column")
        elif self._layout == "csv":
            with self._open_bytes() as raw:
                self._require(list(self._csv_rows(raw).fieldnames or []), "column")
        else:
            for number, record in self._json_lines():
                if isinstance(record, dict):
                    self._require(sorted(record), "field", f"{self.path}:{number}")
                    return

    def _require(self, have: list[str], kind: str, where: str | None = None) -> None:
        named = [(self.fields, self.option)]
        if self.label_field is not None:
            named.append(((self.label_field,), f"--label-field {self.label_field}"))
        if self.score_field is not None:
            named.append(((self.score_field,), f"--score-field {self.score_field}"))
        for names, option in named:
            missing = [name for name in names if name not in have]
            if missing:
                raise ValueError(
                    f"{option}: {where or self.path} has no {kind} {missing[0]!r} "
                    f"({kind}s: {', '.join(map(shown_name, have))}); pass names it has"
                )

    def _open_bytes(self) -> io.BufferedIOBase:
        try:
            raw = open(self.path, "rb")
        except OSError as err:
            raise ValueError(f"cannot read input {self.path}: {err}") from err
        self.total = self.path.stat().st_size
        # Progress in compressed bytes for .gz: the raw file's offset is cheap to read.
        self._position = raw.tell
        handle = gzip.GzipFile(fileobj=raw, mode="rb") if self.path.name.lower().endswith(".gz") else raw
        # A UTF-8 byte order mark (spreadsheet programs and Windows editors write one) is no text:
        # kept, it would start the first line's text or the first CSV column's name.
        if handle.read(len(codecs.BOM_UTF8)) != codecs.BOM_UTF8:
            handle.seek(0)
        return handle  # type: ignore[return-value]

    def _read_txt(self) -> Iterator[object]:
        with self._open_bytes() as handle:
            for line in handle:
                yield (_utf8_or_none(line.decode("utf-8", "surrogateescape").rstrip("\r\n")),)

    def _json_lines(self) -> Iterator[tuple[int, object]]:
        """(line number, the parsed JSON value, or ``_BLANK`` / ``MALFORMED``) per line."""
        with self._open_bytes() as handle:
            for number, line in enumerate(handle, start=1):
                text = line.decode("utf-8", "surrogateescape")
                if not text.strip():
                    yield number, _BLANK
                    continue
                try:
                    yield number, json.loads(text)
                # Not JSON (a JSONDecodeError is a ValueError), or JSON the parser gives up on: an
                # integer past Python's 4300 digits (ValueError), arrays nested too deep
                # (RecursionError). One bad line, not the end of the file.
                except (ValueError, RecursionError):
                    yield number, MALFORMED

    def _read_jsonl(self) -> Iterator[object]:
        """Records of the fields; an object must have at least one of them (the first has all: check_fields).

        An object without any of the fields is not a row of this data (another file's, a wrong
        name): an error naming its line. One lacking some has a missing column: dropped, counted.
        """
        for number, record in self._json_lines():
            if record is _BLANK:
                yield self._record(("",) * len(self._read))
            elif not isinstance(record, dict):  # not JSON, or JSON but not an object
                yield Drop("malformed")
            else:
                if not any(name in record for name in self._read):
                    self._require(sorted(record), "field", f"{self.path}:{number}")
                yield self._record(record.get(name, MISSING) for name in self._read)

    def _csv_rows(self, raw: io.BufferedIOBase) -> csv.DictReader:
        delimiter = "\t" if ".tsv" in self.path.name.lower() else ","
        csv.field_size_limit(sys.maxsize)
        handle = io.TextIOWrapper(raw, encoding="utf-8", errors="surrogateescape", newline="")
        return csv.DictReader(handle, delimiter=delimiter)

    def _read_csv(self) -> Iterator[object]:
        with self._open_bytes() as raw:
            for row in self._csv_rows(raw):
                # DictReader fills the cells past a short row's end with None.
                yield self._record(MISSING if row[name] is None else row[name] for name in self._read)

    def _parquet(self):
        import pyarrow.parquet as pq

        try:
            return pq.ParquetFile(self.path)
        except (OSError, ValueError) as err:
            raise ValueError(f"cannot read Parquet input {self.path}: {err}") from err

    def _read_parquet(self) -> Iterator[object]:
        parquet = self._parquet()
        self.total = parquet.metadata.num_rows
        done = 0
        self._position = lambda: done
        for batch in parquet.iter_batches(batch_size=_BATCH_ROWS, columns=list(self._read)):
            values = [batch.column(name).to_pylist() for name in self._read]
            for row in zip(*values):
                yield self._record(row)
            done += batch.num_rows

    def _dataset(self):
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
        return dataset

    def _read_hf(self) -> Iterator[object]:
        dataset = self._dataset()
        self.total = dataset.num_rows
        done = 0
        self._position = lambda: done
        # Arrow-backed and memory-mapped: batches stream from disk without loading the table.
        for batch in dataset.select_columns(list(self._read)).iter(batch_size=_BATCH_ROWS):
            for row in zip(*(batch[name] for name in self._read)):
                yield self._record(row)
            done += len(batch[self.fields[0]])

    @staticmethod
    def _field_value(value: object) -> object:
        if value is None:
            return ""
        if value is MISSING:
            return MISSING
        if isinstance(value, bytes):
            return _utf8_or_none(value.decode("utf-8", "surrogateescape"))
        if not isinstance(value, str):
            return MALFORMED
        return _utf8_or_none(value)


def open_input(
    path: Path, fmt: str, fields: tuple[str, ...], label_field: str | None = None, score_field: str | None = None
) -> InputReader:
    """A reader of ``path`` for the ``--text-field`` names ``fields`` (``nli`` has fixed fields
    instead), the ``--label-field`` name ``label_field`` and the ``--score-field`` name ``score_field``."""
    if fmt not in FORMATS:
        raise ValueError(f"--format must be one of {', '.join(FORMATS)}; got {fmt!r}")
    if not path.exists():
        raise ValueError(f"input {path} does not exist")
    option = f"--text-field {','.join(fields)}"
    if fmt == "auto":
        fmt = detect_format(path)
    elif fmt == "nli":
        flavour = None if path.is_dir() else _format_of_name(path)
        if flavour not in ("csv", "jsonl"):
            raise ValueError(
                f"--format nli reads SimCSE's nli_for_simcse.csv ({','.join(NLI_CSV_FIELDS)}) or SNLI / MultiNLI "
                f"JSONL ({','.join(NLI_JSONL_FIELDS)}); {path} is neither a .csv nor a .jsonl file"
            )
        fields, option = (NLI_CSV_FIELDS if flavour == "csv" else NLI_JSONL_FIELDS), "--format nli"
    if score_field is not None and (fmt in ("txt", "nli") or len(fields) < 2):
        raise ValueError(
            f"--score-field {score_field} holds a teacher's scores of each row's candidates: pass the anchor, its "
            "positive and any hard negatives with --text-field (e.g. --text-field query,pos,neg --score-field "
            f"scores) from JSONL, CSV, Parquet or datasets input; got {option} for {path}"
        )
    if fmt == "txt" and (len(fields) > 1 or label_field is not None):
        given = option if label_field is None else f"{option} --label-field {label_field}"
        raise ValueError(
            f"{given}: {path} is plain text, one sentence a line, so it has one column; pass one name, or "
            "JSONL / CSV / Parquet / datasets input for pairs"
        )
    reader = InputReader(
        path=path, fmt=fmt, fields=fields, option=option, label_field=label_field, score_field=score_field
    )
    try:
        reader.check_fields()
    except (OSError, EOFError, zlib.error) as err:  # a damaged file: truncated or corrupt gzip, I/O error
        raise ValueError(f"cannot read input {path}: {err}") from err
    return reader

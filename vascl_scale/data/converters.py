"""Converters from each dataset's original format to the data directory's layout.

A converter is ``convert(originals, options, stage)``: ``originals`` are the local copies of a
registry entry's sources, in registry order; ``options`` its ``options`` table plus ``outputs``,
the entry's converted files in registry order; it writes them under ``stage`` (paths relative to
the data directory). Every ``.tsv`` is
written by :func:`write_tsv` (UTF-8, header row, tab-separated, minimal quoting, ``\\n`` line
ends): the layout :func:`vascl_scale.eval.tables.read_tsv` reads. Rows keep the original order;
nothing is deduplicated (these are fixed benchmarks). The training sets are the exceptions: the
corpus is gzipped as it is, and the NLI triplets become shuffled shards (:func:`nli_shards`); the
retrieval sets are written in BEIR's layout (:func:`beir_parquet`). A converter may return
remarks for the download's summary (the rows it dropped). Which originals each one was checked
on is in the registry's ``checked`` field.
"""

from __future__ import annotations

import csv
import gzip
import json
import logging
import math
import shutil
import tarfile
import zipfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import IO

from vascl_scale.log import shown

Converter = Callable[[list[Path], dict, Path], list[str] | None]

logger = logging.getLogger(__name__)


def write_tsv(path: Path, header: Sequence[str], rows: Iterable[Sequence[str]]) -> int:
    """Write one layout ``.tsv``; returns the number of rows."""
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, delimiter="\t", lineterminator="\n")
        writer.writerow(header)
        for row in rows:
            writer.writerow(row)
            count += 1
    return count


def _split_lines(data: bytes) -> list[str]:
    """Lines of UTF-8 bytes split at ``\\n`` only (one ``\\r`` before it dropped), without the
    empty piece after a final line end: texts can hold U+2028 or form feeds, which
    ``str.splitlines`` would split at."""
    lines = data.decode("utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def _text_lines(path: Path) -> list[str]:
    return _split_lines(path.read_bytes())


MEMBER_LIMIT_BYTES = 1 << 26  # 64 MiB: the largest file a converter reads (SICK, an STS year) is a few MB
ARCHIVE_LIMIT_BYTES = 1 << 28  # 256 MiB of one archive's uncompressed stream, read or passed over


class OriginalError(ValueError):
    """An original a converter cannot read: a damaged, cut or unsupported archive, or one over a
    size limit (an archive bomb)."""


def _too_large(what: str, limit: int) -> OriginalError:
    return OriginalError(
        f"{what} holds more than {limit} bytes uncompressed; refused as an archive bomb or a wrong file"
    )


def _read_capped(stream: IO[bytes], limit: int, what: str) -> bytes:
    data = stream.read(limit + 1)  # never more than the limit in memory, whatever the header says
    if len(data) > limit:
        raise _too_large(what, limit)
    return data


def _original_files(originals: list[Path], names: Iterable[str], folder: str = "") -> dict[str, bytes]:
    """The bytes of the files ``names`` among the originals: members directly inside ``folder``
    (e.g. ``test-gold/``) of a ``.zip`` or ``.tar[.gz]``, or a loose original of that name.

    Only those members are decompressed, each to at most ``MEMBER_LIMIT_BYTES``, and no more
    than ``ARCHIVE_LIMIT_BYTES`` of an archive are decompressed in all, so a bomb or a damaged
    archive is an :class:`OriginalError` naming it, never gigabytes of memory or a traceback."""
    names = set(names)
    files: dict[str, bytes] = {}
    for path in originals:
        try:
            if path.name.endswith(".zip"):
                files.update(_zip_members(path, {folder + name for name in names}))
            elif path.name.endswith((".tar", ".tar.gz", ".tgz")):
                files.update(_tar_members(path, {folder + name for name in names}))
            elif path.name in names:
                with path.open("rb") as handle:
                    files[path.name] = _read_capped(handle, MEMBER_LIMIT_BYTES, path.name)
        except OriginalError:
            raise
        except Exception as err:  # zlib.error, EOFError, NotImplementedError (deflate64), RuntimeError (encrypted), ...
            raise OriginalError(
                f"{path.name} cannot be read: a damaged, cut or unsupported archive ({type(err).__name__}: {err})"
            ) from None
    return files


def _zip_members(path: Path, wanted: set[str]) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    left = ARCHIVE_LIMIT_BYTES
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            if info.filename in wanted and not info.is_dir():
                limit = min(MEMBER_LIMIT_BYTES, left)
                what = f"{info.filename} in {path.name}"
                if info.file_size > limit:  # refused before decompressing anything
                    raise _too_large(what, limit)
                with archive.open(info) as member:
                    files[Path(info.filename).name] = data = _read_capped(member, limit, what)
                left -= len(data)
    return files


def _tar_members(path: Path, wanted: set[str]) -> dict[str, bytes]:
    """Read as a stream (``r|*``): members are passed over in order, and reading stops once every
    wanted one is found."""
    files: dict[str, bytes] = {}
    with tarfile.open(path, mode="r|*") as archive:
        for member in archive:
            if wanted <= files.keys():
                break
            if member.offset_data + member.size > ARCHIVE_LIMIT_BYTES:  # reading or passing it goes past the limit
                raise _too_large(path.name, ARCHIVE_LIMIT_BYTES)
            if member.isfile() and member.name in wanted:
                stream = archive.extractfile(member)
                assert stream is not None  # a regular file
                files[member.name] = _read_capped(stream, MEMBER_LIMIT_BYTES, f"{member.name} in {path.name}")
    return {Path(name).name: data for name, data in files.items()}


def _member(files: dict[str, bytes], name: str, where: str) -> bytes:
    if name not in files:
        raise ValueError(f"{name} not found in {where}; the registry entry names a file this original does not hold")
    return files[name]


def parse_score(value: str, where: str, column: str = "score") -> float:
    """A gold score, ``where`` (``file:line``) and ``column`` named in the error. Non-finite values
    (``nan``, ``inf``, ``1e999``) are refused, since one of them turns a Spearman correlation into
    NaN or silently ranks as the largest score."""
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"{where}: {column} {value!r} is not a number") from None
    if not math.isfinite(number):
        raise ValueError(f"{where}: {column} {value!r} is not a finite number; give a real score or remove the row")
    return number


def _score(text: str, where: str, column: str = "score") -> str:
    """A gold score as the layout writes it: the float's shortest text ("4.400" -> "4.4")."""
    return str(parse_score(text.strip(), where, column))


def _without_line_breaks(text: str) -> str:
    """Each line break in the text one space: a layout row is one line, and the layout's reader
    (:func:`vascl_scale.eval.tables.read_tsv`) refuses a field that spans lines as a stray quote."""
    return text.replace("\r\n", " ").replace("\r", " ").replace("\n", " ")


def _one_line(text: str) -> str:
    """The text stripped, a line break left inside it one space."""
    return _without_line_breaks(text.strip())


def _outputs(options: dict, count: int) -> list[str]:
    outputs = list(options["outputs"])
    if len(outputs) * options.get("files_per_output", 1) != count:
        raise ValueError(f"{count} original files for {len(outputs)} outputs: the registry entry is inconsistent")
    return outputs


def gzip_text(originals: list[Path], options: dict, stage: Path) -> None:
    """A one-sentence-per-line text file, gzip-compressed as it is (no timestamp in the header,
    so the same text always gives the same bytes)."""
    (output,) = _outputs(options, len(originals))
    target = stage / output
    target.parent.mkdir(parents=True, exist_ok=True)
    with originals[0].open("rb") as source, target.open("wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as compressed:
            shutil.copyfileobj(source, compressed)


def label_tab_text(originals: list[Path], options: dict, stage: Path) -> None:
    """Short-text clustering release: one ``label<TAB>text`` line per text. A tab inside the text
    becomes a space and the text is stripped (stackoverflow's lines end with a stray tab)."""
    for original, output in zip(originals, _outputs(options, len(originals))):
        rows = []
        for number, line in enumerate(_text_lines(original), start=1):
            label, tab, text = line.partition("\t")
            if not tab:
                raise ValueError(f"{original.name}:{number}: expected label<TAB>text")
            rows.append((text.replace("\t", " ").strip(), label.strip()))
        write_tsv(stage / output, ("text", "label"), rows)


def csv_text_category(originals: list[Path], options: dict, stage: Path) -> None:
    """BANKING77: a CSV file per split with the header ``text,category``."""
    for original, output in zip(originals, _outputs(options, len(originals))):
        with original.open(encoding="utf-8", newline="") as handle:
            rows = list(csv.reader(handle))
        if not rows or rows[0] != ["text", "category"]:
            raise ValueError(f"{original.name}: expected the header text,category")
        write_tsv(stage / output, ("text", "label"), ((_one_line(text), label.strip()) for text, label in rows[1:]))


def json_splits(originals: list[Path], options: dict, stage: Path) -> None:
    """CLINC150's ``data_full.json``: an object of lists of ``[text, intent]``; ``options.splits``
    maps each output to its key (the ``oos_*`` lists, out of scope, are not taken)."""
    (original,) = originals
    table = json.loads(original.read_text(encoding="utf-8"))
    for output, key in options["splits"].items():
        if key not in table:
            raise ValueError(f"{original.name} has no list {key!r} (keys: {', '.join(table)})")
        write_tsv(stage / output, ("text", "label"), ((_one_line(text), label.strip()) for text, label in table[key]))


def parallel_lines(originals: list[Path], options: dict, stage: Path) -> None:
    """HWU64 and SNIPS as the intent-detection repositories hold them: per split a ``seq.in``
    (one text a line) and a ``label`` file, aligned line by line."""
    options = {**options, "files_per_output": 2}
    outputs = _outputs(options, len(originals))
    for index, output in enumerate(outputs):
        text_file, label_file = originals[2 * index], originals[2 * index + 1]
        texts, labels = _text_lines(text_file), _text_lines(label_file)
        if len(texts) != len(labels):
            raise ValueError(f"{text_file} has {len(texts)} lines but {label_file} has {len(labels)}")
        write_tsv(stage / output, ("text", "label"), ((_one_line(t), label.strip()) for t, label in zip(texts, labels)))


def senteval_sts(originals: list[Path], options: dict, stage: Path) -> None:
    """STS 2012-2016 in SentEval's layout: per subset ``<prefix>.input.<subset>.txt`` (two
    tab-separated sentences a line; STS16 adds source columns) and ``<prefix>.gs.<subset>.txt`` (one
    gold score a line). Subsets in ``options.subsets`` order (SentEval's); a leading ``surprise.``
    is dropped from the subset name; a pair with an empty gold line has no gold and is dropped,
    as SentEval does. Read from the year's release zip (``options.folder``) or loose files."""
    prefix, where = options.get("prefix", "STS"), ", ".join(p.name for p in originals)
    names = [f"{prefix}.{kind}.{subset}.txt" for subset in options["subsets"] for kind in ("input", "gs")]
    files = _original_files(originals, names, options.get("folder", ""))
    rows = []
    for subset in options["subsets"]:
        input_name, gold_name = f"{prefix}.input.{subset}.txt", f"{prefix}.gs.{subset}.txt"
        sentences = _split_lines(_member(files, input_name, where))
        gold = _split_lines(_member(files, gold_name, where))
        if len(sentences) != len(gold):
            raise ValueError(f"{input_name} has {len(sentences)} lines but {gold_name} has {len(gold)}")
        name = subset.removeprefix("surprise.")
        for number, (line, score) in enumerate(zip(sentences, gold), start=1):
            if not score.strip():
                continue
            fields = line.split("\t")
            if len(fields) < 2:  # STS16 adds source columns after the two sentences
                raise ValueError(
                    f"{input_name}:{number}: expected 2 tab-separated sentences, found {len(fields)} field"
                )
            rows.append((fields[0], fields[1], _score(score, f"{gold_name}:{number}"), name))
    (output,) = options["outputs"]
    write_tsv(stage / output, ("sentence1", "sentence2", "score", "subset"), rows)


def stsb_csv(originals: list[Path], options: dict, stage: Path) -> None:
    """The STS Benchmark's ``sts-<split>.csv``: tab-separated, unquoted (quotes are literal text),
    no header; fields genre, file, year, id, score, sentence1, sentence2 (and sometimes two source
    columns)."""
    files = _original_files(originals, options["files"], options.get("folder", ""))
    for name, output in options["files"].items():
        rows = []
        for number, line in enumerate(_split_lines(_member(files, name, originals[0].name)), start=1):
            fields = line.split("\t")
            if len(fields) not in (7, 9):
                raise ValueError(f"{name}:{number}: expected 7 or 9 tab-separated fields, found {len(fields)}")
            rows.append((fields[5], fields[6], _score(fields[4], f"{name}:{number}")))
        write_tsv(stage / output, ("sentence1", "sentence2", "score"), rows)


def sick_semeval(originals: list[Path], options: dict, stage: Path) -> None:
    """SICK as SemEval-2014 Task 1 released it, one file per split (``SICK_train.txt``,
    ``SICK_trial.txt``, ``SICK_test_annotated.txt``, each in its zip): a header row, columns
    pair_ID, sentence_A, sentence_B, relatedness_score, entailment_judgment."""
    files = _original_files(originals, options["files"])
    for name, output in options["files"].items():
        lines = _split_lines(_member(files, name, ", ".join(p.name for p in originals)))
        header = lines[0].split("\t") if lines else []
        try:
            a, b, score = (header.index(column) for column in ("sentence_A", "sentence_B", "relatedness_score"))
        except ValueError:
            raise ValueError(f"{name}: expected a header with sentence_A, sentence_B, relatedness_score") from None
        rows = []
        for number, line in enumerate(lines[1:], start=2):
            fields = line.split("\t")
            rows.append((fields[a], fields[b], _score(fields[score], f"{name}:{number}", "relatedness_score")))
        write_tsv(stage / output, ("sentence1", "sentence2", "score"), rows)


def nli_shards(originals: list[Path], options: dict, stage: Path) -> None:
    """SimCSE's ``nli_for_simcse.csv`` (sent0, sent1, hard_neg) as triplet shards (anchor,
    positive, negative_0), and PairSupCon's labelled pairs made of it (each triplet as (anchor,
    positive, 1) and (anchor, negative, 0)) into ``options.labelled_pairs``, each set with its
    manifest, written by ``data prepare --format nli`` itself
    (:func:`vascl_scale.data.prepare.prepare_shards`; the pairs with ``--labelled-pairs``) into
    the folders of the entry's outputs: ``options.shard_size`` samples a shard, rows shuffled once
    with ``options.shuffle_seed`` (the loader shuffles shard order and within a buffer only, so a
    shard should draw on the whole file). A row with an empty text is dropped and counted in the
    manifests' ``dropped``."""
    # webdataset: kept out of the registry
    from vascl_scale.data.prepare import PrepareOptions, prepare_shards
    from vascl_scale.data.shard_writer import dropped_summary

    (original,) = originals
    pairs_folder = Path(options["labelled_pairs"])
    folders = {Path(output).parent for output in options["outputs"]} - {pairs_folder}
    if len(folders) != 1:
        raise ValueError(
            f"the triplet shards' outputs lie in one folder besides {pairs_folder}; the registry entry names {len(folders)}"
        )
    triplets_folder = folders.pop()
    common = {"fmt": "nli", "shard_size": options["shard_size"], "shuffle_seed": options["shuffle_seed"]}
    for folder, settings, what in (
        (triplets_folder, PrepareOptions(**common), "triplets"),
        (pairs_folder, PrepareOptions(**common, labelled_pairs=True), "labelled pairs"),
    ):
        try:
            result = prepare_shards(
                [original], stage / folder, settings, show_progress=False
            )  # the download's bars are live
        except ValueError as err:
            if isinstance(err.__cause__, OSError):
                raise err.__cause__ from None  # the disk under --to (full, read-only): a filesystem failure, the original is kept
            raise
        logger.info(
            "%s: %s %s of %s rows in %d shards; rows dropped: %s (counted in %s/manifest.json)",
            original.name, f"{result.samples:,}", what, f"{result.rows_read or result.lines_read:,}", len(result.shards),
            dropped_summary(result.dropped) or "none", folder,
        )  # fmt: skip


BEIR_FILES = ("corpus.jsonl", "queries.jsonl", "test.tsv")  # the outputs' names, in registry order
QRELS_IDS = ("query-id", "corpus-id")  # the qrels parquet file's id columns


def _label(path: Path) -> str:
    """An original named with its folder: a Hugging Face dataset's files are all ``train-*.parquet``."""
    return f"{path.parent.name}/{path.name}"


def _parquet_columns(path: Path, columns: Sequence[str]) -> list[list]:
    """The values of ``columns`` of a parquet file, read within the archive limit: an error page,
    a cut file or a file without these columns is an :class:`OriginalError` naming it."""
    import pyarrow.parquet as pq  # kept out of the registry's import

    try:
        parquet = pq.ParquetFile(path)
        metadata = parquet.metadata
        size = sum(metadata.row_group(index).total_byte_size for index in range(metadata.num_row_groups))
        if size > ARCHIVE_LIMIT_BYTES:
            raise _too_large(_label(path), ARCHIVE_LIMIT_BYTES)
        found = parquet.schema_arrow.names
        if not set(columns) <= set(found):
            raise OriginalError(f"{_label(path)} has the columns {', '.join(found)}; expected {', '.join(columns)}")
        table = parquet.read(columns=list(columns))
    except OriginalError:
        raise
    except Exception as err:  # pyarrow.ArrowInvalid (no parquet magic bytes), OSError (cut), ...
        raise OriginalError(f"{_label(path)} cannot be read as parquet ({type(err).__name__}: {err})") from None
    return [table.column(name).to_pylist() for name in columns]


def _beir_id(value: object, path: Path, number: int, column: str) -> str:
    """An id of row ``number`` of a BEIR parquet file as the layout writes it: a string, or an
    integer's digits (parquet may type ids as integers, as SciFact's are), each line break one
    space (:func:`_without_line_breaks`: a qrels row is one line). A missing or blank id, or one
    of another type (whose Python repr would become the id), is an error naming the file, the
    row and the column."""
    if value is None or (isinstance(value, str) and not value.strip()):
        raise ValueError(f"{_label(path)}: row {number} has no {column}")
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError(
            f"{_label(path)}: row {number}: {column} {shown(value)} is a {type(value).__name__}; ids are strings "
            "or integers"
        )
    return _without_line_breaks(str(value))


def _beir_texts(path: Path, what: str) -> tuple[dict[str, str], set[str], set[str]]:
    """(id -> text of the rows kept, ids of the rows dropped for an empty text, ids whose line
    breaks became spaces) of a corpus or queries parquet file (columns ``_id``, ``text``), in the
    file's order. A text that is not a string (a list, bytes) is an error naming the row: its
    Python repr is no text to embed."""
    kept: dict[str, str] = {}
    dropped: set[str] = set()
    rewritten: set[str] = set()
    first: dict[str, tuple[int, str]] = {}  # id -> (its row, the id as the file holds it)
    for number, (raw_id, text) in enumerate(zip(*_parquet_columns(path, ("_id", "text"))), start=1):
        key = _beir_id(raw_id, path, number, "_id")
        if key in first:
            row, earlier = first[key]
            ids = (
                f"the _id {earlier!r}"
                if earlier == str(raw_id)
                else f"the _ids {earlier!r} and {str(raw_id)!r}, both {key!r} once line breaks are spaces"
            )
            raise ValueError(f"{_label(path)}: rows {row} and {number} have {ids}; {what} ids must be unique")
        first[key] = (number, str(raw_id))
        if key != str(raw_id):
            rewritten.add(key)
        if text is not None and not isinstance(text, str):
            raise ValueError(
                f"{_label(path)}: row {number}: text {shown(text)} is a {type(text).__name__}, not a string; the "
                f"{what} texts must be strings"
            )
        if text is None or not text.strip():
            dropped.add(key)
        else:
            kept[key] = text
    return kept, dropped, rewritten


def _write_jsonl(path: Path, records: Iterable[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="\n") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")


def _count(count: int, noun: str, nouns: str) -> str:
    return f"{count:,} {noun if count == 1 else nouns}"


def beir_parquet(originals: list[Path], options: dict, stage: Path) -> list[str]:
    """A retrieval set as Hugging Face parquet files (NanoBEIR): ``corpus`` and ``queries``
    (columns ``_id``, ``text``) and ``qrels`` (``query-id``, ``corpus-id``, every pair relevant),
    in that order, into BEIR's layout: ``corpus.jsonl`` (``{"_id", "title": "", "text"}`` a line),
    ``queries.jsonl`` (``{"_id", "text"}``) and ``qrels/test.tsv`` (``query-id``, ``corpus-id``,
    ``score`` = 1), rows in the files' order: what
    :func:`vascl_scale.eval.retrieval.load_retrieval_data` reads.

    A document or query with an empty text is dropped, and so is each qrels pair naming one; an
    id holding a line break is written with a space for it, in all three files (:func:`_beir_id`);
    all are counted in the returned remark (and logged). A qrels query-id the queries file lacks,
    or a corpus-id the corpus lacks, is an error naming the qrels file, the row, the id and the
    file it is missing from; so is a set left without a document, a query or a qrels pair."""
    corpus_out, queries_out, qrels_out = _outputs(options, len(originals))
    if (Path(corpus_out).name, Path(queries_out).name, Path(qrels_out).name) != BEIR_FILES:
        raise ValueError(f"the outputs must be {', '.join(BEIR_FILES)}: the registry entry is inconsistent")
    corpus_file, queries_file, qrels_file = originals
    corpus, dropped_documents, rewritten_documents = _beir_texts(corpus_file, "document")
    queries, dropped_queries, rewritten_queries = _beir_texts(queries_file, "query")
    pairs = []
    dropped_pairs = 0
    for number, raw in enumerate(zip(*_parquet_columns(qrels_file, ("query-id", "corpus-id"))), start=1):
        query, document = (_beir_id(value, qrels_file, number, column) for value, column in zip(raw, QRELS_IDS))
        for key, kept, dropped, source, column in (
            (query, queries, dropped_queries, queries_file, QRELS_IDS[0]),
            (document, corpus, dropped_documents, corpus_file, QRELS_IDS[1]),
        ):
            if key not in kept and key not in dropped:
                raise ValueError(f"{_label(qrels_file)}: row {number}: {column} {key!r} is not in {_label(source)}")
        if query in dropped_queries or document in dropped_documents:
            dropped_pairs += 1
        else:
            pairs.append((query, document, "1"))
    written = ", ".join(
        (
            _count(len(corpus), "document", "documents"),
            _count(len(queries), "query", "queries"),
            _count(len(pairs), "qrels pair", "qrels pairs"),
        )
    )
    if dropped_documents or dropped_queries:
        summary = (
            f"{written}; dropped for an empty text: {_count(len(dropped_documents), 'document', 'documents')}, "
            f"{_count(len(dropped_queries), 'query', 'queries')}, "
            f"and the {_count(dropped_pairs, 'qrels pair', 'qrels pairs')} naming them"
        )
    else:
        summary = f"{written}; no row dropped"
    rewritten = len(rewritten_documents) + len(rewritten_queries)
    if rewritten:
        shown_ids = ", ".join(repr(key) for key in [*rewritten_documents, *rewritten_queries][:3])
        summary += (
            f"; {_count(rewritten, 'id', 'ids')} held a line break, written with a space ({shown_ids}"
            f"{', ...' if rewritten > 3 else ''}): a qrels row is one line"
        )
    folder = Path(corpus_out).parent
    if not (corpus and queries and pairs):
        raise ValueError(
            f"{folder}: nothing to evaluate: {summary}; a retrieval set needs at least one document, query and "
            "qrels pair"
        )
    _write_jsonl(stage / corpus_out, ({"_id": key, "title": "", "text": text} for key, text in corpus.items()))
    _write_jsonl(stage / queries_out, ({"_id": key, "text": text} for key, text in queries.items()))
    write_tsv(stage / qrels_out, ("query-id", "corpus-id", "score"), pairs)
    logger.info("%s: %s", folder, summary)
    return [summary]


CONVERTERS: dict[str, Converter] = {
    "gzip_text": gzip_text,
    "label_tab_text": label_tab_text,
    "csv_text_category": csv_text_category,
    "json_splits": json_splits,
    "parallel_lines": parallel_lines,
    "senteval_sts": senteval_sts,
    "stsb_csv": stsb_csv,
    "sick_semeval": sick_semeval,
    "nli_shards": nli_shards,
    "beir_parquet": beir_parquet,
}

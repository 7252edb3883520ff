"""Retrieval on BEIR-format datasets: exact cosine search, nDCG@10, MRR@10 and Recall@100 x 100.

Data (Thakur et al., 2021, BEIR; the layout MTEB's retrieval tasks load): a directory with
``corpus.jsonl`` (one ``{"_id", "title"?, "text"}`` a line), ``queries.jsonl`` (``{"_id",
"text"}``) and ``qrels/<split>.tsv`` (header ``query-id  corpus-id  score``, integer grades; a
grade <= 0 is not relevant). A document's text is ``title + " " + text`` when its title is not
empty, else its text, stripped, as BEIR's sentence-transformers model joins them.

Queries scored: those of ``queries.jsonl`` that the split's qrels give at least one relevant
document. The others are skipped and counted in the result: ``no_relevant_in_qrels`` (listed in
the qrels, every grade <= 0) and ``not_in_qrels`` (BEIR ships one queries file for all splits,
so these are usually another split's queries).

Prompts: queries are embedded after the model's ``query`` prompt and documents after its
``document`` prompt (config_sentence_transformers.json; a training export writes model.prompts'
``anchor`` prompt as ``query`` and its ``positive`` prompt as ``document``), each only where the
model has it, as ``eval mteb`` does. ``--prompt`` (a prompt for every text) does not apply here.

Search: exact, by cosine: both sides L2-normalised (after ``truncate_dim``, if set: the first m
dimensions of each embedding, Matryoshka-style), then inner products, the similarity every
export of this project declares (``similarity_fn_name: cosine``), by
:func:`vascl_scale.search.top_k_search` (chunked, faiss or torch, k = :data:`SEARCH_DEPTH` = 100,
the deepest cut-off): equal scores go to the document that comes first in ``corpus.jsonl``, so
a run is reproducible.

Metrics, per query, then the mean over the scored queries, x 100 as the other families report:

- nDCG@10 (Jarvelin and Kekalainen, 2002, as trec_eval's ``ndcg_cut.10``): DCG@10 =
  sum over ranks r = 1..10 of grade(r) / log2(r + 1), the grade of an unjudged or
  non-relevant document 0; divided by the DCG@10 of the ideal ranking, the query's grades from
  the qrels sorted in decreasing order.
- MRR@10: 1 / the rank of the first relevant document within the top 10, else 0.
- Recall@100: relevant documents in the top 100 / all relevant documents of the query
  (relevant: grade > 0).

No document is removed from a query's ranking for having the query's id (BEIR's and some of
MTEB's tasks do that, ``ignore_identical_ids``; it changes ArguAna and Quora).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vascl_scale.eval.results import TaskResult, in_task_order
from vascl_scale.eval.sts import Encode
from vascl_scale.eval.tables import MissingDataError, read_tsv, require_file
from vascl_scale.search import CHUNK_SIZE, resolve_search, top_k_search
from vascl_scale.sentence_transformers_format import DOCUMENT, QUERY

logger = logging.getLogger(__name__)

RETRIEVAL = "retrieval"  # the family, and the folder of the data directory that holds its datasets
SPLITS = ("test", "dev", "train")
NDCG_CUT, MRR_CUT, RECALL_CUT = 10, 10, 100
SEARCH_DEPTH = max(NDCG_CUT, MRR_CUT, RECALL_CUT)  # documents kept per query
RETRIEVAL_HINT = (
    "a retrieval dataset is a BEIR directory: corpus.jsonl, queries.jsonl and qrels/<split>.tsv "
    "(docs/evaluation.md, Retrieval)"
)
ROOT_HINT = (
    "it should hold each BEIR dataset in a folder of its own (corpus.jsonl, queries.jsonl, qrels/<split>.tsv; "
    "docs/evaluation.md, Retrieval), or give eval retrieval --data DIR"
)
QRELS_COLUMNS = ("query-id", "corpus-id", "score")
_EXAMPLES = 3  # ids shown in an error about many ids
NO_DOCUMENT = -1  # an empty place of a ranking: a short corpus that lost a query's own document


# --- data ---


@dataclass(frozen=True)
class Qrels:
    """The relevant (query, document) pairs of the scored queries, grade > 0, as parallel arrays:
    ``query`` indexes the scored queries, ``document`` the corpus (its row in corpus.jsonl)."""

    query: np.ndarray  # (R,) int64
    document: np.ndarray  # (R,) int64
    grade: np.ndarray  # (R,) int64, every grade > 0
    queries: int  # Q, the scored queries; each has at least one relevant document

    @classmethod
    def from_grades(cls, grades: Sequence[Mapping[int, int]]) -> Qrels:
        """From one ``{corpus row: grade}`` per query; grades <= 0 (not relevant) are dropped."""
        relevant = [{doc: grade for doc, grade in judged.items() if grade > 0} for judged in grades]
        empty = [q for q, judged in enumerate(relevant) if not judged]
        if empty:
            raise ValueError(f"query {empty[0]} has no relevant document (grade > 0); skip such queries first")
        query = np.array([q for q, judged in enumerate(relevant) for _ in judged], dtype=np.int64)
        document = np.array([doc for judged in relevant for doc in judged], dtype=np.int64)
        grade = np.array([value for judged in relevant for value in judged.values()], dtype=np.int64)
        return cls(query, document, grade, len(grades))

    def gains(self, rows: np.ndarray) -> np.ndarray:
        """The grade (Q, K) of each retrieved document of ``rows`` (Q, K), 0 where not relevant
        and at :data:`NO_DOCUMENT` (an empty place)."""
        rows = np.asarray(rows, dtype=np.int64)
        if not len(self.grade):
            return np.zeros(rows.shape, dtype=np.int64)
        placed = rows != NO_DOCUMENT  # (Q, K) False where a ranking is shorter than K
        rows = np.where(placed, rows, 0)
        width = max(int(self.document.max()), int(rows.max(initial=0))) + 1
        judged = self.query * width + self.document  # (R,) one key per relevant pair
        order = np.argsort(judged)
        judged, grades = judged[order], self.grade[order]
        asked = np.arange(len(rows))[:, None] * width + rows  # (Q, K)
        at = np.minimum(np.searchsorted(judged, asked), len(judged) - 1)  # (Q, K)
        return np.where(placed & (judged[at] == asked), grades[at], 0)

    def relevant_counts(self) -> np.ndarray:
        """Relevant documents (Q,) of each query."""
        return np.bincount(self.query, minlength=self.queries)

    def ideal_dcg(self, cut: int) -> np.ndarray:
        """DCG@cut (Q,) of each query's ideal ranking: its grades, highest first."""
        order = np.lexsort((-self.grade, self.query))  # by query, then grade descending
        query, grade = self.query[order], self.grade[order]
        starts = np.searchsorted(query, query)  # where each pair's query begins in the sorted arrays
        rank = np.arange(len(query)) - starts  # (R,) 0-based rank within its query
        kept = rank < cut
        return np.bincount(query[kept], weights=grade[kept] / np.log2(rank[kept] + 2.0), minlength=self.queries).astype(
            np.float64
        )


@dataclass(frozen=True)
class RetrievalData:
    """One BEIR dataset, read and checked: the corpus in file order, the scored queries in file
    order with their relevant documents, and the queries skipped for having none."""

    name: str
    split: str
    document_ids: list[str]
    documents: list[str]  # title + " " + text, as embedded
    query_ids: list[str]  # the scored queries only
    queries: list[str]
    qrels: Qrels
    skipped: dict[str, int] = field(default_factory=dict)  # no_relevant_in_qrels, not_in_qrels
    directory: str = ""


def _read_jsonl(path: Path, kind: str) -> Iterable[tuple[int, dict]]:
    """(line, object) of each non-blank line of a JSON Lines file; a ValueError naming file:line
    for a line that is not a JSON object with a string (or integer) ``_id``."""
    try:
        with require_file(path, RETRIEVAL_HINT).open(encoding="utf-8-sig") as handle:  # -sig: a BOM is skipped
            for line, raw in enumerate(handle, start=1):
                if not raw.strip():
                    continue
                try:
                    record = json.loads(raw)
                except (ValueError, RecursionError) as err:  # also an integer past 4300 digits, deep nesting
                    if isinstance(err, json.JSONDecodeError):
                        reason = err.msg
                    elif isinstance(err, RecursionError):
                        reason = "nested too deeply"
                    else:
                        reason = str(err).split(":")[0]
                    raise ValueError(
                        f"{path}:{line}: not valid JSON ({reason}); each line must be one {kind} object"
                    ) from None
                if not isinstance(record, dict):
                    raise ValueError(f"{path}:{line}: a JSON {type(record).__name__}, not a {kind} object")
                if isinstance(record.get("_id"), bool) or not isinstance(record.get("_id"), (str, int)):
                    raise ValueError(f'{path}:{line}: no "_id" (a string) in this {kind} object; add one')
                yield line, record
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text ({err.reason}); save the file as UTF-8") from None


def _text_field(record: dict, key: str, path: Path, line: int, required: bool) -> str:
    value = record.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        found = "is missing" if value is None else f"is a {type(value).__name__}"
        raise ValueError(f'{path}:{line}: "{key}" {found}; it must be a string')
    return value


def _unique(ids: dict[str, int], identifier: str, path: Path, line: int) -> None:
    if identifier in ids:
        raise ValueError(
            f"{path}:{line}: duplicate _id {identifier!r} (first on line {ids[identifier]}); ids must be unique: "
            "remove or rename one"
        )
    ids[identifier] = line


def load_corpus(path: str | Path) -> tuple[list[str], list[str]]:
    """(ids, texts) of ``corpus.jsonl`` in file order; a text is ``title + " " + text`` when the
    title is not empty, else the text, stripped (BEIR's join)."""
    path = Path(path)
    seen: dict[str, int] = {}
    ids, texts = [], []
    for line, record in _read_jsonl(path, "document"):
        identifier = str(record["_id"])
        _unique(seen, identifier, path, line)
        title = _text_field(record, "title", path, line, required=False)
        text = _text_field(record, "text", path, line, required=True)
        joined = (title + " " + text).strip() if title.strip() else text.strip()
        if not joined:
            raise ValueError(
                f"{path}:{line}: document {identifier!r} has neither title nor text; fill one or remove it"
            )
        ids.append(identifier)
        texts.append(joined)
    if not ids:
        raise ValueError(f'{path} holds no documents; expected one JSON object a line, {{"_id", "title", "text"}}')
    return ids, texts


def load_queries(path: str | Path) -> tuple[list[str], list[str]]:
    """(ids, texts) of ``queries.jsonl`` in file order."""
    path = Path(path)
    seen: dict[str, int] = {}
    ids, texts = [], []
    for line, record in _read_jsonl(path, "query"):
        identifier = str(record["_id"])
        _unique(seen, identifier, path, line)
        text = _text_field(record, "text", path, line, required=True)
        if not text.strip():
            raise ValueError(f"{path}:{line}: query {identifier!r} has an empty text; fill it in or remove the line")
        ids.append(identifier)
        texts.append(text)
    if not ids:
        raise ValueError(f'{path} holds no queries; expected one JSON object a line, {{"_id", "text"}}')
    return ids, texts


def load_qrels(path: str | Path) -> dict[str, dict[str, tuple[int, int]]]:
    """``{query id: {corpus id: (grade, line)}}`` of a qrels TSV, in file order. A pair listed
    twice with different grades is refused; listed twice with one grade, it counts once."""
    path = require_file(Path(path), RETRIEVAL_HINT)
    qrels: dict[str, dict[str, tuple[int, int]]] = {}
    for line, row in read_tsv(path, QRELS_COLUMNS, text_columns=QRELS_COLUMNS[:2]):
        try:
            grade = int(row["score"])
        except ValueError:
            raise ValueError(
                f"{path}:{line}: score {row['score']!r} is not a whole number; grades are integers (<= 0: not relevant)"
            ) from None
        if not -(2**63) <= grade < 2**63:  # Qrels holds them as int64
            raise ValueError(
                f"{path}:{line}: score {row['score']} is too large; grades are small integers (e.g. 0 to 3)"
            )
        judged = qrels.setdefault(row["query-id"], {})
        earlier = judged.get(row["corpus-id"])
        if earlier is not None and earlier[0] != grade:
            raise ValueError(
                f"{path}:{line}: query {row['query-id']!r} and document {row['corpus-id']!r} are graded {grade} here "
                f"and {earlier[0]} on line {earlier[1]}; keep one of the two lines"
            )
        judged.setdefault(row["corpus-id"], (grade, line))
    return qrels


def _unknown_ids(unknown: dict[str, int], kind: str, path: Path, source: Path, fix: str) -> ValueError:
    shown = ", ".join(f"{identifier!r} (line {line})" for identifier, line in list(unknown.items())[:_EXAMPLES])
    more = ", ..." if len(unknown) > _EXAMPLES else ""
    return ValueError(
        f"{path}: {len(unknown)} {kind} id{'s are' if len(unknown) != 1 else ' is'} not in {source.name}: "
        f"{shown}{more}; {fix}"
    )


def load_retrieval_data(directory: str | Path, split: str = "test") -> RetrievalData:
    """A BEIR directory's corpus, queries and ``qrels/<split>.tsv``, checked against each other."""
    directory = Path(directory)
    if split not in SPLITS:
        raise ValueError(f"--split must be one of {', '.join(SPLITS)}; got {split!r}")
    corpus_path, queries_path = directory / "corpus.jsonl", directory / "queries.jsonl"
    qrels_path = directory / "qrels" / f"{split}.tsv"
    for path in (corpus_path, queries_path, qrels_path):  # all three present before reading any
        require_file(path, RETRIEVAL_HINT)
    qrels = load_qrels(qrels_path)
    query_ids, query_texts = load_queries(queries_path)
    document_ids, documents = load_corpus(corpus_path)
    query_row = {identifier: i for i, identifier in enumerate(query_ids)}
    document_row = {identifier: i for i, identifier in enumerate(document_ids)}
    unknown_queries = {q: min(line for _, line in judged.values()) for q, judged in qrels.items() if q not in query_row}
    if unknown_queries:
        raise _unknown_ids(unknown_queries, "query", qrels_path, queries_path, "remove those rows or add the queries")
    unknown_documents: dict[str, int] = {}
    for judged in qrels.values():
        for doc, (_, line) in judged.items():
            if doc not in document_row:
                unknown_documents.setdefault(doc, line)
    if unknown_documents:
        raise _unknown_ids(
            unknown_documents, "corpus", qrels_path, corpus_path, "remove those rows or add the documents"
        )
    scored, grades = [], []
    no_relevant = 0
    for identifier in query_ids:  # queries.jsonl's order
        judged = qrels.get(identifier)
        if judged is None:
            continue
        relevant = {document_row[doc]: grade for doc, (grade, _) in judged.items() if grade > 0}
        if not relevant:
            no_relevant += 1
            continue
        scored.append(identifier)
        grades.append(relevant)
    skipped = {"no_relevant_in_qrels": no_relevant, "not_in_qrels": len(query_ids) - len(qrels)}
    if not scored:
        raise ValueError(
            f"{qrels_path}: no query has a relevant document (a grade > 0) among its {len(qrels)} queries; "
            "check the score column"
        )
    return RetrievalData(
        name=dataset_name(directory),
        split=split,
        document_ids=document_ids,
        documents=documents,
        query_ids=scored,
        queries=[query_texts[query_row[identifier]] for identifier in scored],
        qrels=Qrels.from_grades(grades),
        skipped=skipped,
        directory=str(directory),
    )


_CACHE: dict[tuple[str, str], tuple[tuple, RetrievalData]] = {}


def cached_retrieval_data(directory: str | Path, split: str = "test") -> RetrievalData:
    """:func:`load_retrieval_data`, read once per process: a later call with the same directory
    and split returns the same object without reading the files, unless one of them changed
    (its size or modification time), as a training loop's dev metric calls it every evaluation."""
    directory = Path(directory).resolve()
    files = (directory / "corpus.jsonl", directory / "queries.jsonl", directory / "qrels" / f"{split}.tsv")
    signature = tuple((s.st_size, s.st_mtime_ns) for s in (path.stat() for path in files if path.is_file()))
    key = (str(directory), split)
    cached = _CACHE.get(key)
    if cached is None or cached[0] != signature:
        _CACHE[key] = (signature, load_retrieval_data(directory, split))
    return _CACHE[key][1]


def dataset_name(directory: str | Path) -> str:
    """A dataset's name in tables and the JSON: its path below the last ``retrieval`` folder,
    parts joined by "-" (``<data>/retrieval/nanobeir/scifact`` -> ``nanobeir-scifact``, as
    ``data download`` names that set), else the directory's own name."""
    parts = Path(os.path.abspath(directory)).parts
    if RETRIEVAL in parts[:-1]:
        below = parts[len(parts) - parts[::-1].index(RETRIEVAL) :]
        return "-".join(below)
    return parts[-1]


def _is_dataset(directory: Path) -> bool:
    return any((directory / name).exists() for name in ("corpus.jsonl", "queries.jsonl", "qrels"))


def retrieval_datasets(data_dir: str | Path) -> list[Path]:
    """The datasets under ``<data_dir>/retrieval/``, by path: each folder that holds a BEIR file
    (corpus.jsonl, queries.jsonl or qrels/), found at any depth (``retrieval/nanobeir/<set>/``
    as ``data download`` writes them), and each empty leaf folder (a dataset without its files).
    A symbolic link to a folder above it (a loop) is skipped with a warning naming it."""
    root = Path(data_dir) / RETRIEVAL
    found: list[Path] = []

    def visit(folder: Path, above: frozenset[str]) -> None:
        real = os.path.realpath(folder)
        if real in above:
            logger.warning("skipping %s: a symbolic link to %s, a folder above it (a loop)", folder, real)
            return
        children = sorted(path for path in folder.iterdir() if path.is_dir() and not path.name.startswith("."))
        if folder != root and (_is_dataset(folder) or not children):
            found.append(folder)
            return
        for child in children:
            visit(child, above | {real})

    if root.is_dir():
        visit(root, frozenset())
    return found


# --- search ---


def unit_rows(embeddings: np.ndarray, truncate_dim: int | None = None) -> np.ndarray:
    """(N, m) float32 rows of unit length: the first ``truncate_dim`` dimensions (all when None),
    L2-normalised; a zero row stays zero (it scores 0 against everything)."""
    embeddings = np.asarray(embeddings, dtype=np.float64)
    if truncate_dim is not None:
        if not 1 <= truncate_dim <= embeddings.shape[1]:
            raise ValueError(
                f"truncate_dim {truncate_dim} must be in [1, {embeddings.shape[1]}], the embeddings' dimensions"
            )
        embeddings = embeddings[:, :truncate_dim]
    norms = np.linalg.norm(embeddings, axis=1, keepdims=True)  # (N, 1)
    return np.ascontiguousarray(embeddings / np.where(norms > 0, norms, 1.0), dtype=np.float32)


# --- metrics ---


def drop_identical_ids(
    rows: np.ndarray, query_ids: Sequence[str], document_ids: Sequence[str], depth: int
) -> tuple[np.ndarray, int]:
    """Each query's ranking without the document that has the query's own id, cut to ``depth``:
    MTEB's ``ignore_identical_ids`` (ArguAna and Quora, where a query is also in the corpus and
    would find itself). ``rows`` (Q, K) best first, from a search ``depth + 1`` deep, so a
    dropped place is filled by the next document. Returns the rows (Q, min(depth, K)), with
    :data:`NO_DOCUMENT` where a corpus shorter than ``depth + 1`` leaves a place empty, and how
    many queries had their own document dropped."""
    row_of = {document: row for row, document in enumerate(document_ids)}
    own = np.array([row_of.get(query, NO_DOCUMENT) for query in query_ids], dtype=np.int64)  # (Q,)
    identical = rows == own[:, None]  # (Q, K), at most one True a query
    order = np.argsort(identical, axis=1, kind="stable")  # the others in rank order, then the query's own
    width = min(depth, rows.shape[1])
    kept = np.take_along_axis(rows, order, axis=1)[:, :width]  # (Q, width)
    emptied = np.take_along_axis(identical, order, axis=1)[:, :width]  # its own document, still in reach
    return np.where(emptied, NO_DOCUMENT, kept), int(identical.any(axis=1).sum())


def per_query_metrics(rows: np.ndarray, qrels: Qrels) -> dict[str, np.ndarray]:
    """nDCG@10, MRR@10 and Recall@100 (each (Q,), in [0, 1]) of the rankings ``rows`` (Q, K),
    best first, against ``qrels`` (see the module docstring for the formulas)."""
    if len(rows) != qrels.queries:
        raise ValueError(f"{len(rows)} rankings for {qrels.queries} queries")
    gains = qrels.gains(rows).astype(np.float64)  # (Q, K)
    discount = 1.0 / np.log2(np.arange(2, NDCG_CUT + 2))  # rank r = 1..10 -> 1 / log2(r + 1)
    top = gains[:, :NDCG_CUT]  # (Q, <= 10)
    ndcg = (top * discount[: top.shape[1]]).sum(axis=1) / qrels.ideal_dcg(NDCG_CUT)
    relevant = gains[:, :MRR_CUT] > 0  # (Q, <= 10)
    first = relevant.argmax(axis=1)  # the first relevant rank - 1 (0 when none: masked below)
    mrr = np.where(relevant.any(axis=1), 1.0 / (first + 1.0), 0.0)
    recall = (gains[:, :RECALL_CUT] > 0).sum(axis=1) / qrels.relevant_counts()
    return {f"ndcg_at_{NDCG_CUT}": ndcg, f"mrr_at_{MRR_CUT}": mrr, f"recall_at_{RECALL_CUT}": recall}


def retrieval_scores(rows: np.ndarray, qrels: Qrels) -> dict[str, float]:
    """The means of :func:`per_query_metrics` over the queries, x 100."""
    return {name: float(values.mean()) * 100.0 for name, values in per_query_metrics(rows, qrels).items()}


# --- the evaluator ---


class RetrievalEvaluator:
    """BEIR datasets; primary metric: nDCG@10 x 100 (MRR@10 and Recall@100 x 100 beside it).

    ``evaluate(encode_queries, encode_documents)`` takes one ``encode`` per side, so queries and
    documents can be embedded after different prompts (one for both when ``encode_documents``
    is None). ``truncate_dim``: score the first m dimensions of each embedding (the ``eval``
    commands truncate where they embed, :class:`vascl_scale.encode.Embedder`, and leave it None).
    """

    family = RETRIEVAL
    metric = f"ndcg_at_{NDCG_CUT}"

    def __init__(
        self,
        datasets: Mapping[str, RetrievalData],
        missing: Mapping[str, Exception] | None = None,
        truncate_dim: int | None = None,
        search: str = "auto",
        chunk_size: int = CHUNK_SIZE,
        ignore_identical_ids: bool = False,
    ) -> None:
        self.datasets = dict(datasets)
        self.missing = dict(missing or {})
        self.truncate_dim = truncate_dim
        self.search = resolve_search(search)
        self.chunk_size = chunk_size
        self.ignore_identical_ids = ignore_identical_ids  # drop_identical_ids

    @classmethod
    def from_dirs(cls, directories: Sequence[str | Path], split: str = "test", **options) -> RetrievalEvaluator:
        """One dataset per BEIR directory, named by the directory; a missing file raises."""
        loaded: dict[str, RetrievalData] = {}
        for directory in directories:
            data = load_retrieval_data(directory, split)
            if data.name in loaded:
                raise ValueError(f"two retrieval datasets are named {data.name!r} ({directory}); rename one folder")
            loaded[data.name] = data
        return cls(loaded, **options)

    @classmethod
    def from_data_dir(
        cls,
        data_dir: str | Path,
        tasks: Iterable[str] | None = None,
        missing_ok: bool = False,
        split: str = "test",
        **options,
    ) -> RetrievalEvaluator:
        """The datasets under ``<data_dir>/retrieval/`` (``tasks``: those names only). With
        ``missing_ok`` a dataset without one of its files is reported as missing, and no
        ``retrieval/`` folder means no retrieval results (with a warning); otherwise either raises."""
        root = Path(data_dir) / RETRIEVAL
        found = {dataset_name(path): path for path in retrieval_datasets(data_dir)}
        if not found:
            problem = "holds no dataset folder" if root.is_dir() else "not found"
            err = MissingDataError(root, ROOT_HINT, what="retrieval folder", problem=problem)
            if not missing_ok:
                raise err
            logger.warning("skipping retrieval: %s", err)
            return cls({}, **options)
        names = list(found) if tasks is None else list(dict.fromkeys(tasks))
        unknown = [name for name in names if name not in found]
        if unknown:
            raise ValueError(f"unknown retrieval dataset(s) {unknown}; {root} holds {', '.join(found)}")
        loaded, missing = {}, {}
        for name in names:
            try:
                loaded[name] = load_retrieval_data(found[name], split)
            except MissingDataError as err:
                if not missing_ok:
                    raise
                logger.warning("skipping retrieval dataset %s: %s", name, err)
                missing[name] = err
        return cls(loaded, missing, **options)

    def query_texts(self) -> set[str]:
        return {text for data in self.datasets.values() for text in data.queries}

    def document_texts(self) -> set[str]:
        return {text for data in self.datasets.values() for text in data.documents}

    def texts(self) -> set[str]:
        return self.query_texts() | self.document_texts()

    def evaluate(self, encode_queries: Encode, encode_documents: Encode | None = None) -> list[TaskResult]:
        encode_documents = encode_documents or encode_queries
        results = [TaskResult.missing(self.family, task, self.metric, err) for task, err in self.missing.items()]
        for name, data in self.datasets.items():
            queries = unit_rows(encode_queries(data.queries), self.truncate_dim)  # (Q, m)
            documents = unit_rows(encode_documents(data.documents), self.truncate_dim)  # (N, m)
            if queries.shape[1] != documents.shape[1]:
                raise ValueError(
                    f"{name}: queries embed to {queries.shape[1]} dimensions, documents to {documents.shape[1]}"
                )
            depth = SEARCH_DEPTH + 1 if self.ignore_identical_ids else SEARCH_DEPTH  # room for a dropped one
            _, rows = top_k_search(queries, documents, depth, self.search, self.chunk_size)  # (Q, <= depth)
            dropped = 0
            if self.ignore_identical_ids:
                rows, dropped = drop_identical_ids(rows, data.query_ids, data.document_ids, SEARCH_DEPTH)
            details = {
                **retrieval_scores(rows, data.qrels),
                "queries": len(data.queries),
                "documents": len(data.documents),
                "relevant": int(len(data.qrels.grade)),
                "skipped_queries": dict(data.skipped),
                "split": data.split,
                "similarity": "cosine",
                "search": self.search,
                "dimensions": int(queries.shape[1]),
                "ignore_identical_ids": self.ignore_identical_ids,
                "identical_ids_dropped": dropped,
            }
            results.append(TaskResult(self.family, name, self.metric, details[self.metric], details=details))
            logger.info(
                "%s: nDCG@10 %.2f, MRR@10 %.2f, Recall@100 %.2f over %d queries and %d documents",
                name,
                details["ndcg_at_10"],
                details["mrr_at_10"],
                details["recall_at_100"],
                len(data.queries),
                len(data.documents),
            )
            if any(data.skipped.values()):
                logger.info(
                    "%s: queries skipped: %d whose qrels grade every document <= 0, %d absent from qrels/%s.tsv",
                    name,
                    data.skipped["no_relevant_in_qrels"],
                    data.skipped["not_in_qrels"],
                    data.split,
                )
        return in_task_order(results, [*self.datasets, *self.missing])


def role_prompts(prompts: Mapping[str, str] | None) -> tuple[str, str]:
    """(query prompt, document prompt) of a model's named prompts: its ``query`` and ``document``
    ones, each "" when absent. A training config's ``model.prompts`` are named by column
    (anchor, positive): :func:`vascl_scale.sentence_transformers_format.export_prompts` names them."""
    prompts = dict(prompts or {})
    return prompts.get(QUERY, ""), prompts.get(DOCUMENT, "")


def retrieval_dev_score(
    encode: Encode,
    data_dir: str | Path,
    split: str = "test",
    prompts: Mapping[str, str] | None = None,
    truncate_dim: int | None = None,
    search: str = "auto",
) -> float:
    """nDCG@10 x 100 of ``encode`` on the BEIR directory ``data_dir``: a training loop's dev
    metric, as :func:`vascl_scale.eval.sts.spearman_score` is for STS-B dev.

    ``encode`` maps texts to an (N, d) array (the trainer's ``model.encode`` closure). Queries
    are encoded after ``prompts["query"]`` and documents after ``prompts["document"]`` (the
    model's named prompts, :func:`role_prompts`), each only where given. The dataset is read
    once per process (:func:`cached_retrieval_data`); the corpus is embedded at every call.
    """
    data = cached_retrieval_data(data_dir, split)
    query_prompt, document_prompt = role_prompts(prompts)
    evaluator = RetrievalEvaluator({data.name: data}, truncate_dim=truncate_dim, search=search)
    [result] = evaluator.evaluate(
        lambda texts: encode([query_prompt + text for text in texts]),
        lambda texts: encode([document_prompt + text for text in texts]),
    )
    return result.primary

"""``data mine``: hard negatives for (anchor, positive) pairs, chosen by an encoder's similarity.

What is mined, as sentence-transformers' ``mine_hard_negatives`` does unless said otherwise:

- **Pool.** The candidates are the input's positives (deduplicated), as its default corpus; a
  ``--pool`` adds its texts to them, as its ``corpus`` argument does. Texts are compared after
  stripping surrounding whitespace, as ``data prepare`` stores them.
- **Similarity.** The cosine of the embeddings (each L2-normalised here), from an
  :data:`Encode` callable: the CLI passes an :class:`vascl_scale.encode.Embedder` (the cache and
  precision the evaluation uses too); this module imports no model.
- **Not candidates of an anchor:** its gold positive and every text equal to a positive of a
  row with the same anchor text (sentence-transformers: "a dataset with duplicate queries has
  all their positives as positives"), and the anchor's own text when the pool holds it.
- **Ranks.** The remaining candidates sorted by similarity, most similar first (ties: the text
  that entered the pool first); ``range_min:range_max`` keeps the 0-based positions
  ``range_min .. range_max - 1``, i.e. ranks ``range_min + 1 .. range_max`` counted from 1:
  ``10:50`` skips the 10 most similar (likely unlabelled positives) and keeps the next 40, as
  sentence-transformers' ``range_min=10, range_max=50``.
- **Margin.** Of those, a candidate is skipped when ``score > margin * positive_score``
  (``positive_score``: the cosine of the row's anchor and positive), which is
  sentence-transformers' ``relative_margin = 1 - margin``; ``0.95`` is NV-Retriever's
  TopK-PercPos (95%). One difference: sentence-transformers applies the margin before the range
  (its ranks count only candidates under the margin); here the range is taken first, so a rank
  is a property of the candidate and the anchor alone.
- **Choice.** ``top``: the ``negatives`` most similar survivors (sentence-transformers'
  default); ``random``: that many drawn uniformly from the survivors with a generator seeded by
  (``seed``, the row's number), so the draw does not depend on chunking or on the search.
  Either way the columns ``negative_0 ..`` hold them most similar first.
- **Too few.** A row with fewer survivors than ``negatives`` is dropped and counted in the
  manifest's ``dropped`` as ``too_few_candidates`` (sentence-transformers' ``n-tuple`` output
  drops them too), so every sample has all its columns.

Search: the top ``range_max + e`` candidates of each anchor (``e``: its excluded texts), exact,
by :func:`vascl_scale.search.top_k_search`: a block of ``chunk_size`` anchors against a chunk of
``chunk_size`` pool rows at a time, each chunk's top-k merged into a running top-k, so memory is
about ``40 * chunk_size * chunk_size`` bytes (40 MB at the default 1024), never anchors x pool;
equal scores go to the lower pool row. With faiss-cpu installed (``search="auto"``, or
``"faiss"``) a flat inner-product index (exact as well) scores each chunk, else a torch matrix
product (``"exact"``); the two agree up to the last bits of each score, hence also in the
negatives chosen unless two candidates' similarities are that close.

Teacher scores (``--teacher``, a reranker or an encoder: :mod:`vascl_scale.teacher`): each
written row's anchor scored against its positive and each of its negatives, stored as the
``scores`` column (a JSON list per row, the positive's first) for ``distill_kl`` and
``margin_mse``; the manifest's miner records the teacher, the summary the mean scores.

Summary (printed, logged and stored in the manifest): the pairs, distinct anchors and pool
texts; the rows written and those dropped as ``too_few_candidates``; the candidates within the
range that the margin skipped; the mean cosine of the written rows' anchor and positive and of
their anchor and each negative; the seconds spent encoding, searching and in all.
"""

from __future__ import annotations

import json
import logging
import math
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from rich.table import Table

from vascl_scale.data.columns import SCORES, checked_scores, columns_of
from vascl_scale.data.inputs import Drop, column_problem, open_input
from vascl_scale.data.manifest import Manifest
from vascl_scale.data.prepare import MAX_COLUMNS, PrepareOptions, PrepareResult
from vascl_scale.data.prepare import summary_table as prepare_summary_table
from vascl_scale.data.shard_writer import DROP_REASONS, RowFilter, ShardSink, dropped_summary, write_shard_set
from vascl_scale.log import LoopProgress, shown
from vascl_scale.search import faiss_module, resolve_search, top_k_search

logger = logging.getLogger(__name__)

# texts -> (len(texts), d) embeddings, row i for texts[i] (as vascl_scale.encode.Embedder gives them)
Encode = Callable[[list[str]], np.ndarray]
SAMPLINGS = ("top", "random")
SEARCHES = ("auto", "exact", "faiss")
TOO_FEW = "too_few_candidates"  # the manifest's drop reason for rows without enough negatives


def parse_range(text: str) -> tuple[int, int]:
    """``"LO:HI"`` -> (LO, HI), as ``--range`` takes it."""
    low, colon, high = text.partition(":")
    try:
        bounds = int(low), int(high)
    except ValueError:
        bounds = None
    if not colon or bounds is None:
        raise ValueError(f"--range {text!r}: give LO:HI, two whole numbers, e.g. 10:50")
    return bounds


def parse_margin(text: str) -> float | None:
    """``--margin``: a number, or ``none`` for no margin."""
    if text.strip().lower() == "none":
        return None
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"--margin {text!r}: give a number such as 0.95, or none") from None


@dataclass(frozen=True)
class MineOptions:
    """What ``data mine`` does; recorded verbatim in the manifest."""

    negatives: int = 1
    range_min: int = 0
    range_max: int = 50
    margin: float | None = 0.95
    sampling: str = "top"
    seed: int = 0
    chunk_size: int = 1024
    search: str = "auto"
    shard_size: int = 50_000
    fmt: str = "auto"
    text_field: str = "anchor,positive"
    pool_field: str = "text"  # comma-separated: every named field of a --pool record is a candidate

    def __post_init__(self) -> None:
        if self.fmt == "nli":
            raise ValueError(
                "--format nli gives (anchor, positive, negative) triplets; mine reads (anchor, positive) pairs: "
                "pass the pairs' format (csv, jsonl, ...) and --text-field A,P"
            )
        if len(self.reading.text_fields) != 2:
            raise ValueError(
                f"--text-field {self.text_field}: mine reads two fields, the anchor's and the positive's (A,P)"
            )
        if not 1 <= self.negatives <= MAX_COLUMNS - 2:
            raise ValueError(f"--negatives must be between 1 and {MAX_COLUMNS - 2}; got {self.negatives}")
        if not 0 <= self.range_min < self.range_max:
            raise ValueError(f"--range {self.range_min}:{self.range_max}: need 0 <= LO < HI")
        if self.range_max - self.range_min < self.negatives:
            raise ValueError(
                f"--range {self.range_min}:{self.range_max} keeps {self.range_max - self.range_min} ranks, fewer than "
                f"--negatives {self.negatives}; widen the range"
            )
        if self.margin is not None and not (math.isfinite(self.margin) and self.margin > 0):
            raise ValueError(f"--margin must be a number > 0 (or none); got {self.margin}")
        if self.sampling not in SAMPLINGS:
            raise ValueError(f"--sampling must be one of {', '.join(SAMPLINGS)}; got {self.sampling!r}")
        if self.search not in SEARCHES:
            raise ValueError(f"--search must be one of {', '.join(SEARCHES)}; got {self.search!r}")
        if self.search == "faiss" and faiss_module() is None:
            raise ValueError(
                "--search faiss: faiss is not installed; pip install 'vascl-scale[faiss]', or use --search exact"
            )
        if self.chunk_size < 1:
            raise ValueError(f"--chunk-size must be >= 1; got {self.chunk_size}")
        if "" in self.pool_fields:
            raise ValueError(
                f"--pool-field {self.pool_field!r} has an empty name; pass names separated by single commas"
            )

    @property
    def reading(self) -> PrepareOptions:
        """How the inputs are read: ``data prepare``'s reading, without its filters."""
        return PrepareOptions(shard_size=self.shard_size, fmt=self.fmt, text_field=self.text_field)

    @property
    def pool_fields(self) -> tuple[str, ...]:
        return tuple(self.pool_field.split(","))

    @property
    def search_backend(self) -> str:
        """``faiss`` or ``torch``, what :func:`vascl_scale.search.top_k_search` runs: ``exact`` is its torch."""
        return resolve_search("torch" if self.search == "exact" else self.search)


# --- choosing among the candidates ---


@dataclass(frozen=True)
class Choice:
    """A row's negatives: pool ``rows`` and their ``scores``, most similar first (fewer than asked
    when too few candidates survived), and how many candidates in the range the margin skipped."""

    rows: np.ndarray
    scores: np.ndarray
    over_margin: int


def choose_negatives(
    scores: np.ndarray,
    rows: np.ndarray,
    excluded: np.ndarray,
    positive_score: float,
    options: MineOptions,
    row_number: int,
) -> Choice:
    """The negatives of one row from its anchor's candidates (``scores``, ``rows``: best first,
    at least ``range_max + len(excluded)`` of them where the pool has that many): drop the
    ``excluded`` pool rows, keep positions ``range_min:range_max``, skip those over the margin,
    then take the top ones or a seeded random draw (see the module docstring)."""
    kept = ~np.isin(rows, excluded)
    ranked_scores = scores[kept][options.range_min : options.range_max]
    ranked_rows = rows[kept][options.range_min : options.range_max]
    if options.margin is None:
        under = np.ones(len(ranked_rows), dtype=bool)
    else:
        under = ranked_scores <= options.margin * positive_score
    survivors = np.flatnonzero(under)  # positions in rank order
    if len(survivors) > options.negatives:
        if options.sampling == "top":
            survivors = survivors[: options.negatives]
        else:
            draw = np.random.default_rng([options.seed, row_number]).choice(
                len(survivors), options.negatives, replace=False
            )
            survivors = survivors[np.sort(draw)]  # back in rank order: most similar first
    return Choice(ranked_rows[survivors], ranked_scores[survivors], int((~under).sum()))


# --- mining a list of pairs ---


@dataclass
class MinedPairs:
    """``rows``: (anchor, positive, negative_0, ...) of every pair that had enough negatives, in
    input order; ``summary``: the figures (module docstring, "Summary")."""

    rows: list[tuple[str, ...]]
    summary: dict

    @property
    def too_few(self) -> int:
        """The pairs dropped for want of enough negatives."""
        return self.summary[TOO_FEW]


def _unit_rows(vectors: np.ndarray, texts: Sequence[str]) -> np.ndarray:
    """``vectors`` (n, d) scaled to unit length (float32), so that inner products are cosines."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)  # (n, 1)
    zero = np.flatnonzero(norms[:, 0] == 0)
    if len(zero):
        raise ValueError(
            f"the encoder gave a zero embedding for {texts[zero[0]][:60]!r}: it has no direction to compare"
        )
    return np.ascontiguousarray(vectors / norms, dtype=np.float32)


def mine_pairs(
    pairs: Sequence[tuple[str, str]],
    encode: Encode,
    options: MineOptions,
    extra_pool: Sequence[str] = (),
) -> MinedPairs:
    """Hard negatives for each (anchor, positive) of ``pairs`` from the pool of the positives and
    ``extra_pool`` (see the module docstring). Every distinct text is encoded in one call."""
    if not pairs:
        raise ValueError("no (anchor, positive) rows to mine: the inputs gave none (see the dropped counts)")
    started = time.perf_counter()
    pool = list(dict.fromkeys([*extra_pool, *(positive for _, positive in pairs)]))
    pool_row = {text: row for row, text in enumerate(pool)}
    anchors = list(dict.fromkeys(anchor for anchor, _ in pairs))
    texts = pool + [anchor for anchor in anchors if anchor not in pool_row]
    text_row = {text: row for row, text in enumerate(texts)}
    logger.info(
        "mining %d pairs: %d distinct anchors, a pool of %d texts; encoding %d texts",
        len(pairs),
        len(anchors),
        len(pool),
        len(texts),
    )
    vectors = np.asarray(encode(texts))
    assert vectors.ndim == 2 and len(vectors) == len(texts), (vectors.shape, len(texts))
    vectors = _unit_rows(vectors, texts)  # (T, d): rows 0..N-1 are the pool
    encoded = time.perf_counter()
    # Per distinct anchor: the pool rows that are never its negatives (its positives, itself).
    excluded: list[set[int]] = [set() if anchor not in pool_row else {pool_row[anchor]} for anchor in anchors]
    anchor_number = {anchor: number for number, anchor in enumerate(anchors)}
    pairs_of: list[list[int]] = [[] for _ in anchors]  # per distinct anchor: its pairs' numbers
    for number, (anchor, positive) in enumerate(pairs):
        excluded[anchor_number[anchor]].add(pool_row[positive])
        pairs_of[anchor_number[anchor]].append(number)
    anchor_vectors = vectors[[text_row[anchor] for anchor in anchors]]  # (A, d)
    pair_anchors = vectors[[text_row[anchor] for anchor, _ in pairs]]  # (P, d)
    pair_positives = vectors[[pool_row[positive] for _, positive in pairs]]  # (P, d)
    positive_scores = np.einsum("nd,nd->n", pair_anchors, pair_positives)  # (P,) the cosine of each pair
    choices: list[Choice | None] = [None] * len(pairs)
    backend = options.search_backend
    search = "faiss" if backend == "faiss" else "exact"
    with LoopProgress(f"mining ({search} search)", len(anchors), "anchors") as progress:
        for start in range(0, len(anchors), options.chunk_size):
            chunk = range(start, min(start + options.chunk_size, len(anchors)))
            k = min(options.range_max + max(len(excluded[number]) for number in chunk), len(pool))
            block = anchor_vectors[chunk.start : chunk.stop]
            scores, rows = top_k_search(
                block, vectors[: len(pool)], k, backend, options.chunk_size, options.chunk_size, show_progress=False
            )
            for offset, number in enumerate(chunk):
                never = np.fromiter(excluded[number], dtype=np.int64)
                for pair in pairs_of[number]:
                    positive_score = float(positive_scores[pair])
                    choices[pair] = choose_negatives(scores[offset], rows[offset], never, positive_score, options, pair)
            progress.update(chunk.stop)
    kept = [number for number, choice in enumerate(choices) if len(choice.rows) == options.negatives]
    rows = [(*pairs[number], *(pool[row] for row in choices[number].rows)) for number in kept]
    negative_scores = np.concatenate([choices[number].scores for number in kept]) if kept else np.zeros(0)
    finished = time.perf_counter()
    summary = {
        "pairs": len(pairs),
        "distinct_anchors": len(anchors),
        "pool_texts": len(pool),
        "search": search,
        "rows_written": len(kept),
        TOO_FEW: len(pairs) - len(kept),
        "candidates_over_margin": sum(choice.over_margin for choice in choices),
        "positive_similarity_mean": float(positive_scores[kept].mean()) if kept else None,
        "negative_similarity_mean": float(negative_scores.mean()) if kept else None,
        "encode_seconds": round(encoded - started, 3),
        "search_seconds": round(finished - encoded, 3),
    }
    return MinedPairs(rows, summary)


# --- files in, shards out ---


@dataclass
class MineResult(PrepareResult):
    """The shard set written, as ``data prepare`` reports it, and the mining figures."""

    summary: dict = field(default_factory=dict)


def _records(reader) -> Iterator[object]:
    """The records of one input, a damaged file (truncated gzip, I/O error) as a ``ValueError``."""
    count = 0
    try:
        for record in reader.records():
            count += 1
            yield record
    except (OSError, EOFError, zlib.error) as err:
        raise ValueError(f"cannot read input {reader.path} after {count} records: {err}") from err


def _read_pool(readers: list) -> tuple[list[str], int, dict[str, int]]:
    """The ``--pool`` texts (every field read of each record, stripped), the records read, and
    the values skipped per reason (:func:`~vascl_scale.data.inputs.column_problem`)."""
    texts: list[str] = []
    dropped: Counter[str] = Counter()
    records = 0
    for reader in readers:
        for record in _records(reader):
            records += 1
            if isinstance(record, Drop):  # a JSONL line that is not an object
                dropped[record.reason] += 1
                continue
            for value in record:  # type: ignore[union-attr]
                problem = column_problem((value,))
                if problem is None:
                    texts.append(value.strip())
                else:
                    dropped[problem] += 1
        logger.info("pool: %d texts after reading %s", len(texts), reader.path)
    return texts, records, dict(dropped)


def mine_shards(
    inputs: Sequence[Path],
    output: Path,
    options: MineOptions,
    encode: Encode,
    miner: dict,
    pool_inputs: Sequence[Path] = (),
    overwrite: bool = False,
    teacher: Callable[[list[str], list[str]], np.ndarray] | None = None,
) -> MineResult:
    """Read (anchor, positive) pairs from ``inputs`` (``data prepare``'s readers), mine
    ``options.negatives`` hard negatives for each, and write the paired shards with a manifest
    that records the ``miner`` (the model and its fingerprint; and its teacher), the options and
    the summary. ``teacher``: scores (anchors, candidates) pairs (:data:`vascl_scale.teacher.TeacherScore`),
    written as the ``scores`` column.

    Raises ``ValueError`` for bad inputs or options; on any failure ``output`` is left as it was.
    """
    if not inputs:
        raise ValueError("pass at least one input file or directory")
    reading = options.reading
    readers = [open_input(Path(path), options.fmt, reading.text_fields) for path in inputs]
    pool_readers = [open_input(Path(path), "auto", options.pool_fields) for path in pool_inputs]

    def write(stage: Path) -> tuple[MineResult, Manifest]:
        started = time.perf_counter()
        row_filter = RowFilter()
        pairs: list[tuple[str, str]] = []
        lines_read = 0
        for reader in readers:
            for record in _records(reader):
                lines_read += 1
                row = row_filter(record)
                if row is not None:
                    pairs.append(row)  # type: ignore[arg-type]
            logger.info("read %d pairs from %s", len(pairs), reader.path)
        pool, pool_records, pool_dropped = _read_pool(pool_readers)
        mined = mine_pairs(pairs, encode, options, pool)
        columns = columns_of(2 + options.negatives)
        rows, teacher_summary = mined.rows, {}
        if teacher is not None and rows:
            rows, teacher_summary = _scored_rows(rows, teacher)
            columns = (*columns, SCORES)
        sink = ShardSink(stage, columns, options.shard_size)
        for row in rows:
            sink.add(row)
        sink.close()
        dropped = {reason: row_filter.dropped.get(reason, 0) for reason in DROP_REASONS} | {TOO_FEW: mined.too_few}
        assert sum(dropped.values()) + len(mined.rows) == lines_read, (dropped, len(mined.rows), lines_read)
        summary = {**mined.summary, **teacher_summary, "seconds": round(time.perf_counter() - started, 3)}
        manifest = Manifest(
            columns=columns,
            shards=sink.shards,
            lines_read=lines_read,
            dropped=dropped,
            sources=[_source(reader) for reader in readers],
            options=asdict(options),
            pool={
                "sources": [_source(reader) for reader in pool_readers],
                "records_read": pool_records,
                "skipped": pool_dropped,
                "texts": mined.summary["pool_texts"],
            },
            miner=miner,
            summary=summary,
        )
        result = MineResult(
            output, columns, sink.shards, dropped, lines_read, None, summary["seconds"], summary=summary
        )
        return result, manifest

    def nothing_mined(result: MineResult) -> str:
        """Why no row was mined and what to change (a pool too small for --negatives, mostly)."""
        if result.lines_read == 0:
            return f"no row mined into --output {result.output}: the inputs hold no pairs; give inputs with (anchor, positive) pairs"
        too_few = result.dropped[TOO_FEW]
        advice = (
            f"{too_few:,} had fewer than --negatives {options.negatives} candidates left of a pool of "
            f"{result.summary['pool_texts']:,} texts after --range {options.range_min}:{options.range_max} and "
            f"--margin {'none' if options.margin is None else options.margin}; give more candidates (more pairs, or "
            "texts with --pool), ask for fewer --negatives or widen --range"
            if too_few
            else "fix the inputs"
        )
        return (
            f"no row mined into --output {result.output}: all {result.lines_read:,} pairs read were dropped "
            f"({dropped_summary(result.dropped)}): {advice}"
        )

    result = write_shard_set(output, overwrite, write, nothing_mined)
    logger.info(
        "mined %d rows into %s in %.1f s: positive similarity %s, negative %s, %d rows without enough candidates",
        result.samples,
        output,
        result.seconds,
        _shown_mean(result.summary["positive_similarity_mean"]),
        _shown_mean(result.summary["negative_similarity_mean"]),
        result.summary[TOO_FEW],
    )
    return result


def _scored_rows(
    rows: list[tuple[str, ...]], teacher: Callable[[list[str], list[str]], np.ndarray]
) -> tuple[list[tuple[str, ...]], dict]:
    """Each row (anchor, positive, negatives...) with its teacher scores' JSON text appended (the
    positive's first), and the summary's teacher figures."""
    started = time.perf_counter()
    candidates = len(rows[0]) - 1
    anchors = [row[0] for row in rows for _ in range(candidates)]
    scored = [text for row in rows for text in row[1:]]
    scores = np.asarray(teacher(anchors, scored), dtype=np.float64).reshape(len(rows), candidates)  # (R, 1 + N)
    for row, values in zip(rows, scores):
        try:
            checked_scores(values.tolist())  # what data prepare and the loader take
        except ValueError as err:
            raise ValueError(
                f"the --teacher's list of scores for the row of anchor {shown(row[0])} {err}; check the teacher model (its "
                "weights or precision)"
            ) from None
    written = [(*row, json.dumps([round(float(v), 6) for v in values])) for row, values in zip(rows, scores)]
    summary = {
        "teacher_positive_mean": float(scores[:, 0].mean()),
        "teacher_negative_mean": float(scores[:, 1:].mean()),
        "teacher_seconds": round(time.perf_counter() - started, 3),
    }
    return written, summary


def _source(reader) -> dict:
    return {"path": str(reader.path), "format": reader.fmt, "text_field": ",".join(reader.fields)}


def _shown_mean(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def summary_table(result: MineResult) -> Table:
    """``data prepare``'s table of the shard set written, then the mining figures."""
    summary = result.summary
    table = prepare_summary_table(result)
    table.title = f"data mine -> {result.output}"
    table.columns[1].header = "value"
    for what, value in (
        ("pairs mined", f"{summary['pairs']:,}"),
        ("distinct anchors", f"{summary['distinct_anchors']:,}"),
        ("pool texts", f"{summary['pool_texts']:,}"),
        ("search", summary["search"]),
        ("candidates over the margin", f"{summary['candidates_over_margin']:,}"),
        ("mean positive similarity", _shown_mean(summary["positive_similarity_mean"])),
        ("mean negative similarity", _shown_mean(summary["negative_similarity_mean"])),
        ("seconds encoding / searching", f"{summary['encode_seconds']:.1f} / {summary['search_seconds']:.1f}"),
    ):
        table.add_row(what, value)
    if "teacher_seconds" in summary:
        table.add_row("mean teacher score, positive", _shown_mean(summary["teacher_positive_mean"]))
        table.add_row("mean teacher score, negative", _shown_mean(summary["teacher_negative_mean"]))
        table.add_row("seconds scoring (teacher)", f"{summary['teacher_seconds']:.1f}")
    return table

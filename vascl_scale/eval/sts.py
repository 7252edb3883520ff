"""Semantic textual similarity: Spearman x 100 between cosine similarity and gold scores.

Protocol as in Reimers and Gurevych (2019), SimCSE (Gao et al., 2021), VaSCL Table 1 and MTEB:
embed both sentences of every pair, score the pair by the cosine of the two embeddings, and
report Spearman's rank correlation with the gold scores (x 100). For STS12-16 the headline is
"all": one correlation over every subset concatenated (SimCSE, VaSCL and MTEB report it); the
per-subset values, their plain mean and their size-weighted mean ("wmean", SentEval) go to the
JSON.

The pairs are read from the TSV layout of the data directory (docs/data.md), which ``data
download`` writes from the original formats (:mod:`vascl_scale.data.converters`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from vascl_scale.data.converters import parse_score
from vascl_scale.eval.results import TaskResult, in_task_order
from vascl_scale.eval.tables import MissingDataError, read_tsv

logger = logging.getLogger(__name__)

Encode = Callable[[list[str]], np.ndarray]


@dataclass(frozen=True)
class StsPair:
    sentence1: str
    sentence2: str
    score: float
    subset: str = ""


# task name -> (folder under <data>/sts, splits concatenated in this order)
STS_TASKS: dict[str, tuple[str, tuple[str, ...]]] = {
    "sts12": ("sts12", ("test",)),
    "sts13": ("sts13", ("test",)),
    "sts14": ("sts14", ("test",)),
    "sts15": ("sts15", ("test",)),
    "sts16": ("sts16", ("test",)),
    "stsb": ("stsb", ("test",)),
    "sickr": ("sickr", ("test",)),
    # MTEB scores SICK-R over all 9,927 pairs (train + trial + test); offered for comparison.
    "sickr-full": ("sickr", ("train", "dev", "test")),
    "stsb-dev": ("stsb", ("dev",)),
}
# The seven columns of the paper's Table 1, averaged in that order.
PAPER_STS_TASKS = ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr")
# Which copy of the STS data a task is scored on: "mteb", the releases as published (and as
# MTEB scores them) under <data>/sts; "senteval", the Moses-tokenised, lower-cased copies that
# SentEval's download script leaves, under <data>/sts_senteval (what SentEval-based papers,
# SimCSE and VaSCL's Table 1 among them, scored). SICK-R has no SentEval copy here: it stays on
# <data>/sts under either source.
STS_SOURCES = {"mteb": "sts", "senteval": "sts_senteval"}
SENTEVAL_FOLDERS = ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb")


def check_sts_source(source: str) -> str:
    if source not in STS_SOURCES:
        raise ValueError(f"--sts-source must be one of {', '.join(STS_SOURCES)}; got {source!r}")
    return source


def task_source(task: str, source: str) -> str:
    """The source ``task`` is really scored on under ``--sts-source source``."""
    return source if STS_TASKS[task][0] in SENTEVAL_FOLDERS else "mteb"


def load_sts_tsv(path: str | Path) -> list[StsPair]:
    """Pairs of one ``<task>/<split>.tsv`` (sentence1, sentence2, score[, subset])."""
    path = Path(path)
    rows = read_tsv(path, ("sentence1", "sentence2", "score"), ("sentence1", "sentence2"), optional=("subset",))
    pairs = []
    for line, row in rows:
        score = parse_score(row["score"], f"{path}:{line}")
        pairs.append(StsPair(row["sentence1"], row["sentence2"], score, row.get("subset", "")))
    return pairs


def check_gold_scores(pairs: Sequence[StsPair], files: str) -> None:
    """Spearman's rho needs two pairs or more whose gold scores differ, over a task and within
    each named subset (each is scored apart); otherwise it is undefined (NaN), so the task's
    ``files`` are refused before anything is encoded."""
    groups = {None: list(pairs)}
    for pair in pairs:
        if pair.subset:
            groups.setdefault(pair.subset, []).append(pair)
    for subset, members in groups.items():
        where = files + (f" (subset {subset!r})" if subset is not None else "")
        if len(members) < 2:
            raise ValueError(
                f"{where} has {len(members)} pair; Spearman needs at least 2 pairs with different gold scores"
            )
        if len({pair.score for pair in members}) == 1:
            raise ValueError(
                f"{where}: every gold score is {members[0].score:g}, so Spearman's rho is undefined; "
                "check that this is the right file (scores in the score column)"
            )


def sts_task_paths(data_dir: str | Path, task: str, source: str = "mteb") -> list[Path]:
    if task not in STS_TASKS:
        raise ValueError(f"unknown STS task {task!r}; choose from {', '.join(STS_TASKS)}")
    folder, splits = STS_TASKS[task]
    root = Path(data_dir) / STS_SOURCES[task_source(task, check_sts_source(source))]
    return [root / folder / f"{split}.tsv" for split in splits]


def default_stsb_dev_path(data_dir: str | Path) -> Path:
    """``<data_dir>/sts/stsb/dev.tsv``: STS-B dev, the model-selection set of Appendix A."""
    return sts_task_paths(data_dir, "stsb-dev")[0]


def load_sts_task(data_dir: str | Path, task: str, source: str = "mteb") -> list[StsPair]:
    return [pair for path in sts_task_paths(data_dir, task, source) for pair in load_sts_tsv(path)]


def cosine_similarity_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine of (N, d) and (N, d) -> (N,), in float64 so ranks are not decided by
    float32 rounding; zero vectors score 0."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return np.einsum("nd,nd->n", a, b) / np.where(norms > 0, norms, 1.0)


def spearman_x100(predicted: Sequence[float], gold: Sequence[float]) -> float:
    """Spearman's rho (ties get average ranks) x 100."""
    if len(predicted) != len(gold) or len(gold) < 2:
        raise ValueError(f"Spearman needs two equal-length lists of >= 2 values; got {len(predicted)} and {len(gold)}")
    return float(spearmanr(predicted, gold).statistic) * 100.0


def pair_similarities(encode: Encode, pairs: Sequence[StsPair]) -> np.ndarray:
    """Cosine similarity of every pair (N,). Each distinct sentence is encoded once."""
    texts = list(dict.fromkeys(text for pair in pairs for text in (pair.sentence1, pair.sentence2)))
    row = {text: i for i, text in enumerate(texts)}
    embeddings = encode(texts)  # (T, d)
    first = embeddings[[row[pair.sentence1] for pair in pairs]]  # (N, d)
    second = embeddings[[row[pair.sentence2] for pair in pairs]]  # (N, d)
    return cosine_similarity_rows(first, second)


def spearman_score(encode: Encode, pairs: Sequence[StsPair]) -> float:
    """Spearman x 100 of cosine similarity against gold, over all ``pairs`` at once.

    ``encode`` maps a list of texts to an (N, d) array, e.g. ``functools.partial(model.encode,
    batch_size=64)``. This is the model-selection score on STS-B dev (Appendix A).
    """
    if not pairs:
        raise ValueError("no STS pairs to score")
    return spearman_x100(pair_similarities(encode, pairs), [pair.score for pair in pairs])


def sts_task_scores(similarities: np.ndarray, pairs: Sequence[StsPair]) -> dict:
    """Spearman over all pairs ("all"), per subset, and the subsets' plain and weighted means.

    The gold scores of each group vary (:func:`check_gold_scores`); equal similarities for every
    pair of a group (an encoder that maps every text to one vector, or to zero) would leave
    Spearman undefined, so they are refused, never reported as NaN."""
    gold = np.array([pair.score for pair in pairs])
    subsets = np.array([pair.subset for pair in pairs])

    def spearman(chosen: np.ndarray, group: str) -> float:
        if np.ptp(similarities[chosen]) == 0:
            raise ValueError(
                f"every pair{group} has the same cosine similarity ({similarities[chosen][0]:.4g}), so Spearman's "
                "rho is undefined: the encoder maps these texts to one vector (or to zero); check its weights"
            )
        return spearman_x100(similarities[chosen], gold[chosen])

    per_subset = {}
    sizes = {}
    for name in dict.fromkeys(subsets.tolist()):
        if not name:
            continue
        chosen = subsets == name
        per_subset[name] = spearman(chosen, f" of subset {name!r}")
        sizes[name] = int(chosen.sum())
    scores = {"all": spearman(np.ones(len(pairs), dtype=bool), ""), "pairs": len(pairs)}
    if per_subset:
        values = np.array(list(per_subset.values()))
        weights = np.array(list(sizes.values()), dtype=np.float64)
        scores.update(
            mean=float(values.mean()),
            wmean=float((values * weights).sum() / weights.sum()),
            subsets=per_subset,
            subset_pairs=sizes,
        )
    return scores


class STSEvaluator:
    """STS tasks; primary metric: Spearman x 100 over all pairs of a task ("all")."""

    family = "sts"
    metric = "spearman"

    def __init__(
        self,
        tasks: Mapping[str, Sequence[StsPair]],
        missing: Mapping[str, Exception] | None = None,
        source: str = "mteb",
    ) -> None:
        self.tasks = dict(tasks)
        self.missing = dict(missing or {})
        self.source = check_sts_source(source)

    @classmethod
    def from_data_dir(
        cls,
        data_dir: str | Path,
        tasks: Iterable[str] = PAPER_STS_TASKS,
        missing_ok: bool = False,
        source: str = "mteb",
    ) -> STSEvaluator:
        """The ``tasks`` from ``data_dir``, on the copies ``source`` names (:data:`STS_SOURCES`)."""
        loaded, missing = {}, {}
        for task in tasks:
            try:
                loaded[task] = load_sts_task(data_dir, task, source)
            except MissingDataError as err:
                if not missing_ok:
                    raise
                logger.warning("skipping STS task %s: %s", task, err)
                missing[task] = err
                continue
            check_gold_scores(loaded[task], " + ".join(str(path) for path in sts_task_paths(data_dir, task, source)))
        kept = [task for task in loaded if task_source(task, source) != source]
        if kept:
            logger.info(
                "%s: no SentEval copy exists, scored on the untokenised release as with --sts-source mteb",
                ", ".join(kept),
            )
        return cls(loaded, missing, source)

    def texts(self) -> set[str]:
        return {text for pairs in self.tasks.values() for pair in pairs for text in (pair.sentence1, pair.sentence2)}

    def evaluate(self, encode: Encode) -> list[TaskResult]:
        results = [TaskResult.missing(self.family, task, self.metric, err) for task, err in self.missing.items()]
        for task, pairs in self.tasks.items():
            try:
                scores = sts_task_scores(pair_similarities(encode, pairs), pairs)
            except ValueError as err:
                raise ValueError(f"{task}: {err}") from None
            scores["source"] = task_source(task, self.source)
            results.append(TaskResult(self.family, task, self.metric, scores["all"], details=scores))
            logger.info("%s: Spearman %.2f over %d pairs", task, scores["all"], len(pairs))
        return in_task_order(results, list(STS_TASKS))

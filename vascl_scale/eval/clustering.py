"""Short text clustering (VaSCL Table 2): KMeans on the embeddings, Hungarian-matched accuracy.

For each dataset KMeans with k = number of classes runs once per seed (10 seeds, the
"independent runs" averaged in the paper), each run the least inertia of 10 k-means++ inits, as
the authors' code got from scikit-learn's ``KMeans(n_clusters)`` defaults before 1.4
(``--kmeans-inits``; :mod:`vascl_scale.eval.kmeans` runs all seeds' inits together, as
scikit-learn would one seed at a time). Accuracy uses the best one-to-one matching of clusters
to classes (Hungarian algorithm, as in SCCL and VaSCL); NMI is reported beside it. Both are
x 100, as mean and std over seeds.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import sklearn
from scipy.optimize import linear_sum_assignment
from sklearn.metrics import normalized_mutual_info_score

from vascl_scale.eval.kmeans import best_of_inits
from vascl_scale.eval.results import TaskResult, in_task_order
from vascl_scale.eval.sts import Encode
from vascl_scale.eval.tables import MissingDataError, read_tsv

logger = logging.getLogger(__name__)

KMEANS_INITS = 10  # k-means++ inits per run, the best kept: scikit-learn's n_init default before 1.4
CLUSTERING_TASKS = (
    "agnews",
    "searchsnippets",
    "stackoverflow",
    "biomedical",
    "tweet",
    "googlenews_ts",
    "googlenews_t",
    "googlenews_s",
)


def load_labelled_texts(path: str | Path) -> tuple[list[str], list[str]]:
    """(texts, labels) of a ``text, label`` TSV; labels stay strings (ids need not be contiguous)."""
    rows = read_tsv(Path(path), ("text", "label"), text_columns=("text", "label"))
    return [row["text"] for _, row in rows], [row["label"] for _, row in rows]


def check_clusterable(labels: Sequence[str], where: str) -> None:
    """Refuse a dataset that any clustering scores 100 on: one class (one cluster holds all), or
    a class of its own for every text (k = N clusters, one text each)."""
    classes = set(labels)
    if len(classes) == 1:
        raise ValueError(
            f"{where} has the single label {next(iter(classes))!r} over its {len(labels)} text(s); clustering needs "
            "two classes or more (one cluster would score 100)"
        )
    if len(classes) == len(labels):
        raise ValueError(
            f"{where}: each of its {len(labels)} labels has one text; clustering needs classes of several texts "
            "(one text per cluster would score 100)"
        )


def contingency(labels: Sequence, clusters: Sequence) -> np.ndarray:
    """Counts (n_clusters, n_classes) of items per (cluster, class); any hashable ids."""
    _, label_ids = np.unique(np.asarray(labels), return_inverse=True)
    _, cluster_ids = np.unique(np.asarray(clusters), return_inverse=True)
    table = np.zeros((cluster_ids.max() + 1, label_ids.max() + 1), dtype=np.int64)
    np.add.at(table, (cluster_ids, label_ids), 1)
    return table


def cluster_accuracy(labels: Sequence, clusters: Sequence) -> float:
    """Share of items whose cluster is matched to their class, under the one-to-one matching of
    clusters to classes that maximises it (Hungarian algorithm). With more clusters than classes
    the unmatched clusters count as errors; with fewer, the unmatched classes do. x 100."""
    if len(labels) != len(clusters) or not len(labels):
        raise ValueError(f"need equal, non-zero numbers of labels and clusters; got {len(labels)} and {len(clusters)}")
    table = contingency(labels, clusters)
    rows, cols = linear_sum_assignment(table, maximize=True)
    return float(table[rows, cols].sum()) / len(labels) * 100.0


def nmi(labels: Sequence, clusters: Sequence) -> float:
    """Normalised mutual information (arithmetic normalisation, scikit-learn's default) x 100."""
    return float(normalized_mutual_info_score(np.asarray(labels), np.asarray(clusters))) * 100.0


def stratified_subsample(labels: Sequence[str], max_texts: int, seed: int = 0) -> np.ndarray:
    """Sorted indices of about ``max_texts`` items, each class keeping its share (at least one
    item), drawn with a fixed seed so every model is scored on the same subset."""
    if max_texts < 1:
        raise ValueError(f"max_texts must be >= 1; got {max_texts}")
    labels = np.asarray(labels)
    if len(labels) <= max_texts:
        return np.arange(len(labels))
    order = np.random.default_rng(seed).permutation(len(labels))
    keep = []
    for label in np.unique(labels):
        members = order[labels[order] == label]  # this class, in the seeded order
        keep.append(members[: max(1, round(len(members) * max_texts / len(labels)))])
    return np.sort(np.concatenate(keep))


class ClusteringEvaluator:
    """Clustering datasets; primary metric: Hungarian accuracy x 100, mean over seeds."""

    family = "clustering"
    metric = "accuracy"

    def __init__(
        self,
        datasets: Mapping[str, tuple[Sequence[str], Sequence[str]]],
        missing: Mapping[str, Exception] | None = None,
        seeds: Sequence[int] = tuple(range(10)),
        kmeans_inits: int = KMEANS_INITS,
    ) -> None:
        if not seeds:
            raise ValueError("clustering needs at least one seed")
        if kmeans_inits < 1:
            raise ValueError(f"--kmeans-inits must be >= 1; got {kmeans_inits}")
        self.datasets = dict(datasets)
        self.missing = dict(missing or {})
        self.seeds = tuple(seeds)
        self.kmeans_inits = kmeans_inits

    @classmethod
    def from_data_dir(
        cls,
        data_dir: str | Path,
        tasks: Iterable[str] = CLUSTERING_TASKS,
        missing_ok: bool = False,
        seeds: Sequence[int] = tuple(range(10)),
        max_texts: int | None = None,
        kmeans_inits: int = KMEANS_INITS,
    ) -> ClusteringEvaluator:
        """``max_texts``: score each dataset on a fixed stratified subsample of that size (for
        quick ablations; the paper's numbers use every text, the default). ``kmeans_inits``:
        k-means++ inits per seed, the one of least inertia scored."""
        loaded, missing = {}, {}
        for task in tasks:
            if task not in CLUSTERING_TASKS:
                raise ValueError(f"unknown clustering task {task!r}; choose from {', '.join(CLUSTERING_TASKS)}")
            path = Path(data_dir) / "clustering" / f"{task}.tsv"
            try:
                texts, labels = load_labelled_texts(path)
            except MissingDataError as err:
                if not missing_ok:
                    raise
                logger.warning("skipping clustering task %s: %s", task, err)
                missing[task] = err
                continue
            check_clusterable(labels, str(path))
            if max_texts is not None:
                keep = stratified_subsample(labels, max_texts)
                logger.info(
                    "clustering %s: scoring a stratified subsample of %d of %d texts", task, len(keep), len(texts)
                )
                texts, labels = [texts[i] for i in keep], [labels[i] for i in keep]
                check_clusterable(labels, f"{path} subsampled by --clustering-max-texts {max_texts} (raise it)")
            loaded[task] = (texts, labels)
        return cls(loaded, missing, seeds, kmeans_inits)

    def texts(self) -> set[str]:
        return {text for texts, _ in self.datasets.values() for text in texts}

    def evaluate(self, encode: Encode) -> list[TaskResult]:
        results = [TaskResult.missing(self.family, task, self.metric, err) for task, err in self.missing.items()]
        for task, (texts, labels) in self.datasets.items():
            embeddings = encode(list(texts))  # (N, d)
            n_classes = len(set(labels))
            runs = best_of_inits(embeddings, n_classes, self.seeds, self.kmeans_inits)
            per_seed = [
                {"seed": seed, "accuracy": cluster_accuracy(labels, clusters), "nmi": nmi(labels, clusters)}
                for seed, clusters in zip(self.seeds, runs)
            ]
            accuracy = np.array([run["accuracy"] for run in per_seed])
            nmis = np.array([run["nmi"] for run in per_seed])
            details = {
                "accuracy_mean": float(accuracy.mean()),
                "accuracy_std": float(accuracy.std()),
                "nmi_mean": float(nmis.mean()),
                "nmi_std": float(nmis.std()),
                "texts": len(texts),
                "clusters": n_classes,
                "kmeans": {
                    "n_init": self.kmeans_inits,
                    "init": "k-means++",
                    "algorithm": "lloyd",
                    "scikit_learn": sklearn.__version__,
                },
                "per_seed": per_seed,
            }
            results.append(TaskResult(self.family, task, self.metric, details["accuracy_mean"], details=details))
            logger.info("%s: accuracy %.2f +- %.2f, NMI %.2f", task, accuracy.mean(), accuracy.std(), nmis.mean())
        return in_task_order(results, CLUSTERING_TASKS)

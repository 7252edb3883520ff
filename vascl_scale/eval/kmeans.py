"""KMeans as scikit-learn's ``KMeans(n_clusters, n_init=n, random_state=seed).fit_predict`` runs it,
for many seeds at once.

scikit-learn before 1.4 ran ``n_init=10`` by default: ten k-means++ initialisations, each refined
by Lloyd's k-means, the one of least inertia kept. That is how SCCL and VaSCL clustered their
embeddings. scikit-learn's own k-means++ recomputes float64 distances to all points for every
local trial, so ten inits per seed cost several times the one-init protocol; here:

- k-means++ draws exactly what ``sklearn.cluster.kmeans_plusplus`` draws from each seed's
  ``RandomState`` (the greedy variant: 2 + ln k local trials per centre), on the same float32
  distances scikit-learn computes (from float64 products, rounded to float32), a seed's inits in
  lockstep; when the runs need more candidate rows than there are points, all point-to-point
  distances are computed once.
- Lloyd's steps follow ``sklearn.cluster._kmeans._kmeans_single_lloyd``: the assignment by
  ``|c|^2 - 2 x.c`` in float32 (first minimum on ties), empty clusters relocated to the points
  farthest from their centres, stop at unchanged labels or at a centre shift within ``tol`` times
  the data's mean variance, a last assignment to the final centres if the labels were not
  stable, at most ``max_iter`` steps; distance bounds (:class:`Lloyd`) spare scoring the points
  whose nearest centre cannot have changed.
- Per seed the init of least inertia wins; a later init replaces the best only if its inertia is
  lower and it is a different partition, as scikit-learn decides.

Sums run in another order than scikit-learn's BLAS and OpenMP reductions, so a point equidistant
from two centres to the last bits can go the other way; otherwise the labels are scikit-learn's
(tests/test_eval_kmeans.py; with one init the ten seeds of every clustering set of the real data
gave scikit-learn's accuracies exactly).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np
import torch
from threadpoolctl import threadpool_limits

DISTANCE_MATRIX_BYTES = 1 << 30  # k-means++ computes all point-to-point distances if they fit in this
BLOCK_ROWS = 256  # rows of that matrix per product: small blocks stay in cache for the in-place steps


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """torch on ``count`` intra-op threads inside the block (a decorator too), as before after it."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def local_trials(n_clusters: int) -> int:
    """scikit-learn's greedy k-means++: candidates sampled per centre after the first."""
    return 2 + int(np.log(n_clusters))


def draws_per_init(n_clusters: int) -> int:
    """Uniforms one k-means++ init draws: one for the first centre (``RandomState.choice`` with
    ``p``), ``uniform(size=trials)`` for each later one; each is also a candidate's distance row."""
    return 1 + (n_clusters - 1) * local_trials(n_clusters)


def seeded_uniforms(seed: int, n_init: int, n_clusters: int) -> np.ndarray:
    """(n_init, :func:`draws_per_init`) float64: the uniforms ``KMeans(random_state=seed)``
    draws for its ``n_init`` k-means++ inits, in order."""
    per_init = draws_per_init(n_clusters)
    return np.random.RandomState(seed).random_sample(n_init * per_init).reshape(n_init, per_init)


class CandidateDistances:
    """Squared distances (rows, N) float32 from chosen points to every point, as scikit-learn's
    ``_euclidean_distances`` returns them for float32 data: ``-2 x.y + |x|^2 + |y|^2`` in float64,
    rounded to float32, negatives set to 0. When the runs will ask for more ``rows`` than there
    are points, all N x N are computed once (``map``: over row blocks), if they fit in
    :data:`DISTANCE_MATRIX_BYTES`."""

    def __init__(self, points: np.ndarray, rows: int, map: Callable = map) -> None:
        self.points = points.astype(np.float64)  # (N, d)
        self.norms = np.einsum("ij,ij->i", self.points, self.points)  # (N,), as sklearn's row_norms
        n = len(points)
        self.matrix = None
        if rows > n and n * n * 4 <= DISTANCE_MATRIX_BYTES:
            blocks = np.array_split(np.arange(n), -(-n // BLOCK_ROWS))
            self.matrix = np.concatenate(list(map(self._compute, blocks)))  # (N, N)

    def _compute(self, ids: np.ndarray) -> np.ndarray:
        squared = self.points[ids] @ self.points.T  # (rows, N) float64 products, then in place:
        squared *= -2
        squared += self.norms[ids, None]
        squared += self.norms[None, :]
        distances = squared.astype(np.float32)
        return np.maximum(distances, 0, out=distances)

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        """(*ids.shape, N) float32 for point ids of any shape."""
        flat = ids.reshape(-1)
        rows = self.matrix[flat] if self.matrix is not None else self._compute(flat)
        return rows.reshape(*ids.shape, -1)


def kmeans_plusplus_runs(distances: CandidateDistances, n_clusters: int, uniforms: np.ndarray) -> np.ndarray:
    """(R, k) point indices of the k-means++ centres of R runs, run r drawing from ``uniforms[r]``
    (:func:`seeded_uniforms`) as ``sklearn.cluster.kmeans_plusplus`` draws from its RandomState,
    on the points of ``distances`` (the data as KMeans sees it: centred, float32)."""
    n, trials = len(distances.points), local_trials(n_clusters)
    runs = len(uniforms)
    assert uniforms.shape == (runs, draws_per_init(n_clusters)), uniforms.shape
    # RandomState.choice(n, p=1/n each): the cdf of float32 weights, searched on the right
    weights = np.ones(n, dtype=np.float32)
    cdf = (weights / weights.sum()).astype(np.float64).cumsum()
    cdf /= cdf[-1]
    chosen = np.empty((runs, n_clusters), dtype=np.int64)
    chosen[:, 0] = cdf.searchsorted(uniforms[:, 0], side="right")
    closest = distances(chosen[:, 0])  # (R, N) float32
    column = weights.reshape(-1, 1)
    potential = (closest[:, None, :] @ column)[:, 0, 0]  # (R,) float32, one dot per run as sklearn's
    everyone = np.arange(runs)
    for c in range(1, n_clusters):
        targets = uniforms[:, 1 + (c - 1) * trials : 1 + c * trials] * potential[:, None]  # (R, trials) float64
        cumulative = np.cumsum(weights * closest, axis=1).astype(np.float64)  # float32 running sums, as numpy's 1-D
        candidates = torch.searchsorted(torch.from_numpy(cumulative), torch.from_numpy(targets))
        candidates = candidates.clamp_(max=n - 1).numpy()  # (R, trials)
        trial = distances(candidates)  # (R, trials, N)
        np.minimum(trial, closest[:, None, :], out=trial)
        potentials = (trial @ column)[..., 0]  # (R, trials) float32, per run as sklearn's matrix-vector product
        best = potentials.argmin(axis=1)  # first minimum, as np.argmin
        chosen[:, c] = candidates[everyone, best]
        potential = potentials[everyone, best]
        closest = trial[everyone, best]
    return chosen


def _relocate_empty(points: np.ndarray, centres: np.ndarray, labels: np.ndarray, sums, counts) -> None:
    """scikit-learn's ``_relocate_empty_clusters_dense``: each empty cluster takes one of the
    points farthest from their (old) centres, which leaves its own cluster. ``sums`` (k, d) and
    ``counts`` (k,) change in place; the labels do not."""
    empty = np.flatnonzero(counts == 0)
    far_off = ((points - centres[labels]) ** 2).sum(axis=1)  # (N,) float32
    if far_off.max() == 0:  # as many clusters as distinct points: nothing to move
        return
    for cluster, point in zip(empty, np.argpartition(far_off, -len(empty))[: -len(empty) - 1 : -1]):
        sums[labels[point]] -= points[point]
        sums[cluster] = points[point]
        counts[labels[point]] -= 1
        counts[cluster] = 1


class Lloyd:
    """Lloyd's k-means on fixed points, one run per call, as ``_kmeans_single_lloyd`` runs it.

    Each step assigns every point to its nearest centre as scikit-learn ranks them (``|c|^2 -
    2 x.c`` in float32, the first minimum on ties) and moves each centre to its points' mean.
    Most points keep their centre from one step to the next, so, as in Elkan's k-means, each
    point carries an upper bound on its distance to its centre and a lower bound on its
    distance to every other, moved by each centre's shift; a point is scored against all
    centres again only when the bounds leave its nearest centre open by a margin that covers
    the float32 error of the ranking (``error``), so the labels are those every point would
    get from scoring all centres. The cluster sums follow the points that changed cluster.
    """

    def __init__(self, points: np.ndarray, tol: float, max_iter: int = 300) -> None:
        self.x = torch.from_numpy(np.ascontiguousarray(points, dtype=np.float32))  # (N, d)
        self.x64 = self.x.double()
        self.norms = (self.x64 * self.x64).sum(1)  # (N,) |x|^2
        self.norms32 = self.norms.float()
        largest = float(self.norms.max())
        # |c|^2 - 2 x.c in float32 is within (d + 2) u (|c|^2 + 2 |x||c|) of its value (u = 2^-24,
        # Higham's bound for dot products), |c| <= max |x| as centres are means of points; doubled
        self.error = (self.x.shape[1] + 2) * 2.0**-23 * 3 * largest
        self.pad = 2.0**-22 * math.sqrt(largest)  # float32 rounding of a lower bound's step
        self.tol, self.max_iter = tol, max_iter

    def __call__(self, initial: np.ndarray) -> tuple[np.ndarray, float]:
        """(labels (N,), inertia) of the run from centres ``initial`` (k, d): stops at unchanged
        labels, at a total squared centre shift ``<= tol`` or after ``max_iter`` steps; a run
        that did not stop at unchanged labels is relabelled on its final centres."""
        n, k = len(self.x), len(initial)
        centres = torch.from_numpy(np.array(initial, dtype=np.float32))  # (k, d)
        lower = torch.empty(n, k)  # float32 lower bounds on each point's distance to each other centre
        upper = torch.empty(n, dtype=torch.float64)  # upper bound on its distance to its own
        labels = sums = counts = None
        strict = False
        for _ in range(self.max_iter):
            found = self._assign(centres, labels, lower, upper)
            if labels is None:
                sums = torch.zeros(k, self.x.shape[1], dtype=torch.float64).index_add_(0, found, self.x64)
                counts = torch.bincount(found, minlength=k)
            else:
                strict = not self._move(sums, counts, labels, found)
            moved = self._means(sums, counts, centres, found)
            shift = (moved.double() - centres.double()).norm(dim=1)  # (k,)
            lower -= (shift + self.pad).float()
            upper += shift[found]
            centres, labels = moved, found
            if strict or float((shift**2).sum()) <= self.tol:
                break
        if not strict:
            found = self._assign(centres, labels, lower, upper)
            self._move(sums, counts, labels, found)
            labels = found
        c64 = centres.double()  # inertia = sum |x|^2 - 2 sum_j c_j . S_j + sum_j n_j |c_j|^2
        inertia = self.norms.sum() - 2 * (c64 * sums).sum() + (counts * (c64 * c64).sum(1)).sum()
        return labels.numpy(), float(inertia)

    def _assign(self, centres: torch.Tensor, labels, lower: torch.Tensor, upper: torch.Tensor) -> torch.Tensor:
        """(N,) nearest of ``centres`` (k, d) for every point. A point is scored against all of
        them (and its bounds reset) unless its bounds settle it: no other centre's distance^2
        within 3 ``error`` of its own (2 for the two float32 scores, 1 for the bounds' rounding).
        At the first step (``labels`` None) every point is scored."""
        ids = None  # every point
        if labels is not None:
            other = lower.amin(1).double()  # (N,)
            ids = ((other <= 0) | (other * other - upper * upper <= 3 * self.error)).nonzero()[:, 0]
            if not len(ids):
                return labels
        x = self.x if ids is None else self.x.index_select(0, ids)  # (m, d)
        squared = torch.addmm((centres * centres).sum(1), x, centres.T, alpha=-2)  # (m, k): |c|^2 - 2 x.c
        best, nearest = squared.min(1)  # the first minimum, as argmin
        norms = self.norms32 if ids is None else self.norms32.index_select(0, ids)  # (m,) |x|^2
        own = (best.double() + norms + self.error).sqrt()
        squared += norms[:, None]
        bounds = squared.sub_(self.error).clamp_min_(0).sqrt_().scatter_(1, nearest[:, None], math.inf)
        if ids is None:
            lower.copy_(bounds), upper.copy_(own)
            return nearest
        lower.index_copy_(0, ids, bounds), upper.index_copy_(0, ids, own)
        return labels.index_copy(0, ids, nearest)

    def _move(self, sums: torch.Tensor, counts: torch.Tensor, labels: torch.Tensor, found: torch.Tensor) -> int:
        """Cluster sums (k, d) and counts (k,) of ``labels`` made those of ``found``, in place;
        returns how many points changed cluster."""
        changed = (found != labels).nonzero()[:, 0]
        points, now, before = self.x64.index_select(0, changed), found[changed], labels[changed]
        sums.index_add_(0, now, points).index_add_(0, before, points, alpha=-1)
        counts += torch.bincount(now, minlength=len(counts)) - torch.bincount(before, minlength=len(counts))
        return len(changed)

    def _means(self, sums: torch.Tensor, counts: torch.Tensor, centres: torch.Tensor, labels: torch.Tensor):
        """(k, d) float32 new centres: the clusters' means after relocating empty clusters (on
        copies: scikit-learn sums the clusters afresh every step); a cluster still empty (all
        points on their centres) takes the largest one's, as ``_average_centers`` does."""
        if (counts == 0).any():
            sums, counts = sums.clone(), counts.clone()
            _relocate_empty(self.x.numpy(), centres.numpy(), labels.numpy(), sums.numpy(), counts.numpy())
        means = (sums / counts.clamp_min(1)[:, None]).float()
        empty = counts == 0
        if empty.any():
            means[empty] = means[counts.argmax()]
        return means


def tolerance(data: np.ndarray, tol: float = 1e-4) -> float:
    """scikit-learn's ``_tolerance``: ``tol`` times the mean over features of the data's variance."""
    return float(np.mean(np.var(data, axis=0)) * tol)


def same_partition(labels: np.ndarray, other: np.ndarray) -> bool:
    """scikit-learn's ``_is_same_clustering``: every cluster of ``labels`` lies in one cluster of ``other``."""
    return len(np.unique(np.stack([labels, other]), axis=1)[0]) == len(np.unique(labels))


def best_of_inits(
    embeddings: np.ndarray, n_clusters: int, seeds: Sequence[int], n_init: int, max_iter: int = 300, tol: float = 1e-4
) -> list[np.ndarray]:
    """Per seed, the cluster ids (N,) that ``KMeans(n_clusters, n_init=n_init, random_state=seed,
    max_iter=max_iter, tol=tol).fit_predict(embeddings)`` returns: the least inertia of
    ``n_init`` k-means++ inits, each refined by Lloyd's k-means; a later init replaces the best
    only with less inertia and another partition, as scikit-learn decides. Seeds run in one
    thread per CPU core, each with one BLAS and torch thread: on a shared, oversubscribed
    machine, threads that wait on each other inside every product were several times slower."""
    assert n_init >= 1 and len(seeds), (n_init, seeds)
    data = np.asarray(embeddings, dtype=np.float32)
    points = data - data.mean(axis=0)  # KMeans centres the data for accurate distances
    rows = len(seeds) * n_init * draws_per_init(n_clusters)  # the candidates' distance rows k-means++ asks for
    workers = min(len(seeds), len(os.sched_getaffinity(0)))
    with torch_threads(1), threadpool_limits(limits=1), ThreadPoolExecutor(workers) as pool:
        distances = CandidateDistances(points, rows, pool.map)
        lloyd = Lloyd(points, tolerance(data, tol), max_iter)

        def best(seed: int) -> np.ndarray:
            chosen = kmeans_plusplus_runs(distances, n_clusters, seeded_uniforms(seed, n_init, n_clusters))
            kept, least = lloyd(points[chosen[0]])
            for centres in chosen[1:]:
                labels, inertia = lloyd(points[centres])
                if inertia < least and not same_partition(labels, kept):
                    kept, least = labels, inertia
            return kept

        return list(pool.map(best, seeds))

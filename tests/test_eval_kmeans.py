"""The batched k-means of ``eval clustering`` against scikit-learn's KMeans: the same k-means++
draws, the same Lloyd labels from fixed initial centres, the same best-of-n choice; and
``--kmeans-inits`` through the CLI into the results JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest
import sklearn
from sklearn.cluster import KMeans, kmeans_plusplus
from sklearn.utils.extmath import row_norms
from threadpoolctl import threadpool_limits

from tests.eval_helpers import invoke, make_data, save_tiny_bert
from vascl_scale.eval.kmeans import (
    CandidateDistances,
    Lloyd,
    best_of_inits,
    kmeans_plusplus_runs,
    seeded_uniforms,
    tolerance,
)


@pytest.fixture(autouse=True)
def one_thread():
    """scikit-learn's OpenMP threads busy-wait on a shared machine: these tiny fits took seconds with two."""
    with threadpool_limits(limits=1):
        yield


def blobs(n: int, k: int, spread: float, seed: int = 0, d: int = 8) -> np.ndarray:
    """(n, d) float32 points around k random centres; a larger ``spread`` overlaps them (local optima)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(k, d)) * 3
    return (centres[rng.integers(0, k, n)] + spread * rng.normal(size=(n, d))).astype(np.float32)


@pytest.mark.parametrize("n, k", [(400, 6), (120, 25)])  # distances computed per candidate, then all at once
def test_kmeans_plusplus_draws_what_sklearn_draws(n, k):
    points = blobs(n, k, 2.0)
    points -= points.mean(axis=0)
    seeds, n_init = (0, 7), 3
    uniforms = np.concatenate([seeded_uniforms(s, n_init, k) for s in seeds])
    distances = CandidateDistances(points, uniforms.size)
    assert (distances.matrix is not None) == (n < uniforms.size)
    chosen = kmeans_plusplus_runs(distances, k, uniforms)
    expected = []
    for seed in seeds:
        state = np.random.RandomState(seed)  # KMeans draws its n_init inits from one RandomState in turn
        for _ in range(n_init):
            expected.append(
                kmeans_plusplus(points, k, x_squared_norms=row_norms(points, squared=True), random_state=state)[1]
            )
    np.testing.assert_array_equal(chosen, np.array(expected))


def test_lloyd_gives_sklearn_labels_and_inertia_on_fixed_inits():
    data = blobs(500, 5, 1.5, seed=1)
    rng = np.random.default_rng(2)
    inits = [data[rng.choice(len(data), 5, replace=False)] for _ in range(3)]
    far = data[:5].copy()
    far[4] = 1e3  # no point is nearest to it: an empty cluster, relocated to the farthest point
    inits.append(far)
    mean = data.mean(axis=0)
    lloyd = Lloyd(data - mean, tolerance(data))
    for init in inits:
        labels, inertia = lloyd(init - mean)
        reference = KMeans(5, init=init, n_init=1).fit(data)
        np.testing.assert_array_equal(labels, reference.labels_)
        assert inertia == pytest.approx(reference.inertia_, rel=1e-5)


def test_lloyd_stops_at_max_iter_and_relabels_like_sklearn():
    data = blobs(300, 4, 2.5, seed=3)
    init = data[:4]
    mean = data.mean(axis=0)
    labels, inertia = Lloyd(data - mean, tolerance(data), max_iter=2)(init - mean)
    reference = KMeans(4, init=init, n_init=1, max_iter=2).fit(data)
    np.testing.assert_array_equal(labels, reference.labels_)
    assert inertia == pytest.approx(reference.inertia_, rel=1e-5)


def test_best_of_inits_is_sklearns_kmeans_with_n_init():
    data = blobs(600, 8, 2.5, seed=4)  # overlapping: the inits end in different local optima
    seeds = (0, 1, 2, 3)
    ours = best_of_inits(data, 8, seeds, n_init=5)
    single = best_of_inits(data, 8, seeds, n_init=1)
    for seed, labels, one in zip(seeds, ours, single):
        np.testing.assert_array_equal(labels, KMeans(8, n_init=5, random_state=seed).fit_predict(data))
        np.testing.assert_array_equal(one, KMeans(8, n_init=1, random_state=seed).fit_predict(data))
    assert any(not np.array_equal(a, b) for a, b in zip(ours, single))  # the choice of init mattered here


def test_kmeans_inits_reach_the_results_json(tmp_path):
    model, data = save_tiny_bert(tmp_path / "tiny"), make_data(tmp_path / "data")
    common = ["--model", str(model), "--data-dir", str(data), "--no-cache", "--task", "agnews"]
    for inits, extra in ((3, ["--kmeans-inits", "3"]), (10, [])):
        output = tmp_path / f"c{inits}.json"
        result = invoke("clustering", *common, *extra, "--output", str(output))
        assert result.exit_code == 0, result.output
        details = json.loads(output.read_text())["models"][0]["results"][0]["details"]
        assert details["kmeans"] == {
            "n_init": inits,
            "init": "k-means++",
            "algorithm": "lloyd",
            "scikit_learn": sklearn.__version__,
        }
    refused = invoke("sts", *common[:-2], "--kmeans-inits", "3", "--output", str(tmp_path / "s.json"))
    assert refused.exit_code == 2 and "--kmeans-inits only applies to clustering" in refused.output
    zero = invoke("clustering", *common, "--kmeans-inits", "0", "--output", str(tmp_path / "z.json"))
    assert zero.exit_code == 2 and "--kmeans-inits" in zero.output

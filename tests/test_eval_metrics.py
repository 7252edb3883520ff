"""Known-answer tests for every evaluation metric."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vascl_scale.eval.clustering import cluster_accuracy, contingency, nmi, stratified_subsample
from vascl_scale.eval.neighbours import alignment, neighbour_statistics, uniformity
from vascl_scale.eval.sts import StsPair, cosine_similarity_rows, spearman_score, spearman_x100, sts_task_scores


def test_spearman_perfect_and_inverted():
    gold = [0.0, 1.0, 2.5, 4.0, 5.0]
    assert spearman_x100([0.1, 0.2, 0.3, 0.4, 0.9], gold) == pytest.approx(100.0)
    assert spearman_x100([0.9, 0.4, 0.3, 0.2, 0.1], gold) == pytest.approx(-100.0)
    # one swapped adjacent pair: rho = 1 - 6 * 2 / (5 * 24) = 0.9
    assert spearman_x100([0.1, 0.3, 0.2, 0.4, 0.9], gold) == pytest.approx(90.0)


def test_spearman_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="equal-length"):
        spearman_x100([0.1, 0.2], [1.0])


def test_cosine_rows_known_values():
    a = np.array([[1.0, 0.0], [1.0, 1.0], [2.0, 0.0], [0.0, 0.0]])
    b = np.array([[0.0, 3.0], [2.0, 2.0], [-1.0, 0.0], [1.0, 0.0]])
    np.testing.assert_allclose(cosine_similarity_rows(a, b), [0.0, 1.0, -1.0, 0.0])


def _encoder_from_table(table: dict[str, list[float]]):
    return lambda texts: np.array([table[t] for t in texts], dtype=np.float32)


def test_spearman_score_through_an_encoder():
    # cosine with [1, 0] falls as the angle grows: a, b, c, d in decreasing similarity
    angles = {"a": 0.1, "b": 0.5, "c": 1.0, "d": 1.5}
    table = {name: [math.cos(t), math.sin(t)] for name, t in angles.items()} | {"ref": [1.0, 0.0]}
    encode = _encoder_from_table(table)
    pairs = [StsPair("ref", name, score) for name, score in zip("abcd", [5.0, 3.0, 2.0, 0.5])]
    assert spearman_score(encode, pairs) == pytest.approx(100.0)
    inverted = [StsPair("ref", name, score) for name, score in zip("abcd", [0.5, 2.0, 3.0, 5.0])]
    assert spearman_score(encode, inverted) == pytest.approx(-100.0)


def test_sts_aggregates_all_mean_and_wmean():
    # subset x (3 pairs) perfectly ordered, subset y (2 pairs) inverted
    pairs = [StsPair("", "", g, "x") for g in (1.0, 2.0, 3.0)] + [StsPair("", "", g, "y") for g in (1.0, 2.0)]
    similarities = np.array([0.1, 0.2, 0.3, 0.9, 0.8])
    scores = sts_task_scores(similarities, pairs)
    assert scores["subsets"] == {"x": pytest.approx(100.0), "y": pytest.approx(-100.0)}
    assert scores["mean"] == pytest.approx(0.0)
    assert scores["wmean"] == pytest.approx((3 * 100.0 - 2 * 100.0) / 5)
    # "all" is one correlation over the concatenation, not an average of subsets
    gold = [p.score for p in pairs]
    assert scores["all"] == pytest.approx(spearman_x100(similarities, gold))
    assert scores["pairs"] == 5


def test_cluster_accuracy_is_one_under_any_permutation():
    labels = np.array([0, 0, 1, 1, 2, 2, 2])
    for permutation in ([0, 1, 2], [2, 0, 1], [1, 2, 0], [2, 1, 0]):
        clusters = np.array(permutation)[labels]
        assert cluster_accuracy(labels, clusters) == pytest.approx(100.0)
        assert nmi(labels, clusters) == pytest.approx(100.0)


def test_cluster_accuracy_non_contiguous_and_string_labels():
    labels = ["7", "7", "42", "42", "1000"]
    clusters = [3, 3, 9, 9, 9]  # the 1000 item is lumped with 42
    assert cluster_accuracy(labels, clusters) == pytest.approx(80.0)
    assert cluster_accuracy([5, 5, 90, 90], [1, 1, 0, 0]) == pytest.approx(100.0)


def test_cluster_accuracy_more_clusters_than_classes():
    labels = [0, 0, 0, 0, 1, 1]
    clusters = [0, 0, 1, 1, 2, 2]  # class 0 split in two: only one half can be matched
    assert cluster_accuracy(labels, clusters) == pytest.approx(4 / 6 * 100)
    assert contingency(labels, clusters).shape == (3, 2)


def test_cluster_accuracy_fewer_clusters_than_classes():
    assert cluster_accuracy([0, 1, 2, 2], [0, 0, 0, 0]) == pytest.approx(50.0)


def test_nmi_of_independent_partitions_is_zero():
    assert nmi([0, 0, 1, 1], [0, 1, 0, 1]) == pytest.approx(0.0, abs=1e-9)


def test_neighbour_statistics_on_two_separated_groups():
    # two tight groups of 3 far apart: the 2 nearest neighbours are same-class, the third is not
    group_a = [[1.0, 0.0], [1.0, 0.01], [1.0, -0.01]]
    group_b = [[0.0, 1.0], [0.01, 1.0], [-0.01, 1.0]]
    stats = neighbour_statistics(np.array(group_a + group_b), [0, 0, 0, 1, 1, 1], ks=(1, 2, 3))
    assert stats[1]["same_class"] == pytest.approx(100.0)
    assert stats[2]["same_class"] == pytest.approx(100.0)
    assert stats[3]["same_class"] == pytest.approx(200.0 / 3)
    assert stats[1]["distance"] < 0.05
    assert stats[3]["distance"] > stats[2]["distance"]


def test_neighbour_statistics_rejects_k_too_large():
    with pytest.raises(ValueError, match="K must be"):
        neighbour_statistics(np.eye(3), [0, 1, 2], ks=(3,))


def test_alignment_and_uniformity_known_values():
    x = np.array([[1.0, 0.0], [0.0, 1.0]])
    assert alignment(x, x) == pytest.approx(0.0)
    assert alignment(x, -x) == pytest.approx(4.0)  # antipodal unit vectors: |a - b|^2 = 4
    # two orthogonal unit vectors: one pair at squared distance 2 -> log exp(-2 * 2) = -4
    assert uniformity(x) == pytest.approx(-4.0)
    # four points on the circle at right angles: squared distances 2, 2, 4, 2, 2, 4 (scale-free)
    square = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]]) * 3.0
    expected = math.log((4 * math.exp(-4.0) + 2 * math.exp(-8.0)) / 6)
    assert uniformity(square) == pytest.approx(expected)


def test_stratified_subsample_keeps_every_class_and_its_share():
    labels = ["a"] * 600 + ["b"] * 300 + ["c"] * 99 + ["d"]
    keep = stratified_subsample(labels, 100, seed=0)
    kept = [labels[i] for i in keep]
    assert {c: kept.count(c) for c in "abcd"} == {"a": 60, "b": 30, "c": 10, "d": 1}  # a rare class keeps one
    assert list(keep) == sorted(set(keep.tolist()))  # distinct, in file order
    assert np.array_equal(keep, stratified_subsample(labels, 100, seed=0))  # same subset for every model
    assert not np.array_equal(keep, stratified_subsample(labels, 100, seed=1))
    assert np.array_equal(stratified_subsample(labels[:50], 100), np.arange(50))  # small sets stay whole
    with pytest.raises(ValueError, match="max_texts must be >= 1"):
        stratified_subsample(labels, 0)


def test_the_average_column_is_starred_unless_every_paper_task_was_scored() -> None:
    """--task stsb --task sickr-full averages stsb alone (sickr-full is an extra): not Table 1's Avg."""
    from vascl_scale.eval.report import _average
    from vascl_scale.eval.results import TaskResult
    from vascl_scale.eval.sts import PAPER_STS_TASKS

    def scored(tasks, missing=()):
        return {t: TaskResult("sts", t, "spearman", None if t in missing else 70.0 + i, status="missing" if t in missing else "ok")
                for i, t in enumerate(tasks)}  # fmt: skip

    assert _average(scored(PAPER_STS_TASKS), "sts") == f"{70 + (len(PAPER_STS_TASKS) - 1) / 2:.2f}"
    assert _average(scored(["stsb", "sickr-full"]), "sts") == "70.00*"
    assert _average(scored(PAPER_STS_TASKS, missing=("sts12",)), "sts").endswith("*")
    assert _average(scored(["sickr-full"]), "sts") == ""


def test_the_tables_say_what_a_starred_average_averages(tmp_path) -> None:
    """The issue's `eval sts --task stsb --task sickr-full`: Avg. 82.04* is STS-B's alone, and the
    rich table's caption and the Markdown say so; a second model missing sickr has its own set."""
    import io

    from rich.console import Console

    from vascl_scale.eval.report import EvalReport, ModelReport, average_note, markdown, rich_tables
    from vascl_scale.eval.results import TaskResult
    from vascl_scale.eval.sts import PAPER_STS_TASKS

    subset = [TaskResult("sts", "stsb", "spearman", 82.04), TaskResult("sts", "sickr-full", "spearman", 77.58)]
    report = EvalReport([ModelReport({"name": "pkg/model"}, {}, {}, subset)])
    note = "Avg.* is the mean of stsb only (1 of the 7 tasks the paper averages); sickr-full is not averaged."
    assert average_note(report, "sts") == note
    assert f"| 82.04* |\n\n{note}" in markdown(report)
    console = Console(file=io.StringIO(), width=400)
    console.print(*rich_tables(report))
    assert note in " ".join(console.file.getvalue().split())  # the caption wraps at the table's width

    full = [TaskResult("sts", task, "spearman", 70.0) for task in PAPER_STS_TASKS]
    no_sickr = [*full[:-1], TaskResult.missing("sts", "sickr", "spearman", FileNotFoundError("sickr/test.tsv"))]
    report = EvalReport(
        [ModelReport({"name": "a/full"}, {}, {}, full), ModelReport({"name": "b/part"}, {}, {}, no_sickr)]
    )
    assert average_note(report, "sts") == (
        "Avg.* is the mean of sts12, sts13, sts14, sts15, sts16, stsb only (6 of the 7 tasks the paper averages)."
    )
    assert average_note(EvalReport([ModelReport({"name": "a/full"}, {}, {}, full)]), "sts") == ""  # the paper's Avg.

"""Few-shot intent: the sampler's counts and determinism, and the batched linear probes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vascl_scale.eval.intent import (
    FewShotProtocol,
    IntentData,
    IntentEvaluator,
    sample_few_shot_split,
    train_linear_probes,
)

LABELS = ["a"] * 12 + ["b"] * 7 + ["c"] * 30  # class b has fewer than 2K examples at K = 5


def test_sampler_counts_per_class_and_disjointness():
    split = sample_few_shot_split(LABELS, shots=5, seed=0)
    labels = np.array(LABELS)
    train_counts = {c: int((labels[split.train] == c).sum()) for c in "abc"}
    valid_counts = {c: int((labels[split.valid] == c).sum()) for c in "abc"}
    assert train_counts == {"a": 5, "b": 5, "c": 5}
    assert valid_counts == {"a": 5, "b": 2, "c": 5}  # b keeps K for training, the rest validates
    assert split.short_classes == 1
    assert not set(split.train) & set(split.valid)


def test_sampler_is_deterministic_per_seed_and_varies_across_seeds():
    first = sample_few_shot_split(LABELS, shots=5, seed=3)
    again = sample_few_shot_split(LABELS, shots=5, seed=3)
    other = sample_few_shot_split(LABELS, shots=5, seed=4)
    np.testing.assert_array_equal(first.train, again.train)
    np.testing.assert_array_equal(first.valid, again.valid)
    assert not np.array_equal(first.train, other.train)


def test_sampler_rejects_classes_too_small():
    with pytest.raises(ValueError, match="class 'b' has 7 examples, too few for 7-shot"):
        sample_few_shot_split(LABELS, shots=7, seed=0)


def _blobs(n_per_class: int, n_classes: int, dim: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Points around fixed class centres (the same for every seed), labels (n,)."""
    centres = torch.randn(n_classes, dim, generator=torch.Generator().manual_seed(1234)) * 3
    gen = torch.Generator().manual_seed(seed)
    labels = torch.arange(n_classes).repeat_interleave(n_per_class)
    return centres[labels] + 0.1 * torch.randn(len(labels), dim, generator=gen), labels


def test_batched_probes_match_probes_trained_alone():
    protocol = FewShotProtocol(shots=(4,), splits=3, learning_rate=1e-2, batch_size=5, iterations=30, eval_every=10)
    train_x, train_y = _blobs(4, 3, 8, seed=0)  # N = 12: epochs end on a short batch of 2
    valid_x, valid_y = _blobs(2, 3, 8, seed=1)
    test_x, test_y = _blobs(5, 3, 8, seed=2)
    seeds = [11, 12, 13]
    stacked = train_linear_probes(
        torch.stack([train_x, train_x.flip(0), train_x]),
        torch.stack([train_y, train_y.flip(0), train_y]),
        torch.stack([valid_x] * 3),
        torch.stack([valid_y] * 3),
        test_x,
        test_y,
        3,
        seeds,
        protocol,
    )
    for s, (x, y) in enumerate([(train_x, train_y), (train_x.flip(0), train_y.flip(0)), (train_x, train_y)]):
        alone = train_linear_probes(
            x[None], y[None], valid_x[None], valid_y[None], test_x, test_y, 3, [seeds[s]], protocol
        )
        batched, single = stacked[s]["curve"], alone[0]["curve"]
        # same evaluation points, and at each the same validation and test accuracy
        assert [point["iteration"] for point in batched] == [point["iteration"] for point in single]
        for key in ("valid", "test"):
            assert [point[key] for point in batched] == pytest.approx([point[key] for point in single])
        assert stacked[s]["test_accuracy"] == alone[0]["test_accuracy"]


def test_probe_learns_separable_classes_and_reports_best_validation_point():
    protocol = FewShotProtocol(shots=(5,), splits=2, learning_rate=5e-2, batch_size=8, iterations=60, eval_every=20)
    train_x, train_y = _blobs(5, 4, 16, seed=0)
    valid_x, valid_y = _blobs(3, 4, 16, seed=1)
    test_x, test_y = _blobs(10, 4, 16, seed=2)
    runs = train_linear_probes(
        torch.stack([train_x] * 2),
        torch.stack([train_y] * 2),
        torch.stack([valid_x] * 2),
        torch.stack([valid_y] * 2),
        test_x,
        test_y,
        4,
        [0, 1],
        protocol,
    )
    for run in runs:
        assert run["test_accuracy"] == pytest.approx(100.0)
        assert [point["iteration"] for point in run["curve"]] == [20, 40, 60]
        best = max(run["curve"], key=lambda point: point["valid"])  # max() keeps the earliest on ties
        assert run["best_iteration"] == best["iteration"]
        assert run["test_accuracy"] == best["test"]


def test_evaluator_embeds_only_sampled_pool_texts_and_reports_every_k():
    pool_labels = [f"c{i % 3}" for i in range(60)]
    data = IntentData([f"pool {i}" for i in range(60)], pool_labels, ["test 0", "test 1", "test 2"], ["c0", "c1", "c2"])
    protocol = FewShotProtocol(shots=(2, 3), splits=2, learning_rate=1e-1, batch_size=4, iterations=20, eval_every=10)
    evaluator = IntentEvaluator({"toy": data}, protocol=protocol)
    texts = evaluator.texts()
    assert {"test 0", "test 1", "test 2"} <= texts and len(texts) < 63  # unsampled pool texts are not embedded

    # embeddings that encode the class directly: every probe reaches 100 %
    def encode(batch):
        return np.array([np.eye(3)[int(t.split()[1]) % 3] for t in batch], dtype=np.float32)

    results = evaluator.evaluate(encode)
    assert [r.variant for r in results] == ["2-shot", "3-shot"]
    for result in results:
        assert result.details["train_per_split"] == 3 * int(result.variant[0])
        assert len(result.details["per_split"]) == 2
        assert result.primary == pytest.approx(100.0)

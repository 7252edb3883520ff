"""Representation analysis of section 4.3: neighbourhoods on categorical data (Figure 2a) and
alignment / uniformity (Wang and Isola, 2020) on STS-B.

Everything is measured on L2-normalised embeddings, so nearest neighbours by Euclidean distance
are nearest by cosine similarity, and distances lie in [0, 2].
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from vascl_scale.eval.sts import StsPair
from vascl_scale.figures import save_figure

NEIGHBOUR_KS = (1, 5, 10, 20, 50, 100)
# SimCSE (Gao et al., 2021, section 6) takes STS-B pairs with gold >= 4 as positives for alignment.
POSITIVE_SCORE = 4.0


def neighbour_statistics(
    embeddings: np.ndarray, labels: Sequence, ks: Sequence[int] = NEIGHBOUR_KS, chunk_size: int = 1024
) -> dict[int, dict[str, float]]:
    """For each K: the share (x 100) of an instance's top-K neighbours (itself excluded) that
    share its class, and its mean distance to them, both averaged over all instances."""
    x = F.normalize(torch.as_tensor(np.asarray(embeddings), dtype=torch.float32), dim=-1)  # (N, d)
    n = x.shape[0]
    k_max = max(ks)
    if min(ks) < 1 or k_max >= n:
        raise ValueError(f"K must be in [1, {n - 1}] for {n} instances; got {list(ks)}")
    _, label_ids = np.unique(np.asarray(labels), return_inverse=True)
    label_ids = torch.from_numpy(label_ids)  # (N,)
    same_sum = torch.zeros(len(ks), dtype=torch.float64)
    distance_sum = torch.zeros(len(ks), dtype=torch.float64)
    for start in range(0, n, chunk_size):
        rows = torch.arange(start, min(start + chunk_size, n))
        similarity = x[rows] @ x.T  # (c, N)
        similarity[torch.arange(len(rows)), rows] = -float("inf")  # an instance is not its own neighbour
        top_similarity, top_index = similarity.topk(k_max, dim=1)  # (c, K_max), nearest first
        distance = (2.0 - 2.0 * top_similarity).clamp_min(0.0).sqrt()  # unit vectors: |a-b|^2 = 2 - 2 cos
        same = (label_ids[top_index] == label_ids[rows, None]).double()  # (c, K_max)
        for i, k in enumerate(ks):
            same_sum[i] += same[:, :k].mean(dim=1).sum()
            distance_sum[i] += distance[:, :k].double().mean(dim=1).sum()
    return {
        k: {"same_class": float(same_sum[i] / n * 100.0), "distance": float(distance_sum[i] / n)}
        for i, k in enumerate(ks)
    }


def alignment(first: np.ndarray, second: np.ndarray, alpha: float = 2.0) -> float:
    """E ||f(x) - f(y)||^alpha over positive pairs, on normalised embeddings (lower: closer)."""
    a = F.normalize(torch.as_tensor(np.asarray(first), dtype=torch.float64), dim=-1)
    b = F.normalize(torch.as_tensor(np.asarray(second), dtype=torch.float64), dim=-1)
    return float((a - b).norm(dim=1).pow(alpha).mean())


def uniformity(embeddings: np.ndarray, t: float = 2.0) -> float:
    """log E exp(-t ||f(x) - f(y)||^2) over distinct pairs, normalised (lower: more uniform)."""
    x = F.normalize(torch.as_tensor(np.asarray(embeddings), dtype=torch.float64), dim=-1)
    if x.shape[0] < 2:
        raise ValueError("uniformity needs at least two embeddings")
    return float(torch.pdist(x).pow(2).mul(-t).exp().mean().log())


def alignment_uniformity(encode, pairs: Sequence[StsPair], positive_score: float = POSITIVE_SCORE) -> dict[str, float]:
    """Alignment over pairs with gold >= ``positive_score``; uniformity over all their sentences."""
    positives = [p for p in pairs if p.score >= positive_score]
    if not positives:
        raise ValueError(f"no STS pair has a score >= {positive_score}; cannot measure alignment")
    sentences = list(dict.fromkeys(text for p in pairs for text in (p.sentence1, p.sentence2)))
    return {
        "alignment": alignment(encode([p.sentence1 for p in positives]), encode([p.sentence2 for p in positives])),
        "uniformity": uniformity(encode(sentences)),
        "positive_pairs": len(positives),
        "sentences": len(sentences),
    }


def plot_neighbours(
    statistics: Mapping[str, Mapping[int, Mapping[str, float]]], path: str | Path, dataset: str
) -> Path:
    """Figure 2a: same-class share and mean distance against K, one line per model."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers
    import matplotlib.pyplot as plt

    figure, (share_axis, distance_axis) = plt.subplots(1, 2, figsize=(10, 4))
    for name, by_k in statistics.items():
        ks = sorted(by_k)
        share_axis.plot(ks, [by_k[k]["same_class"] for k in ks], marker="o", label=name)
        distance_axis.plot(ks, [by_k[k]["distance"] for k in ks], marker="o", label=name)
    all_ks = sorted({k for by_k in statistics.values() for k in by_k})
    for axis, label in ((share_axis, "same-class neighbours (%)"), (distance_axis, "mean distance to neighbours")):
        axis.set_xscale("log")
        axis.set_xticks(all_ks, [str(k) for k in all_ks])
        axis.set_xlabel("top-K neighbours")
        axis.set_ylabel(label)
        axis.grid(True, alpha=0.3)
    share_axis.legend()
    figure.suptitle(f"Neighbourhoods on {dataset} (L2-normalised embeddings)")
    figure.tight_layout()
    return save_figure(figure, path)

"""Instance-discrimination maths shared by SimCSE (Eq. 1; supervised, Eq. 5 of Gao et al.) and VaSCL (Eq. 2 and 5).

Pure tensor maths: no ranks, no communication. Callers pass the anchors held by this
process and the candidates they are scored against (the gathered global batch), with
integer indices into the candidates. Logits are formed and reduced in float32 or wider,
outside autocast, whatever the dtype of the features.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor


@contextmanager
def full_precision(reference: Tensor) -> Iterator[torch.dtype]:
    """Disable autocast and yield the dtype logits use: float32, or float64 for float64 input."""
    dtype = torch.promote_types(reference.dtype, torch.float32)
    with torch.autocast(device_type=reference.device.type, enabled=False):
        yield dtype


def check_features(name_a: str, a: Tensor, name_b: str, b: Tensor) -> None:
    """Both (B, D), same shape, at least one row."""
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(
            f"{name_a} and {name_b} must be 2-D (batch, dim); got shapes {tuple(a.shape)} and {tuple(b.shape)}"
        )
    if a.shape != b.shape:
        raise ValueError(
            f"{name_a} and {name_b} must have the same shape (one row per sentence in each view); "
            f"got {tuple(a.shape)} and {tuple(b.shape)}"
        )
    if a.shape[0] < 1:
        raise ValueError(f"{name_a} and {name_b} hold no rows; pass at least one sentence per rank")


# Logits of more than this many elements (A x C; 64 MiB in float32) are formed a block of
# anchor rows at a time, each block recomputed in the backward (activation checkpointing), so
# that the loss's memory does not grow with the square of the global batch. Smaller ones (every
# batch up to a few thousand sentences per rank) take the one-matrix path.
LOGITS_BLOCK_ELEMENTS = 1 << 24


def _masked_logits(
    anchors: Tensor,
    candidates: Tensor,
    self_index: Tensor | None,
    temperature: float,
    dtype: torch.dtype,
    weighted_index: Tensor | None = None,
    weight: float = 0.0,
    excluded: Tensor | None = None,
) -> Tensor:
    """sim / tau (A, C) in ``dtype``, each anchor's own column (``self_index``) and its
    ``excluded`` cells (A, C) (false negatives) at -inf, and ``weight`` added to its
    ``weighted_index`` columns (supervised SimCSE's hard negatives)."""
    logits = anchors.to(dtype) @ candidates.to(dtype).T / temperature  # (A, C)
    rows = torch.arange(anchors.shape[0], device=anchors.device)
    if weighted_index is not None and weight != 0.0:
        assert weighted_index.dim() == 2, weighted_index.shape  # (A, k): k distinct columns per anchor
        cells = (rows[:, None], weighted_index)  # (A, 1) broadcast against (A, k)
        logits = logits.index_put(cells, logits[cells] + weight)  # out of place: autograd
    if self_index is None and excluded is None:
        return logits
    removed = torch.zeros_like(logits, dtype=torch.bool) if excluded is None else excluded.clone()
    if self_index is not None:
        removed[rows, self_index] = True
    return logits.masked_fill(removed, float("-inf"))


def _nt_xent_block_sum(
    anchors: Tensor,
    candidates: Tensor,
    positive_index: Tensor,
    self_index: Tensor | None,
    temperature: float,
    weighted_index: Tensor | None,
    weight: float,
    excluded: Tensor | None,
) -> Tensor:
    """NT-Xent summed over one block of anchors (a, D) against all candidates (C, D)."""
    with full_precision(anchors) as dtype:
        logits = _masked_logits(
            anchors, candidates, self_index, temperature, dtype, weighted_index, weight, excluded
        )  # (a, C)
        return F.cross_entropy(logits, positive_index, reduction="sum")


def nt_xent(
    anchors: Tensor,
    candidates: Tensor,
    positive_index: Tensor,
    self_index: Tensor | None,
    temperature: float,
    weighted_index: Tensor | None = None,
    weight: float = 0.0,
    excluded: Tensor | None = None,
) -> Tensor:
    """Mean NT-Xent over anchors; each anchor's own column is removed from its candidates.

    anchors (A, D) and candidates (C, D) are L2-normalised, so the dot product is the cosine
    of Eq. 1. positive_index (A,) and self_index (A,) index candidates. Returns a scalar:
    mean over the A anchors of -log softmax(sim / tau)[positive], with the anchor itself
    masked out (the 2M - 1 candidates of Eq. 1 when C is the 2M features of the batch).
    ``self_index`` None: the anchors are not among the candidates (supervised SimCSE), nothing
    is masked. ``weighted_index`` (A, k): k distinct columns per anchor whose logits get
    ``weight`` added (log space: their exponentials are scaled by e^weight; SimCSE's
    hard_negative_weight on an anchor's own hard negatives). ``excluded`` (A, C) bool: cells
    removed from the softmax like the anchor's own column (false negatives,
    :mod:`vascl_scale.losses.false_negatives`); never an anchor's positive.
    Past :data:`LOGITS_BLOCK_ELEMENTS` logits, blocks of anchor rows are summed and divided
    by A: the same value and gradient, with one block's logits alive at a time.
    """
    rows, columns = anchors.shape[0], candidates.shape[0]
    if rows * columns <= LOGITS_BLOCK_ELEMENTS:
        with full_precision(anchors) as dtype:
            logits = _masked_logits(
                anchors, candidates, self_index, temperature, dtype, weighted_index, weight, excluded
            )  # (A, C)
            return F.cross_entropy(logits, positive_index)
    from torch.utils.checkpoint import checkpoint

    def block(index: Tensor | None, start: int, stop: int) -> Tensor | None:
        return None if index is None else index[start:stop]

    size = max(1, LOGITS_BLOCK_ELEMENTS // columns)
    total = sum(
        checkpoint(
            _nt_xent_block_sum,
            anchors[start : start + size],
            candidates,
            positive_index[start : start + size],
            block(self_index, start, start + size),
            temperature,
            block(weighted_index, start, start + size),
            weight,
            block(excluded, start, start + size),
            use_reentrant=False,
        )
        for start in range(0, rows, size)
    )
    return total / rows


def cosines(anchors: Tensor, candidates: Tensor) -> Tensor:
    """(A, C) similarities of L2-normalised (A, D) and (C, D) rows, without gradient, in float32
    or wider (the scores a false-negative margin reads)."""
    with torch.no_grad(), full_precision(anchors) as dtype:
        return anchors.detach().to(dtype) @ candidates.detach().to(dtype).T


def neighbourhood_nll(anchor: Tensor, positive: Tensor, negatives: Tensor, temperature: float) -> Tensor:
    """Per-anchor -log p(positive) against its own negatives (Eq. 2; Eq. 5 per direction).

    anchor (B, D), positive (B, D), negatives (B, M, D), all L2-normalised -> (B,).
    """
    with full_precision(anchor) as dtype:
        anchor, positive, negatives = anchor.to(dtype), positive.to(dtype), negatives.to(dtype)
        positive_logit = (anchor * positive).sum(dim=-1, keepdim=True)  # (B, 1)
        negative_logits = torch.einsum("bd,bmd->bm", anchor, negatives)  # (B, M)
        logits = torch.cat([positive_logit, negative_logits], dim=1) / temperature  # (B, 1 + M)
        return torch.logsumexp(logits, dim=1) - logits[:, 0]

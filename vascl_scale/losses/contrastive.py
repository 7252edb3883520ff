"""Instance-discrimination maths shared by SimCSE (Eq. 1) and VaSCL (Eq. 2 and 5).

Pure tensor maths: no ranks, no communication. Callers pass the anchors held by this
process and the candidates they are scored against (the gathered global batch), with
integer indices into the candidates. Logits are formed and reduced in float32 or wider,
outside autocast, whatever the dtype of the features.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

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


def nt_xent(
    anchors: Tensor,
    candidates: Tensor,
    positive_index: Tensor,
    self_index: Tensor,
    temperature: float,
) -> Tensor:
    """Mean NT-Xent over anchors; each anchor's own column is removed from its candidates.

    anchors (A, D) and candidates (C, D) are L2-normalised, so the dot product is the cosine
    of Eq. 1. positive_index (A,) and self_index (A,) index candidates. Returns a scalar:
    mean over the A anchors of -log softmax(sim / tau)[positive], with the anchor itself
    masked out (the 2M - 1 candidates of Eq. 1 when C is the 2M features of the batch).
    """
    with full_precision(anchors) as dtype:
        logits = anchors.to(dtype) @ candidates.to(dtype).T / temperature  # (A, C)
        rows = torch.arange(anchors.shape[0], device=anchors.device)
        is_self = torch.zeros_like(logits, dtype=torch.bool)
        is_self[rows, self_index] = True
        logits = logits.masked_fill(is_self, float("-inf"))
        return F.cross_entropy(logits, positive_index)


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

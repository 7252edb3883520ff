"""SimCSE's objective (Eq. 1 of the VaSCL paper in both directions) over the global batch."""

from __future__ import annotations

import torch
from torch import Tensor

from vascl_scale import distributed
from vascl_scale.losses.contrastive import check_features, nt_xent
from vascl_scale.losses.rules import check_temperature


def simcse_indices(rows: int, rank: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Candidate indices of this rank's 2b anchors in the gathered ``cat(z1, z2)`` blocks.

    Each rank contributes one block of 2b rows, [z1 (b); z2 (b)], so the gathered
    candidates are (W * 2b, D) laid out as :func:`vascl_scale.distributed.block_row` says.
    Anchor order is [z1; z2] of this rank. Returns (positive_index, self_index), both (2b,).
    """
    local = torch.arange(rows, device=device)
    view1 = distributed.block_row(rank, 0, local, 2, rows)  # (b,)
    view2 = distributed.block_row(rank, 1, local, 2, rows)  # (b,)
    positive_index = torch.cat([view2, view1])
    self_index = torch.cat([view1, view2])
    return positive_index, self_index


def simcse_from_gathered(local: Tensor, gathered: Tensor, rank: int, temperature: float) -> Tensor:
    """Eq. 1 for this rank's anchors ``local = cat(z1, z2)`` (2b, D) against ``gathered`` (W*2b, D)."""
    rows = local.shape[0] // 2
    positive_index, self_index = simcse_indices(rows, rank, local.device)
    return nt_xent(local, gathered, positive_index, self_index, temperature)


def simcse_loss(z1: Tensor, z2: Tensor, temperature: float = 0.05) -> Tensor:
    """SimCSE / NT-Xent loss of the two dropout views, mean over the 2B anchors.

    z1, z2: (b, D) L2-normalised features of the same b sentences on this rank. Every
    anchor (2B of them over the global batch of B sentences) is scored against the 2B - 2
    features of the other sentences and its positive (the other view of its sentence);
    both directions of Eq. 1. Under torch.distributed with W > 1 the candidates are
    all-gathered with gradient (see :mod:`vascl_scale.distributed`): the mean over ranks of
    the returned value equals the single-process loss on the concatenated batch.
    """
    check_features("z1", z1, "z2", z2)
    check_temperature(temperature)
    rank, _ = distributed.world()
    distributed.require_equal_rows(z1.shape[0])
    local = torch.cat([z1, z2], dim=0)  # (2b, D)
    gathered = distributed.all_gather_with_grad(local)  # (W * 2b, D)
    return simcse_from_gathered(local, gathered, rank, temperature)

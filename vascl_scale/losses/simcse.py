"""SimCSE's objectives over the global batch: unsupervised (Eq. 1 of the VaSCL paper in both
directions) and supervised with hard negatives (Gao et al. 2021, Eq. 5)."""

from __future__ import annotations

import torch
from torch import Tensor

from vascl_scale import distributed
from vascl_scale.losses.contrastive import check_features, nt_xent
from vascl_scale.losses.rules import check_hard_negative_weight, check_temperature


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


def simcse_sup_indices(rows: int, rank: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Candidate indices of this rank's b anchors in the gathered ``cat(z_positive, z_negative)`` blocks.

    Each rank contributes one block of 2b candidate rows, [positives (b); hard negatives (b)],
    so the gathered candidates are (W * 2b, D) laid out as :func:`vascl_scale.distributed.block_row`
    says. Returns (positive_index, hard_negative_index), both (b,): anchor i's own positive
    and its own hard negative.
    """
    local = torch.arange(rows, device=device)
    positive_index = distributed.block_row(rank, 0, local, 2, rows)  # (b,)
    hard_negative_index = distributed.block_row(rank, 1, local, 2, rows)  # (b,)
    return positive_index, hard_negative_index


def simcse_sup_loss(
    z_anchor: Tensor, z_positive: Tensor, z_negative: Tensor, temperature: float = 0.05, hard_negative_weight: float = 0.0
) -> Tensor:
    """Supervised SimCSE (Gao et al. 2021, Eq. 5), mean over the B anchors of the global batch.

    z_anchor, z_positive, z_negative: (b, D) L2-normalised features of this rank's b triplets
    (h_i, h_i^+, h_i^-). Anchor i is scored against every positive and every hard negative of
    the global batch (2B candidates; anchors are not candidates):

        l_i = -log e^{sim(h_i, h_i^+) / tau}
              / sum_j (e^{sim(h_i, h_j^+) / tau} + e^{sim(h_i, h_j^-) / tau + alpha [i = j]})

    alpha = ``hard_negative_weight``, added in log space to the logit of the anchor's own hard
    negative only, as ``cl_forward`` in princeton-nlp/SimCSE adds its ``hard_negative_weight``
    to the diagonal of the hard-negative block (0: Eq. 5 as printed). Under torch.distributed
    with W > 1 the candidates are all-gathered with gradient, one block per rank: the mean over
    ranks of the returned value (what DDP's gradient averaging takes) equals the
    single-process loss on the concatenated batch, as for :func:`simcse_loss`.
    """
    check_features("z_anchor", z_anchor, "z_positive", z_positive)
    check_features("z_anchor", z_anchor, "z_negative", z_negative)
    check_temperature(temperature)
    check_hard_negative_weight(hard_negative_weight)
    rank, _ = distributed.world()
    rows = z_anchor.shape[0]
    distributed.require_equal_rows(rows)
    candidates = distributed.all_gather_with_grad(torch.cat([z_positive, z_negative], dim=0))  # (2b, D) -> (W * 2b, D)
    positive_index, hard_negative_index = simcse_sup_indices(rows, rank, z_anchor.device)
    return nt_xent(z_anchor, candidates, positive_index, None, temperature, hard_negative_index, hard_negative_weight)

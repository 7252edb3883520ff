"""SimCSE's objectives over the global batch: unsupervised (Eq. 1 of the VaSCL paper in both
directions) and supervised with hard negatives (Gao et al. 2021, Eq. 5)."""

from __future__ import annotations

import torch
from torch import Tensor

from vascl_scale import distributed
from vascl_scale.losses.contrastive import check_features, nt_xent
from vascl_scale.losses.false_negatives import FalseNegatives, objective_mask
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


def simcse_from_gathered(
    local: Tensor, gathered: Tensor, rank: int, temperature: float, false_negatives: FalseNegatives | None = None
) -> tuple[Tensor, Tensor | None]:
    """Eq. 1 for this rank's anchors ``local = cat(z1, z2)`` (2b, D) against ``gathered`` (W*2b, D).

    Returns (the loss, the (2b, W 2b) mask of false negatives removed, None without
    ``false_negatives``, whose evidence is that of the two views, in order)."""
    rows = local.shape[0] // 2
    positive_index, self_index = simcse_indices(rows, rank, local.device)
    masked = objective_mask(false_negatives, local, gathered, [0, 1], [0, 1], positive_index, self_index)
    return nt_xent(local, gathered, positive_index, self_index, temperature, excluded=masked), masked


def simcse_loss(
    z1: Tensor,
    z2: Tensor,
    temperature: float = 0.05,
    *,
    check_rows: bool = True,
    false_negatives: FalseNegatives | None = None,
) -> Tensor:
    """SimCSE / NT-Xent loss of the two dropout views, mean over the 2B anchors.

    z1, z2: (b, D) L2-normalised features of the same b sentences on this rank. Every
    anchor (2B of them over the global batch of B sentences) is scored against the 2B - 2
    features of the other sentences and its positive (the other view of its sentence);
    both directions of Eq. 1. Under torch.distributed with W > 1 the candidates are
    all-gathered with gradient (see :mod:`vascl_scale.distributed`): the mean over ranks of
    the returned value equals the single-process loss on the concatenated batch.
    ``false_negatives``: candidates removed from each anchor's softmax
    (:mod:`vascl_scale.losses.false_negatives`; its evidence per view, (z1, z2)).
    """
    return simcse_loss_and_mask(z1, z2, temperature, check_rows=check_rows, false_negatives=false_negatives)[0]


def simcse_loss_and_mask(
    z1: Tensor,
    z2: Tensor,
    temperature: float = 0.05,
    *,
    check_rows: bool = True,
    false_negatives: FalseNegatives | None = None,
) -> tuple[Tensor, Tensor | None]:
    """:func:`simcse_loss` and the (2b, W 2b) mask of the false negatives it removed (or None)."""
    check_features("z1", z1, "z2", z2)
    check_temperature(temperature)
    rank, _ = distributed.world()
    if check_rows:
        distributed.require_equal_rows(z1.shape[0])
    local = torch.cat([z1, z2], dim=0)  # (2b, D)
    gathered = distributed.all_gather_with_grad(local)  # (W * 2b, D)
    return simcse_from_gathered(local, gathered, rank, temperature, false_negatives)


def simcse_sup_indices(rows: int, negatives: int, rank: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Candidate indices of this rank's b anchors in the gathered ``cat(z_positive, z_negative_0, ...)`` blocks.

    Each rank contributes one block of (1 + N) b candidate rows, [positives (b); hard negatives 0
    (b); ...; hard negatives N - 1 (b)], so the gathered candidates are (W (1 + N) b, D) laid out
    as :func:`vascl_scale.distributed.block_row` says (view 0 the positives, view 1 + j hard
    negative j). Returns (positive_index (b,), hard_negative_index (b, N)): anchor i's own
    positive and its own N hard negatives.
    """
    local = torch.arange(rows, device=device)
    views = 1 + negatives
    positive_index = distributed.block_row(rank, 0, local, views, rows)  # (b,)
    hard_negative_index = torch.stack(
        [distributed.block_row(rank, 1 + j, local, views, rows) for j in range(negatives)], dim=1
    )  # (b, N)
    return positive_index, hard_negative_index


def simcse_sup_loss(
    z_anchor: Tensor,
    z_positive: Tensor,
    *z_negatives: Tensor,
    temperature: float = 0.05,
    hard_negative_weight: float = 0.0,
    check_rows: bool = True,
    false_negatives: FalseNegatives | None = None,
) -> Tensor:
    """Supervised SimCSE (Gao et al. 2021, Eq. 5) with N >= 1 hard negatives per anchor, mean
    over the B anchors of the global batch.

    z_anchor, z_positive and each of the N ``z_negatives``: (b, D) L2-normalised features of this
    rank's b tuples (h_i, h_i^+, h_i^{-,1}, ..., h_i^{-,N}; N = 1 is SimCSE's NLI triplets, N > 1
    the n-tuples of sentence-transformers' MultipleNegativesRankingLoss). Anchor i is scored
    against every positive and every hard negative of the global batch ((1 + N) B candidates;
    anchors are not candidates):

        l_i = -log e^{sim(h_i, h_i^+) / tau}
              / sum_j (e^{sim(h_i, h_j^+) / tau} + sum_n e^{sim(h_i, h_j^{-,n}) / tau + alpha [i = j]})

    alpha = ``hard_negative_weight``, added in log space to the logits of the anchor's own hard
    negatives only, all N of them, as ``cl_forward`` in princeton-nlp/SimCSE adds its
    ``hard_negative_weight`` to the diagonal of its one hard-negative block (0: Eq. 5 as
    printed). Under torch.distributed with W > 1 the candidates are all-gathered with gradient
    in one gather of one block per rank: the mean over ranks of the returned value (what DDP's
    gradient averaging takes) equals the single-process loss on the concatenated batch, as for
    :func:`simcse_loss`. ``false_negatives``: candidates removed from the sum (an anchor's own
    hard negative among them, where it repeats the anchor or its positive: mined too close;
    :mod:`vascl_scale.losses.false_negatives`, its evidence per view in this order).
    """
    return simcse_sup_loss_and_mask(
        z_anchor,
        z_positive,
        *z_negatives,
        temperature=temperature,
        hard_negative_weight=hard_negative_weight,
        check_rows=check_rows,
        false_negatives=false_negatives,
    )[0]


def simcse_sup_loss_and_mask(
    z_anchor: Tensor,
    z_positive: Tensor,
    *z_negatives: Tensor,
    temperature: float = 0.05,
    hard_negative_weight: float = 0.0,
    check_rows: bool = True,
    false_negatives: FalseNegatives | None = None,
) -> tuple[Tensor, Tensor | None]:
    """:func:`simcse_sup_loss` and the (b, W (1 + N) b) mask of the false negatives it removed (or None)."""
    if not z_negatives:
        raise ValueError("supervised SimCSE needs at least one hard negative per anchor (z_negatives); got none")
    check_features("z_anchor", z_anchor, "z_positive", z_positive)
    for index, z_negative in enumerate(z_negatives):
        check_features("z_anchor", z_anchor, f"z_negatives[{index}]", z_negative)
    check_temperature(temperature)
    check_hard_negative_weight(hard_negative_weight)
    rank, _ = distributed.world()
    rows = z_anchor.shape[0]
    if check_rows:
        distributed.require_equal_rows(rows)
    local = torch.cat([z_positive, *z_negatives], dim=0)  # ((1 + N) b, D), view-major as block_row reads it
    candidates = distributed.all_gather_with_grad(local)  # (W (1 + N) b, D)
    positive_index, hard_negative_index = simcse_sup_indices(rows, len(z_negatives), rank, z_anchor.device)
    candidate_views = list(range(1, 2 + len(z_negatives)))  # the positives, then each hard-negative column
    masked = objective_mask(false_negatives, z_anchor, candidates, [0], candidate_views, positive_index, None)
    loss = nt_xent(
        z_anchor,
        candidates,
        positive_index,
        None,
        temperature,
        hard_negative_index,
        hard_negative_weight,
        excluded=masked,
    )
    return loss, masked

"""PairSupCon (Zhang et al., EMNLP 2021) over the global batch, as the authors' code computes it.

Written from ``PairSupCon/`` in amazon-research/sentence-representations: ``HardConLoss``
(``utils/contrastive_utils.py``), the classification head (``models/Transformers.py``) and the
sum of the two (``training.py``). A batch holds B labelled pairs (text1, text2, pairsimi); e1,
e2 (B, d) are their mean-pooled embeddings, z1, z2 = normalise(h(e1)), normalise(h(e2)) and
y_i in {0, 1} the labels.

Instance discrimination (``HardConLoss``). The 2B features [z1; z2] are the anchors and the
candidates alike. Anchor a, either text of pair i, has the other text of pair i as its
positive, s_a+ = z1_i . z2_i / tau, and the 2B - 2 features of the other pairs as its
negatives, s_aj = z_a . z_j / tau:

    l_a = -log( e^{s_a+} / (e^{s_a+} + N_a) )
    orig      N_a = sum_j e^{s_aj}
    hardneg   N_a = sum_j w_aj e^{s_aj},  w_aj = e^{s_aj} / mean_j e^{s_aj}
                  = (2B - 2) sum_j e^{2 s_aj} / sum_j e^{s_aj}

The authors' weights ``negimp = neg.log().exp()`` are e^{s_aj} themselves and are NOT detached,
so they carry gradient: N_a is differentiated as the function above, and so it is here (in log
space, with logsumexp: the same function, hence the same gradient, without overflow). Only the
anchors of label-1 pairs count (``posmask``): L_inst = sum_{a: y = 1} l_a / P, P the number of
such anchors in the global batch (2 per positive pair); the features of label-0 pairs are
still negatives of every anchor.

Pairwise classification: logits = C([e1, e2, |e1 - e2|]) with C = Linear(3d, 2, no bias)
(:class:`vascl_scale.model.PairClassifier`) on the embeddings before the head, cross-entropy
against y, mean over all B pairs. The objective is beta * L_inst + L_cls (``training.py``:
``loss = self.beta * instdisc_loss; loss += classify_loss``).

Distributed: each rank holds b = B / W pairs; the candidates are all-gathered with gradient,
one block [z1; z2] per rank, so a rank's anchors meet the negatives of every rank. The rank's
value is W times its share of the global loss (its anchors' sum over the all-reduced P; its
pairs' cross-entropy mean), so that the mean over ranks, what DDP and ZeRO average the
gradients with, is the single-process loss on the concatenated batch. A global batch without
any positive pair has L_inst = 0 (P is taken as 1; the authors' code divides 0 by 0 there).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from vascl_scale import distributed
from vascl_scale.losses.contrastive import check_features, full_precision
from vascl_scale.losses.false_negatives import FalseNegatives, objective_mask
from vascl_scale.losses.rules import check_contrast_type, check_temperature


def check_labels(labels: Tensor, rows: int) -> None:
    """One integer label per pair: (b,)."""
    if labels.shape != (rows,) or labels.dtype.is_floating_point:
        raise ValueError(
            f"labels must hold one integer per pair, shape ({rows},); got {labels.dtype} of shape {tuple(labels.shape)}"
        )


def hard_contrastive_loss(
    z1: Tensor,
    z2: Tensor,
    labels: Tensor,
    temperature: float = 0.05,
    contrast_type: str = "hardneg",
    *,
    check_rows: bool = True,
    false_negatives: FalseNegatives | None = None,
) -> Tensor:
    """The authors' ``HardConLoss`` over the global batch (module docstring), this rank's value.

    z1, z2: (b, D) L2-normalised features of the two texts of this rank's b pairs; labels (b,)
    their labels, 1 for the pairs whose two texts are positives of each other. Returns W times
    this rank's anchors' share of L_inst, so that the mean over ranks is L_inst of the global batch.
    ``false_negatives`` (:mod:`vascl_scale.losses.false_negatives`, its evidence per view, (z1,
    z2)): candidates removed from N_a; under "hardneg" the mean weight is over the rest.
    """
    return hard_contrastive_loss_and_mask(
        z1, z2, labels, temperature, contrast_type, check_rows=check_rows, false_negatives=false_negatives
    )[0]


def hard_contrastive_loss_and_mask(
    z1: Tensor,
    z2: Tensor,
    labels: Tensor,
    temperature: float = 0.05,
    contrast_type: str = "hardneg",
    *,
    check_rows: bool = True,
    false_negatives: FalseNegatives | None = None,
) -> tuple[Tensor, Tensor | None]:
    """:func:`hard_contrastive_loss` and the (2b, W 2b) mask of the false negatives it removed (or None)."""
    check_features("z1", z1, "z2", z2)
    check_temperature(temperature)
    check_contrast_type(contrast_type)
    rows = z1.shape[0]
    check_labels(labels, rows)
    rank, world_size = distributed.world()
    if check_rows:
        distributed.require_equal_rows(rows)
    local = torch.cat([z1, z2])  # (2b, D): this rank's anchors, [z1; z2]
    candidates = distributed.all_gather_with_grad(local)  # (W 2b, D), laid out as distributed.block_row says
    if candidates.shape[0] <= 2:
        raise ValueError(
            "PairSupCon needs at least 2 pairs in the global batch: an anchor's negatives are the other pairs"
        )
    own = torch.arange(rows, device=z1.device)
    first, second = (
        distributed.block_row(rank, 0, own, 2, rows),
        distributed.block_row(rank, 1, own, 2, rows),
    )  # (b,) each
    self_index, partner_index = (
        torch.cat([first, second]),
        torch.cat([second, first]),
    )  # (2b,): each anchor's own row, its pair's
    is_anchor = torch.cat([labels == 1, labels == 1])  # (2b,): the authors' posmask
    masked = objective_mask(false_negatives, local, candidates, [0, 1], [0, 1], partner_index, self_index)
    with full_precision(local) as dtype:
        positive = (z1.to(dtype) * z2.to(dtype)).sum(dim=-1) / temperature  # (b,) s_i+
        positive = torch.cat([positive, positive])  # (2b,): both texts of a pair share it
        logits = local.to(dtype) @ candidates.to(dtype).T / temperature  # (2b, W 2b)
        anchors = torch.arange(2 * rows, device=z1.device)
        not_negative = torch.zeros_like(logits, dtype=torch.bool) if masked is None else masked.clone()
        not_negative[anchors, self_index] = True
        not_negative[anchors, partner_index] = True
        negatives = logits.masked_fill(not_negative, float("-inf"))  # (2b, W 2b): the 2B - 2 negatives per row
        log_sum = torch.logsumexp(negatives, dim=1)  # (2b,) log sum_j e^{s_aj}
        if (
            contrast_type == "hardneg"
        ):  # log N_a = log (2B - 2) + log sum_j e^{2 s_aj} - log sum_j e^{s_aj}, weights not detached
            if masked is None:
                count = torch.full_like(log_sum, math.log(candidates.shape[0] - 2))
            else:  # each row's own number of negatives left, at least one (else N_a = 0 below)
                count = (~not_negative).sum(dim=1).clamp_min(1).to(dtype).log()  # (2b,)
            log_negatives = count + torch.logsumexp(2 * negatives, dim=1) - log_sum
            log_negatives = torch.where(torch.isinf(log_sum), log_sum, log_negatives)  # no negative left: N_a = 0
        else:
            log_negatives = log_sum
        per_anchor = torch.logaddexp(positive, log_negatives) - positive  # (2b,) l_a = -log(e^{s+} / (e^{s+} + N_a))
        total = torch.where(is_anchor, per_anchor, torch.zeros_like(per_anchor)).sum()
    positives = distributed.sum_over_ranks(is_anchor.sum())  # P: the label-1 anchors of the global batch
    return world_size * total / positives.clamp_min(1), masked


def pair_classification_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Cross-entropy of the pairwise classifier's logits (b, classes) against the labels (b,),
    mean over this rank's b pairs (the mean over ranks is the global batch's: b pairs on each),
    in float32 or wider."""
    check_labels(labels, logits.shape[0])
    with full_precision(logits) as dtype:
        return F.cross_entropy(logits.to(dtype), labels)

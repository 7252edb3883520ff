"""VaSCL (Zhang et al., Findings of ACL 2022): Eq. 6 over the global batch.

Per step, for the b sentences on this rank (B = W * b over all ranks):

1. z1, z2 = normalise(h(e1)), normalise(h(e2)): features of the two dropout views; the
   SimCSE term is Eq. 1 in both directions over the global batch.
2. N(i): the k nearest neighbours of e1_i among the other B - 1 embeddings of the global
   batch, by raw inner product e1 @ e1.T (the authors' choice; ``similarity="cosine"`` is
   the alternative).
3. Virtual augmentation (Eq. 2-4): a direction d_i starts uniform in [-0.5, 0.5) per
   element, L2-normalised per row; each power iteration replaces it by the gradient g, with
   respect to d only, of the mean over the B sentences of the global batch of Eq. 2 at
   h(e_i + xi * d_i) against the clean features (no gradient) of i (positive) and of N(i)
   (negatives), normalised as the authors' code does (``VaSCL/learners/vat_utils.py``,
   ``_l2_normalize``): g_i / (||g_i|| + 1e-8). delta_i = eps * d_i, so ||delta_i|| = eps, the
   paper's Delta, wherever ||g_i|| >> 1e-8; where Eq. 2 saturates and its gradient nearly
   vanishes, delta_i shrinks with it. Only row i of the mean depends on d_i, so g_i is that row's
   gradient / B on every rank alike. delta is a constant afterwards (Danskin).
   With ``eps_mode="relative"`` (and ``xi_mode``) eps and xi are multiples of the mean
   ||e1|| over the global batch instead; with "relative_instance", of each row's own ||e1_i||.
4. Eq. 5 for anchor i in both directions: (z_i*, z_i) and (z_i, z_i*), each against the
   clean and augmented features of its k neighbours (2k negatives), z_i* = h(e_i + delta_i).
5. Loss = SimCSE mean over the 2B anchors + mean over the 2B anchors of the two Eq. 5
   directions, i.e. Eq. 6.

``detach=True`` (the authors' code): the neighbourhood term uses e1.detach(), and its
clean features carry no gradient, so it trains the head only, through z* = h(e + delta).
``detach=False`` is the paper read literally: gradient also flows through e1, z and z*.

Distributed: each rank scores its own anchors; neighbours, their clean and augmented
features and the SimCSE candidates come from the whole global batch through the gathers
of :mod:`vascl_scale.distributed`. The mean over ranks of the loss equals the single-process
loss of the concatenated batch, and so do averaged parameter gradients. The head is called
the same number of times on every rank (ZeRO-3 gathers its shards per call).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from vascl_scale import distributed
from vascl_scale.losses.contrastive import check_features, full_precision, neighbourhood_nll
from vascl_scale.losses.false_negatives import FalseNegatives
from vascl_scale.losses.rules import check_neighbour_count, check_temperature, check_vascl_settings
from vascl_scale.losses.simcse import simcse_from_gathered

Head = Callable[[Tensor], Tensor]
# A neighbour whose embedding has at least this cosine with the anchor's counts as a
# near-duplicate of it (the share is logged: a neighbourhood of copies teaches nothing).
NEAR_DUPLICATE_COSINE = 0.95
# Added to each row's norm when a direction is normalised, as in the authors' _l2_normalize.
DIRECTION_GUARD = 1e-8


@dataclass
class VaSCLOutput:
    """Everything one VaSCL loss call computed on this rank."""

    loss: Tensor  # scalar: simcse + neighbourhood
    simcse: Tensor  # scalar: Eq. 1 mean over this rank's 2b anchors
    neighbourhood: Tensor  # scalar: Eq. 5 mean over this rank's 2b anchors
    neighbours: Tensor  # (b, k) global row indices of N(i)
    delta: Tensor  # (b, d) the virtual augmentation, ||delta_i|| = eps
    stats: dict[str, float]  # empty unless asked for (with_stats): computing it syncs with the host
    false_negatives: Tensor | None = None  # (2b, W 2b) the SimCSE term's masked candidates, None without masking


def project(head: Head, embeddings: Tensor) -> Tensor:
    """Contrastive features z = L2-normalise(h(e)): (n, d) -> (n, D)."""
    return F.normalize(head(embeddings), dim=-1)


def nearest_neighbours(
    queries: Tensor,
    keys: Tensor,
    k: int,
    query_offset: int,
    similarity: str = "dot",
    excluded: Tensor | None = None,
) -> Tensor:
    """Top-k rows of ``keys`` (B, d) by similarity with ``queries`` (b, d), self excluded.

    ``similarity``: "dot", the raw inner product (the authors' choice: it favours
    neighbours of large norm), or "cosine". Query j is row ``query_offset + j`` of keys, and
    is never its own neighbour. ``excluded`` (b, B) bool: rows ranked after every other (the
    query's false negatives), taken only where fewer than k others remain. Returns (b, k)
    indices into keys, most similar first.
    """
    with torch.no_grad(), full_precision(queries) as dtype:
        queries, keys = queries.to(dtype), keys.to(dtype)
        if similarity == "cosine":
            queries, keys = F.normalize(queries, dim=-1), F.normalize(keys, dim=-1)
        scores = queries @ keys.T  # (b, B)
        if excluded is not None:
            scores = scores.masked_fill(excluded, torch.finfo(dtype).min)
        rows = torch.arange(queries.shape[0], device=queries.device)
        scores[rows, query_offset + rows] = float("-inf")
        return scores.topk(k, dim=1).indices


def _near_duplicate_share(anchors: Tensor, neighbour_embeddings: Tensor) -> Tensor:
    """Share of (anchor, neighbour) pairs with cosine >= NEAR_DUPLICATE_COSINE: (b, d), (b, k, d) -> ()."""
    cosine = F.cosine_similarity(anchors.float()[:, None, :], neighbour_embeddings.float(), dim=-1)  # (b, k)
    return (cosine >= NEAR_DUPLICATE_COSINE).float().mean()


def adversarial_direction(
    embeddings: Tensor,
    head: Head,
    positive: Tensor,
    negatives: Tensor,
    *,
    init_dir: Tensor,
    xi: float | Tensor,
    power_iters: int,
    temperature: float,
    global_rows: int,
) -> Tensor:
    """Direction per row that increases Eq. 2 (power iteration, Eq. 3), as the authors compute it.

    embeddings (b, d) without gradient; positive (b, D) and negatives (b, k, D) are clean
    features without gradient; init_dir (b, d); xi a number or (b, 1), one radius per row;
    ``global_rows`` B, the rows of the global batch the mean of Eq. 2 runs over. Returns (b, d):
    each row g / (||g|| + 1e-8) of the gradient g of that mean, so of norm 1 unless g nearly
    vanishes. Only the direction is differentiated (autograd.grad), so no parameter gradient or
    DDP/ZeRO gradient hook is touched.
    """
    direction = _authors_l2_normalize(init_dir)
    for _ in range(power_iters):
        direction = direction.detach().requires_grad_(True)
        with torch.enable_grad():
            perturbed = project(head, embeddings + xi * direction)  # (b, D)
            # This rank's share of the global mean: sum over its b rows / B.
            nll = neighbourhood_nll(perturbed, positive, negatives, temperature).sum() / global_rows
            (grad,) = torch.autograd.grad(nll, direction)
        direction = _authors_l2_normalize(grad)
    return direction.detach()


def _authors_l2_normalize(rows: Tensor) -> Tensor:
    """(n, d) -> rows / (||row|| + 1e-8): the guard of the authors' ``_l2_normalize``, which
    lets a vanishing gradient give a short direction (``F.normalize`` would stretch it to 1)."""
    return rows / (rows.norm(dim=-1, keepdim=True) + DIRECTION_GUARD)


def _strength(value: float, mode: str, e1: Tensor, global_embeddings: Tensor) -> float | Tensor:
    """A norm (xi or eps) in absolute units: a number, a 0-d tensor ("relative") or (b, 1)
    ("relative_instance").

    "relative" uses the mean ||e|| of the gathered global batch (B, d), which every rank
    holds already, so all ranks agree without another collective.
    """
    if mode == "absolute":
        return value
    wide = torch.promote_types(e1.dtype, torch.float32)
    if mode == "relative":  # a 0-d tensor: no host sync
        return value * global_embeddings.detach().to(wide).norm(dim=-1).mean().to(e1.dtype)
    return value * e1.detach().to(wide).norm(dim=-1, keepdim=True).to(e1.dtype)  # (b, 1)


def vascl_objective(
    e1: Tensor,
    e2: Tensor,
    head: Head,
    *,
    k: int = 16,
    temperature: float = 0.05,
    xi: float = 15.0,
    eps: float = 15.0,
    power_iters: int = 1,
    detach: bool = True,
    init_dir: Tensor | None = None,
    generator: torch.Generator | None = None,
    similarity: str = "dot",
    eps_mode: str = "absolute",
    xi_mode: str = "absolute",
    with_stats: bool = True,
    check_rows: bool = True,
    false_negatives: FalseNegatives | None = None,
) -> VaSCLOutput:
    """Eq. 6 for this rank's slice; see the module docstring. Returns all intermediate results.

    Without ``init_dir`` the initial directions are drawn from ``generator`` for the whole
    global batch, (B, d), and each rank takes its own rows: with the same generator state on
    every rank they do not depend on the number of ranks. ``with_stats=False`` skips the
    float statistics (they sync with the host), e.g. on steps that log nothing.

    ``eps_mode`` / ``xi_mode`` "relative" read eps / xi in units of the mean norm of e1 over
    the global batch (the same number on every rank), so one setting transfers across
    backbones whose embedding norms differ; "relative_instance" in units of each row's own
    ||e1_i|| (so ||delta_i|| / ||e1_i|| = eps for every i); "absolute" is the paper's Delta.
    The norms are constants (no gradient), like Delta itself.

    ``false_negatives`` (:mod:`vascl_scale.losses.false_negatives`, its evidence per view,
    (e1, e2)): the SimCSE term removes them from each anchor's candidates, and the neighbour
    search ranks them last. Eq. 5 scores the anchor against its neighbours as negatives, so a
    copy of the anchor (or of its positive) taken as a neighbour would be pushed away from it:
    the K nearest stay the nearest rows that are not the same text (duplicates) or not scored as
    close as the positive (margin). A masked row is a neighbour only where fewer than k others remain.
    """
    rank, world_size = distributed.world()
    check_features("e1", e1, "e2", e2)
    check_temperature(temperature)
    check_vascl_settings(
        k=k, xi=xi, eps=eps, power_iters=power_iters, similarity=similarity, eps_mode=eps_mode, xi_mode=xi_mode
    )
    rows = e1.shape[0]
    check_neighbour_count(k, rows * world_size)
    if init_dir is not None and init_dir.shape != e1.shape:
        raise ValueError(
            f"init_dir must have the shape of e1 {tuple(e1.shape)} (one direction per local row); "
            f"got {tuple(init_dir.shape)}"
        )
    if check_rows:
        distributed.require_equal_rows(rows)
    offset = rank * rows

    # Both views through the head in one call: z (2b, D) = [z1; z2].
    local_features = project(head, torch.cat([e1, e2], dim=0))
    gathered_features = distributed.all_gather_with_grad(local_features)  # (W * 2b, D)
    simcse, masked = simcse_from_gathered(local_features, gathered_features, rank, temperature, false_negatives)

    # Neighbourhood over the global batch, by raw inner product of the first view.
    anchors = e1.detach() if detach else e1  # (b, d)
    global_embeddings = distributed.all_gather_no_grad(e1)  # (B, d)
    excluded = None
    if masked is not None:  # the first view's anchors against the first view of every global row
        global_rows = torch.arange(rows * world_size, device=e1.device)  # (B,)
        view1_columns = distributed.block_row(global_rows // rows, 0, global_rows % rows, 2, rows)  # (B,)
        excluded = masked[:rows][:, view1_columns]  # (b, B)
    neighbours = nearest_neighbours(e1.detach(), global_embeddings, k, offset, similarity, excluded)  # (b, k) in [0, B)
    xi_abs = _strength(xi, xi_mode, e1, global_embeddings)  # number or (b, 1)
    eps_abs = _strength(eps, eps_mode, e1, global_embeddings)  # number or (b, 1)
    # Global row g is row g % b of rank g // b, whose gathered block is [z1; z2].
    view1_rows = distributed.block_row(neighbours // rows, 0, neighbours % rows, 2, rows)  # (b, k)

    z_clean = local_features[:rows]  # (b, D)
    neighbour_clean = gathered_features[view1_rows]  # (b, k, D)
    if detach:
        z_clean, neighbour_clean = z_clean.detach(), neighbour_clean.detach()

    if init_dir is None:
        draw_device = generator.device if generator is not None else e1.device
        # Drawn in float32 whatever the default dtype, so a seed gives the same draw everywhere;
        # (B, d) for the global batch, this rank's rows kept.
        drawn = torch.rand(
            (rows * world_size, e1.shape[1]), generator=generator, device=draw_device, dtype=torch.float32
        )
        init_dir = drawn[offset : offset + rows].to(e1) - 0.5
    direction = adversarial_direction(
        e1.detach(),
        head,
        local_features[:rows].detach(),
        neighbour_clean.detach(),
        init_dir=init_dir.to(e1),
        xi=xi_abs,
        power_iters=power_iters,
        temperature=temperature,
        global_rows=rows * world_size,
    )
    delta = eps_abs * direction  # (b, d), ||delta_i|| = eps_abs (per row for relative_instance) unless Eq. 2 saturates

    z_aug = project(head, anchors + delta)  # (b, D): z_i* of Eq. 5
    global_aug = distributed.all_gather_with_grad(z_aug)  # (B, D)
    negatives = torch.cat([neighbour_clean, global_aug[neighbours]], dim=1)  # (b, 2k, D)
    aug_to_clean = neighbourhood_nll(z_aug, z_clean, negatives, temperature)  # (b,)
    clean_to_aug = neighbourhood_nll(z_clean, z_aug, negatives, temperature)  # (b,)
    neighbourhood = 0.5 * (aug_to_clean.mean() + clean_to_aug.mean())
    loss = simcse + neighbourhood
    stats = {}
    if with_stats:
        stats = _statistics(
            e1, delta, z_clean, z_aug, global_embeddings, neighbours, offset, loss, simcse, neighbourhood
        )
    return VaSCLOutput(loss, simcse, neighbourhood, neighbours, delta, stats, masked)


def _statistics(
    e1: Tensor,
    delta: Tensor,
    z_clean: Tensor,
    z_aug: Tensor,
    global_embeddings: Tensor,
    neighbours: Tensor,
    offset: int,
    loss: Tensor,
    simcse: Tensor,
    neighbourhood: Tensor,
) -> dict[str, float]:
    """Float diagnostics of one loss call (one host sync); see :func:`vascl_loss` for the names."""
    own_rows = torch.arange(e1.shape[0], device=e1.device)
    with torch.no_grad():
        embedding_norm = e1.detach().float().norm(dim=-1)  # (b,)
        delta_norm = delta.float().norm(dim=-1)  # (b,)
        values = torch.stack(
            [
                loss.detach().float(),
                simcse.detach().float(),
                neighbourhood.detach().float(),
                delta_norm.mean(),
                embedding_norm.mean(),
                (delta_norm / embedding_norm.clamp_min(1e-12)).mean(),
                (z_clean.detach() * z_aug.detach()).sum(-1).float().mean(),
                _near_duplicate_share(e1.detach(), global_embeddings[neighbours]),
                (neighbours == offset + own_rows[:, None]).any().float(),
            ]
        ).tolist()
    *metric_values, self_selected = values
    assert self_selected == 0.0, "an instance was selected as its own neighbour"
    names = (
        "loss",
        "simcse",
        "neighbourhood",
        "delta_norm",
        "embedding_norm",
        "delta_to_embedding",
        "augmentation_cosine",
        "near_duplicate_share",
    )
    return dict(zip(names, metric_values))


def vascl_loss(e1: Tensor, e2: Tensor, head: Head, **settings: Any) -> tuple[Tensor, dict[str, float]]:
    """VaSCL loss (Eq. 6) of this rank's slice and a dict of float statistics.

    e1, e2: (b, d) mean-pooled embeddings of the two dropout views of the same b sentences;
    head: the projection module h; ``settings``: the keywords of :func:`vascl_objective` (``k``,
    ``temperature``, ``xi``, ``eps``, ``power_iters``, ``detach``, ``init_dir``, ``generator``,
    ``similarity``, ``eps_mode``, ``xi_mode``, ``check_rows``), which also returns the neighbours
    and delta themselves. Stats: ``loss``, ``simcse``, ``neighbourhood`` (this rank's terms),
    ``delta_norm`` (mean ||delta||), ``embedding_norm`` (mean ||e1||), ``delta_to_embedding``
    (mean ||delta|| / ||e||), ``augmentation_cosine`` (mean cos(z_i, z_i*)) and
    ``near_duplicate_share`` (share of neighbours with embedding cosine >= 0.95 to their anchor).
    """
    out = vascl_objective(e1, e2, head, with_stats=True, **settings)
    return out.loss, out.stats

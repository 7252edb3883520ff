"""False negatives in the global batch: candidates that are scored as negatives but are not.

The larger the batch, the more of an anchor's in-batch "negatives" repeat its text or its
positive's, or say the same thing in other words; a hard negative mined too close is a
positive. ``loss.false_negatives`` masks them out of every objective with in-batch negatives
(the masked logits are -inf, as the anchor's own column is), over the whole global batch:

- ``duplicates``: a candidate whose text equals the anchor's or the anchor's positive's. Texts
  never leave their rank: the loader carries a 64-bit hash of each row's text
  (:func:`vascl_scale.data.columns.text_hash`), and the hashes are gathered as the features are.
- ``margin``: a candidate that scores above the positive's score minus the margin, GIST's rule
  (Solatorio 2024; sentence-transformers' GISTEmbedLoss, ``margin_strategy``): "absolute",
  s(a, c) > s(a, p) - m; "relative", s(a, c) > s(a, p) (1 - m). The scores are the model's own
  cosines, without gradient, or a frozen guide model's (``guide``: its embeddings of the same
  rows, gathered like the model's).

The anchor's own positive is never masked (nor counted), nor its own column, which every
objective removes anyway. Each mask is built from gathered values alone, so it is the same on
any number of ranks: an anchor on rank 0 and its duplicate on rank 1 are masked as on one process.

Pure maths on tensors: the gathers go through :mod:`vascl_scale.distributed`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from vascl_scale import distributed
from vascl_scale.losses.contrastive import cosines
from vascl_scale.losses.rules import FALSE_NEGATIVE_KINDS, MARGIN_STRATEGIES


@dataclass(frozen=True)
class FalseNegatives:
    """How one loss call finds its false negatives, and this rank's evidence, per view.

    ``text_hashes``: (b,) int64 per encoded view, in the objective's view order (``duplicates``).
    ``guide``: (b, g) per view, a frozen guide model's embeddings of the same rows (``margin``;
    empty: the model's own scores decide).
    """

    kind: str
    margin: float = 0.0
    margin_strategy: str = "absolute"
    text_hashes: tuple[Tensor, ...] = ()
    guide: tuple[Tensor, ...] = ()

    def __post_init__(self) -> None:
        assert self.kind in FALSE_NEGATIVE_KINDS[1:], self.kind
        assert self.margin_strategy in MARGIN_STRATEGIES, self.margin_strategy
        if self.kind == "duplicates" and not self.text_hashes:
            raise ValueError("false_negatives='duplicates' needs the text hash of every row of every view")

    def evidence(self, views: list[int]) -> Tensor | None:
        """This rank's evidence of ``views`` stacked view-major as the candidates are: the hashes
        (n b,) for duplicates, the L2-normalised guide embeddings (n b, g) for a guided margin,
        None where the model's own scores decide."""
        if self.kind == "duplicates":
            return torch.cat([self.text_hashes[i] for i in views])
        if self.guide:
            return torch.nn.functional.normalize(torch.cat([self.guide[i] for i in views]).float(), dim=-1)
        return None


def false_negative_mask(
    rule: FalseNegatives,
    *,
    anchor_evidence: Tensor | None,
    candidate_evidence: Tensor | None,
    own_scores: Tensor | None,
    positive_index: Tensor,
    self_index: Tensor | None,
) -> Tensor:
    """(A, C) bool: True where candidate c is a false negative of anchor a.

    ``anchor_evidence`` (A,) or (A, g) and ``candidate_evidence`` (C,) or (C, g): this rank's
    anchors' and the gathered candidates' hashes (duplicates) or guide embeddings (guided
    margin), row for row in the objective's layout; ``own_scores`` (A, C): the model's cosines,
    used (without gradient) for a margin without guide. ``positive_index`` (A,) and
    ``self_index`` (A,) or None index the candidates; neither is ever masked.
    """
    rows = torch.arange(positive_index.shape[0], device=positive_index.device)
    with torch.no_grad():
        if rule.kind == "duplicates":
            assert anchor_evidence is not None and candidate_evidence is not None
            positive_hash = candidate_evidence[positive_index]  # (A,)
            masked = (candidate_evidence[None, :] == anchor_evidence[:, None]) | (
                candidate_evidence[None, :] == positive_hash[:, None]
            )  # (A, C)
        else:
            if anchor_evidence is not None:  # a guide's cosines
                scores = anchor_evidence @ candidate_evidence.T  # (A, C)
            else:
                assert own_scores is not None
                scores = own_scores.detach()
            positive = scores[rows, positive_index][:, None]  # (A, 1)
            if rule.margin_strategy == "absolute":
                threshold = positive - rule.margin
            else:
                threshold = positive * (1 - rule.margin)
            masked = scores > threshold  # (A, C)
        masked[rows, positive_index] = False
        if self_index is not None:
            masked[rows, self_index] = False
    return masked


def objective_mask(
    rule: FalseNegatives | None,
    anchors: Tensor,
    candidates: Tensor,
    anchor_views: list[int],
    candidate_views: list[int],
    positive_index: Tensor,
    self_index: Tensor | None,
) -> Tensor | None:
    """The (A, C) false-negative mask of an objective whose A anchors (this rank's, features
    (A, D)) are its views ``anchor_views`` stacked view-major, and whose C candidates (gathered,
    (C, D)) are every rank's views ``candidate_views`` stacked view-major; None without a rule.
    The evidence is laid out as the features are: this rank's for the anchors, gathered for the
    candidates. The model's own scores are the features' cosines."""
    if rule is None:
        return None
    anchor_evidence = rule.evidence(anchor_views)
    candidate_evidence = (
        None if anchor_evidence is None else distributed.all_gather_no_grad(rule.evidence(candidate_views))
    )
    return false_negative_mask(
        rule,
        anchor_evidence=anchor_evidence,
        candidate_evidence=candidate_evidence,
        own_scores=cosines(anchors, candidates) if anchor_evidence is None else None,
        positive_index=positive_index,
        self_index=self_index,
    )


def masked_count(masked: Tensor) -> Tensor:
    """The global batch's number of masked (anchor, candidate) cells, from this rank's (A, C)
    mask: this rank's count times W, so that the mean over ranks (how a step's terms are
    logged) is the sum over them when every rank holds as many anchors."""
    _, world_size = distributed.world()
    return (masked.sum() * world_size).float()


def false_negatives_of(
    settings, text_hashes: list[Tensor] | None = None, guide: list[Tensor] | None = None
) -> FalseNegatives | None:
    """The rule of the ``loss`` section (``false_negatives``, ``false_negative_margin``,
    ``margin_strategy``) with one loss call's evidence per view; None when nothing is masked."""
    if settings["false_negatives"] == "none":
        return None
    return FalseNegatives(
        settings["false_negatives"],
        settings["false_negative_margin"],
        settings["margin_strategy"],
        tuple(text_hashes or ()),
        tuple(guide or ()),
    )

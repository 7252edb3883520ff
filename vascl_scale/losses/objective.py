"""One interface for the training objectives, each built from the ``loss`` config section.

An objective is called with this rank's pooled embeddings of the columns it encodes
(``spec.encoded_columns(batch)``, :mod:`vascl_scale.losses.spec`: its inputs, then the data's hard
negatives where it takes them), one (b, d) tensor per column in that order, the projection head
h and the loss call's generator; it returns an :class:`ObjectiveOutput`. Each projects through the head itself, so a
training step knows nothing of either. One that declares a label column (``spec.label``) is
also called with ``labels=``, this rank's (b,) labels, and one that declares the classifier
(``spec.classifier``) with ``classifier=``, the model's pairwise classifier; no other is. Another objective is a class with the same call, its
declaration in :data:`vascl_scale.losses.spec.OBJECTIVES` and one entry in
:data:`IMPLEMENTATIONS`.

Objectives are the training step's: they call the loss functions with ``check_rows=False``, so a
loss call costs no collective beyond the gathers (every rank's batch is the run plan's per-device
batch, checked on each rank by the step). A researcher calling the functions directly keeps
their check that every rank holds the same rows (``check_rows=True``, one tiny all-gather).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor

from vascl_scale.data.columns import LABELS
from vascl_scale.flops import classifier_forward_flops, head_forward_flops
from vascl_scale.losses.pairsupcon import hard_contrastive_loss, pair_classification_loss
from vascl_scale.losses.simcse import simcse_loss, simcse_sup_loss
from vascl_scale.losses.spec import OBJECTIVES, ObjectiveSpec, Settings, objective_spec
from vascl_scale.losses.vascl import Head, project, vascl_objective


@dataclass
class ObjectiveOutput:
    """What one loss call of any objective returns on this rank."""

    loss: Tensor  # scalar, the value to back-propagate
    terms: dict[str, Tensor]  # named scalar parts of the loss, detached; no host sync
    stats: dict[str, float] = field(default_factory=dict)  # diagnostics, only when asked for


class Objective(Protocol):
    spec: ObjectiveSpec  # what it encodes (spec.encoded_columns, the order of ``views``) and needs

    def __call__(
        self,
        views: list[Tensor],
        head: Head,
        generator: torch.Generator | None = None,
        with_stats: bool = False,
    ) -> ObjectiveOutput:
        """``views``: (b, d) embeddings of this rank's b rows, one per encoded column, in order
        (and, where ``spec`` declares them, keyword-only ``labels`` (b,) and ``classifier``)."""
        ...

    def model_flops(self, views: int, rows: int, global_rows: int, hidden: int, out_dim: int) -> int:
        """FLOPs of one loss call's head passes and similarity products on ``views`` views (the
        columns encoded) of a rank of ``rows`` anchors out of ``global_rows`` (forward and
        backward; :mod:`vascl_scale.flops`)."""
        ...


def _contrastive_flops(projected: int, anchors: int, candidates: int, hidden: int, out_dim: int) -> int:
    """``projected`` rows through the head and the (anchors, candidates) logits, forward and backward."""
    return 3 * (head_forward_flops(projected, hidden, out_dim) + 2 * anchors * candidates * out_dim)


def _one_term(loss: Tensor, name: str, with_stats: bool) -> ObjectiveOutput:
    """The output of an objective whose loss is its one term ``name``."""
    terms = {name: loss.detach()}
    stats = {"loss": float(loss.detach()), name: float(loss.detach())} if with_stats else {}
    return ObjectiveOutput(loss, terms, stats)


class SimCSEObjective:
    """Eq. 1 in both directions over the global batch (see :func:`simcse_loss`): each anchor
    against its positive, the positive against its anchor."""

    spec = OBJECTIVES["simcse"]

    def __init__(self, settings: Settings) -> None:
        self.temperature = settings["temperature"]

    def __call__(
        self,
        views: list[Tensor],
        head: Head,
        generator: torch.Generator | None = None,
        with_stats: bool = False,
    ) -> ObjectiveOutput:
        anchor, positive = views  # (b, d) each
        loss = simcse_loss(
            project(head, anchor), project(head, positive), temperature=self.temperature, check_rows=False
        )  # z: (b, D) each
        return _one_term(loss, "simcse", with_stats)

    def model_flops(self, views: int, rows: int, global_rows: int, hidden: int, out_dim: int) -> int:
        """Both views through the head (2b rows), their (2b, 2B) logits."""
        assert views == 2, views  # spec: (anchor, positive)
        return _contrastive_flops(2 * rows, 2 * rows, 2 * global_rows, hidden, out_dim)


class SupervisedSimCSEObjective:
    """Supervised SimCSE (Gao et al. 2021, Eq. 5, see :func:`simcse_sup_loss`) on (anchor,
    positive, negative_0, ..., negative_{N-1}), N >= 1 the data's hard-negative columns: each
    anchor against its positive, every positive and every hard negative of the global batch its
    candidates; ``hard_negative_weight`` the paper's alpha on its own N hard negatives."""

    spec = OBJECTIVES["simcse_sup"]

    def __init__(self, settings: Settings) -> None:
        self.temperature = settings["temperature"]
        self.hard_negative_weight = settings["hard_negative_weight"]

    def __call__(
        self,
        views: list[Tensor],
        head: Head,
        generator: torch.Generator | None = None,
        with_stats: bool = False,
    ) -> ObjectiveOutput:
        # (b, d) each: h_i, h_i^+, h_i^{-,1}, ..., h_i^{-,N} before the head -> (b, D) each
        z = [project(head, view) for view in views]
        loss = simcse_sup_loss(
            *z, temperature=self.temperature, hard_negative_weight=self.hard_negative_weight, check_rows=False
        )
        return _one_term(loss, "simcse_sup", with_stats)

    def model_flops(self, views: int, rows: int, global_rows: int, hidden: int, out_dim: int) -> int:
        """The n = 2 + N columns through the head (n b rows), the b anchors' (b, (1 + N) B) logits."""
        assert views >= 3, views  # spec: anchor, positive and at least one hard negative
        return _contrastive_flops(views * rows, rows, (views - 1) * global_rows, hidden, out_dim)


class VaSCLObjective:
    """Eq. 6 over the global batch (see :func:`vascl_objective`), the positive as x_i'."""

    spec = OBJECTIVES["vascl"]

    def __init__(self, settings: Settings) -> None:
        # Its loss keys are vascl_objective's keywords.
        self.settings = {key: settings[key] for key in self.spec.loss_keys}

    def __call__(
        self,
        views: list[Tensor],
        head: Head,
        generator: torch.Generator | None = None,
        with_stats: bool = False,
    ) -> ObjectiveOutput:
        anchor, positive = views  # (b, d) each: e1, e2 of the paper
        out = vascl_objective(
            anchor, positive, head, generator=generator, with_stats=with_stats, check_rows=False, **self.settings
        )
        terms = {"simcse": out.simcse.detach(), "neighbourhood": out.neighbourhood.detach()}
        return ObjectiveOutput(out.loss, terms, out.stats)

    def model_flops(self, views: int, rows: int, global_rows: int, hidden: int, out_dim: int) -> int:
        """Eq. 1's passes, the (b, B) neighbour search, per power iteration a head forward and
        its input gradient on b rows, and z* forward and backward; the products with the k
        neighbours (b x 2k x D) are left out."""
        assert views == 2, views  # spec: (anchor, positive)
        search = 2 * rows * global_rows * hidden
        power = self.settings["power_iters"] * 2 * head_forward_flops(rows, hidden, out_dim)
        augmented = 3 * head_forward_flops(rows, hidden, out_dim)
        return _contrastive_flops(2 * rows, 2 * rows, 2 * global_rows, hidden, out_dim) + search + power + augmented


class PairSupConObjective:
    """PairSupCon (Zhang et al. 2021, the authors' code; see :mod:`vascl_scale.losses.pairsupcon`):
    ``beta`` x their HardConLoss on the label-1 pairs against every feature of the global batch,
    plus the pairwise classifier's cross-entropy on every pair."""

    spec = OBJECTIVES["pairsupcon"]

    def __init__(self, settings: Settings) -> None:
        self.temperature = settings["temperature"]
        self.contrast_type = settings["contrast_type"]
        self.beta = settings["beta"]

    def __call__(
        self,
        views: list[Tensor],
        head: Head,
        generator: torch.Generator | None = None,
        with_stats: bool = False,
        *,
        labels: Tensor,
        classifier: Head,
    ) -> ObjectiveOutput:
        first, second = views  # (b, d) each: e1, e2 of the pairs, before the head
        z1, z2 = project(head, first), project(head, second)  # (b, D) each
        instdisc = hard_contrastive_loss(
            z1, z2, labels, temperature=self.temperature, contrast_type=self.contrast_type, check_rows=False
        )
        logits = classifier(first, second)  # (b, 2): the classifier on [e1, e2, |e1 - e2|]
        classification = pair_classification_loss(logits, labels)
        loss = self.beta * instdisc + classification  # training.py: beta on the instance loss only
        terms = {"instdisc": instdisc.detach(), "classification": classification.detach()}
        stats = {}
        if with_stats:
            accuracy = (logits.detach().argmax(dim=-1) == labels).float().mean()
            values = torch.stack(
                [loss.detach().float(), instdisc.detach().float(), classification.detach().float(), accuracy]
            )
            stats = dict(zip(("loss", "instdisc", "classification", "classifier_accuracy"), values.tolist()))
        return ObjectiveOutput(loss, terms, stats)

    def model_flops(self, views: int, rows: int, global_rows: int, hidden: int, out_dim: int) -> int:
        """Both texts through the head (2b rows), their (2b, 2B) logits, the classifier on the b pairs."""
        assert views == 2, views  # spec: (anchor, paired)
        classifier = 3 * classifier_forward_flops(rows, hidden, len(LABELS))
        return _contrastive_flops(2 * rows, 2 * rows, 2 * global_rows, hidden, out_dim) + classifier


# Each declared objective's implementation, by name.
IMPLEMENTATIONS: dict[str, type] = {
    cls.spec.name: cls for cls in (VaSCLObjective, SimCSEObjective, SupervisedSimCSEObjective, PairSupConObjective)
}
assert IMPLEMENTATIONS.keys() == OBJECTIVES.keys(), "every declared objective needs an implementation"


def build_objective(name: str, settings: Settings) -> Objective:
    """The objective ``name`` (``RunConfig.objective``) with the ``loss`` section's values
    ``settings`` (``config.loss.model_dump()``)."""
    return IMPLEMENTATIONS[objective_spec(name).name](settings)

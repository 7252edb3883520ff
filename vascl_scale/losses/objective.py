"""One interface for the training objectives, each built from the ``loss`` config section.

An objective is called with this rank's pooled embeddings of the columns it encodes
(``spec.encoded_columns(batch)``, :mod:`vascl_scale.losses.spec`: its inputs, then the data's hard
negatives where it takes them), one (b, d) tensor per column in that order, the projection head
h and the loss call's generator; it returns an :class:`ObjectiveOutput`. Each projects through the head itself, so a
training step knows nothing of either. One that declares a label column (``spec.label``) is
also called with ``labels=``, this rank's (b,) labels, one that declares teacher scores
(``spec.scores``) with ``scores=``, this rank's (b, 1 + N) scores, and one that declares the
classifier (``spec.classifier``) with ``classifier=``, the model's pairwise classifier; no other
is. With ``loss.false_negatives`` (:mod:`vascl_scale.losses.false_negatives`) an objective also
takes the evidence it says it needs (``needs_text_hashes``: ``text_hashes=``, (b,) per view;
``needs_guide``: ``guide=``, the guide model's (b, g) per view) and logs the masked count as
its term ``false_negatives``. Another objective is a class with the same call, its declaration
in :data:`vascl_scale.losses.spec.OBJECTIVES` and one entry in :data:`IMPLEMENTATIONS`.

``loss.matryoshka_dims`` wraps the objective (:class:`MatryoshkaObjective`): the sum over
prefixes of the embedding.

Objectives are the training step's: they call the loss functions with ``check_rows=False``, so a
loss call costs no collective beyond the gathers (every rank's batch is the run plan's per-device
batch, checked on each rank by the step). A researcher calling the functions directly keeps
their check that every rank holds the same rows (``check_rows=True``, one tiny all-gather).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor

from vascl_scale.data.columns import LABELS
from vascl_scale.flops import classifier_forward_flops, head_forward_flops
from vascl_scale.losses.distill import distill_kl_loss, margin_mse_loss, student_scores
from vascl_scale.losses.false_negatives import false_negatives_of, masked_count
from vascl_scale.losses.pairsupcon import hard_contrastive_loss_and_mask, pair_classification_loss
from vascl_scale.losses.simcse import simcse_loss_and_mask, simcse_sup_loss_and_mask
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
    needs_text_hashes: bool  # called with text_hashes= (loss.false_negatives: duplicates)
    needs_guide: bool  # called with guide= (loss.false_negatives: margin with loss.guide_model)

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


def _one_term(loss: Tensor, name: str, with_stats: bool, masked: Tensor | None = None) -> ObjectiveOutput:
    """The output of an objective whose loss is its one term ``name`` (and the count of the
    false negatives it masked, (A, C) ``masked``, where it masks them)."""
    terms = {name: loss.detach()}
    if masked is not None:
        terms["false_negatives"] = masked_count(masked)
    stats = {"loss": float(loss.detach()), name: float(loss.detach())} if with_stats else {}
    return ObjectiveOutput(loss, terms, stats)


class _InBatchNegatives:
    """What every objective with in-batch negatives shares: the ``loss`` section's false-negative
    rule, and the evidence it asks the training step for."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.needs_text_hashes = settings["false_negatives"] == "duplicates"
        self.needs_guide = settings["guide_model"] is not None

    def false_negatives(self, text_hashes: list[Tensor] | None, guide: list[Tensor] | None):
        """This loss call's :class:`~vascl_scale.losses.false_negatives.FalseNegatives`, or None."""
        return false_negatives_of(self.settings, text_hashes, guide)


class SimCSEObjective(_InBatchNegatives):
    """Eq. 1 in both directions over the global batch (see :func:`simcse_loss`): each anchor
    against its positive, the positive against its anchor."""

    spec = OBJECTIVES["simcse"]

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.temperature = settings["temperature"]

    def __call__(
        self,
        views: list[Tensor],
        head: Head,
        generator: torch.Generator | None = None,
        with_stats: bool = False,
        *,
        text_hashes: list[Tensor] | None = None,
        guide: list[Tensor] | None = None,
    ) -> ObjectiveOutput:
        anchor, positive = views  # (b, d) each
        loss, masked = simcse_loss_and_mask(
            project(head, anchor),
            project(head, positive),
            temperature=self.temperature,
            check_rows=False,
            false_negatives=self.false_negatives(text_hashes, guide),
        )  # z: (b, D) each
        return _one_term(loss, "simcse", with_stats, masked)

    def model_flops(self, views: int, rows: int, global_rows: int, hidden: int, out_dim: int) -> int:
        """Both views through the head (2b rows), their (2b, 2B) logits."""
        assert views == 2, views  # spec: (anchor, positive)
        return _contrastive_flops(2 * rows, 2 * rows, 2 * global_rows, hidden, out_dim)


class SupervisedSimCSEObjective(_InBatchNegatives):
    """Supervised SimCSE (Gao et al. 2021, Eq. 5, see :func:`simcse_sup_loss`) on (anchor,
    positive, negative_0, ..., negative_{N-1}), N >= 1 the data's hard-negative columns: each
    anchor against its positive, every positive and every hard negative of the global batch its
    candidates; ``hard_negative_weight`` the paper's alpha on its own N hard negatives."""

    spec = OBJECTIVES["simcse_sup"]

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.temperature = settings["temperature"]
        self.hard_negative_weight = settings["hard_negative_weight"]

    def contrastive(
        self, views: list[Tensor], head: Head, text_hashes: list[Tensor] | None, guide: list[Tensor] | None
    ) -> tuple[Tensor, Tensor | None]:
        """The loss over the global batch and the (b, W (1 + N) b) mask of false negatives (or None)."""
        # (b, d) each: h_i, h_i^+, h_i^{-,1}, ..., h_i^{-,N} before the head -> (b, D) each
        z = [project(head, view) for view in views]
        return simcse_sup_loss_and_mask(
            *z,
            temperature=self.temperature,
            hard_negative_weight=self.hard_negative_weight,
            check_rows=False,
            false_negatives=self.false_negatives(text_hashes, guide),
        )

    def __call__(
        self,
        views: list[Tensor],
        head: Head,
        generator: torch.Generator | None = None,
        with_stats: bool = False,
        *,
        text_hashes: list[Tensor] | None = None,
        guide: list[Tensor] | None = None,
    ) -> ObjectiveOutput:
        loss, masked = self.contrastive(views, head, text_hashes, guide)
        return _one_term(loss, "simcse_sup", with_stats, masked)

    def model_flops(self, views: int, rows: int, global_rows: int, hidden: int, out_dim: int) -> int:
        """The n = 2 + N columns through the head (n b rows), the b anchors' (b, (1 + N) B) logits."""
        assert views >= 3, views  # spec: anchor, positive and at least one hard negative
        return _contrastive_flops(views * rows, rows, (views - 1) * global_rows, hidden, out_dim)


class VaSCLObjective(_InBatchNegatives):
    """Eq. 6 over the global batch (see :func:`vascl_objective`), the positive as x_i'."""

    spec = OBJECTIVES["vascl"]

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        # Its loss keys are vascl_objective's keywords.
        self.keywords = {key: settings[key] for key in self.spec.loss_keys}

    def __call__(
        self,
        views: list[Tensor],
        head: Head,
        generator: torch.Generator | None = None,
        with_stats: bool = False,
        *,
        text_hashes: list[Tensor] | None = None,
        guide: list[Tensor] | None = None,
    ) -> ObjectiveOutput:
        anchor, positive = views  # (b, d) each: e1, e2 of the paper
        out = vascl_objective(
            anchor,
            positive,
            head,
            generator=generator,
            with_stats=with_stats,
            check_rows=False,
            false_negatives=self.false_negatives(text_hashes, guide),
            **self.keywords,
        )
        terms = {"simcse": out.simcse.detach(), "neighbourhood": out.neighbourhood.detach()}
        if out.false_negatives is not None:
            terms["false_negatives"] = masked_count(out.false_negatives)
        return ObjectiveOutput(out.loss, terms, out.stats)

    def model_flops(self, views: int, rows: int, global_rows: int, hidden: int, out_dim: int) -> int:
        """Eq. 1's passes, the (b, B) neighbour search, per power iteration a head forward and
        its input gradient on b rows, and z* forward and backward; the products with the k
        neighbours (b x 2k x D) are left out."""
        assert views == 2, views  # spec: (anchor, positive)
        search = 2 * rows * global_rows * hidden
        power = self.keywords["power_iters"] * 2 * head_forward_flops(rows, hidden, out_dim)
        augmented = 3 * head_forward_flops(rows, hidden, out_dim)
        return _contrastive_flops(2 * rows, 2 * rows, 2 * global_rows, hidden, out_dim) + search + power + augmented


class PairSupConObjective(_InBatchNegatives):
    """PairSupCon (Zhang et al. 2021, the authors' code; see :mod:`vascl_scale.losses.pairsupcon`):
    ``beta`` x their HardConLoss on the label-1 pairs against every feature of the global batch,
    plus the pairwise classifier's cross-entropy on every pair."""

    spec = OBJECTIVES["pairsupcon"]

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
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
        text_hashes: list[Tensor] | None = None,
        guide: list[Tensor] | None = None,
    ) -> ObjectiveOutput:
        first, second = views  # (b, d) each: e1, e2 of the pairs, before the head
        z1, z2 = project(head, first), project(head, second)  # (b, D) each
        instdisc, masked = hard_contrastive_loss_and_mask(
            z1,
            z2,
            labels,
            temperature=self.temperature,
            contrast_type=self.contrast_type,
            check_rows=False,
            false_negatives=self.false_negatives(text_hashes, guide),
        )
        logits = classifier(first, second)  # (b, 2): the classifier on [e1, e2, |e1 - e2|]
        classification = pair_classification_loss(logits, labels)
        loss = self.beta * instdisc + classification  # training.py: beta on the instance loss only
        terms = {"instdisc": instdisc.detach(), "classification": classification.detach()}
        if masked is not None:
            terms["false_negatives"] = masked_count(masked)
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


class DistillationObjective(SupervisedSimCSEObjective, ABC):
    """A teacher's scores distilled (:mod:`vascl_scale.losses.distill`: ``distill_kl`` or
    ``margin_mse``) on each anchor's own positive and N hard negatives, plus
    ``contrastive_weight`` x supervised SimCSE over the global batch (its false negatives
    masked as configured). The in-batch term is computed, and logged, also at weight 0: the
    head then receives a zero gradient, which DDP, ZeRO and FSDP2 need of every parameter they
    reduce."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.teacher_temperature = settings["teacher_temperature"]
        self.contrastive_weight = settings["contrastive_weight"]

    @abstractmethod
    def distillation(self, student: Tensor, teacher: Tensor) -> Tensor:
        """The distillation term of the student's and the teacher's (b, 1 + N) scores: a scalar."""

    def __call__(
        self,
        views: list[Tensor],
        head: Head,
        generator: torch.Generator | None = None,
        with_stats: bool = False,
        *,
        scores: Tensor,
        text_hashes: list[Tensor] | None = None,
        guide: list[Tensor] | None = None,
    ) -> ObjectiveOutput:
        anchor, *candidates = views  # (b, d) each: the anchor, its positive and N hard negatives
        distilled = self.distillation(student_scores(anchor, candidates), scores)  # (b, 1 + N) against (b, 1 + N)
        contrastive, masked = self.contrastive(views, head, text_hashes, guide)
        loss = distilled + self.contrastive_weight * contrastive
        name = self.spec.name
        terms = {name: distilled.detach(), "simcse_sup": contrastive.detach()}
        if masked is not None:
            terms["false_negatives"] = masked_count(masked)
        stats = {}
        if with_stats:
            values = torch.stack([loss.detach().float(), distilled.detach().float(), contrastive.detach().float()])
            stats = dict(zip(("loss", name, "simcse_sup"), values.tolist()))
        return ObjectiveOutput(loss, terms, stats)

    def model_flops(self, views: int, rows: int, global_rows: int, hidden: int, out_dim: int) -> int:
        """Supervised SimCSE's, and the (b, 1 + N) cosines of the distillation term."""
        return super().model_flops(views, rows, global_rows, hidden, out_dim) + 3 * 2 * rows * (views - 1) * hidden


class DistillKLObjective(DistillationObjective):
    spec = OBJECTIVES["distill_kl"]

    def distillation(self, student: Tensor, teacher: Tensor) -> Tensor:
        return distill_kl_loss(student, teacher, self.temperature, self.teacher_temperature)


class MarginMSEObjective(DistillationObjective):
    spec = OBJECTIVES["margin_mse"]

    def distillation(self, student: Tensor, teacher: Tensor) -> Tensor:
        return margin_mse_loss(student, teacher)


def _identity(embeddings: Tensor) -> Tensor:
    return embeddings


class MatryoshkaObjective:
    """An objective summed over prefixes of the embedding (Kusupati et al. 2022; sentence-
    transformers' MatryoshkaLoss): sum_m w_m L(e[:, :m]) over ``loss.matryoshka_dims``.

    The prefixes are taken on e, the pooled embedding that the export keeps and evaluation (and
    ``--truncate-dim``) reads, not on z = h(e): the paper's head maps d -> 128 and is dropped
    after training, so a prefix of z would train a vector nobody keeps, and h cannot take a
    prefix of e as its input. So the full dimension's term (m = d) is the objective as
    configured, through h; a shorter prefix's term is the same objective with h the identity,
    on normalise(e[:, :m]) (VaSCL's perturbation then lives in the prefix). Every term reads the
    same leaves, so in the cached step the prefixes' backward folds into the one gradient per
    row that the chunks replay: no extra encoder pass.
    """

    def __init__(self, inner: Objective, dims: list[int], weights: list[float]) -> None:
        self.inner = inner
        self.spec = inner.spec
        self.needs_text_hashes = inner.needs_text_hashes
        self.needs_guide = inner.needs_guide
        # Largest first: the full dimension's term (and its count of false negatives) leads.
        order = sorted(range(len(dims)), key=lambda i: -dims[i])
        self.dims = [dims[i] for i in order]
        self.weights = [weights[i] for i in order] if weights else [1.0] * len(dims)

    def __call__(
        self, views: list[Tensor], head: Head, generator: torch.Generator | None = None, with_stats: bool = False, **kw
    ) -> ObjectiveOutput:
        width = views[0].shape[1]
        if self.dims[0] != width:
            raise ValueError(
                f"loss.matryoshka_dims must hold the model's embedding dimension {width} as its largest (its term "
                f"trains the head, the others prefixes of it); got {self.dims}"
            )
        loss, terms, stats = 0.0, {}, {}
        for dim, weight in zip(self.dims, self.weights):
            full = dim == width
            out = self.inner(views if full else [view[:, :dim] for view in views], head if full else _identity,
                             generator, with_stats, **kw)  # fmt: skip
            loss = loss + weight * out.loss
            for name, value in out.terms.items():
                if name == "false_negatives":  # the leading prefix's count
                    terms.setdefault(name, value)
                else:
                    terms[f"{name}@{dim}"] = value
            stats.update({f"{name}@{dim}": value for name, value in out.stats.items() if name != "loss"})
        if with_stats:
            stats["loss"] = float(loss.detach())
        return ObjectiveOutput(loss, terms, stats)

    def model_flops(self, views: int, rows: int, global_rows: int, hidden: int, out_dim: int) -> int:
        """The objective's once per prefix: through the head at the full dimension, at m (an
        upper bound: the identity head costs nothing) below it."""
        return sum(
            self.inner.model_flops(views, rows, global_rows, hidden, out_dim if dim == hidden else dim)
            for dim in self.dims
        )


# Each declared objective's implementation, by name.
IMPLEMENTATIONS: dict[str, type] = {
    cls.spec.name: cls
    for cls in (
        VaSCLObjective,
        SimCSEObjective,
        SupervisedSimCSEObjective,
        PairSupConObjective,
        DistillKLObjective,
        MarginMSEObjective,
    )
}
assert IMPLEMENTATIONS.keys() == OBJECTIVES.keys(), "every declared objective needs an implementation"


def build_objective(name: str, settings: Settings) -> Objective:
    """The objective ``name`` (``RunConfig.objective``) with the ``loss`` section's values
    ``settings`` (``config.loss.model_dump()``), summed over Matryoshka prefixes where
    ``matryoshka_dims`` lists them."""
    objective = IMPLEMENTATIONS[objective_spec(name).name](settings)
    if settings["matryoshka_dims"]:
        return MatryoshkaObjective(objective, settings["matryoshka_dims"], settings["matryoshka_weights"])
    return objective

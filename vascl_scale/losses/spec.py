"""The objectives' declarations, without torch: the one place that names them and what they need.

Each entry of :data:`OBJECTIVES` says which data columns (:mod:`vascl_scale.data.columns`) the
objective encodes, in order: its ``inputs``, then, with ``hard_negatives``, every hard-negative
column the data has (``negative_0`` ... ``negative_{N-1}``, N >= 1: the n-tuples of
sentence-transformers' MultipleNegativesRankingLoss). Those are the views it is called with
(:meth:`ObjectiveSpec.encoded_columns`, :class:`vascl_scale.losses.objective.Objective`), so
their number depends on the data. An entry also says what stands in for an input the data
lacks, and the rules its settings obey beyond each key's own. The config validates a run with
it (:mod:`vascl_scale.config`: a known name, the rules), the launcher checks the data's columns
against it before any worker starts, the training stream reads the columns it names
(:meth:`ObjectiveSpec.columns_read`), the trainer logs the data's columns it leaves unread and the
training step encodes its views; the maths is in the modules beside this one.

SimCSE and VaSCL encode (anchor, positive). Where the data has no positive column (single-text
sentences), the anchor stands in for it: the same tokens encoded a second time, under another
dropout mask, the second view of unsupervised SimCSE. With ``data.augment`` the loader makes
the positive column from the anchor (:mod:`vascl_scale.data.augment`). Supervised SimCSE
encodes (anchor, positive, negative_0, ..., negative_{N-1}): SimCSE's NLI triplets are N = 1. It
has no stand-ins: data without a positive and at least one hard negative is refused. PairSupCon
encodes labelled pairs (anchor, paired) and reads their ``label`` (its ``label``: the column
passed to it as ``labels``), and trains the model's pairwise classifier (its ``classifier``: the
model is built with one, and the objective is called with it); data without the three columns
is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vascl_scale.data.columns import ANCHOR, LABEL, PAIRED, POSITIVE, SCORES, negative, negative_columns
from vascl_scale.losses.rules import (
    check_beta,
    check_contrast_type,
    check_distillation,
    check_false_negatives,
    check_hard_negative_weight,
    check_matryoshka,
    check_neighbour_count,
    check_temperature,
    check_vascl_settings,
)

# The ``loss`` section's values as a plain mapping (``config.loss.model_dump()``).
Settings = Mapping[str, Any]


def _no_rules(settings: Settings, global_batch_size: int) -> None:
    del settings, global_batch_size


@dataclass(frozen=True)
class ObjectiveSpec:
    """What one objective encodes and needs; see the module docstring."""

    name: str
    inputs: tuple[str, ...]  # the columns encoded first, in order: the objective's first views
    stand_ins: Mapping[str, str] = field(default_factory=dict)  # input -> the column encoded when the data lacks it
    # After the inputs, every hard-negative column the data has, in order (at least one).
    hard_negatives: bool = False
    # Rules on the settings and the global batch that no single key's check can make (ValueError).
    rules: Callable[[Settings, int], None] = _no_rules
    label: str | None = None  # the label column it reads (one integer per row), passed to it as ``labels``
    scores: str | None = None  # the teacher-score column it reads ((b, 1 + N) floats), passed to it as ``scores``
    classifier: bool = False  # it trains the model's pairwise classifier, passed to it as ``classifier``
    # The keys of the ``loss`` section it reads (its implementation takes these and no other; the
    # model card states them as the objective's settings).
    loss_keys: tuple[str, ...] = ("temperature",)

    def negatives(self, available: Collection[str]) -> tuple[str, ...]:
        """The hard-negative columns of ``available`` it encodes after its inputs, in order."""
        return negative_columns(available) if self.hard_negatives else ()

    def columns_read(self, available: Sequence[str]) -> tuple[str, ...]:
        """The columns of ``available`` (the data's, in its order) that it reads: its inputs and
        hard negatives there, and its label."""
        wanted = {*self.inputs, *self.negatives(available), *self.value_columns}
        return tuple(column for column in available if column in wanted)

    @property
    def value_columns(self) -> tuple[str, ...]:
        """The columns of numbers it reads: its label, its teacher scores."""
        return tuple(column for column in (self.label, self.scores) if column is not None)

    def unread_columns(self, available: Sequence[str]) -> tuple[str, ...]:
        """The columns of ``available`` that it does not read (the training log names them)."""
        read = self.columns_read(available)
        return tuple(column for column in available if column not in read)

    def missing_columns(self, available: Collection[str]) -> tuple[str, ...]:
        """The columns it needs that ``available`` has neither of nor a stand-in for (with
        ``hard_negatives``, ``negative_0`` when the data has no hard negative)."""
        missing = [c for c in self.inputs if c not in available and self.stand_ins.get(c) not in available]
        missing.extend(column for column in self.value_columns if column not in available)
        if self.hard_negatives and not self.negatives(available):
            missing.append(negative(0))
        return tuple(missing)

    def check_columns(self, available: Collection[str], where: str) -> None:
        """ValueError naming the objective and the columns missing from ``where`` (the data)."""
        missing = self.missing_columns(available)
        if missing:
            readers = objectives_reading_all(tuple(available))
            instead = f"objective: {' or '.join(readers)}, which trains on them" if readers else "another objective"
            raise ValueError(
                f"objective {self.name!r} needs the column(s) {', '.join(missing)}, which {where} lacks (its "
                f"columns: {', '.join(available)}); prepare data with them (`vascl-scale data prepare`) or "
                f"choose {instead}"
            )

    def encoded_columns(self, available: Collection[str]) -> tuple[str, ...]:
        """The column encoded for each view, in order: each input itself, else its stand-in; then
        the hard negatives. ``available``: the data's columns, or a batch (its keys)."""
        self.check_columns(available, "the batch")
        return tuple(c if c in available else self.stand_ins[c] for c in self.inputs) + self.negatives(available)


def _vascl_rules(settings: Settings, global_batch_size: int) -> None:
    check_neighbour_count(settings["k"], global_batch_size, "loss.", "train.global_batch_size")


def _pairsupcon_rules(settings: Settings, global_batch_size: int) -> None:
    del global_batch_size
    if settings["matryoshka_dims"]:
        raise ValueError(
            "loss.matryoshka_dims does not apply to objective 'pairsupcon': its pairwise classifier reads the whole "
            "embedding, which a prefix cannot feed; drop loss.matryoshka_dims or choose another objective"
        )


# The keys of the distillation objectives (vascl_scale.losses.distill): supervised SimCSE's, for
# the in-batch term weighted beside the distillation term, and their own.
_DISTILL_KEYS = ("temperature", "hard_negative_weight", "teacher_temperature", "contrastive_weight")


# A second dropout view of the anchor where the data has no positive.
_POSITIVE_OR_ANCHOR = {POSITIVE: ANCHOR}

# The registry: ``objective`` in a config names one of these; its implementation is in
# :mod:`vascl_scale.losses.objective`.
OBJECTIVES: dict[str, ObjectiveSpec] = {
    "vascl": ObjectiveSpec(
        "vascl",
        (ANCHOR, POSITIVE),
        stand_ins=_POSITIVE_OR_ANCHOR,
        rules=_vascl_rules,
        loss_keys=("temperature", "k", "xi", "eps", "power_iters", "detach", "similarity", "eps_mode", "xi_mode"),
    ),
    "simcse": ObjectiveSpec("simcse", (ANCHOR, POSITIVE), stand_ins=_POSITIVE_OR_ANCHOR),
    # Every hard negative the data has, N >= 1: SimCSE's NLI triplets (sent0, sent1, hard_neg) are N = 1.
    "simcse_sup": ObjectiveSpec(
        "simcse_sup", (ANCHOR, POSITIVE), hard_negatives=True, loss_keys=("temperature", "hard_negative_weight")
    ),
    # PairSupCon's labelled pairs (text1, text2, pairsimi) and its pairwise classification head.
    "pairsupcon": ObjectiveSpec(
        "pairsupcon",
        (ANCHOR, PAIRED),
        label=LABEL,
        classifier=True,
        rules=_pairsupcon_rules,
        loss_keys=("temperature", "contrast_type", "beta"),
    ),
    # A teacher's scores of each anchor's positive and hard negatives (the scores column), and
    # supervised SimCSE's in-batch term beside them (loss.contrastive_weight).
    "distill_kl": ObjectiveSpec(
        "distill_kl", (ANCHOR, POSITIVE), hard_negatives=True, scores=SCORES, loss_keys=_DISTILL_KEYS
    ),
    "margin_mse": ObjectiveSpec(
        "margin_mse", (ANCHOR, POSITIVE), hard_negatives=True, scores=SCORES, loss_keys=_DISTILL_KEYS
    ),
}

# The keys every objective reads (the loss call's options around its maths): the model card
# states those that are set.
COMMON_LOSS_KEYS = (
    "false_negatives",
    "false_negative_margin",
    "margin_strategy",
    "guide_model",
    "matryoshka_dims",
    "matryoshka_weights",
)


def objective_spec(name: str, key: str = "objective") -> ObjectiveSpec:
    """The declaration of objective ``name``; ValueError naming ``key`` and the known names."""
    if name not in OBJECTIVES:
        raise ValueError(f"{key} must be one of {', '.join(repr(n) for n in OBJECTIVES)}; got {name!r}")
    return OBJECTIVES[name]


def objectives_reading_all(available: Sequence[str]) -> tuple[str, ...]:
    """The objectives that read every column of ``available`` and need no other."""
    return tuple(
        name
        for name, spec in OBJECTIVES.items()
        if not spec.unread_columns(available) and not spec.missing_columns(available)
    )


def check_loss_settings(settings: Settings) -> None:
    """The rules of the ``loss`` section's keys, each objective's alike (``loss.`` in the messages)."""
    check_temperature(settings["temperature"], prefix="loss.")
    check_hard_negative_weight(settings["hard_negative_weight"], prefix="loss.")
    check_contrast_type(settings["contrast_type"], prefix="loss.")
    check_beta(settings["beta"], prefix="loss.")
    check_false_negatives(
        settings["false_negatives"],
        settings["false_negative_margin"],
        settings["margin_strategy"],
        settings["guide_model"],
        prefix="loss.",
    )
    check_matryoshka(settings["matryoshka_dims"], settings["matryoshka_weights"], prefix="loss.")
    check_distillation(settings["teacher_temperature"], settings["contrastive_weight"], prefix="loss.")
    check_vascl_settings(
        k=settings["k"],
        xi=settings["xi"],
        eps=settings["eps"],
        power_iters=settings["power_iters"],
        similarity=settings["similarity"],
        eps_mode=settings["eps_mode"],
        xi_mode=settings["xi_mode"],
        prefix="loss.",
    )

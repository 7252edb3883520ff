"""The objectives' declarations, without torch: the one place that names them and what they need.

Each entry of :data:`OBJECTIVES` says which data columns (:mod:`vascl_scale.data.columns`) the
objective encodes, in order (its ``inputs``: the views it is called with, see
:class:`vascl_scale.losses.objective.Objective`), what stands in
for an input the data lacks, and the rules its settings obey beyond each key's own. The config
validates a run with it (:mod:`vascl_scale.config`: a known name, the rules), the launcher checks
the data's columns against it before any worker starts, the training stream reads the columns
it names and the training step encodes its inputs; the maths is in the modules beside this one.

SimCSE and VaSCL encode (anchor, positive). Where the data has no positive column (single-text
sentences), the anchor stands in for it: the same tokens encoded a second time, under another
dropout mask, the second view of unsupervised SimCSE. With ``data.augment`` the loader makes
the positive column from the anchor (:mod:`vascl_scale.data.augment`). Supervised SimCSE
encodes (anchor, positive, negative_0), SimCSE's NLI triplets, and has no stand-ins: data
without a positive and a hard negative is refused. PairSupCon encodes labelled pairs (anchor,
paired) and reads their ``label`` (its ``label``: the column passed to it as ``labels``), and
trains the model's pairwise classifier (its ``classifier``: the model is built with one, and
the objective is called with it); data without the three columns is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Mapping

from vascl_scale.data.columns import ANCHOR, LABEL, PAIRED, POSITIVE, negative
from vascl_scale.losses.rules import (
    check_beta,
    check_contrast_type,
    check_hard_negative_weight,
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
    inputs: tuple[str, ...]  # the columns encoded, in order: the objective's views
    stand_ins: Mapping[str, str] = field(default_factory=dict)  # input -> the column encoded when the data lacks it
    # Rules on the settings and the global batch that no single key's check can make (ValueError).
    rules: Callable[[Settings, int], None] = _no_rules
    label: str | None = None  # the label column it reads (one integer per row), passed to it as ``labels``
    classifier: bool = False  # it trains the model's pairwise classifier, passed to it as ``classifier``

    @property
    def columns(self) -> tuple[str, ...]:
        """Every column the objective reads from the data when it is there: its inputs, its label."""
        return self.inputs + (() if self.label is None else (self.label,))

    def missing_columns(self, available: Collection[str]) -> tuple[str, ...]:
        """The columns it needs that ``available`` has neither of nor a stand-in for."""
        return tuple(c for c in self.columns if c not in available and self.stand_ins.get(c) not in available)

    def check_columns(self, available: Collection[str], where: str) -> None:
        """ValueError naming the objective and the columns missing from ``where`` (the data)."""
        missing = self.missing_columns(available)
        if missing:
            raise ValueError(
                f"objective {self.name!r} needs the column(s) {', '.join(missing)}, which {where} lacks (its "
                f"columns: {', '.join(available)}); prepare data with them (`vascl-scale data prepare`) or "
                "choose another objective"
            )

    def encoded_columns(self, available: Collection[str]) -> tuple[str, ...]:
        """The column encoded for each input, in order: the input itself, else its stand-in."""
        self.check_columns(available, "the batch")
        return tuple(c if c in available else self.stand_ins[c] for c in self.inputs)


def _vascl_rules(settings: Settings, global_batch_size: int) -> None:
    check_neighbour_count(settings["k"], global_batch_size, "loss.", "train.global_batch_size")


# A second dropout view of the anchor where the data has no positive.
_POSITIVE_OR_ANCHOR = {POSITIVE: ANCHOR}

# The registry: ``objective`` in a config names one of these; its implementation is in
# :mod:`vascl_scale.losses.objective`.
OBJECTIVES: dict[str, ObjectiveSpec] = {
    "vascl": ObjectiveSpec("vascl", (ANCHOR, POSITIVE), stand_ins=_POSITIVE_OR_ANCHOR, rules=_vascl_rules),
    "simcse": ObjectiveSpec("simcse", (ANCHOR, POSITIVE), stand_ins=_POSITIVE_OR_ANCHOR),
    # One hard negative per anchor, as SimCSE's NLI triplets (sent0, sent1, hard_neg).
    "simcse_sup": ObjectiveSpec("simcse_sup", (ANCHOR, POSITIVE, negative(0))),
    # PairSupCon's labelled pairs (text1, text2, pairsimi) and its pairwise classification head.
    "pairsupcon": ObjectiveSpec("pairsupcon", (ANCHOR, PAIRED), label=LABEL, classifier=True),
}


def objective_spec(name: str, key: str = "objective") -> ObjectiveSpec:
    """The declaration of objective ``name``; ValueError naming ``key`` and the known names."""
    if name not in OBJECTIVES:
        raise ValueError(f"{key} must be one of {', '.join(repr(n) for n in OBJECTIVES)}; got {name!r}")
    return OBJECTIVES[name]


def check_loss_settings(settings: Settings) -> None:
    """The rules of the ``loss`` section's keys, each objective's alike (``loss.`` in the messages)."""
    check_temperature(settings["temperature"], prefix="loss.")
    check_hard_negative_weight(settings["hard_negative_weight"], prefix="loss.")
    check_contrast_type(settings["contrast_type"], prefix="loss.")
    check_beta(settings["beta"], prefix="loss.")
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

"""One interface for the training objectives, each built from the ``loss`` config section.

An objective is called with this rank's pooled embeddings of the two dropout views, e1 and
e2 (b, d), the projection head h and the loss call's generator, and returns an
:class:`ObjectiveOutput`. Both project through the head themselves, so a training step
knows nothing of either. A third objective is a class with the same call and one line in
:data:`OBJECTIVES` (plus its name in ``RunConfig.objective``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor

from vascl_scale.flops import head_forward_flops
from vascl_scale.losses.simcse import simcse_loss
from vascl_scale.losses.vascl import Head, project, vascl_objective

if TYPE_CHECKING:
    from vascl_scale.config import LossConfig


@dataclass
class ObjectiveOutput:
    """What one loss call of any objective returns on this rank."""

    loss: Tensor  # scalar, the value to back-propagate
    terms: dict[str, Tensor]  # named scalar parts of the loss, detached; no host sync
    stats: dict[str, float] = field(default_factory=dict)  # diagnostics, only when asked for


class Objective(Protocol):
    def __call__(
        self, e1: Tensor, e2: Tensor, head: Head, generator: torch.Generator | None = None, with_stats: bool = False
    ) -> ObjectiveOutput: ...

    def model_flops(self, rows: int, global_rows: int, hidden: int, out_dim: int) -> int:
        """FLOPs of one loss call's head passes and similarity products on a rank of ``rows``
        anchors out of ``global_rows`` (forward and backward; :mod:`vascl_scale.flops`)."""
        ...


def _simcse_flops(rows: int, global_rows: int, hidden: int, out_dim: int) -> int:
    """Both views through the head (2b rows) and their (2b, 2B) logits, forward and backward."""
    return 3 * (head_forward_flops(2 * rows, hidden, out_dim) + 2 * (2 * rows) * (2 * global_rows) * out_dim)


class SimCSEObjective:
    """Eq. 1 in both directions over the global batch (see :func:`simcse_loss`)."""

    def __init__(self, loss: "LossConfig") -> None:
        self.temperature = loss.temperature

    def __call__(
        self, e1: Tensor, e2: Tensor, head: Head, generator: torch.Generator | None = None, with_stats: bool = False
    ) -> ObjectiveOutput:
        loss = simcse_loss(project(head, e1), project(head, e2), temperature=self.temperature)  # z: (b, D) each
        terms = {"simcse": loss.detach()}
        stats = {"loss": float(loss.detach()), "simcse": float(loss.detach())} if with_stats else {}
        return ObjectiveOutput(loss, terms, stats)

    def model_flops(self, rows: int, global_rows: int, hidden: int, out_dim: int) -> int:
        return _simcse_flops(rows, global_rows, hidden, out_dim)


class VaSCLObjective:
    """Eq. 6 over the global batch (see :func:`vascl_objective`)."""

    def __init__(self, loss: "LossConfig") -> None:
        self.settings = loss.model_dump()  # the section's keys are vascl_objective's keywords

    def __call__(
        self, e1: Tensor, e2: Tensor, head: Head, generator: torch.Generator | None = None, with_stats: bool = False
    ) -> ObjectiveOutput:
        out = vascl_objective(e1, e2, head, generator=generator, with_stats=with_stats, **self.settings)
        terms = {"simcse": out.simcse.detach(), "neighbourhood": out.neighbourhood.detach()}
        return ObjectiveOutput(out.loss, terms, out.stats)

    def model_flops(self, rows: int, global_rows: int, hidden: int, out_dim: int) -> int:
        """Eq. 1's passes, the (b, B) neighbour search, per power iteration a head forward and
        its input gradient on b rows, and z* forward and backward; the products with the k
        neighbours (b x 2k x D) are left out."""
        search = 2 * rows * global_rows * hidden
        power = self.settings["power_iters"] * 2 * head_forward_flops(rows, hidden, out_dim)
        augmented = 3 * head_forward_flops(rows, hidden, out_dim)
        return _simcse_flops(rows, global_rows, hidden, out_dim) + search + power + augmented


# The registry: ``objective`` in a config names one of these.
OBJECTIVES: dict[str, type] = {"vascl": VaSCLObjective, "simcse": SimCSEObjective}


def check_objective_name(name: str, key: str = "objective") -> None:
    if name not in OBJECTIVES:
        raise ValueError(f"{key} must be one of {', '.join(repr(n) for n in OBJECTIVES)}; got {name!r}")


def build_objective(name: str, loss: "LossConfig") -> Objective:
    """The objective ``name`` (``RunConfig.objective``) with the settings of ``loss``."""
    check_objective_name(name)
    return OBJECTIVES[name](loss)

"""Contrastive objectives: SimCSE (Eq. 1) and VaSCL (Eq. 6), over the global batch.

Pure maths on tensors; all communication goes through :mod:`vascl_scale.distributed`.
``build_objective(config.objective, config.loss)`` gives the configured one behind a single
interface (:class:`ObjectiveOutput`); ``simcse_loss`` / ``vascl_loss`` are the functional API.
"""

from vascl_scale.losses.contrastive import neighbourhood_nll, nt_xent
from vascl_scale.losses.objective import OBJECTIVES, Objective, ObjectiveOutput, build_objective
from vascl_scale.losses.simcse import simcse_loss
from vascl_scale.losses.vascl import VaSCLOutput, nearest_neighbours, vascl_loss, vascl_objective

__all__ = [
    "OBJECTIVES",
    "Objective",
    "ObjectiveOutput",
    "VaSCLOutput",
    "build_objective",
    "nearest_neighbours",
    "neighbourhood_nll",
    "nt_xent",
    "simcse_loss",
    "vascl_loss",
    "vascl_objective",
]

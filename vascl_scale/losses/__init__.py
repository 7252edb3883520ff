"""Contrastive objectives: SimCSE (Eq. 1), supervised SimCSE, VaSCL (Eq. 6) and PairSupCon, over the global batch.

Pure maths on tensors; all communication goes through :mod:`vascl_scale.distributed`.
``build_objective(config.objective, config.loss.model_dump())`` gives the configured one behind
a single interface (:class:`Objective`, returning an :class:`ObjectiveOutput`); ``simcse_loss``,
``simcse_sup_loss``, ``vascl_loss`` and ``hard_contrastive_loss`` (PairSupCon's) are the
functional API. :data:`OBJECTIVES` (:mod:`vascl_scale.losses.spec`) declares what each
objective encodes and needs.

Importing the package loads no torch (the config reads the declarations): each name below is
imported from its module on first use.
"""

from importlib import import_module

# Public name -> the module of this package that defines it.
_EXPORTS = {
    "OBJECTIVES": "spec",
    "ObjectiveSpec": "spec",
    "objective_spec": "spec",
    "Objective": "objective",
    "ObjectiveOutput": "objective",
    "build_objective": "objective",
    "hard_contrastive_loss": "pairsupcon",
    "neighbourhood_nll": "contrastive",
    "nt_xent": "contrastive",
    "simcse_loss": "simcse",
    "simcse_sup_loss": "simcse",
    "VaSCLOutput": "vascl",
    "nearest_neighbours": "vascl",
    "vascl_loss": "vascl",
    "vascl_objective": "vascl",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})

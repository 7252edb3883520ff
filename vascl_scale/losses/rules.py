"""The rules of the objectives' settings, each checked by one function.

Both the config (``loss.*``, with ``prefix="loss."``) and the functional API
(:func:`vascl_scale.losses.simcse_loss`, :func:`vascl_scale.losses.vascl_loss`) call these,
so a setting is accepted or refused, with the same message, whichever way it arrives.
"""

from __future__ import annotations

import math

SIMILARITIES = ("dot", "cosine")
CONTRAST_TYPES = ("orig", "hardneg")  # PairSupCon's HardConLoss: contrast_type Orig | HardNeg
STRENGTH_MODES = ("absolute", "relative", "relative_instance")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_temperature(temperature: float, prefix: str = "") -> None:
    if not temperature > 0:
        raise ValueError(f"{prefix}temperature must be > 0 (the paper uses 0.05); got {temperature}")


def check_hard_negative_weight(weight: float, prefix: str = "") -> None:
    """Supervised SimCSE's alpha, added to the logit of each anchor's own hard negative: any finite number."""
    if not math.isfinite(weight):
        raise ValueError(
            f"{prefix}hard_negative_weight must be a finite number (SimCSE's alpha, 0 by default); got {weight}"
        )


def check_contrast_type(contrast_type: str, prefix: str = "") -> None:
    """PairSupCon's negatives: uniform (orig) or hardness-weighted (hardneg)."""
    if contrast_type not in CONTRAST_TYPES:
        raise ValueError(f"{prefix}contrast_type must be one of {', '.join(CONTRAST_TYPES)}; got {contrast_type!r}")


def check_beta(beta: float, prefix: str = "") -> None:
    """The weight of PairSupCon's instance loss beside its classification loss."""
    if not (math.isfinite(beta) and beta >= 0):
        raise ValueError(
            f"{prefix}beta (the weight of PairSupCon's instance loss beside its classification loss) must be a finite "
            f"number >= 0 (the authors use 1); got {beta}"
        )


def check_vascl_settings(
    *,
    k: int,
    xi: float,
    eps: float,
    power_iters: int,
    similarity: str,
    eps_mode: str,
    xi_mode: str,
    prefix: str = "",
) -> None:
    """VaSCL's own settings (Eq. 2-5); the temperature is :func:`check_temperature`'s."""
    if not _is_int(k) or k < 1:
        raise ValueError(f"{prefix}k (neighbours per instance) must be an integer >= 1; got {k!r}")
    if not xi > 0:
        raise ValueError(f"{prefix}xi (the probing radius of the power iteration) must be > 0; got {xi}")
    if not eps >= 0:
        raise ValueError(f"{prefix}eps (the perturbation norm Delta) must be >= 0; got {eps}")
    if not _is_int(power_iters) or power_iters < 1:
        raise ValueError(f"{prefix}power_iters must be an integer >= 1; got {power_iters!r}")
    if similarity not in SIMILARITIES:
        raise ValueError(f"{prefix}similarity must be one of {', '.join(SIMILARITIES)}; got {similarity!r}")
    for name, mode in (("eps_mode", eps_mode), ("xi_mode", xi_mode)):
        if mode not in STRENGTH_MODES:
            raise ValueError(f"{prefix}{name} must be one of {', '.join(STRENGTH_MODES)}; got {mode!r}")


def check_neighbour_count(
    k: int, global_batch: int, prefix: str = "", batch_name: str = "the global batch size"
) -> None:
    """Each anchor needs k neighbours among the other B - 1 sentences, and the neighbourhood
    term needs at least one sentence that is not a neighbour: k < B - 1."""
    if k >= global_batch - 1:
        raise ValueError(
            f"{prefix}k must be < {batch_name} - 1 = {global_batch - 1}; got {k} (each instance has B - 1 "
            f"others and needs k + 2 <= B); lower {prefix}k or raise the global batch size"
        )

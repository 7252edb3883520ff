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
FALSE_NEGATIVE_KINDS = ("none", "duplicates", "margin")
MARGIN_STRATEGIES = ("absolute", "relative")


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


def check_false_negatives(kind: str, margin: float, strategy: str, guide_model: str | None, prefix: str = "") -> None:
    """The false-negative rule (:mod:`vascl_scale.losses.false_negatives`)."""
    if kind not in FALSE_NEGATIVE_KINDS:
        raise ValueError(f"{prefix}false_negatives must be one of {', '.join(FALSE_NEGATIVE_KINDS)}; got {kind!r}")
    if strategy not in MARGIN_STRATEGIES:
        raise ValueError(f"{prefix}margin_strategy must be one of {', '.join(MARGIN_STRATEGIES)}; got {strategy!r}")
    upper = 1 if strategy == "relative" else 2  # a cosine margin: the scores differ by at most 2
    if not (math.isfinite(margin) and 0 <= margin < upper):
        raise ValueError(
            f"{prefix}false_negative_margin must be in [0, {upper}) with margin_strategy {strategy!r} (a negative is "
            f"masked when it scores above the positive's score {'minus' if upper == 2 else 'times 1 minus'} it); got {margin}"
        )
    if guide_model is not None and kind != "margin":
        raise ValueError(
            f"{prefix}guide_model scores the candidates for false_negatives 'margin'; set {prefix}false_negatives "
            f"to margin, or drop {prefix}guide_model (false_negatives is {kind!r})"
        )


def check_matryoshka(dims: list[int], weights: list[float], prefix: str = "") -> None:
    """Matryoshka prefixes: distinct positive integers, and one positive weight per prefix or none."""
    if not all(_is_int(d) and d >= 1 for d in dims) or len(set(dims)) != len(dims):
        raise ValueError(f"{prefix}matryoshka_dims must be distinct integers >= 1, e.g. [384, 128, 64]; got {dims}")
    if weights and len(weights) != len(dims):
        raise ValueError(
            f"{prefix}matryoshka_weights needs one weight per dimension of {prefix}matryoshka_dims ({len(dims)}), or "
            f"none (each 1); got {len(weights)}"
        )
    if not all(math.isfinite(w) and w > 0 for w in weights):
        raise ValueError(f"{prefix}matryoshka_weights must be finite numbers > 0; got {weights}")


def check_distillation(teacher_temperature: float, contrastive_weight: float, prefix: str = "") -> None:
    """The distillation objectives' own settings (:mod:`vascl_scale.losses.distill`)."""
    if not (math.isfinite(teacher_temperature) and teacher_temperature > 0):
        raise ValueError(
            f"{prefix}teacher_temperature (dividing the teacher's scores before their softmax) must be > 0; "
            f"got {teacher_temperature}"
        )
    if not (math.isfinite(contrastive_weight) and contrastive_weight >= 0):
        raise ValueError(
            f"{prefix}contrastive_weight (of the in-batch term beside the distillation term) must be a finite "
            f"number >= 0; got {contrastive_weight}"
        )

"""The loss options around the objectives: false negatives masked over the global batch
(duplicates by text hash, a margin by the model itself or by a guide), Matryoshka prefixes,
and distillation from teacher scores (KL, MarginMSE).

Each against a float64 loop-by-loop reference written here (one anchor, one candidate at a
time); on W = 2 and 4 gloo ranks against one process (a duplicate pair split over two ranks
among them); and through the training step, cached against uncached, on one and two ranks.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.gloo import mean_over_ranks, run_as_launched, run_on_ranks
from tests.step_helpers import (
    CHUNK,
    GLOBAL_BATCH,
    assert_close_float64,
    call_and_backward,
    own_batch,
    parameter_gradients,
    portable,
    step_parts,
)
from vascl_scale.config import LossConfig
from vascl_scale.losses import build_objective
from vascl_scale.losses.false_negatives import FalseNegatives

ROWS = 8  # the functional tests' global batch
DIM, HEAD = 6, 4


def _settings(**overrides) -> dict:
    return LossConfig(temperature=0.1, **overrides).model_dump()


def _views(count: int, rows: int = ROWS, seed: int = 0, dim: int = DIM) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(rows, dim, generator=generator, dtype=torch.float64) for _ in range(count)]


def _head(seed: int = 1) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Linear(DIM, HEAD).double()


# Text hashes of a global batch of 8 (anchor, positive, negative_0) rows with false negatives
# placed on purpose: row 5's anchor repeats row 1's (on another rank for W = 2 and 4); row 6's
# positive is row 2's anchor; row 3's hard negative is its own positive (mined too close); row
# 0's hard negative is row 7's positive (on another rank).
ANCHOR_HASHES = [100, 101, 102, 103, 104, 101, 106, 107]
POSITIVE_HASHES = [200, 201, 202, 203, 204, 205, 102, 207]
NEGATIVE_HASHES = [300, 301, 302, 203, 304, 305, 306, 207]


def _hashes(rows: slice = slice(None)) -> list[torch.Tensor]:
    return [torch.tensor(h)[rows] for h in (ANCHOR_HASHES, POSITIVE_HASHES, NEGATIVE_HASHES)]


# ---------------------------------------------------------------- loop-by-loop references


def _masked_by_rule(rule: dict, anchor: int, candidate: int, scores, keys, anchor_keys, positive: int) -> bool:
    """Is ``candidate`` a false negative of ``anchor`` (never its positive)?"""
    if candidate == positive:
        return False
    if rule["false_negatives"] == "duplicates":
        return keys[candidate] in (anchor_keys[anchor], keys[positive])
    threshold = (
        scores[anchor][positive] - rule["false_negative_margin"]
        if rule.get("margin_strategy", "absolute") == "absolute"
        else scores[anchor][positive] * (1 - rule["false_negative_margin"])
    )
    return scores[anchor][candidate] > threshold


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(F.cosine_similarity(a.detach(), b.detach(), dim=0))


def reference_simcse_sup(views, head, temperature, alpha, rule=None, hashes=None, guide=None):
    """Supervised SimCSE one anchor and one candidate at a time: (loss, masked count)."""
    z = [F.normalize(head(v), dim=-1) for v in views]
    anchors, candidates = z[0], torch.cat(z[1:])  # candidates: positives, then each negative column
    rows, total, masked = anchors.shape[0], 0.0, 0
    keys = torch.cat(hashes[1:]).tolist() if hashes else None
    anchor_keys = hashes[0].tolist() if hashes else None
    if guide is not None:
        g_anchor, g_candidates = guide[0], torch.cat(guide[1:])
        scores = [[_cos(g_anchor[i], g_candidates[j]) for j in range(len(g_candidates))] for i in range(rows)]
    else:
        scores = [[_cos(anchors[i], candidates[j]) for j in range(len(candidates))] for i in range(rows)]
    for i in range(rows):
        terms = []
        for j in range(len(candidates)):
            if rule is not None and _masked_by_rule(rule, i, j, scores, keys, anchor_keys, i):
                masked += 1
                continue
            own_negative = j >= rows and j % rows == i
            terms.append(anchors[i] @ candidates[j] / temperature + (alpha if own_negative else 0.0))
        logits = torch.stack(terms)
        positive_logit = anchors[i] @ candidates[i] / temperature
        total = total + torch.logsumexp(logits, 0) - positive_logit
    return total / rows, masked


def reference_simcse(views, head, temperature, rule=None, hashes=None):
    """Unsupervised SimCSE (both directions) one anchor and one candidate at a time."""
    z = torch.cat([F.normalize(head(v), dim=-1) for v in views])  # (2B, D): [z1; z2]
    rows = views[0].shape[0]
    keys = torch.cat(hashes).tolist() if hashes else None
    scores = [[_cos(z[a], z[c]) for c in range(2 * rows)] for a in range(2 * rows)]
    total, masked = 0.0, 0
    for a in range(2 * rows):
        positive = (a + rows) % (2 * rows)
        terms = []
        for c in range(2 * rows):
            if c == a:
                continue
            if rule is not None and _masked_by_rule(rule, a, c, scores, keys, keys, positive):
                masked += 1
                continue
            terms.append(z[a] @ z[c] / temperature)
        total = total + torch.logsumexp(torch.stack(terms), 0) - z[a] @ z[positive] / temperature
    return total / (2 * rows), masked


RULES = {
    "duplicates": dict(false_negatives="duplicates"),
    "margin-absolute": dict(false_negatives="margin", false_negative_margin=0.3),
    "margin-relative": dict(false_negatives="margin", false_negative_margin=0.5, margin_strategy="relative"),
}


@pytest.mark.parametrize("rule_id", list(RULES))
@pytest.mark.parametrize("alpha", [0.0, 1.5])
def test_supervised_simcse_masks_as_the_loop_does(rule_id: str, alpha: float) -> None:
    views, head = [v.requires_grad_(True) for v in _views(3)], _head()
    rule = RULES[rule_id]
    objective = build_objective("simcse_sup", _settings(hard_negative_weight=alpha, **rule))
    hashes = _hashes() if rule_id == "duplicates" else None
    out = objective(views, head, text_hashes=hashes)
    expected, masked = reference_simcse_sup(views, head, 0.1, alpha, rule, hashes)
    assert 0 < masked < ROWS * 2 * ROWS, masked  # the rule masks something, not everything
    assert int(out.terms["false_negatives"]) == masked
    if rule_id == "duplicates":
        # The cells placed: 5 repeats 1 (no candidate of theirs is an anchor: nothing); 6's
        # positive is 2's anchor (anchor 2 masks positive 6); 3's negative is its positive; 0's
        # negative is 7's positive (anchor 7 masks negative 0).
        assert masked == 3
    assert_close_float64(out.loss, expected, f"{rule_id} loss")
    got = torch.autograd.grad(out.loss, [*views, *head.parameters()])
    want = torch.autograd.grad(expected, [*views, *head.parameters()])
    for index, (g, w) in enumerate(zip(got, want)):
        assert_close_float64(g, w, f"{rule_id} gradient {index}")
    unmasked = objective.__class__(_settings(hard_negative_weight=alpha))(views, head)
    assert not torch.allclose(unmasked.loss, out.loss)  # masking changed the loss


def test_a_guide_decides_the_margin_as_the_loop_does() -> None:
    views, head = [v.requires_grad_(True) for v in _views(3)], _head()
    guide = _views(3, seed=7, dim=5)
    rule = dict(false_negatives="margin", false_negative_margin=0.2)
    objective = build_objective("simcse_sup", _settings(guide_model="guide", **rule))
    assert objective.needs_guide and not objective.needs_text_hashes
    out = objective(views, head, guide=guide)
    expected, masked = reference_simcse_sup(views, head, 0.1, 0.0, rule, guide=guide)
    assert 0 < masked and int(out.terms["false_negatives"]) == masked
    assert_close_float64(out.loss, expected, "guided loss")
    by_model = build_objective("simcse_sup", _settings(**rule))(views, head)
    assert int(by_model.terms["false_negatives"]) != masked  # the guide, not the model, decided


@pytest.mark.parametrize("rule_id", ["duplicates", "margin-absolute"])
def test_unsupervised_simcse_masks_as_the_loop_does(rule_id: str) -> None:
    views, head = [v.requires_grad_(True) for v in _views(2)], _head()
    rule = RULES[rule_id]
    hashes = _hashes()[:2] if rule_id == "duplicates" else None
    out = build_objective("simcse", _settings(**rule))(views, head, text_hashes=hashes)
    expected, masked = reference_simcse(views, head, 0.1, rule, hashes)
    assert masked > 0 and int(out.terms["false_negatives"]) == masked
    assert_close_float64(out.loss, expected, f"{rule_id} loss")
    for g, w in zip(torch.autograd.grad(out.loss, views), torch.autograd.grad(expected, views)):
        assert_close_float64(g, w, f"{rule_id} gradient")


def test_pairsupcon_masks_duplicates_and_averages_its_hard_negatives_over_the_rest() -> None:
    views, head = [v.requires_grad_(True) for v in _views(2)], _head()
    labels = torch.tensor([1, 1, 0, 1, 1, 0, 1, 1])
    classifier = torch.nn.Linear(3 * DIM, 2, bias=False).double()

    def pair_classifier(a, b):
        return classifier(torch.cat([a, b, (a - b).abs()], dim=-1))

    hashes = _hashes()[:2]
    out = build_objective("pairsupcon", _settings(false_negatives="duplicates", beta=1.0))(
        views, head, labels=labels, classifier=pair_classifier, text_hashes=hashes
    )
    # The loop: HardConLoss "hardneg" over each label-1 anchor's negatives that are not masked.
    z = torch.cat([F.normalize(head(v), dim=-1) for v in views])
    keys = torch.cat(hashes).tolist()
    total, anchors = 0.0, 0
    for a in range(2 * ROWS):
        if labels[a % ROWS] != 1:
            continue
        partner = (a + ROWS) % (2 * ROWS)
        negatives = [
            z[a] @ z[c] / 0.1
            for c in range(2 * ROWS)
            if c not in (a, partner) and keys[c] not in (keys[a], keys[partner])
        ]
        s = torch.stack(negatives)
        n_a = len(negatives) * torch.exp(2 * s).sum() / torch.exp(s).sum()
        positive = torch.exp(z[a] @ z[partner] / 0.1)
        total, anchors = total - torch.log(positive / (positive + n_a)), anchors + 1
    assert_close_float64(out.terms["instdisc"], total / anchors, "instdisc")
    # Every anchor counts its cells, whatever its label: rows 1 and 5 share an anchor text (both
    # views of each mask the other's first text: 4 cells), and row 6's positive is row 2's
    # anchor (each of the four texts of rows 2 and 6 masks the other pair's copy: 4 cells).
    assert int(out.terms["false_negatives"]) == 8


def reference_kl(student, teacher, temperature, teacher_temperature) -> torch.Tensor:
    total = 0.0
    for s, t in zip(student, teacher):
        p = [math.exp(v / teacher_temperature) for v in t.tolist()]
        p = [v / sum(p) for v in p]
        log_q = s / temperature - torch.logsumexp(s / temperature, 0)
        total = total + sum(p[j] * (math.log(p[j]) - log_q[j]) for j in range(len(p)))
    return total / len(student)


def reference_margin_mse(student, teacher) -> torch.Tensor:
    total, count = 0.0, 0
    for s, t in zip(student, teacher):
        for j in range(1, len(s)):
            total, count = total + ((s[0] - s[j]) - (t[0] - t[j])) ** 2, count + 1
    return total / count


@pytest.mark.parametrize("objective_name", ["distill_kl", "margin_mse"])
@pytest.mark.parametrize("contrastive_weight", [0.0, 0.5])
def test_distillation_is_the_loop_plus_the_weighted_in_batch_term(objective_name, contrastive_weight) -> None:
    views, head = [v.requires_grad_(True) for v in _views(4)], _head()  # anchor, positive, 2 negatives
    teacher = torch.randn(ROWS, 3, generator=torch.Generator().manual_seed(9), dtype=torch.float64) * 3
    settings = _settings(teacher_temperature=2.0, contrastive_weight=contrastive_weight)
    out = build_objective(objective_name, settings)(views, head, scores=teacher)
    student = torch.stack(
        [torch.stack([_cos_t(views[0][i], views[c][i]) for c in (1, 2, 3)]) for i in range(ROWS)]
    )  # (B, 3): the embeddings' cosines, before the head
    if objective_name == "distill_kl":
        distilled = reference_kl(student, teacher, 0.1, 2.0)
    else:
        distilled = reference_margin_mse(student, teacher)
    contrastive, _ = reference_simcse_sup(views, head, 0.1, 0.0)
    expected = distilled + contrastive_weight * contrastive
    assert_close_float64(out.terms[objective_name], distilled, "distillation term")
    assert_close_float64(out.terms["simcse_sup"], contrastive, "in-batch term, logged at any weight")
    assert_close_float64(out.loss, expected, "loss")
    *got, head_gradient = torch.autograd.grad(out.loss, [*views, head.weight], allow_unused=True)
    for g, w in zip(got, torch.autograd.grad(expected, views)):
        assert_close_float64(g, w, "gradient")
    assert head_gradient is not None  # the head is in the graph at weight 0 too (DDP needs its gradient)


def _cos_t(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.cosine_similarity(a, b, dim=0)


def test_teacher_scores_of_the_wrong_width_are_refused() -> None:
    views, head = _views(3), _head()
    with pytest.raises(ValueError, match=r"the data's scores hold \(3,\) score\(s\) per row where the objective"):
        build_objective("distill_kl", _settings())(views, head, scores=torch.zeros(ROWS, 3, dtype=torch.float64))


def test_matryoshka_is_the_sum_over_prefixes_the_full_one_through_the_head() -> None:
    views, head = [v.requires_grad_(True) for v in _views(3)], _head()
    dims, weights = [3, DIM, 2], [0.5, 1.0, 2.0]
    out = build_objective(
        "simcse_sup", _settings(matryoshka_dims=dims, matryoshka_weights=weights, false_negatives="duplicates")
    )(views, head, text_hashes=_hashes())
    expected = 0.0
    for dim, weight in zip(dims, weights):
        if dim == DIM:
            term, masked = reference_simcse_sup(views, head, 0.1, 0.0, RULES["duplicates"], _hashes())
        else:
            term, _ = reference_simcse_sup(
                [v[:, :dim] for v in views], lambda e: e, 0.1, 0.0, RULES["duplicates"], _hashes()
            )
        expected = expected + weight * term
        assert_close_float64(out.terms[f"simcse_sup@{dim}"], term, f"prefix {dim}")
    assert_close_float64(out.loss, expected, "loss")
    assert int(out.terms["false_negatives"]) == masked
    for g, w in zip(torch.autograd.grad(out.loss, views), torch.autograd.grad(expected, views)):
        assert_close_float64(g, w, "gradient")
    with pytest.raises(ValueError, match=r"must hold the model's embedding dimension 6 as its largest"):
        build_objective("simcse_sup", _settings(matryoshka_dims=[4, 2]))(views, head)


def test_the_loss_options_are_refused_with_one_line_each() -> None:
    cases = {
        "false_negative_margin must be in [0, 1) with margin_strategy 'relative'": dict(
            false_negatives="margin", false_negative_margin=1.0, margin_strategy="relative"
        ),
        "guide_model scores the candidates for false_negatives 'margin'": dict(guide_model="g"),
        "matryoshka_dims must be distinct integers >= 1": dict(matryoshka_dims=[8, 8]),
        "matryoshka_weights needs one weight per dimension": dict(matryoshka_dims=[8, 4], matryoshka_weights=[1.0]),
        "teacher_temperature": dict(teacher_temperature=0.0),
        "contrastive_weight": dict(contrastive_weight=-1.0),
    }
    for message, overrides in cases.items():
        with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
            LossConfig(**overrides)
    from vascl_scale.config import config_from_dict

    with pytest.raises(ValueError, match="loss.matryoshka_dims does not apply to objective 'pairsupcon'"):
        config_from_dict(
            {
                "objective": "pairsupcon",
                "model": {"path": "m"},
                "data": {"train": "x"},
                "loss": {"matryoshka_dims": [8, 4]},
            }
        )


def test_vascl_never_takes_a_masked_row_as_a_neighbour_while_others_remain() -> None:
    """The choice documented in vascl_objective: duplicates are no neighbours (Eq. 5 pushes
    neighbours away); the next nearest rows take their place."""
    from vascl_scale.losses import vascl_objective

    e1, e2 = _views(2, seed=3)
    e1[5] = e1[1] * 1.01  # row 5 repeats row 1: by far each other's nearest
    head = _head()
    settings = dict(k=2, temperature=0.1, xi=1.0, eps=1.0, init_dir=torch.zeros_like(e1) + 0.1)
    plain = vascl_objective(e1, e2, head, **settings)
    assert plain.neighbours[1, 0] == 5 and plain.neighbours[5, 0] == 1
    rule = FalseNegatives("duplicates", text_hashes=tuple(_hashes()[:2]))
    masked = vascl_objective(e1, e2, head, false_negatives=rule, **settings)
    assert 5 not in masked.neighbours[1].tolist() and 1 not in masked.neighbours[5].tolist()
    np.testing.assert_array_equal(masked.neighbours[1].numpy(), plain.neighbours[1, 1:].tolist() + [
        int(torch.topk(e1 @ e1[1], 4).indices[3])
    ])  # fmt: skip
    for row in (0, 2, 3, 4, 6, 7):  # rows without a copy keep their neighbours
        assert masked.neighbours[row].tolist() == plain.neighbours[row].tolist()


# ---------------------------------------------------------------- many ranks = one process

# (objective, loss overrides, columns, with teacher scores)
RANK_CASES = {
    "simcse_sup-duplicates": ("simcse_sup", dict(false_negatives="duplicates"), 3, False),
    "simcse_sup-margin": ("simcse_sup", dict(false_negatives="margin", false_negative_margin=0.3), 3, False),
    "simcse_sup-guide": (
        "simcse_sup",
        dict(false_negatives="margin", false_negative_margin=0.2, guide_model="g", margin_strategy="relative"),
        3,
        False,
    ),
    "simcse-duplicates": ("simcse", dict(false_negatives="duplicates"), 2, False),
    "vascl-duplicates": ("vascl", dict(false_negatives="duplicates", k=2, xi=1.0, eps=1.0), 2, False),
    "vascl-matryoshka": ("vascl", dict(matryoshka_dims=[DIM, 3], k=2, xi=1.0, eps=1.0), 2, False),
    "simcse_sup-matryoshka": (
        "simcse_sup",
        dict(matryoshka_dims=[2, DIM, 4], matryoshka_weights=[1, 1, 0.5]),
        3,
        False,
    ),
    "distill_kl": ("distill_kl", dict(false_negatives="duplicates", teacher_temperature=0.5), 3, True),
    "margin_mse": ("margin_mse", dict(contrastive_weight=0.2), 3, True),
}


def options_on_slice(rank: int, world_size: int) -> dict:
    """Every case on this rank's rows of the global batch; world_size 1 is the reference."""
    rows = ROWS // world_size
    own = slice(rank * rows, (rank + 1) * rows)
    teacher = torch.randn(ROWS, 2, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    guide = _views(3, seed=7, dim=5)
    results = {}
    for case, (name, overrides, columns, scored) in RANK_CASES.items():
        head = _head()
        leaves = [v[own].clone().requires_grad_(True) for v in _views(columns)]
        objective = build_objective(name, _settings(**overrides))
        keywords = {}
        if objective.needs_text_hashes:
            keywords["text_hashes"] = _hashes(own)[:columns]
        if objective.needs_guide:
            keywords["guide"] = [g[own] for g in guide[:columns]]
        if scored:
            keywords["scores"] = teacher[own]
        generator = torch.Generator().manual_seed(4)
        out = objective(leaves, head, generator, **keywords)
        out.loss.backward()
        # Each rank's own rows' gradients, and the head's averaged like DDP.
        head_grads = torch.cat([p.grad.flatten() for p in head.parameters()])
        values = torch.stack([out.loss.detach(), out.terms.get("false_negatives", torch.zeros(())).double()])
        mean_over_ranks(world_size, head_grads, values)
        results[case] = {
            "values": values.numpy(),
            "head": head_grads.numpy(),
            "rows": torch.cat([leaf.grad for leaf in leaves], dim=1).numpy(),  # (b, n d)
        }
    return results


@pytest.fixture(scope="module")
def one_process() -> dict:
    return options_on_slice(0, 1)


def test_the_rank_cases_mask_something(one_process) -> None:
    for case, (_, overrides, _, _) in RANK_CASES.items():
        masked = one_process[case]["values"][1]
        assert (masked > 0) == ("false_negatives" in overrides), (case, masked)


@pytest.mark.parametrize("world_size", [2, 4])
def test_many_ranks_equal_one_process(world_size: int, one_process) -> None:
    per_rank = run_on_ranks(options_on_slice, world_size)
    for case, expected in one_process.items():
        for got in per_rank:
            assert_close_float64(got[case]["values"], expected["values"], f"{case}, loss and masked count")
            assert_close_float64(got[case]["head"], expected["head"], f"{case}, head gradient")
        # A rank's rows get the gradient of the global loss times W (the mean over ranks is the loss).
        rows = np.concatenate([got[case]["rows"] for got in per_rank]) / world_size
        assert_close_float64(rows, expected["rows"], f"{case}, the rows' gradients")


# ---------------------------------------------------------------- through the training step

# (objective, loss overrides, hard-negative columns, with a positive column, with scores)
STEP_CASES = {
    "simcse_sup-duplicates": ("simcse_sup", dict(false_negatives="duplicates"), 1),
    "vascl-duplicates-matryoshka": ("vascl", dict(false_negatives="duplicates", matryoshka_dims=[16, 4]), 0),
    "distill_kl-margin": ("distill_kl", dict(false_negatives="margin"), 2),
    "simcse_sup-guide": (
        "simcse_sup",
        dict(false_negatives="margin", guide_model="tiny", false_negative_margin=0.05),
        1,
    ),
}


def _step_batch(rank: int, world_size: int, negatives: int) -> dict:
    """own_batch's rows with each text column's hashes and teacher scores for 1 + N candidates."""
    batch = own_batch(rank, world_size, positive=True, negatives=negatives)
    rows = GLOBAL_BATCH // world_size
    own = slice(rank * rows, (rank + 1) * rows)
    for column, hashes in zip(("anchor", "positive", "negative_0"), _hashes()):
        if column in batch:
            batch[f"{column}.hash"] = hashes[own]
    for j in range(1, negatives):
        batch[f"negative_{j}.hash"] = torch.arange(400 + 10 * j, 400 + 10 * j + GLOBAL_BATCH)[own]
    teacher = torch.randn(GLOBAL_BATCH, 1 + negatives, generator=torch.Generator().manual_seed(2))
    batch["scores"] = teacher.double()[own]
    return batch


def step_option_calls(rank: int, world_size: int) -> dict:
    results = {}
    for case, (objective, loss, negatives) in STEP_CASES.items():
        for mode in ("uncached", "cached"):
            _, model, step, _ = step_parts(objective, loss, 0 if mode == "uncached" else CHUNK, 0.0)
            out = call_and_backward(step, _step_batch(rank, world_size, negatives), mode)
            results[case, mode] = {
                "loss": out.loss.detach(),
                "masked": out.terms.get("false_negatives", torch.zeros(())),
                "gradients": parameter_gradients(model),
            }
    return portable(results)


@pytest.mark.e2e
def test_through_the_step_cached_equals_uncached_and_two_ranks_equal_one() -> None:
    (reference,) = run_as_launched(step_option_calls, 1)
    per_rank = run_as_launched(step_option_calls, 2)
    for (case, mode), expected in reference.items():
        what = f"{case}, {mode}"
        assert float(expected["masked"]) > 0, what
        uncached = reference[case, "uncached"]
        assert_close_float64(expected["loss"], uncached["loss"], f"{what} against uncached, loss")
        for name, gradient in uncached["gradients"].items():
            assert abs(gradient).max() > 0, f"{name} has no gradient"
            assert_close_float64(expected["gradients"][name], gradient, f"{what} against uncached, {name}")
        mean = sum(torch.as_tensor(got[case, mode]["loss"]) for got in per_rank) / 2
        assert_close_float64(mean, expected["loss"], f"{what}, mean loss over 2 ranks")
        masked = sum(torch.as_tensor(got[case, mode]["masked"]) for got in per_rank) / 2
        assert_close_float64(masked, expected["masked"], f"{what}, masked count over 2 ranks")
        for got in per_rank:
            for name, gradient in expected["gradients"].items():
                assert_close_float64(got[case, mode]["gradients"][name], gradient, f"{what}, 2 ranks, {name}")

"""Known answers, an independent loop-by-loop reference, gradient checks and bad inputs."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from vascl_scale.losses import nearest_neighbours, neighbourhood_nll, nt_xent, simcse_loss, vascl_loss, vascl_objective
from vascl_scale.losses.vascl import project
from vascl_scale.model import ProjectionHead


@pytest.fixture(autouse=True)
def _float64_by_default():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def _unit(x: torch.Tensor) -> torch.Tensor:
    return F.normalize(x, dim=-1)


def assert_norm_is_eps_unless_saturated(delta: torch.Tensor, eps) -> None:
    """||delta_i|| = eps_i * ||g_i|| / (||g_i|| + 1e-8) (the authors' normalisation): never above
    eps_i, equal to it (to 1e-3) for most rows, short only where Eq. 2's gradient nearly vanishes."""
    ratio = delta.norm(dim=-1) / torch.as_tensor(eps, dtype=delta.dtype)
    assert (ratio <= 1 + 1e-9).all(), ratio
    assert ((ratio - 1).abs() < 1e-3).float().mean() >= 0.75, ratio


# ---------------------------------------------------------------- known answers


@pytest.mark.parametrize("rows,temperature", [(2, 1.0), (3, 0.5), (5, 0.05)])
def test_simcse_known_answer_orthonormal(rows: int, temperature: float) -> None:
    """Identical views of orthonormal rows: positive cosine 1, every negative 0.

    Each of the 2B anchors sees e^{1/tau} against 2B - 2 negatives of e^0, so the loss is
    log(1 + (2B - 2) e^{-1/tau}).
    """
    z = torch.eye(8)[:rows]
    expected = math.log1p((2 * rows - 2) * math.exp(-1.0 / temperature))
    torch.testing.assert_close(simcse_loss(z, z.clone(), temperature), torch.tensor(expected))


def test_simcse_known_answer_swapped_views() -> None:
    """B = 2 with the second views swapped: each anchor's positive is orthogonal to it and
    one negative (the other sentence's second view) is identical to it."""
    z1 = torch.eye(2)
    z2 = torch.eye(2).flip(0)
    # Anchor z1_0 = e0: candidates z1_1 = e1 (0), z2_0 = e1 (positive, 0), z2_1 = e0 (1).
    expected = -math.log(math.exp(0) / (math.exp(0) + math.exp(0) + math.exp(1)))
    torch.testing.assert_close(simcse_loss(z1, z2, 1.0), torch.tensor(expected))


def test_neighbourhood_nll_known_answer() -> None:
    anchor = torch.tensor([[1.0, 0.0]])
    positive = torch.tensor([[1.0, 0.0]])
    negatives = torch.tensor([[[0.0, 1.0], [-1.0, 0.0]]])  # cosines 0 and -1
    expected = -math.log(math.e / (math.e + 1 + math.exp(-1)))
    torch.testing.assert_close(neighbourhood_nll(anchor, positive, negatives, 1.0), torch.tensor([expected]))


def test_neighbours_use_raw_inner_product_not_cosine() -> None:
    """For e0 = (1, 0): e1 = (3, 3) has the larger dot product (3 > 1), e2 = (1, 0.1) the larger cosine."""
    e = torch.tensor([[1.0, 0.0], [3.0, 3.0], [1.0, 0.1], [-1.0, 0.0]])
    neighbours = nearest_neighbours(e, e, k=2, query_offset=0)
    assert neighbours[0].tolist() == [1, 2]
    assert neighbours[1].tolist() == [2, 0]  # (3,3): dots 3.3 with e2, 3 with e0, -3 with e3
    assert all(i not in row for i, row in enumerate(neighbours.tolist()))  # self never chosen


def test_cosine_neighbours_ignore_the_norm() -> None:
    e = torch.tensor([[1.0, 0.0], [3.0, 3.0], [1.0, 0.1], [-1.0, 0.0]])
    assert nearest_neighbours(e, e, k=1, query_offset=0, similarity="cosine")[0].tolist() == [2]


def test_relative_strengths_scale_with_the_mean_embedding_norm() -> None:
    torch.manual_seed(10)
    e1 = 7.0 * torch.randn(12, 16)
    head = ProjectionHead(16, 4)
    init_dir = torch.rand(12, 16) - 0.5
    mean_norm = e1.norm(dim=-1).mean()
    relative = vascl_objective(
        e1, e1 + 0.1, head, k=3, eps=0.5, xi=0.2, eps_mode="relative", xi_mode="relative", init_dir=init_dir
    )
    assert_norm_is_eps_unless_saturated(relative.delta, 0.5 * mean_norm.item())
    absolute = vascl_objective(
        e1, e1 + 0.1, head, k=3, eps=0.5 * mean_norm.item(), xi=0.2 * mean_norm.item(), init_dir=init_dir
    )
    torch.testing.assert_close(relative.delta, absolute.delta)
    torch.testing.assert_close(relative.loss, absolute.loss)


def test_instance_relative_strengths_scale_with_each_embedding_norm() -> None:
    torch.manual_seed(12)
    e1 = torch.randn(12, 16) * torch.linspace(1.0, 9.0, 12)[:, None]  # norms differ row by row
    head = ProjectionHead(16, 4)
    init_dir = torch.rand(12, 16) - 0.5
    norms = e1.norm(dim=-1)
    out = vascl_objective(
        e1,
        e1 + 0.1,
        head,
        k=3,
        eps=0.5,
        xi=0.2,
        eps_mode="relative_instance",
        xi_mode="relative_instance",
        init_dir=init_dir,
    )
    assert_norm_is_eps_unless_saturated(out.delta, 0.5 * norms)
    assert out.stats["delta_to_embedding"] == pytest.approx(0.5, rel=0.05)
    # Row i alone equals an absolute run with eps = 0.5 ||e_i|| and xi = 0.2 ||e_i||: the power
    # iteration of row i depends only on row i's radius.
    for row in (0, 11):
        absolute = vascl_objective(
            e1, e1 + 0.1, head, k=3, eps=0.5 * norms[row].item(), xi=0.2 * norms[row].item(), init_dir=init_dir
        )
        torch.testing.assert_close(out.delta[row], absolute.delta[row])


def test_near_duplicate_share_counts_copies_among_neighbours() -> None:
    torch.manual_seed(11)
    base = torch.randn(6, 16)
    e1 = torch.cat([base, base + 1e-3])  # every sentence appears twice: its copy is its nearest neighbour
    _, stats = vascl_loss(e1, e1, ProjectionHead(16, 4), k=2, eps=0.1, xi=0.1, similarity="cosine")
    assert stats["near_duplicate_share"] == pytest.approx(0.5)


def test_neighbours_respect_query_offset() -> None:
    keys = torch.randn(10, 4)
    queries = keys[6:9]
    neighbours = nearest_neighbours(queries, keys, k=9, query_offset=6)  # every other row
    for j, row in enumerate(neighbours.tolist()):
        assert sorted(row) == [i for i in range(10) if i != 6 + j]


# ---------------------------------------------------------------- independent reference


def _nll(anchor, positive, negatives, temperature):
    num = torch.exp(anchor @ positive / temperature)
    den = num + sum(torch.exp(anchor @ n / temperature) for n in negatives)
    return -torch.log(num / den)


def reference_simcse(z1, z2, temperature):
    """Eq. 1 both directions, anchor by anchor: each of 2B anchors against the 2B - 1 others."""
    rows = z1.shape[0]
    feats = list(z1) + list(z2)
    terms = []
    for a in range(2 * rows):
        pos = (a + rows) % (2 * rows)
        others = [feats[c] for c in range(2 * rows) if c not in (a, pos)]
        terms.append(_nll(feats[a], feats[pos], others, temperature))
    return sum(terms) / (2 * rows)


def reference_vascl(e1, e2, head, k, temperature, xi, eps, power_iters, detach, init_dir):
    """Eq. 6 written anchor by anchor with explicit exp/log sums (slow, float64, no batching)."""
    rows = e1.shape[0]

    def z(x):
        return head(x) / head(x).norm()

    def nll(anchor, positive, negatives):
        return _nll(anchor, positive, negatives, temperature)

    simcse = reference_simcse(
        torch.stack([z(e1[i]) for i in range(rows)]), torch.stack([z(e2[i]) for i in range(rows)]), temperature
    )

    base = e1.detach()
    neighbours = []
    for i in range(rows):
        dots = sorted(((float(base[i] @ base[j]), j) for j in range(rows) if j != i), reverse=True)
        neighbours.append([j for _, j in dots[:k]])
    clean = [z(base[i]).detach() for i in range(rows)]
    deltas = []
    for i in range(rows):
        # The authors' normalisation (vat_utils.py, _l2_normalize): v / (||v|| + 1e-8); the
        # power-iteration gradient is that of the batch mean of Eq. 2, so row i's term / rows.
        direction = init_dir[i] / (init_dir[i].norm() + 1e-8)
        for _ in range(power_iters):
            direction = direction.detach().requires_grad_(True)
            loss_i = nll(z(base[i] + xi * direction), clean[i], [clean[j] for j in neighbours[i]]) / rows
            (grad,) = torch.autograd.grad(loss_i, direction)
            direction = grad / (grad.norm() + 1e-8)
        deltas.append(eps * direction.detach())

    source = base if detach else e1
    z_clean = [clean[i] if detach else z(e1[i]) for i in range(rows)]
    z_aug = [z(source[i] + deltas[i]) for i in range(rows)]
    terms = []
    for i in range(rows):
        negs = [z_clean[j] for j in neighbours[i]] + [z_aug[j] for j in neighbours[i]]
        terms.append(nll(z_aug[i], z_clean[i], negs) + nll(z_clean[i], z_aug[i], negs))
    neighbourhood = sum(terms) / (2 * rows)
    return simcse + neighbourhood, torch.tensor(neighbours), torch.stack(deltas)


@pytest.mark.parametrize("detach", [True, False])
@pytest.mark.parametrize("power_iters", [1, 3])
def test_vascl_matches_reference(detach: bool, power_iters: int) -> None:
    torch.manual_seed(0)
    rows, dim = 7, 16  # wide enough that no row's head has a single active ReLU unit
    e1_leaf = torch.randn(rows, dim, requires_grad=True)
    e2_leaf = torch.randn(rows, dim, requires_grad=True)
    head = ProjectionHead(dim, 4)
    init_dir = torch.rand(rows, dim) - 0.5
    settings = dict(k=3, temperature=0.2, xi=0.7, eps=1.3, power_iters=power_iters, detach=detach)

    out = vascl_objective(e1_leaf, e2_leaf, head, init_dir=init_dir, **settings)
    grads = torch.autograd.grad(out.loss, [e1_leaf, e2_leaf, *head.parameters()])
    ref_loss, ref_neighbours, ref_delta = reference_vascl(e1_leaf, e2_leaf, head, init_dir=init_dir, **settings)
    ref_grads = torch.autograd.grad(ref_loss, [e1_leaf, e2_leaf, *head.parameters()])

    torch.testing.assert_close(out.loss, ref_loss)
    assert out.neighbours.tolist() == ref_neighbours.tolist()
    torch.testing.assert_close(out.delta, ref_delta)
    for got, expected in zip(grads, ref_grads):
        torch.testing.assert_close(got, expected)


def test_saturated_eq2_shortens_delta_as_the_authors_normalisation_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where Eq. 2 saturates (a low temperature here) its gradient nearly vanishes: the authors'
    g / (||g|| + 1e-8) of the batch-mean gradient gives a short delta, a unit normalisation a full
    one. vascl-scale matches the authors' reference; the unit normalisation measurably differs."""
    from vascl_scale.losses import vascl as vascl_module

    torch.manual_seed(8)
    rows, dim = 10, 8
    e1_leaf = torch.randn(rows, dim, requires_grad=True)
    e2_leaf = (e1_leaf.detach() + 0.1).requires_grad_(True)
    head = ProjectionHead(dim, 6)
    init_dir = torch.rand(rows, dim) - 0.5
    settings = dict(k=3, temperature=0.02, xi=1.0, eps=1.0, power_iters=2, detach=True)

    out = vascl_objective(e1_leaf, e2_leaf, head, init_dir=init_dir, **settings)
    ref_loss, _, ref_delta = reference_vascl(e1_leaf, e2_leaf, head, init_dir=init_dir, **settings)
    # A gradient of norm ~1e-9 divided by ||g|| + 1e-8 keeps the float64 rounding of g at a
    # relative 1e-6 (batched vs row-by-row sums): compare at that level.
    close = dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.delta, ref_delta, **close)
    torch.testing.assert_close(out.loss, ref_loss, **close)
    grads = torch.autograd.grad(out.loss, list(head.parameters()))
    ref_grads = torch.autograd.grad(ref_loss, list(head.parameters()))
    for got, expected in zip(grads, ref_grads):
        torch.testing.assert_close(got, expected, **close)
    norms = out.delta.norm(dim=-1)
    assert norms.min() < 0.2 and (norms <= 1.0 + 1e-12).all()  # a saturated row is short

    monkeypatch.setattr(vascl_module, "_authors_l2_normalize", lambda rows_: F.normalize(rows_, dim=-1))
    unit = vascl_objective(e1_leaf, e2_leaf, head, init_dir=init_dir, **settings)
    torch.testing.assert_close(unit.delta.norm(dim=-1), torch.ones(rows))
    assert abs(unit.neighbourhood - out.neighbourhood) > 1e-3 * abs(out.neighbourhood)


def test_simcse_matches_reference_on_random_features() -> None:
    torch.manual_seed(1)
    z1, z2 = _unit(torch.randn(5, 3)), _unit(torch.randn(5, 3))
    torch.testing.assert_close(simcse_loss(z1, z2, 0.3), reference_simcse(z1, z2, 0.3))


def test_eps_zero_makes_the_augmentation_the_clean_feature() -> None:
    torch.manual_seed(1)
    e1, e2 = torch.randn(5, 16), torch.randn(5, 16)
    head = ProjectionHead(16, 4)
    out = vascl_objective(e1, e2, head, k=1, temperature=0.3, xi=1.0, eps=0.0, init_dir=torch.rand(5, 16) - 0.5)
    torch.testing.assert_close(out.simcse, simcse_loss(project(head, e1), project(head, e2), 0.3))
    torch.testing.assert_close(out.delta, torch.zeros_like(out.delta))
    assert out.stats["augmentation_cosine"] == pytest.approx(1.0)


# ---------------------------------------------------------------- gradients


def test_gradcheck_nt_xent_and_neighbourhood_nll() -> None:
    torch.manual_seed(2)
    anchors = torch.randn(4, 3, requires_grad=True)
    candidates = torch.randn(6, 3, requires_grad=True)
    positive = torch.tensor([1, 2, 3, 0])
    own = torch.tensor([0, 5, 4, 1])
    assert torch.autograd.gradcheck(lambda a, c: nt_xent(_unit(a), _unit(c), positive, own, 0.5), (anchors, candidates))
    pos = torch.randn(4, 3, requires_grad=True)
    negs = torch.randn(4, 2, 3, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a, p, n: neighbourhood_nll(_unit(a), _unit(p), _unit(n), 0.5), (anchors, pos, negs)
    )


def test_blocked_nt_xent_equals_the_one_matrix_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past LOGITS_BLOCK_ELEMENTS the logits are formed in row blocks, recomputed in the backward:
    the same loss and gradients (float64), and every backward (twice here, as the cached step
    runs it) recomputes them again."""
    from vascl_scale.losses import contrastive

    torch.manual_seed(3)
    anchors = _unit(torch.randn(10, 4, dtype=torch.float64))
    candidates = _unit(torch.randn(20, 4, dtype=torch.float64))
    positive, own = torch.randint(0, 20, (10,)), torch.arange(10)

    def loss_and_grads():
        a, c = anchors.clone().requires_grad_(True), candidates.clone().requires_grad_(True)
        loss = nt_xent(a, c, positive, own, 0.1)
        first = torch.autograd.grad(loss, [a, c], retain_graph=True)
        second = torch.autograd.grad(loss, [a, c])
        return loss, first, second

    plain = loss_and_grads()
    monkeypatch.setattr(contrastive, "LOGITS_BLOCK_ELEMENTS", 3 * 20)  # blocks of 3, 3, 3 and 1 anchors
    blocked = loss_and_grads()
    torch.testing.assert_close(blocked[0], plain[0], rtol=1e-12, atol=0)
    for got, expected in zip(blocked[1] + blocked[2], plain[1] + plain[2]):
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-14)
    a, c = anchors.clone().requires_grad_(True), candidates.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a, c: nt_xent(_unit(a), _unit(c), positive, own, 0.5), (a, c))


def test_gradcheck_simcse_loss() -> None:
    torch.manual_seed(3)
    z1 = torch.randn(4, 5, requires_grad=True)
    z2 = torch.randn(4, 5, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: simcse_loss(_unit(a), _unit(b), 0.3), (z1, z2))


def test_head_gradient_is_that_of_eq6_at_fixed_delta() -> None:
    """delta is a constant after the search (Danskin): the head's gradient is that of Eq. 6
    with delta and the neighbours held fixed, and that function passes a finite-difference check."""
    torch.manual_seed(4)
    e1, e2 = torch.randn(6, 4), torch.randn(6, 4)
    weights = (torch.randn(4, 4, requires_grad=True), torch.randn(3, 4, requires_grad=True))

    def head_of(w1, w2):
        return lambda x: F.relu(x @ w1.T) @ w2.T

    # detach=False: no stop-gradient left once delta is fixed, so finite differences apply.
    out = vascl_objective(
        e1, e2, head_of(*weights), k=2, temperature=0.5, xi=1.0, eps=0.5, detach=False, init_dir=torch.rand(6, 4) - 0.5
    )
    delta, neighbours = out.delta, out.neighbours

    def eq6_at_fixed_delta(w1, w2):
        head = head_of(w1, w2)
        clean, aug = _unit(head(e1)), _unit(head(e1 + delta))
        negatives = torch.cat([clean[neighbours], aug[neighbours]], dim=1)
        nbr = (
            neighbourhood_nll(aug, clean, negatives, 0.5).mean() + neighbourhood_nll(clean, aug, negatives, 0.5).mean()
        )
        return simcse_loss(_unit(head(e1)), _unit(head(e2)), 0.5) + 0.5 * nbr

    assert torch.autograd.gradcheck(eq6_at_fixed_delta, weights)
    for got, expected in zip(
        torch.autograd.grad(out.loss, weights), torch.autograd.grad(eq6_at_fixed_delta(*weights), weights)
    ):
        torch.testing.assert_close(got, expected)


# ---------------------------------------------------------------- behaviour


def test_detach_true_trains_the_encoder_only_through_simcse() -> None:
    torch.manual_seed(5)
    e1 = torch.randn(8, 5, requires_grad=True)
    e2 = torch.randn(8, 5, requires_grad=True)
    head = ProjectionHead(5, 4)
    init_dir = torch.rand(8, 5) - 0.5
    out = vascl_objective(e1, e2, head, k=3, xi=1.0, eps=1.0, init_dir=init_dir, detach=True)
    grad_e = torch.autograd.grad(out.loss, [e1, e2])
    simcse_only = simcse_loss(project(head, e1), project(head, e2))
    grad_simcse = torch.autograd.grad(simcse_only, [e1, e2])
    for g, s in zip(grad_e, grad_simcse):
        torch.testing.assert_close(g, s)
    # ... while the head does learn from the neighbourhood term.
    head_grad_nbr = torch.autograd.grad(out.neighbourhood, list(head.parameters()), allow_unused=True)
    assert any(g is not None and g.abs().sum() > 0 for g in head_grad_nbr)
    literal = vascl_objective(e1, e2, head, k=3, xi=1.0, eps=1.0, init_dir=init_dir, detach=False)
    grad_literal = torch.autograd.grad(literal.loss, e1)[0]
    assert not torch.allclose(grad_literal, grad_e[0])


def test_delta_has_norm_eps_and_is_adversarial() -> None:
    torch.manual_seed(6)
    rows, dim = 16, 8
    e1 = torch.randn(rows, dim)
    head = ProjectionHead(dim, 6)
    eps = 0.05
    out = vascl_objective(e1, e1 + 0.01, head, k=4, xi=1e-3, eps=eps, init_dir=torch.rand(rows, dim) - 0.5)
    assert_norm_is_eps_unless_saturated(out.delta, eps)

    def eq2(delta):
        clean = project(head, e1)
        return neighbourhood_nll(project(head, e1 + delta), clean, clean[out.neighbours], 0.05)

    found = eq2(out.delta)  # (rows,)
    random = torch.stack([eq2(eps * _unit(torch.randn(rows, dim))) for _ in range(64)])  # (64, rows)
    # The power-iteration direction beats the best of 64 random ones for almost every row.
    assert (found >= random.max(dim=0).values - 1e-9).float().mean() >= 0.9


def test_generator_and_init_dir_agree() -> None:
    torch.manual_seed(7)
    e1, e2 = torch.randn(6, 16), torch.randn(6, 16)
    head = ProjectionHead(16, 4)
    a = vascl_objective(e1, e2, head, k=2, generator=torch.Generator().manual_seed(11))
    b = vascl_objective(e1, e2, head, k=2, generator=torch.Generator().manual_seed(11))
    drawn = torch.rand(e1.shape, generator=torch.Generator().manual_seed(11), dtype=torch.float32).to(e1) - 0.5
    c = vascl_objective(e1, e2, head, k=2, init_dir=drawn)
    torch.testing.assert_close(a.delta, b.delta)
    torch.testing.assert_close(a.delta, c.delta)


def test_head_called_the_same_number_of_times_every_step() -> None:
    """ZeRO-3 needs each rank to call the head equally often: 1 (both views) + power_iters + 1."""
    calls = []
    head = ProjectionHead(4, 3)
    head.register_forward_hook(lambda *_: calls.append(1))
    e = torch.randn(6, 4)
    vascl_loss(e, e + 0.1, head, k=2, power_iters=3)
    assert len(calls) == 5


def test_stats_are_floats_with_expected_values() -> None:
    torch.manual_seed(8)
    e1 = torch.randn(10, 16)
    loss, stats = vascl_loss(e1, e1 + 0.1, ProjectionHead(16, 4), k=3, eps=2.5)
    assert all(isinstance(v, float) for v in stats.values())
    assert stats["loss"] == pytest.approx(loss.item())
    assert stats["loss"] == pytest.approx(stats["simcse"] + stats["neighbourhood"])
    assert 0.95 * 2.5 <= stats["delta_norm"] <= 2.5  # eps, a little less where Eq. 2 saturates
    assert stats["embedding_norm"] == pytest.approx(e1.norm(dim=-1).mean().item())
    assert stats["delta_to_embedding"] == pytest.approx((2.5 / e1.norm(dim=-1)).mean().item(), rel=0.05)
    assert -1.0 <= stats["augmentation_cosine"] <= 1.0


def test_logits_stay_float32_under_bf16_autocast() -> None:
    torch.manual_seed(9)
    head = ProjectionHead(8, 4).float()
    e1, e2 = torch.randn(12, 8, dtype=torch.float32), torch.randn(12, 8, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = vascl_loss(e1, e2, head, k=3)
        z = project(head, e1)
        simcse = simcse_loss(z, project(head, e2))
    assert z.dtype == torch.bfloat16  # the head really ran in bf16 ...
    assert loss.dtype == torch.float32 and simcse.dtype == torch.float32  # ... the loss did not
    full, _ = vascl_loss(e1, e2, head, k=3, generator=torch.Generator().manual_seed(0))
    assert torch.isfinite(full)


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(k=5), "k must be < the global batch size - 1 = 5"),
        (dict(k=6), "k must be < the global batch size - 1 = 5"),
        (dict(k=0), "k \\(neighbours per instance\\)"),
        (dict(k=2.5), "k \\(neighbours per instance\\)"),
        (dict(temperature=0.0), "temperature must be > 0"),
        (dict(temperature=-1.0), "temperature must be > 0"),
        (dict(eps=-0.1), "eps .* must be >= 0"),
        (dict(xi=0.0), "xi .* must be > 0"),
        (dict(power_iters=0), "power_iters must be an integer >= 1"),
        (dict(power_iters=1.5), "power_iters must be an integer >= 1"),
        (dict(init_dir=torch.zeros(6, 3)), "init_dir must have the shape of e1"),
        (dict(similarity="l2"), "similarity must be one of dot, cosine"),
        (dict(eps_mode="scaled"), "eps_mode must be one of absolute, relative, relative_instance"),
        (dict(xi_mode="per-batch"), "xi_mode must be one of absolute, relative, relative_instance"),
    ],
)
def test_vascl_bad_input(kwargs, match) -> None:
    e = torch.randn(6, 4)
    with pytest.raises(ValueError, match=match):
        vascl_loss(e, e, ProjectionHead(4, 3), **{"k": 2, **kwargs})


def test_bad_shapes() -> None:
    head = ProjectionHead(4, 3)
    with pytest.raises(ValueError, match="same shape"):
        vascl_loss(torch.randn(6, 4), torch.randn(5, 4), head, k=2)
    with pytest.raises(ValueError, match="2-D"):
        vascl_loss(torch.randn(6), torch.randn(6), head, k=2)
    with pytest.raises(ValueError, match="same shape"):
        simcse_loss(torch.randn(3, 4), torch.randn(3, 5))
    with pytest.raises(ValueError, match="no rows"):
        simcse_loss(torch.randn(0, 4), torch.randn(0, 4))
    with pytest.raises(ValueError, match="temperature"):
        simcse_loss(torch.randn(3, 4), torch.randn(3, 4), temperature=0)


def test_loss_code_never_imports_torch_distributed() -> None:
    losses_dir = Path(__file__).resolve().parents[1] / "vascl_scale" / "losses"
    for source in losses_dir.glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [f"{node.module}.{alias.name}" for alias in node.names]
            assert not any(n.startswith("torch.distributed") for n in names), f"{source.name} imports {names}"


def test_block_row_is_the_rank_major_then_view_major_layout_of_the_gathered_blocks() -> None:
    from vascl_scale.distributed import block_row

    world, views, rows = 3, 2, 4
    # Rank r's block [v_0; v_1] holds 100 r + 10 v + i at row i of view v; gathered rank by rank.
    gathered = torch.cat(
        [torch.tensor([100 * r + 10 * v + i for v in range(views) for i in range(rows)]) for r in range(world)]
    )
    for r in range(world):
        for v in range(views):
            for i in range(rows):
                assert gathered[block_row(r, v, i, views, rows)] == 100 * r + 10 * v + i
    ranks, own = torch.tensor([[2, 0], [1, 1]]), torch.tensor([[3, 0], [1, 2]])
    assert gathered[block_row(ranks, 1, own, views, rows)].tolist() == [[213, 10], [111, 112]]


def test_declarations_stand_the_anchor_in_for_a_missing_positive_and_name_what_is_missing() -> None:
    from vascl_scale.losses import OBJECTIVES, ObjectiveSpec

    for name in ("simcse", "vascl"):
        assert OBJECTIVES[name].inputs == ("anchor", "positive")
        assert OBJECTIVES[name].encoded_columns(("anchor",)) == ("anchor", "anchor")  # a second dropout view
        assert OBJECTIVES[name].encoded_columns(("positive", "anchor")) == ("anchor", "positive")
    triplets = ObjectiveSpec("triplets", ("anchor", "positive", "negative_0"))
    assert triplets.missing_columns(("anchor", "positive", "negative_0")) == ()
    with pytest.raises(
        ValueError,
        match=r"objective 'triplets' needs the column\(s\) positive, negative_0, which the batch lacks \(its columns: anchor\)",
    ):
        triplets.encoded_columns(("anchor",))


def test_the_objective_is_called_with_its_views_in_declared_order() -> None:
    from vascl_scale.config import LossConfig
    from vascl_scale.losses import OBJECTIVES, build_objective

    head = ProjectionHead(4, 3)
    anchor, positive = torch.randn(6, 4, dtype=torch.float64), torch.randn(6, 4, dtype=torch.float64)
    head.double()
    settings = LossConfig(k=2, temperature=0.1).model_dump()
    simcse = build_objective("simcse", settings)([anchor, positive], head)
    assert torch.equal(simcse.loss, simcse_loss(project(head, anchor), project(head, positive), temperature=0.1))
    vascl = build_objective("vascl", settings)([anchor, positive], head, torch.Generator().manual_seed(3))
    vascl_settings = {key: settings[key] for key in OBJECTIVES["vascl"].loss_keys}
    expected = vascl_objective(
        anchor, positive, head, generator=torch.Generator().manual_seed(3), with_stats=False, **vascl_settings
    )
    assert torch.equal(vascl.loss, expected.loss)
    with pytest.raises(
        ValueError,
        match="objective must be one of 'vascl', 'simcse', 'simcse_sup', 'pairsupcon', 'distill_kl', 'margin_mse'; got 'simclr'",
    ):
        build_objective("simclr", settings)


class _RecordedSettings(dict):
    """A ``loss`` section that records the keys read from it."""

    def __init__(self, values) -> None:
        super().__init__(values)
        self.read: set[str] = set()

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)


def test_each_objective_reads_exactly_its_declared_loss_keys() -> None:
    from vascl_scale.config import LossConfig
    from vascl_scale.losses import OBJECTIVES, build_objective
    from vascl_scale.losses.spec import COMMON_LOSS_KEYS

    declared = set(COMMON_LOSS_KEYS)  # the options around every objective (false negatives, Matryoshka)
    for name, spec in OBJECTIVES.items():
        settings = _RecordedSettings(LossConfig().model_dump())
        build_objective(name, settings)
        assert settings.read - set(COMMON_LOSS_KEYS) == set(spec.loss_keys), name
        declared |= set(spec.loss_keys)
    assert declared == set(LossConfig.model_fields)  # every key of the section is some objective's


def reference_simcse_sup(anchor, positive, negatives, head, temperature, alpha):
    """Supervised SimCSE written from Gao et al. 2021, Eq. 5, with N hard negatives per anchor,
    one anchor and one candidate at a time: h = head(e), sim the cosine, every positive and
    every hard negative of the batch in the denominator, alpha added to the logits of the
    anchor's own N hard negatives."""
    h, h_pos = head(anchor), head(positive)  # (B, D) each
    h_negs = [head(negative) for negative in negatives]  # N x (B, D)
    rows = h.shape[0]

    def sim(a, b):
        return (a * b).sum() / (a.norm() * b.norm())

    losses = []
    for i in range(rows):
        logits = [sim(h[i], h_pos[j]) / temperature for j in range(rows)]
        for h_neg in h_negs:
            logits += [sim(h[i], h_neg[j]) / temperature + (alpha if j == i else 0.0) for j in range(rows)]
        losses.append(torch.logsumexp(torch.stack(logits), dim=0) - logits[i])
    return torch.stack(losses).mean()


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("alpha", [0.0, 1.5, -0.7])
@pytest.mark.parametrize("negatives", [1, 2, 3])
def test_simcse_sup_matches_the_loop_reference_in_value_and_gradient(seed: int, alpha: float, negatives: int) -> None:
    from vascl_scale.config import LossConfig
    from vascl_scale.losses import build_objective

    torch.manual_seed(seed)
    head = ProjectionHead(6, 4)
    views = [torch.randn(5, 6, requires_grad=True) for _ in range(2 + negatives)]  # anchor, positive, N negatives
    objective = build_objective("simcse_sup", LossConfig(temperature=0.1, hard_negative_weight=alpha).model_dump())
    got = objective(views, head).loss
    got_grads = torch.autograd.grad(got, [*views, *head.parameters()])
    expected = reference_simcse_sup(views[0], views[1], views[2:], head, 0.1, alpha)
    expected_grads = torch.autograd.grad(expected, [*views, *head.parameters()])
    torch.testing.assert_close(got, expected)
    for ours, theirs in zip(got_grads, expected_grads):
        assert ours.abs().max() > 0  # every view, every negative column among them, gets a gradient
        torch.testing.assert_close(ours, theirs)


def test_simcse_sup_weight_is_on_the_own_hard_negatives_only_and_blocks_equal_one_matrix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """alpha changes the loss; alpha -> -inf removes each anchor's own N = 2 hard negatives only
    (its row of candidates then lacks those two columns); the blocked path is the one-matrix path."""
    import vascl_scale.losses.contrastive as contrastive
    from vascl_scale.losses.simcse import simcse_sup_loss

    z = [_unit(torch.randn(6, 4, requires_grad=True)) for _ in range(4)]  # anchor, positive, 2 negatives
    plain = simcse_sup_loss(*z, temperature=0.5)
    assert simcse_sup_loss(*z, temperature=0.5, hard_negative_weight=2.0) > plain
    without_own = simcse_sup_loss(*z, temperature=0.5, hard_negative_weight=-1e4)
    expected = []
    for i in range(6):
        others = torch.cat([torch.cat([negative[:i], negative[i + 1 :]]) for negative in z[2:]])  # (2 (B - 1), D)
        logits = torch.cat([z[1] @ z[0][i], others @ z[0][i]]) / 0.5
        expected.append(torch.logsumexp(logits, dim=0) - logits[i])
    torch.testing.assert_close(without_own, torch.stack(expected).mean())
    monkeypatch.setattr(contrastive, "LOGITS_BLOCK_ELEMENTS", 20)  # blocks of 1 anchor row (18 candidates)
    blocked = simcse_sup_loss(*z, temperature=0.5, hard_negative_weight=2.0)
    monkeypatch.undo()
    torch.testing.assert_close(blocked, simcse_sup_loss(*z, temperature=0.5, hard_negative_weight=2.0))


def test_simcse_sup_encodes_every_hard_negative_of_the_data_and_counts_its_flops() -> None:
    from vascl_scale.config import LossConfig
    from vascl_scale.flops import head_forward_flops
    from vascl_scale.losses import OBJECTIVES, build_objective

    spec = OBJECTIVES["simcse_sup"]
    assert spec.inputs == ("anchor", "positive") and spec.hard_negatives and not spec.stand_ins
    triplets, quintuples = (
        ("anchor", "positive", "negative_0"),
        ("negative_2", "anchor", "negative_0", "positive", "negative_1"),
    )
    assert spec.encoded_columns(triplets) == triplets
    assert spec.encoded_columns(quintuples) == ("anchor", "positive", "negative_0", "negative_1", "negative_2")
    assert spec.columns_read(quintuples) == quintuples and spec.unread_columns(quintuples) == ()
    # Numbered from 0 without gaps: a negative after a gap is not one of the N.
    assert spec.encoded_columns(("anchor", "positive", "negative_0", "negative_2")) == triplets
    assert spec.unread_columns(("anchor", "positive", "negative_0", "negative_2")) == ("negative_2",)
    for data, missing in (
        (("anchor",), "positive, negative_0"),
        (("anchor", "positive"), "negative_0"),
        (("anchor", "positive", "negative_1"), "negative_0"),
    ):
        with pytest.raises(
            ValueError, match=rf"objective 'simcse_sup' needs the column\(s\) {missing}, which the batch lacks"
        ):
            spec.encoded_columns(data)
    settings = LossConfig().model_dump()
    rows, global_rows, hidden, out_dim = 4, 16, 32, 8
    for negatives in (1, 3):
        views = 2 + negatives
        # (2 + N) b rows through the head; b anchors against (1 + N) B candidates; forward and backward (x 3).
        expected = 3 * (
            head_forward_flops(views * rows, hidden, out_dim) + 2 * rows * (1 + negatives) * global_rows * out_dim
        )
        assert (
            build_objective("simcse_sup", settings).model_flops(views, rows, global_rows, hidden, out_dim) == expected
        )
    # The unsupervised one: 2b rows through the head, (2b, 2B) logits.
    unsupervised = 3 * (head_forward_flops(2 * rows, hidden, out_dim) + 2 * (2 * rows) * (2 * global_rows) * out_dim)
    assert build_objective("simcse", settings).model_flops(2, rows, global_rows, hidden, out_dim) == unsupervised


def test_the_unsupervised_objectives_leave_hard_negatives_unread_and_name_who_reads_them() -> None:
    from vascl_scale.losses import OBJECTIVES
    from vascl_scale.losses.spec import objectives_reading_all

    quadruples = ("anchor", "positive", "negative_0", "negative_1")
    for name in ("simcse", "vascl"):
        assert OBJECTIVES[name].columns_read(quadruples) == ("anchor", "positive")
        assert OBJECTIVES[name].unread_columns(quadruples) == ("negative_0", "negative_1")
        assert OBJECTIVES[name].unread_columns(("anchor",)) == ()
    assert objectives_reading_all(quadruples) == ("simcse_sup",)
    assert objectives_reading_all(("anchor", "positive")) == ("vascl", "simcse")


def test_simcse_sup_refuses_bad_input() -> None:
    from vascl_scale.losses.simcse import simcse_sup_loss

    z = _unit(torch.randn(4, 3))
    with pytest.raises(ValueError, match=r"z_anchor and z_negatives\[1\] must have the same shape"):
        simcse_sup_loss(z, z, z, z[:3])
    with pytest.raises(ValueError, match="needs at least one hard negative per anchor"):
        simcse_sup_loss(z, z)
    with pytest.raises(ValueError, match="hard_negative_weight must be a finite number"):
        simcse_sup_loss(z, z, z, hard_negative_weight=float("nan"))


def reference_pairsupcon(e1, e2, labels, head, classifier_weight, temperature, contrast_type, beta):
    """PairSupCon written from the authors' code (PairSupCon/utils/contrastive_utils.py
    HardConLoss, models/Transformers.py, training.py), one anchor and one negative at a time:
    features [f1; f2] of the B pairs; anchor a (2B of them) against its pair's other text and the
    2B - 2 features whose row is not its pair's (the authors' ~eye(B).repeat(2, 2)); only label-1
    anchors summed, over their count; "HardNeg": negimp = neg.log().exp() (with gradient),
    Ng = sum(negimp * neg) / mean(negimp). The classifier Linear(3d, 2, no bias) on [u, v, |u - v|],
    mean cross-entropy over the B pairs; loss = beta * instdisc + classification."""
    rows = e1.shape[0]
    f1 = [F.normalize(head(e1[i]), dim=0) for i in range(rows)]
    f2 = [F.normalize(head(e2[i]), dim=0) for i in range(rows)]
    features = f1 + f2
    total, anchors = 0.0, 0
    for a in range(2 * rows):
        pair = a % rows
        if labels[pair] != 1:
            continue
        pos = torch.exp((f1[pair] * f2[pair]).sum() / temperature)
        neg = [torch.exp((features[a] * features[j]).sum() / temperature) for j in range(2 * rows) if j % rows != pair]
        if contrast_type == "orig":
            ng = sum(neg)
        else:
            negimp = [n.log().exp() for n in neg]
            ng = sum(w * n for w, n in zip(negimp, neg)) / (sum(negimp) / len(negimp))
        total = total - torch.log(pos / (ng + pos))
        anchors += 1
    instdisc = total / anchors
    cross_entropy = []
    for i in range(rows):
        logits = classifier_weight @ torch.cat([e1[i], e2[i], (e1[i] - e2[i]).abs()])  # (2,)
        cross_entropy.append(torch.logsumexp(logits, dim=0) - logits[labels[i]])
    classification = torch.stack(cross_entropy).mean()
    return beta * instdisc + classification, instdisc, classification


def _pairsupcon_parts(seed: int, rows: int = 5, hidden: int = 6):
    from vascl_scale.model import PairClassifier

    torch.manual_seed(seed)
    head, classifier = ProjectionHead(hidden, 4), PairClassifier(hidden)
    views = [torch.randn(rows, hidden, requires_grad=True) for _ in range(2)]  # e1, e2 of the pairs
    return head, classifier, views


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("contrast_type", ["orig", "hardneg"])
@pytest.mark.parametrize("beta", [1.0, 0.3])
def test_pairsupcon_matches_the_loop_reference_of_the_authors_code_in_value_and_gradient(
    seed, contrast_type, beta
) -> None:
    from vascl_scale.config import LossConfig
    from vascl_scale.losses import build_objective

    head, classifier, views = _pairsupcon_parts(seed)
    labels = torch.tensor([1, 0, 1, 1, 0])
    settings = LossConfig(temperature=0.1, contrast_type=contrast_type, beta=beta).model_dump()
    out = build_objective("pairsupcon", settings)(views, head, labels=labels, classifier=classifier, with_stats=True)
    parameters = [*views, *head.parameters(), classifier.linear.weight]
    got_grads = torch.autograd.grad(out.loss, parameters)
    expected, instdisc, classification = reference_pairsupcon(
        *views, labels, head, classifier.linear.weight, 0.1, contrast_type, beta
    )
    expected_grads = torch.autograd.grad(expected, parameters)
    torch.testing.assert_close(out.loss, expected)
    torch.testing.assert_close(out.terms["instdisc"], instdisc.detach())
    torch.testing.assert_close(out.terms["classification"], classification.detach())
    for ours, theirs in zip(got_grads, expected_grads):
        torch.testing.assert_close(ours, theirs)
    assert set(out.stats) == {"loss", "instdisc", "classification", "classifier_accuracy"}


def test_pairsupcon_hardness_weights_carry_gradient_and_count_only_label_1_anchors() -> None:
    """The authors' weights are not detached: detaching them gives another gradient (the same
    value). Label-0 pairs are no anchors, but their features are negatives of every anchor;
    without any positive pair the instance loss is 0, not 0 / 0."""
    from vascl_scale.losses.pairsupcon import hard_contrastive_loss

    head, _, (e1, e2) = _pairsupcon_parts(3)
    z1, z2 = project(head, e1), project(head, e2)
    labels = torch.tensor([1, 0, 1, 1, 0])
    loss = hard_contrastive_loss(z1, z2, labels, temperature=0.1)
    (ours,) = torch.autograd.grad(loss, e1, retain_graph=True)
    anchors = torch.cat([z1, z2])  # (2B, D), every pair's own two rows masked below
    logits = anchors @ anchors.T / 0.1
    own = torch.cat([torch.arange(5), torch.arange(5)])
    negatives = logits.masked_fill(own[:, None] == own[None, :], float("-inf"))
    weights = negatives.detach().softmax(dim=1) * 8  # w_aj = e^{s_aj} / mean_j e^{s_aj}, as constants
    log_n = torch.logsumexp(negatives + weights.log(), dim=1)
    positive = torch.cat([(z1 * z2).sum(-1), (z1 * z2).sum(-1)]) / 0.1
    per_anchor = torch.logaddexp(positive, log_n) - positive
    is_anchor = torch.cat([labels, labels]) == 1
    detached = per_anchor[is_anchor].mean()
    torch.testing.assert_close(detached, loss)
    (theirs,) = torch.autograd.grad(detached, e1)
    assert not torch.allclose(ours, theirs), "detached hardness weights gave the same gradient"
    without_negatives_rows = hard_contrastive_loss(z1[[0, 2, 3]], z2[[0, 2, 3]], labels[[0, 2, 3]], temperature=0.1)
    assert not torch.isclose(without_negatives_rows, loss)  # the label-0 pairs' features are negatives
    none = hard_contrastive_loss(z1, z2, torch.zeros(5, dtype=torch.long), temperature=0.1)
    assert none.item() == 0.0


def test_pairsupcon_declares_labelled_pairs_and_the_classifier_and_counts_its_flops() -> None:
    from vascl_scale.config import LossConfig
    from vascl_scale.flops import classifier_forward_flops, head_forward_flops
    from vascl_scale.losses import OBJECTIVES, build_objective

    spec = OBJECTIVES["pairsupcon"]
    assert spec.inputs == ("anchor", "paired") and spec.label == "label" and spec.classifier and not spec.stand_ins
    assert spec.columns_read(("anchor", "positive", "paired", "label", "negative_0")) == ("anchor", "paired", "label")
    assert spec.encoded_columns(("anchor", "paired", "label")) == ("anchor", "paired")
    with pytest.raises(
        ValueError, match=r"objective 'pairsupcon' needs the column\(s\) paired, label, which the batch lacks"
    ):
        spec.encoded_columns(("anchor", "positive", "negative_0"))
    rows, global_rows, hidden, out_dim = 4, 16, 32, 8
    # 2b rows through the head, (2b, 2B) logits, the classifier's 3d x 2 on b pairs; forward and backward.
    expected = 3 * (head_forward_flops(2 * rows, hidden, out_dim) + 2 * (2 * rows) * (2 * global_rows) * out_dim)
    expected += 3 * 2 * rows * 3 * hidden * 2
    assert classifier_forward_flops(rows, hidden, 2) == 2 * rows * 3 * hidden * 2
    assert (
        build_objective("pairsupcon", LossConfig().model_dump()).model_flops(2, rows, global_rows, hidden, out_dim)
        == expected
    )


def test_pairsupcon_refuses_bad_settings_and_labels() -> None:
    from vascl_scale.config import LossConfig
    from vascl_scale.losses.pairsupcon import hard_contrastive_loss

    assert LossConfig().contrast_type == "hardneg" and LossConfig().beta == 1.0  # the authors' defaults
    with pytest.raises(ValueError, match=r"loss.contrast_type must be one of 'orig', 'hardneg'; got 'HardNeg'"):
        LossConfig(contrast_type="HardNeg")
    with pytest.raises(ValueError, match=r"loss.beta .* must be a finite number >= 0 \(the authors use 1\); got -1"):
        LossConfig(beta=-1)
    z = _unit(torch.randn(4, 3))
    with pytest.raises(ValueError, match=r"labels must hold one integer per pair, shape \(4,\)"):
        hard_contrastive_loss(z, z, torch.ones(3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"labels must hold one integer per pair"):
        hard_contrastive_loss(z, z, torch.ones(4))
    with pytest.raises(ValueError, match="at least 2 pairs in the global batch"):
        hard_contrastive_loss(z[:1], z[:1], torch.ones(1, dtype=torch.long))

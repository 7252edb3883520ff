"""Many ranks = one process: the global-batch objectives on real gloo ranks (W = 2 and 4).

One fixed global batch of 12 sentences is split across ranks; each rank pads its slice to
its own longest sentence (as dynamic padding does), so the slices differ in shape and
content. Loss (mean over ranks), neighbour indices, perturbations and rank-averaged
parameter gradients must equal one process on the whole batch, in float64. Supervised SimCSE
gets tuples of 2 + N columns (N = 1 and 2 hard negatives, each column trimmed per slice), with and
without its hard-negative weight.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.gloo import mean_over_ranks, run_on_ranks
from tests.tiny import tiny_encoder, token_batch
from vascl_scale.losses import simcse_loss, vascl_objective
from vascl_scale.losses.vascl import project

GLOBAL_BATCH = 12
SEQ_LEN = 7
K = 3
CASES = (
    "vascl_detach",
    "vascl_literal",
    "vascl_detach_one_iteration",
    "vascl_literal_three_iterations",
    "vascl_relative_cosine",
    "vascl_instance_literal",
    "simcse",
)
# Settings of each VaSCL case beyond the shared ones.
VASCL_CASES = {
    "vascl_detach": dict(detach=True),
    "vascl_literal": dict(detach=False),
    "vascl_detach_one_iteration": dict(detach=True, power_iters=1),
    "vascl_literal_three_iterations": dict(detach=False, power_iters=3),
    "vascl_relative_cosine": dict(
        detach=True, similarity="cosine", eps_mode="relative", xi_mode="relative", eps=0.8, xi=0.5
    ),
    "vascl_instance_literal": dict(
        detach=False, eps_mode="relative_instance", xi_mode="relative_instance", eps=0.8, xi=0.5
    ),
}


def _slice_batch(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Trim a slice to its own longest row, as the data loader's dynamic padding does."""
    longest = int(mask.sum(dim=1).max())
    return ids[:, :longest], mask[:, :longest]


def objective_on_slice(rank: int, world_size: int) -> dict[str, dict[str, np.ndarray]]:
    """Every case on this rank's slice; world_size 1 (no process group) is the reference."""
    model = tiny_encoder(seed=0)
    ids1, mask1 = token_batch(GLOBAL_BATCH, SEQ_LEN, seed=1)
    ids2, mask2 = token_batch(GLOBAL_BATCH, SEQ_LEN, seed=2)  # a different "view" per row
    init_dir = torch.rand(GLOBAL_BATCH, model.hidden_size, generator=torch.Generator().manual_seed(3)) - 0.5
    rows = GLOBAL_BATCH // world_size
    own = slice(rank * rows, (rank + 1) * rows)

    results = {}
    for case in CASES:
        model.zero_grad(set_to_none=False)
        e1 = model(*_slice_batch(ids1[own], mask1[own]))  # (b, d)
        e2 = model(*_slice_batch(ids2[own], mask2[own]))
        extras = {}
        if case == "simcse":
            loss = simcse_loss(project(model.head, e1), project(model.head, e2), temperature=0.1)
        else:
            settings = {"k": K, "temperature": 0.1, "xi": 2.0, "eps": 3.0, "power_iters": 2, **VASCL_CASES[case]}
            out = vascl_objective(e1, e2, model.head, init_dir=init_dir[own].double(), **settings)
            loss = out.loss
            extras = {"neighbours": out.neighbours.numpy(), "delta": out.delta.detach().numpy()}
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.requires_grad])
        mean_loss = loss.detach().clone()
        mean_over_ranks(world_size, grads, mean_loss)
        results[case] = {"loss": mean_loss.numpy(), "grads": grads.numpy(), **extras}
    return results


def unequal_rows(rank: int, world_size: int) -> str:
    """Rank r holds 3 + r rows: both losses must refuse with a clear message."""
    e = torch.randn(3 + rank, 8, dtype=torch.float64)
    head = torch.nn.Linear(8, 4).double()
    messages = []
    for call in (
        lambda: simcse_loss(torch.nn.functional.normalize(e, dim=-1), torch.nn.functional.normalize(e, dim=-1)),
        lambda: vascl_objective(e, e, head, k=1),
    ):
        try:
            call()
            messages.append("no error")
        except ValueError as err:
            messages.append(str(err))
    return " | ".join(messages)


@pytest.fixture(scope="module")
def reference() -> dict[str, dict[str, np.ndarray]]:
    return objective_on_slice(rank=0, world_size=1)


@pytest.mark.e2e
@pytest.mark.parametrize("world_size", [2, 4])
def test_many_ranks_equal_one_process(world_size: int, reference) -> None:
    per_rank = run_on_ranks(objective_on_slice, world_size)
    for case in CASES:
        expected = reference[case]
        for got in per_rank:
            # Every rank holds the same rank-averaged loss and gradients.
            torch.testing.assert_close(torch.from_numpy(got[case]["loss"]), torch.from_numpy(expected["loss"]))
            torch.testing.assert_close(torch.from_numpy(got[case]["grads"]), torch.from_numpy(expected["grads"]))
        if case == "simcse":
            continue
        neighbours = np.concatenate([got[case]["neighbours"] for got in per_rank])
        np.testing.assert_array_equal(neighbours, expected["neighbours"])
        delta = np.concatenate([got[case]["delta"] for got in per_rank])
        torch.testing.assert_close(torch.from_numpy(delta), torch.from_numpy(expected["delta"]))
    # The check is only meaningful if neighbourhoods really span several ranks' slices.
    rows = GLOBAL_BATCH // world_size
    owner_of_anchor = np.arange(GLOBAL_BATCH)[:, None] // rows
    assert (reference["vascl_detach"]["neighbours"] // rows != owner_of_anchor).any()


def test_detach_modes_differ(reference) -> None:
    """The two gradient modes must give different gradients, or the test above proves less."""
    assert not np.allclose(reference["vascl_detach"]["grads"], reference["vascl_literal"]["grads"])


@pytest.mark.e2e
def test_unequal_rows_are_refused() -> None:
    for message in run_on_ranks(unequal_rows, 2):
        parts = message.split(" | ")
        assert len(parts) == 2
        for part in parts:
            assert "same number of rows" in part and "[3, 4]" in part


def gather_backward(rank: int, world_size: int, device: str) -> dict[str, object]:
    """Rank r owns rows [r + 1, ...] and weighs the gathered (W * 2, 3) rows by (r + 1) * j:
    the gradient of its two rows is the sum of every rank's weights for them. Also the
    deprecation warnings the gather and its backward raised (torch warns on old collective names)."""
    import warnings

    from vascl_scale.distributed import all_gather_with_grad, record_traffic

    dtype = torch.float64 if device == "cpu" else torch.float32
    local = torch.full((2, 3), float(rank + 1), dtype=dtype, device=device, requires_grad=True)  # (b, d)
    weights = (rank + 1) * torch.arange(world_size * 2 * 3, dtype=dtype, device=device).reshape(world_size * 2, 3)
    with record_traffic() as traffic, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gathered = all_gather_with_grad(local)  # (W * b, d)
        (weights * gathered).sum().backward()
    deprecations = [str(w.message) for w in caught if issubclass(w.category, (FutureWarning, DeprecationWarning))]
    return {
        "gathered": gathered.detach().cpu().numpy(),
        "grad": local.grad.cpu().numpy(),
        "collectives": [c for c, _, _ in traffic],
        "deprecations": deprecations,
    }


def _expected_gather(world_size: int) -> tuple[np.ndarray, list[np.ndarray]]:
    rows = np.arange(world_size * 2 * 3, dtype=np.float64).reshape(world_size * 2, 3)
    summed = rows * sum(r + 1 for r in range(world_size))  # every rank's weights for every row
    gathered = np.repeat(np.arange(1, world_size + 1, dtype=np.float64), 2)[:, None] * np.ones((1, 3))
    return gathered, [summed[2 * r : 2 * r + 2] for r in range(world_size)]


@pytest.mark.e2e
@pytest.mark.parametrize("world_size", [2, 4])
def test_the_gather_backward_sums_every_ranks_gradient_into_the_owner_with_all_reduce_on_gloo(world_size: int) -> None:
    gathered, grads = _expected_gather(world_size)
    for rank, result in enumerate(run_on_ranks(gather_backward, world_size, "cpu")):
        np.testing.assert_array_equal(result["gathered"], gathered)
        np.testing.assert_array_equal(result["grad"], grads[rank])
        assert result["collectives"] == ["all_gather", "all_reduce"]  # gloo has no reduce-scatter
        assert result["deprecations"] == []


@pytest.mark.e2e
@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs a GPU per rank: 2 or more GPUs")
def test_the_gather_backward_reduce_scatters_on_nccl() -> None:
    gathered, grads = _expected_gather(2)
    for rank, result in enumerate(run_on_ranks(gather_backward, 2, "cuda", backend="nccl")):
        np.testing.assert_allclose(result["gathered"], gathered)
        np.testing.assert_allclose(result["grad"], grads[rank])
        assert result["collectives"] == ["all_gather", "reduce_scatter"]
        assert result["deprecations"] == []  # reduce_scatter_tensor warns on torch 2.13


SUP_ALPHAS = (0.0, 1.5)  # supervised SimCSE's hard_negative_weight: the paper's Eq. 5, and weighted hard negatives
SUP_NEGATIVES = (1, 2)  # hard-negative columns: SimCSE's triplets, and MNRL's n-tuples


def simcse_sup_on_slice(rank: int, world_size: int) -> dict[tuple[int, float], dict[str, np.ndarray]]:
    """Supervised SimCSE on this rank's tuples of 2 + N columns, each trimmed to this slice's own
    longest row, for N = 1 and 2; world_size 1 (no process group) is the reference."""
    from vascl_scale.config import LossConfig
    from vascl_scale.losses import build_objective

    model = tiny_encoder(seed=0)
    # anchor, positive, negative_0, negative_1: other tokens in each column
    columns = [token_batch(GLOBAL_BATCH, SEQ_LEN, seed=seed) for seed in (1, 2, 4, 5)]
    rows = GLOBAL_BATCH // world_size
    own = slice(rank * rows, (rank + 1) * rows)
    results = {}
    for negatives in SUP_NEGATIVES:
        for alpha in SUP_ALPHAS:
            objective = build_objective(
                "simcse_sup", LossConfig(temperature=0.1, hard_negative_weight=alpha).model_dump()
            )
            model.zero_grad(set_to_none=False)
            views = [model(*_slice_batch(ids[own], mask[own])) for ids, mask in columns[: 2 + negatives]]  # (b, d) each
            loss = objective(views, model.head).loss
            loss.backward()
            grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.requires_grad])
            mean_loss = loss.detach().clone()
            mean_over_ranks(world_size, grads, mean_loss)
            results[negatives, alpha] = {"loss": mean_loss.numpy(), "grads": grads.numpy()}
    return results


@pytest.mark.e2e
@pytest.mark.parametrize("world_size", [2, 4])
def test_simcse_sup_many_ranks_equal_one_process(world_size: int) -> None:
    reference = simcse_sup_on_slice(rank=0, world_size=1)
    for negatives in SUP_NEGATIVES:  # alpha matters, and so does the second hard negative
        assert not np.allclose(reference[negatives, SUP_ALPHAS[0]]["loss"], reference[negatives, SUP_ALPHAS[1]]["loss"])
    assert not np.allclose(reference[1, SUP_ALPHAS[1]]["grads"], reference[2, SUP_ALPHAS[1]]["grads"])
    for rank, got in enumerate(run_on_ranks(simcse_sup_on_slice, world_size)):
        for case, expected in reference.items():
            for key in ("loss", "grads"):
                what = f"{key}, (N, alpha) = {case}, rank {rank} of {world_size}"
                torch.testing.assert_close(
                    torch.from_numpy(got[case][key]), torch.from_numpy(expected[key]), msg=lambda m: f"{what}: {m}"
                )


# Labels of the 12 pairs: the positives fall unevenly over the ranks (W = 2: 2 and 5; W = 4: 2, 0, 2, 3),
# so the count of positive anchors must be the global one.
PAIR_LABELS = (1, 1, 0, 0, 0, 0, 1, 0, 1, 1, 1, 1)
CONTRAST_TYPES = ("orig", "hardneg")


def pairsupcon_on_slice(rank: int, world_size: int) -> dict[str, dict[str, np.ndarray]]:
    """PairSupCon on this rank's labelled pairs (each text column trimmed to the slice's own
    longest row), both contrast types, the classifier included; world_size 1 is the reference."""
    from vascl_scale.config import LossConfig
    from vascl_scale.losses import build_objective

    model = tiny_encoder(seed=0, pair_classifier=True)
    columns = [token_batch(GLOBAL_BATCH, SEQ_LEN, seed=seed) for seed in (1, 2)]  # anchor, paired
    labels = torch.tensor(PAIR_LABELS)
    rows = GLOBAL_BATCH // world_size
    own = slice(rank * rows, (rank + 1) * rows)
    results = {}
    for contrast_type in CONTRAST_TYPES:
        objective = build_objective(
            "pairsupcon", LossConfig(temperature=0.1, contrast_type=contrast_type, beta=0.7).model_dump()
        )
        model.zero_grad(set_to_none=False)
        views = [model(*_slice_batch(ids[own], mask[own])) for ids, mask in columns]  # (b, d) each
        out = objective(views, model.head, labels=labels[own], classifier=model.classifier)
        out.loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.requires_grad])
        values = torch.stack([out.loss.detach(), out.terms["instdisc"], out.terms["classification"]])
        mean_over_ranks(world_size, grads, values)
        results[contrast_type] = {"values": values.numpy(), "grads": grads.numpy()}
    return results


@pytest.mark.e2e
@pytest.mark.parametrize("world_size", [2, 4])
def test_pairsupcon_many_ranks_equal_one_process(world_size: int) -> None:
    reference = pairsupcon_on_slice(rank=0, world_size=1)
    assert not np.allclose(reference["orig"]["values"], reference["hardneg"]["values"])  # the contrast type matters
    for got in run_on_ranks(pairsupcon_on_slice, world_size):
        for contrast_type in CONTRAST_TYPES:
            expected = reference[contrast_type]
            torch.testing.assert_close(
                torch.from_numpy(got[contrast_type]["values"]), torch.from_numpy(expected["values"])
            )
            torch.testing.assert_close(
                torch.from_numpy(got[contrast_type]["grads"]), torch.from_numpy(expected["grads"])
            )

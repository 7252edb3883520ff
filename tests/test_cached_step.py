"""The cached step (``train.chunk_size``) is the one-forward step, computed in chunks.

Float64 throughout. With dropout off the cached loss call must give today's loss, neighbours,
delta and parameter gradients; with dropout on the reference is a step that encodes the same
chunks with gradient under the same RNG states, and the replayed forwards must reproduce the
first pass's embeddings exactly while the two views keep different masks. On 2 and 4 gloo
ranks (DDP) the cached optimiser steps must end with the weights of the uncached ones (plain
SGD, so that a wrong gradient scale shows), with exactly one gradient all-reduce per step.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from tests.gloo import run_as_launched
from tests.step_helpers import (
    CASE_IDS,
    CASES,
    CHUNK,
    GLOBAL_BATCH,
    SEQ_LEN,
    assert_close_float64,
    assert_same_call,
    call_and_backward,
    own_batch,
    parameter_gradients,
    portable,
    same_mask_reference,
    step_parts,
)
from tests.tiny import tiny_encoder, token_batch


def one_loss_call(
    rank: int, world_size: int, objective: str, loss: dict, dropout: float, mode: str, positive: bool = False
) -> dict:
    """One loss call and its backward on this rank: "uncached", "cached" or "same_masks"."""
    accelerator, model, step, recorder = step_parts(objective, loss, 0 if mode == "uncached" else CHUNK, dropout)
    forwards: list[tuple[bool, torch.Tensor]] = []
    model.register_forward_hook(
        lambda module, args, output: forwards.append((torch.is_grad_enabled(), output.detach().clone()))
    )
    batch = own_batch(rank, world_size, positive=positive)
    out = same_mask_reference(step, batch, 0) if mode == "same_masks" else call_and_backward(step, batch, mode)
    return {
        "loss": out.loss.detach(),
        "gradients": parameter_gradients(model),
        "recorded": recorder.calls,
        "forwards": forwards,
    }


def loss_calls(
    rank: int, world_size: int, dropout: float, modes: tuple[str, ...], positive: bool = False
) -> list[dict]:
    """:func:`one_loss_call` for every case and mode in one process (starting ranks is what costs)."""
    results = [
        {mode: one_loss_call(rank, world_size, o, loss, dropout, mode, positive) for mode in modes} for o, loss in CASES
    ]
    return portable(results)


@pytest.mark.e2e
def test_without_dropout_the_cached_call_is_the_one_forward_call() -> None:
    (results,) = run_as_launched(loss_calls, 1, 0.0, ("uncached", "cached"))
    for case_id, result in zip(CASE_IDS, results):
        assert_same_call(result["cached"], result["uncached"], case_id)


@pytest.mark.e2e
def test_with_a_positive_column_the_cached_call_is_the_one_forward_call() -> None:
    """A positive of other tokens (a labelled pair's: VaSCL and SimCSE on pairs; or data.augment's):
    each path encodes it as view 2, x_i' of VaSCL."""
    (paired,) = run_as_launched(loss_calls, 1, 0.0, ("uncached", "cached"), True)
    (plain,) = run_as_launched(loss_calls, 1, 0.0, ("uncached",))
    for case_id, result, same_text in zip(CASE_IDS, paired, plain):
        assert_same_call(result["cached"], result["uncached"], f"{case_id}, with a positive column")
        assert abs(result["uncached"]["loss"] - same_text["uncached"]["loss"]) > 1e-6, case_id


def narrow_positive_calls(rank: int, world_size: int) -> dict:
    """One loss call per objective and path on a positive column 2 tokens narrower than the
    anchor ("narrow", as the loader pads each column), and the same batch with the positive
    padded to the anchor's width beforehand ("widened", as the loader padded a second view before
    there were columns); dropout on, so the masks must fall alike too."""
    import torch.nn.functional as F

    rows = GLOBAL_BATCH // world_size
    own = slice(rank * rows, (rank + 1) * rows)
    results = {}
    for objective, loss in (CASES[0], CASES[-1]):
        for mode in ("uncached", "cached"):
            for width in ("narrow", "widened"):
                _, model, step, _ = step_parts(objective, loss, 0 if mode == "uncached" else CHUNK, 0.2)
                batch = own_batch(rank, world_size)
                ids, mask = token_batch(GLOBAL_BATCH, SEQ_LEN - 2, seed=11)  # padding ids are 0 already
                if width == "widened":  # right padding with id 0: what a model without a tokenizer gets
                    ids, mask = F.pad(ids, (0, 2)), F.pad(mask, (0, 2))
                batch["positive"] = {"input_ids": ids[own], "attention_mask": mask[own]}
                out = call_and_backward(step, batch, mode)
                results[objective, mode, width] = {"loss": out.loss.detach(), "gradients": parameter_gradients(model)}
    return portable(results)


@pytest.mark.e2e
def test_columns_of_different_widths_are_encoded_at_one_width_exactly_as_padded_beforehand() -> None:
    (results,) = run_as_launched(narrow_positive_calls, 1)
    for objective, mode, width in results:
        if width == "widened":
            continue
        narrow, widened = results[objective, mode, "narrow"], results[objective, mode, "widened"]
        assert torch.equal(torch.as_tensor(narrow["loss"]), torch.as_tensor(widened["loss"])), (objective, mode)
        for name, gradient in widened["gradients"].items():
            assert torch.equal(torch.as_tensor(narrow["gradients"][name]), torch.as_tensor(gradient)), (
                objective,
                mode,
                name,
            )


@pytest.mark.e2e
def test_with_dropout_the_cached_call_replays_the_masks_of_its_chunks() -> None:
    (results,) = run_as_launched(loss_calls, 1, 0.2, ("same_masks", "cached"))
    for case_id, result in zip(CASE_IDS, results):
        reference, cached = result["same_masks"], result["cached"]
        assert_same_call(cached, reference, f"{case_id}, dropout 0.2")
        # 2 views x 3 chunks without gradient, then the same 6 forwards again with it.
        forwards = cached["forwards"]
        assert [grad for grad, _ in forwards] == [False] * 6 + [True] * 6
        for index in range(6):
            assert (forwards[index][1] == forwards[6 + index][1]).all(), (
                f"{case_id}: forward {index} was not replayed exactly"
            )
        for index in range(3):  # the same sentences in both views, under different masks
            assert abs(forwards[index][1] - forwards[3 + index][1]).max() > 1e-3, (
                f"{case_id}: chunk {index}: the views share masks"
            )
        # And the masks are dropout's: the reference's forwards are the cached step's first pass.
        for index in range(6):
            assert (reference["forwards"][index][1] == forwards[index][1]).all(), case_id


def simcse_sup_calls(rank: int, world_size: int) -> dict:
    """Supervised SimCSE, uncached and cached, on tuples of N = 1 and 2 hard negatives, each
    negative column narrower than the others (each column padded to its own longest), dropout off."""
    results = {}
    for negatives in (1, 2):
        for alpha in (0.0, 1.5):
            for mode in ("uncached", "cached"):
                _, model, step, _ = step_parts(
                    "simcse_sup", {"hard_negative_weight": alpha}, 0 if mode == "uncached" else CHUNK, 0.0
                )
                forwards: list[bool] = []
                model.register_forward_hook(lambda module, args, output: forwards.append(torch.is_grad_enabled()))
                batch = own_batch(rank, world_size, positive=True, negatives=negatives)
                out = call_and_backward(step, batch, mode)
                results[negatives, alpha, mode] = {
                    "loss": out.loss.detach(),
                    "gradients": parameter_gradients(model),
                    "recorded": [],
                    "forwards": forwards,
                }
    return portable(results)


@pytest.mark.e2e
@pytest.mark.parametrize("world_size", [1, 2])
def test_without_dropout_the_cached_simcse_sup_call_is_the_one_forward_call(world_size: int) -> None:
    """On every rank, with 1 and 2 hard negatives; the gathers of the cached call span the ranks
    as the uncached one's do."""
    from vascl_scale.train.step import chunk_count

    chunks = chunk_count(GLOBAL_BATCH // world_size, CHUNK)  # chunks of 3, 3, 2 (W = 1) or 3, 1
    for rank, results in enumerate(run_as_launched(simcse_sup_calls, world_size)):
        for negatives in (1, 2):
            spans = (2 + negatives) * chunks  # every column in chunks
            for alpha in (0.0, 1.5):
                what = f"simcse_sup, N {negatives}, alpha {alpha}, rank {rank} of {world_size}"
                assert_same_call(results[negatives, alpha, "cached"], results[negatives, alpha, "uncached"], what)
                assert results[negatives, alpha, "uncached"]["forwards"] == [True], what  # every column in one forward
                assert results[negatives, alpha, "cached"]["forwards"] == [False] * spans + [True] * spans, what
            assert abs(results[negatives, 0.0, "uncached"]["loss"] - results[negatives, 1.5, "uncached"]["loss"]) > 1e-6
        assert (
            abs(results[1, 1.5, "uncached"]["loss"] - results[2, 1.5, "uncached"]["loss"]) > 1e-6
        )  # the second negative counts


# VaSCL on pairs (the data's positive as x_i'), in both gradient modes, and supervised SimCSE on
# two hard negatives: (objective, loss overrides, hard-negative columns).
PAIRED_CASES = {
    "vascl": ("vascl", {}, 0),
    "vascl-no-detach": ("vascl", {"detach": False}, 0),
    "simcse_sup-2-negatives": ("simcse_sup", {"hard_negative_weight": 1.5}, 2),
}


def paired_calls(rank: int, world_size: int) -> dict:
    """Per paired case and path (uncached, cached): one loss call and its backward on this rank's
    rows of a batch with a positive column, dropout off; DDP averages the gradients over ranks."""
    results = {}
    for case_id, (objective, loss, negatives) in PAIRED_CASES.items():
        for mode in ("uncached", "cached"):
            _, model, step, recorder = step_parts(objective, loss, 0 if mode == "uncached" else CHUNK, 0.0)
            out = call_and_backward(step, own_batch(rank, world_size, positive=True, negatives=negatives), mode)
            results[case_id, mode] = {
                "loss": out.loss.detach(),
                "gradients": parameter_gradients(model),
                "recorded": recorder.calls,
            }
    return portable(results)


@pytest.mark.e2e
def test_on_pairs_two_ranks_equal_one_process_uncached_and_cached() -> None:
    """Through the training step: the rank-mean loss, the averaged gradients and VaSCL's
    neighbours and perturbations of 2 gloo ranks, each holding half the pairs, are those of one
    process on all of them; on one process the cached call is the uncached one."""
    (reference,) = run_as_launched(paired_calls, 1)
    per_rank = run_as_launched(paired_calls, 2)
    for (case_id, mode), expected in reference.items():
        what = f"{case_id}, {mode}"
        if mode == "cached":
            assert_same_call(expected, reference[case_id, "uncached"], f"{what} against uncached, one process")
        assert_close_float64(
            sum(torch.as_tensor(got[case_id, mode]["loss"]) for got in per_rank) / 2,
            expected["loss"],
            f"{what}, mean loss",
        )
        for got in per_rank:
            for name, gradient in expected["gradients"].items():
                assert_close_float64(got[case_id, mode]["gradients"][name], gradient, f"{what}, gradient of {name}")
        for index, call in enumerate(expected["recorded"]):  # VaSCL: this rank's rows of the global batch's
            neighbours = torch.cat(
                [torch.as_tensor(got[case_id, mode]["recorded"][index]["neighbours"]) for got in per_rank]
            )
            assert torch.equal(neighbours, torch.as_tensor(call["neighbours"])), what
            rows = GLOBAL_BATCH // 2  # the check means something only if neighbourhoods span both ranks' rows
            assert (neighbours // rows != torch.arange(GLOBAL_BATCH)[:, None] // rows).any(), what
            delta = torch.cat([torch.as_tensor(got[case_id, mode]["recorded"][index]["delta"]) for got in per_rank])
            assert_close_float64(delta, call["delta"], f"{what}, delta")
        assert len(expected["recorded"]) == (1 if case_id.startswith("vascl") else 0), what


PAIR_LABELS = (1, 0, 1, 1, 0, 0, 1, 1)  # of the global batch's labelled pairs


def _pair_batch(rank: int, world_size: int, seed: int = 10, narrower: int = 0) -> dict:
    """This rank's labelled pairs of the global batch: an anchor, a paired column ``narrower``
    tokens narrower than it (each column padded to its own longest), their labels."""
    batch = own_batch(rank, world_size, seed)
    rows = GLOBAL_BATCH // world_size
    own = slice(rank * rows, (rank + 1) * rows)
    ids, mask = token_batch(GLOBAL_BATCH, SEQ_LEN - narrower, seed=seed + 1)
    batch["paired"] = {"input_ids": ids[own], "attention_mask": mask[own]}
    batch["label"] = torch.tensor(PAIR_LABELS)[own]
    return batch


def pairsupcon_calls(rank: int, world_size: int, dropout: float, modes: tuple[str, ...], narrower: int) -> dict:
    """PairSupCon's loss call and backward per contrast type and mode ("uncached", "cached",
    "same_masks"), recording whether each forward had gradient."""
    results = {}
    for contrast_type in ("orig", "hardneg"):
        for mode in modes:
            _, model, step, _ = step_parts(
                "pairsupcon", {"contrast_type": contrast_type, "beta": 0.5}, 0 if mode == "uncached" else CHUNK, dropout
            )
            forwards: list[bool] = []
            model.register_forward_hook(lambda module, args, output: forwards.append(torch.is_grad_enabled()))
            batch = _pair_batch(rank, world_size, narrower=narrower)
            out = same_mask_reference(step, batch, 0) if mode == "same_masks" else call_and_backward(step, batch, mode)
            results[contrast_type, mode] = {
                "loss": out.loss.detach(),
                "gradients": parameter_gradients(model),
                "recorded": [],
                "forwards": forwards,
            }
    return portable(results)


@pytest.mark.e2e
@pytest.mark.parametrize("world_size", [1, 2])
def test_without_dropout_the_cached_pairsupcon_call_is_the_one_forward_call(world_size: int) -> None:
    """The labels are the rank's rows in both calls, the classifier is trained in both (every
    gradient compared is nonzero, the classifier's included)."""
    from vascl_scale.train.step import chunk_count

    spans = 2 * chunk_count(GLOBAL_BATCH // world_size, CHUNK)  # 2 columns x chunks
    for rank, results in enumerate(run_as_launched(pairsupcon_calls, world_size, 0.0, ("uncached", "cached"), 1)):
        for contrast_type in ("orig", "hardneg"):
            what = f"pairsupcon {contrast_type}, rank {rank} of {world_size}"
            uncached, cached = results[contrast_type, "uncached"], results[contrast_type, "cached"]
            assert "classifier.linear.weight" in uncached["gradients"], what
            assert_same_call(cached, uncached, what)
            assert uncached["forwards"] == [True] and cached["forwards"] == [False] * spans + [True] * spans, what


@pytest.mark.e2e
def test_with_dropout_the_cached_pairsupcon_call_replays_the_masks_of_its_chunks() -> None:
    (results,) = run_as_launched(pairsupcon_calls, 1, 0.2, ("same_masks", "cached"), 0)
    for contrast_type in ("orig", "hardneg"):
        assert_same_call(
            results[contrast_type, "cached"],
            results[contrast_type, "same_masks"],
            f"pairsupcon {contrast_type}, dropout 0.2",
        )


STEPPED = ("vascl", "simcse", "pairsupcon")  # the objectives of the optimiser-step comparison


def optimiser_steps(rank: int, world_size: int, grad_accum_steps: int) -> dict:
    """Per objective, uncached and cached: two SGD steps of A = ``grad_accum_steps`` loss calls
    under DDP, counting the gradient all-reduces (comm hook calls for the first bucket)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    chunk = min(CHUNK, GLOBAL_BATCH // world_size)
    results = {}
    for objective in STEPPED:
        for chunk_size in (0, chunk):
            accelerator, model, step, _ = step_parts(objective, {}, chunk_size, 0.0, grad_accum_steps, sgd=True)
            reductions = []

            def counting_allreduce(state, bucket):
                if bucket.index() == 0:
                    reductions.append(1)
                return default_hooks.allreduce_hook(state, bucket)

            step.model.register_comm_hook(dist.group.WORLD, counting_allreduce)
            per_step = []
            for index in range(2):
                before = len(reductions)
                make = _pair_batch if objective == "pairsupcon" else own_batch
                batches = iter(
                    [make(rank, world_size, seed=20 + 2 * index + micro) for micro in range(grad_accum_steps)]
                )
                step(batches, index)
                per_step.append(len(reductions) - before)
            weights = {name: p.detach().clone() for name, p in model.named_parameters()}
            results[objective, "cached" if chunk_size else "uncached"] = {
                "weights": weights,
                "reductions_per_step": per_step,
            }
    return portable(results)


@pytest.mark.e2e
def test_cached_optimiser_steps_equal_uncached_ones_with_one_all_reduce_each() -> None:
    """1 process (A = 2), 2 ranks (A = 1 and 2) and 4 ranks (A = 1), both unsupervised objectives
    and PairSupCon (its classifier reduced with the rest, touched with zero in the last backward)."""
    initial = dict(tiny_encoder(seed=0, dtype=torch.float64, head_dim=8, pair_classifier=True).named_parameters())
    for world_size, accum in ((1, 2), (2, 1), (4, 1), (2, 2)):
        results = run_as_launched(optimiser_steps, world_size, accum)
        for objective in STEPPED:
            what = f"{objective}, W={world_size}, A={accum}"
            uncached, cached = results[0][objective, "uncached"], results[0][objective, "cached"]
            for name, weight in uncached["weights"].items():
                assert_close_float64(cached["weights"][name], weight, f"{what}: {name}")
            moved = [
                n
                for n, w in uncached["weights"].items()
                if not torch.allclose(initial[n], torch.as_tensor(w), atol=1e-4)
            ]
            assert len(moved) > len(uncached["weights"]) // 2, f"{what}: the steps hardly moved the weights ({moved})"
            for rank in range(world_size):
                assert results[rank][objective, "cached"]["reductions_per_step"] == [1, 1], what
                assert results[rank][objective, "uncached"]["reductions_per_step"] == [1, 1], what


def test_a_chunk_larger_than_the_per_device_batch_or_negative_is_refused_naming_the_key() -> None:
    from vascl_scale.config import config_from_dict

    def config(chunk):
        return config_from_dict(
            {"model": {"path": "m"}, "data": {"train": "t"}, "train": {"global_batch_size": 64, "chunk_size": chunk}}
        )

    with pytest.raises(ValueError, match=r"train\.chunk_size"):
        config(-1)
    with pytest.raises(ValueError, match=r"train\.chunk_size = 65 exceeds the per-device batch 64"):
        config(65)
    with pytest.raises(ValueError, match=r"train\.chunk_size = 48 exceeds the per-device batch 32 .*at most 32"):
        config(48).per_device_batch_size(2)
    assert config(48).per_device_batch_size(1) == 64  # need not divide the batch

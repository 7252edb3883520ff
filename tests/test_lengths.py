"""Spending compute on tokens: length-sorted chunks and buckets, and packed rows, change no result.

Units: the token-budget grouping (every row once, no group over its budget or row cap, a row
over the budget alone), the buckets, putting rows back in order, the packing maths (cumulative
lengths, positions, packing on either padding side, pooling a packed row). Models (float64): a
tiny BERT and a tiny Qwen3 encode the same rows alike padded in one forward, in length buckets
and packed, with the same gradients. The step (real gloo ranks, dropout off): for every
objective at W = 1 and 2 the cached call with sorted chunks, with chunks in row order and with
a token budget, and the uncached call in length buckets, all equal the one-forward call.
"""

from __future__ import annotations

import pytest
import torch

from tests.gloo import run_as_launched
from tests.step_helpers import (
    CHUNK,
    GLOBAL_BATCH,
    SEQ_LEN,
    assert_same_call,
    call_and_backward,
    own_batch,
    parameter_gradients,
    portable,
    step_parts,
)
from tests.tiny import tiny_decoder_dir, tiny_encoder, token_batch
from vascl_scale.lengths import (
    length_sorted_buckets,
    restore_rows,
    row_lengths,
    token_budget_groups,
    trimmed,
)
from vascl_scale.model import POOLERS, SentenceEncoder
from vascl_scale.packing import (
    cumulative_lengths,
    pack,
    packed_positions,
    packs_natively,
    pool_packed,
)
from vascl_scale.train.limits import PACKED_EXACT


def _covers_every_row_once(groups: list[torch.Tensor], rows: int) -> None:
    assert sorted(torch.cat(groups).tolist()) == list(range(rows))


@pytest.mark.parametrize("packed", [False, True])
def test_token_budget_groups_hold_every_row_once_within_the_budget_and_the_row_cap(packed: bool) -> None:
    lengths = torch.tensor([5, 31, 2, 17, 8, 8, 40, 3, 12, 29, 1, 9])
    for max_rows, max_tokens in ((4, 0), (12, 60), (3, 45), (12, 1000)):
        groups = token_budget_groups(lengths, max_rows, max_tokens, packed=packed)
        _covers_every_row_once(groups, len(lengths))
        for group in groups:
            sizes = lengths[group]
            cost = int(sizes.sum()) if packed else len(group) * int(sizes.max())
            assert len(group) <= max_rows
            assert not max_tokens or cost <= max_tokens or len(group) == 1, (max_rows, max_tokens, group)
        forward_order = lengths[torch.cat(groups)].tolist()
        assert forward_order == sorted(forward_order, reverse=True)  # longest first
    by_rows = token_budget_groups(lengths, 4)  # no budget: groups of the row cap
    assert [len(g) for g in by_rows] == [4, 4, 4]


def test_a_row_over_the_budget_is_alone_and_short_rows_share_a_forward() -> None:
    lengths = torch.tensor([3, 50, 4, 2, 3])
    groups = token_budget_groups(lengths, max_rows=5, max_tokens=16)
    assert groups[0].tolist() == [1]  # 50 tokens > 16: alone
    assert [g.tolist() for g in groups[1:]] == [[2, 0, 4, 3]]  # 4 rows x 4 tokens = 16: one forward


def test_without_sorting_the_groups_keep_row_order() -> None:
    lengths = torch.tensor([3, 50, 4, 2, 3, 7, 7])
    groups = token_budget_groups(lengths, max_rows=3, sort=False)
    assert [g.tolist() for g in groups] == [[0, 1, 2], [3, 4, 5], [6]]


def test_length_buckets_split_the_sorted_rows_and_restore_rows_undoes_any_grouping() -> None:
    lengths = torch.tensor([5, 1, 7, 3, 3, 9, 2])
    buckets = length_sorted_buckets(lengths, 3)
    assert [len(b) for b in buckets] == [3, 2, 2]
    _covers_every_row_once(buckets, 7)
    assert len(length_sorted_buckets(lengths[:2], 4)) == 2  # no empty bucket
    values = torch.randn(7, 4, dtype=torch.float64, requires_grad=True)
    restored = restore_rows([values[b] * 1.0 for b in buckets], buckets)
    assert torch.equal(restored, values)
    restored.sum().backward()
    assert torch.equal(values.grad, torch.ones_like(values))


def test_trimming_keeps_each_rows_real_tokens_on_either_padding_side() -> None:
    ids = torch.tensor([[7, 8, 9, 0, 0], [5, 6, 0, 0, 0], [1, 2, 3, 4, 0]])
    mask = (ids > 0).long()
    rows = torch.tensor([2, 0])
    right = trimmed({"input_ids": ids, "attention_mask": mask}, rows, 4, "right")
    assert right["input_ids"].tolist() == [[1, 2, 3, 4], [7, 8, 9, 0]]
    left_ids = torch.tensor([[0, 0, 7, 8, 9], [0, 1, 2, 3, 4]])
    left = trimmed({"input_ids": left_ids}, torch.tensor([0]), 3, "left")
    assert left["input_ids"].tolist() == [[7, 8, 9]]


def test_packing_maths_against_the_padded_rows() -> None:
    lengths = torch.tensor([3, 1, 4])
    assert cumulative_lengths(lengths).tolist() == [0, 3, 4, 8]
    assert cumulative_lengths(lengths).dtype == torch.int32  # what FlashAttention's varlen kernels take
    assert packed_positions(lengths).tolist() == [0, 1, 2, 0, 0, 1, 2, 3]
    right = torch.tensor([[1, 2, 3, 0], [4, 0, 0, 0], [5, 6, 7, 8]])
    left = torch.tensor([[0, 1, 2, 3], [0, 0, 0, 4], [5, 6, 7, 8]])
    for ids, side in ((right, "right"), (left, "left")):
        mask = (ids > 0).long()
        packed = pack({"input_ids": ids, "attention_mask": mask}, lengths, side)
        assert sorted(packed) == ["input_ids"]
        assert packed["input_ids"].tolist() == [[1, 2, 3, 4, 5, 6, 7, 8]]
    hidden = torch.randn(3, 4, 5, dtype=torch.float64)  # (b, L, d), right-padded rows
    mask = (right > 0).long()
    flat = hidden[mask.bool()]  # (T, d): the packed rows' states
    for pooling, pooler in POOLERS.items():
        torch.testing.assert_close(pool_packed(flat, lengths, pooling), pooler(hidden, mask), rtol=0, atol=1e-12)


def test_only_variable_length_attention_packs_natively() -> None:
    assert packs_natively("flash_attention_2") and packs_natively("flash_attention_3")
    assert packs_natively("kernels-community/flash-attn2")
    assert not any(packs_natively(name) for name in (None, "sdpa", "eager", "flex_attention"))


def _tiny_decoder(tmp_path, architecture: str = "qwen3") -> SentenceEncoder:
    model = SentenceEncoder.from_pretrained(
        tiny_decoder_dir(tmp_path / architecture, architecture), pooling="last_token"
    )
    return model.to(torch.float64)


def _encodings(model: SentenceEncoder, ids: torch.Tensor, mask: torch.Tensor, buckets: int) -> dict:
    model.zero_grad()
    embeddings = model(input_ids=ids, attention_mask=mask, length_buckets=buckets)
    (
        embeddings * torch.linspace(-1, 1, embeddings.numel(), dtype=embeddings.dtype).view_as(embeddings)
    ).sum().backward()
    return {"embeddings": embeddings.detach(), **parameter_gradients(model.encoder)}


@pytest.mark.parametrize("backbone", PACKED_EXACT)  # the plan allows model.packed on these alone
def test_buckets_and_packed_rows_encode_as_one_padded_forward(backbone: str, tmp_path) -> None:
    if backbone == "bert":
        model, vocab, pooling_modes = tiny_encoder(seed=0), 64, ("mean", "cls")
    else:
        model, vocab, pooling_modes = _tiny_decoder(tmp_path, backbone), 300, ("last_token", "mean")
    model.train()  # dropout is off in these tiny models: train mode must change nothing here
    ids, mask = token_batch(9, 11, seed=3, vocab_size=vocab)
    if backbone != "bert":  # a decoder's tokenizer pads on the left here: its rows end at the last column
        model.padding_side = "left"
        lengths = row_lengths(mask)
        left = torch.arange(11)[None, :] >= (11 - lengths)[:, None]
        ids = torch.zeros_like(ids).masked_scatter(left, ids[mask.bool()])
        mask = left.long()
    for pooling in pooling_modes:
        model.pooling = pooling
        model.packed = False
        reference = _encodings(model, ids, mask, buckets=1)
        for mode, buckets in (("buckets", 3), ("packed", 1)):
            model.packed = mode == "packed"
            got = _encodings(model, ids, mask, buckets)
            for name, value in reference.items():
                torch.testing.assert_close(
                    got[name], value, rtol=1e-9, atol=1e-11, msg=lambda m: f"{backbone} {pooling} {mode} {name}: {m}"
                )


# (objective, loss overrides, columns besides the anchor): one case per objective.
OBJECTIVE_CASES = {
    "vascl": ("vascl", {}, {}),
    "simcse": ("simcse", {}, {}),
    "simcse_sup": ("simcse_sup", {"hard_negative_weight": 1.0}, {"positive": True, "negatives": 1}),
    "pairsupcon": ("pairsupcon", {"contrast_type": "hardneg", "beta": 0.5}, {"paired": True}),
}
# (mode, chunk size, chunk tokens, sorted chunks, length buckets)
MODES = {
    "one forward": (0, 0, True, 1),
    "length buckets": (0, 0, True, 3),
    "cached, sorted": (CHUNK, 0, True, 1),
    "cached, row order": (CHUNK, 0, False, 1),
    "cached, token budget": (GLOBAL_BATCH, 2 * SEQ_LEN, True, 1),
}


def _case_batch(rank: int, world_size: int, columns: dict) -> dict:
    if not columns.get("paired"):
        return own_batch(
            rank, world_size, positive=columns.get("positive", False), negatives=columns.get("negatives", 0)
        )
    batch = own_batch(rank, world_size)
    rows = GLOBAL_BATCH // world_size
    own = slice(rank * rows, (rank + 1) * rows)
    ids, mask = token_batch(GLOBAL_BATCH, SEQ_LEN, seed=11)
    batch["paired"] = {"input_ids": ids[own], "attention_mask": mask[own]}
    batch["label"] = torch.tensor([1, 0, 1, 1, 0, 0, 1, 1])[own]
    return batch


def every_mode(rank: int, world_size: int) -> dict:
    """Per objective and mode: one loss call and its backward on this rank, dropout off."""
    results = {}
    for case, (objective, loss, columns) in OBJECTIVE_CASES.items():
        for mode, (chunk_size, chunk_tokens, sort_chunks, buckets) in MODES.items():
            chunk_size = min(chunk_size, GLOBAL_BATCH // world_size)
            _, model, step, recorder = step_parts(
                objective, loss, chunk_size, 0.0, chunk_tokens=chunk_tokens, sort_chunks=sort_chunks,
                length_buckets=buckets,
            )  # fmt: skip
            forwards: list[int] = []
            model.encoder.register_forward_hook(lambda module, args, kwargs, out: forwards.append(1), with_kwargs=True)
            out = call_and_backward(
                step, _case_batch(rank, world_size, columns), "cached" if chunk_size else "uncached"
            )
            results[case, mode] = {
                "loss": out.loss.detach(),
                "gradients": parameter_gradients(model),
                "recorded": recorder.calls,
                "forwards": len(forwards),
            }
    return portable(results)


@pytest.mark.e2e
@pytest.mark.parametrize("world_size", [1, 2])
def test_sorted_bucketed_and_budgeted_steps_equal_the_one_forward_step(world_size: int) -> None:
    for rank, results in enumerate(run_as_launched(every_mode, world_size)):
        for case in OBJECTIVE_CASES:
            reference = results[case, "one forward"]
            assert reference["forwards"] == 1
            for mode in MODES:
                what = f"{case}, {mode}, rank {rank} of {world_size}"
                assert_same_call(results[case, mode], reference, what)
            assert results[case, "length buckets"]["forwards"] == 3, case
            # A budget of 2 x SEQ_LEN tokens lets short rows share a forward, and no more.
            assert results[case, "cached, token budget"]["forwards"] > 2, case

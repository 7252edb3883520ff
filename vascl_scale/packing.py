"""Unpadded (packed) encoder forwards: the rows of a batch laid end to end in one sequence.

A padded batch (b, L) computes b x L tokens; packed, the b rows' T = sum of lengths real tokens
form one sequence (1, T), each row's positions counted from 0 (``position_ids``) and its
boundaries given by the cumulative lengths ``cu_seqlens`` (b + 1,) = [0, l_1, l_1 + l_2, ..., T].
An attention backend that takes variable-length sequences (FlashAttention-2/3's varlen kernels:
transformers passes ``cu_seq_lens_q/k`` and ``max_length_q/k`` to them) attends within each row
only and computes no padding at all. Any other backend of transformers 5 also gives each row its
own attention from the position ids alone (a block-diagonal mask, causal for a decoder): exact, so
the maths is tested on a CPU, but that mask is T x T, so there the padded, length-sorted groups
(:mod:`vascl_scale.lengths`) are the fast path.

Pooling reads the packed hidden states (1, T, d) per row: the mean over a row's span, its first
token (CLS) or its last (last-token pooling), which is what the padded forward pools.
"""

from __future__ import annotations

import torch
from torch import Tensor

# The attention implementations that take packed rows without a T x T mask (transformers' names).
VARLEN_ATTENTION = ("flash_attention_2", "flash_attention_3")


def packs_natively(attn_implementation: str | None) -> bool:
    """Whether ``attn_implementation`` runs packed rows without padding or a dense mask: transformers'
    FlashAttention-2/3, or a hub kernel of FlashAttention (``kernels-community/flash-attn...``)."""
    if attn_implementation is None:
        return False
    return attn_implementation in VARLEN_ATTENTION or "flash-attn" in attn_implementation


def cumulative_lengths(lengths: Tensor) -> Tensor:
    """(b,) row lengths -> (b + 1,) int32 boundaries [0, l_1, l_1 + l_2, ..., T] (FlashAttention's cu_seqlens)."""
    return torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)


def packed_positions(lengths: Tensor) -> Tensor:
    """(b,) row lengths -> (T,) each token's position within its row: 0..l_1-1, 0..l_2-1, ..."""
    starts = cumulative_lengths(lengths)[:-1].to(torch.int64)  # (b,)
    total = int(lengths.sum())
    row_start = torch.repeat_interleave(starts, lengths)  # (T,)
    return torch.arange(total, device=lengths.device) - row_start


def pack(tensors: dict[str, Tensor], lengths: Tensor, side: str) -> dict[str, Tensor]:
    """A column's padded tensors (b, L) -> the real tokens of every row end to end, (1, T) each,
    padding on ``side`` left out; the attention mask is dropped (the positions delimit the rows)."""
    width = next(iter(tensors.values())).shape[1]
    columns = torch.arange(width, device=lengths.device)  # (L,)
    if side == "left":
        real = columns[None, :] >= (width - lengths)[:, None]  # (b, L)
    else:
        real = columns[None, :] < lengths[:, None]  # (b, L)
    return {key: value[real][None] for key, value in tensors.items() if key != "attention_mask"}


def packed_model_inputs(tensors: dict[str, Tensor], lengths: Tensor, side: str) -> dict[str, Tensor]:
    """What a transformers model takes for a packed forward: ids (and token types) (1, T),
    ``position_ids`` (1, T), and the varlen kernels' cumulative lengths and longest row."""
    boundaries = cumulative_lengths(lengths)
    longest = int(lengths.max())
    return {
        **pack(tensors, lengths, side),
        "position_ids": packed_positions(lengths)[None],
        "cu_seq_lens_q": boundaries,
        "cu_seq_lens_k": boundaries,
        "max_length_q": longest,
        "max_length_k": longest,
    }


def pool_packed(hidden: Tensor, lengths: Tensor, pooling: str) -> Tensor:
    """Packed hidden states (T, d) -> one vector per row (b, d): ``mean`` over the row's tokens
    (summed in float32 or wider, as :func:`vascl_scale.model.mean_pool`), ``cls`` its first
    token, ``last_token`` its last."""
    boundaries = cumulative_lengths(lengths).to(torch.int64)
    if pooling == "cls":
        return hidden[boundaries[:-1]]
    if pooling == "last_token":
        return hidden[boundaries[1:] - 1]
    assert pooling == "mean", pooling
    dtype = torch.promote_types(hidden.dtype, torch.float32)
    rows = torch.repeat_interleave(torch.arange(len(lengths), device=hidden.device), lengths)  # (T,)
    summed = torch.zeros(len(lengths), hidden.shape[1], dtype=dtype, device=hidden.device)
    summed = summed.index_add(0, rows, hidden.to(dtype))  # (b, d)
    return (summed / lengths.clamp_min(1)[:, None].to(dtype)).to(hidden.dtype)

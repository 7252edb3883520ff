"""Which rows share an encoder forward: length-sorted groups under a row cap and a token budget,
each cut to its own longest row.

A forward over r rows padded to width L computes, and holds activations for, r x L tokens
(attention r x L^2), however few of them are real. Rows of similar length grouped together and
each group cut to its longest row spend the forward on tokens, not padding. Which rows share a
forward changes no embedding: each row is encoded under its own attention mask (a padded
position is masked, a decoder counts positions over real tokens), so a row embeds the same in
any group up to float rounding. It changes only which dropout masks a row draws (a mask is drawn
for the whole tensor of a forward), and never which rows share a batch: the objective sees the
same batch, so the same negatives and neighbours.

Lengths come from the attention mask the loader built ((b, L) -> (b,), one sum per step); the
order is a stable sort, longest first, so equal lengths keep their row order and a run is
reproducible.
"""

from __future__ import annotations

import torch
from torch import Tensor


def row_lengths(attention_mask: Tensor) -> Tensor:
    """Real tokens per row: (b, L) -> (b,) int64."""
    return attention_mask.sum(dim=1, dtype=torch.int64)


def longest_first(lengths: Tensor) -> Tensor:
    """Row indices (b,) ordered by length, longest first; ties in row order."""
    return torch.sort(lengths, descending=True, stable=True).indices


def token_budget_groups(
    lengths: Tensor, max_rows: int, max_tokens: int = 0, sort: bool = True, packed: bool = False
) -> list[Tensor]:
    """The rows of each forward, as index tensors in forward order; together they hold every row once.

    Rows are taken longest first (``sort``) or in row order, and a group is closed before a row
    that would take it past ``max_rows`` rows or past ``max_tokens`` tokens (0: no budget). A
    group's tokens are what its forward computes: rows x its longest row when padded, the sum of
    its rows' lengths when ``packed`` (:mod:`vascl_scale.packing`). A row over the budget by
    itself forms a group of its own.
    """
    assert max_rows >= 1 and max_tokens >= 0, (max_rows, max_tokens)
    order = longest_first(lengths) if sort else torch.arange(len(lengths))
    groups: list[list[int]] = []
    current: list[int] = []  # positions in ``order`` of the group being filled
    longest = total = 0  # its longest row and its rows' sum
    for position, size in enumerate(lengths[order].tolist()):
        if current:
            cost = total + size if packed else (len(current) + 1) * max(longest, size)
            if len(current) >= max_rows or (max_tokens and cost > max_tokens):
                groups.append(current)
                current, longest, total = [], 0, 0
        current.append(position)
        longest, total = max(longest, size), total + size
    if current:
        groups.append(current)
    return [order[group] for group in groups]


def length_sorted_buckets(lengths: Tensor, buckets: int) -> list[Tensor]:
    """The rows sorted longest first and cut into ``buckets`` groups of (nearly) equal row counts,
    as index tensors; fewer groups when there are fewer rows."""
    assert buckets >= 1, buckets
    return [part for part in torch.tensor_split(longest_first(lengths), buckets) if len(part)]


def trimmed(tensors: dict[str, Tensor], rows: Tensor, width: int, side: str) -> dict[str, Tensor]:
    """The rows ``rows`` of a column's tensors (b, L) cut to ``width`` columns (r, width), keeping
    each row's real tokens: the first ``width`` columns under right padding, the last under left."""
    assert 0 < width, width
    columns = slice(None, width) if side != "left" else slice(-width, None)
    return {key: value[rows][:, columns] for key, value in tensors.items()}


def group_inputs(
    tensors: dict[str, Tensor], lengths: Tensor, groups: list[Tensor], side: str
) -> list[dict[str, Tensor]]:
    """Each group's model inputs: its rows of ``tensors`` (b, L) cut to its longest row."""
    return [trimmed(tensors, rows, int(lengths[rows].max()), side) for rows in groups]


def restore_rows(pieces: list[Tensor], groups: list[Tensor]) -> Tensor:
    """The groups' outputs (r_i, ...) back in row order (b, ...), with gradient through the gather."""
    order = torch.cat(groups).to(pieces[0].device)  # (b,): the row of each stacked output
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(len(order), device=order.device)
    return torch.cat(pieces)[inverse]

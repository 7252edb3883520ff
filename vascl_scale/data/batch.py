"""The batch format of the training stream, shared by the loader, the mixer and the training step.

A batch maps each text column (:mod:`vascl_scale.data.columns`) to its token tensors
``{"input_ids", "attention_mask"[, "token_type_ids"]}``, each (b, L_column) and padded to the
column's longest row, and each label column to a LongTensor (b,). Rows of a text column are
padded as the tokenizer pads them (:class:`Padding`); :func:`widen` pads a column to a wider
L without changing what the encoder sees.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# A batch (or a run of rows) of the stream: per text column its token tensors (b, L_column), per
# label column its labels (b,).
Batch = dict[str, "dict[str, torch.Tensor] | torch.Tensor"]


@dataclass(frozen=True)
class Padding:
    """How the tokenizer pads a row: its pad token's id, and on which side."""

    token_id: int = 0
    side: str = "right"

    @classmethod
    def of(cls, tokenizer) -> Padding:
        return cls(tokenizer.pad_token_id, getattr(tokenizer, "padding_side", "right"))


def widen(tensors: dict[str, torch.Tensor], width: int, padding: Padding) -> dict[str, torch.Tensor]:
    """A column's tensors (b, L) -> (b, width), padded on the tokenizer's side (ids with the pad
    token, the mask and token types with 0)."""
    out = {}
    for key, value in tensors.items():
        extra = width - value.shape[1]
        pad = (extra, 0) if padding.side == "left" else (0, extra)
        out[key] = torch.nn.functional.pad(value, pad, value=padding.token_id if key == "input_ids" else 0)
    return out


def concat_padded(parts: list[dict[str, torch.Tensor]], padding: Padding) -> dict[str, torch.Tensor]:
    """One text column's row blocks (r_i, L_i), each padded to its own longest row, joined into
    (sum r_i, max L_i)."""
    width = max(part["input_ids"].shape[1] for part in parts)
    widened = [widen(part, width, padding) for part in parts]
    return {key: torch.cat([part[key] for part in widened]) for key in widened[0]}


def column_rows(column: dict[str, torch.Tensor] | torch.Tensor, rows: slice) -> dict[str, torch.Tensor] | torch.Tensor:
    """The rows ``rows`` of one column: a label's tensor, or each of a text's token tensors."""
    if isinstance(column, torch.Tensor):
        return column[rows]
    return {key: value[rows] for key, value in column.items()}


def batch_rows(batch: Batch, rows: slice) -> Batch:
    """The rows ``rows`` of every column of ``batch``."""
    return {column: column_rows(value, rows) for column, value in batch.items()}

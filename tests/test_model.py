"""The sentence encoder: pooling, head, encode, loading."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoTokenizer, BertModel

from tests.tiny import packaged_minilm_dir, tiny_bert_config
from vascl_scale.model import ProjectionHead, SentenceEncoder, cls_pool, mean_pool


def test_mean_pool_ignores_padding() -> None:
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]], [[5.0, 6.0], [0.0, 0.0], [0.0, 0.0]]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    torch.testing.assert_close(mean_pool(hidden, mask), torch.tensor([[2.0, 3.0], [5.0, 6.0]]))
    torch.testing.assert_close(cls_pool(hidden, mask), torch.tensor([[1.0, 2.0], [5.0, 6.0]]))


def test_mean_pool_keeps_bf16_dtype_and_sums_wide() -> None:
    hidden = torch.full((1, 300, 4), 1.001, dtype=torch.bfloat16)
    out = mean_pool(hidden, torch.ones(1, 300))
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), hidden[:, 0].float())


def test_projection_head_is_appendix_a() -> None:
    head = ProjectionHead(24, 128)
    linears = [m for m in head if isinstance(m, torch.nn.Linear)]
    assert [tuple(m.weight.shape) for m in linears] == [(24, 24), (128, 24)]
    assert all(m.bias is None for m in linears)
    assert isinstance(head[1], torch.nn.ReLU)
    with pytest.raises(ValueError, match="head sizes must be positive"):
        ProjectionHead(0)


def test_encoder_forward_and_frozen_pooler() -> None:
    model = SentenceEncoder(BertModel(tiny_bert_config()), head_dim=8)
    ids = torch.randint(5, 60, (3, 5))
    e = model(ids, torch.ones_like(ids))
    assert e.shape == (3, 16) and model.head(e).shape == (3, 8)
    assert not any(p.requires_grad for p in model.encoder.pooler.parameters())
    with pytest.raises(ValueError, match="pooling must be one of"):
        SentenceEncoder(BertModel(tiny_bert_config()), pooling="max")


def test_encode_restores_order_and_does_not_depend_on_batching() -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(packaged_minilm_dir()))
    torch.manual_seed(0)
    model = SentenceEncoder(BertModel(tiny_bert_config(vocab_size=tokenizer.vocab_size)), tokenizer)
    texts = ["a short one", "a considerably longer sentence with many more words in it", "mid length text here"]
    together = model.encode(texts, batch_size=3)
    one_by_one = np.concatenate([model.encode([t], batch_size=1) for t in texts])
    np.testing.assert_allclose(together, one_by_one, atol=1e-5)
    assert model.training  # encode restores the training flag
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        model.encode(texts, batch_size=0)


def test_from_pretrained_errors_and_head(tmp_path) -> None:
    with pytest.raises(ValueError, match="no config.json"):
        SentenceEncoder.from_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(str(packaged_minilm_dir()))
    BertModel(tiny_bert_config(vocab_size=tokenizer.vocab_size)).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    head = ProjectionHead(16, 8)
    save_file(head.state_dict(), str(tmp_path / "head.safetensors"))
    loaded = SentenceEncoder.from_pretrained(tmp_path)  # the width comes from the saved head
    assert loaded.head.out_dim == 8
    for got, expected in zip(loaded.head.parameters(), head.parameters()):
        torch.testing.assert_close(got, expected)
    with pytest.raises(ValueError, match="holds a 8-wide head; got head_dim=128"):
        SentenceEncoder.from_pretrained(tmp_path, head_dim=128)


def test_packaged_minilm_gives_sentence_embeddings() -> None:
    """The real model: a paraphrase is far closer than an unrelated sentence (weights loaded)."""
    model = SentenceEncoder.from_pretrained(packaged_minilm_dir())
    e = model.encode(["A man is playing a guitar.", "A person plays the guitar.", "Stocks fell sharply today."])
    e = e / np.linalg.norm(e, axis=1, keepdims=True)
    assert e[0] @ e[1] > 0.6 and abs(e[0] @ e[2]) < 0.3


def test_a_model_directory_without_a_tokenizer_vocabulary_is_refused(tmp_path) -> None:
    """The issue's case: config, weights and tokenizer_config.json, but no vocabulary file."""
    tokenizer = AutoTokenizer.from_pretrained(str(packaged_minilm_dir()))
    BertModel(tiny_bert_config(vocab_size=tokenizer.vocab_size)).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    for name in ("tokenizer.json", "vocab.txt"):
        (tmp_path / name).unlink(missing_ok=True)  # transformers 5 writes tokenizer.json only
    assert (tmp_path / "tokenizer_config.json").is_file()
    with pytest.raises(
        ValueError, match=r"has no tokenizer vocabulary: none of tokenizer.json, vocab.txt, vocab.json \+ merges.txt"
    ):
        SentenceEncoder.from_pretrained(tmp_path)
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n")  # a vocabulary of special tokens
    with pytest.raises(ValueError, match=r"turns every word of .* into its unknown token '\[UNK\]'.*5 tokens"):
        SentenceEncoder.from_pretrained(tmp_path)


def test_the_pairwise_classifier_trains_with_the_head_exports_beside_it_and_loads(tmp_path) -> None:
    """PairSupCon's classifier: Linear(3d, 2, no bias) on [u, v, |u - v|]; reached by the probe
    (not frozen), in the head's optimiser group, exported to classifier.safetensors (the encoder
    weights stay the encoder's: AutoModel and the export's embeddings are unchanged) and loaded
    from there; a model without one ignores the file."""
    from accelerate import Accelerator
    from transformers import AutoModel

    from vascl_scale.config import config_from_dict
    from vascl_scale.model_card import CardFacts
    from vascl_scale.train.export import export_model
    from vascl_scale.train.trainer import build_optimizer, freeze_unreached_parameters

    tokenizer = AutoTokenizer.from_pretrained(str(packaged_minilm_dir()))
    BertModel(tiny_bert_config(vocab_size=tokenizer.vocab_size)).save_pretrained(tmp_path / "base")
    tokenizer.save_pretrained(tmp_path / "base")
    model = SentenceEncoder.from_pretrained(tmp_path / "base", head_dim=8, pair_classifier=True)
    assert SentenceEncoder.from_pretrained(tmp_path / "base").classifier is None
    u, v = torch.randn(3, 16), torch.randn(3, 16)
    weight = model.classifier.linear.weight
    assert weight.shape == (2, 48) and model.classifier.linear.bias is None
    torch.testing.assert_close(model.classifier(u, v), torch.cat([u, v, (u - v).abs()], dim=1) @ weight.T)
    frozen = freeze_unreached_parameters(model)
    assert frozen == [] and weight.requires_grad  # the pooler is frozen already (SentenceEncoder)
    config = config_from_dict({"model": {"path": "m"}, "data": {"train": "t"}, "optim": {"lr": 1e-5, "head_lr": 1e-3}})
    groups = build_optimizer(model, config).param_groups
    assert groups[1]["lr"] == 1e-3 and any(p is weight for p in groups[1]["params"])
    with torch.no_grad():
        weight.mul_(3.0)  # not the initial weights
    card = CardFacts(config=config.to_dict(), step=1, world_size=1, zero_stage=0, device_type="cpu", precision="no",
                     embedding_dimension=16, vascl_scale_version="test")  # fmt: skip
    export_model(Accelerator(cpu=True), model, tmp_path / "export", max_seq_length=32, card=card)
    assert sorted(path.name for path in (tmp_path / "export").glob("*.safetensors")) == [
        "classifier.safetensors", "head.safetensors", "model.safetensors",
    ]  # fmt: skip
    loaded = SentenceEncoder.from_pretrained(tmp_path / "export", pair_classifier=True)
    torch.testing.assert_close(loaded.classifier.linear.weight, weight)
    plain = SentenceEncoder.from_pretrained(tmp_path / "export")
    assert plain.classifier is None
    AutoModel.from_pretrained(str(tmp_path / "export"))  # no unexpected keys raised: the encoder alone
    texts = ["a short sentence", "another one here"]
    np.testing.assert_allclose(plain.encode(texts), model.encode(texts), atol=1e-6)

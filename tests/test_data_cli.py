"""``vascl-scale data prepare`` and ``vascl-scale bench data`` through the real CLI."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.data_helpers import make_shards, sentences, shard_texts
from vascl_scale.cli import app


def test_prepare_cli_writes_shards_and_summary(tmp_path):
    (tmp_path / "a.txt").write_text("\n".join(sentences(30)) + "\n\n")
    (tmp_path / "b.jsonl").write_text("".join(json.dumps({"body": t}) + "\n" for t in sentences(30)))
    result = CliRunner().invoke(
        app,
        [
            "data",
            "prepare",
            str(tmp_path / "a.txt"),
            str(tmp_path / "b.jsonl"),
            "--output",
            str(tmp_path / "out"),
            "--shard-size",
            "16",
            "--dedup",
            "--text-field",
            "body",
            "--shuffle-seed",
            "1",
        ],
    )
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["total_samples"] == 30 and manifest["dropped"]["duplicate"] == 30
    assert manifest["dropped"]["empty"] == 1
    assert sorted(shard_texts(tmp_path / "out")) == sorted(sentences(30))
    assert "dropped: duplicate" in result.output


def test_prepare_cli_reports_user_errors(tmp_path):
    (tmp_path / "in.jsonl").write_text(json.dumps({"text": "one"}) + "\n")
    arguments = ["data", "prepare", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "o"), "--text-field", "body"]
    result = CliRunner().invoke(app, arguments)
    assert result.exit_code == 2
    assert "'body'" in result.output


def test_bench_data_cli_reports_rates_and_ratio(tmp_path):
    shards = make_shards(tmp_path, sentences(512), shard_size=128)
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "data",
            str(shards),
            "--workers",
            "1",
            "--seconds",
            "0.3",
            "--repeats",
            "1",
            "--batch-size",
            "32",
            "--output",
            str(tmp_path / "bench.json"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "ratio" in result.output
    measured = json.loads((tmp_path / "bench.json").read_text())
    assert measured["tokenizer_sentences_per_s"] > 0 and measured["loader"][0]["cpu_ratio"] > 0


def _data_dir() -> Path:
    return Path(os.environ.get("VASCL_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data"))


@pytest.mark.realdata
def test_prepare_real_sample_keeps_every_line(tmp_path):
    sample = _data_dir() / "corpus" / "sample_1k.txt"
    if not sample.is_file():
        pytest.skip(f"{sample} is absent")
    arguments = ["data", "prepare", str(sample), "-o", str(tmp_path / "out"), "--shard-size", "300"]
    result = CliRunner().invoke(app, arguments)
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert [s["samples"] for s in manifest["shards"]] == [300, 300, 300, 100]
    lines = [line.strip() for line in sample.read_text(encoding="utf-8").splitlines()]
    assert shard_texts(tmp_path / "out") == lines


@pytest.mark.realdata
def test_text_file_stream_yields_every_real_line_once():
    from collections import Counter

    from tests.data_helpers import minilm_tokenizer
    from vascl_scale.config import DataConfig
    from vascl_scale.data.loader import build_train_stream

    sample = _data_dir() / "corpus" / "sample_1k.txt"
    if not sample.is_file():
        pytest.skip(f"{sample} is absent")
    tokenizer = minilm_tokenizer()
    lines = [line for line in sample.read_text(encoding="utf-8").splitlines() if line.strip()]
    stream = build_train_stream(
        DataConfig(train=str(sample), max_length=32, num_workers=1),
        tokenizer=tokenizer,
        per_device_batch_size=8,
        rank=0,
        world_size=1,
        seed=0,
    )
    rows = Counter()
    for batch in iter(stream):
        for ids, mask in zip(batch["anchor"]["input_ids"], batch["anchor"]["attention_mask"]):
            rows[tuple(ids[mask.bool()].tolist())] += 1
        if stream.batches_yielded * 8 == len(lines):
            break
    expected = Counter(tuple(ids) for ids in tokenizer(lines, truncation=True, max_length=32)["input_ids"])
    assert rows == expected


@pytest.mark.slow
@pytest.mark.realdata
def test_prepare_wiki1m_writes_20_shards_of_all_sentences(tmp_path):
    corpus = _data_dir() / "corpus" / "wiki1m.txt.gz"
    if not corpus.is_file():
        pytest.skip(f"{corpus} is absent")
    arguments = ["data", "prepare", str(corpus), "-o", str(tmp_path / "wiki1m"), "--shard-size", "50000"]
    result = CliRunner().invoke(app, arguments)
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "wiki1m" / "manifest.json").read_text())
    assert len(manifest["shards"]) == 20 and manifest["total_samples"] == 1_000_000
    assert sum(manifest["dropped"].values()) == 0
    shutil.rmtree(tmp_path / "wiki1m")  # 1 GB of shards: do not leave it in pytest's kept temp dirs

"""The training loop's row of ``bench step --compare``: its synthetic shards, and its times read
from the loop's own ``metrics.jsonl``."""

from __future__ import annotations

import json
import statistics
from itertools import islice
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tests.eval_helpers import PACKAGED, save_tiny_bert
from vascl_scale.bench import loop as bench_loop
from vascl_scale.bench.loop import read_loop_metrics, write_synthetic_shards
from vascl_scale.cli import app
from vascl_scale.config import DataConfig
from vascl_scale.data.columns import LABELLED_PAIR
from vascl_scale.data.loader import build_train_stream
from vascl_scale.tokenizer import load_tokenizer


@pytest.mark.parametrize("columns", [("anchor",), ("anchor", "positive", "negative_0"), LABELLED_PAIR])
def test_synthetic_shards_hold_full_length_rows_in_every_column_as_the_step_rows_batch(tmp_path: Path, columns) -> None:
    shards = write_synthetic_shards(
        tmp_path, columns, rows=12, shard_size=4, model_dir=Path(str(PACKAGED)), max_length=10, seed=0
    )
    manifest = json.loads((shards / "manifest.json").read_text())
    assert tuple(manifest["columns"]) == columns and manifest["total_samples"] == 12 and len(manifest["shards"]) == 3
    assert manifest["token_ids"]["max_length"] == 10 and sum(manifest["dropped"].values()) == 0
    tokenizer = load_tokenizer(str(PACKAGED))
    stream = build_train_stream(DataConfig(train=str(shards), max_length=10, num_workers=0), tokenizer=tokenizer,
                                per_device_batch_size=4, rank=0, world_size=1, seed=0)  # fmt: skip
    for batch in islice(iter(stream), 3):
        assert set(batch) == set(columns)
        for column in columns:
            if column == "label":
                assert set(batch[column].tolist()) <= {0, 1}
                continue
            assert batch[column]["input_ids"].shape == (4, 10)  # every row max_length tokens, as the step rows'
            assert bool(batch[column]["attention_mask"].all())


def test_loop_times_are_the_step_lines_of_metrics_jsonl_after_the_warm_up(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    lines = [{"step": 1, "step_seconds": 9.0}, {"step": 2, "step_seconds": 3.0}, {"step": 2, "stsb_dev_spearman": 80.0},
             {"step": 3, "step_seconds": 1.0, "peak_memory_mb": 12.0}, {"step": 4, "step_seconds": 2.0, "peak_memory_mb": 10.0}]  # fmt: skip
    metrics.write_text("".join(json.dumps(line) + "\n" for line in lines))
    loop = read_loop_metrics(metrics, warmup=1)
    assert loop.times_s == [3.0, 1.0, 2.0] and loop.peak_memory_mb == 12.0
    assert read_loop_metrics(metrics, warmup=0).times_s == [9.0, 3.0, 1.0, 2.0]


@pytest.mark.e2e
def test_bench_step_compare_times_the_peer_in_the_same_rounds_and_the_loop_from_its_metrics(
    tmp_path: Path, monkeypatch
) -> None:
    model = save_tiny_bert(tmp_path / "model")  # weights and tokenizer: the peer and the loop load the same directory
    seen = {}  # what the loop's run directory held before the bench removed it

    def spy(metrics: Path, warmup: int):
        seen["metrics"] = [json.loads(line) for line in metrics.read_text().splitlines()]
        seen["config"] = yaml.safe_load((metrics.parent / "config.yaml").read_text())
        return read_loop_metrics(metrics, warmup)

    monkeypatch.setattr(bench_loop, "read_loop_metrics", spy)
    output = tmp_path / "step.json"
    result = CliRunner().invoke(app, [
        "bench", "step", "--model", str(model), "--objective", "simcse", "--global-batch", "8", "--steps", "3",
        "--warmup", "1", "--max-length", "8", "--compare", "sentence-transformers", "--output", str(output),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(output.read_text())
    config = seen["config"]
    assert (
        config["objective"] == "simcse"
        and config["train"]["global_batch_size"] == 8
        and config["data"]["max_length"] == 8
    )
    assert (
        config["train"]["log_every"] == 1
        and config["eval"]["every_steps"] == 0
        and config["checkpoint"]["every_steps"] == 0
    )
    assert config["train"]["max_steps"] == 4 and config["train"]["precision"] == "auto" and config["train"]["seed"] == 0
    windows = [line["step_seconds"] for line in seen["metrics"] if "step_seconds" in line]
    assert len(windows) == 4  # every step a window, the warm-up one dropped
    loop = report["loops"]["simcse"]
    assert loop["times_s"] == windows[1:] and loop["median_s"] == pytest.approx(statistics.median(windows[1:]))
    assert loop["sentences_per_s"] == pytest.approx(8 / loop["median_s"])
    assert loop["model_flops_per_device"] == report["objectives"]["simcse"]["model_flops_per_device"]  # the same shapes
    step, peer = report["objectives"]["simcse"], report["objectives"]["sentence-transformers"]
    assert len(step["times_s"]) == len(peer["times_s"]) == 3 and peer["model_flops_per_device"] > 0
    assert report["speedup_over_peer"]["simcse"] == pytest.approx(peer["median_s"] / step["median_s"])
    assert report["loop_over_step"]["simcse"] == pytest.approx(step["median_s"] / loop["median_s"])
    assert report["loop_speedup_over_peer"]["simcse"] == pytest.approx(peer["median_s"] / loop["median_s"])
    text = " ".join(result.output.split())
    assert "vascl-scale simcse: " in text and "x the sentences/s of sentence-transformers" in text
    assert (
        "simcse train loop" in text
        and "vascl-scale simcse train loop: " in text
        and "x the sentences/s of its step" in text
    )


def test_bench_step_compare_refuses_an_unknown_peer_and_more_than_one_process(tmp_path: Path) -> None:
    model = save_tiny_bert(tmp_path / "model")
    refused = CliRunner().invoke(
        app, ["bench", "step", "--model", str(model), "--compare", "open_clip", "--steps", "1"]
    )
    assert refused.exit_code != 0 and "--compare takes sentence-transformers" in " ".join(refused.output.split())
    alone = CliRunner().invoke(
        app, ["bench", "step", "--model", str(model), "--compare", "sentence-transformers", "--num-processes", "2"]
    )
    assert alone.exit_code != 0 and "--compare runs on one process without DeepSpeed" in " ".join(alone.output.split())
    config = tmp_path / "config.json"
    config.write_text((model / "config.json").read_text())
    no_directory = CliRunner().invoke(
        app, ["bench", "step", "--model", str(config), "--compare", "sentence-transformers", "--steps", "1"]
    )
    assert no_directory.exit_code != 0 and "--compare needs --model to name a model directory" in " ".join(
        no_directory.output.split()
    )


@pytest.mark.e2e
def test_bench_step_on_real_text_counts_tokens_and_times_the_row_order_step_and_the_peers_cached_loss(
    tmp_path: Path, monkeypatch
) -> None:
    """--text: sentences of varied length, a new batch per round; --row-order: the step as it ran
    before length sorting; with --chunk-size the peer runs its cached loss. Sorted chunks compute
    fewer padded positions for the same real tokens."""
    from vascl_scale.bench import peer as bench_peer

    model = save_tiny_bert(tmp_path / "model")
    words = ["river", "bank", "money", "music", "guitar", "song", "football", "goal"]
    text = tmp_path / "text.txt"
    text.write_text("".join(" ".join(words[: 1 + (7 * i) % 8] * (1 + i % 3)) + "\n" for i in range(64)))
    losses = []
    made = bench_peer.sentence_transformers_step

    def spy(*args):
        step, flops, encoder = made(*args)
        losses.append(args)
        return step, flops, encoder

    monkeypatch.setattr(bench_peer, "sentence_transformers_step", spy)
    output = tmp_path / "step.json"
    result = CliRunner().invoke(app, [
        "bench", "step", "--model", str(model), "--objective", "simcse", "--global-batch", "8", "--chunk-size", "2",
        "--steps", "2", "--warmup", "1", "--max-length", "16", "--text", str(text), "--row-order",
        "--compare", "sentence-transformers", "--output", str(output),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert losses and losses[0][-2:] == (2, 0)  # the peer's cached loss, mini-batches of the chunk size
    report = json.loads(output.read_text())
    rows = report["objectives"]
    ours, before, peer = rows["simcse"], rows["simcse row order"], rows["sentence-transformers"]
    assert ours["real_tokens_per_step"] == before["real_tokens_per_step"] == peer["real_tokens_per_step"] > 0
    assert 0 < before["real_token_share"] < ours["real_token_share"] <= 1
    assert ours["tokens_per_s"] == pytest.approx(ours["real_tokens_per_step"] / ours["median_s"])
    assert report["sorted_over_row_order"]["simcse"] == pytest.approx(before["median_s"] / ours["median_s"])
    text_out = " ".join(result.output.split())
    assert "real-token share" in text_out and "text text.txt" in text_out


def test_bench_step_text_is_read_whole_lines_repeated_and_refused_when_missing_or_empty(tmp_path: Path) -> None:
    import gzip

    from vascl_scale.bench import text_lines

    path = tmp_path / "lines.txt.gz"
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.write("one\n\n two \nthree\n")
    assert text_lines(path, 5, repeat=True) == ["one", "two", "three", "one", "two"]
    with pytest.raises(ValueError, match="has 3 non-blank lines"):
        text_lines(path, 5)
    (tmp_path / "blank.txt").write_text("\n \n")
    for missing in (tmp_path / "absent.txt", tmp_path / "blank.txt"):
        with pytest.raises(ValueError, match="--text"):
            text_lines(missing, 3)

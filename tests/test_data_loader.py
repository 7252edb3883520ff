"""The training stream: coverage per epoch, never running dry, corrupt shards, resume, batches.

Ranks are emulated in one process: one stream per rank with rank=0/1 and world_size=2, each
with its own DataLoader workers.
"""

from __future__ import annotations

import gzip
import json
from itertools import islice

import pytest
import torch

from tests.data_helpers import (
    BATCH,
    assert_same_batches,
    captured_warnings,
    decode_rows,
    labelled_rows,
    loader_stream,
    make_paired_shards,
    make_shards,
    minilm_tokenizer,
    paired_rows,
    sentences,
    stream_texts,
    take_batches,
    time_limit,
)
from vascl_scale.data.loader import CorruptShardError


@pytest.fixture(scope="module")
def tokenizer():
    return minilm_tokenizer()


def test_exact_mode_two_ranks_two_workers_cover_every_sample_once_per_epoch(tmp_path, tokenizer):
    texts = sentences(128)
    shards = make_shards(tmp_path, texts, shard_size=16)  # 8 shards: 2 per slot, 64 rows = 8 batches per rank
    per_rank = [stream_texts(loader_stream(shards, tokenizer, rank, 2, mode="exact"), tokenizer, 16) for rank in (0, 1)]
    for epoch in (0, 1):
        seen = [text for rows in per_rank for text in rows[epoch * 64 : (epoch + 1) * 64]]
        assert sorted(seen) == sorted(texts), f"epoch {epoch}"
    assert per_rank[0][:64] != per_rank[0][64:]  # each epoch shuffles anew


def test_text_file_source_two_ranks_cover_every_line_once(tmp_path, tokenizer):
    texts = sentences(64)
    path = tmp_path / "corpus.txt.gz"
    with gzip.open(path, "wt") as handle:
        handle.write("\n\n".join(texts) + "\n")  # empty lines are skipped
    per_rank = [stream_texts(loader_stream(path, tokenizer, rank, 2), tokenizer, 4) for rank in (0, 1)]
    assert sorted(per_rank[0] + per_rank[1]) == sorted(texts)


@pytest.mark.parametrize("mode", ["resampled", "exact"])
def test_uneven_shards_every_rank_keeps_yielding(tmp_path, tokenizer, mode):
    shards = make_shards(tmp_path, sentences(50), shard_size=10)  # 5 shards over 2 ranks x 2 workers
    streams = [loader_stream(shards, tokenizer, rank, 2, mode=mode) for rank in (0, 1)]
    iterators = [iter(stream) for stream in streams]
    with time_limit(90):
        for _ in range(30):  # several epochs on both ranks, in lockstep like a trainer
            for iterator in iterators:
                assert next(iterator)["anchor"]["input_ids"].shape[0] == BATCH
    assert [s.batches_yielded for s in streams] == [30, 30]
    if mode == "resampled":
        # ceil(5 / 4) = 2 shards of 10 per worker per epoch: 40 rows, 5 batches per rank and epoch.
        # After 30 batches both ranks stand at the end of epoch 5.
        assert [(s.state_dict()["epoch"], s.state_dict()["rows_into_epoch"]) for s in streams] == [(5, 40)] * 2


def test_batches_are_dynamically_padded_long_tensors(tmp_path, tokenizer):
    texts = [("word " * (index % 40 + 1)).strip() for index in range(64)]
    shards = make_shards(tmp_path, texts, shard_size=16)
    with time_limit(60):
        for batch in islice(iter(loader_stream(shards, tokenizer, max_length=24)), 12):
            assert set(batch) == {"anchor"} and set(batch["anchor"]) == {
                "input_ids",
                "attention_mask",
                "token_type_ids",
            }
            lengths = batch["anchor"]["attention_mask"].sum(dim=1)
            assert all(
                t.dtype == torch.long and t.shape == (BATCH, int(lengths.max())) for t in batch["anchor"].values()
            )
            assert int(lengths.max()) <= 24


def _truncate(path, keep_bytes: int) -> None:
    path.write_bytes(path.read_bytes()[:keep_bytes])


def test_truncated_and_corrupt_shards_are_skipped_and_counted(tmp_path, tokenizer):
    shards = make_shards(tmp_path, sentences(64), shard_size=16)
    _truncate(shards / "shard-000001.tar", 3 * 1024 + 700)  # inside the 4th sample
    # Cut on a sample boundary: no end-of-archive block, so the 5th sample may be incomplete too.
    _truncate(shards / "shard-000002.tar", 5 * 1024)
    (shards / "shard-000003.tar").write_bytes(b"\x00\x01 not a tar at all" * 100)
    stream = loader_stream(shards, tokenizer, num_workers=2, shuffle_buffer=0)
    # 16 + 3 + 4 + 0 = 23 rows per epoch: 2 batches, and 7 rows dropped; 7 batches reach the fourth epoch.
    rows = stream_texts(stream, tokenizer, 7)
    epochs = [rows[start : start + 16] for start in (0, 16, 32)]
    assert all(len(set(epoch)) == 16 for epoch in epochs) and len(set(rows)) <= 23
    assert stream.samples_dropped == 3 * 7
    # The three finished epochs reported their 3 bad shards each; the fourth may have reported some already.
    assert 9 <= stream.corrupt_shards_skipped <= 12
    assert sorted(set(stream.corrupt_shards)) == [str(shards / f"shard-00000{i}.tar") for i in (1, 2, 3)]


def test_count_mismatch_with_manifest_is_corrupt_and_fail_option_raises(tmp_path, tokenizer, caplog):
    shards = make_shards(tmp_path, sentences(32), shard_size=16)
    manifest = json.loads((shards / "manifest.json").read_text())
    manifest["shards"][1]["samples"] = 17
    (shards / "manifest.json").write_text(json.dumps(manifest))
    stream = loader_stream(shards, tokenizer, num_workers=0)
    with captured_warnings(caplog):
        stream_texts(stream, tokenizer, 4)
    assert stream.corrupt_shards_skipped == 1
    assert "manifest lists 17" in caplog.text
    with pytest.raises(CorruptShardError, match="shard-000001.tar"):
        stream_texts(loader_stream(shards, tokenizer, num_workers=0, on_corrupt="fail"), tokenizer, 4)


@pytest.mark.parametrize("mode,cut", [("exact", 5), ("exact", 13), ("resampled", 13)])
def test_resume_continues_exactly(tmp_path, tokenizer, mode, cut):
    # 9 shards, the last short. Rank 1 reads about 48 rows per epoch: cut 5 resumes deep inside
    # epoch 0 (whole pieces skipped without tokenising), cut 13 just after an epoch boundary.
    shards = make_shards(tmp_path, sentences(100), shard_size=12)
    reference = take_batches(loader_stream(shards, tokenizer, 1, 2, mode=mode), cut + 10)
    first = loader_stream(shards, tokenizer, 1, 2, mode=mode)
    assert_same_batches(take_batches(first, cut), reference[:cut])
    state = json.loads(json.dumps(first.state_dict()))
    assert state["batches_yielded"] == cut and state["samples_yielded"] == cut * BATCH
    resumed = loader_stream(shards, tokenizer, 1, 2, mode=mode)
    resumed.load_state_dict(state)
    assert_same_batches(take_batches(resumed, 10), reference[cut:])
    # A state saved on rank 0 positions rank 1 too: all ranks share the batch count.
    rank0 = loader_stream(shards, tokenizer, 0, 2, mode=mode)
    take_batches(rank0, cut)
    from_rank0 = loader_stream(shards, tokenizer, 1, 2, mode=mode)
    from_rank0.load_state_dict(rank0.state_dict())
    assert_same_batches(take_batches(from_rank0, 10), reference[cut:])


def test_resume_text_file_and_changed_layout(tmp_path, tokenizer, caplog):
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(sentences(40)) + "\n")
    reference = take_batches(loader_stream(path, tokenizer, num_workers=1), 9)
    first = loader_stream(path, tokenizer, num_workers=1)
    take_batches(first, 6)
    resumed = loader_stream(path, tokenizer, num_workers=1)
    resumed.load_state_dict(first.state_dict())
    assert_same_batches(take_batches(resumed, 3), reference[6:])
    other_layout = loader_stream(path, tokenizer, num_workers=2)
    with captured_warnings(caplog):
        other_layout.load_state_dict(first.state_dict())
    assert "layout changed (num_workers)" in caplog.text
    assert other_layout.state_dict()["epoch"] == first.state_dict()["epoch"] == 1
    assert other_layout.state_dict()["rows_into_epoch"] == 0
    # A state from before webdataset ordered the stream (or from another webdataset version).
    older_state = first.state_dict()
    del older_state["layout"]["webdataset"]
    with captured_warnings(caplog):
        loader_stream(path, tokenizer, num_workers=1).load_state_dict(older_state)
    assert "layout changed (webdataset)" in caplog.text


@pytest.mark.parametrize("cut", [2, 5])
def test_the_rows_left_at_the_end_of_an_epoch_are_dropped_counted_and_resumed_past(tmp_path, tokenizer, cut):
    """Never a short batch, never a batch of two epochs; resumed from its own state or from
    rank 0's (the position follows from the batch count, drops included) the stream goes on
    exactly. ``cut`` 2: just after epoch 0's last batch, its drop not yet seen; 5: inside epoch 2."""
    texts = sentences(36)
    shards = make_shards(
        tmp_path, texts, shard_size=6
    )  # 6 shards: 3 per rank, 18 rows = 2 batches and 2 dropped per epoch
    shard_of = {text: index // 6 for index, text in enumerate(texts)}
    options = dict(mode="exact", num_workers=0, shuffle_buffer=4)
    reference_stream = loader_stream(shards, tokenizer, 1, 2, **options)
    reference = take_batches(reference_stream, 7)
    assert reference_stream.samples_dropped == 6 and reference_stream.first_drop == (0, 2)  # 7 batches: 3 epochs ended
    assert reference_stream.stats()["data_samples_dropped"] == 6
    rows = [decode_rows(tokenizer, batch) for batch in reference]
    assert all(len(batch) == BATCH for batch in rows)
    for epoch in range(3):
        own = set(reference_stream.layout.rank_shards(epoch))
        seen = rows[2 * epoch] + rows[2 * epoch + 1]
        assert len(set(seen)) == 16 and {shard_of[text] for text in seen} <= own, f"epoch {epoch}"
    first = loader_stream(shards, tokenizer, 1, 2, **options)
    take_batches(first, cut)
    state = json.loads(json.dumps(first.state_dict()))
    assert state["samples_dropped"] == {2: 0, 5: 4}[cut]  # 2 per epoch ended so far
    resumed = loader_stream(shards, tokenizer, 1, 2, **options)
    resumed.load_state_dict(state)
    assert_same_batches(take_batches(resumed, 7 - cut), reference[cut:])
    assert resumed.samples_dropped == 6
    rank0 = loader_stream(shards, tokenizer, 0, 2, **options)
    take_batches(rank0, cut)
    from_rank0 = loader_stream(shards, tokenizer, 1, 2, **options)
    from_rank0.load_state_dict(rank0.state_dict())
    assert_same_batches(take_batches(from_rank0, 7 - cut), reference[cut:])


def test_passes_with_fewer_rows_than_a_batch_stop_the_stream_naming_the_batch(tmp_path, tokenizer):
    shards = make_shards(tmp_path, sentences(6), shard_size=3)  # 6 rows per epoch, batch 8: all dropped
    with pytest.raises(ValueError, match="read 6 samples in data epoch 9, fewer than its per-device batch of 8"):
        stream_texts(loader_stream(shards, tokenizer, num_workers=0), tokenizer, 1)


def test_sources_and_options_are_validated(tmp_path, tokenizer):
    shards = make_shards(tmp_path, sentences(30), shard_size=10)  # 3 shards
    with pytest.raises(ValueError, match="at least world_size x workers"):
        loader_stream(shards, tokenizer, 0, 2, mode="exact")
    with pytest.raises(ValueError, match="allow_pipe"):
        loader_stream(f"pipe:cat {shards}/shard-000000.tar", tokenizer)
    with pytest.raises(ValueError, match="do not exist"):
        loader_stream(f"{shards}/shard-{{000000..000005}}.tar", tokenizer)
    with pytest.raises(ValueError, match="mode must be one of"):
        loader_stream(shards, tokenizer, mode="fast")
    manifest = json.loads((shards / "manifest.json").read_text())
    manifest["shards"][0]["name"] = "pipe:cat /etc/passwd"
    (shards / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="not a plain file name"):
        loader_stream(shards, tokenizer)


def test_brace_list_and_pipe_sources(tmp_path, tokenizer):
    texts = sentences(32)
    shards = make_shards(tmp_path, texts, shard_size=8)
    brace = loader_stream(f"{shards}/shard-{{000000..000003}}.tar", tokenizer, num_workers=1)
    assert sorted(stream_texts(brace, tokenizer, 4)) == sorted(texts)
    assert brace._dataset.source.total_samples == 32  # counts found in the manifest next to the shards
    piped = loader_stream(f"pipe:cat {shards}/shard-{{000000..000003}}.tar", tokenizer, num_workers=1, allow_pipe=True)
    assert sorted(stream_texts(piped, tokenizer, 4)) == sorted(texts)
    assert piped.corrupt_shards_skipped == 0
    failing_command = f"pipe:cat {shards}/shard-{{000000..000003}}.tar; exit 3"
    failing = loader_stream(failing_command, tokenizer, num_workers=0, allow_pipe=True)
    stream_texts(failing, tokenizer, 4)
    assert failing.corrupt_shards_skipped == 4


def test_sources_follow_webdataset_url_syntax(tmp_path, monkeypatch):
    from vascl_scale.data.shards import resolve_source

    shards = make_shards(tmp_path, sentences(32), shard_size=8)
    monkeypatch.setenv("WDS_SHARDS", str(shards))
    source = resolve_source("${SHARDS}/shard-{000000..000001}.tar::${SHARDS}/shard-000003.tar")
    assert [url.rsplit("/", 1)[1] for url in source.urls] == [
        "shard-000000.tar",
        "shard-000001.tar",
        "shard-000003.tar",
    ]
    assert source.counts == (8, 8, 8)
    with pytest.raises(ValueError, match="WDS_NAME"):
        resolve_source("${UNSET_NAME}/shard-000000.tar")
    with pytest.raises(ValueError, match="allow_pipe"):
        resolve_source(f"{shards}/shard-000000.tar::pipe:cat {shards}/shard-000001.tar")


def test_stored_token_ids_give_the_same_batches(tmp_path, tokenizer):
    from vascl_scale.data.prepare import PrepareOptions, prepare_shards

    texts = [("word " * (index % 30 + 1)) + f"end {index}" for index in range(64)]
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    tokenizer.save_pretrained(tmp_path / "tok")
    for name, stored in (("text", None), ("ids", str(tmp_path / "tok"))):
        options = PrepareOptions(shard_size=16, tokenizer=stored, max_length=20)
        prepare_shards([tmp_path / "in.txt"], tmp_path / name, options, show_progress=False)
    with_ids = loader_stream(tmp_path / "ids", tokenizer, max_length=20)
    assert with_ids._dataset.use_stored_ids
    assert_same_batches(
        take_batches(with_ids, 12), take_batches(loader_stream(tmp_path / "text", tokenizer, max_length=20), 12)
    )
    assert not loader_stream(tmp_path / "ids", tokenizer, max_length=16)._dataset.use_stored_ids


def test_shards_written_by_webdataset_stream_too(tmp_path, tokenizer):
    import webdataset as wds

    texts = sentences(16)
    for shard in range(2):
        with wds.TarWriter(str(tmp_path / f"web-{shard}.tar")) as writer:
            for index in range(8):
                # Long keys with directories exercise the PAX path records of webdataset's writer.
                key = f"nested/dir/{'k' * 120}{shard * 8 + index}"
                writer.write({"__key__": key, "txt": texts[shard * 8 + index], "json": {"index": index}})
    (tmp_path / "manifest.json").write_text('{"written by": "another tool"}')
    stream = loader_stream(f"{tmp_path}/web-{{0..1}}.tar", tokenizer, num_workers=2)
    assert stream._dataset.source.total_samples is None  # no manifest of ours: counts unknown
    assert sorted(stream_texts(stream, tokenizer, 2)) == sorted(texts)


def test_only_corrupt_shards_raise_instead_of_spinning(tmp_path, tokenizer):
    shards = make_shards(tmp_path, sentences(8), shard_size=4)
    for path in shards.glob("shard-*.tar"):
        path.write_bytes(b"garbage" * 200)
    with pytest.raises(RuntimeError, match="read no sample"):
        stream_texts(loader_stream(shards, tokenizer, num_workers=0), tokenizer, 1)


def _lockstep_steps(rank: int, world_size: int, source: str, mode: str, steps: int) -> dict:
    """On a gloo rank: a trainer-like loop, one all_reduce per batch (a rank that ran dry would hang it)."""
    import torch.distributed as dist

    tokenizer = minilm_tokenizer()
    stream = loader_stream(source, tokenizer, rank, world_size, mode=mode)
    batches = iter(stream)
    for _ in range(steps):
        rows = torch.tensor([next(batches)["anchor"]["input_ids"].shape[0]])
        dist.all_reduce(rows)
        assert int(rows) == BATCH * world_size
    return {"batches": stream.batches_yielded, "epoch": stream.epoch}


@pytest.mark.e2e
def test_two_gloo_ranks_step_in_lockstep_over_uneven_shards(tmp_path):
    from tests.gloo import run_on_ranks

    shards = make_shards(tmp_path, sentences(50), shard_size=10)  # 5 shards for 2 ranks x 2 workers
    results = run_on_ranks(_lockstep_steps, 2, str(shards), "resampled", 25, timeout=150)
    assert [r["batches"] for r in results] == [25, 25]
    assert all(r["epoch"] >= 3 for r in results)  # several epochs went by on every rank


# --- paired shards: one member per column, the manifest listing the columns ---

PAIR = ("anchor", "positive")


def test_paired_shards_stream_the_asked_columns_row_by_row_each_padded_to_its_own_longest(tmp_path, tokenizer):
    rows = paired_rows(64)
    shards = make_paired_shards(tmp_path / "pairs", rows, shard_size=8)  # 8 shards: 2 per slot of 2 ranks x 2 workers
    positive_of = {row["anchor"]: row["positive"].strip() for row in rows}
    seen, widths = [], set()
    for rank in (0, 1):
        stream = loader_stream(shards, tokenizer, rank, 2, mode="exact", columns=PAIR)
        assert stream.columns == PAIR
        with time_limit(60):
            batches = list(islice(iter(stream), 4))  # one epoch: 32 rows per rank
        for batch in batches:
            assert set(batch) == set(PAIR)
            for tensors in batch.values():
                longest = int(tensors["attention_mask"].sum(dim=1).max())
                assert all(t.dtype == torch.long and t.shape == (BATCH, longest) for t in tensors.values())
            widths.add((batch["anchor"]["input_ids"].shape[1], batch["positive"]["input_ids"].shape[1]))
            anchors, positives = decode_rows(tokenizer, batch), decode_rows(tokenizer, batch, "positive")
            assert [positive_of[anchor] for anchor in anchors] == positives  # the columns of one sample on one row
            seen += anchors
    assert sorted(seen) == sorted(positive_of)  # every pair once per epoch over the ranks
    assert any(a != p for a, p in widths), "the columns never differed in width: the test would prove nothing"
    # Not asked for columns: every column the data has.
    everything = take_batches(loader_stream(shards, tokenizer, num_workers=0), 1)[0]
    assert set(everything) == {"anchor", "positive", "negative_0"}


def test_shards_prepared_with_two_hard_negatives_stream_every_column_row_by_row(tmp_path, tokenizer):
    """`data prepare --text-field A,P,N1,N2` to supervised SimCSE's columns: all four read, the
    texts of one sample on one row of each column."""
    from vascl_scale.data.prepare import PrepareOptions, prepare_shards
    from vascl_scale.data.shards import source_columns
    from vascl_scale.losses import OBJECTIVES

    rows = paired_rows(24, negatives=2)
    fields = ("query", "pos", "neg_a", "neg_b")
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(dict(zip(fields, row.values()))) + "\n" for row in rows))
    prepare_shards(
        [path], tmp_path / "shards", PrepareOptions(shard_size=6, text_field=",".join(fields)), show_progress=False
    )
    columns = ("anchor", "positive", "negative_0", "negative_1")
    assert OBJECTIVES["simcse_sup"].columns_read(source_columns(str(tmp_path / "shards"))) == columns
    stream = loader_stream(tmp_path / "shards", tokenizer, columns=OBJECTIVES["simcse_sup"].columns_read(columns))
    by_anchor = {row["anchor"]: tuple(text.strip() for text in row.values()) for row in rows}
    seen = []
    for batch in take_batches(stream, 3):  # one epoch
        assert set(batch) == set(columns)
        texts = list(zip(*(decode_rows(tokenizer, batch, column) for column in columns)))
        assert all(by_anchor[row[0]] == row for row in texts)
        seen += [row[0] for row in texts]
    assert sorted(seen) == sorted(by_anchor)


LABELLED = ("anchor", "paired", "label")


@pytest.mark.parametrize(
    "rows,columns", [(paired_rows, PAIR), (labelled_rows, LABELLED)], ids=["pairs", "labelled_pairs"]
)
def test_paired_streams_resume_exactly_and_stored_ids_give_the_same_batches(tmp_path, tokenizer, rows, columns):
    """60 rows, 2 workers: pieces end short at each pass's end, so batches join pieces (labels with them)."""
    rows = rows(60)
    text = make_paired_shards(tmp_path / "text", rows, shard_size=8)
    ids = make_paired_shards(tmp_path / "ids", rows, shard_size=8, tokenizer=tokenizer, max_length=12)
    reference = take_batches(loader_stream(text, tokenizer, 1, 2, mode="exact", columns=columns, max_length=12), 12)
    assert all(set(batch) == set(columns) for batch in reference)
    with_ids = loader_stream(ids, tokenizer, 1, 2, mode="exact", columns=columns, max_length=12)
    assert with_ids._dataset.use_stored_ids
    assert_same_batches(take_batches(with_ids, 12), reference)
    first = loader_stream(text, tokenizer, 1, 2, mode="exact", columns=columns, max_length=12)
    take_batches(first, 5)  # 30 rows per rank and epoch: the cut is inside epoch 1
    resumed = loader_stream(text, tokenizer, 1, 2, mode="exact", columns=columns, max_length=12)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert_same_batches(take_batches(resumed, 7), reference[5:])


def test_a_sample_without_a_column_read_is_counted_and_never_yielded(tmp_path, tokenizer):
    from vascl_scale.data.shards import write_shard

    shards = make_paired_shards(tmp_path / "pairs", paired_rows(17), shard_size=17)
    samples = [
        (f"{i:09d}", {"anchor.txt": f"anchor {i}".encode(), "positive.txt": f"positive {i}".encode()})
        for i in range(17)
    ]
    del samples[3][1]["positive.txt"]
    write_shard(shards / "shard-000000.tar", samples)  # its manifest entry no longer matches: warned about, read on
    stream = loader_stream(shards, tokenizer, num_workers=0, columns=PAIR)
    batch_rows = [
        (anchor, positive)
        for batch in take_batches(stream, 2)
        for anchor, positive in zip(decode_rows(tokenizer, batch), decode_rows(tokenizer, batch, "positive"))
    ]
    assert sorted(batch_rows) == sorted((f"anchor {i}", f"positive {i}") for i in range(17) if i != 3)  # one epoch
    assert stream.samples_missing_field == 1


def test_columns_come_from_the_manifests_and_augmenting_data_that_has_positives_is_refused(tmp_path, tokenizer):
    from vascl_scale.data.shards import source_columns

    pairs = make_paired_shards(tmp_path / "pairs", paired_rows(16, negatives=2), shard_size=8)
    single = make_shards(tmp_path, sentences(16), shard_size=8)  # data prepare: a manifest without columns
    assert source_columns(str(pairs)) == ("anchor", "positive", "negative_0", "negative_1")
    assert source_columns(f"{pairs}/shard-{{000000..000001}}.tar") == ("anchor", "positive", "negative_0", "negative_1")
    assert source_columns(f"{pairs}/shard-000000.tar::{single}/shard-000000.tar") == ("anchor",)
    assert source_columns(str(single)) == source_columns(f"pipe:cat {pairs}/shard-000000.tar") == ("anchor",)
    assert source_columns(str(tmp_path / "corpus.txt")) == source_columns(str(tmp_path / "absent.tar")) == ("anchor",)
    with pytest.raises(
        ValueError, match="data.augment makes each sample's positive from its anchor, and .* has a positive column"
    ):
        loader_stream(pairs, tokenizer, columns=PAIR, augment="wdel")
    augmented = loader_stream(pairs, tokenizer, num_workers=0, columns=("anchor",), augment="wdel")
    assert augmented.columns == PAIR  # the data's positives are not read: the augmentation makes them
    manifest = json.loads((pairs / "manifest.json").read_text())
    for columns in (["positive"], ["anchor", "anchor"], ["anchor", "bad.name"], "anchor"):
        (pairs / "manifest.json").write_text(json.dumps({**manifest, "columns": columns}))
        with pytest.raises(ValueError, match=r"manifest.json: columns .* must be a list of distinct column names"):
            source_columns(str(pairs))


def test_labelled_pairs_stream_their_label_on_the_row_of_their_texts(tmp_path, tokenizer):
    rows = labelled_rows(60)
    shards = make_paired_shards(tmp_path / "pairs", rows, shard_size=8)
    label_of = {row["anchor"]: row["label"] for row in rows}
    stream = loader_stream(shards, tokenizer, 1, 2, mode="exact", columns=LABELLED)
    assert stream.columns == LABELLED
    batches = take_batches(stream, 12)
    for batch in batches:
        assert batch["label"].dtype == torch.long and batch["label"].shape == (BATCH,)
        assert batch["label"].tolist() == [label_of[anchor] for anchor in decode_rows(tokenizer, batch)]
    assert {label for batch in batches for label in batch["label"].tolist()} == {0, 1}
    # An objective that reads no label (SimCSE's anchor) never gets it.
    assert set(take_batches(loader_stream(shards, tokenizer, num_workers=0, columns=("anchor", "positive")), 1)[0]) == {
        "anchor"
    }


def test_a_label_that_is_not_0_or_1_is_a_corrupt_shard(tmp_path, tokenizer):
    from vascl_scale.data.shards import write_shard

    shards = make_paired_shards(tmp_path / "pairs", labelled_rows(16), shard_size=8)
    samples = [
        (f"{i:09d}", {"anchor.txt": b"an anchor", "paired.txt": b"its pair", "label.cls": b"2" if i == 5 else b"1"})
        for i in range(8)
    ]
    write_shard(shards / "shard-000000.tar", samples)
    with pytest.raises(
        CorruptShardError, match=r"shard-000000.tar: ValueError: a label member holds '2', not one of 0, 1"
    ):
        take_batches(
            loader_stream(shards, tokenizer, num_workers=0, columns=LABELLED, on_corrupt="fail", shuffle_buffer=0), 2
        )

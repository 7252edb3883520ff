"""``data prepare``: counts, drop reasons, input formats, determinism, WebDataset compatibility."""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
from collections import Counter
from pathlib import Path

import pytest

from tests.data_helpers import minilm_tokenizer, sentences, shard_texts
from vascl_scale.data.prepare import DROP_REASONS, PrepareOptions, prepare_shards
from vascl_scale.data.shards import ShardStream, iter_tar_samples


def _prepare(inputs, output: Path, **options):
    return prepare_shards([Path(p) for p in inputs], output, PrepareOptions(**options), show_progress=False)


def _messy_corpus(path: Path) -> tuple[list[str], dict[str, int]]:
    """Write lines hitting every drop reason; return the lines kept (in order) and the drops."""
    good = sentences(23)
    lines: list[bytes] = []
    kept: list[str] = []
    for index, text in enumerate(good):
        lines.append(text.encode())
        kept.append(text)
        if index % 5 == 0:
            lines.append(text.encode())  # duplicate
        if index % 7 == 0:
            lines.append(b"   ")  # empty after stripping
    lines += [b"\xff\xfe broken bytes here ok", b"two words", b"many words " * 20, b"caf\xc3\xa9 in  valid utf8 text"]
    kept.append("caf\u00e9 in  valid utf8 text")
    path.write_bytes(b"\n".join(lines) + b"\n")
    dropped = {"empty": 4, "invalid_utf8": 1, "malformed": 0, "too_short": 1, "too_long": 1, "duplicate": 5}
    return kept, dropped


def test_manifest_counts_drops_and_every_line_once(tmp_path):
    kept, dropped = _messy_corpus(tmp_path / "messy.txt")
    result = _prepare([tmp_path / "messy.txt"], tmp_path / "out", shard_size=5, dedup=True, min_words=3, max_chars=100)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["dropped"] == dropped == result.dropped
    assert manifest["total_samples"] == len(kept) == sum(s["samples"] for s in manifest["shards"])
    assert manifest["lines_read"] == len(kept) + sum(dropped.values())
    assert [s["name"] for s in manifest["shards"]] == [f"shard-{i:06d}.tar" for i in range(5)]
    assert [s["samples"] for s in manifest["shards"]] == [5, 5, 5, 5, 4]
    for shard in manifest["shards"]:
        digest = hashlib.sha256((tmp_path / "out" / shard["name"]).read_bytes()).hexdigest()
        assert shard["sha256"] == digest
    assert shard_texts(tmp_path / "out") == kept  # no shuffle: input order, each line once
    assert set(DROP_REASONS) == set(manifest["dropped"])


def test_same_bytes_twice_and_shuffle_is_a_permutation(tmp_path):
    texts = sentences(300)
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    for name in ("a", "b"):
        _prepare([tmp_path / "in.txt"], tmp_path / name, shard_size=64, shuffle_seed=3)
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "b").iterdir())
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    shuffled = shard_texts(tmp_path / "a")
    assert shuffled != texts and sorted(shuffled) == sorted(texts)
    _prepare([tmp_path / "in.txt"], tmp_path / "c", shard_size=64, shuffle_seed=4)
    assert shard_texts(tmp_path / "c") != shuffled


def _write_formats(directory: Path, texts: list[str]) -> dict[str, Path]:
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    paths = {"gz": directory / "in.txt.gz", "jsonl": directory / "in.jsonl", "csv": directory / "in.csv"}
    with gzip.open(paths["gz"], "wb") as handle:
        handle.write(("\n".join(texts) + "\n").encode())
    with open(paths["jsonl"], "w") as handle:
        for index, text in enumerate(texts):
            handle.write(json.dumps({"id": index, "sentence": text}) + "\n")
    with open(paths["csv"], "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "sentence"])
        writer.writerows(enumerate(texts))
    paths["parquet"] = directory / "in.parquet"
    pq.write_table(pa.table({"sentence": texts}), paths["parquet"], row_group_size=7)
    paths["hf"] = directory / "hf_dir"
    datasets.Dataset.from_dict({"sentence": texts}).save_to_disk(str(paths["hf"]))
    return paths


def test_every_input_format(tmp_path):
    texts = sentences(20) + ['a "quoted", comma text with\na newline inside']
    paths = _write_formats(tmp_path, texts)
    for fmt, path in paths.items():
        field = {} if fmt == "gz" else {"text_field": "sentence"}
        _prepare([path], tmp_path / f"out-{fmt}", shard_size=8, **field)
        expected = texts if fmt != "gz" else texts[:-1] + texts[-1].split("\n")
        assert shard_texts(tmp_path / f"out-{fmt}") == expected, fmt
    manifest = json.loads((tmp_path / "out-hf" / "manifest.json").read_text())
    assert manifest["sources"][0]["format"] == "hf"


def test_jsonl_bad_records_are_counted(tmp_path):
    path = tmp_path / "in.jsonl"
    records = [b'{"text": "one good line"}', b"not json", b"[1, 2]", b'{"text": 5}', b'{"text": null}']
    records.append(b'{"text": "bad \xff"}')
    path.write_bytes(b"\n".join(records) + b"\n")
    result = _prepare([path], tmp_path / "out", shard_size=10)
    assert result.samples == 1
    assert result.dropped["malformed"] == 3 and result.dropped["empty"] == 1 and result.dropped["invalid_utf8"] == 1


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet", "hf"])
def test_missing_text_field_names_it(tmp_path, fmt):
    path = _write_formats(tmp_path, sentences(3))[fmt]
    with pytest.raises(ValueError, match="'body'"):
        _prepare([path], tmp_path / "out", text_field="body")


def test_user_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        _prepare([tmp_path / "missing.txt"], tmp_path / "out")
    (tmp_path / "in.weird").write_text("a line\n")
    with pytest.raises(ValueError, match="--format"):
        _prepare([tmp_path / "in.weird"], tmp_path / "out")
    (tmp_path / "in.txt").write_text("a line\n")
    _prepare([tmp_path / "in.txt"], tmp_path / "out")
    with pytest.raises(ValueError, match="--overwrite"):
        _prepare([tmp_path / "in.txt"], tmp_path / "out")
    with pytest.raises(ValueError, match="--shard-size"):
        _prepare([tmp_path / "in.txt"], tmp_path / "out2", shard_size=0)


def test_shards_read_by_webdataset(tmp_path):
    import webdataset as wds

    texts = sentences(12)
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    _prepare([tmp_path / "in.txt"], tmp_path / "out", shard_size=5)
    urls = [str(p) for p in sorted((tmp_path / "out").glob("shard-*.tar"))]
    samples = list(wds.WebDataset(urls, shardshuffle=False))
    assert [s["txt"].decode() for s in samples] == texts
    assert len({s["__key__"] for s in samples}) == len(texts)


def test_stored_token_ids_match_the_tokenizer(tmp_path):
    import numpy as np

    tokenizer = minilm_tokenizer()
    texts = sentences(6)
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    model_dir = tmp_path / "tok"
    tokenizer.save_pretrained(model_dir)
    _prepare([tmp_path / "in.txt"], tmp_path / "out", shard_size=4, tokenizer=str(model_dir), max_length=6)
    with ShardStream(str(tmp_path / "out" / "shard-000000.tar")) as stream:
        stored = [np.frombuffer(sample["ids"], dtype="<i4").tolist() for sample in iter_tar_samples(stream)]
    assert stored == tokenizer(texts[:4], truncation=True, max_length=6)["input_ids"]
    assert Counter(len(ids) for ids in stored) == Counter({6: 4})

"""``data prepare``: counts, drop reasons, input formats, determinism, WebDataset compatibility."""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
from collections import Counter
from pathlib import Path

import pytest

from tests.data_helpers import minilm_tokenizer, sentences, shard_rows, shard_texts
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
    dropped = {"empty": 4, "invalid_utf8": 1, "malformed": 0, "missing_column": 0, "too_short": 1, "too_long": 1}
    dropped["duplicate"] = 5
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


# Paired data: --text-field A,P[,N...] and --format nli, through the CLI.

PAIR_FIELDS = ("query", "pos", "neg_a", "neg_b")


def _cli(*arguments: str):
    from typer.testing import CliRunner

    from vascl_scale.cli import app

    return CliRunner().invoke(app, ["data", "prepare", *map(str, arguments)])


def _rows(count: int, columns: int) -> list[tuple[str, ...]]:
    names = ("anchor", "positive", "negative a", "negative b")
    return [tuple(f"{names[column]} {index} of the tiny corpus" for column in range(columns)) for index in range(count)]


def _write_rows(path: Path, fields: tuple[str, ...], rows: list[tuple[object, ...]]) -> Path:
    """``rows`` as ``path``'s format (by suffix; a directory without one is a datasets directory), an id first."""
    records = [{"id": index, **dict(zip(fields, row))} for index, row in enumerate(rows)]
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(record) + "\n" for record in records))
    elif path.suffix in (".csv", ".tsv"):
        with open(path, "w", newline="") as handle:
            writer = csv.DictWriter(handle, ["id", *fields], delimiter="\t" if path.suffix == ".tsv" else ",")
            writer.writeheader()
            writer.writerows(records)
    else:
        import datasets
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.table({name: [record[name] for record in records] for name in ["id", *fields]})
        if path.suffix == ".parquet":
            pq.write_table(table, path, row_group_size=3)
        else:
            datasets.Dataset(table).save_to_disk(str(path))
    return path


def _manifest(directory: Path) -> dict:
    return json.loads((directory / "manifest.json").read_text())


@pytest.mark.parametrize("columns", [2, 4], ids=["pairs", "triplets_2_negatives"])
@pytest.mark.parametrize("name", ["in.jsonl", "in.csv", "in.tsv", "in.parquet", "hf_dir"])
def test_pairs_and_triplets_on_every_input_format(tmp_path, name, columns):
    import tarfile

    rows = _rows(7, columns)
    rows[2] = (rows[2][0] + ', "quoted"\nacross a newline', *rows[2][1:])
    source = _write_rows(tmp_path / name, PAIR_FIELDS[:columns], rows)
    result = _cli(source, "-o", tmp_path / "out", "--shard-size", "3", "--text-field", ",".join(PAIR_FIELDS[:columns]))
    assert result.exit_code == 0, result.output
    names = ["anchor", "positive", "negative_0", "negative_1"][:columns]
    manifest = _manifest(tmp_path / "out")
    assert manifest["columns"] == names and manifest["fields"] == [f"{column}.txt" for column in names]
    assert manifest["total_samples"] == 7 and manifest["lines_read"] == 7 and sum(manifest["dropped"].values()) == 0
    assert manifest["sources"][0]["text_field"] == ",".join(PAIR_FIELDS[:columns])
    assert shard_rows(tmp_path / "out") == rows
    with tarfile.open(tmp_path / "out" / "shard-000000.tar") as tar:
        first = [member for member in tar.getnames() if member.startswith("000000000000.")]
    assert first == sorted(f"000000000000.{column}.txt" for column in names)
    assert "columns" in result.output and ", ".join(names) in result.output


def test_single_text_manifest_names_the_anchor_column(tmp_path):
    (tmp_path / "in.txt").write_text("\n".join(sentences(3)) + "\n")
    assert _cli(tmp_path / "in.txt", "-o", tmp_path / "out").exit_code == 0
    manifest = _manifest(tmp_path / "out")
    assert manifest["columns"] == ["anchor"] and manifest["fields"] == ["txt"]
    assert manifest["dropped"]["missing_column"] == 0


def test_bad_rows_are_dropped_and_counted_per_reason(tmp_path):
    good = _rows(4, 3)
    path = tmp_path / "in.jsonl"
    lines = [json.dumps(dict(zip(PAIR_FIELDS, good[0])))]
    lines.append(json.dumps({"query": "an anchor without its positive", "neg_a": "a negative here"}))  # missing_column
    lines.append(json.dumps({"query": "an anchor", "pos": "   ", "neg_a": "a negative here"}))  # empty
    lines.append(json.dumps({"query": "an anchor", "pos": "a positive text", "neg_a": 7}))  # malformed
    lines.append("not json at all")  # malformed
    lines.append(json.dumps({"query": "an anchor", "pos": "bad BYTE here", "neg_a": "a negative here"}))  # invalid_utf8
    lines.append(json.dumps({"query": "an anchor", "pos": "short", "neg_a": "a negative here"}))  # too_short
    lines.append(json.dumps(dict(zip(PAIR_FIELDS, (good[0][0], "another positive", "another negative")))))  # duplicate
    lines += [json.dumps(dict(zip(PAIR_FIELDS, row))) for row in good[1:]]
    path.write_bytes("\n".join(lines).encode().replace(b"BYTE", b"\xff") + b"\n")
    result = _cli(path, "-o", tmp_path / "out", "--text-field", "query,pos,neg_a", "--dedup", "--min-words", "2")
    assert result.exit_code == 0, result.output
    manifest = _manifest(tmp_path / "out")
    assert manifest["dropped"] == {
        "empty": 1,
        "invalid_utf8": 1,
        "malformed": 2,
        "missing_column": 1,
        "too_short": 1,
        "too_long": 0,
        "duplicate": 1,
    }
    assert manifest["lines_read"] == len(lines) == manifest["total_samples"] + sum(manifest["dropped"].values())
    assert shard_rows(tmp_path / "out") == good
    for reason in ("missing_column", "malformed", "duplicate"):
        assert f"dropped: {reason}" in result.output


def test_a_short_csv_row_is_a_missing_column(tmp_path):
    rows = _rows(3, 3)
    path = tmp_path / "in.csv"
    path.write_text("query,pos,neg_a\n" + "\n".join(",".join(row) for row in rows) + "\nonly an anchor,its positive\n")
    assert _cli(path, "-o", tmp_path / "out", "--text-field", "query,pos,neg_a").exit_code == 0
    manifest = _manifest(tmp_path / "out")
    assert manifest["dropped"]["missing_column"] == 1 and manifest["dropped"]["invalid_utf8"] == 0
    assert shard_rows(tmp_path / "out") == rows


def test_dedup_is_on_the_anchor_only(tmp_path):
    rows = [("one anchor", "a positive"), ("one anchor", "another positive"), ("two anchor", "a positive")]
    source = _write_rows(tmp_path / "in.jsonl", PAIR_FIELDS[:2], rows)
    assert _cli(source, "-o", tmp_path / "out", "--text-field", "query,pos", "--dedup").exit_code == 0
    assert _manifest(tmp_path / "out")["dropped"]["duplicate"] == 1
    assert shard_rows(tmp_path / "out") == [rows[0], rows[2]]


def test_shuffle_and_stored_ids_keep_each_row_together(tmp_path):
    import numpy as np

    rows = _rows(40, 3)
    source = _write_rows(tmp_path / "in.parquet", PAIR_FIELDS[:3], rows)
    tokenizer = minilm_tokenizer()
    tokenizer.save_pretrained(tmp_path / "tok")
    result = _cli(
        source,
        "-o",
        tmp_path / "out",
        "--text-field",
        "query,pos,neg_a",
        "--shuffle-seed",
        "5",
        "--shard-size",
        "16",
        "--tokenizer",
        tmp_path / "tok",
        "--max-length",
        "6",
    )
    assert result.exit_code == 0, result.output
    shuffled = shard_rows(tmp_path / "out")
    assert shuffled != rows and sorted(shuffled) == sorted(rows)
    manifest = _manifest(tmp_path / "out")
    assert manifest["fields"] == [
        "anchor.txt",
        "anchor.ids",
        "positive.txt",
        "positive.ids",
        "negative_0.txt",
        "negative_0.ids",
    ]
    with ShardStream(str(tmp_path / "out" / "shard-000000.tar")) as stream:
        samples = list(iter_tar_samples(stream))
    for sample, row in zip(samples, shuffled):
        for column, text in zip(("anchor", "positive", "negative_0"), row):
            stored = np.frombuffer(sample[f"{column}.ids"], dtype="<i4").tolist()
            assert stored == tokenizer(text, truncation=True, max_length=6)["input_ids"]


def _nli_csv(path: Path, rows: list[tuple[str, ...]]) -> Path:
    """SimCSE's nli_for_simcse.csv layout: sent0, sent1, hard_neg."""
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["sent0", "sent1", "hard_neg"])
        writer.writerows(rows)
    return path


def test_nli_csv_of_simcse_gives_triplets(tmp_path):
    rows = _rows(5, 3)
    path = _nli_csv(tmp_path / "nli_for_simcse.csv", rows[:3] + [("an anchor", "a positive", "")] + rows[3:])
    result = _cli(path, "-o", tmp_path / "out", "--format", "nli")
    assert result.exit_code == 0, result.output
    manifest = _manifest(tmp_path / "out")
    assert manifest["columns"] == ["anchor", "positive", "negative_0"] and manifest["dropped"]["empty"] == 1
    assert manifest["sources"][0] == {"path": str(path), "format": "nli", "text_field": "sent0,sent1,hard_neg"}
    assert shard_rows(tmp_path / "out") == rows


def test_nli_jsonl_pairs_entailment_and_contradiction_of_each_premise(tmp_path):
    def line(premise: str, hypothesis: str, label: str) -> str:
        return json.dumps({"sentence1": premise, "sentence2": hypothesis, "gold_label": label, "pairID": "x"})

    lines = [  # premises interleaved, as MultiNLI lists them
        line("P1 a dog runs", "P1 an animal moves", "entailment"),
        line("P2 a man sings", "P2 a man is silent", "contradiction"),
        line("P1 a dog runs", "P1 the dog is asleep", "contradiction"),
        line("P1 a dog runs", "P1 the dog is happy", "neutral"),
        line("P2 a man sings", "P2 someone makes sound", "entailment"),
        line("P2 a man sings", "P2 a man sings loudly", "entailment"),
        line("P3 only entails", "P3 an entailment", "entailment"),
        line("P4 only contradicts", "P4 a contradiction", "contradiction"),
        line("P5 two contradictions", "P5 an entailment", "entailment"),
        line("P5 two contradictions", "P5 first contradiction", "contradiction"),
        line("P5 two contradictions", "P5 second contradiction", "contradiction"),
        line("P1 a dog runs", "P1 no agreement", "-"),
        line("P6 empty hypothesis", "  ", "entailment"),
        json.dumps({"sentence1": "P7 no label", "sentence2": "P7 a hypothesis"}),
    ]
    (tmp_path / "snli.jsonl").write_text("\n".join(lines) + "\n")
    result = _cli(tmp_path / "snli.jsonl", "-o", tmp_path / "out", "--format", "nli")
    assert result.exit_code == 0, result.output
    assert shard_rows(tmp_path / "out") == [
        ("P1 a dog runs", "P1 an animal moves", "P1 the dog is asleep"),
        ("P2 a man sings", "P2 someone makes sound", "P2 a man is silent"),
        ("P2 a man sings", "P2 a man sings loudly", "P2 a man is silent"),
        ("P5 two contradictions", "P5 an entailment", "P5 first contradiction"),
    ]
    manifest = _manifest(tmp_path / "out")
    assert manifest["columns"] == ["anchor", "positive", "negative_0"]
    assert manifest["negative_lines"] == 3
    assert {reason: count for reason, count in manifest["dropped"].items() if count} == {
        "neutral": 1,
        "no_gold_label": 1,
        "no_contradiction": 1,
        "no_entailment": 1,
        "unused_contradiction": 1,
        "empty": 1,
        "missing_column": 1,
    }
    assert manifest["lines_read"] == len(lines) == 4 + 3 + sum(manifest["dropped"].values())
    assert "lines kept as hard negatives" in result.output and "dropped: neutral" in result.output
    # --dedup keeps one row per premise.
    assert _cli(tmp_path / "snli.jsonl", "-o", tmp_path / "dedup", "--format", "nli", "--dedup").exit_code == 0
    assert [row[0] for row in shard_rows(tmp_path / "dedup")] == [
        "P1 a dog runs",
        "P2 a man sings",
        "P5 two contradictions",
    ]
    assert _manifest(tmp_path / "dedup")["dropped"]["duplicate"] == 1


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            ["--text-field", "query,body"],
            "--text-field query,body: {source}:1 has no field 'body' (fields: id, pos, query)",
        ),
        (["--text-field", "query,query"], "--text-field query,query names 'query' twice"),
        (["--text-field", "query,,pos"], "--text-field 'query,,pos' has an empty name"),
        (["--text-field", "query,"], "--text-field 'query,' has an empty name"),
        (["--text-field", ",".join(f"f{i}" for i in range(65))], "--text-field names 65 fields; at most 64"),
        (["--format", "nli", "--text-field", "query,pos"], "--text-field query,pos does not apply to --format nli"),
        (["--format", "nli"], "--format nli reads SimCSE's nli_for_simcse.csv"),
    ],
    ids=["absent", "duplicate", "empty", "trailing_comma", "too_many", "nli_with_fields", "nli_on_text"],
)
def test_text_field_errors_are_one_line_naming_the_option(tmp_path, arguments, message):
    source = _write_rows(tmp_path / "in.jsonl", PAIR_FIELDS[:2], _rows(2, 2))
    if arguments == ["--format", "nli"]:
        source = tmp_path / "in.txt"
        source.write_text("one line\n")
    result = _cli(source, "-o", tmp_path / "out", *arguments)
    assert result.exit_code == 2
    assert result.output.strip().startswith(f"error: {message.format(source=source)}"), result.output
    assert result.output.strip().count("\n") == 0
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["in.csv", "in.tsv", "in.parquet", "hf_dir"])
def test_a_field_the_table_lacks_is_named_with_its_columns(tmp_path, name):
    source = _write_rows(tmp_path / name, PAIR_FIELDS[:2], _rows(2, 2))
    result = _cli(source, "-o", tmp_path / "out", "--text-field", "query,pos,hard")
    assert result.exit_code == 2
    assert f"--text-field query,pos,hard: {source} has no column 'hard' (columns: id, query, pos)" in result.output


def test_plain_text_takes_one_field_only(tmp_path):
    (tmp_path / "in.txt").write_text("one line\n")
    result = _cli(tmp_path / "in.txt", "-o", tmp_path / "out", "--text-field", "a,b")
    assert result.exit_code == 2 and result.output.strip().count("\n") == 0
    assert f"--text-field a,b: {tmp_path / 'in.txt'} is plain text" in result.output


def test_a_later_record_without_any_field_stops_naming_its_line(tmp_path):
    source = _write_rows(tmp_path / "in.jsonl", PAIR_FIELDS[:2], _rows(2, 2))
    with open(source, "a") as handle:
        handle.write(json.dumps({"other": "x"}) + "\n")
    result = _cli(source, "-o", tmp_path / "out", "--text-field", "query,pos")
    assert result.exit_code == 2 and f"{source}:3 has no field 'query'" in result.output


# Labelled pairs (PairSupCon): --labelled-pairs from triplets, --label-field as they are.


def _members(shard: Path, key: str) -> list[str]:
    import tarfile

    with tarfile.open(shard) as tar:
        return [member for member in tar.getnames() if member.startswith(f"{key}.")]


def test_labelled_pairs_from_nli_triplets_write_each_anchor_twice_shuffled_and_count_every_row(tmp_path):
    rows = _rows(6, 3)
    # An empty negative, and a repeated triplet.
    path = _nli_csv(tmp_path / "nli_for_simcse.csv", rows[:3] + [("an anchor", "a positive", ""), rows[0]] + rows[3:])
    result = _cli(path, "-o", tmp_path / "out", "--format", "nli", "--labelled-pairs", "--shuffle-seed", "3", "--dedup")
    assert result.exit_code == 0, result.output
    manifest = _manifest(tmp_path / "out")
    assert manifest["columns"] == ["anchor", "paired", "label"] and manifest["fields"] == [
        "anchor.txt",
        "paired.txt",
        "label.cls",
    ]
    assert manifest["lines_read"] == 8 and manifest["rows_read"] == 16
    assert manifest["dropped"] == {**{reason: 0 for reason in DROP_REASONS}, "empty": 1, "duplicate": 2}
    assert manifest["total_samples"] == 13 == manifest["rows_read"] - sum(manifest["dropped"].values())
    in_order = [pair for a, p, n in rows[:3] for pair in ((a, p, "1"), (a, n, "0"))] + [
        ("an anchor", "a positive", "1")
    ]
    in_order += [pair for a, p, n in rows[3:] for pair in ((a, p, "1"), (a, n, "0"))]
    written = shard_rows(tmp_path / "out")
    assert sorted(written) == sorted(in_order) and written != in_order  # shuffled: an anchor's two rows apart
    assert sorted(_members(tmp_path / "out" / "shard-000000.tar", "000000000000")) == [
        "000000000000.anchor.txt", "000000000000.label.cls", "000000000000.paired.txt",
    ]  # fmt: skip
    assert "rows read (two labelled pairs per triplet)" in result.output


@pytest.mark.parametrize("name", ["in.jsonl", "in.tsv", "in.parquet", "hf_dir"])
def test_labelled_pairs_from_a_label_field_count_bad_labels_and_keep_both_rows_of_an_anchor(tmp_path, name):
    good = [
        ("one anchor", "its positive", 1),
        ("one anchor", "its negative", 0),
        ("two anchor", "another", "1"),
        ("three anchor", "x y", 1.0),
    ]
    bad = [
        ("bad anchor a", "a text", 2),
        ("bad anchor b", "a text", "yes"),
        ("bad anchor c", "a text", 0.5),
        ("bad anchor d", "a text", None),
    ]
    if name.endswith("parquet") or name == "hf_dir":  # typed columns: an integer label column (null for None)
        good = [(a, p, int(float(y))) for a, p, y in good]
        bad = [(a, p, y) for (a, p, _), y in zip(bad, (2, 5, -1, None))]
    rows = good[:2] + bad + good[2:] + [good[0]]  # the last repeats a pair: a duplicate
    source = _write_rows(tmp_path / name, ("s1", "s2", "y"), rows)
    result = _cli(source, "-o", tmp_path / "out", "--text-field", "s1,s2", "--label-field", "y", "--dedup")
    assert result.exit_code == 0, result.output
    manifest = _manifest(tmp_path / "out")
    assert manifest["columns"] == ["anchor", "paired", "label"] and "rows_read" not in manifest
    assert manifest["dropped"]["bad_label"] == 4 and manifest["dropped"]["duplicate"] == 1
    assert manifest["lines_read"] == len(rows) == manifest["total_samples"] + sum(manifest["dropped"].values())
    assert shard_rows(tmp_path / "out") == [(a, p, str(int(float(y)))) for a, p, y in good]
    assert "dropped: bad_label" in result.output


def test_a_jsonl_pair_without_its_label_is_a_missing_column_and_a_boolean_a_bad_label(tmp_path):
    path = tmp_path / "in.jsonl"
    records = [
        {"s1": "an anchor", "s2": "a pair", "y": 1},
        {"s1": "an anchor b", "s2": "a pair"},
        {"s1": "c", "s2": "d", "y": True},
    ]
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    assert _cli(path, "-o", tmp_path / "out", "--text-field", "s1,s2", "--label-field", "y").exit_code == 0
    manifest = _manifest(tmp_path / "out")
    assert manifest["dropped"]["missing_column"] == 1 and manifest["dropped"]["bad_label"] == 1
    assert shard_rows(tmp_path / "out") == [("an anchor", "a pair", "1")]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            ["--text-field", "query,pos,neg_a", "--label-field", "y"],
            "--label-field y labels pairs: pass the pair's two texts",
        ),
        (["--text-field", "query,pos", "--label-field", "pos"], "--label-field pos labels pairs"),
        (["--text-field", "query,pos", "--label-field", "a,b"], "--label-field takes one field name; got 'a,b'"),
        (["--format", "nli", "--label-field", "y"], "--label-field y does not apply to --format nli"),
        (
            ["--text-field", "query,pos", "--label-field", "y", "--labelled-pairs"],
            "--label-field y reads labelled pairs and --labelled-pairs",
        ),
        (
            ["--text-field", "query,pos", "--labelled-pairs", "--shuffle-seed", "1"],
            "--labelled-pairs makes two labelled pairs of each triplet",
        ),
        (["--text-field", "query,pos,neg_a", "--labelled-pairs"], "--labelled-pairs writes each anchor twice"),
        (
            ["--text-field", "query,pos", "--label-field", "y"],
            "--label-field y: {source}:1 has no field 'y' (fields: id, pos, query)",
        ),
    ],
    ids=["three_texts", "label_is_a_text", "two_labels", "nli", "both", "pairs_from_pairs", "no_shuffle", "absent"],
)
def test_labelled_pair_errors_are_one_line_naming_the_option(tmp_path, arguments, message):
    source = _write_rows(tmp_path / "in.jsonl", PAIR_FIELDS[:2], _rows(2, 2))
    result = _cli(source, "-o", tmp_path / "out", *arguments)
    assert result.exit_code == 2
    assert result.output.strip().startswith(f"error: {message.format(source=source)}"), result.output
    assert not (tmp_path / "out").exists()


def test_plain_text_has_no_label_field(tmp_path):
    (tmp_path / "in.txt").write_text("one line\n")
    result = _cli(tmp_path / "in.txt", "-o", tmp_path / "out", "--text-field", "a,b", "--label-field", "y")
    assert (
        result.exit_code == 2
        and f"--text-field a,b --label-field y: {tmp_path / 'in.txt'} is plain text" in result.output
    )


@pytest.mark.parametrize(
    "lines,options,reason",
    [
        (["one two", "three four five"], ["--min-words", "9"], "too_short 2); lower --min-words"),
        (
            ["a long sentence here", "", "another long one"],
            ["--max-chars", "3"],
            "too_long 2, empty 1); raise --max-chars or give texts that are not blank",
        ),
        ([], [], "the inputs hold no records; give inputs with text in them"),
    ],
)
def test_writing_no_sample_fails_with_one_line_and_leaves_the_output_as_it_was(tmp_path, lines, options, reason):
    source = tmp_path / "in.txt"
    source.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    output = tmp_path / "out"
    result = _cli(source, "--output", output, *options)
    assert result.exit_code == 1, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in result.output, result.output
    flat = " ".join(result.output.split())
    assert f"error: no sample written to --output {output}: " in flat and reason in flat, flat
    assert "samples written │ 0" in flat
    assert not output.exists()
    # An existing shard set stays as it was, --overwrite or not.
    (tmp_path / "good.txt").write_text("some text\nmore text\n", encoding="utf-8")
    assert _cli(tmp_path / "good.txt", "--output", output).exit_code == 0
    before = {path.name: path.read_bytes() for path in output.iterdir()}
    assert _cli(source, "--output", output, "--overwrite", *options).exit_code == 1
    assert {path.name: path.read_bytes() for path in output.iterdir()} == before


@pytest.mark.parametrize("name", ["in.jsonl", "in.csv", "in.parquet"])
def test_a_score_field_writes_the_scores_column_and_a_row_without_it_is_a_missing_column(tmp_path, name):
    rows = [
        ("q one", "p one", "n one", [3.5, -1]),
        ("q two", "p two", "n two", None),  # no scores: dropped, counted
        ("q three", "p three", "n three", [0.25, 0.125]),
    ]
    if name.endswith(".csv"):  # a CSV cell holds the list's JSON text; an empty cell is no value
        rows = [(*row[:3], "" if row[3] is None else json.dumps(row[3])) for row in rows]
    if name.endswith(".jsonl"):
        rows[1] = rows[1][:3]  # the field absent from the object
    source = _write_rows(tmp_path / name, ("q", "pos", "neg", "teacher"), rows)
    result = _cli(source, "-o", tmp_path / "out", "--text-field", "q,pos,neg", "--score-field", "teacher")
    assert result.exit_code == 0, result.output
    manifest = _manifest(tmp_path / "out")
    assert manifest["columns"] == ["anchor", "positive", "negative_0", "scores"]
    written = shard_rows(tmp_path / "out")
    assert [row[:3] for row in written] == [("q one", "p one", "n one"), ("q three", "p three", "n three")]
    assert [json.loads(row[3]) for row in written] == [[3.5, -1.0], [0.25, 0.125]]
    assert manifest["dropped"]["missing_column"] == 1 and manifest["lines_read"] == 3


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([1.0, float("nan")], r"holds the score nan, not a finite number within \+-10000"),
        ([1.0, 2.0, 3.0], r"holds 3 score\(s\) where the row has 2 candidate\(s\)"),
        (["high", "low"], r"not a list of numbers"),
    ],
)
def test_a_bad_score_is_one_line_naming_the_file_and_record(tmp_path, value, message):
    source = tmp_path / "scored.jsonl"
    good = {"q": "a", "p": "b", "n": "c", "s": [1, 0]}
    bad = {**good, "s": value}
    source.write_text(json.dumps(good) + "\n" + json.dumps(bad).replace("NaN", "NaN") + "\n")
    result = _cli(source, "-o", tmp_path / "out", "--text-field", "q,p,n", "--score-field", "s")
    assert result.exit_code != 0
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.output
    import re

    assert re.search(rf"{re.escape(str(source))}: record 2: --score-field s .*{message}", lines[0]), lines[0]
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_a_score_field_needs_candidates_and_no_labels(tmp_path):
    source = _write_rows(tmp_path / "in.jsonl", ("q", "p", "y", "s"), [("a", "b", 1, [1.0])])
    one_text = _cli(source, "-o", tmp_path / "out", "--text-field", "q", "--score-field", "s")
    assert one_text.exit_code != 0 and "--score-field s holds a teacher's scores of each row's candidates" in (
        one_text.output
    )
    labelled = _cli(source, "-o", tmp_path / "out", "--text-field", "q,p", "--label-field", "y", "--score-field", "s")
    assert labelled.exit_code != 0 and "labelled pairs have none" in labelled.output


def test_the_stream_carries_scores_and_each_text_columns_hashes(tmp_path):
    import torch

    from vascl_scale.config import DataConfig
    from vascl_scale.data.columns import text_hash
    from vascl_scale.data.loader import build_train_stream

    rows = [(f"query {i % 5}", f"passage {i}", f"negative {i}", [float(i), -float(i)]) for i in range(24)]
    source = _write_rows(tmp_path / "in.jsonl", ("q", "p", "n", "s"), rows)
    assert _cli(source, "-o", tmp_path / "out", "--text-field", "q,p,n", "--score-field", "s").exit_code == 0
    columns = ("anchor", "positive", "negative_0", "scores")
    data = DataConfig(train=str(tmp_path / "out"), num_workers=0, shuffle_buffer=0, max_length=16)
    stream = build_train_stream(
        data,
        tokenizer=minilm_tokenizer(),
        per_device_batch_size=8,
        rank=0,
        world_size=1,
        seed=0,
        columns=columns,
        text_hashes=True,
    )
    batch = next(iter(stream))
    assert batch["scores"].dtype == torch.float32 and batch["scores"][:, 0].tolist() == list(range(8))
    for column, field in zip(columns[:3], range(3)):
        expected = [text_hash(rows[i][field].encode()) for i in range(8)]
        assert batch[f"{column}.hash"].tolist() == expected
    anchors = batch["anchor.hash"].tolist()
    assert anchors[0] == anchors[5] and anchors[0] != anchors[1]  # "query 0" twice in the batch

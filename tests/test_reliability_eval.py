"""Bad evaluation input is refused where it is, never scored: stray quotes in a TSV, non-finite
gold scores, a damaged embedding cache, and tables that must keep every digit in a log file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from tests.test_data_loader import captured_warnings
from tests.test_eval_cli import WORDS, invoke, save_tiny_bert, write_tsv
from vascl_scale.eval.clustering import CLUSTERING_TASKS, load_labelled_texts
from vascl_scale.eval.embed import Embedder, resolve_model
from vascl_scale.eval.intent import load_intent_dataset
from vascl_scale.eval.sts import load_senteval_sts_dir, load_sick_txt, load_sts_tsv, load_stsb_csv


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return save_tiny_bert(tmp_path_factory.mktemp("model") / "tiny")


def _load_intent_train(path: Path):
    return load_intent_dataset(path.parents[2], path.parent.name)


# Every loader of a headed TSV: (file under tmp_path, header, one row, the text column that a
# stray quote opens, the loader).
TSV_LOADERS: dict[str, tuple[str, list[str], Callable[[int], list[str]], int, Callable]] = {
    "sts": (
        "sts/stsb/test.tsv",
        ["sentence1", "sentence2", "score"],
        lambda i: [f"one {i}", f"two {i}", str(i % 5)],
        0,
        load_sts_tsv,
    ),
    "sick": (
        "SICK.txt",
        ["pair_ID", "sentence_A", "sentence_B", "relatedness_score"],
        lambda i: [str(i), f"a dog {i}", f"a cat {i}", "3.5"],
        1,
        load_sick_txt,
    ),
    "clustering": ("clustering/agnews.tsv", ["text", "label"], lambda i: [f"text {i}", str(i % 3)], 0, load_labelled_texts),
    "intent": ("intent/toy/train.tsv", ["text", "label"], lambda i: [f"book {i}", f"intent_{i % 3}"], 0, _load_intent_train),
}


def _write_with_quotes(path: Path, header: list[str], row: Callable[[int], list[str]], column: int, rows: int,
                       opened: int, closed: int | None) -> Path:
    """A TSV whose physical line ``opened`` starts field ``column`` with a stray quote; line
    ``closed`` (if any) holds an ordinary in-text quote, which is where the parser closes it."""
    lines = ["\t".join(header)]
    for i in range(rows):
        fields = row(i)
        line = len(lines) + 1
        if line == opened:
            fields[column] = '"' + fields[column]
        if line == closed:
            fields[column] = f'she said "hi {fields[column]}'
        lines.append("\t".join(fields))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    if path.name == "train.tsv":  # the intent loader also needs a test split
        write_tsv(path.parent / "test.tsv", "text\tlabel", ["fine\tintent_0"])
    return path


@pytest.mark.parametrize("kind", list(TSV_LOADERS))
def test_quote_that_merges_rows_is_reported_where_it_opened(tmp_path, kind):
    name, header, row, column, load = TSV_LOADERS[kind]
    path = _write_with_quotes(tmp_path / name, header, row, column, rows=20, opened=4, closed=9)
    with pytest.raises(ValueError, match=rf"{Path(name).name}:4: .*{header[column]!r}.* lines 4 to 9"):
        load(path)


@pytest.mark.parametrize("rows", [10, 40_000])  # 40,000 rows overflow the csv module's field limit
@pytest.mark.parametrize("kind", list(TSV_LOADERS))
def test_never_closed_quote_is_reported_where_it_opened(tmp_path, kind, rows):
    name, header, row, column, load = TSV_LOADERS[kind]
    path = _write_with_quotes(tmp_path / name, header, row, column, rows=rows, opened=4, closed=None)
    with pytest.raises(ValueError, match=rf"{Path(name).name}:4: .*quote"):
        load(path)


NON_FINITE = ["nan", "NaN", "inf", "-inf", "Infinity", "1e999"]


@pytest.mark.parametrize("value", NON_FINITE)
def test_non_finite_gold_scores_are_rejected_in_every_format(tmp_path, value):
    sts = tmp_path / "t.tsv"
    sts.write_text(f"sentence1\tsentence2\tscore\na\tb\t1\nc\td\t{value}\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"t\.tsv:3: score '{value}' is not a finite number"):
        load_sts_tsv(sts)
    sick = tmp_path / "SICK.txt"
    sick.write_text(f"pair_ID\tsentence_A\tsentence_B\trelatedness_score\n1\ta\tb\t{value}\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"SICK\.txt:2: relatedness_score '{value}' is not a finite number"):
        load_sick_txt(sick)
    stsb = tmp_path / "sts-test.csv"
    stsb.write_text(f"main\tMSRvid\t2012\t0001\t{value}\tOne.\tTwo.\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"sts-test\.csv:1: score '{value}' is not a finite number"):
        load_stsb_csv(stsb)
    senteval = tmp_path / "senteval"
    senteval.mkdir()
    (senteval / "STS.input.x.txt").write_text("a .\tb .\nc .\td .\n", encoding="utf-8")
    (senteval / "STS.gs.x.txt").write_text(f"1\n{value}\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"STS\.gs\.x\.txt:2: score '{value}' is not a finite number"):
        load_senteval_sts_dir(senteval)


@pytest.mark.parametrize(
    "content, where",
    [
        ("".join(f"one {i}\ttwo {i}\t{i % 5}\n" if i != 2 else f'"one {i}\ttwo {i}\t1\n' for i in range(30))
         + 'she said "hi\tthere\t2\n', "test.tsv:4: "),
        ("one\ttwo\t1\nthree\tfour\tnan\n", "test.tsv:3: score 'nan' is not a finite number"),
    ],
    ids=["stray-quote", "nan-score"],
)
def test_cli_shows_bad_data_as_a_clean_error(tiny_model, tmp_path, content, where):
    path = tmp_path / "data" / "sts" / "stsb" / "test.tsv"
    path.parent.mkdir(parents=True)
    path.write_text("sentence1\tsentence2\tscore\n" + content, encoding="utf-8")
    result = invoke("sts", "--model", str(tiny_model), "--data-dir", str(tmp_path / "data"), "--task", "stsb",
                    "--max-length", "32", "--no-cache", "--output", str(tmp_path / "r.json"))
    assert result.exit_code == 2, result.output
    assert where in result.output and "Traceback" not in result.output
    assert not (tmp_path / "r.json").exists()




def _flip_a_stored_byte(part: Path) -> None:
    data = bytearray(part.read_bytes())
    data[data.rindex(b"\x93NUMPY") + 200] ^= 0xFF  # inside the embeddings member: its CRC-32 fails
    part.write_bytes(bytes(data))


def _rewrite(part: Path, rows: int | None = None, width: int | None = None) -> None:
    with np.load(part) as stored:
        keys, embeddings = stored["keys"], stored["embeddings"]
    rows = len(keys) if rows is None else rows
    width = embeddings.shape[1] if width is None else width
    np.savez(part, keys=keys, embeddings=np.ones((rows, width), dtype=np.float32))


CORRUPTIONS: dict[str, Callable[[Path], None]] = {
    "empty": lambda part: part.write_bytes(b""),
    "truncated": lambda part: part.write_bytes(part.read_bytes()[: part.stat().st_size // 2]),
    "bad-crc": _flip_a_stored_byte,
    "not-npz": lambda part: part.write_text("not an archive", encoding="utf-8"),
    "wrong-width": lambda part: _rewrite(part, width=5),
    "fewer-rows-than-keys": lambda part: _rewrite(part, rows=2),
}


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_damaged_cache_part_is_a_miss_with_a_warning(tiny_model, tmp_path, caplog, corruption):
    texts = ["river bank money", "music and a guitar", "football goal", "cloud rain storm"]
    spec = resolve_model(tiny_model)
    reference = Embedder(spec, cache_dir=tmp_path).embed(texts)(texts)  # (4, 32); writes one part
    [part] = tmp_path.glob("*/part-*.npz")
    CORRUPTIONS[corruption](part)
    embedder = Embedder(spec, cache_dir=tmp_path)
    with captured_warnings(caplog):
        again = embedder.embed(texts)(texts)
    assert embedder.stats.encoded == len(texts) and embedder.stats.from_cache == 0
    np.testing.assert_allclose(again, reference, atol=1e-6)
    assert part.name in caplog.text and "encoding its texts again" in caplog.text


def test_wide_tables_keep_every_number_when_output_is_not_a_terminal(tiny_model, tmp_path, monkeypatch):
    """Eight clustering columns do not fit the 80 columns rich assumes for a file or a pipe."""
    monkeypatch.setenv("COLUMNS", "80")
    for task in CLUSTERING_TASKS:
        write_tsv(tmp_path / "clustering" / f"{task}.tsv", "text\tlabel",
                  [f"{WORDS[i % 12]} {WORDS[(i * 5) % 12]} {i}\t{i % 3}" for i in range(12)])
    result = invoke("clustering", "--model", str(tiny_model), "--data-dir", str(tmp_path), "--no-cache",
                    "--output", str(tmp_path / "c.json"))
    assert result.exit_code == 0, result.output
    table = "\n".join(line for line in result.output.splitlines() if "│" in line or "┃" in line)
    scores = [r["primary"] for r in json.loads((tmp_path / "c.json").read_text())["models"][0]["results"]]
    assert "…" not in table
    for cell in [*CLUSTERING_TASKS, *(f"{score:.2f}" for score in scores), f"{np.mean(scores):.2f}"]:
        assert cell in table


def test_senteval_sentences_may_hold_unicode_line_separators(tmp_path):
    """Only line ends end a line: str.splitlines would also split at U+0085 (mojibake of a
    cp1252 ellipsis), U+2028 or a form feed and misalign the sentences with their gold scores."""
    (tmp_path / "STS.input.x.txt").write_text("wait\x85 what .\tno .\nyes \u2028 .\tok\x0c .\n", encoding="utf-8")
    (tmp_path / "STS.gs.x.txt").write_text("1\n2\n", encoding="utf-8")
    pairs = load_senteval_sts_dir(tmp_path)
    assert [(p.sentence1, p.sentence2, p.score) for p in pairs] == [
        ("wait\x85 what .", "no .", 1.0),
        ("yes \u2028 .", "ok\x0c .", 2.0),
    ]

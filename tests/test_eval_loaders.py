"""Loaders of the evaluation data: the TSV layout, and the original STS / SICK formats as the
converters of ``data download`` turn them into it, with the errors of bad input (file and line
named)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from vascl_scale.data.converters import CONVERTERS
from vascl_scale.data.registry import load_registry
from vascl_scale.eval.clustering import load_labelled_texts
from vascl_scale.eval.intent import load_intent_dataset
from vascl_scale.eval.sts import StsPair, default_stsb_dev_path, load_sts_task, load_sts_tsv
from vascl_scale.eval.tables import MissingDataError

REPO = Path(__file__).resolve().parents[1]
REAL_DATA = Path(os.environ.get("VASCL_DATA") or REPO.parent / "shared" / "data")
needs_real_data = pytest.mark.skipif(not (REAL_DATA / "sts").is_dir(), reason=f"no evaluation data at {REAL_DATA}")


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def converted(converter: str, originals: list[Path], options: dict, stage: Path) -> list[StsPair]:
    """The pairs of ``originals`` as ``data download`` gives them to the evaluation: converted
    into the layout by ``converter`` (one output, ``out.tsv``), then read back."""
    if converter == "senteval_sts":
        options = {"outputs": ["out.tsv"], **options}
    else:  # stsb_csv, sick_semeval: each original file to its output
        options = {"files": {originals[0].name: "out.tsv"}, **options}
    CONVERTERS[converter](originals, options, stage)
    return load_sts_tsv(stage / "out.tsv")


def senteval(directory: Path, subsets: list[str], stage: Path) -> list[StsPair]:
    """SentEval's STS layout in ``directory`` (``STS.input.<subset>.txt`` beside ``STS.gs.<subset>.txt``), converted."""
    return converted("senteval_sts", sorted(directory.glob("STS.*.txt")), {"subsets": subsets}, stage)


def test_sts_tsv_with_quotes_and_subsets(tmp_path):
    path = write(
        tmp_path / "sts12" / "test.tsv",
        "sentence1\tsentence2\tscore\tsubset\n"
        'A man "runs".\tA man is running.\t4.2\tMSRvid\n'
        '"He said ""no""\tthen left."\tNobody spoke.\t0.5\tOnWN\n',
    )
    assert load_sts_tsv(path) == [
        StsPair('A man "runs".', "A man is running.", 4.2, "MSRvid"),
        StsPair('He said "no"\tthen left.', "Nobody spoke.", 0.5, "OnWN"),
    ]


def test_sts_tsv_without_subset_column(tmp_path):
    path = write(tmp_path / "t.tsv", "sentence1\tsentence2\tscore\na\tb\t1\n")
    assert load_sts_tsv(path) == [StsPair("a", "b", 1.0, "")]


def test_malformed_row_names_file_and_line(tmp_path):
    path = write(tmp_path / "t.tsv", "sentence1\tsentence2\tscore\na\tb\t1\nonly one field\n")
    with pytest.raises(ValueError, match=r"t\.tsv:3: malformed row with 1 fields, expected 3"):
        load_sts_tsv(path)


def test_non_numeric_score_names_file_and_line(tmp_path):
    path = write(tmp_path / "t.tsv", "sentence1\tsentence2\tscore\na\tb\thigh\n")
    with pytest.raises(ValueError, match=r"t\.tsv:2: score 'high' is not a number"):
        load_sts_tsv(path)


def test_empty_text_names_file_and_line(tmp_path):
    path = write(tmp_path / "c.tsv", "text\tlabel\nfine text\t1\n   \t2\n")
    with pytest.raises(ValueError, match=r"c\.tsv:3: empty text in column 'text'"):
        load_labelled_texts(path)


def test_missing_column_is_reported(tmp_path):
    path = write(tmp_path / "c.tsv", "sentence\tlabel\nx\t1\n")
    with pytest.raises(ValueError, match=r"lacks columns \['text'\]"):
        load_labelled_texts(path)


def test_missing_file_names_file_and_layout(tmp_path):
    with pytest.raises(
        MissingDataError,
        match=r"sts/stsb/test\.tsv not found; expected the data layout \(docs/data\.md\).*data download",
    ):
        load_sts_task(tmp_path, "stsb")
    with pytest.raises(ValueError, match="unknown STS task"):
        load_sts_task(tmp_path, "sts99")


def test_sickr_full_concatenates_train_dev_test(tmp_path):
    for split, n in (("train", 3), ("dev", 1), ("test", 2)):
        rows = "".join(f"{split} {i}\tother {i}\t{i + 1}\n" for i in range(n))
        write(tmp_path / "sts" / "sickr" / f"{split}.tsv", "sentence1\tsentence2\tscore\n" + rows)
    pairs = load_sts_task(tmp_path, "sickr-full")
    assert [p.sentence1 for p in pairs] == ["train 0", "train 1", "train 2", "dev 0", "test 0", "test 1"]
    assert len(load_sts_task(tmp_path, "sickr")) == 2


def test_default_stsb_dev_path(tmp_path):
    assert default_stsb_dev_path(tmp_path) == tmp_path / "sts" / "stsb" / "dev.tsv"


def test_senteval_dir_drops_pairs_without_gold(tmp_path):
    write(tmp_path / "STS.input.MSRpar.txt", "a b .\tc d .\ne f .\tg h .\ni j .\tk l .\n")
    write(tmp_path / "STS.gs.MSRpar.txt", "4.000\n\n1.500\n")
    write(tmp_path / "STS.input.surprise.OnWN.txt", "m .\tn .\n")
    write(tmp_path / "STS.gs.surprise.OnWN.txt", "2\n")
    pairs = senteval(tmp_path, ["MSRpar", "surprise.OnWN"], tmp_path / "stage")
    assert pairs == [
        StsPair("a b .", "c d .", 4.0, "MSRpar"),
        StsPair("i j .", "k l .", 1.5, "MSRpar"),
        StsPair("m .", "n .", 2.0, "OnWN"),  # the converter drops a leading "surprise." (the registry's notes)
    ]


def test_senteval_dir_errors(tmp_path):
    stage = tmp_path / "stage"
    with pytest.raises(ValueError, match="STS.input"):
        senteval(tmp_path, ["x"], stage)
    write(tmp_path / "STS.input.x.txt", "a\tb\nc\td\n")
    with pytest.raises(ValueError, match=r"STS\.gs\.x\.txt not found"):
        senteval(tmp_path, ["x"], stage)
    write(tmp_path / "STS.gs.x.txt", "1\n")
    with pytest.raises(ValueError, match="has 2 lines but"):
        senteval(tmp_path, ["x"], stage)
    write(tmp_path / "STS.input.x.txt", "a\tb\nc d\n")
    write(tmp_path / "STS.gs.x.txt", "1\n2\n")
    with pytest.raises(ValueError, match=r"STS\.input\.x\.txt:2: expected 2 tab-separated"):
        senteval(tmp_path, ["x"], stage)


def test_stsb_csv_with_and_without_source_columns(tmp_path):
    path = write(
        tmp_path / "sts-test.csv",
        'main-captions\tMSRvid\t2012test\t0024\t2.500\tA girl is "styling" her hair.\tA girl is brushing her hair.\n'
        "main-news\theadlines\t2013\t0001\t0.000\tOne.\tTwo.\tsrc-a\tsrc-b\n",
    )
    # The layout's STS-B files hold no subset column: the genre is not kept.
    assert converted("stsb_csv", [path], {}, tmp_path / "stage") == [
        StsPair('A girl is "styling" her hair.', "A girl is brushing her hair.", 2.5, ""),
        StsPair("One.", "Two.", 0.0, ""),
    ]
    bad = write(tmp_path / "bad.csv", "g\tf\ty\ti\t1.0\tonly one sentence\n")
    with pytest.raises(ValueError, match=r"bad\.csv:1: expected 7 or 9"):
        converted("stsb_csv", [bad], {}, tmp_path / "stage")


def test_sick_full_release_and_semeval_files(tmp_path):
    full = write(
        tmp_path / "SICK.txt",
        "pair_ID\tsentence_A\tsentence_B\tentailment_label\trelatedness_score\tSemEval_set\n"
        "1\tA dog runs\tA dog is running\tENTAILMENT\t4.5\tTRAIN\n"
        "2\tA cat sleeps\tA man sings\tNEUTRAL\t1.2\tTEST\n",
    )
    # The layout's SICK-R files hold no subset column: SemEval_set is not kept.
    assert converted("sick_semeval", [full], {}, tmp_path / "full") == [
        StsPair("A dog runs", "A dog is running", 4.5, ""),
        StsPair("A cat sleeps", "A man sings", 1.2, ""),
    ]
    semeval = write(
        tmp_path / "SICK_trial.txt",
        "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n3\tx y\tz w\t3.1\tNEUTRAL\n",
    )
    assert converted("sick_semeval", [semeval], {}, tmp_path / "semeval") == [StsPair("x y", "z w", 3.1, "")]


def test_intent_pool_merges_train_and_optional_valid(tmp_path):
    folder = tmp_path / "intent" / "toy"
    write(folder / "train.tsv", "text\tlabel\na\tx\nb\ty\n")
    write(folder / "test.tsv", "text\tlabel\nc\tx\n")
    data = load_intent_dataset(tmp_path, "toy")
    assert data.pool_texts == ["a", "b"] and data.test_labels == ["x"]
    write(folder / "valid.tsv", "text\tlabel\nd\ty\n")
    assert load_intent_dataset(tmp_path, "toy").pool_texts == ["a", "b", "d"]
    write(folder / "test.tsv", "text\tlabel\nc\tz\n")
    with pytest.raises(ValueError, match="labels absent from train/valid"):
        load_intent_dataset(tmp_path, "toy")


@pytest.mark.realdata
@needs_real_data
def test_real_original_formats_match_the_tsv_layout(tmp_path):
    """The raw STS-B csv and SentEval's STS12 folder hold the pairs of the TSV files."""
    raw = converted("stsb_csv", [REAL_DATA / "raw" / "stsbenchmark" / "sts-test.csv"], {}, tmp_path / "stsb")
    tsv = load_sts_tsv(REAL_DATA / "sts" / "stsb" / "test.tsv")
    assert len(raw) == len(tsv) == 1379
    assert [(p.sentence1, p.sentence2, p.score) for p in raw] == [(p.sentence1, p.sentence2, p.score) for p in tsv]
    (sts12,) = load_registry().select(["sts12"])
    folder = REAL_DATA / "raw" / "senteval" / "STS" / "STS12-en-test"
    senteval_pairs = senteval(folder, sts12.options["subsets"], tmp_path / "sts12")
    processed = load_sts_tsv(REAL_DATA / "sts_senteval" / "sts12" / "test.tsv")
    assert len(senteval_pairs) == len(processed) == 3108
    assert sorted(p.score for p in senteval_pairs) == sorted(p.score for p in processed)


@pytest.mark.realdata
@needs_real_data
def test_real_task_sizes():
    assert len(load_sts_task(REAL_DATA, "sickr-full")) == 9927
    texts, labels = load_labelled_texts(REAL_DATA / "clustering" / "tweet.tsv")
    assert len(texts) == 2472 and len(set(labels)) == 89
    banking = load_intent_dataset(REAL_DATA, "banking77")
    assert len(banking.pool_texts) == 10003 and len(np.unique(banking.pool_labels)) == 77

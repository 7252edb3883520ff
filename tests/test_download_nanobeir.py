"""``data download nanobeir``: the shipped registry's 13 NanoBEIR entries fetched through a loopback
HTTP mirror holding stand-in parquet files, converted into BEIR's layout; dropped rows counted,
resume, and the errors of a bad set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.download_helpers import Mirror, beir_parquet_files, sha256
from vascl_scale.cli import app
from vascl_scale.data import download as download_module
from vascl_scale.data.registry import Dataset, load_registry

NANOBEIR = {
    "NanoArguAna": "arguana",
    "NanoClimateFEVER": "climatefever",
    "NanoDBPedia": "dbpedia",
    "NanoFEVER": "fever",
    "NanoFiQA2018": "fiqa2018",
    "NanoHotpotQA": "hotpotqa",
    "NanoMSMARCO": "msmarco",
    "NanoNFCorpus": "nfcorpus",
    "NanoNQ": "nq",
    "NanoQuoraRetrieval": "quoraretrieval",
    "NanoSCIDOCS": "scidocs",
    "NanoSciFact": "scifact",
    "NanoTouche2020": "touche2020",
}
PARQUETS = ("corpus", "queries", "qrels")

# ArguAna's stand-in: an empty and a missing document text and a blank query, each named by a qrels
# pair (dropped with it); a text with a line break, quotes and non-ASCII characters kept as it is.
ARGUANA = beir_parquet_files(
    corpus=[("d1", "First argument."), ("d2", ""), ("d3", None), ("d4", 'Line one\nsaid "no", caf\u00e9')],
    queries=[("q1", "Is it so?"), ("q2", "   "), ("q3", "Why not?")],
    qrels=[("q1", "d1"), ("q1", "d2"), ("q2", "d4"), ("q3", "d4"), ("q3", "d3"), ("q3", "d1")],
)
ARGUANA_BEIR = {
    "corpus.jsonl": '{"_id": "d1", "title": "", "text": "First argument."}\n'
    '{"_id": "d4", "title": "", "text": "Line one\\nsaid \\"no\\", caf\u00e9"}\n',
    "queries.jsonl": '{"_id": "q1", "text": "Is it so?"}\n{"_id": "q3", "text": "Why not?"}\n',
    "qrels/test.tsv": "query-id\tcorpus-id\tscore\nq1\td1\t1\nq3\td4\t1\nq3\td1\t1\n",
}
ARGUANA_REMARK = (
    "2 documents, 2 queries, 3 qrels pairs; dropped for an empty text: 2 documents, 1 query, "
    "and the 3 qrels pairs naming them"
)
# SciFact's stand-in: integer ids, as a parquet file may type them.
SCIFACT = beir_parquet_files(
    corpus=[(4983, "Microstructural development."), (5836, "Induction of myelodysplasia.")],
    queries=[(1, "0-dimensional biomaterials show inductive properties.")],
    qrels=[(1, 5836)],
)
SCIFACT_BEIR = {
    "corpus.jsonl": '{"_id": "4983", "title": "", "text": "Microstructural development."}\n'
    '{"_id": "5836", "title": "", "text": "Induction of myelodysplasia."}\n',
    "queries.jsonl": '{"_id": "1", "text": "0-dimensional biomaterials show inductive properties."}\n',
    "qrels/test.tsv": "query-id\tcorpus-id\tscore\n1\t5836\t1\n",
}


@pytest.fixture(autouse=True)
def short_timeouts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(download_module, "READ_TIMEOUT_S", 10.0)  # a hung loopback fails the test fast


def nanobeir() -> list[Dataset]:
    return load_registry().select(["nanobeir"])


def stand_in(folder: str) -> tuple[bytes, bytes, bytes]:
    """Each set's parquet files: ArguAna's and SciFact's above, a one-pair set for the others."""
    special = {"arguana": ARGUANA, "scifact": SCIFACT}
    return special.get(folder) or beir_parquet_files(
        [("d1", f"A {folder} document.")], [("q1", "A query.")], [("q1", "d1")]
    )


def mirror_files(sets: dict[str, tuple[bytes, bytes, bytes]]) -> dict[str, bytes]:
    """The mirror's files (URL host and path, as ``Mirror.files`` keys them) of these sets by folder name."""
    files = {}
    for dataset in nanobeir():
        folder = Path(next(iter(dataset.outputs))).parent.name
        if folder in sets:
            files.update({f"/{source.mirror_path}": data for source, data in zip(dataset.sources, sets[folder])})
    return files


def download(to: Path, mirror: Mirror, *names: str):
    return CliRunner().invoke(app, ["data", "download", *names, "--to", str(to), "--mirror", mirror.url])


def flat(output: str) -> str:
    return " ".join(output.split())


def test_the_registry_holds_the_13_sets_as_one_group_each_in_beir_layout() -> None:
    datasets = nanobeir()
    assert [d.name for d in datasets] == [f"nanobeir-{folder}" for folder in NANOBEIR.values()]
    for (repo, folder), dataset in zip(NANOBEIR.items(), datasets):
        assert dataset.family == "retrieval" and dataset.group == "nanobeir" and dataset.converter == "beir_parquet"
        assert [source.url for source in dataset.sources] == [
            f"https://huggingface.co/datasets/zeta-alpha-ai/{repo}/resolve/main/{part}/train-00000-of-00001.parquet"
            for part in PARQUETS
        ]
        assert list(dataset.outputs) == [
            f"retrieval/nanobeir/{folder}/{name}" for name in ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv")
        ]
        # Nothing could be fetched here: no digest pinned, and the entry says so as the others do.
        assert not any(dataset.outputs.values()) and not any(source.sha256 for source in dataset.sources)
        assert dataset.checked.startswith("fixtures only: the files could not be fetched here"), dataset.name
    assert load_registry().select(["nanobeir-scifact"]) == [datasets[11]]
    assert load_registry().select(["retrieval"]) == datasets  # the family: NanoBEIR alone so far
    with pytest.raises(ValueError, match=r"unknown dataset 'nano'; .* groups from nanobeir, or all"):
        load_registry().select(["nano"])


def test_data_download_nanobeir_fetches_converts_counts_drops_and_resumes(tmp_path: Path) -> None:
    files = mirror_files({folder: stand_in(folder) for folder in NANOBEIR.values()})
    assert len(files) == 39
    scifact_corpus = (
        "/huggingface.co/datasets/zeta-alpha-ai/NanoSciFact/resolve/main/corpus/train-00000-of-00001.parquet"
    )
    data = tmp_path / "data"
    with Mirror({}) as mirror:
        mirror.files.update(files)
        # One set alone, its first transfer cut: kept as a .part for the next run.
        mirror.cut_after[scifact_corpus] = 10
        first = download(data, mirror, "nanobeir-scifact")
        assert first.exit_code == 1 and "rerun to resume" in flat(first.output), first.output
        assert mirror.requests == [(scifact_corpus, None)]
        # The group: all 13, SciFact's corpus continued from byte 10.
        result = download(data, mirror, "nanobeir")
        text = flat(result.output)
        assert result.exit_code == 0 and "13 converted, 0 present, 0 failed" in text, result.output
        assert (scifact_corpus, "bytes=10-") in mirror.requests and len(mirror.requests) == 1 + 39
        assert ARGUANA_REMARK in text and "1 document, 1 query, 1 qrels pair; no row dropped" in text
        assert f"retrieval/nanobeir/arguana: {ARGUANA_REMARK}" in text  # the log line, beside the summary's row
        assert text.count("dropped for an empty text") == 2  # ArguAna's alone
        qrels_digest = sha256(ARGUANA[2])
        assert f"qrels/train-00000-of-00001.parquet: sha256 {qrels_digest} (not pinned)" in text
        # Present: a second run fetches nothing.
        again = download(data, mirror, "nanobeir")
        assert again.exit_code == 0 and "0 converted, 13 present, 0 failed" in flat(again.output), again.output
        assert len(mirror.requests) == 1 + 39
    for folder, expected in (("arguana", ARGUANA_BEIR), ("scifact", SCIFACT_BEIR)):
        for name, content in expected.items():
            assert (data / "retrieval" / "nanobeir" / folder / name).read_text(encoding="utf-8") == content, name
    for folder in NANOBEIR.values():
        lines = (data / "retrieval" / "nanobeir" / folder / "corpus.jsonl").read_text(encoding="utf-8").splitlines()
        assert all(set(json.loads(line)) == {"_id", "title", "text"} for line in lines)
    assert not list(data.glob(".staging-*"))


@pytest.mark.parametrize(
    "qrels, message",
    [
        (
            [("q1", "d1"), ("q1", "d9")],
            "qrels/train-00000-of-00001.parquet: row 2: corpus-id 'd9' is not in corpus/train-00000-of-00001.parquet",
        ),
        (
            [("q7", "d1")],
            "qrels/train-00000-of-00001.parquet: row 1: query-id 'q7' is not in queries/train-00000-of-00001.parquet",
        ),
    ],
)
def test_a_qrels_id_missing_from_the_set_is_one_error_naming_the_file(
    tmp_path: Path, qrels: list[tuple[str, str]], message: str
) -> None:
    arguana = beir_parquet_files([("d1", "A document.")], [("q1", "A query.")], qrels)
    with Mirror({}) as mirror:
        mirror.files.update(mirror_files({"arguana": arguana}))
        result = download(tmp_path / "data", mirror, "nanobeir-arguana")
        outcome = download_module.download_datasets(
            load_registry().select(["nanobeir-arguana"]), tmp_path / "api", mirror=mirror.url, show_progress=False
        )[0]
    text = flat(result.output)
    assert result.exit_code == 1 and "0 converted, 0 present, 1 failed" in text, result.output
    assert message in text and "Traceback" not in text, result.output  # the summary's row
    logged = [line for line in result.output.splitlines() if "INFO nanobeir-arguana: failed" in line]
    assert len(logged) == 1 and message in logged[0], result.output
    assert outcome.status == "failed" and "\n" not in outcome.reason and message in outcome.reason
    assert outcome.reason.startswith(
        "conversion: converting corpus/train-00000-of-00001.parquet, queries/train-00000-of-00001.parquet, "
        "qrels/train-00000-of-00001.parquet: "
    )
    assert not (tmp_path / "data" / "retrieval").exists()


@pytest.mark.parametrize(
    "corpus, message",
    [
        (b"<html>Service unavailable</html>\n", "corpus/train-00000-of-00001.parquet cannot be read as parquet"),
        (
            beir_parquet_files([], [], [])[2],  # the qrels file where the corpus should be
            "corpus/train-00000-of-00001.parquet has the columns query-id, corpus-id; expected _id, text",
        ),
    ],
)
def test_an_original_that_is_no_such_parquet_fails_its_set_and_is_deleted(
    tmp_path: Path, corpus: bytes, message: str
) -> None:
    _, queries, qrels = stand_in("nq")
    with Mirror({}) as mirror:
        mirror.files.update(mirror_files({"nq": (corpus, queries, qrels), "fever": stand_in("fever")}))
        result = download(tmp_path / "data", mirror, "nanobeir-nq", "nanobeir-fever")
    text = flat(result.output)
    assert result.exit_code == 1 and "1 converted, 0 present, 1 failed" in text, result.output
    assert message in text and "deleted" in text and "Traceback" not in text, result.output
    downloads = tmp_path / "data" / ".downloads"
    assert not [path for path in downloads.rglob("*.parquet") if "NanoNQ" in path.parts]  # fetched afresh next time
    assert len(list(downloads.rglob("*.parquet"))) == 3  # FEVER's


def test_ids_with_a_line_break_tab_or_quote_give_files_the_retrieval_reader_loads(tmp_path: Path) -> None:
    from vascl_scale.eval.retrieval import load_qrels, load_retrieval_data

    arguana = beir_parquet_files(
        corpus=[("d\n1", "First."), ('d"2', "Second."), ("d\t3", "Third.")],
        queries=[("q\r\n1", "A query?"), ("q2", "Another?")],
        qrels=[("q\r\n1", "d\n1"), ("q2", 'd"2'), ("q2", "d\t3")],
    )
    with Mirror({}) as mirror:
        mirror.files.update(mirror_files({"arguana": arguana}))
        result = download(tmp_path / "data", mirror, "nanobeir-arguana")
    text = flat(result.output)
    assert result.exit_code == 0 and "1 converted, 0 present, 0 failed" in text, result.output
    assert (
        "retrieval/nanobeir/arguana: 3 documents, 2 queries, 3 qrels pairs; no row dropped; 2 ids held a line "
        "break, written with a space ('d 1', 'q 1'): a qrels row is one line"
    ) in text
    folder = tmp_path / "data" / "retrieval" / "nanobeir" / "arguana"
    data = load_retrieval_data(folder)  # the reader eval retrieval uses: no "stray quote"
    assert data.document_ids == ["d 1", 'd"2', "d\t3"] and data.query_ids == ["q 1", "q2"]
    assert {query: list(judged) for query, judged in load_qrels(folder / "qrels" / "test.tsv").items()} == {
        "q 1": ["d 1"],
        "q2": ['d"2', "d\t3"],
    }


@pytest.mark.parametrize(
    "arguana, message",
    [
        (  # two ids that are one once the line break is a space
            beir_parquet_files([("a b", "x"), ("a\nb", "y")], [("q1", "Q?")], [("q1", "a b")]),
            "corpus/train-00000-of-00001.parquet: rows 1 and 2 have the _ids 'a b' and 'a\\nb', both 'a b' once "
            "line breaks are spaces; document ids must be unique",
        ),
        (  # a list-typed text column: its Python repr is no text
            beir_parquet_files([("d1", ["First", "part"])], [("q1", "Q?")], [("q1", "d1")]),
            "corpus/train-00000-of-00001.parquet: row 1: text ['First', 'part'] is a list, not a string; the "
            "document texts must be strings",
        ),
        (
            beir_parquet_files([("d1", "x")], [(["q1"], "Q?")], [("q1", "d1")]),
            "queries/train-00000-of-00001.parquet: row 1: _id ['q1'] is a list; ids are strings or integers",
        ),
        (  # empty conversions: nothing to evaluate
            beir_parquet_files([("d1", ""), ("d2", " ")], [("q1", "Q?")], [("q1", "d1")]),
            "retrieval/nanobeir/arguana: nothing to evaluate: 0 documents, 1 query, 0 qrels pairs; dropped for an "
            "empty text: 2 documents, 0 queries, and the 1 qrels pair naming them; a retrieval set needs at least "
            "one document, query and qrels pair",
        ),
        (
            beir_parquet_files([("d1", "x")], [("q1", "Q?")], []),
            "retrieval/nanobeir/arguana: nothing to evaluate: 1 document, 1 query, 0 qrels pairs; no row dropped",
        ),
        (
            beir_parquet_files([], [], []),
            "retrieval/nanobeir/arguana: nothing to evaluate: 0 documents, 0 queries, 0 qrels pairs",
        ),
    ],
    ids=["ids-one-once-spaced", "list-text", "list-id", "all-texts-empty", "no-qrels", "all-empty"],
)
def test_a_set_the_reader_would_refuse_or_misread_fails_naming_it(
    tmp_path: Path, arguana: tuple[bytes, bytes, bytes], message: str
) -> None:
    with Mirror({}) as mirror:
        mirror.files.update(mirror_files({"arguana": arguana}))
        result = download(tmp_path / "data", mirror, "nanobeir-arguana")
    text = flat(result.output)
    assert result.exit_code == 1 and "0 converted, 0 present, 1 failed" in text, result.output
    logged = [line for line in result.output.splitlines() if "INFO nanobeir-arguana: failed" in line]
    assert len(logged) == 1 and message in logged[0] and "Traceback" not in text, result.output
    assert not (tmp_path / "data" / "retrieval").exists()

"""Retrieval evaluation (``vascl_scale.eval.retrieval``, ``eval retrieval``): the metrics against
hand-computed values, pytrec_eval and a loop-by-loop reference; the chunked search against one
matrix product (torch and faiss, ties to the earlier document); BEIR loading and every refused
input; prompts by role; ``--truncate-dim``; the CLI end to end and ``eval all``; the dev score."""

from __future__ import annotations

import json
import math
import zlib
from pathlib import Path

import numpy as np
import pytest

from tests.data_helpers import captured_warnings
from tests.eval_helpers import WORDS, invoke, make_data, save_tiny_bert
from tests.test_model_card import facts_of, model_record, result, split_card
from vascl_scale.encode import (
    EmbeddingStats,
    ModelSpec,
    TextEmbeddings,
    check_truncate_dim,
    resolve_model,
    truncate_embeddings,
)
from vascl_scale.eval import retrieval
from vascl_scale.eval.retrieval import (
    NO_DOCUMENT,
    Qrels,
    RetrievalEvaluator,
    dataset_name,
    drop_identical_ids,
    load_retrieval_data,
    per_query_metrics,
    retrieval_datasets,
    retrieval_dev_score,
    retrieval_scores,
)
from vascl_scale.eval.runner import build_evaluators, evaluate_model
from vascl_scale.eval.sts import STSEvaluator, StsPair
from vascl_scale.model import SentenceEncoder
from vascl_scale.model_card import attach_evaluation, write_model_card
from vascl_scale.search import top_k_search


def write_beir(root: Path, corpus: list[dict], queries: list[dict], qrels: list[tuple], split: str = "test") -> Path:
    """A BEIR directory: corpus.jsonl, queries.jsonl and qrels/<split>.tsv from Python values."""
    (root / "qrels").mkdir(parents=True, exist_ok=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in corpus), encoding="utf-8")
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries), encoding="utf-8")
    rows = "".join(f"{q}\t{d}\t{s}\n" for q, d, s in qrels)
    (root / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n" + rows, encoding="utf-8")
    return root


def toy_beir(root: Path) -> Path:
    """24 documents on three topics, 6 scored queries (two relevant documents each, graded 2 and
    1), one query graded 0 only (skipped) and one absent from the qrels (skipped)."""
    rng = np.random.default_rng(0)
    corpus = [
        {"_id": f"d{i}", "title": WORDS[4 * (i % 3)] if i % 2 else "", "text": " ".join(rng.choice(WORDS, size=6))}
        for i in range(24)
    ]
    queries = [
        {"_id": f"q{i}", "text": " ".join(rng.choice(WORDS[4 * (i % 3) : 4 * (i % 3) + 4], 3))} for i in range(8)
    ]
    qrels = [(f"q{i}", f"d{(5 * i) % 24}", 2) for i in range(6)] + [
        (f"q{i}", f"d{(5 * i + 7) % 24}", 1) for i in range(6)
    ]
    qrels.append(("q6", "d3", 0))
    return write_beir(root, corpus, queries, qrels)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return save_tiny_bert(tmp_path_factory.mktemp("model") / "tiny")


# --- metrics ---


def test_metrics_known_answer_on_a_tiny_corpus():
    # 120 documents; each row is a query's ranking (the first 101 of it), best first.
    ranked = np.tile(np.arange(101), (4, 1))
    ranked[1, :6] = [4, 0, 1, 3, 5, 2]  # query B: 5 at rank 5, 2 at rank 6
    qrels = Qrels.from_grades(
        [
            {1: 2, 3: 1},  # A: grade 2 at rank 2, grade 1 at rank 4
            {5: 1, 2: 3, 0: 0},  # B: grade 0 means not relevant
            {2: 1, 100: 1},  # C: rank 3, and rank 101 (past every cut-off)
            {10: 1},  # D: rank 11 (past 10)
        ]
    )
    metrics = per_query_metrics(ranked, qrels)
    # nDCG@10 = DCG@10 / ideal DCG@10, gain = grade, discount log2(rank + 1):
    # A: (2/log2(3) + 1/log2(5)) / (2/log2(2) + 1/log2(3)) = (1.261860 + 0.430677) / 2.630930 = 0.643322
    # B: (1/log2(6) + 3/log2(7)) / (3/log2(2) + 1/log2(3)) = (0.386853 + 1.068622) / 3.630930 = 0.400854
    # C: (1/log2(4)) / (1/log2(2) + 1/log2(3)) = 0.5 / 1.630930 = 0.306574
    # D: nothing relevant in the top 10: 0
    np.testing.assert_allclose(metrics["ndcg_at_10"], [0.643322, 0.400854, 0.306574, 0.0], atol=1e-6)
    # MRR@10: 1 / rank of the first relevant: 1/2, 1/5, 1/3, none in the top 10
    np.testing.assert_allclose(metrics["mrr_at_10"], [0.5, 0.2, 1 / 3, 0.0])
    # Recall@100: relevant in the top 100 / all relevant: 2/2, 2/2, 1/2, 1/1
    np.testing.assert_allclose(metrics["recall_at_100"], [1.0, 1.0, 0.5, 1.0])
    # means x 100: (0.643322 + 0.400854 + 0.306574 + 0) / 4 = 0.337688; (0.5 + 0.2 + 0.333333 + 0) / 4; 3.5 / 4
    assert retrieval_scores(ranked, qrels) == pytest.approx(
        {"ndcg_at_10": 33.768762, "mrr_at_10": 25.833333, "recall_at_100": 87.5}, abs=1e-5
    )


def test_drop_identical_ids_removes_each_querys_own_document_and_moves_the_rest_up():
    documents = ["a", "b", "c", "d", "e"]
    rows = np.array([[0, 1, 2, 3], [2, 0, 1, 4], [4, 3, 2, 1]])  # (3, 4): a search 3 + 1 deep
    kept, dropped = drop_identical_ids(rows, ["b", "x", "e"], documents, depth=3)
    # "b" drops row 1 and row 2 moves up; "x" is no document: its first 3; "e" drops its first
    assert kept.tolist() == [[0, 2, 3], [2, 0, 1], [3, 2, 1]] and dropped == 2
    # a corpus shorter than depth + 1: the place its own document leaves stays empty
    kept, dropped = drop_identical_ids(rows[:, :3], ["b", "x", "e"], documents, depth=3)
    assert kept.tolist() == [[0, 2, NO_DOCUMENT], [2, 0, 1], [3, 2, NO_DOCUMENT]] and dropped == 2


def test_an_empty_place_of_a_ranking_scores_as_no_document():
    qrels = Qrels.from_grades([{0: 1, 3: 2}, {2: 1}])
    rows = np.array([[NO_DOCUMENT, 0, 3], [1, NO_DOCUMENT, NO_DOCUMENT]])
    assert qrels.gains(rows).tolist() == [[0, 1, 2], [0, 0, 0]]
    metrics = per_query_metrics(rows, qrels)
    np.testing.assert_allclose(metrics["mrr_at_10"], [0.5, 0.0])
    np.testing.assert_allclose(metrics["recall_at_100"], [1.0, 0.0])


def test_ignore_identical_ids_takes_a_query_found_in_the_corpus_out_of_its_ranking(tiny_model, tmp_path):
    # ArguAna's shape: each query is also a document, under the same id, and finds itself first.
    rng = np.random.default_rng(1)
    texts = [" ".join(rng.choice(WORDS, size=5)) for _ in range(12)]
    corpus = [{"_id": f"t{i}", "text": text} for i, text in enumerate(texts)]
    queries = [{"_id": f"t{i}", "text": texts[i]} for i in range(4)]
    data = write_beir(tmp_path / "argu", corpus, queries, [(f"t{i}", f"t{i + 4}", 1) for i in range(4)])
    # float32: the scores are compared with the float32 library's (auto is bf16 on a native-bf16 CPU)
    common = ("retrieval", "--model", str(tiny_model), "--data", str(data), "--no-cache", "--precision", "no")
    plain = invoke(*common, "--output", str(tmp_path / "plain.json"))
    ignored = invoke(*common, "--ignore-identical-ids", "--output", str(tmp_path / "ignored.json"))
    assert plain.exit_code == 0 and ignored.exit_code == 0, plain.output + ignored.output
    [with_self] = json.loads((tmp_path / "plain.json").read_text())["models"][0]["results"]
    [without] = json.loads((tmp_path / "ignored.json").read_text())["models"][0]["results"]
    assert with_self["details"]["ignore_identical_ids"] is False and with_self["details"]["identical_ids_dropped"] == 0
    assert without["details"]["ignore_identical_ids"] is True and without["details"]["identical_ids_dropped"] == 4
    # the library, by hand: each query's ranking without itself, scored
    encoder = SentenceEncoder.from_pretrained(tiny_model)
    loaded = load_retrieval_data(data)
    queries_embedded = retrieval.unit_rows(encoder.encode(loaded.queries))
    documents_embedded = retrieval.unit_rows(encoder.encode(loaded.documents))
    _, rows = top_k_search(queries_embedded, documents_embedded, 12, "torch")
    own = [[row for row in ranking if row != q][:100] for q, ranking in enumerate(rows.tolist())]
    expected = retrieval_scores(np.array(own), loaded.qrels)["ndcg_at_10"]
    assert without["primary"] == pytest.approx(expected, abs=1e-4)
    assert with_self["primary"] < without["primary"]  # finding itself first pushes the answer down
    refused = invoke("sts", "--model", str(tiny_model), "--data-dir", str(tmp_path), "--ignore-identical-ids")
    assert refused.exit_code == 2 and "--ignore-identical-ids only applies to retrieval" in refused.output


def reference_metrics(ranking: list[int], grades: dict[int, int]) -> tuple[float, float, float]:
    """nDCG@10, MRR@10 and Recall@100 of one ranking, written out loop by loop."""
    dcg = 0.0
    for rank, doc in enumerate(ranking[:10], start=1):
        if grades.get(doc, 0) > 0:
            dcg += grades[doc] / math.log2(rank + 1)
    ideal = sorted((grade for grade in grades.values() if grade > 0), reverse=True)[:10]
    ideal_dcg = sum(grade / math.log2(rank + 1) for rank, grade in enumerate(ideal, start=1))
    reciprocal = 0.0
    for rank, doc in enumerate(ranking[:10], start=1):
        if grades.get(doc, 0) > 0:
            reciprocal = 1.0 / rank
            break
    relevant = {doc for doc, grade in grades.items() if grade > 0}
    found = sum(1 for doc in ranking[:100] if doc in relevant)
    return dcg / ideal_dcg, reciprocal, found / len(relevant)


def random_task(seed: int, queries: int = 40, documents: int = 300, grades=(-1, 0, 1, 2, 3)):
    """Random unit embeddings (distinct scores) and qrels with at least one grade > 0 per query."""
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(queries, 16)).astype(np.float32)
    d = rng.normal(size=(documents, 16)).astype(np.float32)
    judged = []
    for _ in range(queries):
        docs = rng.choice(documents, size=int(rng.integers(1, 15)), replace=False)
        grade = {int(doc): int(rng.choice(grades)) for doc in docs}
        grade[int(docs[0])] = int(rng.integers(1, 4))
        judged.append(grade)
    return retrieval.unit_rows(q), retrieval.unit_rows(d), judged


def test_metrics_equal_a_loop_by_loop_reference_on_random_data():
    queries, documents, judged = random_task(1)
    _, rows = top_k_search(queries, documents, 100, search="torch", chunk_size=64)
    full = np.argsort(-(queries.astype(np.float64) @ documents.T.astype(np.float64)), axis=1, kind="stable")
    metrics = per_query_metrics(rows, Qrels.from_grades(judged))
    for i, grades in enumerate(judged):
        expected = reference_metrics(full[i].tolist(), grades)
        got = (metrics["ndcg_at_10"][i], metrics["mrr_at_10"][i], metrics["recall_at_100"][i])
        assert got == pytest.approx(expected, abs=1e-9), i


def test_metrics_equal_pytrec_eval():
    pytrec_eval = pytest.importorskip("pytrec_eval")
    queries, documents, judged = random_task(2, grades=(0, 1, 2, 3))
    scores, rows = top_k_search(queries, documents, 100, search="torch", chunk_size=50)
    qrels = {f"q{i}": {f"d{doc}": grade for doc, grade in grades.items()} for i, grades in enumerate(judged)}

    def run(depth: int) -> dict:
        return {
            f"q{i}": {f"d{doc}": float(score) for doc, score in zip(rows[i, :depth], scores[i, :depth])}
            for i in range(len(rows))
        }

    # MRR@10 is trec_eval's reciprocal rank of the run cut at 10
    deep = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.100"}).evaluate(run(100))
    shallow = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(run(10))
    ours = retrieval_scores(rows, Qrels.from_grades(judged))
    assert ours["ndcg_at_10"] == pytest.approx(100 * np.mean([m["ndcg_cut_10"] for m in deep.values()]), abs=1e-9)
    assert ours["recall_at_100"] == pytest.approx(100 * np.mean([m["recall_100"] for m in deep.values()]), abs=1e-9)
    assert ours["mrr_at_10"] == pytest.approx(100 * np.mean([m["recip_rank"] for m in shallow.values()]), abs=1e-9)


def test_qrels_refuse_a_query_without_a_relevant_document():
    with pytest.raises(ValueError, match="query 1 has no relevant document"):
        Qrels.from_grades([{0: 1}, {2: 0}])


# --- data ---


def test_beir_directory_loads_titles_skipped_queries_and_the_dev_split(tmp_path):
    corpus = [
        {"_id": "d1", "title": "Rivers", "text": "a river bank"},
        {"_id": "d2", "title": "", "text": " plain text "},
        {"_id": 3, "text": "no title key"},
    ]
    queries = [{"_id": "q1", "text": "river"}, {"_id": "q2", "text": "nothing"}, {"_id": "q3", "text": "other"}]
    root = write_beir(
        tmp_path / "retrieval" / "group" / "toy", corpus, queries, [("q1", "d1", 2), ("q1", "3", 1), ("q2", "d2", 0)]
    )
    write_beir(root, corpus, queries, [("q3", "d2", 1)], split="dev")
    data = load_retrieval_data(root)
    assert data.documents == ["Rivers a river bank", "plain text", "no title key"]
    assert data.document_ids == ["d1", "d2", "3"] and data.query_ids == ["q1"] and data.queries == ["river"]
    assert data.skipped == {"no_relevant_in_qrels": 1, "not_in_qrels": 1}
    assert data.name == "group-toy" and dataset_name(tmp_path / "elsewhere") == "elsewhere"
    assert data.qrels.gains(np.array([[2, 0, 1]])).tolist() == [[1, 2, 0]]
    dev = load_retrieval_data(root, "dev")
    assert dev.query_ids == ["q3"] and dev.skipped == {"no_relevant_in_qrels": 0, "not_in_qrels": 2}
    assert retrieval_datasets(tmp_path) == [root]


def _valid():
    corpus = [{"_id": "d1", "text": "a"}, {"_id": "d2", "text": "b"}]
    return corpus, [{"_id": "q1", "text": "x"}, {"_id": "q2", "text": "y"}], [("q1", "d1", 1)]


def _bad(case: str, root: Path) -> tuple[Path, str]:
    """Write dataset ``case`` with one fault; returns (the file the error must name, a phrase of it)."""
    corpus, queries, qrels = _valid()
    qrels_file = root / "qrels" / "test.tsv"
    if case == "unknown corpus id":
        write_beir(root, corpus, queries, qrels + [("q1", "d9", 1), ("q2", "d8", 2)])
        return qrels_file, "2 corpus ids are not in corpus.jsonl: 'd9' (line 3), 'd8' (line 4); remove those rows"
    if case == "unknown query id":
        write_beir(root, corpus, queries, qrels + [(f"q{i}", "d1", 1) for i in range(5, 10)])
        return qrels_file, "5 query ids are not in queries.jsonl: 'q5' (line 3), 'q6' (line 4), 'q7' (line 5), ...;"
    if case == "empty queries":
        write_beir(root, corpus, [], qrels)
        return root / "queries.jsonl", "holds no queries"
    if case == "empty corpus":
        write_beir(root, [], queries, qrels)
        return root / "corpus.jsonl", "holds no documents"
    if case == "malformed corpus line":
        write_beir(root, corpus, queries, qrels)
        (root / "corpus.jsonl").write_text('{"_id": "d1", "text": "a"}\n{"_id": "d2", "text": \n', encoding="utf-8")
        return root / "corpus.jsonl", ":2: not valid JSON"
    if case == "malformed qrels line":
        write_beir(root, corpus, queries, qrels)
        qrels_file.write_text("query-id\tcorpus-id\tscore\nq1\td1\n", encoding="utf-8")
        return qrels_file, ":2: malformed row with 2 fields, expected 3"
    if case == "score not an integer":
        write_beir(root, corpus, queries, [("q1", "d1", "high")])
        return qrels_file, ":2: score 'high' is not a whole number"
    if case == "duplicate document id":
        write_beir(root, corpus + [{"_id": "d1", "text": "again"}], queries, qrels)
        return root / "corpus.jsonl", ":3: duplicate _id 'd1' (first on line 1)"
    if case == "duplicate query id":
        write_beir(root, corpus, queries + [{"_id": "q2", "text": "z"}], qrels)
        return root / "queries.jsonl", ":3: duplicate _id 'q2' (first on line 2)"
    if case == "no _id":
        write_beir(root, corpus + [{"id": "d3", "text": "c"}], queries, qrels)
        return root / "corpus.jsonl", ':3: no "_id"'
    if case == "empty document":
        write_beir(root, corpus + [{"_id": "d3", "title": " ", "text": ""}], queries, qrels)
        return root / "corpus.jsonl", ":3: document 'd3' has neither title nor text"
    if case == "conflicting grades":
        write_beir(root, corpus, queries, qrels + [("q1", "d1", 2)])
        return qrels_file, ":3: query 'q1' and document 'd1' are graded 2 here and 1 on line 2"
    if case == "no relevant document at all":
        write_beir(root, corpus, queries, [("q1", "d1", 0)])
        return qrels_file, "no query has a relevant document"
    assert case == "missing qrels"
    write_beir(root, corpus, queries, qrels, split="dev")
    return qrels_file, "not found; a retrieval dataset is a BEIR directory"


BAD_CASES = [
    "unknown corpus id",
    "unknown query id",
    "empty queries",
    "empty corpus",
    "malformed corpus line",
    "malformed qrels line",
    "score not an integer",
    "duplicate document id",
    "duplicate query id",
    "no _id",
    "empty document",
    "conflicting grades",
    "no relevant document at all",
    "missing qrels",
]


@pytest.mark.parametrize("case", BAD_CASES)
def test_each_bad_input_gives_one_line_naming_the_file(case, tmp_path):
    path, phrase = _bad(case, tmp_path / "toy")
    with pytest.raises(ValueError) as caught:
        load_retrieval_data(tmp_path / "toy")
    message = str(caught.value)
    assert "\n" not in message and str(path) in message and phrase in message, message


def test_a_bad_input_stops_the_cli_with_that_line(tiny_model, tmp_path):
    path, phrase = _bad("unknown corpus id", tmp_path / "toy")
    result = invoke("retrieval", "--model", str(tiny_model), "--data", str(tmp_path / "toy"), "--no-cache")
    assert result.exit_code == 2
    assert "error: " in result.output and phrase in " ".join(result.output.split())


# --- truncation and prompts ---


def test_truncate_embeddings_and_its_check(tiny_model):
    matrix = np.array([[3.0, 4.0, 12.0], [0.0, 0.0, 1.0]], np.float32)
    np.testing.assert_array_equal(truncate_embeddings(matrix, 2, normalize=False), [[3.0, 4.0], [0.0, 0.0]])
    np.testing.assert_allclose(truncate_embeddings(matrix, 2, normalize=True), [[0.6, 0.8], [0.0, 0.0]])
    assert truncate_embeddings(matrix, None, normalize=True) is matrix
    spec = resolve_model(tiny_model)
    assert check_truncate_dim(spec, 32) == 32 and check_truncate_dim(spec, None) is None
    with pytest.raises(ValueError, match=r"--truncate-dim 33: .* gives 32-dimensional embeddings; choose 1 to 32"):
        check_truncate_dim(spec, 33)


class RecordingEmbedder:
    """An Embedder's interface over hashed random vectors: records each (prompt, texts) pass."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec, self.stats, self.truncate_dim, self.calls = spec, EmbeddingStats(), None, []

    def embed(self, texts, prompt: str = "") -> TextEmbeddings:
        distinct = sorted(set(texts))
        self.calls.append((prompt, set(distinct)))
        rows = [np.random.default_rng(zlib.crc32((prompt + t).encode())).normal(size=4) for t in distinct]
        return TextEmbeddings(distinct, np.array(rows, dtype=np.float32))


def test_queries_and_documents_get_the_models_query_and_document_prompts(tmp_path):
    data = load_retrieval_data(toy_beir(tmp_path / "toy"))
    pairs = [StsPair("a river", "a bank", 1.0), StsPair("music", "a song", 3.0), StsPair("rain", "a storm", 2.0)]
    spec = ModelSpec("m", tmp_path, prompts={"query": "query: ", "document": "passage: "})
    embedder = RecordingEmbedder(spec)
    report = evaluate_model(embedder, [STSEvaluator({"stsb": pairs}), RetrievalEvaluator({"toy": data})], "query")
    by_prompt = dict(embedder.calls)
    assert set(by_prompt) == {"query: ", "passage: "}  # --prompt query: STS shares the queries' pass
    assert by_prompt["passage: "] == set(data.documents)
    assert by_prompt["query: "] == set(data.queries) | {t for p in pairs for t in (p.sentence1, p.sentence2)}
    assert [r.family for r in report.results] == ["sts", "retrieval"]
    # the same scores as the evaluator given the two prompted encoders itself
    [direct] = RetrievalEvaluator({"toy": data}).evaluate(
        lambda texts: embedder.embed(texts, "query: ")(texts), lambda texts: embedder.embed(texts, "passage: ")(texts)
    )
    assert report.results[1].details == direct.details
    # no prompts: one pass for everything
    plain = RecordingEmbedder(ModelSpec("m", tmp_path))
    evaluate_model(plain, [RetrievalEvaluator({"toy": data})])
    assert [prompt for prompt, _ in plain.calls] == [""]


# --- the command line ---


def test_eval_retrieval_end_to_end_equals_the_library(tiny_model, tmp_path):
    data = toy_beir(tmp_path / "toy")
    output = tmp_path / "r.json"
    # float32: the scores are compared with the float32 library's (auto is bf16 on a native-bf16 CPU)
    common = ["--model", str(tiny_model), "--data", str(data), "--no-cache", "--precision", "no"]
    result = invoke("retrieval", *common, "--output", str(output))
    assert result.exit_code == 0, result.output
    assert "Retrieval (BEIR format): nDCG@10 x 100" in " ".join(result.output.split())
    report = json.loads(output.read_text())
    [task] = report["models"][0]["results"]
    assert (task["family"], task["task"], task["metric"], task["status"]) == ("retrieval", "toy", "ndcg_at_10", "ok")
    details = task["details"]
    assert {"ndcg_at_10", "mrr_at_10", "recall_at_100"} <= set(details)
    assert all(0 <= details[key] <= 100 for key in ("ndcg_at_10", "mrr_at_10", "recall_at_100"))
    assert task["primary"] == details["ndcg_at_10"]
    assert details["recall_at_100"] == 100.0  # 24 documents: every one is retrieved
    assert (details["queries"], details["documents"], details["split"]) == (6, 24, "test")
    assert details["skipped_queries"] == {"no_relevant_in_qrels": 1, "not_in_qrels": 1}
    assert report["data_dir"] == str(data) and "truncate_dim" not in report["models"][0]["model"]
    assert "| Model | toy | Avg. |" in (tmp_path / "r.md").read_text()
    # embedding apart from scoring: the library's evaluator on the encoder's own embeddings
    encoder = SentenceEncoder.from_pretrained(tiny_model)
    [direct] = RetrievalEvaluator({"toy": load_retrieval_data(data)}).evaluate(lambda texts: encoder.encode(texts))
    assert direct.primary == pytest.approx(task["primary"], abs=1e-4)

    truncated = invoke("retrieval", *common, "--truncate-dim", "8", "--output", str(tmp_path / "t.json"))
    assert truncated.exit_code == 0, truncated.output
    model = json.loads((tmp_path / "t.json").read_text())["models"][0]
    assert model["model"]["truncate_dim"] == 8 and model["results"][0]["details"]["dimensions"] == 8
    [cut] = RetrievalEvaluator({"toy": load_retrieval_data(data)}, truncate_dim=8).evaluate(encoder.encode)
    assert cut.primary == pytest.approx(model["results"][0]["primary"], abs=1e-4)
    assert "@8d" in (tmp_path / "t.md").read_text()

    too_wide = invoke("retrieval", "--model", str(tiny_model), "--data", str(data), "--truncate-dim", "64")
    assert too_wide.exit_code == 2
    assert "--truncate-dim 64:" in too_wide.output and "gives 32-dimensional embeddings" in too_wide.output


def test_truncate_dim_applies_to_the_other_families(tiny_model, tmp_path):
    data_dir = make_data(tmp_path / "data")
    common = ["--model", str(tiny_model), "--data-dir", str(data_dir), "--no-cache", "--task", "stsb"]
    full = invoke("sts", *common, "--output", str(tmp_path / "full.json"))
    cut = invoke("sts", *common, "--truncate-dim", "4", "--output", str(tmp_path / "cut.json"))
    assert full.exit_code == 0 and cut.exit_code == 0, cut.output
    full_model, cut_model = (json.loads((tmp_path / f"{n}.json").read_text())["models"][0] for n in ("full", "cut"))
    assert cut_model["model"]["truncate_dim"] == 4 and "truncate_dim" not in full_model["model"]
    assert cut_model["results"][0]["primary"] != full_model["results"][0]["primary"]
    refused = invoke("sts", *common, "--truncate-dim", "33")
    assert refused.exit_code == 2 and "gives 32-dimensional embeddings; choose 1 to 32" in refused.output
    wrong = invoke("sts", *common, "--split", "dev")
    assert wrong.exit_code == 2 and "--split only applies to retrieval" in wrong.output


def test_eval_all_scores_the_retrieval_datasets_it_finds_and_skips_an_absent_folder(tiny_model, tmp_path, caplog):
    data_dir = make_data(tmp_path / "data")
    with captured_warnings(caplog):
        evaluators = build_evaluators(data_dir, ["retrieval"], missing_ok=True)
    assert evaluators[0].datasets == {} and "skipping retrieval: retrieval folder" in caplog.text
    alone = invoke("retrieval", "--model", str(tiny_model), "--data-dir", str(data_dir))
    assert alone.exit_code == 2 and "retrieval folder" in alone.output and "not found" in alone.output

    toy_beir(data_dir / "retrieval" / "nanobeir" / "toy")
    (data_dir / "retrieval" / "empty").mkdir()
    output = tmp_path / "all.json"
    common = ["--model", str(tiny_model), "--data-dir", str(data_dir), "--no-cache"]
    result = invoke(
        "all", *common, "--task", "stsb", "--task", "nanobeir-toy", "--task", "empty", "--output", str(output)
    )
    assert result.exit_code == 0, result.output
    results = {(r["family"], r["task"]): r for r in json.loads(output.read_text())["models"][0]["results"]}
    assert set(results) == {("sts", "stsb"), ("retrieval", "empty"), ("retrieval", "nanobeir-toy")}
    assert results["retrieval", "nanobeir-toy"]["status"] == "ok"
    assert results["retrieval", "empty"]["status"] == "missing"
    assert "corpus.jsonl not found" in results["retrieval", "empty"]["details"]["error"]
    unknown = invoke("all", *common, "--task", "nope")
    assert unknown.exit_code == 2 and "nanobeir-toy" in unknown.output  # the choices name the datasets found


def test_retrieval_results_go_into_the_model_card(tmp_path):
    write_model_card(tmp_path, facts_of())
    record = model_record(result("retrieval", "nanobeir-scifact", 65.25, queries=50, documents=2919))
    assert attach_evaluation(tmp_path, "retrieval", record, "2026-01-02T00:00:00+00:00")
    meta, body = split_card((tmp_path / "README.md").read_text())
    [entry] = meta["model-index"][0]["results"]
    assert entry["task"]["type"] == "retrieval" and entry["metrics"][0] == {
        "type": "ndcg_at_10",
        "value": 65.25,
        "name": "nDCG@10 x 100, exact cosine search",
    }
    assert "| retrieval / nanobeir-scifact | 65.25 | 50 queries, 2919 documents |" in body


# --- the training loop's dev score ---


def test_retrieval_dev_score_reads_the_data_once_and_uses_the_prompts(tmp_path, monkeypatch):
    corpus = [{"_id": f"d{i}", "text": f"doc {i}"} for i in range(12)]
    queries = [{"_id": f"q{i}", "text": f"query {i}"} for i in range(4)]
    root = write_beir(tmp_path / "dev", corpus, queries, [(f"q{i}", f"d{3 * i}", 1) for i in range(4)], split="dev")
    # one direction per document; query i points at document 3i, and only when both prompts are there
    table = {f"p: doc {i}": np.eye(12)[i] for i in range(12)} | {f"q: query {i}": np.eye(12)[3 * i] for i in range(4)}

    def encode(texts):
        return np.array([table[text] for text in texts], dtype=np.float32)

    reads = []
    monkeypatch.setattr(retrieval, "load_retrieval_data", lambda *a: reads.append(a) or load_retrieval_data(*a))
    retrieval._CACHE.clear()
    prompts = {"query": "q: ", "document": "p: "}
    assert retrieval_dev_score(encode, root, split="dev", prompts=prompts) == pytest.approx(100.0)
    assert retrieval_dev_score(encode, root, split="dev", prompts=prompts, truncate_dim=6) < 100.0
    assert len(reads) == 1  # the second call found the dataset in the cache
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries[:3]), encoding="utf-8")
    with pytest.raises(ValueError, match="query id is not in queries.jsonl"):  # a changed file is read again
        retrieval_dev_score(encode, root, split="dev", prompts=prompts)
    assert len(reads) == 2

"""``vascl-scale eval`` end to end through the real CLI, on a tiny random BERT and tiny files;
model resolution (run, Hugging Face and sentence-transformers directories) and the cache."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.eval_helpers import PACKAGED, WORDS, invoke, make_data, save_tiny_bert, write_tsv
from vascl_scale.encode import Embedder, model_fingerprint, resolve_model
from vascl_scale.eval.report import EvalReport, ModelReport
from vascl_scale.eval.results import TaskResult
from vascl_scale.model import SentenceEncoder

REPO = Path(__file__).resolve().parents[1]
REAL_DATA = Path(os.environ.get("VASCL_DATA") or REPO.parent / "shared" / "data")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return save_tiny_bert(tmp_path_factory.mktemp("model") / "tiny")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return make_data(tmp_path_factory.mktemp("data"))


def test_eval_all_end_to_end_then_from_cache(tiny_model, data_dir, tmp_path):
    common = ["--model", str(tiny_model), "--data-dir", str(data_dir), "--cache-dir", str(tmp_path / "cache")]
    first = invoke("all", *common, "--output", str(tmp_path / "a.json"))
    assert first.exit_code == 0, first.output
    for title in ("STS", "Short text clustering", "Few-shot intent"):
        assert title in first.output
    report = json.loads((tmp_path / "a.json").read_text())
    results = {r["family"] + "/" + r["task"] + "/" + r["variant"]: r for r in report["models"][0]["results"]}
    assert results["sts/stsb/"]["status"] == "ok"
    assert set(results["sts/sts12/"]["details"]["subsets"]) == {"MSRpar", "OnWN"}
    assert (
        results["sts/sickr/"]["status"] == "missing" and "sickr/test.tsv" in results["sts/sickr/"]["details"]["error"]
    )
    assert len(results["clustering/agnews/"]["details"]["per_seed"]) == 10
    assert [results[f"intent/snips/{k}-shot"]["details"]["shots"] for k in (5, 10, 20)] == [5, 10, 20]
    assert len(results["intent/snips/20-shot"]["details"]["per_split"]) == 5
    assert results["intent/banking77/5-shot"]["status"] == "missing"
    markdown = (tmp_path / "a.md").read_text()
    assert "| Model |" in markdown and "missing" in markdown
    assert report["models"][0]["embedding"]["encoded"] == report["models"][0]["embedding"]["distinct_texts"] > 0

    second = invoke("all", *common, "--output", str(tmp_path / "b.json"))
    assert second.exit_code == 0, second.output
    again = json.loads((tmp_path / "b.json").read_text())["models"][0]
    assert again["embedding"]["encoded"] == 0
    assert again["embedding"]["from_cache"] == again["embedding"]["distinct_texts"]
    assert [r["primary"] for r in again["results"]] == [r["primary"] for r in report["models"][0]["results"]]

    compared = invoke("compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"))
    assert compared.exit_code == 0, compared.output
    assert "+0.00" in compared.output


def test_single_family_run_fails_on_a_missing_file(tiny_model, data_dir, tmp_path):
    result = invoke(
        "sts",
        "--model",
        str(tiny_model),
        "--data-dir",
        str(data_dir),
        "--task",
        "sickr",
        "--no-cache",
        "--output",
        str(tmp_path / "r.json"),
    )
    assert result.exit_code == 2
    assert "sickr/test.tsv not found" in result.output and "layout" in result.output


def test_clustering_subsample_through_the_cli(tiny_model, data_dir, tmp_path):
    common = ["--model", str(tiny_model), "--data-dir", str(data_dir), "--no-cache"]
    result = invoke(
        "clustering", *common, "--task", "agnews", "--clustering-max-texts", "12", "--output", str(tmp_path / "c.json")
    )
    assert result.exit_code == 0, result.output
    details = json.loads((tmp_path / "c.json").read_text())["models"][0]["results"][0]["details"]
    assert details["texts"] == 12 and details["clusters"] == 3  # 60 texts, 3 classes of 20 -> 4 each
    refused = invoke("sts", *common, "--clustering-max-texts", "12", "--output", str(tmp_path / "s.json"))
    assert refused.exit_code == 2 and "only applies to clustering" in refused.output


def test_unknown_task_and_missing_data_dir_are_user_errors(tiny_model, data_dir, tmp_path, monkeypatch):
    result = invoke("sts", "--model", str(tiny_model), "--data-dir", str(data_dir), "--task", "agnews")
    assert result.exit_code == 2 and "unknown task" in result.output
    monkeypatch.delenv("VASCL_DATA", raising=False)
    result = invoke("sts", "--model", str(tiny_model))
    assert result.exit_code == 2 and "VASCL_DATA" in result.output


def test_model_directory_without_tokenizer_is_rejected(tmp_path, data_dir):
    bare = save_tiny_bert(tmp_path / "bare", tokenizer=False)
    with pytest.raises(ValueError, match="has no tokenizer vocabulary"):
        resolve_model(bare)
    result = invoke("sts", "--model", str(bare), "--data-dir", str(data_dir), "--task", "stsb")
    assert result.exit_code == 2 and "tokenizer" in result.output


def test_run_directory_prefers_best_then_final(tmp_path, tiny_model):
    run = tmp_path / "run"
    save_tiny_bert(run / "final")
    assert resolve_model(run).directory == run / "final"
    save_tiny_bert(run / "best", seed=1)
    assert resolve_model(run).directory == run / "best"
    with pytest.raises(ValueError, match="neither a model directory"):
        resolve_model(tmp_path)


def _sentence_transformers_dir(root: Path, mode: str, layout: str) -> Path:
    """A tiny sentence-transformers directory as release 2-4 ("legacy") or 5+ ("modern") saves it."""
    save_tiny_bert(root)
    prefix = "sentence_transformers.models." if layout == "legacy" else "sentence_transformers.base.modules."
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": prefix + "Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": prefix + "Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": prefix + "Normalize"},
    ]
    (root / "modules.json").write_text(json.dumps(modules))
    (root / "1_Pooling").mkdir()
    if layout == "legacy":
        (root / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 16, "do_lower_case": False}))
        legacy_keys = {
            "cls": "pooling_mode_cls_token",
            "mean": "pooling_mode_mean_tokens",
            "max": "pooling_mode_max_tokens",
        }
        pooling = {key: name == mode for name, key in legacy_keys.items()}
    else:
        tokenizer_config = json.loads((root / "tokenizer_config.json").read_text())
        (root / "tokenizer_config.json").write_text(json.dumps({**tokenizer_config, "model_max_length": 16}))
        pooling = {"pooling_mode": mode}
    (root / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32, **pooling}))
    return root


@pytest.mark.parametrize("layout", ["legacy", "modern"])
def test_sentence_transformers_directory_pooling_and_normalize_are_honoured(tmp_path, layout):
    root = _sentence_transformers_dir(tmp_path / "st", "cls", layout)
    spec = resolve_model(root)
    assert (spec.pooling, spec.normalize, spec.max_length) == ("cls", True, 16)
    texts = ["a river bank", "a guitar song that goes on and on and on for a while", "rain"]
    embedded = Embedder(spec).embed(texts)(texts)
    reference = SentenceEncoder.from_pretrained(root, pooling="cls").encode(texts, max_length=16, normalize=True)
    np.testing.assert_allclose(embedded, reference, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(embedded, axis=1), 1.0, atol=1e-5)
    assert resolve_model(root, pooling="mean", max_length=8).pooling == "mean"


@pytest.mark.parametrize("layout", ["legacy", "modern"])
def test_unsupported_sentence_transformers_pooling_is_rejected(tmp_path, layout):
    root = _sentence_transformers_dir(tmp_path / "st", "max", layout)
    with pytest.raises(ValueError, match="supports one of"):
        resolve_model(root)


def test_embedder_keeps_order_and_cache_key_depends_on_pooling(tmp_path, tiny_model):
    texts = ["short", "a much longer text about football and goals", "short", "music"]
    spec = resolve_model(tiny_model)
    embedded = Embedder(spec, batch_size=2, cache_dir=tmp_path).embed(texts)(texts)
    reference = SentenceEncoder.from_pretrained(tiny_model).encode(texts, batch_size=2)
    np.testing.assert_allclose(embedded, reference, atol=1e-6)
    assert model_fingerprint(spec) != model_fingerprint(resolve_model(tiny_model, pooling="cls"))
    with pytest.raises(ValueError, match="empty text"):
        Embedder(spec).embed(["fine", "  "])


def test_bf16_embeddings_are_close_to_float32_cached_apart_and_refused_without_native_bf16(
    tmp_path, tiny_model, data_dir, monkeypatch
):
    texts = ["short", "a much longer text about football and goals", "music"]
    spec = resolve_model(tiny_model)
    monkeypatch.setenv("VASCL_SCALE_CPU_BF16", "emulate")
    fp32 = Embedder(spec, cache_dir=tmp_path, precision="no")
    bf16 = Embedder(spec, cache_dir=tmp_path, precision="bf16")
    a, b = fp32.embed(texts)(texts), bf16.embed(texts)(texts)
    assert bf16.stats.precision == "bf16" and bf16.stats.encoded == 3  # not the float32 rows from the cache
    assert bf16.stats.fingerprint == fp32.stats.fingerprint + "-bf16"
    assert not np.array_equal(a, b)
    cosine = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cosine.min() > 0.999
    assert Embedder(spec, precision="auto").stats.precision == "bf16"  # bf16 is "native" while emulated
    monkeypatch.delenv("VASCL_SCALE_CPU_BF16")
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert Embedder(spec, precision="auto").stats.precision == "no"
    result = invoke(
        "sts", "--model", str(tiny_model), "--data-dir", str(data_dir), "--task", "stsb", "--precision", "bf16"
    )
    assert result.exit_code == 2 and "--precision = 'bf16' needs native bf16" in result.output


def test_compare_prints_per_task_differences_and_flags_a_precision_difference(tmp_path):
    def report(stsb: float, agnews: float, embedding: dict) -> EvalReport:
        results = [TaskResult("sts", "stsb", "spearman", stsb), TaskResult("clustering", "agnews", "accuracy", agnews)]
        return EvalReport([ModelReport({"name": "m"}, embedding, {}, results)])

    report(80.0, 60.0, {}).save(tmp_path / "a.json")  # a file from before --precision: float32
    report(81.5, 57.25, {"precision": "no"}).save(tmp_path / "b.json")
    report(81.5, 57.25, {"precision": "bf16"}).save(tmp_path / "c.json")
    result = invoke("compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"))
    assert result.exit_code == 0, result.output
    assert "+1.50" in result.output and "-2.75" in result.output
    assert "precisions differ" not in result.output
    result = invoke("compare", str(tmp_path / "a.json"), str(tmp_path / "c.json"))
    assert result.exit_code == 0, result.output
    assert "precisions differ: A encoded in float32, B in bf16" in " ".join(result.output.split())
    assert "+1.50" in result.output  # still shown: the precision moves scores by tenths, the title says so
    result = invoke("compare", str(tmp_path / "a.json"), str(tmp_path / "nothing.json"))
    assert result.exit_code == 2 and "not found" in result.output


def test_compare_gives_no_difference_between_scores_on_different_sts_sources(tmp_path):
    def report(source: str, stsb: float, sickr: float, sickr_details: dict) -> EvalReport:
        results = [TaskResult("sts", "stsb", "spearman", stsb, details={"source": source}),
                   TaskResult("sts", "sickr", "spearman", sickr, details=sickr_details)]  # fmt: skip
        return EvalReport([ModelReport({"name": "m"}, {}, {}, results)])

    report("senteval", 82.23, 77.0, {}).save(tmp_path / "a.json")  # a file from before --sts-source: the releases
    report("mteb", 82.03, 77.5, {"source": "mteb"}).save(tmp_path / "b.json")
    result = invoke("compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"))
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())
    assert "not comparable: senteval vs mteb" in output and "-0.20" not in output
    assert "sts mean difference (1 task) │ │ │ +0.50" in output  # SICK-R alone


def test_neighbours_writes_table_plot_and_json(tiny_model, data_dir, tmp_path):
    plot, output = tmp_path / "n.png", tmp_path / "n.json"
    result = invoke(
        "neighbours",
        "--model",
        str(tiny_model),
        "--dataset",
        "agnews",
        "--data-dir",
        str(data_dir),
        "--k",
        "1",
        "--k",
        "5",
        "--plot",
        str(plot),
        "--output",
        str(output),
        "--no-cache",
    )
    assert result.exit_code == 0, result.output
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    record = json.loads(output.read_text())
    label = f"{tiny_model.parent.name}/{tiny_model.name}"
    assert set(record["neighbours"][label]) == {"1", "5"}
    assert {"alignment", "uniformity"} <= set(record["stsb_dev"][label])


def test_neighbours_plot_defaults_to_eval_results_never_the_working_directory(
    tiny_model, data_dir, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    result = invoke(
        "neighbours",
        "--model",
        str(tiny_model),
        "--dataset",
        "agnews",
        "--data-dir",
        str(data_dir),
        "--k",
        "1",
        "--no-cache",
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "eval-results" / "neighbours-agnews.png").is_file() and not list(tmp_path.glob("*.png"))
    record = json.loads((tmp_path / "eval-results" / "neighbours-agnews.json").read_text())  # the JSON beside it
    assert record["dataset"] == "agnews" and set(next(iter(record["neighbours"].values()))) == {"1"}


@pytest.mark.realdata
@pytest.mark.slow
@pytest.mark.skipif(not (REAL_DATA / "sts").is_dir(), reason=f"no evaluation data at {REAL_DATA}")
def test_fidelity_packaged_minilm_matches_published_mteb_figures(tmp_path):
    """all-MiniLM-L6-v2, mean pooling, max length 256, float32: MTEB reports STS-B 82.03, SICK-R 77.58."""
    result = invoke(
        "sts",
        "--model",
        str(PACKAGED),
        "--data-dir",
        str(REAL_DATA),
        "--task",
        "stsb",
        "--task",
        "sickr-full",
        "--no-cache",
        "--precision",
        "no",
        "--output",
        str(tmp_path / "f.json"),
    )
    assert result.exit_code == 0, result.output
    scores = {r["task"]: r["primary"] for r in json.loads((tmp_path / "f.json").read_text())["models"][0]["results"]}
    assert scores["stsb"] == pytest.approx(82.03, abs=0.05)
    assert scores["sickr-full"] == pytest.approx(77.58, abs=0.05)


def test_sts_source_senteval_scores_the_senteval_copies_and_keeps_sickr_untokenised(tiny_model, tmp_path):
    rng = np.random.default_rng(1)

    def sentence():
        return " ".join(rng.choice(WORDS, size=4))

    published = [f"{sentence()}\t{sentence()}\t{i % 5}" for i in range(20)]
    senteval = [f"{sentence().upper()} .\t{sentence()} .\t{(i * 7) % 5}" for i in range(20)]
    header = "sentence1\tsentence2\tscore"
    both, only_senteval = tmp_path / "both", tmp_path / "only"
    write_tsv(both / "sts" / "stsb" / "test.tsv", header, published)
    write_tsv(both / "sts" / "sickr" / "test.tsv", header, published)
    write_tsv(both / "sts_senteval" / "stsb" / "test.tsv", header, senteval)
    write_tsv(only_senteval / "sts" / "stsb" / "test.tsv", header, senteval)
    common = ["--model", str(tiny_model), "--no-cache", "--task", "stsb"]

    def scores(data: Path, name: str, *extra: str) -> dict:
        result = invoke("sts", *common, *extra, "--data-dir", str(data), "--output", str(tmp_path / f"{name}.json"))
        assert result.exit_code == 0, result.output
        return {r["task"]: r for r in json.loads((tmp_path / f"{name}.json").read_text())["models"][0]["results"]}

    chosen = scores(both, "senteval", "--task", "sickr", "--sts-source", "senteval")
    assert chosen["stsb"]["details"]["source"] == "senteval" and chosen["sickr"]["details"]["source"] == "mteb"
    assert chosen["stsb"]["primary"] == scores(only_senteval, "reference")["stsb"]["primary"]
    published_scores = scores(both, "published")
    assert published_scores["stsb"]["details"]["source"] == "mteb"
    assert published_scores["stsb"]["primary"] != chosen["stsb"]["primary"]
    assert "SentEval" in (tmp_path / "senteval.md").read_text()

    wrong = invoke(
        "sts", *common, "--data-dir", str(both), "--sts-source", "moses", "--output", str(tmp_path / "w.json")
    )
    assert wrong.exit_code == 2 and "--sts-source must be one of mteb, senteval" in wrong.output
    refused = invoke("clustering", "--model", str(tiny_model), "--data-dir", str(both), "--sts-source", "senteval")
    assert refused.exit_code == 2 and "only applies to STS" in refused.output


def test_augmentation_cosines_table_plot_and_json(tiny_model, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(
        "\n".join(" ".join(WORDS[(i + j) % len(WORDS)] for j in range(6 + i % 4)) for i in range(40)) + "\nshort\n"
    )
    common = ["--model", str(tiny_model), "--corpus", str(corpus), "--no-cache", "--plot", str(tmp_path / "aug.png")]
    result = invoke("augmentation", *common, "--fraction", "0.1,0.5", "--samples", "30")
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "aug.json").read_text())  # by default beside the --plot PNG
    assert record["samples"] == 30  # drawn from the 40 lines of 3+ words
    (cosines,) = record["cosines"].values()
    for share in ("0.1", "0.5"):
        entry = cosines["wdel"][share]
        assert entry["pairs"] == 30 and entry["unchanged"] == 0 and -1 <= entry["mean"] <= 1
    assert cosines["wdel"]["0.5"]["mean"] != cosines["wdel"]["0.1"]["mean"]
    assert (tmp_path / "aug.png").stat().st_size > 0 and "10% words" in result.output
    bad = invoke("augmentation", *common, "--fraction", "0,2")
    assert bad.exit_code == 2 and "every share must be in (0, 1]" in bad.output


def test_encoding_outside_a_terminal_logs_plain_progress_lines(tmp_path, tiny_model, monkeypatch):
    import io
    import logging

    from rich.console import Console

    from vascl_scale import log

    monkeypatch.setattr(log, "PLAIN_PROGRESS_SECONDS", 0.0)
    monkeypatch.setattr(log, "console", Console(file=io.StringIO()))  # not a terminal: a log file, CI
    records: list[logging.LogRecord] = []
    collector = logging.Handler(logging.INFO)
    collector.emit = records.append
    logger = logging.getLogger("vascl_scale.log")
    logger.addHandler(collector)
    previous = logger.level
    logger.setLevel(logging.INFO)
    try:
        texts = [f"{WORDS[i % len(WORDS)]} text {i}" for i in range(12)]
        Embedder(resolve_model(tiny_model), batch_size=2, chunk_batches=2, cache_dir=None).embed(texts)
    finally:
        logger.removeHandler(collector)
        logger.setLevel(previous)
    lines = [record.getMessage() for record in records]
    assert [line.split(",")[0] for line in lines] == [
        "encoding: 4 of 12 texts",
        "encoding: 8 of 12 texts",
        "encoding: 12 of 12 texts",
    ]
    assert all("texts/s" in line and "elapsed, about" in line for line in lines)


def test_results_go_inside_the_evaluated_run_or_to_eval_results(tiny_model, data_dir, tmp_path, monkeypatch):
    import shutil

    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    shutil.copytree(tiny_model, run / "final")
    common = ["--data-dir", str(data_dir), "--no-cache", "--task", "stsb"]
    first = invoke("sts", "--model", str(run), *common)
    assert first.exit_code == 0 and "will replace" not in first.output
    assert (run / "eval-sts.json").is_file() and (run / "eval-sts.md").is_file()
    again = " ".join(
        invoke("sts", "--model", str(run), *common).output.split()
    )  # says, before any work, what it replaces
    for option, path in (("--output", run / "eval-sts.json"), ("--markdown", run / "eval-sts.md")):
        assert (
            f"{option} {path}: this run will replace the file written " in again
            and f"(pass another {option} to keep it)" in again
        )
    assert invoke("sts", "--model", str(tiny_model), *common).exit_code == 0
    assert (tmp_path / "eval-results" / "sts.json").is_file()


def test_intent_shots_option_sets_the_few_shot_sizes(tiny_model, tmp_path):
    """Classes of 8 pool texts are too few for the default 10 and 20 shots; --shots lowers them."""
    for split, count in (("train", 24), ("test", 6)):
        write_tsv(
            tmp_path / "data" / "intent" / "snips" / f"{split}.tsv",
            "text\tlabel",
            [f"{split} {WORDS[i % 12]} {i}\tintent_{i % 3}" for i in range(count)],
        )
    common = ["--model", str(tiny_model), "--data-dir", str(tmp_path / "data"), "--task", "snips", "--no-cache"]
    refused = invoke("intent", *common, "--output", str(tmp_path / "d.json"))
    assert refused.exit_code == 2, refused.output
    assert "too few for 10-shot sampling (needs more than 10); pass smaller --shots" in " ".join(refused.output.split())
    result = invoke("intent", *common, "--shots", "3", "--shots", "2", "--output", str(tmp_path / "i.json"))
    assert result.exit_code == 0, result.output
    results = json.loads((tmp_path / "i.json").read_text())["models"][0]["results"]
    assert [(r["variant"], r["details"]["train_per_split"]) for r in results] == [("2-shot", 6), ("3-shot", 9)]
    wrong = invoke("sts", "--model", str(tiny_model), "--data-dir", str(tmp_path / "data"), "--shots", "2")
    assert wrong.exit_code == 2 and "--shots only applies to intent tasks" in wrong.output
    zero = invoke("intent", *common, "--shots", "0")
    assert zero.exit_code == 2 and "--shots" in zero.output

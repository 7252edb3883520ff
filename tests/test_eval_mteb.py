"""``vascl-scale eval mteb`` offline: an STS task defined here over a local TSV, scored by mteb's
own STS evaluator on the project's embeddings, agrees with ``eval sts`` on the same file; mteb's
result cache is keyed by the weights; ``--help`` and the install hint work without mteb."""

from __future__ import annotations

import importlib
import json
import shutil
import sys
from pathlib import Path

import pytest
from datasets import Dataset, DatasetDict
from mteb.abstasks.sts import AbsTaskSTS
from mteb.abstasks.task_metadata import TaskMetadata
from typer.testing import CliRunner

from tests.eval_helpers import make_data, save_tiny_bert
from vascl_scale.cli import app
from vascl_scale.config import config_from_dict
from vascl_scale.encode import embedding_fingerprint, resolve_model
from vascl_scale.eval.sts import load_sts_tsv
from vascl_scale.model_card import FACTS_FILE, CardFacts, export_step


def local_sts_task(name: str, path: Path | None) -> type[AbsTaskSTS]:
    """An mteb STS task over an ``eval sts`` TSV (sentence1, sentence2, score in 0..5); with
    ``path=None`` its data cannot be loaded, so mteb reports it failed."""

    class LocalSTS(AbsTaskSTS):
        metadata = TaskMetadata(
            name=name,
            type="STS",
            main_score="cosine_spearman",
            description="An STS TSV of the test's data directory.",
            reference="https://example.org/local-sts",
            dataset={"path": "local", "revision": "local"},
            category="t2t",
            eval_splits=["test"],
            eval_langs=["eng-Latn"],
            date=("2024-01-01", "2024-01-01"),
            dialect=[],
            domains=[],
            task_subtypes=[],
            license="cc-by-4.0",
            annotations_creators="derived",
            modalities=["text"],
            sample_creation="found",
            bibtex_citation="",
        )
        min_score, max_score = 0, 5

        def load_data(self, num_proc=None, **kwargs) -> None:
            if path is None:
                raise FileNotFoundError(f"{name} has no data")
            pairs = load_sts_tsv(path)
            columns = {
                "sentence1": [pair.sentence1 for pair in pairs],
                "sentence2": [pair.sentence2 for pair in pairs],
                "score": [pair.score for pair in pairs],
            }
            self.dataset = DatasetDict({"test": Dataset.from_dict(columns)})
            self.data_loaded = True

    return LocalSTS


@pytest.fixture()
def data_dir(tmp_path) -> Path:
    return make_data(tmp_path / "data")


@pytest.fixture()
def local_tasks(monkeypatch, data_dir):
    """LocalSTS (over stsb/test.tsv) and BrokenSTS registered as mteb task names, for --task."""
    registry = importlib.import_module("mteb.get_tasks")._TASKS_REGISTRY
    monkeypatch.setitem(registry, "LocalSTS", local_sts_task("LocalSTS", data_dir / "sts" / "stsb" / "test.tsv"))
    monkeypatch.setitem(registry, "BrokenSTS", local_sts_task("BrokenSTS", None))


def card_facts(step: int) -> CardFacts:
    """The model card's facts of weights trained for ``step`` steps (what export_step reads)."""
    config = config_from_dict({"model": {"path": "tiny"}, "data": {"train": "train.txt"}}).to_dict()
    return CardFacts(config=config, step=step, world_size=1, zero_stage=0, device_type="cpu", precision="no",
                     embedding_dimension=32, vascl_scale_version="test")  # fmt: skip


def write_run(run: Path, seed: int, step: int) -> Path:
    """A training run's layout: final/ (a tiny random BERT) with the card of step ``step``."""
    shutil.rmtree(run / "final", ignore_errors=True)
    save_tiny_bert(run / "final", seed=seed)
    (run / "final" / FACTS_FILE).write_text(card_facts(step).to_json(), encoding="utf-8")
    return run


def invoke(*args: str):
    return CliRunner().invoke(app, ["eval", *args])


def scores(path: Path) -> tuple[dict, dict]:
    """The model record (ModelSpec.describe() and, from eval mteb, mteb's name and revision) and the results by task."""
    model = json.loads(path.read_text(encoding="utf-8"))["models"][0]
    return model["model"], {result["task"]: result for result in model["results"]}


def test_mteb_sts_equals_eval_sts_and_its_cache_is_keyed_by_the_weights(tmp_path, data_dir, local_tasks):
    run = write_run(tmp_path / "run", seed=0, step=10)
    mteb_args = [
        "mteb",
        "--model",
        str(run),
        "--task",
        "LocalSTS",
        "--mteb-cache",
        str(tmp_path / "mteb"),
        "--precision",
        "no",
    ]
    sts_args = [
        "sts",
        "--model",
        str(run),
        "--data-dir",
        str(data_dir),
        "--task",
        "stsb",
        "--no-cache",
        "--precision",
        "no",
    ]

    def evaluate() -> tuple[dict, dict, float]:
        result = invoke(*mteb_args)
        assert result.exit_code == 0, result.output
        model, by_task = scores(run / "eval-mteb.json")  # inside the run, as eval sts writes eval-sts.json
        assert invoke(*sts_args).exit_code == 0
        return model, by_task["LocalSTS"], scores(run / "eval-sts.json")[1]["stsb"]["primary"]

    model, first, reference = evaluate()
    assert (
        first["family"] == "mteb" and first["metric"] == "cosine_spearman" and not first["details"]["from_mteb_cache"]
    )
    assert first["primary"] == pytest.approx(reference, abs=0.01)  # mteb's evaluator on the project's embeddings
    fingerprint = embedding_fingerprint(resolve_model(run), "no")
    assert model["mteb"]["name"] == "vascl-scale/run/final" and model["mteb"]["revision"] == f"step-10-{fingerprint}"
    assert (
        tmp_path / "mteb" / "results" / "vascl-scale__run__final" / f"step-10-{fingerprint}" / "LocalSTS.json"
    ).is_file()
    assert "| LocalSTS | Avg. |" in (run / "eval-mteb.md").read_text(encoding="utf-8")

    again = evaluate()[1]
    assert again["details"]["from_mteb_cache"] and again["primary"] == pytest.approx(first["primary"], abs=1e-3)

    write_run(run, seed=1, step=20)  # training continued: other weights in the same final/
    model, other, other_reference = evaluate()
    assert model["mteb"]["revision"].startswith("step-20-") and not other["details"]["from_mteb_cache"]
    assert other["primary"] == pytest.approx(other_reference, abs=0.01) and other_reference != pytest.approx(
        reference, abs=0.01
    )


def test_a_failing_task_is_reported_and_the_others_still_run(tmp_path, local_tasks):
    model = save_tiny_bert(tmp_path / "tiny")
    output = tmp_path / "m.json"
    result = invoke(
        "mteb",
        "--model",
        str(model),
        "--task",
        "BrokenSTS",
        "--task",
        "LocalSTS",
        "--no-cache",
        "--output",
        str(output),
    )
    assert result.exit_code == 1, result.output
    by_task = scores(output)[1]
    assert (
        by_task["BrokenSTS"]["status"] == "failed"
        and "BrokenSTS has no data" in by_task["BrokenSTS"]["details"]["error"]
    )
    assert by_task["LocalSTS"]["status"] == "ok"
    assert "failed" in output.with_suffix(".md").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "neither --task nor --benchmark"),
        (["--task", "STS12", "--benchmark", "MTEB(eng, v2)"], "both --task and --benchmark"),
        (["--task", "STSBenchmarc"], "Did you mean: 'STSBenchmark'"),
        (["--benchmark", "MTEB(eng, v9)"], "--benchmark 'MTEB(eng, v9)'"),
    ],
)
def test_task_and_benchmark_choices_are_user_errors(tmp_path, args, message):
    result = invoke("mteb", "--model", str(save_tiny_bert(tmp_path / "tiny")), "--no-cache", *args)
    assert result.exit_code == 2 and message in result.output, result.output


def test_without_mteb_help_works_and_running_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mteb", None)  # import mteb now raises ImportError, as when it is absent
    shown = invoke("mteb", "--help")
    assert shown.exit_code == 0 and "--benchmark" in shown.output and "pip install 'vascl-scale[mteb]'" in shown.output
    refused = invoke("mteb", "--model", str(tmp_path), "--task", "STS12")
    assert refused.exit_code == 2 and "needs the mteb library" in refused.output
    assert "pip install 'vascl-scale[mteb]'" in refused.output


def test_export_step_is_the_step_of_the_exports_model_card(tmp_path):
    export = save_tiny_bert(tmp_path / "run" / "final", tokenizer=False)
    assert export_step(export) is None  # no card: not an export of a vascl-scale run
    (export / FACTS_FILE).write_text(card_facts(30).to_json(), encoding="utf-8")
    assert export_step(export) == 30


@pytest.mark.e2e
def test_offline_a_task_without_data_prints_its_reason_and_where_mteb_data_must_be(tmp_path):
    import os
    import subprocess

    model = save_tiny_bert(tmp_path / "tiny")
    home = tmp_path / "hf"  # an empty Hugging Face home: the task's data is nowhere
    # A wide terminal: the log lines are not wrapped, so the paths in them read whole.
    env = {**os.environ, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "COLUMNS": "1000"}
    env.pop("HF_HUB_CACHE", None), env.pop("HF_DATASETS_CACHE", None)
    command = [sys.executable, "-m", "vascl_scale", "eval", "mteb", "--model", str(model), "--task", "STS12", "--no-cache",
               "--output", str(tmp_path / "m.json")]  # fmt: skip
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr
    lines = [" ".join(line.split()) for line in result.stderr.splitlines()]
    summary = lines[next(i for i, line in enumerate(lines) if "1 task(s) failed" in line) :]
    assert summary[1].endswith("ERROR STS12: Couldn't reach 'mteb/sts12-sts' on the Hub (OfflineModeIsEnabled)"), (
        summary
    )
    hint = "".join("".join(summary[2:]).split())  # whitespace left out: a wrapped line may split a path
    expected = f"the Hub cache {home / 'hub'} (HF_HUB_CACHE) and datasets' cache {home / 'datasets'} (HF_DATASETS_CACHE; by default both lie under HF_HOME)"
    assert "".join(expected.split()) in hint, hint
    assert "(--taskSTS12)onamachinethatreachestheHub" in hint and "HF_HUB_OFFLINE=1" in hint
    assert "Traceback" not in result.stderr

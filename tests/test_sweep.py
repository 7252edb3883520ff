"""``vascl-scale sweep`` end to end on a tiny random model: runs, resumes, failures, SLURM, plots."""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, BertConfig, BertModel
from typer.testing import CliRunner

from tests.tiny import packaged_minilm_dir
from vascl_scale.cli import app
from vascl_scale.sweep.grid import SweepPlan, expand, parse_grid_axis, parse_variant
from vascl_scale.sweep.run import eval_command

WORDS = "the a cat dog runs jumps over under quickly slowly red blue green house tree car river".split()


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """A tiny BERT with the packaged tokenizer, 200 training lines and a base config."""
    root = tmp_path_factory.mktemp("sweep")
    tokenizer = AutoTokenizer.from_pretrained(str(packaged_minilm_dir()))
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
    )
    BertModel(config).save_pretrained(root / "tiny")
    tokenizer.save_pretrained(root / "tiny")
    generator = torch.Generator().manual_seed(0)
    lines = []
    for _ in range(200):
        length = int(torch.randint(4, 12, (1,), generator=generator))
        lines.append(" ".join(WORDS[int(i)] for i in torch.randint(len(WORDS), (length,), generator=generator)))
    (root / "train.txt").write_text("\n".join(lines) + "\n")
    (root / "base.yaml").write_text(
        f"""
model: {{path: {root / "tiny"}, head_dim: 16}}
data: {{train: {root / "train.txt"}, max_length: 16, num_workers: 0}}
loss: {{k: 2}}
train: {{global_batch_size: 8, max_steps: 2, log_every: 1}}
eval: {{every_steps: 0}}
checkpoint: {{every_steps: 0}}
"""
    )
    return root


def _sweep(*args: str):
    return CliRunner().invoke(app, ["sweep", *args], catch_exceptions=False)


def _flat(text: str) -> str:
    """Terminal output with rich's line wrapping undone."""
    return " ".join(text.split())


@pytest.mark.e2e
def test_two_by_two_sweep_at_equal_updates_runs_resumes_and_reports(workspace: Path) -> None:
    out = workspace / "s2x2"
    args = ["--config", str(workspace / "base.yaml"), "--grid", "train.global_batch_size=8,16", "--grid", "loss.k=2,3"]
    args += ["--max-steps", "3", "--output", str(out), "--eval", "none"]
    result = _sweep(*args)
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [(r["train.global_batch_size"], r["loss.k"], r["state"]) for r in rows] == [
        ("8", "2", "done"),
        ("8", "3", "done"),
        ("16", "2", "done"),
        ("16", "3", "done"),
    ]
    # Equal updates: every cell takes 3 optimiser steps, so the larger batch sees more sentences.
    assert [(r["optimiser_steps"], r["sentences_seen"]) for r in rows] == [
        ("3", "24"),
        ("3", "24"),
        ("3", "48"),
        ("3", "48"),
    ]
    for row in rows:
        assert float(row["step_seconds"]) > 0 and float(row["sentences_per_second"]) > 0
        assert float(row["peak_rss_mb"]) > 50 and float(row["wall_seconds"]) > 0
    markdown = (out / "results.md").read_text()
    assert "| train.global_batch_size | loss.k | seeds | optimiser_steps | sentences_seen |" in markdown
    assert "| 16 | 3 | 1 | 3 | 48 |" in markdown
    for name in ("step_seconds", "sentences_per_second", "peak_rss_mb"):
        assert (out / "plots" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    status_times = {p: p.stat().st_mtime_ns for p in out.glob("cells/*/status.json")}
    assert len(status_times) == 4

    again = _sweep(*args)  # a rerun skips every finished cell
    assert again.exit_code == 0, again.output
    assert {p: p.stat().st_mtime_ns for p in out.glob("cells/*/status.json")} == status_times

    changed = _sweep(*args[:-2], "--eval", "sts")  # the same directory with other settings
    assert changed.exit_code == 2 and "holds a different sweep" in _flat(changed.output)


@pytest.mark.e2e
def test_failing_cell_is_recorded_and_the_sweep_goes_on(workspace: Path) -> None:
    out = workspace / "sfail"
    missing = workspace / "no-such-file.txt"
    result = _sweep(
        "--config", str(workspace / "base.yaml"),
        "--grid", f"data.train={workspace / 'train.txt'},{missing}",
        "--output", str(out), "--eval", "none",
    )  # fmt: skip
    assert result.exit_code == 1  # failures are reported in the exit code, after every cell ran
    record = json.loads((out / "results.json").read_text())
    states = [cell["state"] for cell in record["cells"]]
    assert states == ["done", "failed"]
    assert record["cells"][1]["error"].startswith("training exited with")
    assert "Failed cells" in (out / "results.md").read_text()


def test_invalid_grid_is_refused_before_anything_runs(workspace: Path) -> None:
    out = workspace / "sinvalid"
    result = _sweep(
        "--config", str(workspace / "base.yaml"),
        "--grid", "train.global_batch_size=8,32", "--grid", "loss.k=2,16",
        "--output", str(out),
    )  # fmt: skip
    assert result.exit_code == 2
    assert "1 of 4 cells are invalid" in _flat(result.output)
    assert not out.exists()


def test_skip_invalid_drops_and_lists_cells_and_sentences_per_cell_sets_each_length(workspace: Path) -> None:
    out = workspace / "sbudget"
    common = [
        "--config",
        str(workspace / "base.yaml"),
        "--grid",
        "train.global_batch_size=8,32",
        "--grid",
        "loss.k=2,16",
    ]
    refused = _sweep(
        *common, "--skip-invalid", "--sentences-per-cell", "40", "--launcher", "slurm", "--output", str(out)
    )
    assert refused.exit_code == 2 and "is not a multiple of cell" in _flat(refused.output) and not out.exists()
    both = _sweep(*common, "--sentences-per-cell", "64", "--max-steps", "3", "--output", str(out))
    assert both.exit_code == 2 and "replaces --max-steps" in _flat(both.output)

    result = _sweep(
        *common, "--skip-invalid", "--sentences-per-cell", "64", "--launcher", "slurm", "--output", str(out)
    )
    assert result.exit_code == 0, result.output
    assert "1 of 4 cells are invalid; skipped (--skip-invalid)" in _flat(result.output)
    plan = SweepPlan.load(out)
    assert [cell.index for cell in plan.cells] == [0, 1, 2]
    steps = {
        (c.values["train.global_batch_size"], c.values["loss.k"]): c.derived["train.max_steps"] for c in plan.cells
    }
    assert steps == {(8, 2): 8, (32, 2): 2, (32, 16): 2}  # 64 sentences each (equal sentences, unequal updates)
    assert "train.max_steps=8" in plan.cells[0].assignments()
    assert list(plan.skipped) == ["train.global_batch_size-8__loss.k-16__seed-0"]
    assert "#SBATCH --array=0-2" in (out / "sweep.sbatch").read_text()
    collected = CliRunner().invoke(app, ["sweep", "collect", str(out)])
    assert collected.exit_code == 0, collected.output
    assert "## Skipped cells" in (out / "results.md").read_text() and "k must be" in (out / "results.md").read_text()


def test_slurm_mode_writes_a_valid_array_script(workspace: Path) -> None:
    out = workspace / "sslurm"
    result = _sweep(
        "--config", str(workspace / "base.yaml"),
        "--grid", "loss.k=2,3", "--seeds", "0,1",
        "--output", str(out), "--launcher", "slurm", "--sbatch", "--partition=gpu", "--sbatch", "--time=01:00:00",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    script = (out / "sweep.sbatch").read_text()
    assert "#SBATCH --array=0-3" in script and "#SBATCH --partition=gpu" in script
    assert "sweep run-cell" in script and '--index "$SLURM_ARRAY_TASK_ID"' in script
    assert subprocess.run(["bash", "-n", str(out / "sweep.sbatch")]).returncode == 0
    assert not (out / "cells").exists()  # nothing ran here
    collected = CliRunner().invoke(app, ["sweep", "collect", str(out)])
    assert collected.exit_code == 0 and "0 done, 0 failed, 0 interrupted, 4 pending" in _flat(collected.output)


def test_grid_parsing_and_expansion() -> None:
    assert parse_grid_axis("loss.k=4,16") == ("loss.k", [4, 16])
    assert parse_grid_axis("objective=vascl,simcse") == ("objective", ["vascl", "simcse"])
    with pytest.raises(ValueError, match="unknown key loss.kk"):
        parse_grid_axis("loss.kk=1,2")
    with pytest.raises(ValueError, match="repeats a value"):
        parse_grid_axis("loss.k=4,4")
    with pytest.raises(ValueError, match="key=v1,v2"):
        parse_grid_axis("loss.k")
    cells = expand({"a.b": [1, 2], "c": ["x"]}, seeds=[0, 1])
    assert [c.name for c in cells] == [
        "a.b-1__c-x__seed-0",
        "a.b-1__c-x__seed-1",
        "a.b-2__c-x__seed-0",
        "a.b-2__c-x__seed-1",
    ]
    assert cells[3].assignments() == ["a.b=2", 'c="x"', "train.seed=1"]


@pytest.mark.e2e
def test_variant_sweep_applies_each_bundle_and_reports_it(workspace: Path) -> None:
    out = workspace / "svariants"
    result = _sweep(
        "--config", str(workspace / "base.yaml"),
        "--variant", "simcse:objective=simcse",
        "--variant", "rel-0.5:loss.eps_mode=relative,loss.xi_mode=relative,loss.eps=0.5,loss.xi=0.5",
        "--grid", "loss.k=2,3", "--seeds", "7", "--output", str(out), "--eval", "none",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [(r["variant"], r["loss.k"], r["seed"], r["state"]) for r in rows] == [
        (variant, k, "7", "done") for variant in ("simcse", "rel-0.5") for k in ("2", "3")
    ]
    resolved = (out / "cells" / "variant-rel-0.5__loss.k-3__seed-7" / "run" / "config.yaml").read_text()
    assert "eps_mode: relative" in resolved and "eps: 0.5" in resolved and "k: 3" in resolved and "seed: 7" in resolved
    assert (
        "objective: simcse" in (out / "cells" / "variant-simcse__loss.k-2__seed-7" / "run" / "config.yaml").read_text()
    )
    assert "| variant | loss.k | seeds |" in (out / "results.md").read_text()
    record = json.loads((out / "results.json").read_text())
    assert [(e["variant"], e["loss.k"], e["seeds"]) for e in record["mean_over_seeds"]] == [
        ("simcse", 2, 1),
        ("simcse", 3, 1),
        ("rel-0.5", 2, 1),
        ("rel-0.5", 3, 1),
    ]
    chosen = CliRunner().invoke(app, ["sweep", "collect", str(out), "--metric", "sentences_per_second"])
    assert chosen.exit_code == 0, chosen.output
    summary = (out / "results.md").read_text().split("## Mean")[0]
    summary_columns = "| variant | loss.k | seeds | optimiser_steps | sentences_seen | sentences_per_second |"
    assert summary_columns in summary and "step_seconds" not in summary
    unknown = CliRunner().invoke(app, ["sweep", "collect", str(out), "--metric", "sts/stsb"])
    assert unknown.exit_code == 2 and "has metric(s) ['sts/stsb']" in _flat(unknown.output)


def test_variant_parsing_and_eval_arguments(tmp_path: Path) -> None:
    assert parse_variant("rel:loss.eps_mode=relative,loss.eps=0.5") == (
        "rel",
        {"loss.eps_mode": "relative", "loss.eps": 0.5},
    )
    for text, message in (
        ("objective=simcse", "NAME:key=value"),
        ("a b:objective=simcse", "letters, digits"),
        ("x:loss.kk=1", "unknown key loss.kk"),
        ("x:loss.k=1,loss.k=2", "sets loss.k twice"),
        ("x:loss.k", "expected key=value"),
    ):
        with pytest.raises(ValueError, match=message):
            parse_variant(text)
    cells = expand({}, seeds=[0], variants={"a": {"loss.k": 4}, "b": {"objective": "simcse"}})
    assert [(c.name, c.assignments()) for c in cells] == [
        ("variant-a__seed-0", ["loss.k=4", "train.seed=0"]),
        ("variant-b__seed-0", ['objective="simcse"', "train.seed=0"]),
    ]
    plan = SweepPlan(
        "base.yaml", {}, [0], eval_tasks="all", eval_args=["--task", "stsb", "--clustering-max-texts", "10"]
    )
    command = eval_command(plan, tmp_path / "run", tmp_path / "eval.json")
    assert command[-4:] == ["--task", "stsb", "--clustering-max-texts", "10"] and "all" in command
    plan = SweepPlan("base.yaml", {}, [0], eval_tasks="retrieval", eval_args=["--data", "beir/scifact"])
    command = eval_command(plan, tmp_path / "run", tmp_path / "eval.json")
    assert command[3:7] == ["eval", "retrieval", "--model", str(tmp_path / "run")]
    assert command[-2:] == ["--data", "beir/scifact"]
    refused = _sweep(
        "--config", "base.yaml", "--variant", "a:loss.k=2", "--variant", "a:loss.k=3", "--output", str(tmp_path / "s")
    )
    assert refused.exit_code == 2 and "share a name" in _flat(refused.output)


def test_a_cell_reports_its_best_dev_score_of_either_dev_task(tmp_path: Path) -> None:
    from vascl_scale.sweep.report import _metrics_summary

    records = [
        {"step": 2, "dev_retrieval_ndcg_at_10": 40.5},
        {"step": 4, "dev_retrieval_ndcg_at_10": 43.25},
        {"step": 4, "stsb_dev_spearman": 81.0},
        {"step": 6, "dev_retrieval_ndcg_at_10": 42.0},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))
    summary = _metrics_summary(tmp_path)
    assert summary["dev_retrieval_best"] == 43.25 and summary["stsb_dev_best"] == 81.0

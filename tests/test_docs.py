"""The documentation's code runs as written: the Python examples of the home page and of "Train
on your own text"."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import yaml

from tests.train_helpers import write_texts, write_tiny_model

REPO = Path(__file__).resolve().parents[1]
OWN_TEXT = REPO / "docs" / "own-text.md"
HOME = REPO / "docs" / "index.md"


def python_blocks(page: Path) -> list[str]:
    """The fenced ```python blocks of a Markdown page, in order."""
    return re.findall(r"^```python\n(.*?)^```$", page.read_text(encoding="utf-8"), flags=re.S | re.M)


def run_example(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, steps: int) -> dict:
    """Run the one ```python block of ``page`` as written, in ``tmp_path``: its my.txt, and
    configs/cpu-demo.yaml as the repository has it but for a tiny random model, ``steps`` steps
    and a global batch of 24 (every other key, and the example's assignments over them,
    validated as written). Returns the block's namespace."""
    from accelerate.state import AcceleratorState

    (code,) = python_blocks(page)
    assert "build_trainer(" in code and ".fit()" in code  # it trains, not only loads
    write_tiny_model(tmp_path / "model")
    write_texts(tmp_path / "my.txt")
    demo = yaml.safe_load((REPO / "configs" / "cpu-demo.yaml").read_text(encoding="utf-8"))
    demo["model"]["path"] = str(tmp_path / "model")
    demo["train"]["max_steps"] = steps
    demo["train"]["global_batch_size"] = 24  # > k + 1 = 17 (configs/cpu-demo.yaml's loss.k)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "cpu-demo.yaml").write_text(yaml.safe_dump(demo), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("VASCL_DATA", raising=False)  # model selection off, with its one warning
    package_logger = logging.getLogger("vascl_scale")
    handlers, level, propagate = package_logger.handlers[:], package_logger.level, package_logger.propagate
    namespace: dict = {}
    try:
        exec(compile(code, str(page), "exec"), namespace)
    finally:
        AcceleratorState._reset_state(True)
        package_logger.handlers[:], package_logger.level, package_logger.propagate = handlers, level, propagate
    return namespace


def test_the_home_page_example_trains_and_encodes_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    namespace = run_example(HOME, tmp_path, monkeypatch, steps=2)
    assert namespace["result"].steps == 20  # the example's own train.max_steps
    assert (tmp_path / "runs" / "quick" / "final" / "model.safetensors").is_file()
    assert namespace["embeddings"].shape == (2, 32)  # the tiny model's width


def test_the_own_text_example_trains_and_encodes_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    namespace = run_example(OWN_TEXT, tmp_path, monkeypatch, steps=2)
    assert namespace["result"].steps == 2
    assert (tmp_path / "shards" / "mine" / "manifest.json").is_file()
    assert (tmp_path / "runs" / "mine" / "final" / "model.safetensors").is_file()
    assert (tmp_path / "runs" / "mine" / "metrics.jsonl").read_text(encoding="utf-8").strip()
    assert namespace["embeddings"].shape == (2, 32)  # the tiny model's width

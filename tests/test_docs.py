"""The documentation's code runs as written: the Python examples of the home page and of "Train
on your own text". And its user pages talk to users: they cite commands and pages, never a test
file; the tests behind a claim are named on the contributor pages (docs/contributing.md)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import yaml

from tests.train_helpers import write_texts, write_tiny_model

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
OWN_TEXT = DOCS / "own-text.md"
HOME = DOCS / "index.md"
# The pages written for contributors, which may name tests; docs/reference/ is generated from the
# code. Every other page under docs/ is a user's page.
CONTRIBUTOR_PAGES = ("contributing.md", "architecture.md")
# A file under tests/ (tests/test_train.py, tests/download_helpers.py) or a test module named bare.
TEST_FILE = re.compile(r"\btests/[\w./-]+\.py\b|(?<![\w/.-])test_\w+\.py\b")


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


def user_pages() -> list[Path]:
    """Every page under docs/ but the contributor pages and the generated reference, globbed at
    run time so that a new page is checked without touching this test."""
    names = [page.relative_to(DOCS) for page in sorted(DOCS.rglob("*.md"))]
    return [DOCS / name for name in names if name.parts[0] != "reference" and name.as_posix() not in CONTRIBUTOR_PAGES]


def named_test_files(text: str) -> list[str]:
    """``line N: match`` for each file under tests/ that ``text`` names."""
    return [
        f"line {number}: {match.group(0)}"
        for number, line in enumerate(text.splitlines(), start=1)
        for match in TEST_FILE.finditer(line)
    ]


def test_the_reader_finds_test_files_and_nothing_else() -> None:
    text = (
        "Proven by `tests/test_decoders.py` and by test_global_mode.py on gloo ranks.\n"
        "See tests/download_helpers.py.\n"
        "Not these: `sts/sts12/test.tsv`, `qrels/test.tsv`, `pytest -m gpu`, the `pytest_gpu` stage,\n"
        "unit_tests/test_loss_dtensor.py of another project, `from tests.tiny import tiny_decoder_dir`.\n"
    )
    assert named_test_files(text) == [
        "line 1: tests/test_decoders.py",
        "line 1: test_global_mode.py",
        "line 2: tests/download_helpers.py",
    ]


@pytest.mark.parametrize("page", user_pages(), ids=lambda page: page.relative_to(DOCS).as_posix())
def test_user_pages_name_no_test_file(page: Path) -> None:
    named = named_test_files(page.read_text(encoding="utf-8"))
    assert not named, (
        f"{page.relative_to(REPO)} is a user's page and names test files ({'; '.join(named)}): cite the "
        "command that shows the claim or another page, and name the tests in a closing '## How we know' "
        "section without file names, or in docs/contributing.md"
    )


def test_the_contributor_pages_exist() -> None:
    assert all((DOCS / name).is_file() for name in CONTRIBUTOR_PAGES)


DURATION = re.compile(r"\d+ min \d+ s|\d+ s")


def test_the_demo_says_the_stage_times_the_readme_and_getting_started_give() -> None:
    # The demo prints EXPECTED_FLOAT32 or EXPECTED_BF16 at its start; the pages' table gives the
    # same measurements (data, train, eval, in all), so a new measurement goes into all three.
    script = (REPO / "launchers" / "cpu_demo.sh").read_text(encoding="utf-8")
    said = {
        precision: DURATION.findall(re.search(rf'^EXPECTED_{name}="(.*)"$', script, flags=re.M).group(1))[:4]
        for precision, name in (("float32", "FLOAT32"), ("bf16", "BF16"))
    }
    for page in (REPO / "README.md", DOCS / "getting-started.md"):
        rows = [line for line in page.read_text(encoding="utf-8").splitlines() if line.count("|") == 7]
        stage_rows = {}
        for row in rows:
            cells = [cell.strip() for cell in row.strip("|").split("|")]
            if cells[1] in said and all(DURATION.fullmatch(cell) for cell in cells[2:]):
                stage_rows[cells[1]] = cells[2:]
        assert stage_rows == said, f"{page.name}: the demo's stage table differs from launchers/cpu_demo.sh"

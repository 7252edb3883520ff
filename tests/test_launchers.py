"""The launcher scripts' own behaviour (what they run is tested through the CLI elsewhere)."""

from __future__ import annotations

import gzip
import json
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.download_helpers import HOST, Mirror, tar_gz_bytes
from tests.train_helpers import WORDS, cli_env, write_tiny_model

# The scripts run as a user runs them, in subprocesses: the e2e tier.
pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]


def test_the_demo_refuses_to_replace_a_directory_it_did_not_make(tmp_path: Path) -> None:
    corpus = tmp_path / "data" / "corpus" / "wiki1m.txt.gz"
    corpus.parent.mkdir(parents=True)
    corpus.write_bytes(gzip.compress(b"one sentence here\n"))
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "keep.txt").write_text("someone's results")
    env = {**os.environ, "VASCL_DATA": str(tmp_path / "data"), "DEMO_OUT": str(theirs)}
    result = subprocess.run(
        ["bash", "launchers/cpu_demo.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2, result.stderr
    assert "was not made by this demo" in result.stderr
    assert (theirs / "keep.txt").read_text() == "someone's results"


def test_the_demo_pointed_at_a_data_directory_without_the_corpus_says_how_to_get_it(tmp_path: Path) -> None:
    env = {**os.environ, "VASCL_DATA": str(tmp_path / "nowhere")}
    result = subprocess.run(
        ["bash", "launchers/cpu_demo.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and "unset it to fetch one into data/" in result.stderr
    assert "vascl-scale data download --to data" in result.stderr


def _demo_originals() -> dict[str, bytes]:
    """Tiny stand-ins for the originals the demo fetches, in their release formats: the corpus
    (one sentence a line), STS-B's tarball (dev for the run's dev evaluation, test for eval all),
    a clustering file (label<TAB>text) and an intent set's CSVs (more than 20 a class: 20-shot)."""
    rng = random.Random(0)

    def sentence() -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 10)))

    def stsb_rows(count: int) -> bytes:
        rows = (
            f"main-captions\tMSRvid\t2012test\t{i:04d}\t{rng.uniform(0, 5):.3f}\t{sentence()}\t{sentence()}"
            for i in range(count)
        )
        return ("\n".join(rows) + "\n").encode()

    def labelled(count: int) -> list[tuple[str, str]]:
        return [(label, sentence()) for label in ("greet", "leave") for _ in range(count)]

    return {
        "corpus/wiki1m_for_simcse.txt": "".join(sentence() + "\n" for _ in range(300)).encode(),
        "sts/Stsbenchmark.tar.gz": tar_gz_bytes(
            {"stsbenchmark/sts-dev.csv": stsb_rows(24), "stsbenchmark/sts-test.csv": stsb_rows(24)}
        ),
        "clustering/agnews": "".join(f"{label}\t{text}\n" for label, text in labelled(10)).encode(),
        "intent/train.csv": ("text,category\n" + "".join(f"{t},{label}\n" for label, t in labelled(22))).encode(),
        "intent/test.csv": ("text,category\n" + "".join(f"{t},{label}\n" for label, t in labelled(4))).encode(),
    }


def _registry_entry(
    name: str, family: str, converter: str, sources: list[str], outputs: list[str], options: str = ""
) -> str:
    """One dataset of a registry: its originals at https://HOST/<source>, its outputs unpinned."""
    urls = ", ".join(f'{{ url = "https://{HOST}/{source}" }}' for source in sources)
    files = ", ".join(f'"{output}" = ""' for output in outputs)
    extra = f"options = {options}\n" if options else ""
    return (
        f'[datasets.{name}]\nfamily = "{family}"\ndescription = "d"\nlicence = "l"\nformat = "f"\n'
        f'checked = "fixtures"\nconverter = "{converter}"\n{extra}sources = [{urls}]\noutputs = {{ {files} }}\n'
    )


DEMO_REGISTRY = "\n".join(
    [
        _registry_entry("wiki1m", "corpus", "gzip_text", ["corpus/wiki1m_for_simcse.txt"], ["corpus/wiki1m.txt.gz"]),
        _registry_entry(
            "stsb",
            "sts",
            "stsb_csv",
            ["sts/Stsbenchmark.tar.gz"],
            ["sts/stsb/dev.tsv", "sts/stsb/test.tsv"],
            '{ folder = "stsbenchmark/", files = { "sts-dev.csv" = "sts/stsb/dev.tsv", "sts-test.csv" = "sts/stsb/test.tsv" } }',
        ),
        _registry_entry("agnews", "clustering", "label_tab_text", ["clustering/agnews"], ["clustering/agnews.tsv"]),
        _registry_entry(
            "banking77",
            "intent",
            "csv_text_category",
            ["intent/train.csv", "intent/test.csv"],
            ["intent/banking77/train.tsv", "intent/banking77/test.tsv"],
        ),
        _registry_entry(
            "sickr",
            "sts",
            "sick_semeval",
            ["sts/sick_test_annotated.zip"],
            ["sts/sickr/test.tsv"],
            '{ files = { "SICK_test_annotated.txt" = "sts/sickr/test.tsv" } }',
        ),
    ]
)
SICK = f"/{HOST}/sts/sick_test_annotated.zip"  # listed, but not on the mirror: the demo goes on without it


def test_the_demo_on_a_fresh_checkout_fetches_its_data_through_a_mirror_then_trains_and_evaluates(
    tmp_path: Path,
) -> None:
    # A checkout with no ../shared/data beside it and no VASCL_DATA: the demo fills <checkout>/data
    # through `data download`, here from a loopback HTTP mirror (VASCL_MIRROR) of tiny stand-ins
    # listed by a registry of their own (VASCL_REGISTRY), and trains a tiny BERT for 2 steps.
    checkout = tmp_path / "checkout"
    (checkout / "launchers").mkdir(parents=True)
    shutil.copy(REPO / "launchers" / "cpu_demo.sh", checkout / "launchers")
    config = {
        "objective": "vascl",
        "model": {"path": str(write_tiny_model(tmp_path / "model")), "head_dim": 16},
        "data": {"train": "set by the demo", "max_length": 16, "num_workers": 0},
        "loss": {"k": 4},
        "train": {"global_batch_size": 16, "max_steps": 2, "log_every": 1, "precision": "no"},
        "eval": {"every_steps": 2, "max_length": 32},  # STS-B dev: $VASCL_DATA/sts/stsb/dev.tsv, fetched
        "checkpoint": {"every_steps": 2},
    }
    (checkout / "demo.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "registry.toml").write_text(DEMO_REGISTRY)
    originals = _demo_originals()
    env = {
        **{k: v for k, v in cli_env().items() if k != "VASCL_DATA"},
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",  # vascl-scale, python3
        "VASCL_REGISTRY": str(tmp_path / "registry.toml"),
        "DEMO_LINES": "200",
        "DEMO_CONFIG": "demo.yaml",
        "VASCL_CACHE": str(tmp_path / "cache"),  # eval's embedding cache: not the user's
    }
    with Mirror(originals) as mirror:
        env["VASCL_MIRROR"] = mirror.url
        result = subprocess.run(
            ["bash", "launchers/cpu_demo.sh"],
            cwd=checkout,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=240,
        )
    output = " ".join(result.stdout.split())
    assert result.returncode == 0, result.stdout[-4000:]
    data = checkout / "data"
    # It says what it will do, and for these settings that it knows no expected times; then that
    # it fetches into data/, before the download's plan sizes the 6 files (one the mirror lacks).
    assert output.index("== the CPU demo: 1/3 data, 2/3 train, 3/3 eval") < output.index(
        "expected times are known for the defaults only"
    )
    said = output.index(f"no VASCL_DATA and no ../shared/data, so the corpus and the evaluation sets go to {data}")
    size = sum(map(len, originals.values())) / 1e3
    planned = output.index(
        f"5 datasets to fetch and convert (0 present): 6 files, {size:.1f} kB to transfer from {mirror.url} "
        "and 1 of unknown size"
    )
    summary = output.index("4 converted, 0 present, 1 failed")
    assert said < planned < summary < output.index("some evaluation sets could not be fetched")
    assert sorted(path for path, _ in mirror.requests) == sorted([SICK, *(f"/{HOST}/{name}" for name in originals)])
    with gzip.open(data / "corpus" / "wiki1m.txt.gz", "rb") as corpus:
        assert corpus.read() == originals["corpus/wiki1m_for_simcse.txt"]
    # The run read the fetched data: the slice, the dev set during training, the sets in eval all.
    out = checkout / "runs" / "demo-e2e"
    assert len((out / "slice.txt").read_text().splitlines()) == 200
    assert "step 2: STS-B dev Spearman" in output
    report = json.loads((out / "eval.json").read_text())
    scored = {
        (row["family"], row["task"])
        for model in report["models"]
        for row in model["results"]
        if row["primary"] is not None
    }
    assert {("sts", "stsb"), ("clustering", "agnews"), ("intent", "banking77")} <= scored, report
    statuses = {row["task"]: row["status"] for model in report["models"] for row in model["results"]}
    assert statuses["sickr"] == "missing"
    # At its end: what each stage took and where the results are.
    assert re.search(
        r"== done in \d+ min \d+ s: data \d+ min \d+ s \(of it \d+ min \d+ s checking or fetching the data\), "
        r"train \d+ min \d+ s, eval \d+ min \d+ s",
        output,
    )
    assert "scores: runs/demo-e2e/eval.md" in output and (out / "eval.md").is_file()
    assert f"data: {data}" in output


def _gpu_proof(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "OUT": str(tmp_path / "out"), "PYTHON": sys.executable, **env}
    return subprocess.run(
        ["bash", "launchers/gpu_proof.sh", *args],
        cwd=REPO,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_failing_gpu_proof_stage_fails_the_dry_run_and_the_later_stages_still_run(tmp_path: Path) -> None:
    # PEAK_TFLOPS=-1 is refused by the env stage; pytest_gpu, after it, does not need the peak.
    result = _gpu_proof(tmp_path, "--dry-run", "--only", "env,pytest_gpu", PEAK_TFLOPS="-1")
    assert result.returncode == 1, result.stdout + result.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert not summary["ok"] and summary["failed"] == ["env"] and summary["dry_run"] is True
    statuses = {s["stage"]: s["status"] for s in summary["stages"]}
    assert statuses == {"env": "failed", "pytest_gpu": "ok"}
    assert "PEAK_TFLOPS must be a number >= 0" in summary["stages"][0]["note"]
    assert summary["stages"][1]["figures"]["failures"] == 0
    assert "gpu proof: FAILED: env" in result.stdout


def test_the_gpu_proof_refuses_unknown_stages_and_a_missing_carry_saying_how_to_pack_one(tmp_path: Path) -> None:
    unknown = _gpu_proof(tmp_path, "--dry-run", "--only", "train,nope")
    assert unknown.returncode == 2 and "unknown stage nope; the stages: install env" in unknown.stderr
    no_carry = _gpu_proof(tmp_path, GPU_CARRY=str(tmp_path / "nowhere"))
    assert no_carry.returncode == 2 and "pack it with bash launchers/gpu_carry.sh" in no_carry.stderr

"""The kill matrix (issue 38): every failure path leaves a state the next run can use.

Each row starts a command in a session of its own, SIGKILLs its process group at one point and
runs the same command again. The rerun must end with what an uninterrupted run of the command
gives (the same shard bytes and manifest; the same downloaded and converted files; after
``--resume`` the same final weights and metrics; the same evaluation scores), or refuse in one
line naming what to pass or remove, and give that result once it is passed.

The points are deterministic, never where a sleep happened to end: the command stops itself
(SIGSTOP) just before a named filesystem call (``tests/kill_points/sitecustomize.py``, switched
on in the environment of the killed run alone), or the test waits for a state that cannot pass by
itself (a server that stops sending part-way). A 2-rank ``train`` pauses rank 0; its launcher's
process group is killed, and with it the paused rank (as a lost node or a cgroup kill takes
every process); the other rank, in a session of its own, must notice the dead launcher and exit
by itself before the rerun starts.

A full disk is a row of its own: the same kill point's machinery fails a named write with ENOSPC
instead of stopping there; the run must stop in one line that says so, and ``--resume`` gives the
uninterrupted run's result.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.data_helpers import pairs_tsv, sentences
from tests.download_helpers import EXPECTED, HOST, ORIGINALS, Mirror, registry_text
from tests.eval_helpers import make_data
from tests.processes import alive
from tests.train_helpers import REPO, ZERO2, assert_same_weights, cli_env, run_train, train_command, write_config

pytestmark = [pytest.mark.kill, pytest.mark.e2e]  # e2e too: the everyday tier leaves it out

KILL_POINTS = Path(__file__).resolve().parent / "kill_points"  # the folder of the pausing sitecustomize
CLI = [sys.executable, "-m", "vascl_scale"]
FULL_SHARD = str(REPO / "configs" / "fsdp" / "full-shard.yaml")


@dataclass(frozen=True)
class Pause:
    """Stop the command just before the ``nth`` call of ``call`` (os.replace, os.rename, os.mkdir,
    or open for writing) whose path arguments match the regex ``path`` ("SRC -> DST" for a rename),
    in the process of rank ``rank`` (any process when None)."""

    call: str
    path: str
    nth: int = 1
    rank: int | None = None


def _state(pid: int) -> str | None:
    """The process state letter of ``pid`` (T: stopped), None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-6000:] if log.exists() else ""


def kill_at(command: list[str], point, directory: Path, timeout: float = 180) -> str:
    """Run ``command`` until it reaches ``point`` (a :class:`Pause`, or a function that returns True
    once the state to kill in is there), SIGKILL its process group (and a paused worker, which runs
    in a session of its own), wait until every process below it is gone; the run's output."""
    pid_file = directory / "paused.pid"
    log = directory / "killed-run.log"
    env = cli_env()
    if isinstance(point, Pause):
        spec = {"call": point.call, "path": point.path, "nth": point.nth, "pid_file": str(pid_file)}
        if point.rank is not None:
            spec["rank"] = point.rank
        env.update(PYTHONPATH=f"{KILL_POINTS}{os.pathsep}{REPO}", VASCL_TEST_PAUSE=json.dumps(spec))
    with log.open("w") as out:
        process = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    below: set[int] = set()
    try:
        paused = _wait_for(point, pid_file, process, log, timeout)
        below = _descendants(process.pid)  # train's ranks (sessions of their own) and their loader workers
        os.killpg(process.pid, signal.SIGKILL)
        if paused is not None:
            with suppress(ProcessLookupError):
                os.kill(paused, signal.SIGKILL)  # SIGKILL ends a stopped process too
        process.wait(timeout=30)
        deadline = time.monotonic() + 30  # docs/training.md: every worker polls its launcher and exits
        while any(alive(pid) for pid in below):
            assert time.monotonic() < deadline, (
                f"processes {[pid for pid in below if alive(pid)]} outlived the killed command"
            )
            time.sleep(0.1)
    finally:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        for pid in below:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        process.wait(timeout=30)
    return _tail(log)


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (from /proc), whatever its session."""
    found: set[int] = set()
    pending = [pid]
    while pending:
        parent = pending.pop()
        for children in Path(f"/proc/{parent}/task").glob("*/children"):
            with suppress(OSError):
                pending += [int(child) for child in children.read_text().split() if int(child) not in found]
        found.update(pending)
    return found


def _wait_for(point, pid_file: Path, process: subprocess.Popen, log: Path, timeout: float) -> int | None:
    """Poll (every 10 ms) until ``point`` is reached: the pid of the process paused there, or None
    for a state the test waited for."""
    deadline = time.monotonic() + timeout
    while True:
        if isinstance(point, Pause):
            if pid_file.is_file():
                pid = int(pid_file.read_text().split()[0])
                if _state(pid) in ("T", "t"):
                    return pid
        elif point():
            return None
        if process.poll() is not None:
            pytest.fail(f"the command ended (exit {process.returncode}) before reaching {point}:\n{_tail(log)}")
        if time.monotonic() > deadline:
            pytest.fail(f"the command did not reach {point} in {timeout:g} s:\n{_tail(log)}")
        time.sleep(0.01)


def run_cli(*arguments: str, expect: int = 0, timeout: float = 300) -> subprocess.CompletedProcess:
    """``vascl-scale ARGUMENTS`` to its end, as a user reruns it (no kill point)."""
    result = subprocess.run(
        [*CLI, *arguments], cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=timeout
    )
    if result.returncode != expect:
        raise AssertionError(
            f"exit code {result.returncode} (expected {expect})\n{result.stdout}\n{result.stderr[-6000:]}"
        )
    return result


def one_error_line(result: subprocess.CompletedProcess) -> str:
    """The refusal's one line (``error: ...`` of the data and eval commands, an ERROR log line of train)."""
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output
    errors = [line for line in output.splitlines() if line.startswith("error: ") or " ERROR " in line]
    assert len(errors) == 1, output
    return errors[0]


def tree(root: Path, ignore: tuple[str, ...] = ()) -> dict[str, str | None]:
    """Every entry under ``root`` by relative path: a file's sha256 (of its bytes with ``root``
    written as ``<root>``: a manifest names its sources' paths), None for a folder."""
    entries: dict[str, str | None] = {}
    for path in sorted(root.rglob("*")):
        if path.name not in ignore:
            data = path.read_bytes().replace(str(root).encode(), b"<root>") if path.is_file() else None
            entries[str(path.relative_to(root))] = None if data is None else hashlib.sha256(data).hexdigest()
    return entries


# --- data prepare -------------------------------------------------------------------------------

PREPARE_SHARDS = 4  # 200 sentences, 50 a shard


def prepare_arguments(corpus: Path, output: Path, *extra: str) -> list[str]:
    return [
        "data",
        "prepare",
        str(corpus),
        "--output",
        str(output),
        "--shard-size",
        "50",
        "--shuffle-seed",
        "3",
        *extra,
    ]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The corpus and the tree of an uninterrupted ``data prepare`` of it."""
    root = tmp_path_factory.mktemp("prepare")
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(sentences(50 * PREPARE_SHARDS)) + "\n", encoding="utf-8")
    run_cli(*prepare_arguments(corpus, root / "reference"))
    reference = tree(root / "reference")
    assert sum(name.startswith("shard-") for name in reference) == PREPARE_SHARDS
    return corpus, reference


PREPARE_POINTS = [
    pytest.param(Pause("os.mkdir", r"/out/\.prepare-\w+$"), "clean", id="staging-lock-taken-directory-not-made"),
    pytest.param(Pause("open", r"/out/\.prepare-\w+/shard-000002\.tar$"), "clean", id="staging-2-of-4-shards-written"),
    pytest.param(Pause("os.replace", r"-> .*/out/shard-000001\.tar$"), "overwrite", id="swap-1-of-4-shards-moved-in"),
]


@pytest.mark.parametrize("pause,rerun", PREPARE_POINTS)
def test_killed_prepare_reruns_to_the_same_shards(prepared, tmp_path: Path, pause: Pause, rerun: str) -> None:
    corpus, reference = prepared
    output = tmp_path / "out"
    kill_at([*CLI, *prepare_arguments(corpus, output)], pause, tmp_path)
    if rerun == "overwrite":  # half a set moved in, without its manifest: the same command refuses
        refusal = run_cli(*prepare_arguments(corpus, output), expect=2)
        line = one_error_line(refusal)
        assert f"--output {output} already holds shards or a manifest; pass --overwrite" in line
        result = run_cli(*prepare_arguments(corpus, output, "--overwrite"))
    else:
        result = run_cli(*prepare_arguments(corpus, output))
    assert tree(output) == reference  # shard bytes, manifest, and nothing the killed run left
    # What the killed run left is named: its staging directory (with shards in it), or its lock file alone.
    left = "1 lock files without their directory" if pause.call == "os.mkdir" else "1 staging directories"
    assert f"removed {left} left by interrupted `data prepare` runs" in " ".join(result.stderr.split())


# --- data mine ----------------------------------------------------------------------------------

# 120 pairs -> 240 texts to encode, in cache parts of 16 x 4 = 64 texts: 4 parts.
MINE_PAIRS = 120


def mine_arguments(pairs: Path, model: Path, output: Path, cache: Path) -> list[str]:
    return [
        "data", "mine", str(pairs), "--model", str(model), "--text-field", "query,answer", "--output", str(output),
        "--negatives", "2", "--range", "0:8", "--margin", "none", "--shard-size", "40", "--search", "exact",
        "--batch-size", "4", "--precision", "no", "--cache-dir", str(cache),
    ]  # fmt: skip


def _mined(output: Path) -> tuple[dict, dict]:
    """(the tree without the manifest, the manifest without its timings)."""
    manifest = json.loads((output / "manifest.json").read_text())
    for key in ("seconds", "encode_seconds", "search_seconds"):
        manifest["summary"].pop(key)
    files = tree(output)
    files.pop("manifest.json")
    return files, manifest


@pytest.fixture(scope="module")
def mined(workspace: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, tuple[dict, dict]]:
    root = tmp_path_factory.mktemp("mine")
    pairs = root / "pairs.tsv"
    pairs_tsv(pairs, MINE_PAIRS)
    run_cli(*mine_arguments(pairs, workspace / "model", root / "reference", root / "cache"))
    return pairs, _mined(root / "reference")


MINE_POINTS = [
    pytest.param(Pause("os.replace", r"-> .*/cache/\w+/part-[^/]+\.npz$", nth=2), id="encoding-cache-part-2-of-4"),
    pytest.param(Pause("open", r"/out/\.prepare-\w+/shard-000001\.tar$"), id="staging-1-of-3-shards-written"),
]


@pytest.mark.parametrize("pause", MINE_POINTS)
def test_killed_mine_reruns_to_the_same_shards(workspace: Path, mined, tmp_path: Path, pause: Pause) -> None:
    pairs, reference = mined
    arguments = mine_arguments(pairs, workspace / "model", tmp_path / "out", tmp_path / "cache")
    kill_at([*CLI, *arguments], pause, tmp_path)
    run_cli(*arguments)
    assert _mined(tmp_path / "out") == reference


# --- data download ------------------------------------------------------------------------------

DOWNLOAD_NAMES = ("c", "wiki", "nli")  # three outputs; one large original; shards
WIKI = f"/{HOST}/corpus/wiki.txt"
# wiki.txt large enough that the part received before the stall reaches the disk (the writer's
# buffer is 8 KiB): 400 kB, of which the server sends 160 kB and then stops.
DOWNLOAD_ORIGINALS = {
    **ORIGINALS,
    "corpus/wiki.txt": ("\n".join(f"line {index} of the corpus" for index in range(16000)) + "\n").encode(),
}
STALL_AFTER = 160_000


class _StallingWriter:
    """A response's socket writer that sends ``limit`` bytes, then blocks until ``release``."""

    def __init__(self, wfile, limit: int, release: threading.Event) -> None:
        self._wfile, self._left, self._release = wfile, limit, release

    def write(self, data: bytes) -> int:
        if len(data) <= self._left:
            self._left -= len(data)
            return self._wfile.write(data)
        self._wfile.write(data[: self._left])
        self._left = 0
        self._release.wait(timeout=120)  # the client is killed meanwhile: the rest is never sent
        return len(data)

    def __getattr__(self, name: str):
        return getattr(self._wfile, name)


def stall_first_response(mirror: Mirror, path: str, limit: int) -> threading.Event:
    """Make ``mirror``'s first response for ``path`` stop after ``limit`` bytes (headers included)
    until the returned event is set; later responses are whole."""
    release, stalled = threading.Event(), threading.Event()
    handler = mirror.server.RequestHandlerClass

    class Stalling(handler):
        def do_GET(self) -> None:
            if self.path == path and not stalled.is_set():
                stalled.set()
                self.wfile = _StallingWriter(self.wfile, limit, release)
            super().do_GET()

    mirror.server.RequestHandlerClass = Stalling
    return release


def download_arguments(registry: Path, to: Path, mirror: Mirror) -> list[str]:
    return ["data", "download", *DOWNLOAD_NAMES, "--to", str(to), "--mirror", mirror.url, "--registry", str(registry)]


@pytest.fixture(scope="module")
def downloaded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The registry and the tree of an uninterrupted download of ``DOWNLOAD_NAMES``."""
    root = tmp_path_factory.mktemp("download")
    registry = root / "registry.toml"
    registry.write_text(registry_text(EXPECTED))
    with Mirror(DOWNLOAD_ORIGINALS) as mirror:
        run_cli(*download_arguments(registry, root / "reference", mirror))
    reference = tree(root / "reference", ignore=(".download.lock",))
    assert {"intent/c/valid.tsv", "corpus/wiki.txt.gz", "corpus/nli/manifest.json", f".downloads{WIKI}"} <= set(
        reference
    )
    return registry, reference


DOWNLOAD_POINTS = [
    pytest.param(None, id="transfer-stalled-160k-of-400k"),
    pytest.param(
        Pause("os.replace", r"/\.staging-c-\w+/intent/c/valid\.tsv -> "), id="convert-1-of-3-outputs-moved-in"
    ),
]


@pytest.mark.parametrize("pause", DOWNLOAD_POINTS)
def test_killed_download_reruns_to_the_same_files(downloaded, tmp_path: Path, pause: Pause | None) -> None:
    registry, reference = downloaded
    to = tmp_path / "data"
    part = to / ".downloads" / HOST / "corpus" / "wiki.txt.part"
    with Mirror(DOWNLOAD_ORIGINALS) as mirror:
        arguments = download_arguments(registry, to, mirror)
        if pause is None:  # killed while the server holds back the rest of wiki.txt
            release = stall_first_response(mirror, WIKI, STALL_AFTER)
            try:
                kill_at(
                    [*CLI, *arguments], lambda: part.is_file() and part.stat().st_size >= STALL_AFTER // 2, tmp_path
                )
            finally:
                release.set()
            received = part.stat().st_size
            assert (to / ".downloads" / HOST / "corpus" / "wiki.txt.part.validator").is_file()
        else:
            kill_at([*CLI, *arguments], pause, tmp_path)
        rerun = run_cli(*arguments)
        if pause is None:  # the rerun asked for the rest only
            assert (WIKI, f"bytes={received}-") in mirror.requests
        else:  # the killed run's staging folder, with two converted files in it, is named
            flat = " ".join((rerun.stdout + rerun.stderr).split())
            assert "removed 1 staging folders left by interrupted `data download` runs" in flat, flat
    assert tree(to, ignore=(".download.lock",)) == reference  # no .part, no staging folder left


# --- train: DDP, ZeRO-2 and FSDP2 on 2 ranks ---------------------------------------------------

# Where rank 0 is stopped (4 steps; a checkpoint and an evaluation every 2) and how the same
# command is then rerun: "fresh" (no complete checkpoint: --resume refuses naming none, the plain
# command trains from the start) or "resume" (the plain command refuses naming --resume).
TRAIN_POINTS = {
    "first-checkpoint-staged-not-renamed": (Pause("os.rename", r"/\.tmp-step-00000002 -> ", rank=0), "fresh"),
    "last-checkpoint-staged-not-renamed": (Pause("os.rename", r"/\.tmp-step-00000004 -> ", rank=0), "resume"),
    "final-export-staged-not-renamed": (Pause("os.rename", r"/\.tmp-final -> ", rank=0), "resume"),
}
TRAIN_ROWS = [
    # The final export's rename in the slow tier: the same staging and rename as the checkpoints'.
    *(
        pytest.param(
            "ddp", point, id=f"ddp-{point}", marks=[pytest.mark.slow] if point.startswith("final-export") else []
        )
        for point in TRAIN_POINTS
    ),
    *(
        # The slow tier: the save and rename code is the engines' one; DDP's rows stay in CI.
        pytest.param("zero2", point, id=f"zero2-{point}", marks=[pytest.mark.deepspeed, pytest.mark.slow])
        for point in ("last-checkpoint-staged-not-renamed", "final-export-staged-not-renamed")
    ),
    # FSDP2 saves through DCP (a shard file per rank) into the same staging directory.
    pytest.param("fsdp", "last-checkpoint-staged-not-renamed", id="fsdp-last-checkpoint-staged-not-renamed"),
]
ENGINE_ARGUMENTS = {"ddp": [], "zero2": ["--deepspeed", ZERO2], "fsdp": ["--fsdp", FULL_SHARD]}
# Each engine's result against DDP's: ZeRO-2 and FSDP2 reduce in their own order, equal up to
# float32 rounding. The DDP reference encodes in 4 length buckets (train.length_buckets: auto);
# FSDP2 full_shard's auto is 1, so it is given the same 4, to draw the same forwards.
ENGINE_ATOL = {"ddp": 0, "zero2": 1e-6, "fsdp": 1e-6}
ENGINE_TRAIN = {"ddp": {}, "zero2": {}, "fsdp": {"length_buckets": 4}}


def _metrics(run: Path) -> list[tuple]:
    """(step, loss, dev score) of each metrics.jsonl record: each step once, with its values."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r.get("loss/loss"), r.get("stsb_dev_spearman")) for r in records]


@pytest.mark.parametrize("engine,point", TRAIN_ROWS)
def test_killed_train_reruns_to_the_weights_of_an_uninterrupted_run(
    workspace: Path, ddp_reference: Path, tmp_path: Path, engine: str, point: str
) -> None:
    pause, rerun = TRAIN_POINTS[point]
    # A loader worker per rank (the reference has none; the stream is the same): they must go too.
    config = write_config(workspace, tmp_path / "config.yaml", data={"num_workers": 1}, train=ENGINE_TRAIN[engine])
    run = tmp_path / "run"
    engine_arguments = ["--num-processes", "2", *ENGINE_ARGUMENTS[engine]]
    kill_at(train_command(config, run, *engine_arguments), pause, tmp_path, timeout=420 if engine == "zero2" else 180)

    if rerun == "fresh":
        refusal = run_train(config, run, *engine_arguments, "--resume", expect=2)
        assert f"--resume: no complete checkpoint under {run / 'checkpoints'}" in one_error_line(refusal)
        run_train(config, run, *engine_arguments, timeout=420)
    else:
        refusal = run_train(config, run, *engine_arguments, expect=2)
        line = one_error_line(refusal)
        assert f"{run} already holds checkpoints of a run; pass --resume to continue it or a new --output" in line
        resumed = run_train(config, run, *engine_arguments, "--resume", timeout=420)
        step = 4 if point.startswith("final") else 2
        assert f"resumed from {run / 'checkpoints' / f'step-{step:08d}'} at step {step}" in " ".join(
            resumed.stderr.split()
        )
    _assert_uninterrupted(run, ddp_reference, engine)


def _assert_uninterrupted(run: Path, ddp_reference: Path, engine: str) -> None:
    """``run`` ended as the uninterrupted DDP run did: its weights, each step logged once, its two
    checkpoints and no staging or trash directory."""
    assert_same_weights(run, ddp_reference, atol=ENGINE_ATOL[engine])
    if engine == "ddp":  # each step logged once, with the values of the uninterrupted run
        assert _metrics(run) == _metrics(ddp_reference)
    else:
        assert [record[0] for record in _metrics(run)] == [record[0] for record in _metrics(ddp_reference)]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "step-00000002",
        "step-00000004",
    ]  # no .tmp-*, .trash-*
    assert not [p.name for p in run.iterdir() if p.name.startswith((".tmp-", ".trash-"))]


def test_a_full_disk_while_saving_stops_in_one_line_and_resumes_to_the_weights_of_an_uninterrupted_run(
    workspace: Path, ddp_reference: Path, tmp_path: Path
) -> None:
    config = write_config(workspace, tmp_path / "config.yaml", data={"num_workers": 1})
    run, checkpoints = tmp_path / "run", tmp_path / "run" / "checkpoints"
    # Rank 0's last write of the step-4 checkpoint meets a full disk; every rank's files are in.
    full = {"call": "open", "path": r"/\.tmp-step-00000004/trainer_state\.json$", "rank": 0, "fail": "ENOSPC"}
    env = {"PYTHONPATH": f"{KILL_POINTS}{os.pathsep}{REPO}", "VASCL_TEST_PAUSE": json.dumps(full)}
    failure = run_train(config, run, "--num-processes", "2", expect=1, env=env, timeout=420)
    output = failure.stdout + failure.stderr
    assert "Traceback" not in output, output[-6000:]
    full_lines = [line for line in output.splitlines() if " ERROR " in line and "the disk is full" in line]
    assert len(full_lines) == 1, output[-6000:]
    assert (
        f"checkpoint {checkpoints / 'step-00000004'} not saved: the disk is full (no space left on device)"
        in (full_lines[0])
    )
    assert f"the last complete checkpoint, {checkpoints / 'step-00000002'}, is intact" in full_lines[0]
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-00000002"]  # the partial one removed
    resumed = run_train(config, run, "--num-processes", "2", "--resume", timeout=420)
    assert f"resumed from {checkpoints / 'step-00000002'} at step 2" in " ".join(resumed.stderr.split())
    _assert_uninterrupted(run, ddp_reference, "ddp")


# --- eval sts with its embedding cache ----------------------------------------------------------


def eval_arguments(model: Path, data: Path, cache: Path, output: Path) -> list[str]:
    return [
        "eval", "sts", "--model", str(model), "--data-dir", str(data), "--task", "stsb", "--task", "sts12",
        "--cache-dir", str(cache), "--output", str(output), "--batch-size", "1", "--precision", "no",
    ]  # fmt: skip


def _scores(output: Path) -> tuple[list, str]:
    """(every task's results, the embedding fingerprint) of an eval JSON."""
    model = json.loads(output.read_text())["models"][0]
    return model["results"], model["embedding"]["fingerprint"]


@pytest.fixture(scope="module")
def evaluated(workspace: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, tuple[list, str], int]:
    """The data, the scores of an uninterrupted ``eval sts`` and the number of texts it encoded."""
    root = tmp_path_factory.mktemp("eval")
    data = make_data(root / "data")
    run_cli(*eval_arguments(workspace / "model", data, root / "cache", root / "sts.json"))
    encoded = json.loads((root / "sts.json").read_text())["models"][0]["embedding"]["encoded"]
    assert encoded > 2 * 16  # more than two cache parts (16 texts each at --batch-size 1)
    return data, _scores(root / "sts.json"), encoded


EVAL_POINTS = [
    pytest.param(Pause("os.replace", r"-> .*/cache/\w+/part-[^/]+\.npz$", nth=2), 16, id="encoding-cache-part-2"),
    # Results are written to a staging file renamed into place: killed while it is written.
    pytest.param(Pause("open", r"/out/\.tmp-sts\.json$"), None, id="writing-results-json"),
]


@pytest.mark.parametrize("pause,cached", EVAL_POINTS)
def test_killed_eval_reruns_to_the_same_scores(
    workspace: Path, evaluated, tmp_path: Path, pause: Pause, cached: int | None
) -> None:
    data, reference, encoded = evaluated
    output = tmp_path / "out" / "sts.json"
    arguments = eval_arguments(workspace / "model", data, tmp_path / "cache", output)
    kill_at([*CLI, *arguments], pause, tmp_path)
    run_cli(*arguments)
    assert _scores(output) == reference
    embedding = json.loads(output.read_text())["models"][0]["embedding"]
    # What the killed run cached is used: one complete part, or every text.
    assert embedding["from_cache"] == (encoded if cached is None else cached)
    assert (tmp_path / "out" / "sts.md").is_file()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["sts.json", "sts.md"]  # no staging file left

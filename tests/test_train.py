"""``vascl-scale train`` end to end through the real CLI on CPU, with a tiny random BERT.

Every run is a subprocess with a timeout (``python -m vascl_scale train ...``); multi-process
runs go through accelerate's launcher with 2 ranks x 1 thread over gloo. Runs with the same
world size and seed must give the same weights whatever the engine (DDP, ZeRO-2, ZeRO-3,
two simulated nodes) and whether or not they were stopped and resumed.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file

from tests.processes import alive, group_alive
from tests.train_helpers import (
    REPO,
    WORDS,
    ZERO2,
    ZERO3,
    ZERO_OBJECTIVES,
    assert_no_unactionable_warnings,
    assert_same_weights,
    cli_env,
    run_train,
    train_command,
    write_config,
)
from vascl_scale.precision import precision_reason, train_precision

TEST_TEXTS = ["the cat runs quickly", "a big green house by the river", "music", "old man reads a new book"]


# The cached runs' train.chunk_size: per-device batch 8 in chunks of 3, 3 and 2.
CACHED_CHUNK = 3


@pytest.mark.e2e
def test_single_process_run_writes_a_complete_run_directory(workspace: Path, tmp_path: Path) -> None:
    config = write_config(workspace, tmp_path / "config.yaml")
    run = tmp_path / "run"
    result = run_train(
        config, run, "--set", "checkpoint.keep_last=1", "--set", "train.peak_tflops=2", "--set", "train.precision=auto"
    )
    assert "global contrastive batch 16 sentences = 1 ranks x 16 per device" in result.stderr
    # The precision and its reason, whichever this CPU resolves `auto` to.
    assert f"training in {precision_reason('auto', train_precision('auto'), 'cpu', 'train.precision')}" in result.stderr
    assert_no_unactionable_warnings(result)

    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["checkpoint"]["keep_last"] == 1 and saved["train"]["output_dir"] == str(run)
    records = [yaml.safe_load(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [r for r in records if "loss/loss" in r]
    assert [r["step"] for r in losses] == [2, 4]
    for record in losses:
        assert {"loss/simcse", "loss/neighbourhood", "loss/delta_norm", "sentences_per_second"} <= set(record)
        assert record["loss/delta_norm"] == pytest.approx(15.0, rel=1e-4)  # ||delta|| = eps
        assert record["tflops_per_device"] > 0 and record["mfu"] == pytest.approx(record["tflops_per_device"] / 2)
    assert [r["step"] for r in records if "stsb_dev_spearman" in r] == [2, 4]
    checkpoints = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert checkpoints == ["step-00000004"]  # keep_last = 1
    for export in ("best", "last", "final"):
        assert (run / export / "model.safetensors").is_file() and (run / export / "modules.json").is_file()
    # The head is saved beside the encoder, never inside its weights.
    assert not any(k.startswith("head") for k in load_file(str(run / "final" / "model.safetensors")))
    initial = load_file(str(workspace / "model" / "model.safetensors"))
    trained = load_file(str(run / "final" / "model.safetensors"))
    assert any(not torch.equal(initial[k], trained[k]) for k in initial if k in trained)


@pytest.mark.e2e
def test_export_loads_in_automodel_and_sentence_transformers_with_equal_embeddings(
    workspace: Path, ddp_reference: Path
) -> None:
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel, AutoTokenizer

    from vascl_scale.model import SentenceEncoder, mean_pool

    final = ddp_reference / "final"
    ours = SentenceEncoder.from_pretrained(final, head_dim=16).encode(TEST_TEXTS)
    st = SentenceTransformer(str(final), device="cpu").encode(TEST_TEXTS)
    np.testing.assert_allclose(st, ours, atol=1e-5, rtol=0)
    encoder = AutoModel.from_pretrained(str(final)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(final))
    batch = tokenizer(TEST_TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        pooled = mean_pool(encoder(**batch).last_hidden_state, batch["attention_mask"]).numpy()
    np.testing.assert_allclose(pooled, ours, atol=1e-5, rtol=0)
    assert not np.allclose(ours[0], ours[1], atol=1e-3)


@pytest.mark.e2e
def test_ddp_stopped_and_resumed_equals_an_uninterrupted_run(
    workspace: Path, tmp_path: Path, ddp_reference: Path
) -> None:
    # Data-loader worker processes on (the reference has none; the stream is the same): the
    # stream position must survive the restart too.
    config = write_config(workspace, tmp_path / "config.yaml", data={"num_workers": 1})
    run = tmp_path / "run"
    run_train(config, run, "--num-processes", "2", "--max-steps", "2")
    assert (run / "checkpoints" / "step-00000002" / "trainer_state.json").is_file()
    run_train(config, run, "--num-processes", "2", "--resume")
    assert_same_weights(run, ddp_reference, atol=0)


@pytest.mark.e2e
def test_two_ranks_train_from_prepared_shards(workspace: Path, tmp_path: Path) -> None:
    """data prepare -> WebDataset shards -> 2 ranks x 1 loader worker in exact mode."""
    shards = tmp_path / "shards"
    prepared = subprocess.run(
        [sys.executable, "-m", "vascl_scale", "data", "prepare", str(workspace / "train.txt"), "--output", str(shards),
         "--shard-size", "50"],
        cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert prepared.returncode == 0, prepared.stderr
    config = write_config(
        workspace,
        tmp_path / "config.yaml",
        data={"train": str(shards), "num_workers": 1, "mode": "exact"},
        eval={"every_steps": 0},
    )
    run = tmp_path / "run"
    result = run_train(config, run, "--num-processes", "2")
    assert_no_unactionable_warnings(result)  # nor from DDP ranks
    records = [yaml.safe_load(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    windows = [r for r in records if "data/samples" in r]
    # Every loss call takes 16 sentences from the shards: 2 and 4 steps read 32 and 64 in total.
    assert [(r["step"], r["data/samples"], r["data/corrupt_shards_skipped"]) for r in windows] == [
        (2, 32, 0),
        (4, 64, 0),
    ]
    assert (run / "final" / "model.safetensors").is_file()


@pytest.mark.e2e
def test_two_simulated_nodes_equal_two_local_processes(workspace: Path, tmp_path: Path, ddp_reference: Path) -> None:
    from vascl_scale.train.launch import free_port

    config = write_config(workspace, tmp_path / "config.yaml")
    port = str(free_port())
    nodes = [
        subprocess.Popen(
            train_command(
                config,
                tmp_path / "run",
                "--num-processes",
                "1",
                "--num-machines",
                "2",
                "--machine-rank",
                str(rank),
                "--main-process-ip",
                "127.0.0.1",
                "--main-process-port",
                port,
            ),  # fmt: skip
            cwd=REPO,
            env=cli_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    try:
        errors = [node.communicate(timeout=300)[1] for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    assert [node.returncode for node in nodes] == [0, 0], errors
    assert_same_weights(tmp_path / "run", ddp_reference)


def _worker_pids(launcher_pid: int) -> dict[int, int]:
    """rank -> pid of the training workers below a launcher process (from /proc)."""
    found: dict[int, int] = {}
    pending = [launcher_pid]
    while pending:
        pid = pending.pop()
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        pending.extend(int(c) for c in children)
        env = dict(item.split(b"=", 1) for item in environ if b"=" in item)
        if pid != launcher_pid and b"RANK" in env:
            found[int(env[b"RANK"])] = pid
    return found


def _start_endless_run(
    workspace: Path, tmp_path: Path, output: Path | None = None
) -> tuple[Path, Path, subprocess.Popen, dict[int, int]]:
    """A 2-rank run that checkpoints every 2 steps and never ends by itself, in its own session
    (as a terminal or scheduler starts it), its stdout and stderr into ``output`` if given;
    returns once its first checkpoint is complete."""
    config = write_config(
        workspace,
        tmp_path / "config.yaml",
        train={"max_steps": 100000, "log_every": 50},
        eval={"every_steps": 0},
        checkpoint={"every_steps": 2, "keep_last": 2},
    )
    run = tmp_path / "run"
    launcher = subprocess.Popen(
        train_command(config, run, "--num-processes", "2"),
        cwd=REPO,
        env=cli_env(),
        stdout=subprocess.DEVNULL if output is None else output.open("w"),
        stderr=subprocess.DEVNULL if output is None else subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 180
    while not list((run / "checkpoints").glob("step-*/trainer_state.json")):
        if time.monotonic() > deadline or launcher.poll() is not None:
            launcher.kill()
            raise AssertionError("no checkpoint appeared")
        time.sleep(0.2)
    workers = _worker_pids(launcher.pid)
    assert sorted(workers) == [0, 1]
    return config, run, launcher, workers


@pytest.mark.e2e
def test_sigkill_of_one_rank_ends_the_job_and_the_last_checkpoint_resumes(workspace: Path, tmp_path: Path) -> None:
    config, run, launcher, workers = _start_endless_run(workspace, tmp_path)
    try:
        os.kill(workers[1], signal.SIGKILL)
        killed_at = time.monotonic()
        returncode = launcher.wait(timeout=120)  # the other rank must not hang
    finally:
        launcher.kill()
    assert returncode != 0
    assert time.monotonic() - killed_at < 120
    for worker in workers.values():
        assert not Path(f"/proc/{worker}").exists() or "Z" in Path(f"/proc/{worker}/stat").read_text().split()[2]

    from vascl_scale.train.checkpoint import complete_checkpoints

    latest = complete_checkpoints(run)[-1]
    step = int(latest.name.split("-")[1])
    run_train(config, run, "--num-processes", "2", "--resume", "--max-steps", str(step + 2))
    assert (run / "checkpoints" / f"step-{step + 2:08d}" / "trainer_state.json").is_file()
    assert (run / "final" / "model.safetensors").is_file()


@pytest.mark.e2e
def test_ctrl_c_stops_every_rank_with_one_line_naming_the_checkpoint_kept(workspace: Path, tmp_path: Path) -> None:
    output = tmp_path / "output.txt"
    _, run, launcher, workers = _start_endless_run(workspace, tmp_path, output)
    try:
        before = len(output.read_text().splitlines())
        os.killpg(launcher.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends: the launcher's process group
        returncode = launcher.wait(timeout=120)
    finally:
        launcher.kill()
    assert returncode == 128 + signal.SIGINT
    for worker in workers.values():
        assert not Path(f"/proc/{worker}").exists() or "Z" in Path(f"/proc/{worker}/stat").read_text().split()[2]
    after = output.read_text().splitlines()[before:]
    # Steps may finish and checkpoints be saved until the signal arrives; then one error line.
    from vascl_scale.train.checkpoint import complete_checkpoints

    errors = [line for line in after if " ERROR " in line]
    assert errors == [f"{errors[0].split(' ERROR ')[0]} ERROR training in {run} stopped by SIGINT; the last complete "
                      f"checkpoint is {complete_checkpoints(run)[-1]} (continue with --resume)"], after  # fmt: skip
    assert not any("Traceback" in line or "signal" in line.lower() and " ERROR " not in line for line in after), after


@pytest.mark.e2e
def test_paired_shards_train_on_their_positives_and_augmenting_them_stops_before_any_worker(
    workspace: Path, tmp_path: Path
) -> None:
    from tests.data_helpers import make_paired_shards

    rng = random.Random(2)
    rows = [
        {column: " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) for column in ("anchor", "positive")}
        for _ in range(64)
    ]
    pairs = make_paired_shards(tmp_path / "pairs", rows, shard_size=16)
    config = write_config(workspace, tmp_path / "config.yaml", data={"train": str(pairs)}, eval={"every_steps": 0})
    result = run_train(config, tmp_path / "run", "--set", "objective=simcse", "--max-steps", "2")
    assert "4 shards (64 samples), columns anchor, positive" in result.stderr
    assert json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 2
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()
    failure = run_train(config, tmp_path / "refused", "--num-processes", "2", "--set", "data.augment=wdel", expect=2)
    assert f"data.augment makes each sample's positive from its anchor, and data.train {pairs} has" in " ".join(
        failure.stderr.split()
    )
    assert "launching" not in failure.stderr and not (tmp_path / "refused").exists()


@pytest.mark.e2e
def test_bad_input_fails_before_training_with_a_clear_message(workspace: Path, tmp_path: Path) -> None:
    config = write_config(workspace, tmp_path / "config.yaml")
    failure = run_train(config, tmp_path / "a", "--set", "loss.kk=3", expect=2)
    assert "unknown key loss.kk" in failure.stderr
    failure = run_train(config, tmp_path / "b", "--num-processes", "3", expect=2)
    assert "global_batch_size = 16 is not divisible by the world size 3" in failure.stderr
    failure = run_train(config, tmp_path / "c", "--set", "loss.k=15", expect=2)
    assert "loss.k must be < train.global_batch_size - 1 = 15" in failure.stderr
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    failure = run_train(config, blocker / "run", expect=2)
    assert "is not writable" in failure.stderr
    failure = run_train(config, tmp_path / "d", "--resume", expect=2)
    assert "no complete checkpoint" in failure.stderr
    # A model directory whose tokenizer lost its vocabulary (tokenizer_config.json alone).
    no_vocabulary = tmp_path / "model-without-vocabulary"
    shutil.copytree(workspace / "model", no_vocabulary)
    for name in ("tokenizer.json", "vocab.txt"):
        (no_vocabulary / name).unlink(missing_ok=True)
    failure = run_train(config, tmp_path / "e", "--set", f"model.path={no_vocabulary}", expect=2)
    assert "has no tokenizer vocabulary" in failure.stderr and not (tmp_path / "e" / "final").exists()
    # A dev file whose gold scores are all equal: Spearman is undefined, so no model can be selected.
    constant = tmp_path / "constant-dev.tsv"
    constant.write_text("sentence1\tsentence2\tscore\na b\tc d\t3.0\ne f\tg h\t3.0\n", encoding="utf-8")
    failure = run_train(config, tmp_path / "f", "--set", f"eval.stsb_dev={constant}", expect=2)
    assert f"eval.stsb_dev {constant}: every gold score is 3" in failure.stderr


def test_an_undefined_dev_score_never_selects_a_model(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A collapsed encoder (every similarity equal) gives Spearman NaN; taken as a score, NaN would
    # become the best and no later step could beat it.
    from accelerate.state import AcceleratorState

    from vascl_scale.config import load_config
    from vascl_scale.eval import sts
    from vascl_scale.train import trainer as trainer_module
    from vascl_scale.train.plan import make_plan

    monkeypatch.setattr(sts, "spearman_score", lambda encode, pairs: float("nan"))
    run = tmp_path / "run"
    config = load_config(write_config(workspace, tmp_path / "config.yaml"), [f"train.output_dir={run}"])
    try:
        trainer_module.build_trainer(make_plan(config)).fit()
    finally:
        AcceleratorState._reset_state(True)
    assert (run / "last").is_dir() and not (run / "best").exists()
    records = [
        json.loads(line, parse_constant=pytest.fail) for line in (run / "metrics.jsonl").read_text().splitlines()
    ]
    assert records and not any("stsb_dev_spearman" in record for record in records)


def test_each_evaluation_says_whether_it_is_a_new_best(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Dev scores 86.92, 87.03, 86.50: the second is a new best, the third is not."""
    import logging

    from accelerate.state import AcceleratorState

    from vascl_scale.config import load_config
    from vascl_scale.eval import sts
    from vascl_scale.train import trainer as trainer_module
    from vascl_scale.train.plan import make_plan

    scores = iter([86.92, 87.03, 86.50])
    monkeypatch.setattr(sts, "spearman_score", lambda encode, pairs: next(scores))
    run = tmp_path / "run"
    config = load_config(write_config(workspace, tmp_path / "config.yaml", checkpoint={"every_steps": 0}),
                         [f"train.output_dir={run}", "train.max_steps=6"])  # fmt: skip
    logger = logging.getLogger("vascl_scale")
    monkeypatch.setattr(logger, "propagate", True)  # the CLI's setup (another test) may have cut it off from caplog
    try:
        with caplog.at_level(logging.INFO, logger="vascl_scale"):
            result = trainer_module.build_trainer(make_plan(config)).fit()
    finally:
        AcceleratorState._reset_state(True)
    # In the full suite a line can reach caplog twice (another test's CLI logging set-up): the
    # wording is what is tested here, so each distinct line counts once, in order.
    lines = list(dict.fromkeys(r.getMessage() for r in caplog.records if "STS-B dev Spearman" in r.getMessage()))
    assert lines == [
        "step 2: STS-B dev Spearman 86.92, new best (the first evaluation)",
        "step 4: STS-B dev Spearman 87.03, new best (the previous best 86.92 at step 2)",
        "step 6: STS-B dev Spearman 86.50, best so far 87.03 at step 4",
    ]
    assert result.best_score == 87.03


@pytest.mark.e2e
def test_an_unset_variable_in_a_path_fails_once_in_the_launcher(workspace: Path, tmp_path: Path) -> None:
    config = write_config(workspace, tmp_path / "config.yaml", model={"path": "${VASCL_TEST_UNSET}/model"})
    failure = run_train(config, tmp_path / "a", "--num-processes", "2", expect=2)
    message = (
        "model.path = '${VASCL_TEST_UNSET}/model' uses the environment variable VASCL_TEST_UNSET, which is not set"
    )
    assert " ".join(failure.stderr.split()).count(message) == 1
    assert "launching" not in failure.stderr and not (tmp_path / "a" / "config.yaml").exists()  # no worker started
    failure = run_train(config, tmp_path / "b", "--set", "model.path=$VASCL_TEST_UNSET", expect=2)
    assert "model.path = '$VASCL_TEST_UNSET' uses the environment variable VASCL_TEST_UNSET" in failure.stderr


@pytest.mark.e2e
def test_paths_are_expanded_once_in_the_launcher_and_saved_as_written(workspace: Path, tmp_path: Path) -> None:
    written = {
        "model": {"path": "${VASCL_TEST_ROOT}/model", "head_dim": 16},
        "data": {"train": "$VASCL_TEST_ROOT/train.txt", "num_workers": 0},
        "eval": {"stsb_dev": "${VASCL_TEST_UNSET}/dev.tsv", "every_steps": 2},  # optional: off, one warning
    }
    config = write_config(workspace, tmp_path / "config.yaml", **written, train={"max_steps": 2})
    env = {"VASCL_TEST_ROOT": str(workspace), "VASCL_TEST_RUNS": str(tmp_path)}
    result = run_train(config, Path("$VASCL_TEST_RUNS/run"), "--num-processes", "2", env=env)
    run = tmp_path / "run"
    assert (run / "final" / "model.safetensors").is_file() and (run / "last" / "model.safetensors").is_file()
    # Workers log warnings too ("[rank 1] ..."): only the launcher expanded eval.stsb_dev.
    assert " ".join(result.stderr.split()).count("model selection on STS-B dev is off") == 1
    for saved_file in (run / "config.yaml", run / "checkpoints" / "step-00000002" / "config.yaml"):
        saved = yaml.safe_load(saved_file.read_text())
        assert saved["model"]["path"] == written["model"]["path"] and saved["data"]["train"] == written["data"]["train"]
        assert saved["eval"]["stsb_dev"] == written["eval"]["stsb_dev"]
        assert saved["train"]["output_dir"] == "$VASCL_TEST_RUNS/run"


@pytest.mark.e2e
def test_resume_refuses_a_changed_model_or_batch_and_a_reused_directory(workspace: Path, tmp_path: Path) -> None:
    config = write_config(workspace, tmp_path / "config.yaml", eval={"every_steps": 0})
    run = tmp_path / "run"
    run_train(config, run, "--max-steps", "2")
    failure = run_train(config, run, "--max-steps", "4", expect=2)
    assert "already holds checkpoints" in failure.stderr
    failure = run_train(config, run, "--max-steps", "4", "--resume", "--set", "model.head_dim=8", expect=2)
    assert "the config changes model.head_dim: 16 -> 8" in failure.stderr
    failure = run_train(config, run, "--max-steps", "4", "--resume", "--set", "train.global_batch_size=32", expect=2)
    assert "train.global_batch_size: 16 -> 32" in failure.stderr
    run_train(
        config, tmp_path / "other", "--max-steps", "4", "--resume-from", str(run / "checkpoints" / "step-00000002")
    )
    assert (tmp_path / "other" / "final" / "model.safetensors").is_file()


@pytest.mark.e2e
def test_resume_with_another_objective_or_data_columns_names_the_change_before_loading(
    workspace: Path, tmp_path: Path
) -> None:
    config = write_config(workspace, tmp_path / "config.yaml", "pairsupcon", eval={"every_steps": 0})
    run = tmp_path / "run"
    run_train(config, run, "--max-steps", "2")
    checkpoint = run / "checkpoints" / "step-00000002"
    assert json.loads((checkpoint / "trainer_state.json").read_text())["columns"] == ["anchor", "paired", "label"]
    # Another objective (its model has no pairwise classifier): named, on one process and from a launcher.
    for processes in ("1", "2"):
        failure = run_train(
            config, run, "--max-steps", "4", "--resume", "--objective", "vascl", "--num-processes", processes, expect=2
        )
        message = " ".join(failure.stderr.split())
        assert f"--resume {checkpoint}: the config changes objective: 'pairsupcon' -> 'vascl'" in message, message
        assert (
            "could not load checkpoint" not in message
            and "Unexpected key" not in message
            and "Traceback" not in message
        )
    # The same objective on data with other columns (triplets give no label): named too.
    failure = run_train(config, run, "--max-steps", "4", "--resume", "--set", f"data.train={workspace / 'triplets'}",
                        "--objective", "simcse_sup", expect=2)  # fmt: skip
    message = " ".join(failure.stderr.split())
    assert "objective: 'pairsupcon' -> 'simcse_sup'" in message
    assert (
        "data.train's columns change: anchor, paired, label -> anchor, positive, negative_0, negative_1" in message
    ), message
    run_train(config, run, "--max-steps", "4", "--resume")  # as written, it continues
    assert (run / "final" / "model.safetensors").is_file()


@pytest.mark.e2e
def test_simcse_objective_and_gradient_accumulation_in_the_same_loop(workspace: Path, tmp_path: Path) -> None:
    config = write_config(workspace, tmp_path / "config.yaml", eval={"every_steps": 0})
    result = run_train(
        config, tmp_path / "run", "--objective", "simcse", "--max-steps", "2", "--set", "train.grad_accum_steps=2"
    )
    assert "32 sentences per update, but each loss still sees only 16 (accumulation adds no negatives)" in result.stderr
    records = [yaml.safe_load(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["loss/loss"] == pytest.approx(records[-1]["loss/simcse"])
    assert "loss/neighbourhood" not in records[-1]


@pytest.mark.e2e
@pytest.mark.deepspeed
# ZeRO-2 stopped and resumed: the slow tier. In CI, ZeRO-2's step equals one process's
# (test_step_parity), its cached runs equal DDP's, one process resumes and refuses a tampered
# DeepSpeed state (test_deepspeed_with_one_process_...), and the GPU proof's dry run stops and
# resumes a 2-rank ZeRO-2 run.
@pytest.mark.slow
@pytest.mark.parametrize("objective", ZERO_OBJECTIVES)
def test_zero2_stopped_and_resumed_equals_ddp(workspace: Path, tmp_path: Path, ddp_references, objective: str) -> None:
    config = write_config(workspace, tmp_path / "config.yaml", objective)
    run = tmp_path / "run"
    first = run_train(config, run, "--num-processes", "2", "--deepspeed", ZERO2, "--max-steps", "2", timeout=420)
    assert_no_unactionable_warnings(first)  # from the launcher or either ZeRO-2 rank
    # Resuming reads DeepSpeed's files only after they pass the weights_only allowlist check.
    run_train(config, run, "--num-processes", "2", "--deepspeed", ZERO2, "--resume", timeout=300)
    assert (run / "checkpoints" / "step-00000004" / "pytorch_model").is_dir()
    assert_same_weights(run, ddp_references(objective))
    if objective != "vascl":  # the file check below does not depend on the objective: once is enough
        return

    # A DeepSpeed file holding anything but tensors and DeepSpeed's plain types is refused, even
    # when the file list of the checkpoint's marker is rewritten to match it.
    states = run / "checkpoints" / "step-00000004" / "pytorch_model" / "mp_rank_00_model_states.pt"
    payload = torch.load(states, weights_only=False)
    payload["ds_config"] = Path("an object weights_only refuses")
    torch.save(payload, states)
    _relist(states.parent.parent)
    failure = run_train(
        config, run, "--num-processes", "2", "--deepspeed", ZERO2, "--resume", "--max-steps", "6", expect=1
    )
    assert "mp_rank_00_model_states.pt cannot be loaded safely (UnpicklingError" in " ".join(failure.stderr.split())


def _relist(checkpoint: Path) -> None:
    """Rewrite a checkpoint's file list to match its files, as someone tampering with it would."""
    state_file = checkpoint / "trainer_state.json"
    state = json.loads(state_file.read_text())
    state["files"] = {name: (checkpoint / name).stat().st_size for name in state["files"]}
    state_file.write_text(json.dumps(state))


@pytest.mark.e2e
@pytest.mark.deepspeed
# The slow tier for every objective: in CI, the cached ZeRO-3 VaSCL run below is stopped and
# resumed and exports its consolidated shards, and cached ZeRO-3 PairSupCon exports its own.
@pytest.mark.slow
@pytest.mark.parametrize("objective", ZERO_OBJECTIVES)
def test_zero3_consolidates_its_shards_for_export_and_equals_ddp(
    workspace: Path, tmp_path: Path, ddp_references, objective: str
) -> None:
    # The DDP reference encodes in length buckets (train.length_buckets: auto is 4 there, 1 under
    # ZeRO-3): the same 4 here, so that both draw the same forwards.
    config = write_config(workspace, tmp_path / "config.yaml", objective, train={"length_buckets": 4})
    run = tmp_path / "run"
    run_train(config, run, "--num-processes", "2", "--deepspeed", ZERO3, "--max-steps", "2", timeout=420)
    run_train(config, run, "--num-processes", "2", "--deepspeed", ZERO3, "--resume", timeout=300)
    # ZeRO-3 reduces in another order than DDP: equal up to float32 rounding.
    assert_same_weights(run, ddp_references(objective), atol=1e-6)
    assert (run / "best" / "model.safetensors").is_file()


def test_non_finite_loss_stops_before_the_update_and_keeps_the_last_good_checkpoint(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from accelerate.state import AcceleratorState

    from vascl_scale.config import load_config
    from vascl_scale.train import trainer as trainer_module
    from vascl_scale.train.checkpoint import complete_checkpoints
    from vascl_scale.train.plan import make_plan
    from vascl_scale.train.step import NonFiniteLossError

    real_build_objective = trainer_module.build_objective
    calls = []

    def objective_with_a_nan_at_the_third_call(name, loss_config):
        objective = real_build_objective(name, loss_config)

        def call(*args, **kwargs):
            out = objective(*args, **kwargs)
            calls.append(len(calls) + 1)
            if len(calls) == 3:
                out.loss = out.loss * float("nan")
            return out

        call.model_flops, call.spec = objective.model_flops, objective.spec
        call.needs_text_hashes, call.needs_guide = objective.needs_text_hashes, objective.needs_guide
        return call

    monkeypatch.setattr(trainer_module, "build_objective", objective_with_a_nan_at_the_third_call)
    run = tmp_path / "run"
    config = load_config(
        write_config(workspace, tmp_path / "config.yaml", eval={"every_steps": 0}), [f"train.output_dir={run}"]
    )
    try:
        with pytest.raises(NonFiniteLossError, match="non-finite loss at step 3") as stopped:
            trainer_module.build_trainer(make_plan(config)).fit()
    finally:
        AcceleratorState._reset_state(True)
    assert [p.name for p in complete_checkpoints(run)] == ["step-00000002"]
    assert f"the last good checkpoint is {run / 'checkpoints' / 'step-00000002'}" in str(stopped.value)
    assert not (run / "final").exists()
    # A NaN before the first checkpoint: the message must not point at one that does not exist.
    calls.clear()
    early = tmp_path / "early"
    config = load_config(
        write_config(workspace, tmp_path / "early.yaml", eval={"every_steps": 0}, checkpoint={"every_steps": 5}),
        [f"train.output_dir={early}"],
    )
    try:
        with pytest.raises(NonFiniteLossError, match="no checkpoint had been written yet"):
            trainer_module.build_trainer(make_plan(config)).fit()
    finally:
        AcceleratorState._reset_state(True)


# --- checkpoint safety and completeness (no training: a stand-in for accelerate's state) ---


def test_the_log_names_unread_columns_and_the_first_dropped_partial_batch_once(
    workspace: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Shards with two hard negatives: SimCSE reads anchor and positive, and the log says the
    negatives are ignored; 40 rows per epoch at batch 16 drop 8 at each epoch's end, logged the
    first time only; supervised SimCSE then trains on all four columns."""
    import logging

    from accelerate.state import AcceleratorState

    from tests.data_helpers import make_paired_shards, paired_rows
    from vascl_scale.config import load_config
    from vascl_scale.train import trainer as trainer_module
    from vascl_scale.train.plan import make_plan

    shards = make_paired_shards(tmp_path / "quads", paired_rows(40, negatives=2), shard_size=10)
    config_path = write_config(workspace, tmp_path / "config.yaml", data={"train": str(shards)}, eval={"every_steps": 0},
                               train={"log_every": 1}, checkpoint={"every_steps": 0})  # fmt: skip
    logger = logging.getLogger("vascl_scale")
    captured = not logger.propagate  # the CLI's setup makes it non-propagating: hand caplog the records
    if captured:
        logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger="vascl_scale"):
            for objective, steps in (("simcse", 5), ("simcse_sup", 2)):
                overrides = [
                    f"objective={objective}",
                    f"train.max_steps={steps}",
                    f"train.output_dir={tmp_path / objective}",
                ]
                trainer_module.build_trainer(make_plan(load_config(config_path, overrides))).fit()
                AcceleratorState._reset_state(True)
    finally:
        if captured:
            logger.removeHandler(caplog.handler)
        AcceleratorState._reset_state(True)
    lines = [" ".join(record.getMessage().split()) for record in caplog.records]
    unread = [line for line in lines if "does not read" in line]
    assert unread == [
        "data: data.train has the column(s) negative_0, negative_1, which objective 'simcse' does not read: they are "
        "ignored (it reads anchor, positive); every column is read by 'simcse_sup'"
    ]
    drops = [line for line in lines if "samples dropped" in line]
    assert len(drops) == 1 and drops[0].startswith(
        "data: 8 samples dropped by step 3; rank 0 dropped 8 at the end of data epoch 0: the rows left at the end of a data "
        "epoch that do not fill a per-device batch of 16 are not trained on"
    ), drops
    records = [json.loads(line) for line in (tmp_path / "simcse" / "metrics.jsonl").read_text().splitlines()]
    assert [r["data/samples_dropped"] for r in records] == [0, 0, 8, 8, 16]  # epochs 0 and 1 ended by step 5
    assert (
        "the encoder forwards of a loss call hold the activations of 64 sentences (4 views of 16), "
        "in 4 length-sorted forwards" in lines
    )
    supervised = [json.loads(line) for line in (tmp_path / "simcse_sup" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in supervised] == [1, 2] and all(math.isfinite(r["loss/simcse_sup"]) for r in supervised)


class _OneProcessAccelerator:
    """What save_checkpoint needs of an Accelerator: one process writing model-like files."""

    is_main_process = True
    process_index = 0

    def wait_for_everyone(self) -> None:
        pass

    def save_state(self, directory: str) -> None:
        from safetensors.torch import save_file

        save_file({"weight": torch.arange(64.0)}, str(Path(directory) / "model.safetensors"))
        torch.save({"state": {0: {"exp_avg": torch.ones(8)}}}, Path(directory) / "optimizer.bin")


def _save(run: Path, step: int, keep_last: int = 5) -> Path:
    from vascl_scale.config import config_from_dict
    from vascl_scale.train.checkpoint import TrainerState, save_checkpoint

    config = config_from_dict({"model": {"path": "m"}, "data": {"train": "t"}, "train": {"global_batch_size": 64}})
    state = TrainerState(step=step, world_size=1, scheduler={})
    return save_checkpoint(_OneProcessAccelerator(), run, config, state, {"epoch": 0}, keep_last)


def test_resume_compares_the_paths_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vascl_scale.config import config_from_dict
    from vascl_scale.train.checkpoint import TrainerState, check_resume_compatible, save_checkpoint
    from vascl_scale.train.plan import resolve_paths

    def config(model_path: str):
        data = {"model": {"path": model_path}, "data": {"train": "t"}, "train": {"global_batch_size": 64}}
        return resolve_paths(config_from_dict({**data, "eval": {"every_steps": 0}}))

    monkeypatch.setenv("VASCL_TEST_ROOT", str(tmp_path))
    state = TrainerState(step=1, world_size=1, scheduler={})
    checkpoint = save_checkpoint(_OneProcessAccelerator(), tmp_path / "run", config("$VASCL_TEST_ROOT/m"), state, {}, 5)
    saved_file = checkpoint / "config.yaml"
    assert yaml.safe_load(saved_file.read_text())["model"]["path"] == "$VASCL_TEST_ROOT/m"
    check_resume_compatible(checkpoint, config("$VASCL_TEST_ROOT/m"), 1, ("anchor",), "ddp")
    with pytest.raises(ValueError, match=rf"model.path: '\$VASCL_TEST_ROOT/m' -> '{tmp_path}/m'"):
        check_resume_compatible(checkpoint, config(f"{tmp_path}/m"), 1, ("anchor",), "ddp")
    # A config.yaml saved with the paths expanded (before they were saved as written) still matches.
    saved_file.write_text(saved_file.read_text().replace("$VASCL_TEST_ROOT", str(tmp_path)))
    check_resume_compatible(checkpoint, config("$VASCL_TEST_ROOT/m"), 1, ("anchor",), "ddp")


class _RunsCode:
    """A pickle that runs a shell command when unpickled without weights_only."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def test_a_kill_while_a_checkpoint_is_replaced_leaves_the_older_ones_resumable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vascl_scale.train import checkpoint as ckpt

    run = tmp_path / "run"
    _save(run, 1)
    _save(run, 2)
    real_rmtree = shutil.rmtree

    def killed_inside_rmtree(path, *args, **kwargs):
        (Path(path) / "model.safetensors").unlink()  # the kill lands after the weights went
        raise KeyboardInterrupt

    monkeypatch.setattr(ckpt.shutil, "rmtree", killed_inside_rmtree)
    with pytest.raises(KeyboardInterrupt):
        _save(run, 2)  # the same step saved again replaces step-2
    monkeypatch.setattr(ckpt.shutil, "rmtree", real_rmtree)
    assert [p.name for p in ckpt.complete_checkpoints(run)] == ["step-00000001"]
    assert ckpt.resolve_resume("latest", run).name == "step-00000001"
    _save(run, 3)  # the next save clears what the killed one left
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-00000001", "step-00000003"]


def test_resume_skips_a_checkpoint_whose_files_are_gone_and_names_what_is_missing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from vascl_scale.train import checkpoint as ckpt

    run = tmp_path / "run"
    _save(run, 1)
    broken = _save(run, 2)
    (broken / "model.safetensors").unlink()  # trainer_state.json is still there
    with caplog.at_level("WARNING"):
        assert ckpt.resolve_resume("latest", run).name == "step-00000001"
    assert "skipping incomplete checkpoint" in caplog.text and "model.safetensors is missing" in caplog.text
    with pytest.raises(ValueError, match=r"model.safetensors is missing.*--resume-from .*step-00000001"):
        ckpt.resolve_resume(str(broken), run)
    truncated = _save(run, 3)
    data = (truncated / "optimizer.bin").read_bytes()
    (truncated / "optimizer.bin").write_bytes(data[: len(data) // 2])
    assert ckpt.resolve_resume("latest", run).name == "step-00000001"
    with pytest.raises(ValueError, match=r"optimizer.bin has \d+ bytes, not the \d+ it was written with"):
        ckpt.resolve_resume(str(truncated), run)


def test_symlinks_out_of_a_checkpoint_and_code_carrying_pickles_are_refused_before_any_load(tmp_path: Path) -> None:
    from vascl_scale.train.checkpoint import verify_checkpoint_files

    run = tmp_path / "run"
    _save(run, 1)
    checkpoint = _save(run, 2)
    verify_checkpoint_files(checkpoint)  # what save_checkpoint writes passes
    marker = tmp_path / "code-ran"
    # The attack of the issue: DeepSpeed's model directory replaced by a symlink to a directory
    # whose mp_rank_00_model_states.pt runs a command when DeepSpeed unpickles it.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    torch.save({"module": _RunsCode(f"touch {marker}")}, elsewhere / "mp_rank_00_model_states.pt")
    (checkpoint / "pytorch_model").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(
        ValueError, match=r"pytorch_model is a symlink to .*elsewhere, outside the checkpoint.*step-00000001"
    ):
        verify_checkpoint_files(checkpoint)
    (checkpoint / "pytorch_model").unlink()
    # The same file inside the checkpoint, and a symlink that stays inside, are opened weights-only.
    (checkpoint / "pytorch_model").mkdir()
    shutil.move(str(elsewhere / "mp_rank_00_model_states.pt"), checkpoint / "pytorch_model")
    (checkpoint / "inner-link").symlink_to(checkpoint / "pytorch_model", target_is_directory=True)
    with pytest.raises(ValueError, match=r"mp_rank_00_model_states.pt cannot be loaded safely \(UnpicklingError"):
        verify_checkpoint_files(checkpoint)
    assert not marker.exists()


def test_truncated_checkpoint_files_are_refused_with_the_file_and_the_previous_checkpoint(tmp_path: Path) -> None:
    from vascl_scale.train.checkpoint import STATE_FILE, TrainerState, verify_checkpoint_files

    run = tmp_path / "run"
    _save(run, 1)
    checkpoint = _save(run, 2)
    weights = checkpoint / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-40])
    with pytest.raises(
        ValueError, match=r"model.safetensors cannot be loaded safely \(SafetensorError.*--resume-from .*step-00000001"
    ):
        verify_checkpoint_files(checkpoint)
    state = checkpoint / STATE_FILE
    state.write_text(state.read_text()[:30])
    with pytest.raises(ValueError, match=rf"{STATE_FILE} is unreadable or incomplete"):
        TrainerState.from_file(state)


@pytest.mark.e2e
@pytest.mark.deepspeed
def test_deepspeed_with_one_process_trains_resumes_and_refuses_a_symlinked_model_state(
    workspace: Path, tmp_path: Path
) -> None:
    config = write_config(workspace, tmp_path / "config.yaml", eval={"every_steps": 0})
    run = tmp_path / "run"
    first = run_train(config, run, "--deepspeed", ZERO2, "--max-steps", "2", timeout=420)
    assert_no_unactionable_warnings(first)
    checkpoint = run / "checkpoints" / "step-00000002"
    assert (checkpoint / "pytorch_model" / "mp_rank_00_model_states.pt").is_file()
    attacked = tmp_path / "attacked"
    shutil.copytree(run, attacked)
    # The attack on a real ZeRO-2 checkpoint: DeepSpeed's directory replaced by a
    # symlink to one whose model states run a command when unpickled with weights_only=False.
    model_states = attacked / "checkpoints" / "step-00000002" / "pytorch_model"
    evil = tmp_path / "evil"
    shutil.move(str(model_states), evil)
    marker = tmp_path / "code-ran"
    torch.save({"module": _RunsCode(f"touch {marker}")}, evil / "mp_rank_00_model_states.pt")
    model_states.symlink_to(evil, target_is_directory=True)
    _relist(model_states.parent)  # the attacker rewrites the file list too
    failure = run_train(config, attacked, "--deepspeed", ZERO2, "--resume", "--max-steps", "3", timeout=300, expect=2)
    assert "outside the checkpoint directory" in failure.stderr and not marker.exists()
    run_train(
        config, run, "--deepspeed", ZERO2, "--resume", "--max-steps", "3", timeout=300
    )  # DeepSpeed's own files pass
    assert (run / "checkpoints" / "step-00000003" / "trainer_state.json").is_file()


@pytest.mark.e2e
def test_workers_die_with_a_killed_launcher_and_a_run_directory_holds_one_run(workspace: Path, tmp_path: Path) -> None:
    config, run, launcher, workers = _start_endless_run(workspace, tmp_path)
    try:
        second = run_train(config, run, "--num-processes", "2", "--resume", timeout=120, expect=2)
        assert f"run directory {run} is in use by another run (pid {launcher.pid}" in second.stderr
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=30)
        deadline = time.monotonic() + 30
        while any(alive(pid) for pid in workers.values()):
            assert time.monotonic() < deadline, f"workers {workers} outlived their launcher"
            time.sleep(0.2)
    finally:
        for pid in [launcher.pid, *workers.values()]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    from vascl_scale.train.checkpoint import complete_checkpoints

    step = int(complete_checkpoints(run)[-1].name.split("-")[1])  # the dead run's lock is gone
    run_train(config, run, "--num-processes", "2", "--resume", "--max-steps", str(step + 1))
    assert (run / "final" / "model.safetensors").is_file()


@pytest.mark.e2e
def test_a_pipe_source_that_never_gives_data_stops_the_run_naming_the_command(workspace: Path, tmp_path: Path) -> None:
    config = write_config(workspace, tmp_path / "config.yaml", eval={"every_steps": 0})
    started = time.monotonic()
    failure = run_train(
        config,
        tmp_path / "run",
        "--set", f"data.train=pipe:sleep 3600; cat {workspace / 'train.txt'}",
        "--set", "data.allow_pipe=true",
        "--set", "data.pipe_timeout=2",
        timeout=120,
        expect=2,
    )  # fmt: skip
    assert time.monotonic() - started < 90
    assert "stalled" in failure.stderr and "sleep 3600" in failure.stderr and "Traceback" not in failure.stderr


@pytest.mark.e2e
@pytest.mark.parametrize("workers", [0, 1])
def test_sigterm_stops_a_run_reading_a_pipe_and_kills_the_command(
    workspace: Path, tmp_path: Path, workers: int
) -> None:
    """SIGTERM (a scheduler's stop) ends the run as Ctrl-C does: one line naming what was kept,
    exit 143, and the pipe: command, which runs in a session of its own, killed with its group,
    whether the trainer or a loader worker runs it."""
    config = write_config(workspace, tmp_path / "config.yaml", eval={"every_steps": 0}, data={"num_workers": workers})
    run, pid_file, log = tmp_path / "run", tmp_path / "command.pid", tmp_path / "output.txt"
    # Output to a file, not a pipe: a surviving command would hold a pipe open after the trainer is gone.
    trainer = subprocess.Popen(
        train_command(config, run, "--set", f"data.train=pipe:echo $$ > {pid_file}; sleep 1000", "--set", "data.allow_pipe=true"),
        cwd=REPO, env=cli_env(), stdout=subprocess.DEVNULL, stderr=log.open("w"),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (pid_file.is_file() and pid_file.read_text().strip()):
            assert time.monotonic() < deadline and trainer.poll() is None, "the pipe command never started"
            time.sleep(0.1)
        group = int(pid_file.read_text())
        reader = int(Path(f"/proc/{group}/stat").read_text().rsplit(")", 1)[1].split()[1])  # trainer or loader worker
        trainer.send_signal(signal.SIGTERM)
        trainer.wait(timeout=60)
    finally:
        trainer.kill()
    stderr = log.read_text()

    deadline = time.monotonic() + 10
    while (group_alive(group) or alive(reader)) and time.monotonic() < deadline:
        time.sleep(0.1)
    command_alive, reader_alive = group_alive(group), alive(reader)
    if command_alive:
        os.killpg(group, signal.SIGKILL)
    if reader_alive:
        os.kill(reader, signal.SIGKILL)
    assert not command_alive, "the pipe command outlived the stopped run"
    assert not reader_alive, f"the process reading the pipe (pid {reader}) outlived the stopped run"
    assert trainer.returncode == 128 + signal.SIGTERM, stderr
    errors = [line.split(" ERROR ", 1)[1] for line in stderr.splitlines() if " ERROR " in line]
    assert errors == [f"training in {run} stopped by SIGTERM; no checkpoint had been saved yet"], stderr
    assert "Traceback" not in stderr


@pytest.mark.e2e
def test_a_pipe_that_writes_text_instead_of_tar_stops_the_run_naming_the_command(
    workspace: Path, tmp_path: Path
) -> None:
    config = write_config(workspace, tmp_path / "config.yaml", eval={"every_steps": 0})
    command = f"cat {workspace / 'train.txt'}"
    failure = run_train(
        config,
        tmp_path / "run",
        "--set",
        f"data.train=pipe:{command}",
        "--set",
        "data.allow_pipe=true",
        timeout=120,
        expect=2,
    )
    errors = [line.split(" ERROR ", 1)[1] for line in failure.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and f"pipe:{command}" in errors[0] and "tar" in errors[0], failure.stderr
    assert "Traceback" not in failure.stderr


@pytest.mark.e2e
def test_a_resumed_run_logs_each_step_once_in_its_metrics(workspace: Path, tmp_path: Path) -> None:
    """A run killed after logging steps past its last checkpoint (per-step saves) left their records in
    metrics.jsonl, the last one cut mid-line: the resumed run drops them and logs those steps anew."""
    config = write_config(
        workspace,
        tmp_path / "config.yaml",
        eval={"every_steps": 0},
        train={"log_every": 1},
        checkpoint={"every_steps": 1},
    )
    run = tmp_path / "run"
    run_train(config, run, "--max-steps", "2")
    with (run / "metrics.jsonl").open("a", encoding="utf-8") as handle:
        handle.write(json.dumps({"step": 3, "loss/loss": 1.0}) + "\n" + '{"step": 4, "loss/lo')
    result = run_train(config, run, "--resume", "--max-steps", "4")
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert records[2]["loss/loss"] != 1.0  # step 3 of the resumed run, not the killed one's
    assert "dropped 2 records of metrics.jsonl past step 2" in " ".join(result.stderr.split())


@pytest.fixture(scope="session")
def ddp_cached_reference(ddp_references) -> Path:
    """The cached VaSCL run of :func:`ddp_references`."""
    return ddp_references("vascl", CACHED_CHUNK)


@pytest.mark.e2e
def test_a_cached_run_stopped_and_resumed_equals_an_uninterrupted_one(
    workspace: Path, tmp_path: Path, ddp_cached_reference: Path
) -> None:
    config = write_config(workspace, tmp_path / "config.yaml", train={"chunk_size": CACHED_CHUNK})
    run = tmp_path / "run"
    run_train(config, run, "--num-processes", "2", "--max-steps", "2")
    run_train(config, run, "--num-processes", "2", "--resume")
    assert_same_weights(run, ddp_cached_reference, atol=0)


# ZeRO-2 on PairSupCon in the slow tier: ZeRO-2 on VaSCL and ZeRO-3 on PairSupCon stay in CI.
# ZeRO-3 on VaSCL is stopped after 2 steps and resumed (ZeRO-3's resume in CI).
CACHED_ZERO_CASES = [
    pytest.param("zero2", "pairsupcon", None, marks=pytest.mark.slow, id="zero2-pairsupcon"),
    *(
        pytest.param(z, o, stop, id=f"{z}-{o}")
        for z, o, stop in [("zero2", "vascl", None), ("zero3", "vascl", 2), ("zero3", "pairsupcon", None)]
    ),
]


@pytest.mark.e2e
@pytest.mark.deepspeed
@pytest.mark.parametrize("zero, objective, stop_at", CACHED_ZERO_CASES)
def test_cached_zero_runs_equal_the_cached_ddp_run(
    workspace: Path, tmp_path: Path, ddp_references, zero: str, objective: str, stop_at: int | None
) -> None:
    config = write_config(workspace, tmp_path / "config.yaml", objective, train={"chunk_size": CACHED_CHUNK})
    run = tmp_path / "run"
    deepspeed = ZERO2 if zero == "zero2" else ZERO3
    if stop_at is not None:
        run_train(config, run, "--num-processes", "2", "--deepspeed", deepspeed, "--max-steps", str(stop_at))
        run_train(config, run, "--num-processes", "2", "--deepspeed", deepspeed, "--resume", timeout=420)
        assert (run / "best" / "model.safetensors").is_file()  # evaluated with every rank encoding its shards
    else:
        run_train(config, run, "--num-processes", "2", "--deepspeed", deepspeed, timeout=420)
    # 7 backwards per loss call (5 for PairSupCon's two columns), reduced in DeepSpeed's order:
    # equal up to float32 rounding.
    assert_same_weights(run, ddp_references(objective, CACHED_CHUNK), atol=2e-6)


@pytest.mark.e2e
def test_both_objectives_train_on_explicitly_augmented_pairs(workspace: Path, tmp_path: Path) -> None:
    config = write_config(workspace, tmp_path / "config.yaml", eval={"every_steps": 0})
    for objective in ("vascl", "simcse"):
        result = run_train(
            config, tmp_path / objective, "--objective", objective, "--max-steps", "2",
            "--set", "data.augment=wdel", "--set", "data.augment_fraction=0.2",
        )  # fmt: skip
        assert "wdel augmentation of 0.2 of the words, second view(s)" in result.stderr
        records = [yaml.safe_load(line) for line in (tmp_path / objective / "metrics.jsonl").read_text().splitlines()]
        assert records[-1]["step"] == 2 and math.isfinite(records[-1]["loss/loss"])


# ------------------------------------------------------------------ FSDP2 (--fsdp): stopped, resumed,
# exported and refused, against the DDP runs of ddp_references (shared with the ZeRO runs above).
# tests/test_fsdp.py proves its step on launched gloo ranks.

FULL_SHARD = str(REPO / "configs" / "fsdp" / "full-shard.yaml")
SHARD_GRAD_OP = str(REPO / "configs" / "fsdp" / "shard-grad-op.yaml")

# (objective, chunk size, FSDP2 file): the CI tier runs VaSCL and PairSupCon cached (PairSupCon under
# shard_grad_op, whose export and checkpoint checks follow); the slow tier the six other cases.
# tests/test_fsdp.py runs all eight on launched gloo ranks in float64 in CI.
CI_CASES = [("vascl", CACHED_CHUNK, FULL_SHARD), ("pairsupcon", CACHED_CHUNK, SHARD_GRAD_OP)]
SLOW_CASES = [
    ("simcse", 0, FULL_SHARD),
    ("simcse_sup", 0, FULL_SHARD),
    ("simcse", CACHED_CHUNK, FULL_SHARD),
    ("simcse_sup", CACHED_CHUNK, FULL_SHARD),
    ("vascl", 0, FULL_SHARD),
    ("pairsupcon", 0, FULL_SHARD),
]


def _case_id(objective: str, chunk_size: int, fsdp: str) -> str:
    return f"{objective}-{'cached' if chunk_size else 'uncached'}-{Path(fsdp).stem}"


CASES = [
    *(pytest.param(*case, id=_case_id(*case)) for case in CI_CASES),
    *(pytest.param(*case, id=_case_id(*case), marks=pytest.mark.slow) for case in SLOW_CASES),
]


@pytest.mark.e2e
@pytest.mark.parametrize("objective, chunk_size, fsdp", CASES)
def test_fsdp2_stopped_and_resumed_equals_ddp(
    workspace: Path, tmp_path: Path, ddp_references, objective: str, chunk_size: int, fsdp: str
) -> None:
    # The DDP reference encodes in 4 length buckets (train.length_buckets: auto under DDP); auto is 1
    # under full_shard, so the same 4 here, that both draw the same forwards.
    config = write_config(
        workspace, tmp_path / "config.yaml", objective, train={"chunk_size": chunk_size, "length_buckets": 4}
    )
    run, strategy = tmp_path / "run", Path(fsdp).stem.replace("-", "_")
    first = run_train(config, run, "--num-processes", "2", "--fsdp", fsdp, "--max-steps", "2", timeout=420)
    assert_no_unactionable_warnings(first)
    assert f"FSDP2 {strategy} over 2 ranks: 3 units (BertEmbeddings, BertLayer)" in first.stderr
    run_train(config, run, "--num-processes", "2", "--fsdp", fsdp, "--resume", timeout=300)
    checkpoint = run / "checkpoints" / "step-00000004"
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    assert state["engine"] == "fsdp" and {"fsdp/.metadata", "fsdp/__0_0.distcp", "fsdp/__1_0.distcp"} <= set(
        state["files"]
    )
    # FSDP2 reduce-scatters where DDP all-reduces: equal up to float32 rounding. The export is the
    # whole model (every tensor of DDP's, at its full shape), gathered from both ranks' shards.
    assert_same_weights(run, ddp_references(objective, chunk_size), atol=2e-6 if chunk_size else 1e-6)
    summary = json.loads((run / "run_summary.json").read_text())
    assert summary["engine"] == "fsdp" and summary["resumed_at_step"] == 2
    assert summary["fsdp"]["sharding_strategy"] == strategy
    if (objective, chunk_size, fsdp) == CI_CASES[-1]:  # once: they do not depend on the objective
        _assert_the_export_loads_everywhere(run / "final", strategy)
        _assert_a_tampered_metadata_is_refused(config, run, checkpoint, fsdp)


def _assert_the_export_loads_everywhere(final: Path, strategy: str) -> None:
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel

    from vascl_scale.model import SentenceEncoder

    assert json.loads((final / "config.json").read_text())["architectures"] == ["BertModel"]  # not FSDP2's class
    assert f"FSDP2 {strategy}, 2 processes" in (final / "README.md").read_text()
    texts = ["the cat runs quickly", "a big green house by the river"]
    ours = SentenceEncoder.from_pretrained(str(final)).encode(texts, batch_size=2, max_length=32)
    theirs = SentenceTransformer(str(final), device="cpu").encode(texts, convert_to_numpy=True)
    assert torch.allclose(torch.as_tensor(ours), torch.as_tensor(theirs), atol=1e-5)
    AutoModel.from_pretrained(str(final))


def _assert_a_tampered_metadata_is_refused(config: Path, run: Path, checkpoint: Path, fsdp: str) -> None:
    """A DCP .metadata naming a global outside DCP's types, its file list rewritten to match: refused
    before DCP unpickles it."""
    metadata_file = checkpoint / "fsdp" / ".metadata"
    metadata = pickle.loads(metadata_file.read_bytes())
    metadata.planner_data = {"payload": __import__("collections").Counter()}
    metadata_file.write_bytes(pickle.dumps(metadata))
    state_file = checkpoint / "trainer_state.json"
    state = json.loads(state_file.read_text())
    state["files"] = {name: (checkpoint / name).stat().st_size for name in state["files"]}
    state_file.write_text(json.dumps(state))
    failure = run_train(config, run, "--num-processes", "2", "--fsdp", fsdp, "--resume", "--max-steps", "6", expect=1)
    message = " ".join(failure.stderr.split())
    assert ".metadata cannot be loaded safely (UnpicklingError: a DCP .metadata may not name collections.Counter)" in (
        message
    ), message[-3000:]


@pytest.mark.e2e
def test_bad_engine_choices_are_refused_before_any_worker_starts(
    workspace: Path, tmp_path: Path, ddp_references
) -> None:
    config = write_config(workspace, tmp_path / "config.yaml")
    unknown = tmp_path / "zero3.yaml"
    unknown.write_text("sharding_strategy: zero3\n", encoding="utf-8")
    refusals = {
        "unknown strategy": (
            ["--fsdp", str(unknown)],
            f"--fsdp {unknown}: sharding_strategy must be one of 'full_shard', 'shard_grad_op', 'hybrid_shard'; got 'zero3'",
        ),
        "two engines": (["--fsdp", FULL_SHARD, "--deepspeed", ZERO2], "name two engines; pass one of them"),
        # A DDP run's checkpoint: its layout is accelerate's, not DCP's.
        "another engine's checkpoint": (
            [
                "--fsdp",
                FULL_SHARD,
                "--resume-from",
                str(ddp_references("vascl", CACHED_CHUNK) / "checkpoints" / "step-00000002"),
            ],
            "it was written by the DDP engine and this run uses FSDP2; their checkpoints differ in layout, "
            "so resume with the engine that wrote it (neither --deepspeed nor --fsdp)",
        ),
    }
    for case, (options, message) in refusals.items():
        failure = run_train(config, tmp_path / case.replace(" ", "-"), "--num-processes", "2", *options, expect=2)
        text = " ".join(failure.stderr.split())
        assert message in text, f"{case}: {text[-2000:]}"
        assert "rank 0" not in text and "Traceback" not in text, f"{case}: a worker started"

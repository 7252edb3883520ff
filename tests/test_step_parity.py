"""Many ranks = one device for the whole training step, not only the loss.

One fixed sequence of global batches (dropout off, the same seed) goes through the trainer's
own :class:`TrainingStep` (objective from the registry, accelerator and optimiser from the
trainer's factories) on W = 1, 2 and 4 gloo ranks under DDP, each rank taking its rows, and on
2 ranks under DeepSpeed ZeRO-2. After a few optimiser steps every engine must hold the weights
of the one-process run: in float64 for DDP, in float32 within a stated tolerance for ZeRO-2
(DeepSpeed keeps float32 master weights and reduces in its own order).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.gloo import run_as_launched
from tests.tiny import tiny_encoder, token_batch

GLOBAL_BATCH = 8
SEQ_LEN = 6
STEPS = 3
ZERO2 = str(Path(__file__).resolve().parents[1] / "configs" / "deepspeed" / "zero2.json")


def _config(objective: str):
    from vascl_scale.config import config_from_dict

    return config_from_dict(
        {
            "objective": objective,
            "model": {"path": "tiny", "head_dim": 8},
            "data": {"train": "fixed batches"},
            # xi and eps near the tiny model's embedding norm; 2 power iterations.
            "loss": {"k": 3, "temperature": 0.1, "xi": 1.0, "eps": 1.0, "power_iters": 2},
            # A large learning rate, so that the steps move the weights measurably.
            "optim": {"lr": 1e-2, "head_lr": 1e-2},
            "train": {"global_batch_size": GLOBAL_BATCH, "precision": "no", "seed": 5},
        }
    )


def train_steps(rank: int, world_size: int, objectives: tuple[str, ...], deepspeed: str | None, dtype: str) -> dict:
    """STEPS optimiser steps per objective on this rank's rows; rank 0 returns the weights."""
    from vascl_scale.losses import build_objective
    from vascl_scale.train.step import TrainingStep
    from vascl_scale.train.trainer import build_accelerator, build_optimizer, prepare_for_training

    rows = GLOBAL_BATCH // world_size
    own = slice(rank * rows, (rank + 1) * rows)
    weights = {}
    for objective in objectives:
        config = _config(objective)
        model = tiny_encoder(seed=0, dtype=getattr(torch, dtype), head_dim=8)  # dropout 0: no masks to match
        accelerator = build_accelerator(config, deepspeed)
        prepared, prepared_optimizer = prepare_for_training(accelerator, model, build_optimizer(model, config), config)
        step = TrainingStep(
            accelerator, prepared, prepared_optimizer, build_objective(objective, config.loss),
            seed=config.train.seed, per_device_batch=rows,
        )  # fmt: skip
        for index in range(STEPS):
            ids, mask = token_batch(GLOBAL_BATCH, SEQ_LEN, seed=10 + index)  # the same global batch everywhere
            step(iter([{"input_ids": ids[own], "attention_mask": mask[own]}]), index)
        module = accelerator.unwrap_model(prepared)
        weights[objective] = {n: p.detach().double().numpy().copy() for n, p in module.named_parameters()}
    return weights if rank == 0 else {}


def _assert_same(got: dict, expected: dict, atol: float, what: str) -> None:
    assert sorted(got) == sorted(expected)
    moved = False
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], atol=atol, rtol=0, err_msg=f"{what}: {name}")
    initial = tiny_encoder(seed=0, dtype=torch.float64, head_dim=8)
    for name, parameter in initial.named_parameters():
        moved |= not np.allclose(parameter.detach().numpy(), expected[name], atol=1e-6)
    assert moved, "the steps did not change the weights: the comparison would prove nothing"


def test_ddp_on_2_and_4_ranks_ends_with_the_weights_of_one_process() -> None:
    objectives = ("vascl", "simcse")
    (reference,) = run_as_launched(train_steps, 1, objectives, None, "float64")
    for world_size in (2, 4):
        got = run_as_launched(train_steps, world_size, objectives, None, "float64")[0]
        for objective in objectives:
            _assert_same(got[objective], reference[objective], 1e-10, f"{objective}, DDP W={world_size}")


@pytest.mark.deepspeed
def test_zero2_on_2_ranks_ends_with_the_weights_of_one_process() -> None:
    (reference,) = run_as_launched(train_steps, 1, ("vascl",), None, "float32")
    got = run_as_launched(train_steps, 2, ("vascl",), ZERO2, "float32")[0]
    _assert_same(got["vascl"], reference["vascl"], 2e-5, "vascl, ZeRO-2 W=2")

"""Atomic, resumable checkpoints of a training run.

Layout of ``<run>/checkpoints/step-00000100/``:

- accelerate's state (``accelerator.save_state``): model and head (one module), optimiser
  and per-rank RNG states; under DeepSpeed the engine's (ZeRO-partitioned) checkpoint;
- ``data/rank-00000.pt``: each rank's position in its training stream;
- ``config.yaml``: the resolved config of the run that wrote it;
- ``trainer_state.json``: step, scheduler, best score, world size. Written last.

Every rank writes into ``checkpoints/.tmp-step-00000100``; after a barrier, rank 0 writes
``trainer_state.json`` and renames the directory. A directory named ``step-*`` is therefore
complete, and a run killed while saving leaves only a ``.tmp-*`` directory, which the next
save removes. Requires the run directory on a file system that every machine sees.

Loading is safe: accelerate reads its files with ``torch.load(weights_only=True)``; DeepSpeed
reads its own with ``weights_only=False``, so each rank first opens the DeepSpeed files it
will read with ``weights_only=True`` and a short allowlist of DeepSpeed's plain data types,
and refuses a checkpoint that holds anything else.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

from vascl_scale.config import RunConfig, save_config

logger = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
STATE_FILE = "trainer_state.json"
_NAME = re.compile(r"^step-(\d{8})$")


@dataclass
class TrainerState:
    """What the loop needs besides accelerate's state to continue exactly."""

    step: int  # optimiser steps completed
    world_size: int
    scheduler: dict[str, Any]
    best_score: float | None = None  # best STS-B dev Spearman x 100 so far
    best_step: int | None = None

    def to_json(self) -> str:
        return json.dumps(self.__dict__, indent=2)

    @classmethod
    def from_file(cls, path: Path) -> "TrainerState":
        return cls(**json.loads(path.read_text(encoding="utf-8")))


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}"


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _NAME.match(p.name) and (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: int(_NAME.match(p.name).group(1)))


def prepare_run_dir(run_dir: Path, resume: str | None) -> None:
    """Refuse to mix two runs in one directory."""
    if resume is None and complete_checkpoints(run_dir):
        raise ValueError(
            f"{run_dir} already holds checkpoints of a run; pass --resume to continue it or a new --output"
        )


def resolve_resume(target: str, run_dir: Path) -> Path:
    """``latest`` -> the newest complete checkpoint of ``run_dir``; a run dir -> its newest;
    a checkpoint dir -> itself."""
    candidate = Path(run_dir) if target == "latest" else Path(target)
    if (candidate / STATE_FILE).is_file():
        return candidate
    checkpoints = complete_checkpoints(candidate)
    if not checkpoints:
        raise ValueError(
            f"--resume: no complete checkpoint under {candidate / CHECKPOINTS} "
            "(a complete one is a step-* directory holding trainer_state.json)"
        )
    return checkpoints[-1]


def check_resume_compatible(checkpoint: Path, config: RunConfig, world_size: int) -> TrainerState:
    """The saved state, after checking that this run can continue it: same model, same batch, same world."""
    state = TrainerState.from_file(checkpoint / STATE_FILE)
    saved = yaml.safe_load((checkpoint / "config.yaml").read_text(encoding="utf-8"))
    current = config.to_dict()
    changed = [f"model.{key}" for key in current["model"] if saved["model"].get(key) != current["model"][key]]
    if saved["train"]["global_batch_size"] != current["train"]["global_batch_size"]:
        changed.append("train.global_batch_size")
    if changed:
        details = ", ".join(
            f"{key}: {_lookup(saved, key)!r} -> {_lookup(current, key)!r}" for key in changed
        )
        raise ValueError(
            f"--resume {checkpoint}: the config changes {details}; resume with the config the "
            "checkpoint was written with (its config.yaml), or start a new run with another --output"
        )
    if state.world_size != world_size:
        raise ValueError(
            f"--resume {checkpoint}: it was written by {state.world_size} processes and this run has "
            f"{world_size}; optimiser shards and data positions are per rank, so resume with "
            f"{state.world_size} processes"
        )
    return state


def _lookup(tree: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        tree = tree[part]
    return tree


def data_state_path(checkpoint: Path, rank: int) -> Path:
    return checkpoint / "data" / f"rank-{rank:05d}.pt"


def save_checkpoint(
    accelerator,
    run_dir: Path,
    config: RunConfig,
    state: TrainerState,
    data_state: dict[str, Any],
    keep_last: int,
) -> Path:
    """Write a complete checkpoint atomically (all ranks call this); returns its path."""
    root = Path(run_dir) / CHECKPOINTS
    final = root / checkpoint_name(state.step)
    staging = root / f".tmp-{final.name}"
    if accelerator.is_main_process:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".tmp-*"):  # left by a run killed while saving
            shutil.rmtree(stale, ignore_errors=True)
        staging.mkdir()
    accelerator.wait_for_everyone()
    accelerator.save_state(str(staging))
    path = data_state_path(staging, accelerator.process_index)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(data_state, path)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        save_config(config, staging / "config.yaml")
        (staging / STATE_FILE).write_text(state.to_json(), encoding="utf-8")
        if final.exists():  # the same step saved again (a resumed run that stopped there)
            shutil.rmtree(final)
        staging.rename(final)
        for old in complete_checkpoints(run_dir)[:-keep_last]:
            shutil.rmtree(old)
        logger.info("saved checkpoint %s", final)
    accelerator.wait_for_everyone()
    return final


# Plain data types that DeepSpeed pickles into its checkpoint files next to tensors.
def _deepspeed_safe_globals() -> list[Any]:
    import argparse
    import collections

    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [
        ZeroStageEnum,
        fragment_address,
        LossScaler,  # its attributes are numbers
        DynamicLossScaler,
        collections.OrderedDict,
        argparse.Namespace,
        set,
    ]


def verify_deepspeed_files(checkpoint: Path, rank: int) -> None:
    """Open the DeepSpeed files this rank will read with ``weights_only=True``; refuse others."""
    rank_marker = re.compile(r"zero_pp_rank_(\d+)_")
    for path in sorted(checkpoint.rglob("*.pt")):
        match = rank_marker.search(path.name)
        if path.parent.name == "data" or (match and int(match.group(1)) != rank):
            continue
        try:
            with torch.serialization.safe_globals(_deepspeed_safe_globals()):
                torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:  # an unpickling error names the offending global
            raise ValueError(
                f"refusing to load {path}: it holds objects outside the safe allowlist ({err})"
            ) from err


def load_checkpoint(accelerator, checkpoint: Path, deepspeed: bool) -> dict[str, Any]:
    """Restore accelerate's state from ``checkpoint``; returns this rank's data position."""
    if deepspeed:
        verify_deepspeed_files(checkpoint, accelerator.process_index)
    accelerator.load_state(str(checkpoint))
    return torch.load(data_state_path(checkpoint, accelerator.process_index), weights_only=True)

"""Atomic, resumable checkpoints of a training run, and safe loading of them.

Layout of ``<run>/checkpoints/step-00000100/``:

- accelerate's state (``accelerator.save_state``): model and head (one module), optimiser
  and per-rank RNG states; under DeepSpeed the engine's (ZeRO-partitioned) checkpoint;
  under FSDP2 instead ``fsdp/``, the model's and the optimiser's shards written by
  ``torch.distributed.checkpoint`` (DCP: a ``__<rank>_0.distcp`` per rank and a ``.metadata``;
  :mod:`vascl_scale.train.fsdp`). No RNG state is needed there: the step seeds every loss
  call's randomness from (seed, loss call, rank), and the data stream keeps its own position;
- ``data/rank-00000.pt``: each rank's position in its training stream;
- ``config.yaml``: the config of the run that wrote it, its paths as written;
- ``trainer_state.json``: step, scheduler, best score, world size, the engine that wrote it
  and the size of every other file of the checkpoint. Written last: it is the completion marker.

Every rank writes into ``checkpoints/.tmp-step-00000100``; after a barrier, rank 0 lists the
files, writes ``trainer_state.json`` and renames the directory. A checkpoint is deleted by
renaming it away (``.trash-*``) first, so a run killed while saving or deleting leaves only a
``.tmp-*`` or ``.trash-*`` directory, which the next save removes, and never a ``step-*``
directory with files missing. A checkpoint whose files do not match its marker (lost or
truncated afterwards) is not complete: ``--resume`` falls back to the newest complete one.
Requires the run directory on a file system that every machine sees.

Loading is safe: accelerate reads its files with ``torch.load(weights_only=True)`` or
safetensors, but DeepSpeed reads its own with ``weights_only=False``, and DCP unpickles its
``.metadata`` and the non-tensor entries of its ``.distcp`` files (the optimiser's settings)
without restriction. So before anything is loaded, :func:`verify_checkpoint_files` refuses
symlinks that leave the checkpoint directory, opens every pickle-based file that any loader
may read with ``weights_only=True`` and a short allowlist of DeepSpeed's plain data types,
every DCP ``.metadata`` with an unpickler that resolves only the exact (module, name) pairs of
DCP's metadata types, and every non-tensor DCP entry with ``weights_only=True``, and every
safetensors file with safetensors.

A save that meets a full disk removes its staging directory and stops with a ValueError that
says so, naming the last complete checkpoint, which stays intact (:func:`vascl_scale.fs.full_disk`).
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from vascl_scale.config import RunConfig, save_config
from vascl_scale.fs import full_disk, remove_directory, replace_directory, staging_directory

logger = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
STATE_FILE = "trainer_state.json"
_NAME = re.compile(r"^step-(\d{8})$")
# Files that loaders read with pickle (torch.load): accelerate's .bin / .pkl, DeepSpeed's .pt.
PICKLE_SUFFIXES = {".pt", ".pth", ".bin", ".pkl"}
ENGINE_NAMES = {"ddp": "DDP", "deepspeed": "DeepSpeed", "fsdp": "FSDP2"}
ENGINE_OPTIONS = {"ddp": "neither --deepspeed nor --fsdp", "deepspeed": "--deepspeed FILE", "fsdp": "--fsdp FILE"}
# What a DCP .metadata pickle may name: exact (module, name) pairs. DCP's types are those a real
# FSDP2 checkpoint's .metadata names (tests/test_reliability_checkpoint.py checks one), beside
# torch's sizes and dtypes and plain pathlib and collections types. Never a whole module, nor a
# dotted name: protocol 4 resolves "os.system" in a module as an attribute path, so a module that
# imports os would lend out all of it.
_DCP_GLOBALS = {
    *(
        ("torch.distributed.checkpoint.metadata", name)
        for name in (
            "Metadata",
            "MetadataIndex",
            "StorageMeta",
            "TensorProperties",
            "TensorStorageMetadata",
            "ChunkStorageMetadata",
            "BytesStorageMetadata",
            "_MEM_FORMAT_ENCODING",
        )
    ),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "Path"),
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("collections", "OrderedDict"),
    *(("torch", name) for name, value in vars(torch).items() if isinstance(value, torch.dtype)),
}


@dataclass
class TrainerState:
    """What the loop needs besides accelerate's state to continue exactly."""

    step: int  # optimiser steps completed
    world_size: int
    scheduler: dict[str, Any]
    best_score: float | None = None  # best STS-B dev Spearman x 100 so far
    best_step: int | None = None
    # The columns each training batch holds (None: a checkpoint written before they were saved).
    columns: list[str] | None = None
    # Size in bytes of every other file of the checkpoint, by path relative to it (all ranks').
    files: dict[str, int] = field(default_factory=dict)
    # "ddp", "deepspeed" or "fsdp" (vascl_scale.train.plan.engine_name); None: written before it was saved.
    engine: str | None = None

    def to_json(self) -> str:
        return json.dumps(self.__dict__, indent=2)

    @classmethod
    def from_file(cls, path: Path) -> TrainerState:
        try:
            return cls(**json.loads(path.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError, ValueError, TypeError) as err:  # JSONDecodeError is a ValueError
            raise ValueError(f"{path} is unreadable or incomplete ({err})") from err


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}"


def checkpoint_problem(checkpoint: Path) -> str | None:
    """Why ``checkpoint`` is not complete, or None when its files match its marker."""
    marker = Path(checkpoint) / STATE_FILE
    if not marker.is_file():
        return f"it has no {STATE_FILE} (the completion marker)"
    try:
        state = TrainerState.from_file(marker)
    except ValueError as err:
        return str(err)
    for name, size in sorted(state.files.items()):
        path = Path(checkpoint) / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} has {path.stat().st_size} bytes, not the {size} it was written with (truncated or replaced)"
    return None


def _step_directories(run_dir: Path) -> list[Path]:
    """``step-*`` directories of a run, oldest first, complete or not."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _NAME.match(p.name) and p.is_dir()]
    return sorted(found, key=lambda p: int(_NAME.match(p.name).group(1)))


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    return [p for p in _step_directories(run_dir) if checkpoint_problem(p) is None]


def previous_checkpoint_hint(checkpoint: Path) -> str:
    """What to resume from instead of ``checkpoint``: the newest complete one before it."""
    run_dir = Path(checkpoint).parent.parent
    earlier = [p for p in complete_checkpoints(run_dir) if p.name < Path(checkpoint).name]
    if not earlier:
        return "no earlier complete checkpoint exists; start a new run with another --output"
    return f"resume from the previous complete checkpoint with --resume-from {earlier[-1]}"


def prepare_run_dir(run_dir: Path, resume: str | None) -> None:
    """Refuse to mix two runs in one directory."""
    if resume is None and _step_directories(run_dir):
        raise ValueError(
            f"{run_dir} already holds checkpoints of a run; pass --resume to continue it or a new --output"
        )


def resolve_resume(target: str, run_dir: Path) -> Path:
    """``latest`` -> the newest complete checkpoint of ``run_dir``; a run dir -> its newest
    complete one (incomplete ones are skipped with a warning); a checkpoint dir -> itself, if complete."""
    candidate = Path(run_dir) if target == "latest" else Path(target)
    if _NAME.match(candidate.name) or (candidate / STATE_FILE).exists():
        problem = checkpoint_problem(candidate)
        if problem is not None:
            raise ValueError(
                f"--resume-from {candidate} is not a complete checkpoint: {problem}; {previous_checkpoint_hint(candidate)}"
            )
        return candidate
    found = _step_directories(candidate)
    for checkpoint in reversed(found):
        problem = checkpoint_problem(checkpoint)
        if problem is None:
            return checkpoint
        logger.warning("skipping incomplete checkpoint %s: %s", checkpoint, problem)
    option = "--resume" if target == "latest" else "--resume-from"
    fresh = (
        f"remove its incomplete {', '.join(p.name for p in found)} (or pass another --output) and run without {option}"
        if found
        else f"run without {option}"
    )
    raise ValueError(
        f"--resume: no complete checkpoint under {candidate / CHECKPOINTS} "
        f"(a complete one is a step-* directory whose files match its {STATE_FILE}), so there is nothing to "
        f"resume; to start the run from step 0, {fresh}"
    )


def check_resume_compatible(
    checkpoint: Path, config: RunConfig, world_size: int, columns: tuple[str, ...], engine: str
) -> TrainerState:
    """The saved state, after checking that this run can continue it, before anything is loaded:
    the same objective, model (backbone, pooling, head, adapter: every ``model`` key), global
    batch, ``columns`` of the data's batches, ``engine`` and world size. Each change is named,
    saved value against asked."""
    state = TrainerState.from_file(checkpoint / STATE_FILE)
    saved = _saved_config(checkpoint)
    # config.yaml holds the paths as written (expanded in files saved before that): compare
    # like with like.
    current, expanded = config.as_written().to_dict(), config.to_dict()
    changed = [
        f"model.{key}"
        for key in current["model"]
        if saved["model"].get(key) not in (current["model"][key], expanded["model"][key])
    ]
    if saved.get("objective") != current["objective"]:
        changed.insert(0, "objective")
    if saved["train"].get("global_batch_size") != current["train"]["global_batch_size"]:
        changed.append("train.global_batch_size")
    details = [f"{key}: {_lookup(saved, key)!r} -> {_lookup(current, key)!r}" for key in changed]
    problems = [f"the config changes {', '.join(details)}"] if details else []
    if state.columns is not None:  # what the stream's saved position and the objective's views refer to
        if set(columns) != set(state.columns):
            problems.append(f"data.train's columns change: {', '.join(state.columns)} -> {', '.join(columns)}")
    if problems:
        raise ValueError(
            f"--resume {checkpoint}: {'; '.join(problems)}; resume with the config the checkpoint was written "
            "with (its config.yaml) and its data, or start a new run with another --output (to train its weights "
            "on from there, set model.path to the run's export: final/ or best/)"
        )
    if state.engine is not None and state.engine != engine:
        raise ValueError(
            f"--resume {checkpoint}: it was written by the {ENGINE_NAMES[state.engine]} engine and this run uses "
            f"{ENGINE_NAMES[engine]}; their checkpoints differ in layout, so resume with the engine that wrote it "
            f"({ENGINE_OPTIONS[state.engine]}), or start a new run from its export (set model.path to final/ or best/)"
        )
    ranks = sorted(f"data/{p.name}" for p in (checkpoint / "data").glob("rank-*.pt"))
    if len(ranks) != state.world_size:  # an edited world size would reshard and drop ranks' data positions
        raise ValueError(
            f"--resume {checkpoint}: its {STATE_FILE} says {state.world_size} processes wrote it, but it holds "
            f"the data positions of {len(ranks)} ranks ({', '.join(ranks) or 'none'}); one of them was edited or "
            f"mixed from another checkpoint, so it cannot be resumed exactly; {previous_checkpoint_hint(checkpoint)}"
        )
    if state.world_size != world_size:
        raise ValueError(
            f"--resume {checkpoint}: it was written by {state.world_size} processes and this run has "
            f"{world_size}; optimiser shards and data positions are per rank, so resume with "
            f"{state.world_size} processes"
        )
    return state


def _saved_config(checkpoint: Path) -> dict[str, Any]:
    """The config a checkpoint was written with, with the sections the resume check compares."""
    path = checkpoint / "config.yaml"
    try:
        saved = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise ValueError(f"{path} is unreadable ({err}); {previous_checkpoint_hint(checkpoint)}") from err
    if (
        not isinstance(saved, dict)
        or not isinstance(saved.get("model"), dict)
        or not isinstance(saved.get("train"), dict)
    ):
        raise ValueError(f"{path} lacks the model and train sections; {previous_checkpoint_hint(checkpoint)}")
    return saved


def _lookup(tree: dict[str, Any], dotted: str) -> Any:
    """The value at ``dotted`` in ``tree``; None where a saved config lacks it."""
    for part in dotted.split("."):
        tree = tree.get(part) if isinstance(tree, dict) else None
    return tree


def data_state_path(checkpoint: Path, rank: int) -> Path:
    return checkpoint / "data" / f"rank-{rank:05d}.pt"


def _file_sizes(directory: Path) -> dict[str, int]:
    return {str(p.relative_to(directory)): p.stat().st_size for p in sorted(directory.rglob("*")) if p.is_file()}


def save_checkpoint(
    accelerator,
    run_dir: Path,
    config: RunConfig,
    state: TrainerState,
    data_state: dict[str, Any],
    keep_last: int,
    sharded: tuple[torch.nn.Module, torch.optim.Optimizer] | None = None,
) -> Path:
    """Write a complete checkpoint atomically (all ranks call this); returns its path.
    ``sharded``: the model and optimiser of an FSDP2 run, saved through DCP instead of accelerate.
    A full disk is a ValueError saying so (:func:`_full_disk_error`), the staging directory removed."""
    from torch.distributed.checkpoint.api import CheckpointException

    root = Path(run_dir) / CHECKPOINTS
    final = root / checkpoint_name(state.step)
    staging = root / f".tmp-{final.name}"
    try:
        if accelerator.is_main_process:
            root.mkdir(parents=True, exist_ok=True)
            for stale in [*root.glob(".tmp-*"), *root.glob(".trash-*")]:  # left by runs killed while saving
                shutil.rmtree(stale, ignore_errors=True)
            staging_directory(final)
        accelerator.wait_for_everyone()
        if sharded is not None:
            from vascl_scale.train.fsdp import SHARDED_STATE, save_sharded

            save_sharded(*sharded, staging / SHARDED_STATE)
        else:
            accelerator.save_state(str(staging))
        path = data_state_path(staging, accelerator.process_index)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(data_state, path)
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            save_config(config, staging / "config.yaml")
            state.files = _file_sizes(staging)  # every rank's files: the run directory is shared
            (staging / STATE_FILE).write_text(state.to_json(), encoding="utf-8")
            replace_directory(staging, final)  # final exists when a resumed run saves the same step again
            for old in complete_checkpoints(run_dir)[:-keep_last]:
                remove_directory(old)
            logger.info("saved checkpoint %s", final)
    except (Exception, CheckpointException) as err:  # DCP's save reports each rank's error in the latter
        problem = full_disk(err, root)
        if problem is None:
            raise
        shutil.rmtree(staging, ignore_errors=True)  # its space back at once; the next save would remove it
        raise _full_disk_error(problem, final, keep_last) from err
    accelerator.wait_for_everyone()
    return final


def _full_disk_error(problem: str, checkpoint: Path, keep_last: int) -> ValueError:
    """The error of a save of ``checkpoint`` stopped by a full disk (``problem`` says where): what
    is kept, how much room a checkpoint takes, and what to do."""
    run_dir = checkpoint.parent.parent
    saved = complete_checkpoints(run_dir)
    room = f"while it saves, the run needs room for checkpoint.keep_last + 1 = {keep_last + 1} checkpoints"
    if saved:
        size = sum(TrainerState.from_file(saved[-1] / STATE_FILE).files.values())
        return ValueError(
            f"checkpoint {checkpoint} not saved: {problem}; the last complete checkpoint, {saved[-1]}, is intact. "
            f"Free space there ({room} of {size / 2**20:.1f} MiB) or lower checkpoint.keep_last, then continue "
            "from it with --resume"
        )
    return ValueError(
        f"checkpoint {checkpoint} not saved: {problem}; no checkpoint of {run_dir} is complete yet. Free space there "
        f"({room}) or train on a disk with room (--output), then start the run again"
    )


def _safe_globals() -> list[Any]:
    """Types the loaders' files hold besides tensors: accelerate's allowlist (numpy RNG
    states), and the plain data types that DeepSpeed pickles next to its tensors."""
    import argparse
    import collections

    from accelerate.utils.other import TORCH_SAFE_GLOBALS

    globals_: list[Any] = [*TORCH_SAFE_GLOBALS, collections.OrderedDict, argparse.Namespace, set]
    try:
        from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
        from deepspeed.runtime.zero.config import ZeroStageEnum
        from deepspeed.utils.tensor_fragment import fragment_address
    except ImportError:  # without DeepSpeed no checkpoint can hold its types
        return globals_
    return [*globals_, ZeroStageEnum, fragment_address, LossScaler, DynamicLossScaler]  # scalers hold numbers


def _files_inside(checkpoint: Path) -> list[Path]:
    """Every file under ``checkpoint``, through symlinks, after refusing any that leave it."""
    root = checkpoint.resolve()
    files: list[Path] = []
    seen: set[Path] = set()
    for directory, dirnames, filenames in os.walk(checkpoint, followlinks=True):
        real = Path(directory).resolve()
        if real in seen:  # a link back up the tree: visited already
            dirnames[:] = []
            continue
        seen.add(real)
        for name in [*dirnames, *filenames]:
            path = Path(directory) / name
            if path.is_symlink() and not path.resolve().is_relative_to(root):
                raise ValueError(f"{path} is a symlink to {path.resolve()}, outside the checkpoint directory")
        files += [Path(directory) / name for name in filenames]
    return files


def verify_checkpoint_files(checkpoint: Path) -> None:
    """Refuse a checkpoint that any loader could not read safely; the error names the file.

    Pickle-based files are opened with ``weights_only=True`` (memory-mapped, so only the
    pickle is read, not the tensor data); safetensors files are opened with safetensors,
    which checks that the header covers the file.
    """
    from safetensors import safe_open

    checkpoint = Path(checkpoint)
    try:
        files = _files_inside(checkpoint)
        for path in files:
            try:
                if path.name == ".metadata":
                    _check_dcp_directory(path.parent)
                elif path.suffix in PICKLE_SUFFIXES:
                    with torch.serialization.safe_globals(_safe_globals()):
                        torch.load(path, map_location="cpu", weights_only=True, mmap=True)
                elif path.suffix == ".safetensors":
                    with safe_open(str(path), framework="pt"):
                        pass
            except Exception as err:  # unpickling errors name the offending global; any error refuses the file
                raise ValueError(f"{path} cannot be loaded safely ({type(err).__name__}: {err})") from err
    except ValueError as err:
        raise ValueError(f"refusing checkpoint {checkpoint}: {err}; {previous_checkpoint_hint(checkpoint)}") from err


class _DcpMetadataUnpickler(pickle.Unpickler):
    """Unpickles the globals of :data:`_DCP_GLOBALS` and nothing else."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _DCP_GLOBALS:
            raise pickle.UnpicklingError(f"a DCP .metadata may not name {module}.{name}")
        return super().find_class(module, name)


def read_dcp_metadata(path: Path) -> Any:
    """DCP's ``Metadata`` in the ``.metadata`` file ``path``, read with :class:`_DcpMetadataUnpickler`."""
    from torch.distributed.checkpoint.metadata import Metadata

    with open(path, "rb") as handle:
        metadata = _DcpMetadataUnpickler(handle).load()
    if not isinstance(metadata, Metadata):
        raise pickle.UnpicklingError(f"it holds a {type(metadata).__name__}, not DCP's Metadata")
    return metadata


def _check_dcp_directory(directory: Path) -> None:
    """DCP's ``.metadata`` read with :func:`read_dcp_metadata`; every non-tensor entry it points
    to (bytes in a ``.distcp`` file, which DCP would unpickle freely) with ``weights_only=True``."""
    import io

    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    metadata = read_dcp_metadata(directory / ".metadata")
    for index, where in metadata.storage_data.items():
        if not isinstance(metadata.state_dict_metadata.get(index.fqn), BytesStorageMetadata):
            continue
        path = directory / where.relative_path
        if not path.resolve().is_relative_to(directory.resolve()):
            raise ValueError(f"{directory / '.metadata'} points outside its directory ({where.relative_path})")
        with open(path, "rb") as handle:
            handle.seek(where.offset)
            payload = handle.read(where.length)
        try:
            torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
        except Exception as err:
            raise ValueError(
                f"{path}: entry {index.fqn} cannot be loaded safely ({type(err).__name__}: {err})"
            ) from err


def load_checkpoint(
    accelerator, checkpoint: Path, sharded: tuple[torch.nn.Module, torch.optim.Optimizer] | None = None
) -> dict[str, Any]:
    """Restore the run's state from ``checkpoint`` (``sharded``: an FSDP2 run's model and
    optimiser, through DCP); returns this rank's data position."""
    from torch.distributed.checkpoint.api import CheckpointException

    verify_checkpoint_files(checkpoint)
    try:
        if sharded is not None:
            from vascl_scale.train.fsdp import SHARDED_STATE, load_sharded

            load_sharded(*sharded, checkpoint / SHARDED_STATE)
        else:
            accelerator.load_state(str(checkpoint))
        return torch.load(data_state_path(checkpoint, accelerator.process_index), weights_only=True)
    # Files that passed the checks but do not fit this model or run, or whose bytes changed in
    # place (DCP's CheckpointException is a BaseException).
    except (Exception, CheckpointException) as err:
        raise ValueError(
            f"could not load checkpoint {checkpoint} ({_described(err)}); {previous_checkpoint_hint(checkpoint)}"
        ) from err


def _described(err: BaseException) -> str:
    """``err`` for a message; a DCP CheckpointException (a traceback per rank in its text) as the
    first line of each failed rank's error."""
    from torch.distributed.checkpoint.api import CheckpointException

    if isinstance(err, CheckpointException):
        return "; ".join(
            f"rank {rank}: {type(error).__name__}: {(str(error).splitlines() or [''])[0]}"
            for rank, (error, _) in sorted(err.failures.items())
        )
    return f"{type(err).__name__}: {err}"

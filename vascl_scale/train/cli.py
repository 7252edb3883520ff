"""``vascl-scale train``: parse options, then launch workers or train in this process."""

from __future__ import annotations

import json
import logging
import os
import signal
from pathlib import Path

import typer

from vascl_scale.log import process_rank
from vascl_scale.losses.spec import OBJECTIVES

logger = logging.getLogger(__name__)

# The paths the launcher expanded (JSON, by dotted key), for its workers: they expand nothing.
RESOLVED_PATHS_ENV = "VASCL_RESOLVED_PATHS"


def train_command(
    config: Path = typer.Option(..., "--config", help="Training config (YAML), e.g. configs/cpu-demo.yaml."),
    overrides: list[str] = typer.Option([], "--set", help="Override one key, e.g. --set loss.k=32 (repeatable)."),
    deepspeed: Path | None = typer.Option(
        None, "--deepspeed", help="DeepSpeed JSON, e.g. configs/deepspeed/zero2.json."
    ),
    num_processes: int = typer.Option(1, "--num-processes", help="Processes on this machine."),
    num_machines: int = typer.Option(1, "--num-machines"),
    machine_rank: int = typer.Option(0, "--machine-rank"),
    main_process_ip: str | None = typer.Option(None, "--main-process-ip", help="Address of machine rank 0."),
    main_process_port: int | None = typer.Option(None, "--main-process-port", help="A free port on machine rank 0."),
    max_steps: int | None = typer.Option(None, "--max-steps", help="Same as --set train.max_steps=S."),
    output: Path | None = typer.Option(None, "--output", help="Run directory (same as --set train.output_dir=DIR)."),
    objective: str | None = typer.Option(
        None, "--objective", help=f"{', '.join(OBJECTIVES)} (same as --set objective=...)."
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Continue from the latest complete checkpoint of the run directory."
    ),
    resume_from: Path | None = typer.Option(
        None, "--resume-from", help="Continue from DIR: a checkpoint, or a run directory (its latest checkpoint)."
    ),
) -> None:
    """Train a sentence encoder with VaSCL or SimCSE over the global batch."""
    # Typer options cannot take an optional value, so `--resume [DIR]` is two options.
    resume_target = str(resume_from) if resume_from is not None else ("latest" if resume else None)
    # JSON strings and numbers are valid YAML scalars: paths are never re-typed.
    assignments = list(overrides)
    if max_steps is not None:
        assignments.append(f"train.max_steps={max_steps}")
    if output is not None:
        assignments.append(f"train.output_dir={json.dumps(str(output))}")
    if objective is not None:
        assignments.append(f"objective={json.dumps(objective)}")
    # Imported here, not at the top: `vascl-scale --help` must not load torch (test_cli_import).
    from vascl_scale.config import load_config, path_values, resolve_paths
    from vascl_scale.precision import train_precision
    from vascl_scale.train.checkpoint import check_resume_compatible, prepare_run_dir, resolve_resume
    from vascl_scale.train.launch import (
        LaunchPlan,
        StoppedBySignal,
        become_single_rank,
        check_writable,
        exit_with_parent,
        in_distributed_worker,
        launch_workers,
    )
    from vascl_scale.train.run_lock import HELD_ENV, RunDirectoryLock
    from vascl_scale.train.tracking import resolve_trackers

    run_lock: RunDirectoryLock | None = None
    try:
        run_config = load_config(config, assignments)
        deepspeed_path = str(deepspeed) if deepspeed is not None else None
        if in_distributed_worker():
            exit_with_parent()  # never train on as an orphan of a killed launcher
            # A worker of another launcher (torchrun, srun) resolves the paths itself.
            given = os.environ.get(RESOLVED_PATHS_ENV)
            run_config = resolve_paths(run_config, json.loads(given) if given else None)
            return _train(run_config, deepspeed_path, resume_target)
        plan = LaunchPlan(
            processes_per_machine=num_processes,
            num_machines=num_machines,
            machine_rank=machine_rank,
            main_process_ip=main_process_ip,
            main_process_port=main_process_port,
            deepspeed=deepspeed is not None,
        )
        # Fail here, once, rather than in every worker.
        run_config = resolve_paths(run_config)
        run_config.per_device_batch_size(plan.world_size)
        train_precision(run_config.train.precision)
        resolve_trackers(run_config.train.report_to)  # a tracker asked for but not installed
        run_dir = Path(run_config.train.output_dir)
        check_writable(run_dir)
        if deepspeed is not None and not deepspeed.is_file():
            raise ValueError(f"--deepspeed {deepspeed}: no such file")
        if plan.needs_launcher:  # checked here once, before any worker starts (in place: by the trainer)
            if plan.machine_rank == 0:  # machine 0 holds the shared run directory
                run_lock = RunDirectoryLock(run_dir).acquire()
            prepare_run_dir(run_dir, resume_target)
            if resume_target is not None:
                check_resume_compatible(resolve_resume(resume_target, run_dir), run_config, plan.world_size)
    except ValueError as err:
        logger.error("%s", err)
        raise typer.Exit(2) from err
    if plan.needs_launcher:
        # The workers see that the run directory is held and checked for them, and its paths.
        worker_env = {HELD_ENV: "1", RESOLVED_PATHS_ENV: json.dumps(path_values(run_config))}
        try:
            raise typer.Exit(launch_workers(plan, worker_env=worker_env))
        except StoppedBySignal as err:
            raise _stopped(run_dir, err.signum) from None
        except KeyboardInterrupt:  # Ctrl-C before the agent took over the signals
            raise _stopped(run_dir, signal.SIGINT) from None
        finally:
            if run_lock is not None:
                run_lock.release()
    if plan.deepspeed:
        become_single_rank()
    _train(run_config, deepspeed_path, resume_target)  # the Trainer locks the run directory itself


def _train(run_config, deepspeed_path: str | None, resume: str | None) -> None:
    """Train in this process; configuration and data errors exit with 2, a non-finite loss with 3."""
    from vascl_scale.data.loader import CorruptShardError
    from vascl_scale.train.launch import StoppedBySignal, sigterm_stops_training
    from vascl_scale.train.run_lock import HELD_ENV
    from vascl_scale.train.step import NonFiniteLossError
    from vascl_scale.train.trainer import build_trainer, deepspeed_path_from_environment

    try:
        with sigterm_stops_training():
            trainer = build_trainer(run_config, deepspeed_path or deepspeed_path_from_environment(), resume)
            trainer.fit()
            trainer.end_process_group()
    except ValueError as err:
        logger.error("%s", err)
        raise typer.Exit(2) from err
    except CorruptShardError as err:
        # Raised in a loader worker, it arrives wrapped in that worker's traceback: its last line
        # is the message.
        logger.error("%s", str(err).strip().splitlines()[-1].removeprefix(f"{CorruptShardError.__module__}."))
        raise typer.Exit(2) from err
    except NonFiniteLossError as err:
        logger.error("%s", err)
        raise typer.Exit(3) from err
    except (KeyboardInterrupt, StoppedBySignal) as err:  # Ctrl-C or SIGTERM here, or a launcher's stop
        signum = err.signum if isinstance(err, StoppedBySignal) else signal.SIGINT
        if os.environ.get(HELD_ENV) == "1" or process_rank() != 0:  # the launcher / rank 0 reports it
            raise typer.Exit(128 + signum) from None
        raise _stopped(Path(run_config.train.output_dir), signum) from None


def _stopped(run_dir: Path, signum: int) -> typer.Exit:
    """One line on what stopped the run and what it kept; the exit status a shell gives the signal."""
    from vascl_scale.train.checkpoint import complete_checkpoints

    saved = complete_checkpoints(run_dir)
    kept = (
        f"the last complete checkpoint is {saved[-1]} (continue with --resume)"
        if saved
        else "no checkpoint had been saved yet"
    )
    logger.error("training in %s stopped by %s; %s", run_dir, signal.Signals(signum).name, kept)
    return typer.Exit(128 + signum)

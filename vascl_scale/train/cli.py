"""``vascl-scale train``: parse options, then launch workers or train in this process."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from pathlib import Path

import typer

from vascl_scale.log import process_rank
from vascl_scale.losses.spec import OBJECTIVES

logger = logging.getLogger(__name__)


def train_command(
    config: Path = typer.Option(..., "--config", help="Training config (YAML), e.g. configs/cpu-demo.yaml."),
    overrides: list[str] = typer.Option([], "--set", help="Override one key, e.g. --set loss.k=32 (repeatable)."),
    deepspeed: Path | None = typer.Option(
        None, "--deepspeed", help="DeepSpeed JSON, e.g. configs/deepspeed/zero2.json."
    ),
    fsdp: Path | None = typer.Option(
        None, "--fsdp", help="FSDP2 settings (YAML), e.g. configs/fsdp/full-shard.yaml; not with --deepspeed."
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
    plan_file: Path | None = typer.Option(
        None, "--plan", hidden=True, help="A worker of our launcher: the run plan it made (<run>/plan.json)."
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
    from vascl_scale.config import load_config
    from vascl_scale.train.launch import (
        LaunchPlan,
        StoppedBySignal,
        in_distributed_worker,
        run_here_or_launch,
        worker_world_size,
    )
    from vascl_scale.train.plan import (
        PLAN_DIGEST_ENV,
        make_plan,
        plan_digest,
        plan_path,
        read_worker_plan,
        worker_engine,
        write_plan,
    )

    run_plan = None
    try:
        run_config = load_config(config, assignments)
        if plan_file is not None:  # a worker of our launcher: it runs the launcher's plan, unchanged
            if not in_distributed_worker():
                raise ValueError(
                    f"--plan {plan_file}: only the workers that vascl-scale train starts take --plan (RANK and "
                    "WORLD_SIZE are unset here); run vascl-scale train without --plan"
                )
            run_plan = read_worker_plan(plan_file, os.environ.get(PLAN_DIGEST_ENV))
            run_plan.check_worker(run_config, worker_world_size(), worker_engine(deepspeed, fsdp), plan_file)
            run_here_or_launch(LaunchPlan())  # watch the launcher
        elif in_distributed_worker():  # a worker of another launcher (torchrun, srun) plans for itself
            run_plan = make_plan(
                run_config,
                world_size=worker_world_size(),
                deepspeed=deepspeed,
                fsdp=fsdp,
                resume=resume_target,
                lock="workers",
            )
            if process_rank() == 0:
                write_plan(run_plan, plan_path(run_plan.run_dir))
            run_here_or_launch(LaunchPlan())  # watch the launcher
        else:
            launch = LaunchPlan(
                processes_per_machine=num_processes,
                num_machines=num_machines,
                machine_rank=machine_rank,
                main_process_ip=main_process_ip,
                main_process_port=main_process_port,
                process_group=deepspeed is not None or fsdp is not None,
            )
            # Machine 0 holds the shared run directory for the workers of every machine.
            holder = "here" if launch.machine_rank == 0 else "launcher"
            run_plan = make_plan(
                run_config,
                world_size=launch.world_size,
                deepspeed=deepspeed,
                fsdp=fsdp,
                resume=resume_target,
                lock=holder,
            )
            written = write_plan(run_plan, plan_path(run_plan.run_dir, launch.machine_rank))
            logger.info("run plan: %s (the workers read it)", written)
            os.environ[PLAN_DIGEST_ENV] = plan_digest(run_plan)  # the workers inherit it
            try:
                code = run_here_or_launch(launch, sys.argv[1:] + ["--plan", str(written)])
            except StoppedBySignal as err:
                raise _stopped(run_plan.run_dir, err.signum) from None
            except KeyboardInterrupt:  # Ctrl-C before the agent took over the signals
                raise _stopped(run_plan.run_dir, signal.SIGINT) from None
            finally:
                os.environ.pop(PLAN_DIGEST_ENV, None)
            if code is not None:
                if run_plan.run_lock is not None:
                    run_plan.run_lock.release()
                raise typer.Exit(code)
    except ValueError as err:
        if run_plan is not None and run_plan.run_lock is not None:
            run_plan.run_lock.release()
        logger.error("%s", err)
        raise typer.Exit(2) from err
    _train(run_plan, launched=plan_file is not None)


def _train(run_plan, launched: bool) -> None:
    """Train in this process; configuration and data errors exit with 2, a non-finite loss with 3.
    ``launched``: this is a worker of our launcher, which reports a stop itself."""
    from vascl_scale.data.loader import CorruptShardError
    from vascl_scale.fs import full_disk
    from vascl_scale.train.launch import StoppedBySignal, sigterm_stops_training
    from vascl_scale.train.step import NonFiniteLossError
    from vascl_scale.train.trainer import build_trainer

    try:
        with sigterm_stops_training():
            trainer = build_trainer(run_plan)
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
    except Exception as err:  # an export, config.yaml or the metrics on a full disk: one line, not a traceback
        problem = full_disk(err, run_plan.run_dir)  # torch.save's own error carries no errno
        if problem is None:
            raise
        logger.error(
            "training in %s stopped: %s (%s: %s); free space there, then continue with --resume (the last "
            "complete checkpoint is kept)",
            run_plan.run_dir,
            problem,
            type(err).__name__,
            str(err).splitlines()[0] if str(err) else "",
        )
        raise typer.Exit(2) from err
    except (KeyboardInterrupt, StoppedBySignal) as err:  # Ctrl-C or SIGTERM here, or a launcher's stop
        signum = err.signum if isinstance(err, StoppedBySignal) else signal.SIGINT
        if launched or process_rank() != 0:  # the launcher / rank 0 reports it
            raise typer.Exit(128 + signum) from None
        raise _stopped(run_plan.run_dir, signum) from None


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

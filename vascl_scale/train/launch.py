"""Starting a run: train in this process, or hand the command to accelerate's launcher.

``vascl-scale train`` is both the launcher and the worker. Outside a distributed launch,
with more than one process, it re-runs its own command line (``python -m vascl_scale ...``)
under ``accelerate launch``; accelerate starts the workers through torch's elastic agent, which
also ends the surviving workers when one of them dies. Inside a worker (``RANK`` and
``WORLD_SIZE`` set by ``accelerate launch``, ``torchrun``, the ``deepspeed`` launcher, or an
``srun`` script that exports them) it trains. One process with DeepSpeed or FSDP2 trains in
place in a one-rank process group (:func:`become_single_rank`): both need a group even then.

The elastic agent starts each worker in a new session, so a signal to the launcher's process
group (a SIGKILL from a scheduler or a terminal) misses the workers: every worker therefore
watches its parent (:func:`exit_with_parent`) and exits when the launcher is gone, instead of
training on as an orphan.

DeepSpeed and FSDP2 are configured in the worker from ``--deepspeed`` / ``--fsdp`` (see
:mod:`vascl_scale.train.trainer`), so every launcher gives the same run; accelerate's
launcher is used in its torchrun mode (``--multi_gpu``), which also works on CPU with gloo.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

logger = logging.getLogger(__name__)


def in_distributed_worker() -> bool:
    """True inside a process started by a distributed launcher (torchrun-style environment)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def worker_world_size() -> int:
    """The number of ranks of the launch this worker belongs to (its launcher's ``WORLD_SIZE``)."""
    return int(os.environ["WORLD_SIZE"])


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now on ``host`` (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class LaunchPlan:
    """Where the processes of a run go: ``processes_per_machine`` x ``num_machines`` ranks."""

    processes_per_machine: int = 1
    num_machines: int = 1
    machine_rank: int = 0
    main_process_ip: str | None = None
    main_process_port: int | None = None
    process_group: bool = False
    """one process trains in a one-rank process group (DeepSpeed and FSDP2 need one)"""

    def __post_init__(self) -> None:
        if self.processes_per_machine < 1:
            raise ValueError(f"--num-processes must be >= 1; got {self.processes_per_machine}")
        if self.num_machines < 1:
            raise ValueError(f"--num-machines must be >= 1; got {self.num_machines}")
        if not 0 <= self.machine_rank < self.num_machines:
            raise ValueError(f"--machine-rank must be in [0, {self.num_machines - 1}]; got {self.machine_rank}")
        if self.num_machines > 1 and (self.main_process_ip is None or self.main_process_port is None):
            raise ValueError(
                "--num-machines > 1 needs --main-process-ip and --main-process-port "
                "(the address of machine rank 0, the same on every machine)"
            )

    @property
    def world_size(self) -> int:
        return self.processes_per_machine * self.num_machines

    @property
    def needs_launcher(self) -> bool:
        """One process trains in place (in a one-rank group under DeepSpeed and FSDP2); more need a launcher."""
        return self.world_size > 1

    def accelerate_arguments(self, worker_argv: list[str]) -> list[str]:
        """``accelerate launch`` arguments that run ``python -m vascl_scale <worker_argv>``."""
        port = self.main_process_port if self.main_process_port is not None else free_port()
        arguments = [
            "--multi_gpu",
            "--num_processes", str(self.world_size),
            "--num_machines", str(self.num_machines),
            "--machine_rank", str(self.machine_rank),
            "--main_process_ip", self.main_process_ip or "127.0.0.1",
            "--main_process_port", str(port),
            # Precision and DeepSpeed are set up by the worker from the training config.
            "--mixed_precision", "no",
            "--dynamo_backend", "no",
            "--module", "vascl_scale",
        ]  # fmt: skip
        return arguments + worker_argv


def become_single_rank() -> None:
    """Make this process rank 0 of a one-rank process group (torchrun's environment).

    DeepSpeed initialises torch.distributed even for one process, and FSDP2 shards over a
    process group's mesh; accelerate's launcher
    refuses ``--multi_gpu`` with one process, so the group is formed here, in place.
    """
    os.environ.update(
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
    )


def exit_with_parent(poll_seconds: float = 0.5) -> None:
    """End this worker when its parent (the launcher or elastic agent) is gone.

    A daemon thread polls the parent PID; once the process has been re-parented (the parent
    died, even by SIGKILL), it exits at once with status 1. Checkpoints are atomic, so an
    exit in the middle of one leaves the last complete checkpoint intact.
    """
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_seconds)
        sys.stderr.write(f"vascl-scale worker {os.getpid()}: the launcher (pid {parent}) is gone; exiting\n")
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


class StoppedBySignal(BaseException):
    """SIGINT or SIGTERM (Ctrl-C, a scheduler's stop) stopped the run: a launcher's workers, or
    the training in this process (:func:`sigterm_stops_training`). A BaseException, like
    KeyboardInterrupt, so that no ``except Exception`` on the way up can swallow it."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


@contextmanager
def sigterm_stops_training() -> Iterator[None]:
    """In this block SIGTERM raises :class:`StoppedBySignal`, as SIGINT raises KeyboardInterrupt.

    Python's default for SIGTERM ends the process where it stands: nothing unwinds, so a
    ``pipe:`` shard command, which runs in a session of its own, would outlive the run, and no
    line would say which checkpoint was kept. Raised instead, the stop unwinds like Ctrl-C: the
    shard stream kills its command's process group on the way out.
    """

    def stop(signum: int, frame: object) -> None:
        raise StoppedBySignal(signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _signal_of_exit_status(code: object) -> int | None:
    """The signal a shell's exit status ``128 + N`` stands for, or None for any other status."""
    if isinstance(code, int) and code > 128:
        try:
            return int(signal.Signals(code - 128))
        except ValueError:
            return None
    return None


def launch_workers(plan: LaunchPlan, worker_argv: list[str] | None = None) -> int:
    """Run this command line on ``plan.world_size`` ranks through accelerate; the exit status.

    ``worker_argv`` defaults to this process's own arguments: the workers parse the same
    command and, seeing the launcher's environment, train. What the workers need beyond their
    command line is in files they are pointed to (``train``: ``--plan <run>/plan.json``); this
    process's environment is restored afterwards.
    """
    from accelerate.commands.launch import launch_command, launch_command_parser
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    argv = list(sys.argv[1:] if worker_argv is None else worker_argv)
    arguments = plan.accelerate_arguments(argv)
    logger.info(
        "launching %d process(es) on machine %d of %d through accelerate: %s",
        plan.processes_per_machine,
        plan.machine_rank,
        plan.num_machines,
        " ".join(arguments),
    )
    saved_env = dict(os.environ)
    # One thread per rank unless the user chose otherwise: ranks share the machine's cores.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # The agent's warnings on a stop (the signal, each worker's closing signal) say what the
    # caller's one line on StoppedBySignal says; its errors (a failed rank) still show. Its
    # modules' loggers set their own levels when they load, so they are loaded first.
    import torch.distributed.run  # noqa: F401

    for name in list(logging.root.manager.loggerDict):
        if name.startswith("torch.distributed.elastic"):
            logging.getLogger(name).setLevel(logging.ERROR)
    try:
        launch_command(launch_command_parser().parse_args(arguments))
    except SignalException as err:  # the agent has already sent the signal on to the workers
        raise StoppedBySignal(err.sigval) from None
    except ChildFailedError as err:
        failures = "; ".join(f"rank {rank}: exit code {failure.exitcode}" for rank, failure in err.failures.items())
        logger.error("the run failed (%s); the last complete checkpoint can be resumed with --resume", failures)
        return 1
    except SystemExit as err:
        # accelerate >= 1.16 turns the agent's SignalException (and a KeyboardInterrupt) into
        # sys.exit(128 + signal) once the workers are shut down; 1.15 let them propagate.
        signum = _signal_of_exit_status(err.code)
        if signum is None:
            raise
        raise StoppedBySignal(signum) from None
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
    return 0


def run_here_or_launch(launch: LaunchPlan, worker_argv: list[str] | None = None) -> int | None:
    """The one way a command (``train``, ``bench step``) runs on its ranks.

    None when this process is to do the work itself: it is a worker of a launcher (it then
    watches its parent, :func:`exit_with_parent`), or the only process (under DeepSpeed and
    FSDP2, in a one-rank group, :func:`become_single_rank`). Otherwise the exit status of the workers
    :func:`launch_workers` started with ``worker_argv`` (default: this command line).
    ``sweep`` runs each cell as a ``vascl-scale train`` command, so its cells start the same way;
    ``bench comm`` always measures on workers it launches (:func:`launch_workers`), one included.
    """
    if in_distributed_worker():
        exit_with_parent()  # never run on as an orphan of a killed launcher
        return None
    if launch.needs_launcher:
        return launch_workers(launch, worker_argv)
    if launch.process_group:
        become_single_rank()
    return None

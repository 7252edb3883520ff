"""Run a function on W real gloo ranks (separate processes) and collect each rank's result."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import tempfile
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist


def _rank_main(fn: Callable[..., Any], rank: int, world_size: int, init_file: str, backend: str, results, args) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)  # one GPU per rank
        dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world_size)
        try:
            results.put((rank, "ok", fn(rank, world_size, *args)))
        finally:
            dist.destroy_process_group()
    except BaseException:  # report any failure to the test instead of hanging it
        results.put((rank, "error", traceback.format_exc()))


def run_on_ranks(
    fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 180.0, backend: str = "gloo"
) -> list[Any]:
    """fn(rank, world_size, *args) on each of ``world_size`` spawned processes of one
    ``backend`` group (gloo; nccl puts rank r on GPU r).

    ``fn`` must be importable (module level). Returns the results in rank order; raises
    with the worker's traceback if any rank fails, and kills every rank after ``timeout``.
    """
    with tempfile.TemporaryDirectory() as tmp:
        return _collect(_rank_main, fn, world_size, (os.path.join(tmp, "rendezvous"), backend), args, timeout)


def _collect(
    main: Callable[..., None], fn: Callable[..., Any], world_size: int, where: tuple, args: tuple, timeout: float
) -> list[Any]:
    """Spawn ``main(fn, rank, world_size, *where, results, args)`` per rank; results in rank order."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=main, args=(fn, rank, world_size, *where, results, args)) for rank in range(world_size)]
    for proc in procs:
        proc.start()
    collected: dict[int, Any] = {}
    try:
        for _ in range(world_size):
            rank, status, payload = results.get(timeout=timeout)
            if status == "error":
                raise RuntimeError(f"rank {rank} of {world_size} failed:\n{payload}")
            collected[rank] = payload
    except queue.Empty as err:
        raise TimeoutError(f"gloo ranks did not finish within {timeout} s") from err
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    return [collected[rank] for rank in range(world_size)]


def _launched_rank_main(fn: Callable[..., Any], rank: int, world_size: int, port: int, results, args) -> None:
    # The environment torchrun gives a worker: accelerate (and DeepSpeed) form the group from it.
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
    )
    torch.set_num_threads(1)
    try:
        try:
            results.put((rank, "ok", fn(rank, world_size, *args)))
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))


def run_as_launched(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 300.0) -> list[Any]:
    """Like :func:`run_on_ranks`, but each rank starts as a launcher starts it (torchrun's
    environment, no process group yet), so that accelerate / DeepSpeed set everything up."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return _collect(_launched_rank_main, fn, world_size, (port,), args, timeout)


def mean_over_ranks(world_size: int, *tensors: torch.Tensor) -> None:
    """What DDP and ZeRO do with parameter gradients, in place: average each tensor over the ranks."""
    if world_size > 1:
        for tensor in tensors:
            dist.all_reduce(tensor)
            tensor /= world_size

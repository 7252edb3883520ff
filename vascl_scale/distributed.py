"""All of vascl-scale's collective communication, in one place.

Everything here is the identity at world size 1 (or when torch.distributed is not
initialised), so the loss code calls it unconditionally and a single process needs no
process group. The loss maths in :mod:`vascl_scale.losses` takes tensors and a row offset
and never imports ``torch.distributed`` itself.

Gradient convention of :func:`all_gather_with_grad`: each rank's loss is a mean over its
own anchors, scored against gathered candidates. The backward pass sums, over all ranks,
the gradient that each rank's loss sends to a row, and delivers it to the rank that owns
the row. DDP and ZeRO then *average* parameter gradients over the W ranks, so the result is
d/dtheta of (1/W) sum_r loss_r, the gradient of the single-process loss on the concatenated
global batch (that loss is the mean of the per-rank means because every rank holds the same
number of rows). No extra factor of W is needed anywhere.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import Tensor

# (collective, bytes of the tensor this rank passes in, world size) of every collective issued
# here while :func:`record_traffic` is active; ``vascl-scale bench comm`` reads it.
_traffic: list[tuple[str, int, int]] | None = None


@contextmanager
def record_traffic() -> Iterator[list[tuple[str, int, int]]]:
    """Record every collective this module issues (forward gathers and their backward reductions)."""
    global _traffic
    previous, _traffic = _traffic, []
    try:
        yield _traffic
    finally:
        _traffic = previous


def _note(collective: str, tensor: Tensor, world_size: int) -> None:
    if _traffic is not None:
        _traffic.append((collective, tensor.numel() * tensor.element_size(), world_size))


def world() -> tuple[int, int]:
    """(rank, world_size) of the default process group; (0, 1) when not distributed."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def local_world_size(world_size: int) -> int:
    """The ranks on this node: ``LOCAL_WORLD_SIZE`` as torchrun and accelerate set it, else all
    ``world_size`` (one node). The nodes are ``world_size // local_world_size``."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", world_size))


def _gather_rows(local: Tensor, world_size: int) -> Tensor:
    """Concatenate every rank's ``local`` (b, ...) along dim 0, rank-major: (W * b, ...)."""
    parts = [torch.empty_like(local) for _ in range(world_size)]
    _note("all_gather", local, world_size)
    dist.all_gather(parts, local.contiguous())
    return torch.cat(parts, dim=0)


class _AllGatherWithGrad(torch.autograd.Function):
    """All-gather whose backward returns to each rank the summed gradient of its own rows."""

    @staticmethod
    def forward(ctx, local: Tensor) -> Tensor:  # (b, ...) -> (W * b, ...)
        rank, world_size = world()
        ctx.rank, ctx.rows = rank, local.shape[0]
        return _gather_rows(local, world_size)

    @staticmethod
    def backward(ctx, grad_global: Tensor) -> Tensor:  # (W * b, ...) -> (b, ...)
        # Every rank holds the gradient of its own loss with respect to all W * b rows; the
        # owner of a row needs the sum over ranks: a reduce-scatter, which sends (W - 1) / W of
        # the tensor. gloo has none, so there all-reduce and slice (twice the bytes; the
        # embeddings are small next to the parameter gradients).
        grad_global = grad_global.contiguous()
        world_size = dist.get_world_size()
        if dist.get_backend() == "nccl":
            own = grad_global.new_empty((ctx.rows, *grad_global.shape[1:]))  # (b, ...)
            _note("reduce_scatter", grad_global, world_size)
            # torch 2.13 deprecates reduce_scatter_tensor (it warns) for reduce_scatter_single;
            # older torch releases have only the old name.
            reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
            reduce_scatter(own, grad_global, op=dist.ReduceOp.SUM)
            return own
        summed = grad_global.clone()
        _note("all_reduce", summed, world_size)
        dist.all_reduce(summed, op=dist.ReduceOp.SUM)
        start = ctx.rank * ctx.rows
        return summed[start : start + ctx.rows]


def all_gather_with_grad(local: Tensor) -> Tensor:
    """(b, ...) on each rank -> (W * b, ...) on every rank, rows in rank order.

    Autograd-aware: gradient reaching any gathered row flows back to the rank that owns
    it (see the module docstring for why no rescaling is needed). Requires the same b on
    every rank; call :func:`require_equal_rows` once per step to get a clear error.
    """
    _, world_size = world()
    if world_size == 1:
        return local
    return _AllGatherWithGrad.apply(local)


def block_row(rank: int | Tensor, view: int, row: int | Tensor, views: int, rows: int) -> int | Tensor:
    """Where row ``row`` of view ``view`` of rank ``rank`` lands in a gather of per-rank blocks.

    Each rank passes the gathers one block of its n = ``views`` views stacked, [v_0; ...;
    v_(n-1)] (n b, ...) with b = ``rows``, so the gathered rows (W n b, ...) are rank-major, then
    view-major: (rank n + view) b + row. Integers or integer tensors alike; every objective reads
    the gathered block through this one function.
    """
    return (rank * views + view) * rows + row


def all_gather_no_grad(local: Tensor) -> Tensor:
    """Like :func:`all_gather_with_grad` for values used without gradient (neighbour search)."""
    _, world_size = world()
    if world_size == 1:
        return local.detach()
    with torch.no_grad():
        return _gather_rows(local.detach(), world_size)


def sum_over_ranks(value: Tensor) -> Tensor:
    """The sum of ``value`` over all ranks, on every rank, without gradient: a count that
    normalises a loss (PairSupCon's positive anchors of the global batch)."""
    _, world_size = world()
    if world_size == 1:
        return value.detach()
    summed = value.detach().clone()
    _note("all_reduce", summed, world_size)
    dist.all_reduce(summed, op=dist.ReduceOp.SUM)
    return summed


def require_equal_rows(rows: int, what: str = "per-rank batch") -> None:
    """Raise ``ValueError`` unless every rank passes the same ``rows`` (one tiny all-gather)."""
    _, world_size = world()
    if world_size == 1:
        return
    # Where the backend can only move device tensors (NCCL), the count must live there.
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    counts = _gather_rows(torch.tensor([rows], dtype=torch.long, device=device), world_size).tolist()
    if len(set(counts)) != 1:
        raise ValueError(
            f"every rank must hold the same number of rows in the {what} (the global batch is "
            f"gathered rank by rank); got {counts} across {world_size} ranks. Make the global "
            "batch size a multiple of the world size and drop incomplete last batches."
        )


def average_gradients(parameters: list[torch.nn.Parameter]) -> None:
    """Average the gradients of ``parameters`` over all ranks, in place, as DDP does (one flat
    all-reduce): the parameters an FSDP2 run keeps whole on every rank (the heads,
    :mod:`vascl_scale.train.fsdp`). Parameters without a gradient are skipped."""
    _, world_size = world()
    grads = [p.grad for p in parameters if p.grad is not None]
    if world_size == 1 or not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    _note("all_reduce", flat, world_size)
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= world_size
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def device_mesh(device_type: str, replicas: int, shard_size: int):
    """The FSDP2 mesh of all ranks: ``replicas`` x ``shard_size`` (dims "replicate", "shard") for
    hybrid sharding, one "shard" dim when ``replicas`` is 1."""
    from torch.distributed.device_mesh import init_device_mesh

    _, world_size = world()
    assert replicas * shard_size == world_size, (replicas, shard_size, world_size)
    if replicas == 1:
        return init_device_mesh(device_type, (shard_size,), mesh_dim_names=("shard",))
    return init_device_mesh(device_type, (replicas, shard_size), mesh_dim_names=("replicate", "shard"))


def global_norm(local_norm: Tensor) -> Tensor:
    """A plain tensor of a norm computed from sharded (DTensor) gradients: the whole norm, on every rank."""
    full_tensor = getattr(local_norm, "full_tensor", None)
    return full_tensor() if full_tensor is not None else local_norm

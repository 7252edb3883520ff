"""FSDP2, the second sharded engine: ``vascl-scale train --fsdp configs/fsdp/full-shard.yaml``.

The backbone is sharded with ``torch.distributed.fsdp.fully_shard`` directly, not through
accelerate's FSDP plugin, for three reasons:

- the projection head and PairSupCon's classifier stay whole on every rank. The objectives
  call them outside the encoder's forward, several times per loss call (VaSCL's views and its
  perturbed view). The cached step also goes through them with ``autograd.grad`` and then
  once more in a backward. Per-module gather and release hooks handle that pattern awkwardly:
  ZeRO-3 needs a re-gather there (:meth:`TrainingStep._released_heads_gathered`). The heads are
  under 1% of the parameters, so their gradients are averaged with one all-reduce
  (:func:`vascl_scale.distributed.average_gradients`), as DDP would;
- the units are explicit: each transformer block (the backbone's ``_no_split_modules``:
  ``BertLayer``, ``Qwen3DecoderLayer``, ...), then the backbone as the root. The mesh is
  explicit too: one dimension, or (replicate, shard) for ``hybrid_shard``;
- the optimiser is built after sharding, on the sharded (DTensor) parameters, and checkpoints
  go through ``torch.distributed.checkpoint`` (DCP) with the state-dict helpers of
  ``torch.distributed.checkpoint.state_dict``. accelerate's FSDP2 path instead swaps an
  optimiser's parameters after the fact and saves through its own layout.

The Accelerator of an FSDP2 run is a plain multi-process one (gloo on CPU, NCCL on GPU). It
prepares the optimiser for its accumulation boundaries and never wraps the model.

What FSDP2 moves per optimiser step, per rank, with P the trainable parameters' bytes and W
ranks (ring algorithms; ``vascl-scale bench comm``):

- full_shard: each block's parameters are all-gathered before each forward and again before
  each backward. The gradients are reduce-scattered once per step (``gradient_sync: step``,
  the default) or once per backward (``gradient_sync: backward``);
- shard_grad_op: one all-gather per forward that follows a backward (the parameters stay
  gathered from a forward until the next backward is done), and the same reduce-scatters;
- hybrid_shard: full_shard within a group, and an all-reduce of the reduced gradient shards
  across groups.

The cached step (m chunks per view, n views) runs 2 n m forwards and n m backwards. Under
full_shard that is 3 n m gathers of the parameters. With ``gradient_sync: step`` there is
still one reduce-scatter of the gradients per step. The price: between the backwards each
rank holds unsharded gradients (P bytes), as DDP does. ``gradient_sync: backward`` keeps them
sharded (P / W) and reduce-scatters n m times, as ZeRO-2/3 do.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from vascl_scale.config import FsdpConfig
from vascl_scale.distributed import device_mesh, global_norm, local_world_size, world

logger = logging.getLogger(__name__)

SHARDED_STATE = "fsdp"  # a checkpoint's DCP directory: model (heads included) and optimiser, sharded


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``model``'s backbone was sharded by :func:`shard_model`."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(getattr(model, "encoder", None), FSDPModule)


def transformer_blocks(encoder: torch.nn.Module, class_names: list[str] | None) -> list[torch.nn.Module]:
    """The modules of ``encoder`` sharded as units, innermost first: those whose class is named in
    ``class_names``, or in the backbone's ``_no_split_modules`` when None."""
    names = set(class_names or getattr(encoder, "_no_split_modules", None) or ())
    blocks = [m for m in encoder.modules() if m is not encoder and type(m).__name__ in names]
    if not blocks:
        present = sorted({type(m).__name__ for m in encoder.modules() if m is not encoder})
        raise ValueError(
            f"FSDP2: no module of the backbone is of a class in {sorted(names) or '[] (it declares no _no_split_modules)'}; "
            f"set transformer_layer_cls_to_wrap in the --fsdp file to its block's class, one of {', '.join(present)}"
        )
    return blocks[::-1]  # modules() is pre-order: children after their parents; shard children first


def mesh_shape(settings: FsdpConfig, world_size: int, ranks_per_machine: int) -> tuple[int, int]:
    """(replicas, shard group size) of the run's mesh."""
    if settings.sharding_strategy != "hybrid_shard":
        return 1, world_size
    shard_size = settings.shard_size or ranks_per_machine
    if world_size % shard_size:
        raise ValueError(
            f"FSDP2 hybrid_shard: shard groups of {shard_size} ranks do not divide the {world_size} ranks; "
            "set shard_size in the --fsdp file to a divisor of the world size"
        )
    return world_size // shard_size, shard_size


def shard_model(
    model: torch.nn.Module, settings: FsdpConfig, precision: str, device: torch.device, compile_blocks: bool = False
) -> str:
    """Shard ``model``'s backbone in place (module doc); returns what was done, for the log.

    The model is on ``device`` first (``fully_shard`` keeps a module where it is). ``precision``
    (the run plan's) bf16 casts the parameters to bf16 for the forward and backward, the
    gradients reduced in ``settings.reduce_dtype``. ``compile_blocks`` (``train.compile``): each
    block through ``torch.compile`` before it is sharded, as torchtitan does, so that FSDP2's
    gather hooks sit between compiled blocks instead of breaking one compiled backbone."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    assert precision in ("no", "bf16"), precision  # the plan refuses fp16 under FSDP2
    _, world_size = world()
    replicas, shard_size = mesh_shape(settings, world_size, local_world_size(world_size))
    mesh = device_mesh(device.type, replicas, shard_size)
    mixed = (
        MixedPrecisionPolicy(
            param_dtype=torch.bfloat16,
            reduce_dtype=torch.float32 if settings.reduce_dtype == "float32" else torch.bfloat16,
        )
        if precision == "bf16"
        else MixedPrecisionPolicy()
    )
    options = {
        "mesh": mesh,
        "reshard_after_forward": settings.sharding_strategy != "shard_grad_op",
        "mp_policy": mixed,
        # Pinned host memory needs an accelerator to pin for.
        "offload_policy": CPUOffloadPolicy(pin_memory=device.type == "cuda")
        if settings.cpu_offload
        else OffloadPolicy(),
    }
    if not settings.cpu_offload:
        model.to(device)
    blocks = transformer_blocks(model.encoder, settings.transformer_layer_cls_to_wrap)
    for block in blocks:
        if compile_blocks:
            block.compile()
        fully_shard(block, **options)
    fully_shard(model.encoder, **options)
    if settings.cpu_offload:  # the heads are not sharded: they go to the device themselves
        for module in (model.head, model.classifier):
            if module is not None:
                module.to(device)
    classes = ", ".join(sorted({type(b).__name__.removeprefix("FSDP") for b in blocks}))
    groups = f"{replicas} replicas of {shard_size}-rank shard groups" if replicas > 1 else f"{shard_size} ranks"
    return (
        f"FSDP2 {settings.sharding_strategy} over {groups}: {len(blocks)} units ({classes}) and the backbone's root; "
        f"the heads whole on every rank; gradients reduced once per {settings.gradient_sync}"
        + (f"; bf16 parameters, {settings.reduce_dtype} reduction" if precision == "bf16" else "")
        + ("; parameters, gradients and optimiser state offloaded to the CPU" if settings.cpu_offload else "")
    )


def set_gradient_sync(model: torch.nn.Module, sync: bool) -> None:
    """Reduce the backbone's gradients in the coming backward (True), or accumulate them unsharded
    on each rank (False), FSDP2's counterpart of DDP's ``no_sync``."""
    model.encoder.set_requires_gradient_sync(sync)


def clip_grad_norm_(parameters: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """Scale the gradients so that their global 2-norm is at most ``max_norm``; returns that norm.

    The backbone's gradients are sharded (DTensor) and the heads' are whole on every rank: the
    two groups' norms are taken apart (foreach kernels take one kind) and combined."""
    from torch.distributed.tensor import DTensor
    from torch.nn.utils import clip_grads_with_norm_, get_total_norm

    with_grad = [p for p in parameters if p.grad is not None]
    groups = [
        [p for p in with_grad if isinstance(p.grad, DTensor)],
        [p for p in with_grad if not isinstance(p.grad, DTensor)],
    ]
    norms = [global_norm(get_total_norm([p.grad for p in group])) for group in groups if group]
    device = norms[-1].device
    total = torch.stack([n.to(device, torch.float32) for n in norms]).norm()
    for group in groups:
        if group:
            clip_grads_with_norm_(group, max_norm, total.to(group[0].grad.device))
    return total


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's state (every shard gathered) on rank 0, in CPU memory; {} on the other
    ranks. Every rank calls this (it gathers)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def save_sharded(model: torch.nn.Module, optimizer: torch.optim.Optimizer, directory: Path) -> None:
    """Each rank's shards of the model and the optimiser into ``directory`` (DCP: one
    ``__<rank>_0.distcp`` per rank and a ``.metadata``); every rank calls this."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(directory))


def load_sharded(model: torch.nn.Module, optimizer: torch.optim.Optimizer, directory: Path) -> None:
    """Restore :func:`save_sharded`'s state in place (after :func:`verify_sharded_files`)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=str(directory))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])

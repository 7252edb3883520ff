"""``vascl-scale bench comm``: bytes the embedding gathers move per step, against gradient traffic.

Computed: per rank and step, with the ring algorithms NCCL and gloo use (an all-gather of
n local bytes sends (W - 1) n; an all-reduce of N bytes sends 2 (W - 1) / W N; a
reduce-scatter or an all-gather of a partitioned N-byte tensor sends (W - 1) / W N):

* VaSCL gathers: e1 (b x d, no gradient) for the neighbour
  search, the features of its n = 2 views [z1; z2] (n b x D) and z* (b x D), plus the backward
  of the last two (n B x D and B x D): a reduce-scatter on NCCL, an all-reduce on gloo (which
  has no reduce-scatter; twice the bytes); SimCSE needs the features of its views with their
  backward. n is the number of the objective's inputs (``spec.inputs``). The training step
  checks no row counts across ranks (its batches are the run plan's per-device batch), so no
  other collective runs in a loss call.
* Gradient traffic: DDP all-reduces every trainable gradient; ZeRO-2 reduce-scatters the
  gradients and all-gathers the updated parameters; ZeRO-3 also all-gathers the parameters in
  the forward and again in the backward. FSDP2 (``gradient_sync: step``) reduce-scatters the
  gradients once per step; full_shard all-gathers the parameters for each forward and each
  backward, shard_grad_op once per backward (:mod:`vascl_scale.train.fsdp`).

The cached step (``--chunk-size`` c, m = ceil(b / c) chunks per view) sends the same DDP
gradient all-reduce once per step, and its gathers run their backward twice (once for d loss
/ d e, once for the head's gradient in the first chunk's backward; z*'s only with
``loss.detach: false``, since detached it does not reach the embeddings). ZeRO-2 and ZeRO-3 reduce
the gradients of every backward, n m per loss call instead of one, and ZeRO-3 gathers the
parameters for each of the 2 n m forwards and n m backwards.

Measured: one training step on W real gloo ranks (DDP) counts the payload of every
collective, the gathers through :func:`vascl_scale.distributed.record_traffic` and the
gradient buckets through a DDP communication hook, then applies the same ring formulas.
Bytes do not depend on the sequence length, so the measured step uses 4 tokens per sentence.
"""

from __future__ import annotations

from typing import Any

import torch

from vascl_scale.bench.step import build_bench_model
from vascl_scale.losses.spec import OBJECTIVES
from vascl_scale.train.step import chunk_count

MEASURE_MAX_LENGTH = 4  # collective sizes do not depend on it; short sequences keep the run cheap
REPORTED = ("vascl", "simcse")  # the objectives the report compares


def ring_bytes_sent(collective: str, payload: int, world_size: int) -> float:
    """Bytes one rank sends for a collective whose per-rank input tensor has ``payload`` bytes."""
    w = world_size
    if collective == "all_gather":
        return (w - 1) * payload
    if collective == "all_reduce":
        return 2 * (w - 1) / w * payload
    if collective in ("reduce_scatter", "all_gather_partitioned"):
        return (w - 1) / w * payload
    raise ValueError(f"unknown collective {collective!r}")


def gather_collectives(
    objective: str,
    global_batch: int,
    world_size: int,
    hidden: int,
    head_dim: int,
    element_bytes: int,
    cached: bool = False,
    detach: bool = True,
    backend: str = "nccl",
) -> list[tuple[str, int]]:
    """(collective, per-rank payload bytes) of one loss call of ``objective`` (``loss.detach``
    as given; the benchmarks use the default, true) on ``backend`` (nccl or gloo)."""
    backward = "reduce_scatter" if backend == "nccl" else "all_reduce"
    b = global_batch // world_size
    # The cached step runs the backward of a gather twice when the embeddings depend on it (for
    # d loss / d e, then with the head's gradient); z* depends on them only without detach.
    features_backwards = 2 if cached else 1
    augmented_backwards = 2 if cached and not detach else 1
    features = len(OBJECTIVES[objective].inputs) * b * head_dim * element_bytes  # every view's z
    calls = [("all_gather", features)] + [(backward, world_size * features)] * features_backwards
    if objective == "vascl":
        augmented = b * head_dim * element_bytes
        calls += [("all_gather", b * hidden * element_bytes)]  # e1 for the neighbour search
        calls += [("all_gather", augmented)] + [(backward, world_size * augmented)] * augmented_backwards
    return calls


def chunks_per_view(global_batch: int, world_size: int, chunk_size: int) -> int:
    """m: encoder forwards per view and loss call of the cached step (0 when uncached)."""
    return chunk_count(global_batch // world_size, chunk_size) if chunk_size else 0


def computed_traffic(
    trainable_params: int,
    hidden: int,
    head_dim: int,
    global_batch: int,
    world_size: int,
    element_bytes: int = 4,
    grad_bytes: int = 4,
    param_bytes: int = 4,
    chunk_size: int = 0,
    backend: str = "nccl",
) -> dict[str, Any]:
    """Bytes sent per rank and step by the gathers and by each gradient strategy."""
    w = world_size
    gradients = trainable_params * grad_bytes
    parameters = trainable_params * param_bytes
    # The views the cached step encodes in chunks: the reported objectives' number, one for all.
    (views,) = {len(OBJECTIVES[objective].inputs) for objective in REPORTED}
    m = chunks_per_view(global_batch, w, chunk_size)
    forwards, backwards = (2 * views * m, views * m) if m else (1, 1)
    reduce_scatters = backwards * ring_bytes_sent("reduce_scatter", gradients, w)
    strategies = {
        "ddp": ring_bytes_sent("all_reduce", gradients, w),
        "zero2": reduce_scatters + ring_bytes_sent("all_gather_partitioned", parameters, w),
        "zero3": reduce_scatters
        + (1 + forwards + backwards) * ring_bytes_sent("all_gather_partitioned", parameters, w),
        # FSDP2 with gradient_sync: step reduce-scatters once per step; full_shard gathers the
        # parameters for every forward and backward, shard_grad_op once per backward (they stay
        # gathered from a forward until the next backward is done).
        "fsdp_full_shard": ring_bytes_sent("reduce_scatter", gradients, w)
        + (forwards + backwards) * ring_bytes_sent("all_gather_partitioned", parameters, w),
        "fsdp_shard_grad_op": ring_bytes_sent("reduce_scatter", gradients, w)
        + backwards * ring_bytes_sent("all_gather_partitioned", parameters, w),
    }
    gathers = {
        objective: sum(
            ring_bytes_sent(c, b, w)
            for c, b in gather_collectives(
                objective, global_batch, w, hidden, head_dim, element_bytes, cached=m > 0, backend=backend
            )
        )
        for objective in REPORTED
    }
    return {"gathers": gathers, "gradients": strategies}


def measure_step(model: str, global_batch: int, k: int, head_dim: int, chunk_size: int = 0) -> dict[str, Any]:
    """On every rank of a gloo job: one training step (the trainer's own) of VaSCL and one of
    SimCSE under DDP, counting the gathers and the gradient all-reduce payloads."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    from vascl_scale.bench.step import bench_config, synthetic_batch
    from vascl_scale.distributed import record_traffic
    from vascl_scale.losses import build_objective
    from vascl_scale.train.step import TrainingStep
    from vascl_scale.train.trainer import build_accelerator, build_optimizer, prepare_for_training

    configs = {o: bench_config(o, model, global_batch, MEASURE_MAX_LENGTH, k, 15.0, "no") for o in REPORTED}
    torch.manual_seed(0)
    encoder = build_bench_model(model, head_dim)
    accelerator = build_accelerator(configs["vascl"], None, "no")  # DDP over gloo, float32
    world_size, rank = accelerator.num_processes, accelerator.process_index
    if world_size < 2:
        raise ValueError("the measured run needs at least 2 ranks")
    rows = configs["vascl"].per_device_batch_size(world_size)
    chunk_size = min(chunk_size, rows)
    ddp, optimizer = prepare_for_training(
        accelerator, encoder, build_optimizer(encoder, configs["vascl"]), configs["vascl"].train, rows
    )
    gradient_payloads: list[int] = []

    def counting_allreduce(state, bucket):
        gradient_payloads.append(bucket.buffer().numel() * bucket.buffer().element_size())
        return default_hooks.allreduce_hook(state, bucket)

    ddp.register_comm_hook(dist.group.WORLD, counting_allreduce)
    vocab = int(encoder.encoder.config.vocab_size)
    specs = [OBJECTIVES[o] for o in REPORTED]
    batch = synthetic_batch(specs, rows, MEASURE_MAX_LENGTH, vocab, torch.Generator().manual_seed(rank))
    measured: dict[str, Any] = {}
    for objective, config in configs.items():
        step = TrainingStep(
            accelerator, ddp, optimizer, build_objective(objective, config.loss.model_dump()), seed=0, per_device_batch=rows,
            chunk_size=chunk_size,
        )  # fmt: skip
        gradient_payloads.clear()
        with record_traffic() as gathers:
            step(iter([batch]), 0)
        measured[objective] = {
            "gathers": [{"collective": c, "payload": n} for c, n, _ in gathers],
            "gather_bytes_sent": sum(ring_bytes_sent(c, n, w) for c, n, w in gathers),
            "gradient_payload": sum(gradient_payloads),
            "gradient_bytes_sent_ddp": sum(ring_bytes_sent("all_reduce", n, world_size) for n in gradient_payloads),
        }
    # Leave no gloo thread running at exit (a worker could abort: "terminate called without an
    # active exception").
    accelerator.wait_for_everyone()
    accelerator.end_training()
    trainable = sum(p.numel() for p in encoder.parameters() if p.requires_grad)
    return {
        "rank": rank,
        "world_size": world_size,
        "trainable_params": trainable,
        "hidden": int(encoder.hidden_size),
        "head_dim": head_dim,
        "chunk_size": chunk_size,
        "measured": measured,
    }


def comm_report(
    model: str,
    global_batch: int,
    world_size: int,
    head_dim: int,
    measured: dict[str, Any] | None,
    chunk_size: int = 0,
    backend: str = "nccl",
) -> dict[str, Any]:
    """Computed traffic for ``world_size`` ranks on ``backend`` (and the measured gloo run when
    given, against the gloo formulas), with ratios."""
    if backend not in ("nccl", "gloo"):
        raise ValueError(f"--backend must be nccl or gloo; got {backend!r}")
    if measured is not None:
        trainable, hidden = measured["trainable_params"], measured["hidden"]
    else:
        encoder = build_bench_model(model, head_dim)
        trainable = sum(p.numel() for p in encoder.parameters() if p.requires_grad)
        hidden = int(encoder.hidden_size)
    computed = computed_traffic(
        trainable, hidden, head_dim, global_batch, world_size, chunk_size=chunk_size, backend=backend
    )
    ratios = {
        objective: {strategy: computed["gathers"][objective] / sent for strategy, sent in computed["gradients"].items()}
        for objective in REPORTED
    }
    report = {
        "model": model,
        "global_batch": global_batch,
        "world_size": world_size,
        "trainable_params": trainable,
        "hidden": hidden,
        "head_dim": head_dim,
        "chunk_size": chunk_size,
        "backend": backend,
        "chunks_per_view": chunks_per_view(global_batch, world_size, chunk_size),
        "computed": computed,
        "gather_share_of_gradient_traffic": ratios,
    }
    if measured is not None:
        w = measured["world_size"]
        report["measured"] = {"world_size": w, **measured["measured"]}
        report["measured_vs_computed"] = {
            objective: {
                "gathers": measured["measured"][objective]["gather_bytes_sent"]
                / sum(
                    ring_bytes_sent(c, n, w)
                    for c, n in gather_collectives(
                        objective,
                        global_batch,
                        w,
                        hidden,
                        head_dim,
                        4,
                        cached=measured["chunk_size"] > 0,
                        backend="gloo",
                    )
                ),
                "ddp_gradients": measured["measured"][objective]["gradient_bytes_sent_ddp"]
                / ring_bytes_sent("all_reduce", trainable * 4, w),
            }
            for objective in REPORTED
        }
    return report


def comm_table(report: dict[str, Any]):
    from rich.table import Table

    mib = 2**20
    cached = f", cached step with {report['chunks_per_view']} chunks per view" if report["chunk_size"] else ""
    table = Table(
        title=f"bench comm: {report['trainable_params'] / 1e6:.1f}M trainable params, global batch "
        f"{report['global_batch']}, {report['world_size']} ranks on {report['backend']}{cached} (MiB sent per rank and step)"
    )
    for column in ("traffic", "MiB per rank", "VaSCL gathers as share", "SimCSE gathers as share"):
        table.add_column(column, justify="right")
    gathers = report["computed"]["gathers"]
    table.add_row("VaSCL gathers", f"{gathers['vascl'] / mib:.3f}", "", "")
    table.add_row("SimCSE gathers", f"{gathers['simcse'] / mib:.3f}", "", "")
    for strategy, sent in report["computed"]["gradients"].items():
        shares = report["gather_share_of_gradient_traffic"]
        table.add_row(
            f"{strategy} gradients",
            f"{sent / mib:.1f}",
            f"{100 * shares['vascl'][strategy]:.2f}%",
            f"{100 * shares['simcse'][strategy]:.2f}%",
        )
    return table

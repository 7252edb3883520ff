"""Memory per device and bytes sent per rank and step of each engine (DDP, ZeRO-2, ZeRO-3,
FSDP2) for full fine-tuning of Qwen3-0.6B and Mistral-7B on 8 GPUs: arithmetic only, printed as
the table of docs/engines.md.

    python -m tools.engine_table

Memory: the model states alone, in bytes per parameter P and device, N devices, bf16 compute.
Activations are left out: the cached step bounds them by its chunk for every engine
(docs/batch-arithmetic.md).

- DDP (accelerate's bf16 autocast): float32 weights, gradients and two Adam moments on every
  device, 16 P;
- ZeRO-2 (DeepSpeed's bf16 mode): bf16 weights whole, the bf16 gradients, float32 master weights
  and moments partitioned, 2 P + 14 P / N (Rajbhandari et al. 2020, "ZeRO", section 5);
- ZeRO-3: all of it partitioned, 16 P / N, plus the module being gathered;
- FSDP2 full_shard (float32 sharded parameters cast to bf16 for compute): 16 P / N, plus a
  block being gathered. The cached step with ``gradient_sync: step`` adds the unsharded float32
  gradients its backwards accumulate before the one reduce-scatter, 4 P;
  ``gradient_sync: backward`` does not;
- FSDP2 shard_grad_op: 16 P / N plus the bf16 parameters it keeps gathered from a forward to its
  backward, 2 P.

Bytes: :func:`vascl_scale.bench.comm.computed_traffic` (the formulas of ``vascl-scale bench
comm``), with bf16 parameter gathers, float32 gradient reduction for DDP and FSDP2 (its
``reduce_dtype: float32``), bf16 for DeepSpeed's bf16 mode. The cached step uses B = 2048 and
chunks of 64: b = 256 rows per device, m = 4 chunks for each of n = 2 views.
"""

from __future__ import annotations

from tools.decoder_memory import MODELS as DECODERS
from vascl_scale.bench.comm import computed_traffic
from vascl_scale.train.step import chunk_count

DEVICES = 8
GLOBAL_BATCH, CHUNK = 2048, 64
VIEWS = 2
# (name, parameters of the base model AutoModel loads, hidden size): tools/decoder_memory.py's shapes.
MODELS = tuple((d.name, d.parameters(), d.hidden) for d in DECODERS if d.name in ("Qwen3-0.6B", "Mistral-7B-v0.1"))
GB = 1e9


def memory_bytes(engine: str, parameters: int, cached: bool) -> float:
    """Model-state bytes per device (module doc)."""
    p, n = parameters, DEVICES
    return {
        "DDP": 16 * p,
        "ZeRO-2": 2 * p + 14 * p / n,
        "ZeRO-3": 16 * p / n,
        "FSDP2 full_shard": 16 * p / n + (4 * p if cached else 0),
        "FSDP2 full_shard, gradient_sync: backward": 16 * p / n,
        "FSDP2 shard_grad_op": 16 * p / n + 2 * p + (4 * p if cached else 0),
    }[engine]


def sent_bytes(engine: str, parameters: int, hidden: int, cached: bool) -> float:
    """Gradient and parameter bytes one rank sends per optimiser step."""
    chunk = CHUNK if cached else 0
    fp32, bf16 = (
        computed_traffic(parameters, hidden, 128, GLOBAL_BATCH, DEVICES, 2, grad_bytes, 2, chunk)["gradients"]
        for grad_bytes in (4, 2)
    )
    backwards = VIEWS * chunk_count(GLOBAL_BATCH // DEVICES, CHUNK) if cached else 1
    reduce_scatter = (DEVICES - 1) / DEVICES * 4 * parameters
    return {
        "DDP": fp32["ddp"],
        "ZeRO-2": bf16["zero2"],
        "ZeRO-3": bf16["zero3"],
        "FSDP2 full_shard": fp32["fsdp_full_shard"],
        # one reduce-scatter per backward instead of one per step
        "FSDP2 full_shard, gradient_sync: backward": fp32["fsdp_full_shard"] + (backwards - 1) * reduce_scatter,
        "FSDP2 shard_grad_op": fp32["fsdp_shard_grad_op"],
    }[engine]


ENGINES = (
    "DDP",
    "ZeRO-2",
    "ZeRO-3",
    "FSDP2 full_shard",
    "FSDP2 full_shard, gradient_sync: backward",
    "FSDP2 shard_grad_op",
)


def table() -> str:
    names = [name for name, *_ in MODELS]
    header = (
        "| engine | "
        + " | ".join(f"memory per device, {n}: uncached / cached (GB)" for n in names)
        + " | "
        + " | ".join(f"sent per rank and step, {n}: uncached / cached (GB)" for n in names)
        + " |"
    )
    lines = [header, "|---|" + "---:|" * (2 * len(MODELS))]
    for engine in ENGINES:
        memory = [
            f"{memory_bytes(engine, p, False) / GB:.1f} / {memory_bytes(engine, p, True) / GB:.1f}"
            for _, p, _ in MODELS
        ]
        sent = [
            f"{sent_bytes(engine, p, h, False) / GB:.1f} / {sent_bytes(engine, p, h, True) / GB:.1f}"
            for _, p, h in MODELS
        ]
        lines.append(f"| {engine} | " + " | ".join(memory + sent) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())

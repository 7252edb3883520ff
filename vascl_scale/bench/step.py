"""``vascl-scale bench step``: wall time of full training steps, VaSCL against SimCSE, in one run.

A step is exactly what ``vascl-scale train`` runs per optimiser step: the one
:class:`vascl_scale.train.step.TrainingStep` (both dropout views through the encoder in one
forward, the objective with its gathers, the finiteness check, backward, the update), built
with the trainer's own factories (accelerator, optimiser groups, objective). The batch is synthetic (random token ids of the full max length), so the data
loader is not measured here (``bench data`` does that). Objectives alternate in rounds
(A B A B ...) so that drift of a shared machine hits both alike; the first ``warmup``
steps of each objective are dropped. Reported per objective: median, p10 and p90 step time,
sentences/s at the median, and peak memory (GPU: max allocated per objective; CPU: the
process's peak resident set, which only grows, so it is shown once); then the ratio of the
VaSCL median to the SimCSE median.
"""

from __future__ import annotations

import itertools
import logging
import resource
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vascl_scale.config import RunConfig, config_from_dict
from vascl_scale.model import SentenceEncoder

logger = logging.getLogger(__name__)

def build_bench_model(model: str, head_dim: int) -> SentenceEncoder:
    """A model directory (pretrained weights) or a Hugging Face ``config.json`` (random init)."""
    path = Path(model)
    if path.is_dir():
        return SentenceEncoder.from_pretrained(path, head_dim=head_dim)
    if path.is_file() and path.suffix == ".json":
        from transformers import AutoConfig, AutoModel

        encoder = AutoModel.from_config(AutoConfig.from_pretrained(str(path)))
        return SentenceEncoder(encoder, tokenizer=None, head_dim=head_dim)
    raise ValueError(f"--model {model}: expected a model directory or a Hugging Face config.json")


def bench_config(objective: str, model: str, global_batch: int, max_length: int, k: int, eps: float, precision: str) -> RunConfig:
    """The run config a training run with these settings would have (validated the same way)."""
    return config_from_dict(
        {
            "objective": objective,
            "model": {"path": model},
            "data": {"train": "synthetic", "max_length": max_length},
            "loss": {"k": k, "eps": eps, "xi": eps},
            "train": {"global_batch_size": global_batch, "precision": precision},
        }
    )


def run_step_bench(
    model: str,
    global_batch: int,
    objectives: list[str],
    steps: int = 10,
    warmup: int = 2,
    max_length: int = 32,
    k: int = 16,
    eps: float = 15.0,
    precision: str = "auto",
    deepspeed: str | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Time ``steps`` steps per objective (after ``warmup``) on this rank; every rank returns."""
    from vascl_scale.losses import OBJECTIVES, build_objective
    from vascl_scale.train.step import TrainingStep
    from vascl_scale.train.trainer import build_accelerator, build_optimizer, prepare_for_training

    unknown = [o for o in objectives if o not in OBJECTIVES]
    if unknown or not objectives:
        raise ValueError(f"--objective takes {' and/or '.join(OBJECTIVES)}, comma separated; got {objectives}")
    if steps < 1 or warmup < 0:
        raise ValueError(f"--steps must be >= 1 and --warmup >= 0; got {steps} and {warmup}")
    configs = {o: bench_config(o, model, global_batch, max_length, k, eps, precision) for o in objectives}
    first = configs[objectives[0]]

    torch.manual_seed(seed)
    encoder = build_bench_model(model, first.model.head_dim)
    encoder.train()
    accelerator = build_accelerator(first, deepspeed)
    world_size, rank = accelerator.num_processes, accelerator.process_index
    rows = first.per_device_batch_size(world_size)
    wrapped, optimizer = prepare_for_training(accelerator, encoder, build_optimizer(encoder, first), first)
    steps_of = {
        o: TrainingStep(accelerator, wrapped, optimizer, build_objective(o, configs[o].loss), seed=seed, per_device_batch=rows)
        for o in objectives
    }
    device = accelerator.device
    cuda = device.type == "cuda"

    vocab = int(encoder.encoder.config.vocab_size)
    generator = torch.Generator().manual_seed(seed + rank)
    ids = torch.randint(min(1000, vocab - 1), vocab, (rows, max_length), generator=generator)
    batches = itertools.repeat({"input_ids": ids, "attention_mask": torch.ones_like(ids)})  # (b, L), every step

    times: dict[str, list[float]] = {o: [] for o in objectives}
    peak_mb: dict[str, float] = {}
    for round_index in range(warmup + steps):
        for objective in objectives:
            if cuda:
                torch.cuda.synchronize()
                if round_index == warmup:
                    torch.cuda.reset_peak_memory_stats()
            started = time.perf_counter()
            steps_of[objective](batches, round_index)
            if cuda:
                torch.cuda.synchronize()
                peak_mb[objective] = max(peak_mb.get(objective, 0.0), torch.cuda.max_memory_allocated() / 2**20)
            elapsed = time.perf_counter() - started
            if round_index >= warmup:
                times[objective].append(elapsed)
    accelerator.wait_for_everyone()
    accelerator.end_training()  # leave no process-group thread running at exit (see bench comm)
    # Every rank waited for the slowest in the gathers: report rank 0's view.
    setup = {
        "model": model,
        "global_batch": global_batch,
        "per_device_batch": rows,
        "world_size": world_size,
        "max_length": max_length,
        "device": str(device),
        "deepspeed": deepspeed,
        "precision": first.train.precision,
        "steps": steps,
        "warmup": warmup,
    }
    return {**_summary(times, peak_mb, global_batch, setup), "rank": rank}


def _summary(times: dict[str, list[float]], peak_mb: dict[str, float], global_batch: int, setup: dict[str, Any]) -> dict[str, Any]:
    """Per objective: median, p10, p90 step time, sentences/s at the median, peak memory."""
    result: dict[str, Any] = {**setup, "objectives": {}}
    for objective in times:
        values = times[objective]
        median = statistics.median(values)
        result["objectives"][objective] = {
            "median_s": median,
            "p10_s": float(np.percentile(values, 10)),  # linear interpolation
            "p90_s": float(np.percentile(values, 90)),
            "sentences_per_s": global_batch / median,
            "peak_memory_mb": peak_mb.get(objective),
            "times_s": values,
        }
    result["process_peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    if "vascl" in times and "simcse" in times:
        result["vascl_over_simcse"] = result["objectives"]["vascl"]["median_s"] / result["objectives"]["simcse"]["median_s"]
    return result


def step_table(result: dict[str, Any]):
    from rich.table import Table

    title = (
        f"bench step: global batch {result['global_batch']} = {result['world_size']} x {result['per_device_batch']}, "
        f"max length {result['max_length']}, {result['device']}, {result['steps']} steps after {result['warmup']} warm-up"
    )
    table = Table(title=title)
    for column in ("objective", "median s", "p10 s", "p90 s", "sentences/s", "peak GPU MiB"):
        table.add_column(column, justify="right")
    for objective, stats in result["objectives"].items():
        peak = stats["peak_memory_mb"]
        table.add_row(
            objective,
            f"{stats['median_s']:.4f}",
            f"{stats['p10_s']:.4f}",
            f"{stats['p90_s']:.4f}",
            f"{stats['sentences_per_s']:.1f}",
            "-" if peak is None else f"{peak:.0f}",
        )
    return table


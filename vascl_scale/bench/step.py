"""``vascl-scale bench step``: wall time and peak memory of full training steps, VaSCL against
SimCSE, uncached and cached (``--chunk-size``).

A step is exactly what ``vascl-scale train`` runs per optimiser step: the one
:class:`vascl_scale.train.step.TrainingStep` (the objective's views through the encoder in one
forward, the objective with its gathers, the finiteness check, backward, the update), built
with the trainer's own factories (accelerator, optimiser groups, objective). The batch is
synthetic, random token ids of the full max length in each column the objective encodes and
cannot stand in for (SimCSE and VaSCL: the anchor, encoded twice as on single-text data;
supervised SimCSE: anchor, positive and ``--negatives`` N hard-negative columns), and random
labels, 0 or 1, where it reads them (PairSupCon), so the data loader is not measured here
(``bench data`` does that). PairSupCon's model carries the pairwise classifier, which another
objective would leave without a gradient: it is benched on its own. Objectives alternate in rounds
(A B A B ...) so that drift of a shared machine hits both alike; the first ``warmup``
steps of each objective are dropped. Reported per objective: median, p10 and p90 step time,
sentences/s at the median, and peak memory (GPU: max allocated per objective; CPU: the
process's peak resident set, which only grows, so it is shown once); then the ratio of the
VaSCL median to the SimCSE median. With ``--compare`` a peer's step (:mod:`vascl_scale.bench.peer`)
runs in the same rounds, and, first, ``vascl-scale train`` itself per objective on shards of the
same kind of batch, its step times read from its metrics (:mod:`vascl_scale.bench.loop`): the
loop, step and peer rows of one table. Peak resident memory is each rank's own (``ru_maxrss``),
summed over the ranks: an upper bound of the process tree's peak (the launcher excluded).

Several global batches or chunk sizes (``--global-batch 64,256 --chunk-size 0,64``) make a
grid: every cell runs as its own ``bench step`` process, so that each peak is the cell's own,
and the cells are tabulated and plotted together (:func:`run_grid`). A cell whose encoder
forward would hold more than ``--max-rows-per-forward`` sentences (n b uncached for n views, c
cached: what activation memory grows with) is skipped and listed as such.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from vascl_scale.bench import text_lines
from vascl_scale.config import RunConfig, config_from_dict
from vascl_scale.data.columns import ANCHOR, LABELS, SCORES, negative
from vascl_scale.figures import save_figure
from vascl_scale.flops import tflops_and_mfu
from vascl_scale.hub import locate_model
from vascl_scale.losses.spec import OBJECTIVES, ObjectiveSpec, objective_spec
from vascl_scale.model import SentenceEncoder
from vascl_scale.train.step import rows_per_forward

if TYPE_CHECKING:
    from vascl_scale.bench.loop import LoopTimes

logger = logging.getLogger(__name__)

COMPARE_ALONE = "--compare runs on one process without DeepSpeed (the peer is a single-process trainer)"
COMPILE_WITHOUT_DEEPSPEED = (
    "--compile times compiled steps beside eager ones on a second copy of the model, and DeepSpeed takes one engine per "
    "process: drop --deepspeed / --fsdp (train.compile itself runs under ZeRO-2: vascl-scale train --set train.compile=true)"
)
COMPILED = " compiled"  # the suffix of a compiled step's row name
PACKED = " packed"  # the suffix of a step's row with its rows packed (--packed)
ROW_ORDER = " row order"  # the suffix of a step's row as it ran before length sorting (--row-order)


def compiled_name(objective: str) -> str:
    """The row of ``objective``'s step with the encoder compiled (``--compile``)."""
    return objective + COMPILED


def build_bench_model(
    model: str,
    head_dim: int,
    pair_classifier: bool = False,
    attn_implementation: str | None = None,
    packed: bool = False,
) -> SentenceEncoder:
    """A Hugging Face ``config.json`` (random init, no tokenizer), or pretrained weights named as
    ``model.path`` names them (a directory, ``package:MODULE/SUBDIR``, a hub id); with the pairwise
    classifier when ``pair_classifier``, the attention backend ``attn_implementation`` (None:
    transformers' default), rows packed when ``packed`` (:mod:`vascl_scale.packing`)."""
    path = Path(model)
    attention = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    if path.is_file() and path.suffix == ".json":
        from transformers import AutoConfig, AutoModel

        encoder = AutoModel.from_config(AutoConfig.from_pretrained(str(path)), **attention)
        return SentenceEncoder(
            encoder, tokenizer=None, head_dim=head_dim, pair_classifier=pair_classifier, packed=packed
        )
    location = locate_model(model, "--model")
    if not location.directory.is_dir():
        raise ValueError(
            f"--model {model}: expected a model directory, package:MODULE/SUBDIR, a hub id or a Hugging Face config.json"
        )
    return SentenceEncoder.from_pretrained(
        location.directory, head_dim=head_dim, pair_classifier=pair_classifier, packed=packed, **attention
    )


def bench_objectives(names: list[str]) -> list[ObjectiveSpec]:
    """The declarations of the objectives ``--objective`` names; ValueError for an unknown one,
    or for one that trains the pairwise classifier beside one that does not."""
    if not names:
        raise ValueError(f"--objective takes {', '.join(OBJECTIVES)}, comma separated; got none")
    specs = [objective_spec(name, "--objective") for name in names]
    with_classifier = [spec.name for spec in specs if spec.classifier]
    if with_classifier and len(with_classifier) != len(specs):
        raise ValueError(
            f"--objective {','.join(names)}: {', '.join(with_classifier)} trains a pairwise classifier that the others "
            "would leave without a gradient (DDP and ZeRO need one for every parameter); bench it on its own"
        )
    return specs


def synthetic_columns(specs: list[ObjectiveSpec], negatives: int) -> tuple[str, ...]:
    """The columns that one of ``specs`` encodes and cannot stand in for, with ``negatives``
    hard-negative columns where one takes them (``--negatives``; ValueError below 1 there)."""
    if negatives < 1 and any(spec.hard_negatives for spec in specs):
        taking = ", ".join(spec.name for spec in specs if spec.hard_negatives)
        raise ValueError(
            f"--negatives must be >= 1: {taking} encodes at least one hard-negative column; got {negatives}"
        )
    hard = tuple(negative(index) for index in range(negatives))
    wanted = (
        column
        for spec in specs
        for column in (*spec.inputs, *(hard if spec.hard_negatives else ()))
        if column not in spec.stand_ins
    )
    return tuple(dict.fromkeys(wanted))


def bench_views(specs: list[ObjectiveSpec], negatives: int) -> int:
    """The most views an objective of ``specs`` encodes on the synthetic batch (what its forward holds)."""
    columns = synthetic_columns(specs, negatives)
    return max(len(spec.encoded_columns(columns + spec.value_columns)) for spec in specs)


def synthetic_values(
    specs: list[ObjectiveSpec], rows: int, negatives: int, generator: torch.Generator
) -> dict[str, torch.Tensor]:
    """Random values of each column of numbers one of ``specs`` reads, drawn in that order from
    ``generator``: labels (rows,), 0 or 1; teacher scores (rows, 1 + negatives) in [-1, 1)."""
    values = {}
    for column in dict.fromkeys(column for spec in specs for column in spec.value_columns):
        if column == SCORES:
            values[column] = torch.rand(rows, 1 + negatives, generator=generator) * 2 - 1
        else:
            values[column] = torch.randint(0, len(LABELS), (rows,), generator=generator)
    return values


def synthetic_batch(
    specs: list[ObjectiveSpec], rows: int, tokens: int, vocab: int, generator: torch.Generator, negatives: int = 1
) -> dict:
    """Random ids (rows, tokens) and a full mask in each of :func:`synthetic_columns`, and the
    :func:`synthetic_values` one of ``specs`` reads, drawn in that order from ``generator``."""
    batch = {}
    for column in synthetic_columns(specs, negatives):
        ids = torch.randint(min(1000, vocab - 1), vocab, (rows, tokens), generator=generator)
        batch[column] = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}  # (b, L)
    return {**batch, **synthetic_values(specs, rows, negatives, generator)}


def bench_config(
    objective: str,
    model: str,
    global_batch: int,
    max_length: int,
    k: int,
    eps: float,
    precision: str,
    chunk_size: int = 0,
    seed: int = 0,
    compile: bool = False,
    chunk_tokens: int = 0,
    length_buckets: int | str = "auto",
) -> RunConfig:
    """The run config a training run with these settings would have (validated the same way)."""
    return config_from_dict(
        {
            "objective": objective,
            "model": {"path": model},
            "data": {"train": "synthetic", "max_length": max_length},
            "loss": {"k": k, "eps": eps, "xi": eps},
            "train": {
                "global_batch_size": global_batch,
                "precision": precision,
                "chunk_size": chunk_size,
                "chunk_tokens": chunk_tokens,
                "length_buckets": length_buckets,
                "seed": seed,
                "compile": compile,
            },
        }
    )


def text_batches(
    lines: list[str],
    tokenizer,
    specs: list[ObjectiveSpec],
    global_batch: int,
    rank: int,
    world_size: int,
    max_length: int,
    negatives: int,
    generator: torch.Generator,
) -> list[dict]:
    """This rank's rows of consecutive global batches of real text: each text column of
    :func:`synthetic_columns` takes the next ``global_batch`` lines, tokenised (truncated to
    ``max_length``) and padded to its longest row over the global batch, as the loader pads; the
    :func:`synthetic_values` an objective reads."""
    columns = synthetic_columns(specs, negatives)
    rows = global_batch // world_size
    own = slice(rank * rows, (rank + 1) * rows)
    batches, cursor = [], 0
    while cursor + global_batch * len(columns) <= len(lines):
        batch = {}
        for column in columns:
            texts = lines[cursor : cursor + global_batch]
            cursor += global_batch
            tokens = tokenizer(texts, truncation=True, max_length=max_length, padding="longest", return_tensors="pt")
            batch[column] = {k: v[own] for k, v in tokens.items() if k in ("input_ids", "attention_mask")}
        values = synthetic_values(specs, global_batch, negatives, generator)
        batches.append({**batch, **{column: value[own] for column, value in values.items()}})
    return batches


class TokenCounter:
    """Token positions the encoder computed, summed over its forwards: a forward hook on its input
    embeddings (called as a module by every model, whoever calls the model's ``forward``), which see
    (b, L) ids per padded forward and (1, T) per packed one."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.computed = 0
        model.get_input_embeddings().register_forward_pre_hook(self._count)

    def _count(self, module, args) -> None:
        self.computed += args[0].numel()


def row_order_name(objective: str) -> str:
    """The row of ``objective``'s step before length sorting (``--row-order``)."""
    return objective + ROW_ORDER


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
    fsdp: str | None = None,
    seed: int = 0,
    chunk_size: int = 0,
    peak_tflops: float = 0.0,
    compare: str | None = None,
    negatives: int = 1,
    compile: bool = False,
    text: Path | None = None,
    chunk_tokens: int = 0,
    length_buckets: int | str = "auto",
    row_order: bool = False,
    attn_implementation: str | None = None,
    packed: bool = False,
) -> dict[str, Any]:
    """Time ``steps`` steps per objective (after ``warmup``) on this rank; every rank returns.
    ``peak_tflops``: the device's peak, for MFU (0: none). ``compare``: a peer
    (:data:`vascl_scale.bench.peer.PEERS`) timed in the same rounds, on one process only.
    ``negatives``: the hard-negative columns of the batch of an objective that takes them.
    ``compile``: also time each objective's step with the encoder through ``torch.compile``
    (``train.compile``), on a second copy of the model, in the same rounds as the eager steps,
    so the ratio of the two cancels the machine's drift; the compiling is in the compiled rows'
    warm-up steps, whose times are reported apart (``warmup_s``), and the training loop rows
    run compiled. ``text``: real sentences (one per line), a new global batch each round, every
    row timed on the same one; else one synthetic batch of full-length rows. ``chunk_tokens``,
    ``length_buckets``: as ``train.chunk_tokens`` and ``train.length_buckets``. ``row_order``:
    also time each objective as it ran before length sorting (chunks in row order, one uncached
    forward), on the same model, in the same rounds. ``attn_implementation``: every model's
    attention backend; ``packed``: also time each objective with its rows packed
    (:mod:`vascl_scale.packing`), on a second copy of the model, in the same rounds. ``fsdp``:
    an FSDP2 settings file (``vascl-scale train --fsdp``): the model sharded by it."""
    from vascl_scale.bench.loop import run_training_loops
    from vascl_scale.bench.peer import PEERS, comparable_model_directory, sentence_transformers_step
    from vascl_scale.config import load_fsdp_config
    from vascl_scale.losses import build_objective
    from vascl_scale.precision import train_precision
    from vascl_scale.train.fsdp import shard_model
    from vascl_scale.train.plan import gathers_per_forward
    from vascl_scale.train.plan import length_buckets as resolve_length_buckets
    from vascl_scale.train.step import TrainingStep
    from vascl_scale.train.trainer import build_accelerator, build_optimizer, prepare_for_training

    specs = bench_objectives(objectives)
    views = bench_views(specs, negatives)
    if steps < 1 or warmup < 0:
        raise ValueError(f"--steps must be >= 1 and --warmup >= 0; got {steps} and {warmup}")
    if compile and (deepspeed is not None or fsdp is not None):
        raise ValueError(COMPILE_WITHOUT_DEEPSPEED)
    if fsdp is not None and deepspeed is not None:
        raise ValueError(f"--fsdp {fsdp} and --deepspeed {deepspeed} name two engines; pass one of them")
    fsdp_settings = load_fsdp_config(fsdp) if fsdp is not None else None
    settings = dict(chunk_tokens=chunk_tokens, length_buckets=length_buckets)
    configs = {
        o: bench_config(o, model, global_batch, max_length, k, eps, precision, chunk_size, seed, compile, **settings)
        for o in objectives
    }
    first = configs[objectives[0]]
    run_precision = train_precision(first.train.precision)
    rounds = warmup + steps
    lines = None
    if text is not None:
        lines = text_lines(Path(text), rounds * global_batch * len(synthetic_columns(specs, negatives)), repeat=True)
    loops: dict[str, LoopTimes] = {}
    if compare is not None:
        if compare not in PEERS:
            raise ValueError(f"--compare takes {', '.join(PEERS)}; got {compare!r}")
        if deepspeed is not None or fsdp is not None or int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise ValueError(COMPARE_ALONE)
        model_dir = comparable_model_directory(model)
        # Before this process builds anything: the loop's process has the machine to itself.
        loops = run_training_loops(configs, model_dir, synthetic_columns(specs, negatives), steps, warmup, lines)

    accelerator = build_accelerator(first, deepspeed, run_precision)
    world_size, rank = accelerator.num_processes, accelerator.process_index
    rows = first.per_device_batch_size(world_size)
    zero_stage = int(accelerator.state.deepspeed_plugin.zero_stage) if deepspeed is not None else 0

    def training_steps(compiled: bool, packed_rows: bool = False) -> tuple[torch.nn.Module, dict[str, TrainingStep]]:
        """The model (the same initial weights each time) and a step per objective on it (and,
        with ``row_order``, per objective as it ran before length sorting)."""
        torch.manual_seed(seed)
        encoder = build_bench_model(
            model, first.model.head_dim, specs[0].classifier, attn_implementation, packed=packed_rows
        )
        encoder.train()
        config = bench_config(
            objectives[0], model, global_batch, max_length, k, eps, precision, chunk_size, seed, compiled, **settings
        )
        if fsdp_settings is not None:
            shard_model(encoder, fsdp_settings, run_precision, accelerator.device)
        wrapped, optimizer = prepare_for_training(
            accelerator, encoder, build_optimizer(encoder, config), config.train, rows
        )
        buckets = resolve_length_buckets(
            config.train.length_buckets, gathers_per_forward(zero_stage, fsdp_settings), encoder.packed
        )

        def step_of(objective: str, sorted_rows: bool) -> TrainingStep:
            return TrainingStep(
                accelerator, wrapped, optimizer, build_objective(objective, configs[objective].loss.model_dump()),
                seed=seed, per_device_batch=rows, chunk_size=chunk_size, precision=run_precision,
                chunk_tokens=chunk_tokens if sorted_rows else 0, sort_chunks=sorted_rows,
                length_buckets=buckets if sorted_rows else 1,
                reduce_every_backward=fsdp_settings is not None and fsdp_settings.gradient_sync == "backward",
            )  # fmt: skip

        made = {o: step_of(o, True) for o in objectives}
        if row_order and not compiled and not packed_rows:
            made.update({row_order_name(o): step_of(o, False) for o in objectives})
        return encoder, made

    encoder, steps_of = training_steps(compiled=False)
    device = accelerator.device
    cuda = device.type == "cuda"
    counters = {}  # row name -> TokenCounter of the encoder it runs
    ours_counter = TokenCounter(encoder.encoder)
    passes = 2 if chunk_size else 1  # the cached step (ours and the peer's) encodes every row twice

    def encoded_tokens(step: TrainingStep):
        """Real tokens a step of ``step`` encodes on this rank in round ``index``: every view's."""
        return lambda index: sum(
            int(batch_of(index)[column]["attention_mask"].sum()) for column in step.encoded_columns(batch_of(index))
        )

    def ours(step: TrainingStep):
        return lambda index: step(iter([batch_of(index)]), index).model_flops

    timed = {o: ours(step) for o, step in steps_of.items()}  # name -> (round index -> model FLOPs of the step)
    counters.update(dict.fromkeys(timed, ours_counter))
    real_tokens = {o: encoded_tokens(step) for o, step in steps_of.items()}  # name -> (round index -> real tokens)
    if compile:
        compiled_encoder, compiled_steps = training_steps(compiled=True)
        timed.update({compiled_name(o): ours(compiled_steps[o]) for o in objectives})
        real_tokens.update({compiled_name(o): real_tokens[o] for o in objectives})
        counters.update(dict.fromkeys((compiled_name(o) for o in objectives), TokenCounter(compiled_encoder.encoder)))
    if packed:
        packed_encoder, packed_steps = training_steps(compiled=False, packed_rows=True)
        timed.update({o + PACKED: ours(packed_steps[o]) for o in objectives})
        real_tokens.update({o + PACKED: real_tokens[o] for o in objectives})
        counters.update(dict.fromkeys((o + PACKED for o in objectives), TokenCounter(packed_encoder.encoder)))
    if compare is not None:
        peer_step, peer_flops, peer_encoder = sentence_transformers_step(
            str(model_dir), rows, max_length, run_precision, chunk_size, chunk_tokens
        )

        def peer(index: int) -> int:
            peer_step(batch_of(index)[ANCHOR])
            return peer_flops

        timed[compare] = peer
        counters[compare] = TokenCounter(peer_encoder)
        real_tokens[compare] = lambda index: 2 * int(batch_of(index)[ANCHOR]["attention_mask"].sum())  # two views

    generator = torch.Generator().manual_seed(seed + rank)
    if lines is not None:
        if encoder.tokenizer is None:
            raise ValueError(f"--text needs a --model with a tokenizer to tokenise it; {model} has none")
        pool = text_batches(
            lines, encoder.tokenizer, specs, global_batch, rank, world_size, max_length, negatives, generator
        )
    else:
        vocab = int(encoder.encoder.config.vocab_size)
        pool = [synthetic_batch(specs, rows, max_length, vocab, generator, negatives)]  # every step

    def batch_of(index: int) -> dict:
        return pool[index % len(pool)]

    times: dict[str, list[float]] = {o: [] for o in timed}
    warmup_times: dict[str, list[float]] = {o: [] for o in timed}
    flops: dict[str, int] = {}
    peak_mb: dict[str, float] = {}
    shares: dict[str, tuple[int, int]] = {o: (0, 0) for o in timed}  # name -> (real, computed) token positions
    for round_index in range(rounds):
        for objective, run_step in timed.items():
            if cuda:
                torch.cuda.synchronize()
                if round_index == warmup:
                    torch.cuda.reset_peak_memory_stats()
            counter = counters[objective]
            computed = counter.computed
            started = time.perf_counter()
            flops[objective] = run_step(round_index)
            if cuda:
                torch.cuda.synchronize()
                peak_mb[objective] = max(peak_mb.get(objective, 0.0), torch.cuda.max_memory_allocated() / 2**20)
            elapsed = time.perf_counter() - started
            (times if round_index >= warmup else warmup_times)[objective].append(elapsed)
            if round_index >= warmup:
                real, total = shares[objective]
                shares[objective] = (real + real_tokens[objective](round_index), total + counter.computed - computed)
    own_peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux
    rank_peaks_mb = accelerator.gather(torch.tensor([own_peak_mb], dtype=torch.float64, device=device)).tolist()
    # Real tokens a step of each row encodes over every rank (each view of each column), per timed round.
    own_tokens = [sum(real_tokens[name](index) for index in range(warmup, rounds)) for name in timed]
    global_tokens = accelerator.reduce(torch.tensor(own_tokens, device=device), reduction="sum").tolist()
    accelerator.wait_for_everyone()
    accelerator.end_training()  # leave no process-group thread running at exit (see bench comm)
    # Every rank waited for the slowest in the gathers: report rank 0's view.
    setup = {
        "model": model,
        "global_batch": global_batch,
        "per_device_batch": rows,
        "world_size": world_size,
        "max_length": max_length,
        "text": str(text) if text is not None else None,
        "device": str(device),
        "deepspeed": deepspeed,
        "fsdp": fsdp,
        "precision": run_precision,
        "compile": compile,
        "steps": steps,
        "warmup": warmup,
        "chunk_size": chunk_size,
        "chunk_tokens": chunk_tokens,
        "length_buckets": steps_of[objectives[0]].length_buckets,
        "attn_implementation": attn_implementation,
        "peak_tflops": peak_tflops,
        "negatives": negatives if any(spec.hard_negatives for spec in specs) else 0,
        "rows_per_forward": rows_per_forward(rows, chunk_size, views),
        "peak_rss_mb": sum(rank_peaks_mb),
        "peak_rss_mb_per_rank": rank_peaks_mb,
    }
    result = _summary(times, flops, peak_mb, global_batch, setup, loops, compare)
    for name, values in warmup_times.items():
        rows_of = result["compiled"] if name.endswith(COMPILED) else result["objectives"]
        row = rows_of[name.removesuffix(COMPILED)]
        row["warmup_s"] = values
    for name, (real, computed), tokens in zip(shares, shares.values(), global_tokens):
        row = (result["compiled"] if name.endswith(COMPILED) else result["objectives"])[name.removesuffix(COMPILED)]
        row["real_token_share"] = passes * real / computed if computed else None  # computed: both passes
        row["real_tokens_per_step"] = tokens / steps
        row["tokens_per_s"] = row["real_tokens_per_step"] / row["median_s"]
    return {**result, "rank": rank}


def _summary(
    times: dict[str, list[float]],
    flops: dict[str, int],
    peak_mb: dict[str, float],
    global_batch: int,
    setup: dict[str, Any],
    loops: dict[str, LoopTimes],
    peer: str | None = None,
) -> dict[str, Any]:
    """Per objective (and ``peer``, the compared system): :func:`_row` under ``"objectives"``;
    per objective's compiled step (``times`` of :func:`compiled_name`) the same under
    ``"compiled"``; per objective's training loop (``loops``) under ``"loops"``, its FLOPs those
    of the objective's step (the same shapes); and the ratios of their sentences/s (a loop's to
    the compiled step's when the steps were compiled, as the loop then is)."""
    result: dict[str, Any] = {**setup, "objectives": {}}
    measured = {
        name: _row(values, flops[name], peak_mb.get(name), global_batch, setup["peak_tflops"])
        for name, values in times.items()
    }
    compiled = {name.removesuffix(COMPILED): row for name, row in measured.items() if name.endswith(COMPILED)}
    result["objectives"] = {name: row for name, row in measured.items() if not name.endswith(COMPILED)}
    stats = result["objectives"]
    if "vascl" in stats and "simcse" in stats:
        result["vascl_over_simcse"] = stats["vascl"]["median_s"] / stats["simcse"]["median_s"]
    ours = [name for name in stats if name != peer]
    packed_rows = {name.removesuffix(PACKED): row for name, row in stats.items() if name.endswith(PACKED)}
    if packed_rows:
        result["packed_over_padded"] = {o: stats[o]["median_s"] / row["median_s"] for o, row in packed_rows.items()}
    ordered = {name.removesuffix(ROW_ORDER): row for name, row in stats.items() if name.endswith(ROW_ORDER)}
    if ordered:
        result["sorted_over_row_order"] = {o: row["median_s"] / stats[o]["median_s"] for o, row in ordered.items()}
    if compiled:
        result["compiled"] = compiled
        result["compiled_over_eager"] = {o: stats[o]["median_s"] / compiled[o]["median_s"] for o in compiled}
    if peer is not None:  # sentences/s of each vascl-scale row over the peer's, at the same batch
        result["speedup_over_peer"] = {o: stats[peer]["median_s"] / stats[o]["median_s"] for o in ours}
        if compiled:
            result["compiled_speedup_over_peer"] = {
                o: stats[peer]["median_s"] / row["median_s"] for o, row in compiled.items()
            }
    if loops:
        result["loops"] = {
            o: _row(loop.times_s, flops[o], loop.peak_memory_mb, global_batch, setup["peak_tflops"])
            for o, loop in loops.items()
        }
        loop_stats, steps_run = result["loops"], compiled or stats
        result["loop_over_step"] = {o: steps_run[o]["median_s"] / loop_stats[o]["median_s"] for o in loops}
        result["loop_speedup_over_peer"] = {o: stats[peer]["median_s"] / loop_stats[o]["median_s"] for o in loops}
    return result


def _row(
    values: list[float], flops: int, peak_mb: float | None, global_batch: int, peak_tflops: float
) -> dict[str, Any]:
    """Median, p10, p90 step time, sentences/s at the median, model TFLOP/s per device at the
    median (and MFU against ``peak_tflops``), peak memory, and the times."""
    median = statistics.median(values)
    tflops, mfu = tflops_and_mfu(flops, median, peak_tflops)
    return {
        "model_flops_per_device": flops,
        "tflops_per_device": tflops,
        "mfu": mfu,
        "median_s": median,
        "p10_s": float(np.percentile(values, 10)),  # linear interpolation
        "p90_s": float(np.percentile(values, 90)),
        "sentences_per_s": global_batch / median,
        "peak_memory_mb": peak_mb,
        "times_s": values,
    }


def step_table(result: dict[str, Any]):
    from rich.table import Table

    cached = f"cached, chunks of {result['chunk_size']}" if result["chunk_size"] else "uncached"
    if result["chunk_size"] and result.get("chunk_tokens"):
        cached += f" and {result['chunk_tokens']} tokens"
    if not result["chunk_size"] and result.get("length_buckets", 1) > 1:
        cached += f", {result['length_buckets']} length buckets"
    if result["negatives"]:
        cached += f", {result['negatives']} hard negatives"
    rows_from = f"text {Path(result['text']).name}" if result.get("text") else "synthetic full-length rows"
    engine = (
        f", FSDP2 ({Path(result['fsdp']).name})"
        if result.get("fsdp")
        else (f", DeepSpeed ({Path(result['deepspeed']).name})" if result.get("deepspeed") else "")
    )
    title = (
        f"bench step: global batch {result['global_batch']} = {result['world_size']} x {result['per_device_batch']}"
        f"{engine}, "
        f"{cached}, max length {result['max_length']}, {rows_from}, {result['device']}, precision {result['precision']}"
        f"{', eager and compiled' if result.get('compile') else ''}, {result['steps']} steps after "
        f"{result['warmup']} warm-up"
    )
    table = Table(title=title)
    for column in (
        "objective",
        "median s",
        "p10 s",
        "p90 s",
        "sentences/s",
        "tokens/s",
        "real-token share",
        "TFLOP/s per device",
        "MFU",
        "peak GPU MiB",
    ):
        table.add_column(column, justify="right")
    objectives = result["objectives"]
    steps = [(name, stats) for name, stats in objectives.items() if name in OBJECTIVES]
    variants = [(name, stats) for name, stats in objectives.items() if name.endswith((ROW_ORDER, PACKED))]
    compiled = [(compiled_name(name), stats) for name, stats in result.get("compiled", {}).items()]
    loop_kind = "train loop, compiled" if compiled else "train loop"
    loops = [(f"{name} {loop_kind}", stats) for name, stats in result.get("loops", {}).items()]
    peers = [
        (name, stats)
        for name, stats in objectives.items()
        if name not in OBJECTIVES and not name.endswith((ROW_ORDER, PACKED))
    ]
    for name, stats in steps + variants + compiled + loops + peers:
        peak = stats["peak_memory_mb"]
        share = stats.get("real_token_share")
        tokens = stats.get("tokens_per_s")
        table.add_row(
            name,
            f"{stats['median_s']:.4f}",
            f"{stats['p10_s']:.4f}",
            f"{stats['p90_s']:.4f}",
            f"{stats['sentences_per_s']:.1f}",
            "-" if tokens is None else f"{tokens:.0f}",
            "-" if share is None else f"{share:.2f}",
            f"{stats['tflops_per_device']:.3g}",
            "-" if stats["mfu"] is None else f"{stats['mfu']:.1%}",
            "-" if peak is None else f"{peak:.0f}",
        )
    return table


def grid_cells(
    global_batches: list[int], chunk_sizes: list[int], world_size: int, max_rows_per_forward: int, views: int
) -> list[tuple[int, int, str | None]]:
    """(global batch, chunk size, why it is skipped or None) of every cell, batch-major;
    ``views``: the most views (columns encoded) an objective of the bench encodes."""
    cells = []
    for global_batch, chunk_size in itertools.product(global_batches, chunk_sizes):
        reason = None
        if global_batch % world_size:
            reason = f"{world_size} ranks do not divide the batch"
        elif chunk_size > global_batch // world_size:
            reason = f"chunk {chunk_size} > per-device batch {global_batch // world_size}"
        elif rows_per_forward(global_batch // world_size, chunk_size, views) > max_rows_per_forward:
            rows = rows_per_forward(global_batch // world_size, chunk_size, views)
            reason = f"{rows} sentences per forward > --max-rows-per-forward {max_rows_per_forward}"
        cells.append((global_batch, chunk_size, reason))
    return cells


def run_grid(cell_argv: list[str], cells: list[tuple[int, int, str | None]]) -> list[dict[str, Any]]:
    """Each runnable cell as its own ``vascl-scale bench step`` process (``cell_argv`` plus the
    cell's batch, chunk size and output file); a failed cell is reported and the grid goes on."""
    from rich.progress import Progress

    from vascl_scale.log import console

    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as scratch, Progress(console=console, transient=True) as progress:
        task = progress.add_task("bench step cells", total=len(cells))
        for global_batch, chunk_size, reason in cells:
            row: dict[str, Any] = {"global_batch": global_batch, "chunk_size": chunk_size, "skipped": reason}
            if reason is not None:
                logger.info("cell B=%d chunk=%d skipped: %s", global_batch, chunk_size, reason)
            else:
                output = Path(scratch) / f"cell-{global_batch}-{chunk_size}.json"
                argv = [
                    *cell_argv,
                    "--global-batch",
                    str(global_batch),
                    "--chunk-size",
                    str(chunk_size),
                    "--output",
                    str(output),
                ]
                done = subprocess.run([sys.executable, "-m", "vascl_scale", *argv], capture_output=True, text=True)
                if done.returncode == 0:
                    row["result"] = json.loads(output.read_text(encoding="utf-8"))
                    logger.info(
                        "cell B=%d chunk=%d: peak resident %.0f MiB, step times %s s",
                        global_batch,
                        chunk_size,
                        row["result"]["peak_rss_mb"],
                        ", ".join(f"{t:.2f}" for o in row["result"]["objectives"].values() for t in o["times_s"]),
                    )
                else:
                    row["failed"] = f"exit {done.returncode}: " + " ".join(done.stderr.split()[-60:])
                    logger.warning("bench step cell B=%d chunk=%d failed: %s", global_batch, chunk_size, row["failed"])
            results.append(row)
            progress.advance(task)
    return results


def grid_table(cells: list[dict[str, Any]], objective: str):
    """One row per cell: peak memory and median step time, and cached against uncached at the same batch."""
    from rich.table import Table

    uncached = {c["global_batch"]: c["result"] for c in cells if "result" in c and c["chunk_size"] == 0}
    table = Table(title=f"bench step grid ({objective}): peak resident memory and step time per cell")
    for column in (
        "global batch",
        "chunk",
        "sentences per forward",
        "peak RSS MiB",
        "median s",
        "sentences/s",
        "time / uncached",
        "note",
    ):
        table.add_column(column, justify="right")
    for cell in cells:
        batch, chunk = cell["global_batch"], cell["chunk_size"]
        if "result" not in cell:
            table.add_row(
                str(batch),
                str(chunk) if chunk else "-",
                "",
                "",
                "",
                "",
                "",
                cell.get("skipped") or cell.get("failed", ""),
            )
            continue
        result = cell["result"]
        stats = result["objectives"][objective]
        ratio = ""
        if chunk and batch in uncached:
            ratio = f"{stats['median_s'] / uncached[batch]['objectives'][objective]['median_s']:.2f}"
        table.add_row(
            str(batch),
            str(chunk) if chunk else "-",
            str(result["rows_per_forward"]),
            f"{result['peak_rss_mb']:.0f}",
            f"{stats['median_s']:.2f}",
            f"{stats['sentences_per_s']:.1f}",
            ratio,
            "",
        )
    return table


def plot_grid(cells: list[dict[str, Any]], objective: str, path: Path) -> None:
    """Peak memory and median step time against the global batch, one line per chunk size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (memory_axis, time_axis) = plt.subplots(1, 2, figsize=(10, 4))
    for chunk in sorted({c["chunk_size"] for c in cells}):
        done = [c for c in cells if c["chunk_size"] == chunk and "result" in c]
        if not done:
            continue
        batches = [c["global_batch"] for c in done]
        label = f"cached, chunk {chunk}" if chunk else "uncached"
        memory_axis.plot(batches, [c["result"]["peak_rss_mb"] / 1024 for c in done], marker="o", label=label)
        time_axis.plot(
            batches, [c["result"]["objectives"][objective]["median_s"] for c in done], marker="o", label=label
        )
    first = next(c["result"] for c in cells if "result" in c)
    for axis, ylabel in ((memory_axis, "peak resident memory (GiB)"), (time_axis, "median step time (s)")):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("global batch (sentences)")
        axis.set_ylabel(ylabel)
        axis.grid(True, alpha=0.3)
        axis.legend()
    time_axis.set_yscale("log")
    figure.suptitle(
        f"{objective} training step, {first['world_size']} process(es), {first['device']}, max length {first['max_length']}"
    )
    figure.tight_layout()
    save_figure(figure, path)

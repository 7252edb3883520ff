"""``vascl-scale bench ...``: reproducible measurements (medians and ratios from one run)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from vascl_scale.cli_options import PRECISION

app = typer.Typer(
    help="Benchmarks: data loading, training steps, communication, the matrix-product peak.", no_args_is_help=True
)


@app.command("data")
def data(
    shards: str = typer.Argument(..., help="Shard directory (with manifest.json), brace list of shards, or .txt[.gz]."),
    workers: str = typer.Option("1,2", "--workers", help="Comma-separated DataLoader worker counts to measure."),
    tokenizer: str | None = typer.Option(
        None, "--tokenizer", help="Tokenizer directory (default: the packaged MiniLM)."
    ),
    max_length: int = typer.Option(32, "--max-length", help="Truncation length."),
    batch_size: int = typer.Option(64, "--batch-size", help="Per-device batch size."),
    seconds: float = typer.Option(5.0, "--seconds", help="Length of each timed window."),
    repeats: int = typer.Option(3, "--repeats", help="Timed windows per measurement; medians are reported."),
    output: Path | None = typer.Option(None, "--output", help="Also write the result as JSON here."),
) -> None:
    """Tokenised sentences/s of the training stream per worker count vs the bare fast tokenizer."""
    from vascl_scale.bench import save_result
    from vascl_scale.bench.data import results_table, run_data_bench
    from vascl_scale.log import fail, print_table

    try:
        counts = _integers(workers, "--workers")
        _check_outputs(output=output)
        result = run_data_bench(shards, counts, tokenizer, max_length, batch_size, seconds, repeats)
    except ValueError as err:
        fail(err)
    print_table(
        results_table(
            result, f"bench data {shards} (batch {batch_size}, max length {max_length}, medians of {repeats})"
        )
    )
    if output is not None:
        save_result(result.as_dict(), output)


@app.command("matmul")
def matmul(
    size: str = typer.Option(
        "1024,2048,4096",
        "--size",
        help="n of the (n, n) @ (n, n) products (2 n^3 FLOPs each); several, comma separated.",
    ),
    precision: str = typer.Option(
        "no,bf16", "--precision", help="Precisions, comma separated: no, bf16, fp16 or auto (as train.precision)."
    ),
    repeats: int = typer.Option(5, "--repeats", help="Timed products per size and precision, after 2 untimed."),
    output: Path | None = typer.Option(None, "--output", help="Also write the result as JSON here."),
) -> None:
    """TFLOP/s of large matrix products per precision: the practical peak for --peak-tflops."""
    from vascl_scale.bench import save_result
    from vascl_scale.bench.matmul import matmul_table, run_matmul_bench
    from vascl_scale.log import console, fail, print_table

    try:
        _check_outputs(output=output)
        result = run_matmul_bench(
            _integers(size, "--size"), [p.strip() for p in precision.split(",") if p.strip()], repeats
        )
    except ValueError as err:
        fail(err)
    print_table(matmul_table(result))
    for name, peak in result["peak_tflops"].items():
        console.print(
            f"{name}: --peak-tflops {peak:.3f} (the best product of any size) gives MFU against this machine's practical peak"
        )
    if output is not None:
        save_result(result, output)


def _integers(text: str, option: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values:
        raise ValueError(f"{option} takes integers, comma separated; got {text[:200]!r}")
    return values


def _check_outputs(**paths: Path | None) -> None:
    """Refuse, before any measurement, an output file that could not be written (``--output``,
    ``--plot``: keyword = option name)."""
    from vascl_scale.paths import check_output_file

    for name, path in paths.items():
        if path is not None:
            check_output_file(path, f"--{name}")


@app.command("step")
def step(
    model: str = typer.Option(
        ...,
        "--model",
        help="Model: a directory, package:MODULE/SUBDIR, a hub id, or a Hugging Face config.json (random init).",
    ),
    global_batch: str = typer.Option(
        "64", "--global-batch", help="Sentences per loss call over all ranks; several, comma separated, make a grid."
    ),
    chunk_size: str = typer.Option(
        "0",
        "--chunk-size",
        help="train.chunk_size: 0 uncached, else sentences per encoder forward; several make a grid.",
    ),
    objective: str = typer.Option(
        "vascl,simcse",
        "--objective",
        help="Objectives, comma separated: vascl, simcse, simcse_sup, or pairsupcon alone (the VaSCL / SimCSE ratio needs both).",
    ),
    steps: int = typer.Option(10, "--steps", help="Timed steps per objective."),
    warmup: int = typer.Option(2, "--warmup", help="Untimed steps per objective first."),
    max_length: int = typer.Option(
        32, "--max-length", help="Tokens per sentence: the truncation of --text, the length of every synthetic one."
    ),
    text: Path | None = typer.Option(
        None,
        "--text",
        help="Real sentences, one per line (.gz allowed), a new global batch per round; default: synthetic rows of "
        "--max-length tokens (no padding, so length sorting shows nothing).",
    ),
    chunk_tokens: int = typer.Option(
        0, "--chunk-tokens", min=0, help="train.chunk_tokens: the cached step's tokens per forward (0: no budget)."
    ),
    length_buckets: str = typer.Option(
        "auto", "--length-buckets", help="train.length_buckets: the uncached step's length-sorted forwards."
    ),
    row_order: bool = typer.Option(
        False,
        "--row-order",
        help="Also time each objective as before length sorting (chunks in row order, one uncached forward).",
    ),
    attn_implementation: str | None = typer.Option(
        None, "--attn-implementation", help="model.attn_implementation of every model (e.g. flash_attention_2)."
    ),
    packed: bool = typer.Option(
        False, "--packed", help="Also time each objective with its rows packed (model.packed), on a second model."
    ),
    negatives: int = typer.Option(
        1, "--negatives", help="Hard-negative columns of the synthetic batch, for simcse_sup (N >= 1)."
    ),
    k: int = typer.Option(16, "--k", help="VaSCL neighbours."),
    eps: float = typer.Option(15.0, "--eps", help="VaSCL perturbation norm (and xi)."),
    precision: str = typer.Option("auto", "--precision", help="auto, no, bf16 or fp16 (as train.precision)."),
    compile: bool = typer.Option(
        False,
        "--compile",
        help="Also time each step with the encoder through torch.compile (train.compile), in the same rounds as eager "
        "(its compile time: the compiled rows' warm-up steps, printed apart); the loop rows run compiled.",
    ),
    num_processes: int = typer.Option(1, "--num-processes", help="Ranks on this machine (through accelerate)."),
    deepspeed: Path | None = typer.Option(
        None, "--deepspeed", help="DeepSpeed JSON, e.g. configs/deepspeed/zero2.json."
    ),
    fsdp: Path | None = typer.Option(None, "--fsdp", help="FSDP2 settings, e.g. configs/fsdp/full-shard.yaml."),
    max_rows_per_forward: int = typer.Option(
        1 << 30,
        "--max-rows-per-forward",
        help="Grid: skip cells whose encoder forward holds more sentences (n b uncached, n views; c cached).",
    ),
    plot: Path | None = typer.Option(None, "--plot", help="Grid: also plot memory and time against the batch (PNG)."),
    peak_tflops: float = typer.Option(
        0.0, "--peak-tflops", min=0, help="The device's peak TFLOP/s in this precision: adds MFU."
    ),
    compare: str | None = typer.Option(
        None,
        "--compare",
        help="sentence-transformers: also time its SimCSE step (MNRL; with --chunk-size its cached loss), alternating, "
        "and `vascl-scale train` itself per objective (one process).",
    ),
    output: Path | None = typer.Option(None, "--output", help="Also write the result as JSON here."),
) -> None:
    """Median / p10 / p90 time, model TFLOP/s per device (MFU with --peak-tflops) and peak memory of full training steps, uncached or cached; a
    grid over global batches and chunk sizes runs each cell as its own process."""
    from vascl_scale.bench import save_result
    from vascl_scale.bench.loop import LoopFailedError
    from vascl_scale.bench.step import (
        COMPARE_ALONE,
        COMPILE_WITHOUT_DEEPSPEED,
        bench_objectives,
        bench_views,
        grid_cells,
        grid_table,
        plot_grid,
        run_grid,
        run_step_bench,
        step_table,
    )
    from vascl_scale.log import console, fail, print_table
    from vascl_scale.train.launch import LaunchPlan, run_here_or_launch

    objectives = [o.strip() for o in objective.split(",") if o.strip()]
    try:
        batches, chunks = _integers(global_batch, "--global-batch"), _integers(chunk_size, "--chunk-size")
        buckets = length_buckets if length_buckets == "auto" else _integers(length_buckets, "--length-buckets")[0]
        if buckets != "auto" and buckets < 1:
            raise ValueError(f"--length-buckets takes auto or a number >= 1; got {length_buckets}")
        if chunk_tokens and not any(chunks):
            raise ValueError("--chunk-tokens budgets the cached step's chunks: give --chunk-size too")
        if text is not None and not text.is_file():
            raise ValueError(f"--text {text}: no such file; pass a text file of one sentence per line (.gz allowed)")
        _check_outputs(output=output, plot=plot)
        views = bench_views(bench_objectives(objectives), negatives)
        if compare is not None and (num_processes > 1 or deepspeed is not None or fsdp is not None):
            raise ValueError(COMPARE_ALONE)
        if compile and (deepspeed is not None or fsdp is not None):
            raise ValueError(COMPILE_WITHOUT_DEEPSPEED)
        if fsdp is not None:
            from vascl_scale.config import load_fsdp_config

            load_fsdp_config(fsdp)  # its errors before any worker starts
    except ValueError as err:
        fail(err)
    if len(batches) * len(chunks) > 1:
        cell_argv = [
            "bench",
            "step",
            "--model",
            model,
            "--objective",
            objective,
            "--steps",
            str(steps),
            "--warmup",
            str(warmup),
        ]
        cell_argv += ["--max-length", str(max_length), "--negatives", str(negatives), "--k", str(k), "--eps", str(eps)]
        cell_argv += ["--precision", precision] + (["--compile"] if compile else [])
        cell_argv += ["--chunk-tokens", str(chunk_tokens), "--length-buckets", length_buckets]
        cell_argv += (["--text", str(text)] if text else []) + (["--row-order"] if row_order else [])
        cell_argv += (["--attn-implementation", attn_implementation] if attn_implementation else []) + (
            ["--packed"] if packed else []
        )
        cell_argv += ["--peak-tflops", str(peak_tflops)] + (["--compare", compare] if compare else [])
        cell_argv += ["--num-processes", str(num_processes)] + (["--deepspeed", str(deepspeed)] if deepspeed else [])
        cell_argv += ["--fsdp", str(fsdp)] if fsdp else []
        cells = run_grid(cell_argv, grid_cells(batches, chunks, num_processes, max_rows_per_forward, views))
        print_table(grid_table(cells, objectives[0]))
        if plot is not None and any("result" in c for c in cells):
            plot_grid(cells, objectives[0], plot)
            console.print(f"plot: {plot}")
        if output is not None:
            save_result({"cells": cells}, output)
        return

    code = run_here_or_launch(
        LaunchPlan(processes_per_machine=num_processes, process_group=deepspeed is not None or fsdp is not None)
    )
    if code is not None:  # the launcher: its workers measured
        raise typer.Exit(code)
    try:
        result = run_step_bench(
            model,
            batches[0],
            objectives,
            steps=steps,
            warmup=warmup,
            max_length=max_length,
            k=k,
            eps=eps,
            precision=precision,
            deepspeed=str(deepspeed) if deepspeed is not None else None,
            fsdp=str(fsdp) if fsdp is not None else None,
            chunk_size=chunks[0],
            peak_tflops=peak_tflops,
            compare=compare,
            negatives=negatives,
            compile=compile,
            text=text,
            chunk_tokens=chunk_tokens,
            length_buckets=buckets,
            row_order=row_order,
            attn_implementation=attn_implementation,
            packed=packed,
        )
    except (ValueError, LoopFailedError) as err:
        fail(err)
    if result["rank"] != 0:
        return
    print_table(step_table(result))
    if "vascl_over_simcse" in result:
        console.print(f"VaSCL / SimCSE median step time: {result['vascl_over_simcse']:.3f}")
    if compile:
        # The objectives share one compiled model, so the first one's warm-up compiles for all of them.
        warm = "; ".join(
            f"{o} {', '.join(f'{t:.2f}' for t in stats['warmup_s']) or '-'}" for o, stats in result["compiled"].items()
        )
        console.print(
            f"torch.compile: warm-up steps of the compiled rows (s, the compiling; one encoder for every objective): {warm}"
        )
        for objective, speedup in result["compiled_over_eager"].items():
            console.print(
                f"vascl-scale {objective}: compiled {speedup:.2f}x the sentences/s of eager, in the same rounds"
            )
    for objective, speedup in result.get("speedup_over_peer", {}).items():
        console.print(f"vascl-scale {objective}: {speedup:.2f}x the sentences/s of {compare}")
    for objective, speedup in result.get("packed_over_padded", {}).items():
        console.print(f"vascl-scale {objective} packed: {speedup:.2f}x the sentences/s of its padded steps")
    for objective, speedup in result.get("sorted_over_row_order", {}).items():
        console.print(f"vascl-scale {objective}: {speedup:.2f}x the sentences/s of its steps in row order")
    for objective, speedup in result.get("compiled_speedup_over_peer", {}).items():
        console.print(f"vascl-scale {objective} compiled: {speedup:.2f}x the sentences/s of {compare}")
    loop, step_row = ("train loop, compiled", "compiled step") if compile else ("train loop", "step")
    for objective, ratio in result.get("loop_over_step", {}).items():
        speedup = result["loop_speedup_over_peer"][objective]
        console.print(
            f"vascl-scale {objective} {loop}: {ratio:.2f}x the sentences/s of its {step_row}, {speedup:.2f}x those of {compare}"
        )
    ranks = " + ".join(f"{mb:.0f}" for mb in result["peak_rss_mb_per_rank"])
    console.print(f"peak resident memory: {result['peak_rss_mb']:.0f} MiB (ranks: {ranks})")
    if output is not None:
        save_result(result, output)


@app.command("encode")
def encode(
    model: str = typer.Option(
        ..., "--model", help="Model directory with its tokenizer: a directory, package:MODULE/SUBDIR or a hub id."
    ),
    text: Path = typer.Option(..., "--text", help="Text file, one text per line (.gz read through)."),
    texts: int = typer.Option(2000, "--texts", help="How many of its non-blank lines to encode (the first ones)."),
    batch_size: int = typer.Option(128, "--batch-size", help="Texts per encoder forward at most (as eval.batch_size)."),
    max_length: int = typer.Option(128, "--max-length", help="Truncation length in tokens."),
    precision: str = PRECISION,
    max_tokens: str = typer.Option(
        "0",
        "--max-tokens",
        help="Padded tokens per forward at most of the token-sorted encode (0: none); several, comma separated, make "
        "a row each.",
    ),
    compare: str | None = typer.Option(
        None, "--compare", help="sentence-transformers: also time SentenceTransformer.encode, in the same rounds."
    ),
    repeats: int = typer.Option(3, "--repeats", help="Timed rounds, systems alternating; medians are reported."),
    peak_tflops: float = typer.Option(
        0.0, "--peak-tflops", min=0, help="The device's peak TFLOP/s in this precision: adds MFU."
    ),
    output: Path | None = typer.Option(None, "--output", help="Also write the result as JSON here."),
) -> None:
    """Texts/s, real tokens/s, real-token share and TFLOP/s of evaluation's encode on real text: batched by
    token length against the character-sorted batches it used before (and sentence-transformers)."""
    from vascl_scale.bench import save_result
    from vascl_scale.bench.encode import CHARACTER_SORTED, encode_table, run_encode_bench
    from vascl_scale.log import console, fail, print_table

    try:
        _check_outputs(output=output)
        result = run_encode_bench(
            model,
            text,
            texts=texts,
            batch_size=batch_size,
            max_length=max_length,
            precision=precision,
            max_tokens=_integers(max_tokens, "--max-tokens"),
            compare=compare,
            repeats=repeats,
            peak_tflops=peak_tflops,
        )
    except ValueError as err:
        fail(err)
    print_table(encode_table(result))
    for name, speedup in result["speedup_over_character_sorted"].items():
        if name not in (CHARACTER_SORTED, compare):
            versus_peer = f", {result['speedup_over_peer'][name]:.2f}x those of {compare}" if compare else ""
            console.print(f"{name}: {speedup:.2f}x the texts/s of the {CHARACTER_SORTED} batches{versus_peer}")
    if output is not None:
        save_result(result, output)


@app.command("comm")
def comm(
    model: str = typer.Option(
        ...,
        "--model",
        help="Model: a directory, package:MODULE/SUBDIR, a hub id, or a Hugging Face config.json (random init).",
    ),
    global_batch: int = typer.Option(1024, "--global-batch", help="Sentences per loss call over all ranks."),
    world_size: int = typer.Option(8, "--world-size", help="Ranks of the deployment to compute traffic for."),
    measure_processes: int = typer.Option(
        2, "--measure-processes", help="gloo ranks of the measured step (0: skip it)."
    ),
    k: int = typer.Option(16, "--k", help="VaSCL neighbours in the measured step."),
    head_dim: int = typer.Option(128, "--head-dim", help="Output size of the projection head."),
    chunk_size: int = typer.Option(0, "--chunk-size", help="train.chunk_size of the cached step (0: uncached)."),
    backend: str = typer.Option("nccl", "--backend", help="Backend of the deployment: nccl (reduce-scatter) or gloo."),
    output: Path | None = typer.Option(None, "--output", help="Also write the report as JSON here."),
    worker_output: Path | None = typer.Option(None, "--worker-output", hidden=True),
) -> None:
    """Bytes per step of the embedding gathers against DDP / ZeRO-2 / ZeRO-3 gradient traffic."""
    import tempfile

    from vascl_scale.bench import save_result
    from vascl_scale.bench.comm import comm_report, comm_table, measure_step
    from vascl_scale.log import console, fail, print_table
    from vascl_scale.train.launch import LaunchPlan, exit_with_parent, in_distributed_worker, launch_workers

    if in_distributed_worker():  # a rank of the measured step
        exit_with_parent()
        measured = measure_step(model, global_batch, k, head_dim, chunk_size)
        if measured["rank"] == 0 and worker_output is not None:
            worker_output.write_text(json.dumps(measured), encoding="utf-8")
        return
    try:
        _check_comm_options(global_batch, world_size, measure_processes, k, head_dim, chunk_size)
        _check_outputs(output=output)
    except ValueError as err:
        fail(err)
    measured = None
    if measure_processes > 0:
        with tempfile.TemporaryDirectory() as tmp:
            result_file = Path(tmp) / "measured.json"
            argv = [
                "bench",
                "comm",
                "--model",
                model,
                "--global-batch",
                str(global_batch),
                "--world-size",
                str(world_size),
            ]
            argv += [
                "--k",
                str(k),
                "--head-dim",
                str(head_dim),
                "--chunk-size",
                str(chunk_size),
                "--worker-output",
                str(result_file),
            ]
            code = launch_workers(LaunchPlan(processes_per_machine=measure_processes), argv)
            if code != 0 or not result_file.is_file():
                raise typer.Exit(code or 1)
            measured = json.loads(result_file.read_text(encoding="utf-8"))
    try:
        report = comm_report(model, global_batch, world_size, head_dim, measured, chunk_size, backend)
    except ValueError as err:
        fail(err)
    print_table(comm_table(report))
    if measured is not None:
        for objective, ratios in report["measured_vs_computed"].items():
            console.print(
                f"{objective}: measured / computed bytes on {measured['world_size']} gloo ranks: "
                f"gathers {ratios['gathers']:.3f}, DDP gradients {ratios['ddp_gradients']:.3f}"
            )
    if output is not None:
        save_result(report, output)


def _check_comm_options(
    global_batch: int, world_size: int, measure_processes: int, k: int, head_dim: int, chunk_size: int
) -> None:
    """``bench comm``'s sizes, before anything is measured: a zero would report zero traffic."""
    from vascl_scale.losses.rules import check_neighbour_count

    for option, value in (
        ("--global-batch", global_batch),
        ("--world-size", world_size),
        ("--k", k),
        ("--head-dim", head_dim),
    ):
        if value < 1:
            raise ValueError(f"{option} must be >= 1; got {value}")
    if global_batch % world_size:
        raise ValueError(f"--global-batch {global_batch} must be a multiple of --world-size {world_size}")
    if not 0 <= chunk_size <= global_batch // world_size:
        raise ValueError(
            f"--chunk-size {chunk_size} must be between 0 and the per-device batch {global_batch // world_size}"
        )
    if measure_processes == 0:
        return
    if measure_processes < 2 or global_batch % measure_processes:
        raise ValueError(
            f"--measure-processes must be >= 2 and divide --global-batch (or 0 to skip); got {measure_processes}"
        )
    check_neighbour_count(k, global_batch, "--", "--global-batch")  # the measured VaSCL step's rule

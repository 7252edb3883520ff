"""``bench matmul``: the TFLOP/s square matrix products reach here, per size and precision.

MFU needs the device's peak in the run's precision. For a GPU the data sheet gives it
(:mod:`vascl_scale.bench.peaks`); for a CPU the arithmetic one (cores x FLOPs per cycle x clock,
docs/speed.md) assumes every multiply-add pipe busy at a clock a virtual machine does not
report, and the libraries torch calls may not use every pipe (float32 products go to MKL,
bf16 ones to oneDNN: ``torch.__config__.show()``). The best of a few (n, n) @ (n, n) products,
2 n^3 FLOPs each, over a few sizes (large ones spill out of the caches) is what a training
step's matrix products can reach at most on this machine: MFU against it is the share of the
practical peak a step attains.
"""

from __future__ import annotations

import statistics
import time

import torch

from vascl_scale.precision import local_device_type, precision_name, resolve_precision

DTYPES = {"no": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def time_products(size: int, dtype: torch.dtype, device: str, repeats: int, warmup: int = 2) -> list[float]:
    """Seconds of each of ``repeats`` timed (size, size) @ (size, size) products in ``dtype``."""
    assert size >= 1 and repeats >= 1
    generator = torch.Generator(device="cpu").manual_seed(0)
    left = torch.randn(size, size, generator=generator).to(device=device, dtype=dtype)
    right = torch.randn(size, size, generator=generator).to(device=device, dtype=dtype)
    seconds = []
    for index in range(warmup + repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        left @ right
        if device == "cuda":
            torch.cuda.synchronize()
        if index >= warmup:
            seconds.append(time.perf_counter() - start)
    return seconds


def run_matmul_bench(sizes: list[int], precisions: list[str], repeats: int) -> dict[str, object]:
    """The products' times and TFLOP/s per size and precision (``no``, ``bf16``, ``fp16`` or
    ``auto``, resolved as ``train.precision`` is: bf16 on a CPU without native bf16 is
    refused), and per precision the best TFLOP/s of any size (``peak_tflops``)."""
    if not sizes or min(sizes) < 1 or repeats < 1:
        raise ValueError(f"--size takes sizes >= 1 and --repeats must be >= 1; got {sizes} and {repeats}")
    if not precisions:
        raise ValueError("--precision needs at least one of no, bf16, fp16 or auto")
    device = local_device_type()
    resolved = dict.fromkeys(
        resolve_precision(requested, device, "--precision") for requested in precisions
    )  # each once
    rows = []
    for precision in resolved:
        for size in dict.fromkeys(sizes):
            seconds = time_products(size, DTYPES[precision], device, repeats)
            best, median = min(seconds), statistics.median(seconds)
            flops = 2 * size**3
            rows.append(
                {
                    "precision": precision,
                    "size": size,
                    "best_s": best,
                    "median_s": median,
                    "best_tflops": flops / best / 1e12,
                    "median_tflops": flops / median / 1e12,
                }
            )
    peaks = {p: max(row["best_tflops"] for row in rows if row["precision"] == p) for p in resolved}
    return {
        "repeats": repeats,
        "device": device,
        "threads": torch.get_num_threads(),
        "rows": rows,
        "peak_tflops": peaks,
    }


def matmul_table(result: dict[str, object]):
    from rich.table import Table

    title = f"bench matmul: (n, n) @ (n, n), 2 n^3 FLOPs, {result['device']}, {result['threads']} threads, {result['repeats']} timed products"
    table = Table(title=title)
    for column in ("precision", "n", "best s", "median s", "best TFLOP/s", "median TFLOP/s"):
        table.add_column(column, justify="right")
    for row in result["rows"]:
        table.add_row(
            precision_name(row["precision"]),
            str(row["size"]),
            f"{row['best_s']:.4f}",
            f"{row['median_s']:.4f}",
            f"{row['best_tflops']:.3f}",
            f"{row['median_tflops']:.3f}",
        )
    return table

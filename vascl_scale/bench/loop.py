"""The training loop's row of ``bench step --compare``: ``vascl-scale train`` itself, timed
from its own ``metrics.jsonl``.

The step rows time :class:`vascl_scale.train.step.TrainingStep` on one synthetic batch held in
memory; this row runs the whole loop around it (the data stream and its workers, the
scheduler, logging, the metrics sink) on data of the same kind. :func:`write_synthetic_shards`
writes shards of random sentences, each at least ``max_length`` tokens long, through
``data prepare``'s own library call with the model's tokenizer, which stores their token ids
truncated to ``max_length``: so every row of every column is full length, as in the step rows'
batch, and the loader pads stored ids instead of tokenising (the step and peer rows are given
token ids too; ``bench data`` measures tokenisation). :func:`run_training_loop` trains in a
process of its own (``python -m vascl_scale train``, its memory and threads its own) for
``warmup + steps`` steps with the step rows' settings, a metrics line per step
(``train.log_every: 1``), no evaluation and no checkpoint before the last step. Each line's
``step_seconds`` is one step: from the loop's request of the batch to the scheduler's step, so
with the wait for the batch and, as every step logs, the objective's diagnostics (which a step
row skips), but not the writing of the line, which follows it. The first ``warmup`` lines are
dropped, as the step rows drop their warm-up steps (here they also hold the data workers' start).

The loops run before the step rounds, one objective after the other, while the bench's process
holds no model yet (on a GPU, none of its memory): so drift of a shared machine between the two
periods is not cancelled as the alternating rounds cancel it between the step rows; the rows'
p10-p90 spreads say how far their medians can be trusted.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from vascl_scale.config import RunConfig, config_from_dict, save_config
from vascl_scale.data.columns import LABEL, LABELS, SCORES, VALUE_COLUMNS
from vascl_scale.data.prepare import PrepareOptions, prepare_shards
from vascl_scale.log import LoopProgress
from vascl_scale.losses.spec import objective_spec

# What a run directory's metrics line holds for one step (``Trainer._log_window``).
STEP_SECONDS = "step_seconds"


def vocabulary_words(tokenizer) -> list[str]:
    """The fast tokenizer's vocabulary as words: each entry but the special ones, decoded, that is
    one word (no space inside) of at least one token."""
    special = set(tokenizer.all_special_ids)
    ids = [[i] for i in range(len(tokenizer)) if i not in special]
    backend = tokenizer.backend_tokenizer  # the Rust tokenizer, batched: the whole vocabulary in well under a second
    words = [word for word in (text.strip() for text in backend.decode_batch(ids)) if word and len(word.split()) == 1]
    return [
        word for word, encoding in zip(words, backend.encode_batch(words, add_special_tokens=False)) if encoding.ids
    ]


def synthetic_sentences(tokenizer, words: list[str], count: int, max_length: int, rng: random.Random) -> list[str]:
    """``count`` sentences of ``max_length`` of ``words`` (:func:`vocabulary_words`): each word is
    at least one token, so with the special tokens each sentence fills ``max_length``."""
    sentences = [" ".join(rng.choices(words, k=max_length)) for _ in range(count)]
    lengths = [len(ids) for ids in tokenizer(sentences, truncation=False)["input_ids"]]
    assert min(lengths) >= max_length, (min(lengths), max_length)  # what the step rows' batch is
    return sentences


def write_synthetic_shards(
    directory: Path,
    columns: tuple[str, ...],
    rows: int,
    shard_size: int,
    model_dir: Path,
    max_length: int,
    seed: int,
    lines: list[str] | None = None,
) -> Path:
    """Shards of ``rows`` samples in ``columns`` (a sentence in each text column; a random label,
    0 or 1, in a label column; random teacher scores in a scores column) written by ``data prepare`` into ``directory``/shards, with the
    token ids of the tokenizer of ``model_dir`` stored (module doc). The sentences are ``lines``
    of real text when given (``bench step --text``: consecutive lines per column, as the step
    rows' batches take them), else synthetic full-length ones."""
    from vascl_scale.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    rng = random.Random(seed)
    texts = [column for column in columns if column not in VALUE_COLUMNS]
    if lines is not None:  # batch-major: each global batch takes the next lines, column after column
        batch, count = shard_size, len(texts)
        sentences = {
            column: [lines[(row // batch) * batch * count + offset * batch + row % batch] for row in range(rows)]
            for offset, column in enumerate(texts)
        }
    else:
        words = vocabulary_words(tokenizer)
        sentences = {column: synthetic_sentences(tokenizer, words, rows, max_length, rng) for column in texts}
    records = directory / "synthetic.jsonl"
    with records.open("w", encoding="utf-8") as handle:
        for row in range(rows):
            record = {column: sentences[column][row] for column in texts}
            if LABEL in columns:
                record[LABEL] = rng.choice(LABELS)
            if SCORES in columns:  # a teacher's score of each candidate (all texts after the anchor)
                record[SCORES] = [rng.uniform(-1, 1) for _ in texts[1:]]
            handle.write(json.dumps(record) + "\n")
    options = PrepareOptions(
        shard_size=shard_size,
        fmt="jsonl",
        text_field=",".join(texts),
        label_field=LABEL if LABEL in columns else None,
        score_field=SCORES if SCORES in columns else None,
        tokenizer=str(model_dir),
        max_length=max_length,
    )
    output = directory / "shards"
    prepare_shards([records], output, options, show_progress=False)
    records.unlink()
    return output


def loop_config(step_config: RunConfig, shards: Path, output_dir: Path, max_steps: int) -> RunConfig:
    """``step_config`` (a step row's run config) training on ``shards`` for ``max_steps`` steps
    into ``output_dir``, a metrics line per step, no evaluation, only the final checkpoint."""
    data = step_config.to_dict()
    data["data"]["train"] = str(shards)
    data["train"].update(max_steps=max_steps, output_dir=str(output_dir), log_every=1)
    data["eval"]["every_steps"] = 0
    data["checkpoint"]["every_steps"] = 0
    return config_from_dict(data)


class LoopFailedError(RuntimeError):
    """The training loop's process exited with an error (its output's end is the message)."""


@dataclass
class LoopTimes:
    """What the bench takes from one training loop's ``metrics.jsonl``."""

    times_s: list[float]  # step_seconds of each step after the warm-up
    peak_memory_mb: float | None  # the largest peak_memory_mb of its lines (CUDA only), else None


def read_loop_metrics(metrics: Path, warmup: int) -> LoopTimes:
    """The ``step_seconds`` of every step line of a run's ``metrics.jsonl`` after the first ``warmup``,
    and its peak device memory."""
    lines = [json.loads(line) for line in metrics.read_text(encoding="utf-8").splitlines() if line.strip()]
    steps = [line for line in lines if STEP_SECONDS in line]
    peaks = [line["peak_memory_mb"] for line in steps if "peak_memory_mb" in line]
    return LoopTimes([line[STEP_SECONDS] for line in steps[warmup:]], max(peaks) if peaks else None)


def run_training_loop(config: RunConfig, workdir: Path, warmup: int) -> LoopTimes:
    """Train ``config`` in a process of its own (``python -m vascl_scale train``) and read its
    ``metrics.jsonl`` (:func:`read_loop_metrics`); a failed run is a :class:`LoopFailedError`."""
    config_path = workdir / f"{config.objective}-loop.yaml"
    save_config(config, config_path)
    command = [sys.executable, "-m", "vascl_scale", "train", "--config", str(config_path)]
    finished = subprocess.run(command, capture_output=True, text=True)
    if finished.returncode != 0:
        tail = "\n".join((finished.stdout + finished.stderr).splitlines()[-20:])
        raise LoopFailedError(f"the training loop ({' '.join(command)}) exited with {finished.returncode}:\n{tail}")
    return read_loop_metrics(Path(config.train.output_dir) / "metrics.jsonl", warmup)


def run_training_loops(
    configs: dict[str, RunConfig],
    model_dir: Path,
    columns: tuple[str, ...],
    steps: int,
    warmup: int,
    lines: list[str] | None = None,
) -> dict[str, LoopTimes]:
    """The loop of each objective's step-row config (``configs``), ``warmup + steps`` steps on
    one set of shards of ``columns`` (the step rows' batch columns; real ``lines`` or synthetic
    sentences) and the labels an objective reads, one objective after the other."""
    first = next(iter(configs.values()))
    rows, max_length, seed = first.train.global_batch_size, first.data.max_length, first.train.seed
    labels = tuple(  # the columns of numbers (labels, teacher scores) an objective reads
        dict.fromkeys(
            column for config in configs.values() for column in objective_spec(config.objective).value_columns
        )
    )
    loops = {}
    with tempfile.TemporaryDirectory(prefix="vascl-bench-loop-") as tmp:
        workdir = Path(tmp)
        # One global batch per shard: every piece a worker cuts is one whole batch, none is dropped.
        shards = write_synthetic_shards(
            workdir, columns + labels, (warmup + steps) * rows, rows, model_dir, max_length, seed, lines
        )
        with LoopProgress("bench step: training loops", len(configs), "runs") as progress:
            for done, (objective, config) in enumerate(configs.items(), start=1):
                progress.update(done - 1, note=objective)
                loops[objective] = run_training_loop(
                    loop_config(config, shards, workdir / objective, warmup + steps), workdir, warmup
                )
                progress.update(done)
    return loops

"""Where training metrics go: a JSONL file, TensorBoard (when installed) and the progress
(a bar on a terminal, plain lines in a log file).

Rank 0 writes through a :class:`MetricsSink` (the numbers it receives are already averaged
over ranks by the trainer); the other ranks get a :class:`NullMetricsSink`.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from vascl_scale.log import LoopProgress

logger = logging.getLogger(__name__)


def _tensorboard_writer(log_dir: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        logger.info("TensorBoard is not installed; metrics go to metrics.jsonl only")
        return None
    return SummaryWriter(str(log_dir))


def _step_of(line: str) -> int | None:
    """The step of a metrics.jsonl line; None for a line that is not a whole record (cut by a kill)."""
    try:
        step = json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):  # JSONDecodeError is a ValueError
        return None
    return step if isinstance(step, int) else None


def _drop_records_past(path: Path, step: int) -> None:
    """Keep only the records of ``path`` up to ``step``, the checkpoint a run starts from.

    A run killed after logging steps past its last complete checkpoint (between two per-step
    saves, say) left records that the resumed run writes again: without this, metrics.jsonl
    would hold those steps twice. A last line cut by the kill goes too. Rewritten atomically.
    """
    if not path.is_file():
        return
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    kept = [line for line in lines if (logged := _step_of(line)) is not None and logged <= step]
    if len(kept) == len(lines):
        return
    staging = path.with_name(path.name + ".tmp")
    staging.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
    os.replace(staging, path)
    logger.info(
        "dropped %d records of %s past step %d, the checkpoint this run starts from (a stopped run logged "
        "them after it): this run logs those steps again",
        len(lines) - len(kept),
        path.name,
        step,
    )


class MetricsSink:
    """metrics.jsonl (one JSON object per line, appended across resumes) + TensorBoard + progress."""

    def __init__(self, run_dir: Path, start_step: int, max_steps: int) -> None:
        path = Path(run_dir) / "metrics.jsonl"
        _drop_records_past(path, start_step)
        self.jsonl = path.open("a", encoding="utf-8")
        self.tensorboard = _tensorboard_writer(Path(run_dir) / "tensorboard")
        self.progress = LoopProgress("train", max_steps, "steps", completed=start_step, keep=True).start()

    def advance(self, step: int) -> None:
        self.progress.update(step)

    def log(self, step: int, values: dict[str, float], summary: str | None = None) -> None:
        record = {"step": step, **values}
        self.jsonl.write(json.dumps(record) + "\n")
        self.jsonl.flush()
        if self.tensorboard is not None:
            for name, value in values.items():
                self.tensorboard.add_scalar(name, value, step)
        if summary is not None:
            self.progress.update(step, note=summary)

    def close(self) -> None:
        self.progress.stop()
        self.jsonl.close()
        if self.tensorboard is not None:
            self.tensorboard.close()


class NullMetricsSink:
    """The sink of ranks other than 0: the same calls, nothing written."""

    def advance(self, step: int) -> None:
        pass

    def log(self, step: int, values: dict[str, float], summary: str | None = None) -> None:
        pass

    def close(self) -> None:
        pass

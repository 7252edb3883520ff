"""Where training metrics go: a JSONL file, TensorBoard (when installed) and a rich progress bar.

Rank 0 writes through a :class:`MetricsSink` (the numbers it receives are already averaged
over ranks by the trainer); the other ranks get a :class:`NullMetricsSink`.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from vascl_scale.log import console

logger = logging.getLogger(__name__)


def _tensorboard_writer(log_dir: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        logger.info("TensorBoard is not installed; metrics go to metrics.jsonl only")
        return None
    return SummaryWriter(str(log_dir))


class MetricsSink:
    """metrics.jsonl (one JSON object per line, appended across resumes) + TensorBoard + progress."""

    def __init__(self, run_dir: Path, start_step: int, max_steps: int) -> None:
        self.jsonl = (Path(run_dir) / "metrics.jsonl").open("a", encoding="utf-8")
        self.tensorboard = _tensorboard_writer(Path(run_dir) / "tensorboard")
        self.progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=console,
            transient=False,
        )
        self.task = self.progress.add_task("", total=max_steps, completed=start_step)
        self.progress.start()

    def advance(self, step: int) -> None:
        self.progress.update(self.task, completed=step)

    def log(self, step: int, values: dict[str, float], summary: str | None = None) -> None:
        record = {"step": step, **values}
        self.jsonl.write(json.dumps(record) + "\n")
        self.jsonl.flush()
        if self.tensorboard is not None:
            for name, value in values.items():
                self.tensorboard.add_scalar(name, value, step)
        if summary is not None:
            self.progress.update(self.task, description=summary)

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

"""Where training metrics go: metrics.jsonl, the trackers of ``train.report_to`` (TensorBoard,
Weights & Biases) and the progress (a bar on a terminal, plain lines in a log file).

Rank 0 writes through a :class:`MetricsSink` (the numbers it receives are already averaged
over ranks by the trainer); the other ranks get a :class:`NullMetricsSink`, so a run of any
world size makes one TensorBoard log and one W&B run. metrics.jsonl is always written (sweeps,
the GPU proof and a resumed run read it). A resumed run continues each: metrics.jsonl loses
the records past the checkpoint it starts from, TensorBoard purges those steps (its
``purge_step``), and W&B continues the run whose id ``<run>/wandb-run-id`` holds (W&B keeps
the first value it got for a step, the one the resumed run logs again).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from pathlib import Path
from typing import Any

from vascl_scale.config import ALL_TRACKERS, NO_TRACKER, TRACKERS
from vascl_scale.fs import replace_file
from vascl_scale.log import LoopProgress

logger = logging.getLogger(__name__)

JSONL = "jsonl"
# Each optional tracker: the module it needs, and the pip extra that installs it.
OPTIONAL_TRACKERS = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb")}
assert (JSONL, *OPTIONAL_TRACKERS) == TRACKERS, "every name train.report_to takes has a writer here"
WANDB_ID_FILE = "wandb-run-id"


def tracker_installed(name: str) -> bool:
    """Whether the module tracker ``name`` needs can be imported (found, not imported)."""
    return importlib.util.find_spec(OPTIONAL_TRACKERS[name][0]) is not None


def resolve_trackers(report_to: list[str] | None) -> tuple[str, ...]:
    """The trackers a run writes to, ``jsonl`` first, from ``train.report_to``.

    Unset: jsonl, and TensorBoard when it is installed (said at debug level only, as nobody
    asked for it). A tracker asked for by name but not installed is a ValueError naming its
    pip extra; ``all`` takes those installed.
    """
    optional = tuple(OPTIONAL_TRACKERS)
    if report_to is None:
        if tracker_installed("tensorboard"):
            return (JSONL, "tensorboard")
        logger.debug("TensorBoard is not installed; metrics go to metrics.jsonl only (train.report_to)")
        return (JSONL,)
    if report_to == [NO_TRACKER]:
        return (JSONL,)
    if report_to == [ALL_TRACKERS]:
        return (JSONL, *(name for name in optional if tracker_installed(name)))
    for name in report_to:
        if name != JSONL and not tracker_installed(name):
            module, extra = OPTIONAL_TRACKERS[name]
            raise ValueError(
                f"train.report_to asks for {name}, whose Python package {module} is not installed: "
                f"pip install 'vascl-scale[{extra}]', or remove {name} from train.report_to"
            )
    return (JSONL, *(name for name in optional if name in report_to))


class _TensorBoard:
    """Scalars into ``<run>/tensorboard/``; a resumed run hides the steps after its checkpoint."""

    def __init__(self, run_dir: Path, start_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # Steps past start_step were logged by the stopped run after its checkpoint: this run logs them again.
        self.writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=start_step + 1 if start_step else None)

    def log(self, step: int, values: dict[str, float]) -> None:
        for name, value in values.items():
            self.writer.add_scalar(name, value, step)

    def close(self) -> None:
        self.writer.close()

    def describe(self) -> str:
        return "TensorBoard (tensorboard/)"


class _WandB:
    """One W&B run per run directory, its id kept in ``<run>/wandb-run-id`` so that a resumed
    training continues it; the run's config is logged once, at its start. WANDB_PROJECT
    (default vascl-scale), WANDB_MODE, WANDB_DIR (default: the run directory) and the other
    WANDB_* variables apply as W&B documents them."""

    def __init__(self, run_dir: Path, config: dict[str, Any]) -> None:
        import wandb

        id_file = run_dir / WANDB_ID_FILE
        run_id = id_file.read_text(encoding="utf-8").strip() if id_file.is_file() else None  # None: W&B draws one
        try:
            self.run = wandb.init(
                project=os.environ.get("WANDB_PROJECT", "vascl-scale"),
                name=run_dir.name,
                id=run_id,
                resume="allow",
                dir=None if "WANDB_DIR" in os.environ else str(run_dir),
                config=config,
            )
        except wandb.errors.Error as err:  # no API key, no network: a setup error, said as one
            raise ValueError(
                f"train.report_to: W&B could not start a run ({err}); run `wandb login`, or set WANDB_MODE=offline "
                "(sync later with `wandb sync`)"
            ) from err
        id_file.write_text(self.run.id + "\n", encoding="utf-8")

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()

    def describe(self) -> str:
        return f"W&B (run {self.run.id}, {self.run.settings.mode} mode)"


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
    replace_file(path, "".join(line + "\n" for line in kept))
    logger.info(
        "dropped %d records of %s past step %d, the checkpoint this run starts from (a stopped run logged "
        "them after it): this run logs those steps again",
        len(lines) - len(kept),
        path.name,
        step,
    )


class MetricsSink:
    """metrics.jsonl (one JSON object per line, appended across resumes), the other trackers
    (:func:`resolve_trackers`) and the progress.

    ``config``: the run's config as written, logged by the trackers that keep one (W&B).
    """

    def __init__(
        self, run_dir: Path, start_step: int, max_steps: int, trackers: tuple[str, ...], config: dict[str, Any]
    ) -> None:
        assert trackers[0] == JSONL, trackers
        run_dir = Path(run_dir)
        path = run_dir / "metrics.jsonl"
        _drop_records_past(path, start_step)
        self.jsonl = path.open("a", encoding="utf-8")
        self.trackers: list[_TensorBoard | _WandB] = []
        if "tensorboard" in trackers:
            self.trackers.append(_TensorBoard(run_dir, start_step))
        if "wandb" in trackers:
            self.trackers.append(_WandB(run_dir, config))
        logger.info("metrics: metrics.jsonl%s", "".join(f", {tracker.describe()}" for tracker in self.trackers))
        self.progress = LoopProgress("train", max_steps, "steps", completed=start_step, keep=True).start()

    def advance(self, step: int) -> None:
        self.progress.update(step)

    def log(self, step: int, values: dict[str, float], summary: str | None = None) -> None:
        record = {"step": step, **values}
        self.jsonl.write(json.dumps(record) + "\n")
        self.jsonl.flush()
        for tracker in self.trackers:
            tracker.log(step, values)
        if summary is not None:
            self.progress.update(step, note=summary)

    def close(self) -> None:
        self.progress.stop()
        self.jsonl.close()
        for tracker in self.trackers:
            tracker.close()


class NullMetricsSink:
    """The sink of ranks other than 0: the same calls, nothing written."""

    def advance(self, step: int) -> None:
        pass

    def log(self, step: int, values: dict[str, float], summary: str | None = None) -> None:
        pass

    def close(self) -> None:
        pass

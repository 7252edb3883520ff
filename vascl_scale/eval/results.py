"""One record per evaluated task: what the tables, the JSON and ``eval compare`` are built from."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

FAMILIES = ("sts", "clustering", "intent", "retrieval")  # the project's own evaluators
MTEB_FAMILY = "mteb"  # ``eval mteb``: tasks as mteb names them, scored by mteb's evaluators


@dataclass
class TaskResult:
    """The primary metric of one task (``None`` when its data is missing) and everything else.

    ``variant`` separates settings of one dataset, e.g. ``"5-shot"`` for few-shot intent.
    """

    family: str
    task: str
    metric: str
    primary: float | None = None
    variant: str = ""
    status: str = "ok"  # "ok", "missing" (no data) or "failed" (mteb's task raised); both with details["error"]
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.family}/{self.task}" + (f"/{self.variant}" if self.variant else "")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> TaskResult:
        return cls(**record)

    @classmethod
    def missing(cls, family: str, task: str, metric: str, error: Exception, variant: str = "") -> TaskResult:
        return cls(family, task, metric, None, variant, "missing", {"error": str(error)})


def in_task_order(results: list[TaskResult], order: Sequence[str]) -> list[TaskResult]:
    """Results sorted by task as in ``order`` (unknown tasks last); stable, so a task's variants
    keep their order."""
    position = {task: i for i, task in enumerate(order)}
    return sorted(results, key=lambda result: position.get(result.task, len(position)))

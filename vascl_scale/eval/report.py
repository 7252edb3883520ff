"""Results of one ``eval`` run: the JSON record, the paper-layout tables and ``eval compare``.

Tables follow the paper: one table per task family, tasks as columns and the average last
(Tables 1 and 2); few-shot intent has one row per (model, K), cells "mean +- std" (Table 3).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table

from vascl_scale import __version__
from vascl_scale.eval.clustering import CLUSTERING_TASKS
from vascl_scale.eval.intent import INTENT_TASKS
from vascl_scale.eval.results import FAMILIES, MTEB_FAMILY, TaskResult
from vascl_scale.eval.sts import PAPER_STS_TASKS, STS_TASKS
from vascl_scale.fs import replace_file
from vascl_scale.precision import precision_name

# Families in the order their tables appear; mteb's tasks keep the order they were run in.
REPORTED_FAMILIES = (*FAMILIES, MTEB_FAMILY)
TASK_ORDER = {"sts": tuple(STS_TASKS), "clustering": CLUSTERING_TASKS, "intent": INTENT_TASKS}
# Tasks averaged in the "Avg." column: the paper's columns (sickr-full and stsb-dev are extras);
# for retrieval and mteb, every task run (MTEB's mean over tasks).
AVERAGED = {"sts": PAPER_STS_TASKS, "clustering": CLUSTERING_TASKS, "intent": INTENT_TASKS}
TITLES = {
    "sts": "STS: Spearman x 100 of cosine similarity (Table 1)",
    "clustering": "Short text clustering: KMeans accuracy x 100, mean of seeds (Table 2)",
    "intent": "Few-shot intent classification: test accuracy x 100, mean +- std of splits (Table 3)",
    "retrieval": "Retrieval (BEIR format): nDCG@10 x 100, exact cosine search; MRR@10 and Recall@100 in the JSON; "
    "Avg.: the mean over datasets",
    MTEB_FAMILY: "MTEB: each task's main score x 100, from mteb's own evaluators; Avg.: the mean over tasks",
}


def short_label(model_path: str) -> str:
    """A model path's last two parts ("run/best", "pkg/model"): short for tables, still telling."""
    return "/".join(Path(model_path).parts[-2:]) or model_path


def write_output(path: str | Path, text: str) -> Path:
    """``text`` at ``path`` (its folder made), whole or not at all (:func:`vascl_scale.fs.replace_file`):
    a write that fails leaves an earlier file there as it was, and is a ValueError naming the file
    (a full disk: replace_file's own)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_file(path, text)
    except OSError as err:
        raise ValueError(
            f"cannot write {path} ({err.strerror or err}); an earlier {path.name} there is left as it was: "
            "free space on that disk or write it elsewhere"
        ) from None
    return path


def write_json(path: str | Path, record: dict[str, Any]) -> Path:
    """``record`` as indented JSON at ``path`` (:func:`write_output`). NaN or inf is refused
    (``ValueError``): JSON has no such numbers, and a score that is one is a bug upstream."""
    return write_output(path, json.dumps(record, indent=1, allow_nan=False) + "\n")


@dataclass
class ModelReport:
    model: dict[str, Any]  # ModelSpec.describe()
    embedding: dict[str, Any]  # EmbeddingStats.to_json()
    seconds: dict[str, float]  # wall time per stage
    results: list[TaskResult] = field(default_factory=list)

    @property
    def label(self) -> str:
        """The model's short name; with the dimensions scored when they were truncated (--truncate-dim)."""
        dims = self.model.get("truncate_dim")
        return short_label(self.model["name"]) + (f" @{dims}d" if dims is not None else "")

    @property
    def precision(self) -> str:
        """What the encoder ran in: float32 or bf16 (files from before --precision: float32)."""
        return precision_name(self.embedding.get("precision", "no"))

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "embedding": self.embedding,
            "seconds": self.seconds,
            "results": [result.to_json() for result in self.results],
        }

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> ModelReport:
        results = [TaskResult.from_json(r) for r in record["results"]]
        return cls(record["model"], record.get("embedding", {}), record.get("seconds", {}), results)


@dataclass
class EvalReport:
    models: list[ModelReport]
    data_dir: str = ""
    created: str = field(default_factory=lambda: dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))

    def to_json(self) -> dict[str, Any]:
        return {
            "vascl_scale_version": __version__,
            "created": self.created,
            "data_dir": self.data_dir,
            "models": [m.to_json() for m in self.models],
        }

    def save(self, path: str | Path) -> None:
        write_json(path, self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> EvalReport:
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"results file {path} not found; pass a JSON written by `vascl-scale eval ... --output`")
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            models = [ModelReport.from_json(m) for m in record["models"]]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise ValueError(f"{path} is not a vascl-scale eval results file ({err})") from None
        return cls(models, record.get("data_dir", ""), record.get("created", ""))


def _ordered_tasks(results: Sequence[TaskResult], family: str) -> list[str]:
    present = list(dict.fromkeys(r.task for r in results if r.family == family))
    return [task for task in TASK_ORDER[family] if task in present] if family in TASK_ORDER else present


def _variants(results: Sequence[TaskResult], family: str) -> list[str]:
    found = dict.fromkeys(r.variant for r in results if r.family == family)
    return sorted(found, key=lambda v: (len(v), v))  # "5-shot" < "10-shot" < "20-shot"


def _cell(result: TaskResult | None, with_std: bool) -> str:
    if result is None:
        return ""
    if result.status != "ok":
        return result.status  # missing or failed
    if with_std and "accuracy_std" in result.details:
        return f"{result.primary:.2f}±{result.details['accuracy_std']:.2f}"
    return f"{result.primary:.2f}"


def _averaged_tasks(results: dict[str, TaskResult], family: str) -> list[str]:
    """The tasks of the paper's average (a benchmark's: all of its tasks) that ``results`` (one
    row's, by task) scored."""
    return [task for task in AVERAGED.get(family, tuple(results)) if task in results and results[task].status == "ok"]


def _average(results: dict[str, TaskResult], family: str) -> str:
    """Mean of the primary metric over the family's averaged tasks; "*" if some are missing
    (not run, as with --task, without data, or failed): then it is not the paper's (or the
    benchmark's) average."""
    averaged = AVERAGED.get(family, tuple(results))
    present = _averaged_tasks(results, family)
    if not present:
        return ""
    return f"{np.mean([results[task].primary for task in present]):.2f}" + ("*" if len(present) < len(averaged) else "")


def _rows_by_task(report: EvalReport, family: str) -> Iterator[tuple[str, str, dict[str, TaskResult]]]:
    """(model label, variant, that row's results by task) of each row of the family's table."""
    everything = [r for m in report.models for r in m.results]
    for variant in _variants(everything, family):
        for model in report.models:
            by_task = {r.task: r for r in model.results if r.family == family and r.variant == variant}
            if by_task:
                yield model.label, variant, by_task


def family_rows(report: EvalReport, family: str) -> tuple[list[str], list[list[str]]]:
    """Header and rows of one family's table (the same cells for rich and Markdown)."""
    tasks = _ordered_tasks([r for m in report.models for r in m.results], family)
    header = ["Model"] + (["K"] if family == "intent" else []) + tasks + ["Avg."]
    rows = []
    for label, variant, by_task in _rows_by_task(report, family):
        cells = [_cell(by_task.get(task), with_std=family == "intent") for task in tasks]
        rows.append([label] + ([variant] if family == "intent" else []) + cells + [_average(by_task, family)])
    return header, rows


def average_note(report: EvalReport, family: str) -> str:
    """What a starred "Avg." averages (each distinct set of tasks), and which tasks in the table
    no "Avg." includes (the extras, e.g. sickr-full); "" when every Avg. is the paper's (or,
    for a benchmark without one, the mean of what ran)."""
    if family not in AVERAGED:
        return ""
    paper = AVERAGED[family]
    partial: list[list[str]] = []  # in the order of the rows
    for *_, by_task in _rows_by_task(report, family):
        tasks = _averaged_tasks(by_task, family)
        if 0 < len(tasks) < len(paper) and tasks not in partial:
            partial.append(tasks)
    notes = [
        f"Avg.* is the mean of {', '.join(tasks)} only ({len(tasks)} of the {len(paper)} tasks the paper averages)"
        for tasks in partial
    ]
    extras = [
        task for task in _ordered_tasks([r for m in report.models for r in m.results], family) if task not in paper
    ]
    if extras:
        notes.append(f"{', '.join(extras)} {'is' if len(extras) == 1 else 'are'} not averaged")
    return "; ".join(notes) + "." if notes else ""


def families_in(report: EvalReport) -> list[str]:
    present = {r.family for m in report.models for r in m.results}
    return [family for family in REPORTED_FAMILIES if family in present]


def family_title(report: EvalReport, family: str) -> str:
    """The family's title; for STS, which copies were scored when not the published releases."""
    sources = {
        r.details.get("source") for m in report.models for r in m.results if r.family == family and r.status == "ok"
    }
    if family == "sts" and "senteval" in sources:
        return (
            TITLES[family]
            + "; STS12-16 and STS-B on SentEval's tokenised copies"
            + (", SICK-R untokenised (no SentEval copy)" if "mteb" in sources else "")
        )
    return TITLES[family]


def rich_tables(report: EvalReport) -> list[Table]:
    tables = []
    for family in families_in(report):
        header, rows = family_rows(report, family)
        note = average_note(report, family)
        table = Table(
            title=family_title(report, family), title_justify="left", caption=note or None, caption_justify="left"
        )
        for i, name in enumerate(header):
            table.add_column(name, justify="left" if i == 0 else "right", style="bold" if name == "Avg." else None)
        for row in rows:
            table.add_row(*row)
        tables.append(table)
    return tables


def markdown(report: EvalReport) -> str:
    parts = []
    for family in families_in(report):
        header, rows = family_rows(report, family)
        lines = [f"### {family_title(report, family)}", "", "| " + " | ".join(header) + " |"]
        lines.append("|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|")
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        note = average_note(report, family)
        parts.append("\n".join(lines) + (f"\n\n{note}" if note else ""))
    return (
        "\n\n".join(parts)
        + "\n\n`missing`: dataset file absent; `failed`: the task raised (its error is in the JSON).\n"
    )


def _paper_order(key: str) -> tuple:
    """Sort key of "family/task[/variant]": variants as K grows, then tasks in paper order."""
    family, task, *variant = key.split("/")
    variant_name = variant[0] if variant else ""
    tasks = TASK_ORDER.get(family, ())  # mteb's tasks: by name
    return (len(variant_name), variant_name, tasks.index(task) if task in tasks else len(tasks), task)


def compare_rows(baseline: ModelReport, candidate: ModelReport) -> list[list[str]]:
    """Per task (in paper order): baseline, candidate, candidate - baseline; then family averages.
    A task scored on different data (``--sts-source``) gets no difference and stays out of the mean."""
    first = {r.key: r for r in baseline.results}
    second = {r.key: r for r in candidate.results}
    rows = []
    for family in REPORTED_FAMILIES:
        diffs = []
        keys = [k for k in dict.fromkeys(list(first) + list(second)) if k.split("/")[0] == family]
        for key in sorted(keys, key=_paper_order):
            a, b = first.get(key), second.get(key)
            a_ok = a is not None and a.status == "ok"
            b_ok = b is not None and b.status == "ok"
            delta = ""
            # STS-B on SentEval's tokenised copy and on the release are different test sets; files
            # written before --sts-source (and the other families) scored the releases.
            a_source, b_source = (r.details.get("source", "mteb") if r is not None else None for r in (a, b))
            if a_ok and b_ok and a_source != b_source:
                delta = f"not comparable: {a_source} vs {b_source}"
            elif a_ok and b_ok:
                diffs.append(b.primary - a.primary)
                delta = f"{b.primary - a.primary:+.2f}"
            rows.append([key, f"{a.primary:.2f}" if a_ok else "-", f"{b.primary:.2f}" if b_ok else "-", delta])
        if diffs:
            tasks = f"{len(diffs)} task" + ("s" if len(diffs) != 1 else "")
            rows.append([f"{family} mean difference ({tasks})", "", "", f"{np.mean(diffs):+.2f}"])
    return rows


def compare_title(baseline: ModelReport, candidate: ModelReport) -> str:
    """B minus A, and when the two encoded in different precisions, that the differences include
    the precision's (bf16 moves clustering and intent scores by a few tenths)."""
    title = f"{candidate.label} minus {baseline.label}"
    if baseline.precision != candidate.precision:
        title += (
            f"; precisions differ: A encoded in {baseline.precision}, B in {candidate.precision}, so each "
            "difference includes the precision's (evaluate both with the same --precision to compare models)"
        )
    return title


def compare_table(baseline: ModelReport, candidate: ModelReport) -> Table:
    table = Table(title=compare_title(baseline, candidate), title_justify="left")
    for name, justify in (("Task", "left"), ("A", "right"), ("B", "right"), ("B - A", "right")):
        table.add_column(name, justify=justify)
    for row in compare_rows(baseline, candidate):
        table.add_row(*row)
    return table

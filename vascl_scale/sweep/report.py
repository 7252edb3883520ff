"""Collect a sweep's cells into one table (CSV, JSON, Markdown) and plots (PNG).

One row per cell: the grid values, the seed, the state, how long it trained (optimiser steps
and sentences: equal steps and equal sentences are different studies), every evaluation primary metric,
the median step time and sentences/s over the logged windows (the first window, which
holds warm-up, is left out when there are others), the best STS-B dev score, the peak
resident memory of the training process tree and the wall time. A second table averages
seeds (mean and std) per grid point; the plots draw it.
"""

from __future__ import annotations

import csv
import json
import re
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from vascl_scale.config.schema import RETRIEVAL_DEV_METRIC, STSB_DEV_METRIC
from vascl_scale.eval.report import AVERAGED
from vascl_scale.sweep.grid import SweepPlan
from vascl_scale.sweep.run import cell_dir, read_status

COST_COLUMNS = ("step_seconds", "sentences_per_second", "peak_rss_mb", "wall_seconds")
LENGTH_COLUMNS = ("optimiser_steps", "sentences_seen")  # from the last training record of metrics.jsonl


def _metrics_summary(run_dir: Path) -> dict[str, float]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return {}
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    windows = [r for r in records if "step_seconds" in r]
    steady = windows[1:] or windows
    summary: dict[str, float] = {}
    trained = [r for r in records if "data/samples" in r]
    if trained:
        summary["optimiser_steps"] = trained[-1]["step"]
        summary["sentences_seen"] = int(trained[-1]["data/samples"])
    for key in ("step_seconds", "sentences_per_second"):
        values = [r[key] for r in steady if isinstance(r.get(key), (int, float))]
        if values:
            summary[key] = statistics.median(values)
    peaks = [r["peak_memory_mb"] for r in records if isinstance(r.get("peak_memory_mb"), (int, float))]
    if peaks:
        summary["peak_device_memory_mb"] = max(peaks)
    for metric, column in ((STSB_DEV_METRIC, "stsb_dev_best"), (RETRIEVAL_DEV_METRIC, "dev_retrieval_best")):
        dev = [r[metric] for r in records if isinstance(r.get(metric), (int, float))]
        if dev:
            summary[column] = max(dev)
    return summary


def _eval_metrics(report_path: Path) -> dict[str, float]:
    if not report_path.is_file():
        return {}
    record = json.loads(report_path.read_text(encoding="utf-8"))
    metrics = {}
    by_family: dict[str, list[float]] = defaultdict(list)
    for result in record["models"][0]["results"]:
        if result.get("primary") is not None:
            key = f"{result['family']}/{result['task']}" + (f"/{result['variant']}" if result.get("variant") else "")
            metrics[key] = float(result["primary"])
            averaged = AVERAGED.get(result["family"])  # None: every task of the family (retrieval, mteb)
            if averaged is None or result["task"] in averaged:
                by_family[result["family"]].append(float(result["primary"]))
    # The paper's "Avg." column: the mean of the family's primary metrics over its paper tasks
    # (extras such as stsb-dev, the model-selection set, stay out of it).
    for family, values in by_family.items():
        if len(values) > 1:
            metrics[f"{family}/avg"] = statistics.fmean(values)
    return metrics


def cell_rows(sweep_dir: Path, plan: SweepPlan) -> list[dict[str, Any]]:
    rows = []
    for cell in plan.cells:
        status = read_status(sweep_dir, cell)
        directory = cell_dir(sweep_dir, cell)
        row: dict[str, Any] = {**({"variant": cell.variant} if plan.variants else {}), **cell.values}
        row.update(seed=cell.seed, state=status.get("state", "pending"))
        if status.get("error"):
            row["error"] = status["error"].splitlines()[0]
        row.update(_eval_metrics(directory / "eval.json"))
        row.update(_metrics_summary(directory / "run"))
        for key in ("peak_rss_mb", "wall_seconds"):
            if key in status:
                row[key] = status[key]
        rows.append(row)
    return rows


def metric_columns(rows: list[dict[str, Any]], plan: SweepPlan) -> list[str]:
    fixed = set(plan.columns) | {"seed", "state", "error"}
    found = []
    for row in rows:
        for key, value in row.items():
            if key not in fixed and key not in found and isinstance(value, (int, float)):
                found.append(key)
    quality = sorted(k for k in found if k not in COST_COLUMNS and k not in LENGTH_COLUMNS)
    return [k for k in LENGTH_COLUMNS if k in found] + quality + [k for k in COST_COLUMNS if k in found]


def headline_columns(metrics: list[str]) -> list[str]:
    """What fits a terminal: the training length, family averages (or the lone task of a family), then the costs."""
    averages = [m for m in metrics if m.endswith("/avg")]
    families_with_average = {m.split("/")[0] for m in averages}
    singles = [m for m in metrics if "/" in m and m.split("/")[0] not in families_with_average and m not in averages]
    costs = [m for m in ("step_seconds", "sentences_per_second", "peak_rss_mb") if m in metrics]
    return [m for m in LENGTH_COLUMNS if m in metrics] + averages + singles + costs


def aggregate(rows: list[dict[str, Any]], plan: SweepPlan, metrics: list[str]) -> list[dict[str, Any]]:
    """Mean and std over seeds of every metric, per grid point (done cells only)."""
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if row["state"] == "done":
            groups[tuple(json.dumps(row[k]) for k in plan.columns)].append(row)
    table = []
    for key, members in groups.items():
        entry: dict[str, Any] = {k: json.loads(v) for k, v in zip(plan.columns, key)}
        entry["seeds"] = len(members)
        for metric in metrics:
            values = [m[metric] for m in members if isinstance(m.get(metric), (int, float))]
            if values:
                mean = statistics.fmean(values)
                # Counts (steps, sentences) stay whole numbers where every seed agrees.
                entry[metric] = int(mean) if all(isinstance(v, int) for v in values) and mean.is_integer() else mean
                if len(values) > 1:  # a single seed has no spread to report
                    entry[f"{metric}_std"] = statistics.stdev(values)
        table.append(entry)
    return table


def format_cell(value: Any) -> str:
    """A table cell: floats to 2 decimals (small ones to 2 significant digits), counts as they are."""
    if isinstance(value, float):
        return f"{value:.2f}" if abs(value) >= 0.01 or value == 0 else f"{value:.2g}"
    return str(value)


def markdown_table(entries: list[dict[str, Any]], columns: list[str], with_std: bool) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for entry in entries:
        cells = []
        for column in columns:
            value = entry.get(column, "")
            std = entry.get(f"{column}_std")
            cells.append(
                f"{format_cell(value)} ± {format_cell(std)}"
                if with_std and std is not None and value != ""
                else format_cell(value)
            )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _x_axis(plan: SweepPlan) -> str:
    for key in plan.grid:
        if key.endswith("global_batch_size"):
            return key
    return next(iter(plan.grid)) if plan.grid else "variant"


def _natural_key(label: str) -> list:
    """Sort "k=4" before "k=16"."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", label)]


def _draw(ax, entries: list[dict[str, Any]], plan: SweepPlan, metric: str) -> bool:
    """``metric`` against the x axis on ``ax``, a line per combination of the other columns,
    error bars = std over seeds; False when no entry has the metric."""
    x_key = _x_axis(plan)
    line_keys = [k for k in plan.columns if k != x_key]
    lines: dict[str, list[tuple[Any, float, float]]] = defaultdict(list)
    for entry in entries:
        if metric in entry:
            label = ", ".join(f"{k.split('.')[-1]}={entry[k]}" for k in line_keys) or metric
            lines[label].append((entry[x_key], entry[metric], entry.get(f"{metric}_std", 0.0)))
    if not lines:
        return False
    numeric_x = all(isinstance(x, (int, float)) for points in lines.values() for x, _, _ in points)
    order = list(plan.variants) if x_key == "variant" else []
    for label, points in sorted(lines.items(), key=lambda item: _natural_key(item[0])):
        points.sort(key=lambda p: p[0] if numeric_x else (order.index(p[0]) if p[0] in order else str(p[0])))
        xs = [p[0] if numeric_x else str(p[0]) for p in points]
        # Categorical x (variants, names) has no order between points: markers only.
        style = "-" if numeric_x else "none"
        ax.errorbar(
            xs, [p[1] for p in points], yerr=[p[2] for p in points], marker="o", capsize=3, linestyle=style, label=label
        )
    if numeric_x and all(x > 0 for points in lines.values() for x, _, _ in points):
        ax.set_xscale("log", base=2)
        ticks = sorted({x for points in lines.values() for x, _, _ in points})
        ax.set_xticks(ticks, [str(t) for t in ticks])
    if not numeric_x:
        ax.tick_params(axis="x", labelrotation=35)
    ax.set_xlabel(x_key)
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    if len(lines) > 1:
        ax.legend(fontsize=8)
    return True


def plot(
    entries: list[dict[str, Any]], plan: SweepPlan, metrics: list[str], headline: list[str], out_dir: Path
) -> list[Path]:
    """One PNG per metric against the x axis (the global batch when swept, else the first grid
    key, else the variant), and ``overview.png``: the headline quality metrics side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for metric in (m for m in metrics if m not in LENGTH_COLUMNS):
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        if _draw(ax, entries, plan, metric):
            fig.tight_layout()
            written.append(out_dir / (metric.replace("/", "_") + ".png"))
            fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    overview = [m for m in headline if m not in COST_COLUMNS and m not in LENGTH_COLUMNS]
    if len(overview) > 1:
        fig, axes = plt.subplots(1, len(overview), figsize=(4.2 * len(overview), 3.8), squeeze=False)
        for ax, metric in zip(axes[0], overview):
            _draw(ax, entries, plan, metric)
            ax.set_title(metric, fontsize=9)
        fig.tight_layout()
        written.append(out_dir / "overview.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    return written


def collect(sweep_dir: Path, headline: list[str] | None = None) -> dict[str, Any]:
    """Write results.{csv,json,md} and plots/*.png; return what was written and the counts.

    ``headline``: the metrics of the summary (the first table of results.md, the terminal
    table and plots/overview.png); default: :func:`headline_columns`.
    """
    sweep_dir = Path(sweep_dir)
    plan = SweepPlan.load(sweep_dir)
    rows = cell_rows(sweep_dir, plan)
    metrics = metric_columns(rows, plan)
    unknown = [m for m in headline or [] if m not in metrics]
    if unknown:
        raise ValueError(f"no cell of {sweep_dir} has metric(s) {unknown}; choose from {', '.join(metrics)}")
    # The training length always leads the summary: without it equal-steps and equal-sentences
    # studies read alike.
    if headline:
        headline = [m for m in LENGTH_COLUMNS if m in metrics and m not in headline] + list(headline)
    else:
        headline = headline_columns(metrics)
    entries = aggregate(rows, plan, metrics)
    grid_columns = plan.columns

    columns = [*grid_columns, "seed", "state", *metrics, "error"]
    with (sweep_dir / "results.csv").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    (sweep_dir / "results.json").write_text(
        json.dumps({"plan": str(sweep_dir / "sweep.json"), "cells": rows, "mean_over_seeds": entries}, indent=1) + "\n",
        encoding="utf-8",
    )
    markdown = "## Summary: mean ± std over seeds\n\n" + markdown_table(
        entries, [*grid_columns, "seeds", *headline], True
    )
    markdown += "\n## Mean ± std over seeds, every metric\n\n"
    markdown += markdown_table(entries, [*grid_columns, "seeds", *metrics], True)
    markdown += "\n## Every cell\n\n" + markdown_table(rows, [*grid_columns, "seed", "state", *metrics], False)
    failed = [r for r in rows if r["state"] == "failed"]
    if failed:
        markdown += (
            "\n## Failed cells\n\n"
            + "\n".join(
                f"- {', '.join(f'{k}={r[k]}' for k in grid_columns)}, seed {r['seed']}: {r.get('error', '')}"
                for r in failed
            )
            + "\n"
        )
    if plan.skipped:
        markdown += (
            "\n## Skipped cells (invalid config, --skip-invalid)\n\n"
            + "\n".join(f"- {name}: {reason}" for name, reason in plan.skipped.items())
            + "\n"
        )
    (sweep_dir / "results.md").write_text(markdown, encoding="utf-8")
    plots = plot(entries, plan, metrics, headline, sweep_dir / "plots")
    states = ("done", "failed", "interrupted", "pending")
    counts = {state: sum(r["state"] == state for r in rows) for state in states}
    return {
        "rows": rows,
        "entries": entries,
        "metrics": metrics,
        "headline": headline,
        "plots": plots,
        "counts": counts,
    }

"""The table of the pairs study (docs/findings/pairs-study.md) from its ``eval all`` results.

Usage: python tools/pairs_study_table.py EVAL_JSON LABEL=PART_OF_MODEL_NAME ...

STS-B train pairs made the paired data, so STS-B is reported apart and left out of the STS
average (the other six tasks of Table 1); clustering and few-shot intent are the families'
average as ``eval all`` writes it (the launcher leaves few-shot intent out).
"""

from __future__ import annotations

import sys

import numpy as np

from vascl_scale.eval.report import AVERAGED, EvalReport

HELD_OUT = "stsb"  # the paired data's source: not in the average


def family_mean(results: list, family: str, leave_out: str = "") -> float:
    """Mean primary metric of ``family``'s averaged tasks (every variant), ``leave_out`` excluded."""
    values = [r.primary for r in results if r.family == family and r.task in AVERAGED[family] and r.task != leave_out]
    assert values and all(v is not None for v in values), f"{family}: missing results"
    return float(np.mean(values))


def main(path: str, labelled: list[str]) -> None:
    report = EvalReport.load(path)
    print("| Model | STS avg (6, no STS-B) | STS-B | SICK-R | clustering avg |")
    print("|---|---:|---:|---:|---:|")
    for item in labelled:
        label, part = item.split("=", 1)
        [model] = [m for m in report.models if part in m.model["name"]]
        by_task = {r.task: r.primary for r in model.results if r.family == "sts"}
        cells = [
            family_mean(model.results, "sts", HELD_OUT),
            by_task[HELD_OUT],
            by_task["sickr"],
            family_mean(model.results, "clustering"),
        ]
        print(f"| {label} | " + " | ".join(f"{value:.2f}" for value in cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])

"""The table of the loss-options study (docs/findings/false-negatives-matryoshka.md) from the
eval reports and the runs' metrics that ``launchers/loss_options_study.sh`` writes.

Usage: python -m tools.loss_options_study_table STUDY_OUT

One row per model and dimension (384, and the prefixes --truncate-dim 128 and 64 read): STS-B
test and SICK-R Spearman x 100, the STS-B dev retrieval set's nDCG@10, MRR@10 and Recall@100,
and the mean clustering accuracy of the three sets; then the masked false negatives per step of
the duplicates run (its metrics.jsonl's loss/false_negatives).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from vascl_scale.eval.report import EvalReport

MODELS = (
    ("minilm", "packaged all-MiniLM-L6-v2 (start)"),
    ("baseline", "simcse_sup"),
    ("duplicates", "simcse_sup, false_negatives: duplicates"),
    ("matryoshka", "simcse_sup, matryoshka_dims [384, 128, 64]"),
)
DIMENSIONS = ((384, ""), (128, "-128"), (64, "-64"))
CLUSTERING = ("tweet", "agnews", "searchsnippets")


def _results(path: Path) -> dict:
    """task -> result of the one model of the report at ``path``."""
    (model,) = EvalReport.load(path).models
    return {result.task: result for result in model.results}


def main(out: str) -> None:
    results = Path(out) / "results"
    print("| model | dims | STS-B test | SICK-R | retrieval nDCG@10 | MRR@10 | Recall@100 | clustering (3 sets) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, title in MODELS:
        for dims, suffix in DIMENSIONS:
            sts = _results(results / f"{name}{suffix}-sts.json")
            retrieval = _results(results / f"{name}{suffix}-retrieval.json")["stsb-dev-retrieval"].details
            clustering = _results(results / f"{name}{suffix}-clustering.json")
            accuracy = sum(clustering[task].primary for task in CLUSTERING) / len(CLUSTERING)
            print(
                f"| {title} | {dims} | {sts['stsb'].primary:.2f} | {sts['sickr'].primary:.2f} | "
                f"{retrieval['ndcg_at_10']:.2f} | {retrieval['mrr_at_10']:.2f} | {retrieval['recall_at_100']:.2f} | "
                f"{accuracy:.2f} |"
            )
    lines = (Path(out) / "run-duplicates" / "metrics.jsonl").read_text().splitlines()
    masked = [(r["step"], r["loss/false_negatives"]) for r in map(json.loads, lines) if "loss/false_negatives" in r]
    print()
    print(
        "masked (anchor, candidate) cells per loss call, mean of the logging window: "
        + ", ".join(f"step {step}: {value:.1f}" for step, value in masked)
    )


if __name__ == "__main__":
    main(*sys.argv[1:])

"""``eval all`` in library form: load the tasks once, then per model embed every distinct text
once (through the cache) and score every task on those embeddings."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from vascl_scale.encode import Embedder, ModelSpec
from vascl_scale.eval.clustering import CLUSTERING_TASKS, ClusteringEvaluator
from vascl_scale.eval.intent import INTENT_TASKS, FewShotProtocol, IntentEvaluator
from vascl_scale.eval.report import EvalReport, ModelReport
from vascl_scale.eval.results import FAMILIES
from vascl_scale.eval.sts import PAPER_STS_TASKS, STSEvaluator, check_sts_source

logger = logging.getLogger(__name__)

DEFAULT_TASKS = {"sts": PAPER_STS_TASKS, "clustering": CLUSTERING_TASKS, "intent": INTENT_TASKS}


def resolve_data_dir(data_dir: str | Path | None) -> Path:
    """``data_dir``, else ``$VASCL_DATA``; it must be an existing directory."""
    chosen = data_dir or os.environ.get("VASCL_DATA")
    if not chosen:
        raise ValueError(
            "no evaluation data: pass --data-dir DIR or set VASCL_DATA (`vascl-scale data download --to DIR` fetches it)"
        )
    path = Path(chosen)
    if not path.is_dir():
        raise ValueError(f"data directory {path} does not exist; pass --data-dir or set VASCL_DATA")
    return path


def build_evaluators(
    data_dir: str | Path,
    families: Sequence[str],
    tasks: Mapping[str, Sequence[str]] | None = None,
    missing_ok: bool = False,
    clustering_seeds: int = 10,
    protocol: FewShotProtocol = FewShotProtocol(),
    clustering_max_texts: int | None = None,
    sts_source: str = "mteb",
) -> list:
    """One evaluator per family, its data loaded. With ``missing_ok`` a task whose file is absent
    is skipped with a warning and reported as missing; otherwise its absence raises.
    ``sts_source``: the STS copies to score (:data:`vascl_scale.eval.sts.STS_SOURCES`).
    ``clustering_max_texts``: see :meth:`ClusteringEvaluator.from_data_dir`."""
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        raise ValueError(f"unknown task families {unknown}; choose from {', '.join(FAMILIES)}")
    if clustering_max_texts is not None and "clustering" not in families:
        raise ValueError("--clustering-max-texts only applies to clustering tasks (eval clustering or eval all)")
    if check_sts_source(sts_source) != "mteb" and "sts" not in families:
        raise ValueError("--sts-source only applies to STS tasks (eval sts or eval all)")
    tasks = {**DEFAULT_TASKS, **(tasks or {})}
    evaluators = []
    for family in families:
        if family == "sts":
            evaluators.append(STSEvaluator.from_data_dir(data_dir, tasks["sts"], missing_ok, sts_source))
        elif family == "clustering":
            seeds = tuple(range(clustering_seeds))
            evaluators.append(
                ClusteringEvaluator.from_data_dir(
                    data_dir, tasks["clustering"], missing_ok, seeds, clustering_max_texts
                )
            )
        else:
            evaluators.append(IntentEvaluator.from_data_dir(data_dir, tasks["intent"], missing_ok, protocol))
    return evaluators


def evaluate_model(embedder: Embedder, evaluators: Sequence, prompt: str | None = None) -> ModelReport:
    """Embed the union of the evaluators' texts once, then score each evaluator on it.
    ``prompt``: the name of one of the model's prompts, put before every text (none by default)."""
    prompt_text = embedder.spec.prompt_text(prompt)
    started = time.perf_counter()
    per_family = {evaluator.family: evaluator.texts() for evaluator in evaluators}
    texts = set().union(*per_family.values())
    if len(per_family) > 1:  # where the encoding time goes; families share some texts
        counts = ", ".join(f"{family} {len(family_texts):,}" for family, family_texts in per_family.items())
        logger.info("distinct texts per family: %s; %s in all", counts, f"{len(texts):,}")
    embeddings = embedder.embed(texts, prompt_text)
    seconds = {"embed": time.perf_counter() - started}
    results = []
    for evaluator in evaluators:
        began = time.perf_counter()
        try:
            results += evaluator.evaluate(embeddings)
        except ValueError as err:  # e.g. a collapsed encoder: say which of the models it is
            raise ValueError(f"{embedder.spec.directory}: {err}") from None
        seconds[evaluator.family] = time.perf_counter() - began
    seconds["total"] = time.perf_counter() - started
    logger.info(
        "%s: embedding %.1f s (%d texts encoded), scoring %.1f s",
        embedder.spec.name,
        seconds["embed"],
        embedder.stats.encoded,
        seconds["total"] - seconds["embed"],
    )
    model = embedder.spec.describe()
    if prompt is not None:
        model["prompt"] = prompt  # the prompt every text was embedded after
    return ModelReport(model, embedder.stats.to_json(), seconds, results)


def run_evaluation(
    specs: Sequence[ModelSpec],
    evaluators: Sequence,
    data_dir: str | Path = "",
    batch_size: int = 64,
    cache_dir: str | Path | None = None,
    device: str | None = None,
    precision: str = "no",
    prompt: str | None = None,
) -> EvalReport:
    for spec in specs:  # an unknown prompt name fails before any model is loaded
        spec.prompt_text(prompt)
    models = []
    for spec in specs:
        embedder = Embedder(spec, batch_size=batch_size, cache_dir=cache_dir, device=device, precision=precision)
        models.append(evaluate_model(embedder, evaluators, prompt))
    return EvalReport(models, str(data_dir))

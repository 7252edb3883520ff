"""``eval all`` in library form: load the tasks once, then per model embed every distinct text
once (through the cache) and score every task on those embeddings.

Prompts by role: a retrieval evaluator's queries are embedded after the model's ``query``
prompt and its documents after its ``document`` prompt (where the model has them, as ``eval
mteb`` does); every other family's texts after the prompt ``--prompt`` names (none by default).
Roles whose prompts are the same text share one embedding pass."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from vascl_scale.encode import Embedder, ModelSpec, TextEmbeddings, check_truncate_dim
from vascl_scale.eval.clustering import CLUSTERING_TASKS, KMEANS_INITS, ClusteringEvaluator
from vascl_scale.eval.intent import INTENT_TASKS, FewShotProtocol, IntentEvaluator
from vascl_scale.eval.report import EvalReport, ModelReport
from vascl_scale.eval.results import FAMILIES
from vascl_scale.eval.retrieval import RETRIEVAL, SPLITS, RetrievalEvaluator
from vascl_scale.eval.sts import PAPER_STS_TASKS, STSEvaluator, check_sts_source
from vascl_scale.sentence_transformers_format import DOCUMENT, QUERY

logger = logging.getLogger(__name__)

# Per family, the tasks run when --task names none of it (retrieval: every dataset found).
DEFAULT_TASKS = {"sts": PAPER_STS_TASKS, "clustering": CLUSTERING_TASKS, "intent": INTENT_TASKS, RETRIEVAL: None}
OTHER = "other"  # the role of a text embedded for a symmetric task (STS, clustering, intent)


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
    kmeans_inits: int | None = None,
    sts_source: str = "mteb",
    split: str = "test",
    retrieval_dirs: Sequence[str | Path] | None = None,
    ignore_identical_ids: bool = False,
) -> list:
    """One evaluator per family, its data loaded. With ``missing_ok`` a task whose file is absent
    is skipped with a warning and reported as missing; otherwise its absence raises.
    ``sts_source``: the STS copies to score (:data:`vascl_scale.eval.sts.STS_SOURCES`).
    ``clustering_max_texts``, ``kmeans_inits`` (None: 10): see :meth:`ClusteringEvaluator.from_data_dir`. Retrieval: the
    BEIR directories ``retrieval_dirs``, else those under ``<data_dir>/retrieval/``, scored on
    their ``qrels/<split>.tsv``, without each query's own document with ``ignore_identical_ids``."""
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        raise ValueError(f"unknown task families {unknown}; choose from {', '.join(FAMILIES)}")
    if clustering_max_texts is not None and "clustering" not in families:
        raise ValueError("--clustering-max-texts only applies to clustering tasks (eval clustering or eval all)")
    if kmeans_inits is not None and "clustering" not in families:
        raise ValueError("--kmeans-inits only applies to clustering tasks (eval clustering or eval all)")
    if check_sts_source(sts_source) != "mteb" and "sts" not in families:
        raise ValueError("--sts-source only applies to STS tasks (eval sts or eval all)")
    if split not in SPLITS:
        raise ValueError(f"--split must be one of {', '.join(SPLITS)}; got {split!r}")
    if split != "test" and RETRIEVAL not in families:
        raise ValueError("--split only applies to retrieval datasets (eval retrieval or eval all)")
    if ignore_identical_ids and RETRIEVAL not in families:
        raise ValueError("--ignore-identical-ids only applies to retrieval datasets (eval retrieval or eval all)")
    tasks = {**DEFAULT_TASKS, **(tasks or {})}
    evaluators = []
    for family in families:
        if family == "sts":
            evaluators.append(STSEvaluator.from_data_dir(data_dir, tasks["sts"], missing_ok, sts_source))
        elif family == "clustering":
            seeds = tuple(range(clustering_seeds))
            evaluators.append(
                ClusteringEvaluator.from_data_dir(
                    data_dir,
                    tasks["clustering"],
                    missing_ok,
                    seeds,
                    clustering_max_texts,
                    KMEANS_INITS if kmeans_inits is None else kmeans_inits,
                )
            )
        elif family == "intent":
            evaluators.append(IntentEvaluator.from_data_dir(data_dir, tasks["intent"], missing_ok, protocol))
        elif retrieval_dirs:
            evaluators.append(
                RetrievalEvaluator.from_dirs(retrieval_dirs, split, ignore_identical_ids=ignore_identical_ids)
            )
        else:
            evaluators.append(
                RetrievalEvaluator.from_data_dir(
                    data_dir, tasks[RETRIEVAL], missing_ok, split, ignore_identical_ids=ignore_identical_ids
                )
            )
    return evaluators


def role_prompts(spec: ModelSpec, prompt: str | None = None) -> dict[str, str]:
    """The text put before each role's texts: ``query`` and ``document``, the model's prompts of
    those names (else none); ``other``, the model's prompt named ``prompt`` (else none)."""
    return {
        QUERY: spec.prompts.get(QUERY, ""),
        DOCUMENT: spec.prompts.get(DOCUMENT, ""),
        OTHER: spec.prompt_text(prompt),
    }


def _texts_by_role(evaluator) -> dict[str, set[str]]:
    """What ``evaluator`` embeds, by role: retrieval's queries and documents, or texts of no role."""
    if isinstance(evaluator, RetrievalEvaluator):
        return {QUERY: evaluator.query_texts(), DOCUMENT: evaluator.document_texts()}
    return {OTHER: evaluator.texts()}


def _score(evaluator, by_role: dict[str, TextEmbeddings]) -> list:
    """``evaluator``'s results on the embeddings of its roles (:func:`_texts_by_role`)."""
    if isinstance(evaluator, RetrievalEvaluator):
        return evaluator.evaluate(by_role[QUERY], by_role[DOCUMENT])
    return evaluator.evaluate(by_role[OTHER])


def evaluate_model(embedder: Embedder, evaluators: Sequence, prompt: str | None = None) -> ModelReport:
    """Embed the union of the evaluators' texts once per prompt, then score each evaluator on it.
    ``prompt``: the name of one of the model's prompts, put before every text of the symmetric
    families (none by default); retrieval's queries and documents get the model's query and
    document prompts (:func:`role_prompts`)."""
    prompts = role_prompts(embedder.spec, prompt)
    started = time.perf_counter()
    per_family = {evaluator.family: evaluator.texts() for evaluator in evaluators}
    if len(per_family) > 1:  # where the encoding time goes; families share some texts
        counts = ", ".join(f"{family} {len(family_texts):,}" for family, family_texts in per_family.items())
        logger.info("distinct texts per family: %s; %s in all", counts, f"{len(set().union(*per_family.values())):,}")
    by_prompt: dict[str, set[str]] = {}  # prompt text -> the texts embedded after it
    for evaluator in evaluators:
        for role, texts in _texts_by_role(evaluator).items():
            by_prompt.setdefault(prompts[role], set()).update(texts)
    embedded = {text: embedder.embed(texts, text) for text, texts in by_prompt.items()}
    by_role = {role: embedded[text] for role, text in prompts.items() if text in embedded}
    seconds = {"embed": time.perf_counter() - started}
    results = []
    for evaluator in evaluators:
        began = time.perf_counter()
        try:
            results += _score(evaluator, by_role)
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
        model["prompt"] = prompt  # the prompt every text of the symmetric families was embedded after
    if embedder.truncate_dim is not None:
        model["truncate_dim"] = embedder.truncate_dim  # every embedding scored was cut to this many dimensions
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
    truncate_dim: int | None = None,
) -> EvalReport:
    """Every model scored by every evaluator. ``truncate_dim``: score the first m dimensions of
    each embedding (:class:`vascl_scale.encode.Embedder`), recorded in the report's model record."""
    for spec in specs:  # an unknown prompt name or a too large truncate_dim fails before any model is loaded
        spec.prompt_text(prompt)
        check_truncate_dim(spec, truncate_dim)
    models = []
    for spec in specs:
        embedder = Embedder(
            spec,
            batch_size=batch_size,
            cache_dir=cache_dir,
            device=device,
            precision=precision,
            truncate_dim=truncate_dim,
        )
        models.append(evaluate_model(embedder, evaluators, prompt))
    return EvalReport(models, str(data_dir))

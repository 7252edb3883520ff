"""``eval mteb``: MTEB tasks scored by the mteb library on the project's own embeddings.

mteb calls :class:`ProjectEncoder`, its encoder protocol over :class:`Embedder`, so a task sees
the embeddings ``eval sts`` scores (pooling, normalisation, maximum length, precision); mteb's
own evaluators score them. mteb keeps every task's result in its result cache under a model name
and revision and returns them instead of evaluating again; here the name is the run (or model
directory) and the revision the step with the fingerprint of the weights and of everything else
that decides the embeddings (:func:`vascl_scale.encode.embedding_fingerprint`), so another
checkpoint, or the same one under another pooling, length, precision or prompts, is never given
cached scores.

Prompts: mteb names each encode call's role (``prompt_type``: query or document, in retrieval
and reranking tasks; none in symmetric tasks such as STS or clustering). A query gets the
model's ``query`` prompt and a document its ``document`` prompt (config_sentence_transformers.json,
as a training export with ``model.prompts`` writes them), where the model has them; a call
without a role gets no prompt unless ``--prompt NAME`` names one (:func:`mteb_prompts`).

Needs the ``mteb`` extra (``pip install 'vascl-scale[mteb]'``); this module imports mteb.
Written against mteb 2.x: ``mteb.evaluate`` and the ``EncoderProtocol`` of
``mteb.models.models_protocols``.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mteb
import numpy as np
from mteb.abstasks import AbsTask
from mteb.models import ModelMeta
from mteb.models.abs_encoder import AbsEncoder

from vascl_scale.encode import Embedder, ModelSpec, embedding_fingerprint, embedding_width
from vascl_scale.eval.report import ModelReport, short_label
from vascl_scale.eval.results import MTEB_FAMILY, TaskResult
from vascl_scale.log import LoopProgress
from vascl_scale.model_card import export_step
from vascl_scale.sentence_transformers_format import DOCUMENT, QUERY

logger = logging.getLogger(__name__)

# What mteb's model names and revisions may hold here: they become folder names of its cache.
_UNSAFE = re.compile(r"[^A-Za-z0-9._/-]+")
OTHER = "other"  # the role of an encode call mteb gives no prompt type (symmetric tasks)


def resolve_tasks(names: Sequence[str], benchmark: str | None) -> list[AbsTask]:
    """The mteb tasks of ``--task`` names (repeatable) or of one ``--benchmark``, never both."""
    if bool(names) == bool(benchmark):
        given = "both --task and --benchmark" if names else "neither --task nor --benchmark"
        raise ValueError(
            f"eval mteb got {given}; give --task NAME (repeatable) or --benchmark NAME, e.g. --benchmark 'MTEB(eng, v2)'"
        )
    if benchmark:
        try:
            return list(mteb.get_benchmark(benchmark).tasks)
        except KeyError as err:
            raise ValueError(f"--benchmark {benchmark!r}: {_mteb_key_error(err)}") from None
    tasks = []
    for name in dict.fromkeys(names):
        try:
            tasks.append(mteb.get_task(name))
        except KeyError as err:
            raise ValueError(
                f"--task {name!r}: {_mteb_key_error(err)} (mteb's task names, e.g. STSBenchmark, SICK-R)"
            ) from None
    return tasks


# What mteb's error holds when a task's data is neither in the local caches nor reachable on the
# Hugging Face Hub (huggingface_hub's and datasets' messages).
_UNREACHABLE = ("OfflineModeIsEnabled", "Couldn't reach", "LocalEntryNotFoundError", "ConnectionError", "offline mode")


def is_offline_error(error: str) -> bool:
    """Whether mteb's ``error`` for a task says its data could not be had from the Hub."""
    return any(marker in error for marker in _UNREACHABLE)


def offline_data_hint(task_names: Sequence[str]) -> str:
    """Where mteb's data must be for a machine without the Hub, and how to put it there."""
    import datasets.config
    import huggingface_hub.constants

    names = " ".join(f"--task {name}" for name in task_names)
    return (
        "mteb reads each task's data from the Hugging Face Hub through datasets; without the Hub it must be in "
        f"their caches already: the Hub cache {huggingface_hub.constants.HF_HUB_CACHE} (HF_HUB_CACHE) and datasets' "
        f"cache {datasets.config.HF_DATASETS_CACHE} (HF_DATASETS_CACHE; by default both lie under HF_HOME). Fill them by running the "
        f"same command ({names}) on a machine that reaches the Hub, copy both folders to the same places here (or "
        "point HF_HOME at the copy), and run with HF_HUB_OFFLINE=1"
    )


def _mteb_key_error(err: KeyError) -> str:
    """mteb's message for an unknown name ("KeyError: 'X' not found. Did you mean: 'Y'?")."""
    return str(err.args[0]).removeprefix("KeyError: ")


def mteb_prompts(spec: ModelSpec, prompt: str | None = None) -> dict[str, str]:
    """The prompt text of each role of an encode call: ``query`` and ``document`` (the model's
    prompts of those names, else none) and ``other`` (the model's prompt named ``prompt``, else
    none); a ValueError when the model has no prompt named ``prompt``."""
    return {
        QUERY: spec.prompts.get(QUERY, ""),
        DOCUMENT: spec.prompts.get(DOCUMENT, ""),
        OTHER: spec.prompt_text(prompt),
    }


def model_identity(
    spec: ModelSpec, precision: str, prompts: dict[str, str] | None = None
) -> tuple[str, str, int | None]:
    """(name, revision, step) under which mteb caches this model's results.

    name: ``vascl-scale/<run>/<best or final>`` for a training run's export (``.../lora`` for its
    adapter), else
    ``vascl-scale/`` and the last two parts of the model as given (a directory, ``package:`` or
    a hub id); revision: ``step-<N>-<fingerprint>`` for an export, whose model card records the
    step of its weights (:func:`vascl_scale.model_card.export_step`), else the fingerprint alone.
    The fingerprint covers the ``prompts`` used (:func:`mteb_prompts`); without any it is the
    embedding cache's.
    """
    export = spec.adapter.parent if spec.adapter is not None else spec.directory  # <export>/lora/: the export's step
    step = export_step(export)
    label = short_label(str(export) if step is not None else spec.name)
    if step is not None and spec.adapter is not None:
        label += "/" + spec.adapter.name  # run/final/lora: the adapter over its base, apart from the merged run/final
    fingerprint = embedding_fingerprint(spec, precision, prompts)
    revision = fingerprint if step is None else f"step-{step}-{fingerprint}"
    return "vascl-scale/" + _UNSAFE.sub("_", label), revision, step


def model_meta(spec: ModelSpec, name: str, revision: str, prompts: dict[str, str] | None = None) -> ModelMeta:
    """What mteb records of the model: its name and revision (the cache's keys), width, maximum
    length, cosine similarity and whether it embeds with prompts; nothing the project does not
    know is claimed."""
    return ModelMeta(
        loader=None,
        name=name,
        revision=revision,
        release_date=None,
        languages=None,
        n_parameters=None,
        memory_usage_mb=None,
        max_tokens=spec.max_length,
        embed_dim=embedding_width(spec),
        license=None,
        open_weights=True,
        public_training_code=None,
        public_training_data=None,
        framework=["PyTorch", "Transformers"],
        similarity_fn_name="cosine",
        use_instructions=any((prompts or {}).values()),
        training_datasets=None,
    )


class ProjectEncoder(AbsEncoder):
    """mteb's encoder protocol over the project's :class:`Embedder`. ``prompts``
    (:func:`mteb_prompts`) is put before the texts of each call by its role: the model's query
    and document prompts for queries and documents, the ``other`` one (none by default) for a
    call without a prompt type; mteb's own task instructions are not used. Similarity is the
    cosine (``similarity_fn_name`` of the metadata), as ``eval sts`` scores."""

    def __init__(self, embedder: Embedder, meta: ModelMeta, prompts: dict[str, str] | None = None) -> None:
        self.embedder = embedder
        self.mteb_model_meta = meta
        self.prompts = dict(prompts or {})

    def prompt_for(self, prompt_type: Any) -> str:
        """The prompt text of an encode call whose role is ``prompt_type`` (mteb's PromptType or None)."""
        role = OTHER if prompt_type is None else str(getattr(prompt_type, "value", prompt_type))
        return self.prompts.get(role, "")

    def encode(
        self, inputs, *, task_metadata, hf_split: str, hf_subset: str, prompt_type=None, **kwargs: Any
    ) -> np.ndarray:
        """(N, d) float32 embeddings of the ``text`` of every batch of ``inputs``, in their order."""
        texts = [text for batch in inputs for text in batch["text"]]
        return self.embedder.embed(texts, self.prompt_for(prompt_type))(texts)


def _json_numbers(value: Any) -> Any:
    """mteb's scores with NaN and inf as None: JSON holds neither (a constant encoder gives NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _json_numbers(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_json_numbers(item) for item in value]
    return value


def evaluate_with_mteb(
    spec: ModelSpec,
    tasks: Sequence[AbsTask],
    batch_size: int = 64,
    device: str | None = None,
    precision: str = "no",
    results_cache: Path | None = None,
    use_cache: bool = True,
    benchmark: str | None = None,
    prompt: str | None = None,
) -> ModelReport:
    """Score ``tasks`` with mteb on ``spec``'s embeddings, one task after another.

    Queries and documents get the model's query and document prompts; the texts of calls
    without a role (symmetric tasks) get the model's prompt named ``prompt``, or none.

    ``results_cache``: mteb's result cache folder (None: mteb's default, ``$MTEB_CACHE`` or
    ``~/.cache/mteb``); ``use_cache=False`` evaluates every task and stores nothing there. A task
    that raises (its data cannot be loaded, say) is reported ``failed`` with mteb's error, and
    the others still run. The primary metric is the task's main score (mteb's mean over its
    evaluation splits and subsets) x 100, as the project reports every score.
    """
    embedder = Embedder(
        spec, batch_size=batch_size, cache_dir=None, device=device, precision=precision, allow_blank=True
    )
    prompts = mteb_prompts(spec, prompt)
    name, revision, step = model_identity(spec, embedder.stats.precision, prompts)
    encoder = ProjectEncoder(embedder, model_meta(spec, name, revision, prompts), prompts)
    cache = (
        (mteb.ResultCache(results_cache) if results_cache is not None else mteb.ResultCache()) if use_cache else None
    )
    logger.info(
        "%s: mteb model %s, revision %s%s", spec.name, name, revision, "" if step is not None else " (step unknown)"
    )
    used = {role: text for role, text in prompts.items() if text}
    if used:
        logger.info("%s: prompts by role: %s", spec.name, ", ".join(f"{role} {text!r}" for role, text in used.items()))
    results, seconds = [], {}
    started = time.perf_counter()
    with LoopProgress("mteb tasks", len(tasks), "tasks") as progress:
        for done, task in enumerate(tasks, start=1):
            task_name, main_score = task.metadata.name, task.metadata.main_score
            texts_before, began = embedder.stats.distinct_texts, time.perf_counter()
            outcome = mteb.evaluate(
                encoder,
                task,
                cache=cache,
                raise_error=False,
                co2_tracker=False,
                show_progress_bar=False,
                encode_kwargs={"batch_size": batch_size, "show_progress_bar": False},
            )
            seconds[task_name] = time.perf_counter() - began
            if outcome.exceptions:
                error = "; ".join(failure.exception for failure in outcome.exceptions)
                logger.error("%s failed: %s", task_name, error)
                results.append(
                    TaskResult(MTEB_FAMILY, task_name, main_score, None, status="failed", details={"error": error})
                )
            else:
                [scored] = outcome.task_results
                value = 100.0 * float(scored.get_score())
                cached = embedder.stats.distinct_texts == texts_before  # mteb embedded nothing: its cache answered
                details = {
                    "type": task.metadata.type,
                    "dataset_revision": scored.dataset_revision,
                    "from_mteb_cache": cached,
                    "scores": _json_numbers(scored.model_dump(mode="json")["scores"]),
                }
                if math.isfinite(value):
                    results.append(TaskResult(MTEB_FAMILY, task_name, main_score, value, details=details))
                    logger.info(
                        "%s: %s %.2f%s", task_name, main_score, value, " (from mteb's result cache)" if cached else ""
                    )
                else:
                    error = f"mteb's main score {main_score} is not a number: the encoder maps these texts to one vector? check its weights"
                    logger.error("%s failed: %s", task_name, error)
                    results.append(
                        TaskResult(
                            MTEB_FAMILY,
                            task_name,
                            main_score,
                            None,
                            status="failed",
                            details={**details, "error": error},
                        )
                    )
            progress.update(done)
    seconds["total"] = time.perf_counter() - started
    model = {
        **spec.describe(),
        **({"prompt": prompt} if prompt is not None else {}),
        "mteb": {"name": name, "revision": revision, "step": step, "version": mteb.__version__, "benchmark": benchmark},
    }
    return ModelReport(model, embedder.stats.to_json(), seconds, results)

"""``vascl-scale eval ...``: STS, clustering, few-shot intent and retrieval on saved checkpoints."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import typer

from vascl_scale.cli_options import (
    BATCH,
    CACHE,
    DEVICE,
    MAX_LENGTH,
    NO_CACHE,
    POOLING,
    PRECISION,
    PROMPT,
    embedding_cache,
)
from vascl_scale.data.augment import DEFAULT_WORDNET
from vascl_scale.log import fail, print_table

logger = logging.getLogger(__name__)

app = typer.Typer(
    help="Evaluate checkpoints: STS, short text clustering, few-shot intent, retrieval; MTEB through the mteb library.",
    no_args_is_help=True,
)

MODEL = typer.Option(..., "--model", help="Run dir (best/, else final/), HF or sentence-transformers dir; repeatable.")
DATA_DIR = typer.Option(
    None, "--data-dir", help="Evaluation data directory (docs/data.md; `data download` fills one); default $VASCL_DATA."
)
OUTPUT = typer.Option(
    None,
    "--output",
    help="JSON with every score, per task, subset and seed; default: <run dir>/eval-<command>.json for one training "
    "run directory, else eval-results/<command>.json.",
)
MARKDOWN = typer.Option(None, "--markdown", help="Markdown tables; default: the --output path with .md.")
STS_SOURCE = typer.Option(
    "mteb",
    "--sts-source",
    help="STS copies to score: mteb (the releases as published, as MTEB scores them) or senteval (SentEval's "
    "tokenised, lower-cased copies under sts_senteval/, as SentEval-based papers did; SICK-R stays untokenised).",
)
TASK = typer.Option(None, "--task", help="Run only these tasks (repeatable), e.g. --task stsb --task sickr-full.")
SHOTS = typer.Option(None, "--shots", min=1, help="Few-shot sizes K of the intent tasks (repeatable); default 5 10 20.")
FIGURE_JSON = typer.Option(None, "--output", help="The numbers as JSON; default: the --plot path with .json.")
TRUNCATE_DIM = typer.Option(
    None,
    "--truncate-dim",
    min=1,
    help="Score the first M dimensions of every embedding (Matryoshka), re-normalised where the model normalises "
    "(retrieval scores cosines); recorded in the JSON. Default: all.",
)
SPLIT = typer.Option(
    "test", "--split", help="Retrieval: the qrels scored, qrels/<split>.tsv of each dataset: test, dev or train."
)
IGNORE_IDENTICAL_IDS = typer.Option(
    False,
    "--ignore-identical-ids",
    help="Retrieval: leave out of each query's ranking the document with the query's own id, as MTEB does for "
    "ArguAna and Quora (a query that is also in the corpus).",
)
CLUSTERING_MAX_TEXTS = typer.Option(
    None,
    "--clustering-max-texts",
    min=1,
    help="Cluster a fixed stratified subsample of N texts per dataset (quick ablations; default: all).",
)
KMEANS_INITS = typer.Option(
    None,
    "--kmeans-inits",
    min=1,
    help="k-means++ inits per clustering seed, the one of least inertia scored (scikit-learn's n_init); default 10, "
    "as the authors' code ran; 1 was this tool's protocol before.",
)


def _tasks_by_family(tasks: list[str] | None, families: list[str], data: Path) -> dict[str, list[str]] | None:
    """Route ``--task`` names to their families; every name must belong to one of ``families``
    (retrieval's: the datasets under ``<data>/retrieval/``)."""
    if not tasks:
        return None
    from vascl_scale.eval.clustering import CLUSTERING_TASKS
    from vascl_scale.eval.intent import INTENT_TASKS
    from vascl_scale.eval.retrieval import RETRIEVAL, dataset_name, retrieval_datasets
    from vascl_scale.eval.sts import STS_TASKS

    known = {
        "sts": tuple(STS_TASKS),
        "clustering": CLUSTERING_TASKS,
        "intent": INTENT_TASKS,
        RETRIEVAL: tuple(dataset_name(path) for path in retrieval_datasets(data)),
    }
    routed = {family: [t for t in tasks if t in known[family]] for family in families}
    unknown = [t for t in tasks if not any(t in routed[f] for f in families)]
    if unknown:
        choices = ", ".join(t for f in families for t in known[f])
        raise ValueError(f"unknown task(s) {unknown} for eval {'/'.join(families)}; choose from {choices}")
    return {family: names for family, names in routed.items() if names}


def default_output(models: list[Path], command: str) -> Path:
    """Where ``eval <command>`` writes without ``--output``: inside the one training run it
    evaluated (beside its best/ and final/), else ``eval-results/<command>.json`` here."""
    if len(models) == 1 and any((Path(models[0]) / name).is_dir() for name in ("best", "final")):
        return Path(models[0]) / f"eval-{command}.json"
    return Path("eval-results") / f"{command}.json"


def _run(
    command: str,
    families: list[str],
    models: list[Path],
    data_dir: Path | None,
    output: Path | None,
    markdown_path: Path | None,
    tasks: list[str] | None,
    batch_size: int,
    max_length: int | None,
    pooling: str | None,
    device: str | None,
    cache_dir: Path | None,
    no_cache: bool,
    missing_ok: bool,
    clustering_max_texts: int | None,
    precision: str,
    sts_source: str,
    shots: list[int] | None,
    prompt: str | None = None,
    truncate_dim: int | None = None,
    split: str = "test",
    retrieval_dirs: list[Path] | None = None,
    ignore_identical_ids: bool = False,
    kmeans_inits: int | None = None,
) -> None:
    """One ``eval`` command: check every option, load the data, then embed and score each model.
    ``retrieval_dirs`` (``eval retrieval --data``): BEIR directories scored instead of the data
    directory's ``retrieval/`` datasets."""
    from vascl_scale.encode import check_truncate_dim, resolve_device, resolve_model
    from vascl_scale.eval.intent import FewShotProtocol
    from vascl_scale.eval.runner import build_evaluators, resolve_data_dir, run_evaluation
    from vascl_scale.paths import check_output_file

    started = time.perf_counter()
    try:
        device = resolve_device(device)
        output = check_output_file(output or default_output(models, command), "--output")
        markdown_path = check_output_file(markdown_path or output.with_suffix(".md"), "--markdown")
        cache = embedding_cache(cache_dir, no_cache)
        if retrieval_dirs and data_dir is not None:
            raise ValueError("--data and --data-dir exclude each other: --data names the datasets themselves")
        data = Path() if retrieval_dirs else resolve_data_dir(data_dir)
        routed = _tasks_by_family(tasks, families, data)
        if routed is not None:
            families = [family for family in families if family in routed]
        if shots and "intent" not in families:
            raise ValueError("--shots only applies to intent tasks (eval intent or eval all)")
        protocol = FewShotProtocol(shots=tuple(sorted(set(shots)))) if shots else FewShotProtocol()
        specs = [resolve_model(path, pooling, max_length) for path in models]
        for spec in specs:  # an unknown prompt name or a too large --truncate-dim fails before any data is loaded
            spec.prompt_text(prompt)
            check_truncate_dim(spec, truncate_dim)
        evaluators = build_evaluators(
            data,
            families,
            routed,
            missing_ok=missing_ok,
            protocol=protocol,
            clustering_max_texts=clustering_max_texts,
            kmeans_inits=kmeans_inits,
            sts_source=sts_source,
            split=split,
            retrieval_dirs=retrieval_dirs,
            ignore_identical_ids=ignore_identical_ids,
        )
        where = ", ".join(map(str, retrieval_dirs)) if retrieval_dirs else data
        report = run_evaluation(
            specs, evaluators, where, batch_size, cache, device, precision, prompt, truncate_dim=truncate_dim
        )
    except ValueError as err:
        fail(err)
    _show_and_write(report, output, markdown_path)
    _refresh_model_cards(report, command, output)
    wall = time.perf_counter() - started
    for model in report.models:
        encode = model.embedding["encode_seconds"]
        ratio = f", {wall / encode:.2f}x the encoding time" if encode > 0 else ""
        logger.info(
            "%s: %d distinct texts (%d encoded in %.1f s in %s, %d from cache)%s",
            model.label,
            model.embedding["distinct_texts"],
            model.embedding["encoded"],
            encode,
            model.precision,
            model.embedding["from_cache"],
            ratio if len(report.models) == 1 else "",
        )
    logger.info("wrote %s and %s; wall time %.1f s", output, markdown_path, wall)


def _show_and_write(report, output: Path, markdown_path: Path) -> None:
    """The report's tables on the terminal, its JSON at ``output`` and its Markdown at
    ``markdown_path``; exit status 1 with one line when a file cannot be written (a full disk)."""
    from vascl_scale.eval.report import markdown, rich_tables, write_output

    for table in rich_tables(report):
        print_table(table)
    try:
        report.save(output)
        write_output(markdown_path, markdown(report))
    except ValueError as err:
        fail(err, status=1)


def _write_record(output: Path, record: dict) -> None:
    """A figure command's numbers as JSON at ``output``; exit status 1 with one line when it cannot be written."""
    from vascl_scale.eval.report import write_json

    try:
        logger.info("wrote %s", write_json(output, record))
    except ValueError as err:
        fail(err, status=1)


def _refresh_model_cards(report, command: str, output: Path) -> None:
    """Add the results to the model card of each evaluated export of a training run whose run
    directory holds the results file (``<run>/eval-<command>.json``, where results of one run go
    by default); results written elsewhere (``--output``) leave the cards as they are."""
    from vascl_scale.model_card import CARD_FILE, attach_evaluation

    for model in report.models:
        directory = Path(model.model["directory"])
        if output.resolve().parent == directory.resolve().parent and attach_evaluation(
            directory, command, model.to_json(), report.created
        ):
            logger.info("added the results to the model card %s", directory / CARD_FILE)


def _family_command(name: str, families: list[str], missing_ok: bool, doc: str):
    """One ``eval`` sub-command over ``families``; all four share their options (``eval
    retrieval`` has its own: it can take the datasets themselves)."""

    def command(
        model: list[Path] = MODEL,
        data_dir: Path | None = DATA_DIR,
        output: Path | None = OUTPUT,
        markdown_path: Path | None = MARKDOWN,
        task: list[str] | None = TASK,
        batch_size: int = BATCH,
        max_length: int | None = MAX_LENGTH,
        pooling: str | None = POOLING,
        device: str | None = DEVICE,
        cache_dir: Path | None = CACHE,
        no_cache: bool = NO_CACHE,
        clustering_max_texts: int | None = CLUSTERING_MAX_TEXTS,
        kmeans_inits: int | None = KMEANS_INITS,
        precision: str = PRECISION,
        sts_source: str = STS_SOURCE,
        shots: list[int] | None = SHOTS,
        prompt: str | None = PROMPT,
        truncate_dim: int | None = TRUNCATE_DIM,
        split: str = SPLIT,
        ignore_identical_ids: bool = IGNORE_IDENTICAL_IDS,
    ) -> None:
        _run(
            name,
            families,
            model,
            data_dir,
            output,
            markdown_path,
            task,
            batch_size,
            max_length,
            pooling,
            device,
            cache_dir,
            no_cache,
            missing_ok,
            clustering_max_texts,
            precision,
            sts_source,
            shots,
            prompt,
            truncate_dim=truncate_dim,
            split=split,
            ignore_identical_ids=ignore_identical_ids,
            kmeans_inits=kmeans_inits,
        )

    command.__doc__ = doc
    return command


for _name, _families, _missing_ok, _doc in (
    ("sts", ["sts"], False, "STS12-16, STS-B, SICK-R (extra tasks: sickr-full, stsb-dev): Spearman x 100 of cosine."),
    (
        "clustering",
        ["clustering"],
        False,
        "Short text clustering: KMeans (10 seeds, each the best of 10 inits), Hungarian accuracy and NMI.",
    ),
    (
        "intent",
        ["intent"],
        False,
        "Few-shot intent (5/10/20 shots, 5 splits): linear softmax probe on frozen embeddings.",
    ),
    (
        "all",
        ["sts", "clustering", "intent", "retrieval"],
        True,
        "STS, clustering, intent and (the BEIR datasets under <data-dir>/retrieval/) retrieval on one encoding pass; "
        "a missing dataset is skipped and marked missing.",
    ),
):
    app.command(_name)(_family_command(_name, _families, _missing_ok, _doc))


@app.command("retrieval")
def retrieval_command(
    model: list[Path] = MODEL,
    data: list[Path] | None = typer.Option(
        None,
        "--data",
        help="A BEIR directory: corpus.jsonl, queries.jsonl, qrels/<split>.tsv (repeatable); default: every folder "
        "under <data-dir>/retrieval/.",
    ),
    data_dir: Path | None = DATA_DIR,
    split: str = SPLIT,
    output: Path | None = OUTPUT,
    markdown_path: Path | None = MARKDOWN,
    batch_size: int = BATCH,
    max_length: int | None = MAX_LENGTH,
    pooling: str | None = POOLING,
    device: str | None = DEVICE,
    cache_dir: Path | None = CACHE,
    no_cache: bool = NO_CACHE,
    precision: str = PRECISION,
    truncate_dim: int | None = TRUNCATE_DIM,
    ignore_identical_ids: bool = IGNORE_IDENTICAL_IDS,
) -> None:
    """Retrieval on BEIR-format datasets: exact cosine search, nDCG@10 (primary), MRR@10, Recall@100 x 100.
    Queries get the model's query prompt, documents its document prompt, where it has them."""
    _run(
        "retrieval",
        ["retrieval"],
        model,
        data_dir,
        output,
        markdown_path,
        None,
        batch_size,
        max_length,
        pooling,
        device,
        cache_dir,
        no_cache,
        False,
        None,
        precision,
        "mteb",
        None,
        truncate_dim=truncate_dim,
        split=split,
        retrieval_dirs=data,
        ignore_identical_ids=ignore_identical_ids,
    )


MTEB_EXTRA = "pip install 'vascl-scale[mteb]'"


def _mteb_runner():
    """:mod:`vascl_scale.eval.mteb_runner`, or a ValueError saying how to install mteb: the
    library is an optional extra, imported only when ``eval mteb`` runs (never for --help)."""
    try:
        import mteb  # noqa: F401
    except ImportError as err:
        raise ValueError(
            f"eval mteb needs the mteb library, which is not installed ({err}); install the extra: {MTEB_EXTRA}"
        ) from None
    from vascl_scale.eval import mteb_runner

    return mteb_runner


@app.command("mteb")
def mteb_command(
    model: list[Path] = MODEL,
    task: list[str] | None = typer.Option(
        None, "--task", help="An mteb task by its mteb name (repeatable), e.g. --task STSBenchmark --task SICK-R."
    ),
    benchmark: str | None = typer.Option(
        None,
        "--benchmark",
        help="All tasks of an mteb benchmark, e.g. 'MTEB(eng, v2)' (41 tasks; a GPU job: docs/evaluation.md).",
    ),
    output: Path | None = OUTPUT,
    markdown_path: Path | None = MARKDOWN,
    batch_size: int = BATCH,
    max_length: int | None = MAX_LENGTH,
    pooling: str | None = POOLING,
    device: str | None = DEVICE,
    precision: str = PRECISION,
    mteb_cache: Path | None = typer.Option(
        None,
        "--mteb-cache",
        help="mteb's result cache, where finished tasks are kept and found again; default $MTEB_CACHE or ~/.cache/mteb.",
    ),
    no_cache: bool = typer.Option(
        False, "--no-cache", help="Evaluate every task afresh and store nothing in mteb's result cache."
    ),
    prompt: str | None = typer.Option(
        None,
        "--prompt",
        help="Put the model's prompt of this name (e.g. query) before the texts mteb asks for without a query or "
        "document role (symmetric tasks: STS, clustering, classification); queries and documents always get the "
        "model's query and document prompts, where it has them. Default: none.",
    ),
) -> None:
    """MTEB tasks scored by mteb's own evaluators on this project's embeddings (as eval sts embeds).
    Needs the mteb extra: pip install 'vascl-scale\\[mteb]'. Datasets come from the Hugging Face hub
    (its cache; HF_HUB_OFFLINE=1 uses the cache alone)."""
    from vascl_scale.encode import resolve_device, resolve_model
    from vascl_scale.eval.report import EvalReport
    from vascl_scale.paths import check_output_dir, check_output_file

    started = time.perf_counter()
    try:
        runner = _mteb_runner()
        device = resolve_device(device)
        output = check_output_file(output or default_output(model, "mteb"), "--output")
        markdown_path = check_output_file(markdown_path or output.with_suffix(".md"), "--markdown")
        if mteb_cache is not None and no_cache:
            raise ValueError("--mteb-cache and --no-cache exclude each other; give one")
        cache = check_output_dir(mteb_cache, "--mteb-cache") if mteb_cache is not None else None
        tasks = runner.resolve_tasks(task or [], benchmark)
        specs = [resolve_model(path, pooling, max_length) for path in model]
        for spec in specs:  # an unknown prompt name fails before any model is loaded
            spec.prompt_text(prompt)
        reports = [
            runner.evaluate_with_mteb(
                spec, tasks, batch_size, device, precision, cache, not no_cache, benchmark, prompt=prompt
            )
            for spec in specs
        ]
    except ValueError as err:
        fail(err)
    report = EvalReport(reports)
    _show_and_write(report, output, markdown_path)
    logger.info("wrote %s and %s; wall time %.1f s", output, markdown_path, time.perf_counter() - started)
    failed = {r.task: r.details["error"] for m in reports for r in m.results if r.status == "failed"}
    if failed:
        logger.error("%d task(s) failed (their errors are in %s too):", len(failed), output)
        for task_name, error in sorted(failed.items()):
            logger.error("  %s: %s", task_name, " ".join(error.split()))  # mteb's message, on one line
        if any(runner.is_offline_error(error) for error in failed.values()):
            logger.error("%s", runner.offline_data_hint(sorted(failed)))
        raise typer.Exit(1)


@app.command("neighbours")
def neighbours(
    model: list[Path] = MODEL,
    dataset: str = typer.Option("stackoverflow", "--dataset", help="A clustering dataset (text, label)."),
    k: list[int] | None = typer.Option(None, "--k", help="Neighbourhood sizes; default 1 5 10 20 50 100."),
    data_dir: Path | None = DATA_DIR,
    plot: Path | None = typer.Option(
        None,
        "--plot",
        help="PNG path; default <run dir>/eval-neighbours-<dataset>.png for one training run, else eval-results/neighbours-<dataset>.png.",
    ),
    output: Path | None = FIGURE_JSON,
    batch_size: int = BATCH,
    max_length: int | None = MAX_LENGTH,
    pooling: str | None = POOLING,
    device: str | None = DEVICE,
    cache_dir: Path | None = CACHE,
    no_cache: bool = NO_CACHE,
) -> None:
    """Figure 2a: same-class share of top-K neighbours and their distance; alignment and
    uniformity on STS-B dev (positives: gold >= 4)."""
    from rich.table import Table

    from vascl_scale.encode import Embedder, resolve_device, resolve_model
    from vascl_scale.eval.clustering import CLUSTERING_TASKS, load_labelled_texts
    from vascl_scale.eval.neighbours import NEIGHBOUR_KS, alignment_uniformity, neighbour_statistics, plot_neighbours
    from vascl_scale.eval.report import short_label
    from vascl_scale.eval.runner import resolve_data_dir
    from vascl_scale.eval.sts import default_stsb_dev_path, load_sts_tsv
    from vascl_scale.paths import check_output_file

    try:
        if dataset not in CLUSTERING_TASKS:
            raise ValueError(f"unknown dataset {dataset!r}; choose from {', '.join(CLUSTERING_TASKS)}")
        device = resolve_device(device)
        plot = check_output_file(plot or default_output(model, f"neighbours-{dataset}").with_suffix(".png"), "--plot")
        output = check_output_file(output or plot.with_suffix(".json"), "--output")
        cache = embedding_cache(cache_dir, no_cache)
        data = resolve_data_dir(data_dir)
        texts, labels = load_labelled_texts(data / "clustering" / f"{dataset}.tsv")
        pairs = load_sts_tsv(default_stsb_dev_path(data))
        ks = tuple(k or NEIGHBOUR_KS)
        statistics, geometry = {}, {}
        for path in model:
            spec = resolve_model(path, pooling, max_length)
            embedder = Embedder(spec, batch_size=batch_size, cache_dir=cache, device=device)
            embeddings = embedder.embed(texts + [t for p in pairs for t in (p.sentence1, p.sentence2)])
            statistics[short_label(spec.name)] = neighbour_statistics(embeddings(texts), labels, ks)
            geometry[short_label(spec.name)] = alignment_uniformity(embeddings, pairs)
    except ValueError as err:
        fail(err)
    table = Table(title=f"Top-K neighbours on {dataset}: same-class share (%) / mean distance", title_justify="left")
    table.add_column("Model")
    for size in ks:
        table.add_column(f"K={size}", justify="right")
    table.add_column("align", justify="right")
    table.add_column("uniform", justify="right")
    for name, by_k in statistics.items():
        cells = [f"{by_k[size]['same_class']:.1f} / {by_k[size]['distance']:.3f}" for size in ks]
        table.add_row(name, *cells, f"{geometry[name]['alignment']:.3f}", f"{geometry[name]['uniformity']:.3f}")
    print_table(table)
    logger.info("wrote %s", plot_neighbours(statistics, plot, dataset))
    record = {"dataset": dataset, "neighbours": statistics, "stsb_dev": geometry}
    _write_record(output, record)


@app.command("augmentation")
def augmentation(
    model: list[Path] = MODEL,
    augment: list[str] = typer.Option(["wdel"], "--augment", help="wdel, wnet or ctxt (repeatable)."),
    fraction: str = typer.Option("0.05,0.1,0.2", "--fraction", help="Shares of words changed, comma-separated."),
    corpus: Path | None = typer.Option(
        None, "--corpus", help="Sentences, one a line (.txt[.gz]); default $VASCL_DATA/corpus/wiki1m.txt.gz."
    ),
    samples: int = typer.Option(20000, "--samples", help="Sentences drawn from the corpus (seeded)."),
    seed: int = typer.Option(0, "--seed", help="Seeds the sample and the augmentations."),
    augment_model: str | None = typer.Option(None, "--augment-model", help="ctxt: the masked language model."),
    wordnet: str = typer.Option(
        DEFAULT_WORDNET, "--wordnet", help="wnet: the WordNet 3.0 database directory (Debian's wordnet-base)."
    ),
    data_dir: Path | None = DATA_DIR,
    plot: Path | None = typer.Option(
        None,
        "--plot",
        help="PNG path; default <run dir>/eval-augmentation.png for one training run, else eval-results/augmentation.png.",
    ),
    output: Path | None = FIGURE_JSON,
    batch_size: int = BATCH,
    max_length: int | None = MAX_LENGTH,
    pooling: str | None = POOLING,
    device: str | None = DEVICE,
    cache_dir: Path | None = CACHE,
    no_cache: bool = NO_CACHE,
) -> None:
    """Figure 3b: mean cosine between each sentence and its explicit augmentation, per model."""
    from rich.table import Table

    from vascl_scale.data.augment import AUGMENTATIONS, AugmentSpec, at_fraction, build_augmenter
    from vascl_scale.encode import Embedder, resolve_device, resolve_model
    from vascl_scale.eval.augmentation import (
        augmentation_cosines,
        augmented_texts,
        plot_augmentation_cosines,
        sample_sentences,
    )
    from vascl_scale.eval.report import short_label
    from vascl_scale.eval.runner import resolve_data_dir
    from vascl_scale.hub import locate_model
    from vascl_scale.paths import check_output_file

    try:
        device = resolve_device(device)
        plot = check_output_file(plot or default_output(model, "augmentation").with_suffix(".png"), "--plot")
        output = check_output_file(output or plot.with_suffix(".json"), "--output")
        cache = embedding_cache(cache_dir, no_cache)
        kinds = list(dict.fromkeys(augment))
        unknown = [kind for kind in kinds if kind not in AUGMENTATIONS[1:]]
        if unknown:
            raise ValueError(f"--augment {unknown[0]!r}: choose from {', '.join(AUGMENTATIONS[1:])}")
        try:
            shares = [float(part) for part in fraction.split(",") if part.strip()]
        except ValueError:
            raise ValueError(f"--fraction {fraction!r}: give shares such as 0.05,0.1,0.2") from None
        if not shares or not all(0 < share <= 1 for share in shares):
            raise ValueError(f"--fraction {fraction!r}: every share must be in (0, 1]")
        if samples < 2:
            raise ValueError(f"--samples must be >= 2; got {samples}")
        source = corpus or resolve_data_dir(data_dir) / "corpus" / "wiki1m.txt.gz"
        originals = sample_sentences(source, samples, seed)
        masked_lm = str(locate_model(augment_model, "--augment-model").directory) if augment_model else None
        variants = {}
        for kind in kinds:  # one augmenter (WordNet, masked LM) per kind, at each share
            augmenter = build_augmenter(AugmentSpec(kind, shares[0], wordnet_dir=wordnet, model=masked_lm))
            for share in shares:
                variants[kind, share] = augmented_texts(originals, at_fraction(augmenter, share), kind, share, seed)
        results: dict[str, dict[str, dict[str, dict]]] = {}
        for path in model:
            spec = resolve_model(path, pooling, max_length)
            embeddings = Embedder(spec, batch_size=batch_size, cache_dir=cache, device=device).embed(
                originals + [text for texts in variants.values() for text in texts if text.strip()]
            )
            by_kind = results.setdefault(short_label(spec.name), {})
            for (kind, share), texts in variants.items():
                kept = [i for i, text in enumerate(texts) if text.strip()]
                by_kind.setdefault(kind, {})[str(share)] = augmentation_cosines(
                    embeddings, [originals[i] for i in kept], [texts[i] for i in kept]
                )
    except ValueError as err:
        fail(err)
    table = Table(
        title=f"Mean cosine between a sentence and its augmentation ({len(originals)} sentences)", title_justify="left"
    )
    table.add_column("Model")
    table.add_column("augmentation")
    for share in shares:
        table.add_column(f"{100 * share:g}% words", justify="right")
    for name, by_kind in results.items():
        for kind in kinds:
            table.add_row(name, kind, *[f"{by_kind[kind][str(share)]['mean']:.4f}" for share in shares])
    print_table(table)
    logger.info("wrote %s", plot_augmentation_cosines(results, plot))
    record = {"corpus": str(source), "samples": len(originals), "seed": seed, "cosines": results}
    _write_record(output, record)


@app.command("compare")
def compare(
    baseline: Path = typer.Argument(..., help="Results JSON A (the baseline)."),
    candidate: Path = typer.Argument(..., help="Results JSON B."),
    index_a: int = typer.Option(0, "--index-a", min=0, help="Which model of A, when it holds several."),
    index_b: int = typer.Option(0, "--index-b", min=0, help="Which model of B, when it holds several."),
) -> None:
    """Per-task differences B - A of the primary metrics, and each family's mean difference."""
    from vascl_scale.eval.report import EvalReport, compare_table

    try:
        first, second = EvalReport.load(baseline), EvalReport.load(candidate)
        for report, index, path in ((first, index_a, baseline), (second, index_b, candidate)):
            if index >= len(report.models):
                raise ValueError(f"{path} holds {len(report.models)} model(s); --index must be below that")
    except ValueError as err:
        fail(err)
    print_table(compare_table(first.models[index_a], second.models[index_b]))

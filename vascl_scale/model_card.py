"""The model card of an export: ``README.md``, as sentence-transformers and the Hugging Face hub read it.

Every export of a training run (``final/``, ``last/``, ``best/``) holds ``model_card.json``, the
facts of the run that wrote its weights (:class:`CardFacts`), and ``README.md`` rendered from
them: YAML front matter (``library_name``, ``pipeline_tag``, ``tags``, ``base_model`` for a hub
model, ``datasets`` / ``language`` / ``license`` from the ``card`` config section, ``metrics``
and ``model-index`` when there are results), then the objective and its settings, the data and
the sentences seen, the global batch, the steps, the precision and the engine, the results, the
run's config and how to load the directory in sentence-transformers and transformers.

``vascl-scale eval`` (sts, clustering, intent, all) that writes its results into a training run
attaches the results it measured on that run's export to the export's ``model_card.json`` and
renders ``README.md`` again (:func:`attach_evaluation`). The results live with the weights they
were measured on: a later export (training resumed) replaces the directory, card and all, so a
card never shows the scores of other weights.

Torch-free: the eval command line uses it too.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vascl_scale.fs import replace_file
from vascl_scale.losses.spec import objective_spec
from vascl_scale.precision import precision_name

CARD_FILE = "README.md"
FACTS_FILE = "model_card.json"
OBJECTIVE_TITLES = {
    "vascl": "VaSCL (virtual augmentation supported contrastive learning, Zhang et al. 2022, Eq. 6)",
    "simcse": "unsupervised SimCSE (Gao et al. 2021, Eq. 1)",
    "simcse_sup": "supervised SimCSE with hard negatives (Gao et al. 2021, Eq. 5)",
    "pairsupcon": "PairSupCon (Zhang et al. 2021): instance contrast plus pairwise classification",
    "distill_kl": "distillation of a teacher's scores by KL divergence, plus supervised SimCSE's in-batch term",
    "margin_mse": "distillation of a teacher's score margins by MSE (Hofstaetter et al. 2020), plus supervised "
    "SimCSE's in-batch term",
}
# Each eval family in the hub's model-index: the task's type and name, the metric's type and name.
_MODEL_INDEX = {
    "sts": ("semantic-similarity", "Semantic Similarity", "cosine_spearman", "Spearman of cosine similarity x 100"),
    "clustering": ("clustering", "Short Text Clustering", "accuracy", "KMeans accuracy x 100 (mean of seeds)"),
    "intent": (
        "text-classification",
        "Few-shot Intent Classification",
        "accuracy",
        "linear probe accuracy x 100 (mean of splits)",
    ),
    "retrieval": ("retrieval", "Retrieval", "ndcg_at_10", "nDCG@10 x 100, exact cosine search"),
}


@dataclass
class CardFacts:
    """What the card says about the weights of one export, saved beside them as ``model_card.json``."""

    config: dict[str, Any]  # the run's config as written (its config.yaml)
    step: int  # optimiser steps that made these weights
    world_size: int
    zero_stage: int  # 0: DDP (or one process); 2 or 3: DeepSpeed ZeRO
    device_type: str  # "cpu" or "cuda"
    precision: str  # the resolved train.precision: "no" (float32), "bf16" or "fp16"
    embedding_dimension: int
    vascl_scale_version: str
    dev_score: float | None = None  # the model-selection score of these weights, when evaluated
    dev_metric: str = "stsb_dev_spearman"  # what dev_score is (vascl_scale.train.plan.DevSet.metric)
    dev_title: str = "STS-B dev Spearman"  # its name in words
    fsdp_strategy: str | None = None  # FSDP2's sharding_strategy when FSDP2 trained them
    # What `vascl-scale eval <command>` measured on these weights, by command (attach_evaluation).
    evaluations: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, allow_nan=False) + "\n"

    @classmethod
    def from_file(cls, path: Path) -> CardFacts:
        return cls(**json.loads(Path(path).read_text(encoding="utf-8")))


def export_step(directory: Path) -> int | None:
    """The optimiser step whose weights export ``directory`` holds, from its ``model_card.json``;
    None for a directory without one (not an export of a vascl-scale run)."""
    path = Path(directory) / FACTS_FILE
    return CardFacts.from_file(path).step if path.is_file() else None


def write_model_card(directory: Path, facts: CardFacts) -> None:
    """``model_card.json`` and ``README.md`` in ``directory``, each replaced atomically."""
    directory = Path(directory)
    replace_file(directory / FACTS_FILE, facts.to_json())
    replace_file(directory / CARD_FILE, render_card(facts))


def attach_evaluation(directory: Path, command: str, model_record: dict[str, Any], created: str) -> bool:
    """Keep ``model_record`` (one model of an eval report: ``ModelReport.to_json()``) as what
    ``vascl-scale eval command`` measured on export ``directory``, and render its card again.
    False, and nothing written, when ``directory`` holds no card (it is no vascl-scale export)."""
    path = Path(directory) / FACTS_FILE
    if not path.is_file():
        return False
    facts = CardFacts.from_file(path)
    facts.evaluations[command] = {
        "created": created,
        "max_length": model_record["model"]["max_length"],
        "precision": model_record["embedding"].get("precision", "no"),
        "results": [_compact(result) for result in model_record["results"] if result["status"] == "ok"],
    }
    write_model_card(directory, facts)
    return True


def _compact(result: dict[str, Any]) -> dict[str, Any]:
    """A task result as the card shows it: the primary metric, its spread and what it was measured on."""
    details = result["details"]
    measured_on = {
        "sts": details.get("source", ""),
        "clustering": f"{details.get('texts', '?')} texts",
        "retrieval": f"{details.get('queries', '?')} queries, {details.get('documents', '?')} documents",
    }
    return {
        "family": result["family"],
        "task": result["task"],
        "variant": result["variant"],
        "value": result["primary"],
        "std": details.get("accuracy_std"),
        "measured_on": measured_on.get(result["family"], ""),
    }


def _latest_results(facts: CardFacts) -> list[tuple[str, dict[str, Any]]]:
    """(command, result) of every task, the latest evaluation's where several measured it."""
    by_key: dict[tuple[str, str, str], tuple[str, dict[str, Any]]] = {}
    for command, evaluation in sorted(facts.evaluations.items(), key=lambda item: item[1]["created"]):
        for result in evaluation["results"]:
            by_key[result["family"], result["task"], result["variant"]] = (command, result)
    return list(by_key.values())


def _front_matter(facts: CardFacts, name: str) -> dict[str, Any]:
    config = facts.config
    meta: dict[str, Any] = {
        "library_name": "sentence-transformers",
        "pipeline_tag": "sentence-similarity",
        "tags": [
            "sentence-transformers",
            "sentence-similarity",
            "feature-extraction",
            "vascl-scale",
            config["objective"],
        ],
    }
    if config["model"].get("revision") is not None:  # set by the launcher for a hub model only
        meta["base_model"] = config["model"]["path"]
    card = config.get("card", {})
    for key in ("datasets", "language"):
        if card.get(key):
            meta[key] = list(card[key])
    if card.get("license"):
        meta["license"] = card["license"]
    results = _model_index_results(facts)
    if results:
        meta["metrics"] = sorted({metric["type"] for result in results for metric in result["metrics"]})
        meta["model-index"] = [{"name": name, "results": results}]
    return meta


def _model_index_results(facts: CardFacts) -> list[dict[str, Any]]:
    """The hub's model-index entries: each evaluated task, and the model-selection score."""
    scores = [
        (
            result["family"],
            result["task"] + (f" ({result['variant']})" if result["variant"] else ""),
            result["task"],
            result["value"],
        )
        for _, result in _latest_results(facts)
    ]
    if facts.dev_score is not None and facts.dev_metric == "stsb_dev_spearman":
        scores.append(("sts", "stsb-dev (model selection)", "stsb", facts.dev_score))
    entries = []
    for family, dataset_name, dataset_type, value in scores:
        task_type, task_name, metric_type, metric_name = _MODEL_INDEX[family]
        entries.append(
            {
                "task": {"type": task_type, "name": task_name},
                "dataset": {"name": dataset_name, "type": dataset_type},
                "metrics": [{"type": metric_type, "value": round(value, 2), "name": metric_name}],
            }
        )
    return entries


def _engine(facts: CardFacts) -> str:
    if facts.fsdp_strategy is not None:
        return f"FSDP2 {facts.fsdp_strategy}, {facts.world_size} processes"
    if facts.zero_stage:
        return f"DeepSpeed ZeRO-{facts.zero_stage}, {facts.world_size} processes"
    if facts.world_size == 1:
        return "one process"
    return f"DDP over {'NCCL' if facts.device_type == 'cuda' else 'gloo'}, {facts.world_size} processes"


def _data(config: dict[str, Any]) -> str:
    data = config["data"]
    if isinstance(data["train"], str):
        return f"`{data['train']}`"
    sources = ", ".join(f"`{source['source']}` (weight {source['weight']:g})" for source in data["train"])
    return f"a mix ({data['mix']}) of {sources}"


def _false_negatives(loss: dict) -> str:
    """The ``loss.false_negatives`` rule in words."""
    if loss["false_negatives"] == "duplicates":
        return "in-batch negatives with the anchor's or its positive's text masked, over the global batch"
    judge = f"guide model `{loss['guide_model']}`" if loss.get("guide_model") else "the model's own cosines"
    margin = loss["false_negative_margin"]
    rule = (
        f"the positive's score minus {margin:g}"
        if loss["margin_strategy"] == "absolute"
        else f"{1 - margin:g} x the positive's score"
    )
    return f"in-batch negatives scoring above {rule} masked ({judge}), over the global batch"


def render_card(facts: CardFacts) -> str:
    """The card's text: front matter, then the training, the results and how to load it."""
    config = facts.config
    train, loss, optim = config["train"], config["loss"], config["optim"]
    name = Path(train["output_dir"]).name
    spec = objective_spec(config["objective"])
    batch, accumulation, chunk = train["global_batch_size"], train["grad_accum_steps"], train["chunk_size"]
    sentences = facts.step * batch * accumulation
    base = config["model"]["path"] + (
        f" (revision {config['model']['revision']})" if config["model"].get("revision") else ""
    )
    precision = precision_name(facts.precision)
    pooling = config["model"]["pooling"]
    rows = [
        ("objective", f"`{config['objective']}`: {OBJECTIVE_TITLES[config['objective']]}"),
        ("settings (`loss`)", ", ".join(f"{key} = {json.dumps(loss[key])}" for key in spec.loss_keys)),
        ("data", _data(config)),
        (
            "sentences seen",
            f"{sentences:,} ({facts.step} steps x {batch} sentences x {accumulation} loss calls a step)",
        ),
        (
            "global batch",
            f"{batch} sentences per loss call ({facts.world_size} x {batch // facts.world_size} per device); "
            + (
                "no gradient accumulation"
                if accumulation == 1
                else f"gradient accumulation x{accumulation} (adds no negatives)"
            )
            + (f"; cached step in chunks of {chunk}" if chunk else ""),
        ),
        ("steps", f"{facts.step} of {train['max_steps']}"),
        (
            "optimiser",
            f"AdamW, lr {optim['lr']:g} (encoder) and {optim['head_lr']:g} (head), weight decay {optim['weight_decay']:g}, "
            f"warm-up {optim['warmup_steps']} steps",
        ),
        ("precision", precision),
        ("engine", _engine(facts)),
        ("seed", str(train["seed"])),
        (
            "max length",
            f"{config['data']['max_length']} tokens in training; {config['eval']['max_length']} in this export",
        ),
    ]
    model = config["model"]
    lora = model.get("lora") or {}
    if lora.get("r"):
        targets = ", ".join(lora["target_modules"]) if lora.get("target_modules") else "every linear layer"
        rows.append(
            (
                "LoRA",
                f"rank {lora['r']}, alpha {lora['alpha']:g}, dropout {lora['dropout']:g} on {targets}; merged into "
                "these weights; the adapter alone in `lora/` (PEFT's format)",
            )
        )
    if model.get("prompts"):
        rows.append(
            ("prompts", "; ".join(f"{column}: {json.dumps(text)}" for column, text in model["prompts"].items()))
        )
    if loss.get("false_negatives", "none") != "none":
        rows.append(("false negatives", _false_negatives(loss)))
    if loss.get("matryoshka_dims"):
        dims = loss["matryoshka_dims"]
        weights = loss.get("matryoshka_weights") or [1] * len(dims)
        shown = ", ".join(f"{d} (weight {w:g})" for d, w in sorted(zip(dims, weights), key=lambda item: -item[0]))
        rows.append(
            (
                "Matryoshka dimensions",
                f"{shown}: the embedding's first m dimensions, re-normalised, are an embedding of their own "
                f"(`SentenceTransformer(path, truncate_dim={min(dims)})`, `vascl-scale eval ... --truncate-dim {min(dims)}`)",
            )
        )
    if facts.dev_score is not None:
        rows.append(("model selection", f"{facts.dev_title} x 100 {facts.dev_score:.2f} at this step"))
    meta = yaml.safe_dump(_front_matter(facts, name), sort_keys=False, allow_unicode=True)
    lines = [
        "---",
        meta.rstrip("\n"),
        "---",
        "",
        f"# {name}",
        "",
        f"A sentence encoder fine-tuned from `{base}` by vascl-scale {facts.vascl_scale_version}: "
        f"{pooling}-pooled embeddings of dimension {facts.embedding_dimension}, compared by cosine similarity. "
        "The contrastive projection head is saved beside the encoder (`head.safetensors`) and is not part of the embeddings.",
        "",
        "## Training",
        "",
        "| | |",
        "|---|---|",
        *(f"| {key} | {value} |" for key, value in rows),
        "",
    ]
    lines += _results_section(facts)
    lines += [
        "## Usage",
        "",
        "With sentence-transformers:",
        "",
        "```python",
        "from sentence_transformers import SentenceTransformer",
        "",
        'model = SentenceTransformer("path/to/this/directory")',
        'embeddings = model.encode(["A sentence.", "Another one."])',
        "similarities = model.similarity(embeddings, embeddings)",
        *(
            [
                'queries = model.encode(["a search query"], prompt_name="query")  # the anchor\'s prompt put before each text'
            ]
            if (model.get("prompts") or {}).get("anchor")
            else []
        ),
        "```",
        "",
        f"With transformers ({pooling} pooling over the last hidden states):",
        "",
        "```python",
        "import torch",
        "from transformers import AutoModel, AutoTokenizer",
        "",
        'tokenizer = AutoTokenizer.from_pretrained("path/to/this/directory")',
        *(['tokenizer.padding_side = "right"'] if pooling == "last_token" else []),
        'model = AutoModel.from_pretrained("path/to/this/directory").eval()',
        f'batch = tokenizer(["A sentence.", "Another one."], padding=True, truncation=True, max_length={config["eval"]["max_length"]}, return_tensors="pt")',
        "with torch.no_grad():",
        "    hidden = model(**batch).last_hidden_state  # (n, length, d)",
        *(
            [
                '    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (n, length, 1)',
                "    embeddings = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)  # (n, d)",
            ]
            if pooling == "mean"
            else [
                '    last = batch["attention_mask"].sum(1) - 1  # (n,): each row\'s last token, the EOS (right padding)',
                "    embeddings = hidden[torch.arange(len(last)), last]  # (n, d)",
            ]
            if pooling == "last_token"
            else ["    embeddings = hidden[:, 0]  # (n, d): the first token"]
        ),
        "```",
        "",
        'With vascl-scale (the projection head included): `SentenceEncoder.from_pretrained("path/to/this/directory")`.',
        "",
        "## Config",
        "",
        "<details><summary>The run's config.yaml</summary>",
        "",
        "```yaml",
        yaml.safe_dump(config, sort_keys=False, default_flow_style=None).rstrip("\n"),
        "```",
        "",
        "</details>",
        "",
    ]
    return "\n".join(lines)


def _results_section(facts: CardFacts) -> list[str]:
    """The results of ``vascl-scale eval`` on these weights, or a line saying how to get them."""
    results = _latest_results(facts)
    lines = ["## Evaluation", ""]
    if not results:
        return lines + [
            "Not evaluated yet: `vascl-scale eval all --model <run directory>` scores the run's best/ (else final/) "
            "and adds its results here.",
            "",
        ]
    lines += ["| task | score | measured on | by |", "|---|---|---|---|"]
    for command, result in results:
        task = result["task"] + (f" ({result['variant']})" if result["variant"] else "")
        score = f"{result['value']:.2f}" + (f" +- {result['std']:.2f}" if result["std"] is not None else "")
        evaluation = facts.evaluations[command]
        by = f"`eval {command}`, {evaluation['created']}, max length {evaluation['max_length']}"
        lines.append(f"| {result['family']} / {task} | {score} | {result['measured_on']} | {by} |")
    metrics = "; ".join(
        f"{family}: {_MODEL_INDEX[family][3]}" for family in dict.fromkeys(r["family"] for _, r in results)
    )
    return lines + ["", f"Scores: {metrics}.", ""]

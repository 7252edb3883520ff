"""The model card (vascl_scale.model_card) rendered from its facts: the front matter the hub
reads, the objective's own settings, and evaluation results attached and merged. Real exports
of a training run, their cards and their loading are tested in test_tracking.py."""

from __future__ import annotations

from pathlib import Path

import yaml

from vascl_scale.config import config_from_dict
from vascl_scale.model_card import CardFacts, attach_evaluation, render_card, write_model_card


def facts_of(
    objective: str = "simcse", model: dict | None = None, card: dict | None = None, loss: dict | None = None, **values
) -> CardFacts:
    config = config_from_dict(
        {
            "objective": objective,
            "model": model or {"path": "models/local-bert"},
            "loss": loss or {},
            "data": {"train": "shards/wiki1m"},
            "train": {"global_batch_size": 64, "grad_accum_steps": 2, "chunk_size": 8, "output_dir": "runs/demo"},
            "card": card or {},
        }
    )
    settings = dict(
        step=10,
        world_size=4,
        zero_stage=2,
        device_type="cuda",
        precision="bf16",
        embedding_dimension=768,
        vascl_scale_version="0.1.0",
    )
    return CardFacts(config=config.to_dict(), **{**settings, **values})


def split_card(text: str) -> tuple[dict, str]:
    assert text.startswith("---\n")
    front, body = text[4:].split("\n---\n", 1)
    return yaml.safe_load(front), body


def test_front_matter_names_a_hub_base_model_and_the_card_section_and_the_body_states_the_run() -> None:
    meta, body = split_card(render_card(facts_of()))
    assert meta == {
        "library_name": "sentence-transformers",
        "pipeline_tag": "sentence-similarity",
        "tags": ["sentence-transformers", "sentence-similarity", "feature-extraction", "vascl-scale", "simcse"],
    }  # a local model and no results: no base_model, no metrics, no model-index
    rows = " ".join(body.split())
    assert "| settings (`loss`) | temperature = 0.05 |" in rows  # SimCSE reads no other loss key
    assert "| sentences seen | 1,280 (10 steps x 64 sentences x 2 loss calls a step) |" in rows
    assert (
        "64 sentences per loss call (4 x 16 per device); gradient accumulation x2 (adds no negatives); cached step in chunks of 8"
        in rows
    )
    assert "| engine | DeepSpeed ZeRO-2, 4 processes |" in rows and "| precision | bf16 |" in rows
    assert "Not evaluated yet" in body
    config_block = body.split("```yaml\n", 1)[1].split("\n```", 1)[0]
    assert yaml.safe_load(config_block)["train"]["global_batch_size"] == 64

    hub = facts_of(
        "vascl",
        model={"path": "roberta-base", "revision": "e2da8e2f811d1448a5b465c236feacd80ffbac7b"},
        card={"datasets": ["princeton-nlp/datasets-for-simcse"], "language": ["en"], "license": "apache-2.0"},
        dev_score=81.234,
    )
    meta, body = split_card(render_card(hub))
    assert meta["base_model"] == "roberta-base"
    assert (meta["datasets"], meta["language"], meta["license"]) == (
        ["princeton-nlp/datasets-for-simcse"],
        ["en"],
        "apache-2.0",
    )
    assert meta["metrics"] == ["cosine_spearman"]
    (selection,) = meta["model-index"][0]["results"]
    assert selection["dataset"] == {"name": "stsb-dev (model selection)", "type": "stsb"}
    assert selection["metrics"][0]["value"] == 81.23
    assert "k = 16" in body and 'eps_mode = "absolute"' in body


def test_the_card_states_the_loss_options_and_every_objective_has_a_title() -> None:
    from vascl_scale.losses.spec import OBJECTIVES

    for objective in OBJECTIVES:
        render_card(facts_of(objective))
    options = dict(false_negatives="duplicates", matryoshka_dims=[768, 128, 64], matryoshka_weights=[1, 1, 2])
    rows = " ".join(render_card(facts_of("distill_kl", loss=options)).split())
    assert "| false negatives | in-batch negatives with the anchor's or its positive's text masked" in rows
    assert "| Matryoshka dimensions | 768 (weight 1), 128 (weight 1), 64 (weight 2): " in rows
    assert "truncate_dim=64" in rows and "KL divergence" in rows
    guided = dict(false_negatives="margin", false_negative_margin=0.1, guide_model="guides/minilm")
    rows = " ".join(render_card(facts_of("simcse_sup", loss=guided)).split())
    assert "scoring above the positive's score minus 0.1 masked (guide model `guides/minilm`)" in rows


def result(family: str, task: str, value: float | None, variant: str = "", status: str = "ok", **details) -> dict:
    return {
        "family": family,
        "task": task,
        "metric": "m",
        "primary": value,
        "variant": variant,
        "status": status,
        "details": details,
    }


def model_record(*results: dict) -> dict:
    return {"model": {"max_length": 128}, "embedding": {"precision": "bf16"}, "results": list(results)}


def test_attached_evaluations_merge_by_task_the_latest_winning_and_skip_missing_data(tmp_path: Path) -> None:
    assert not attach_evaluation(
        tmp_path, "sts", model_record(), "2026-01-01T00:00:00+00:00"
    )  # no card: nothing written
    assert not list(tmp_path.iterdir())
    write_model_card(tmp_path, facts_of())
    sts = model_record(result("sts", "stsb", 80.0, source="mteb"), result("sts", "sickr", None, status="missing"))
    assert attach_evaluation(tmp_path, "sts", sts, "2026-01-02T00:00:00+00:00")
    everything = model_record(
        result("sts", "stsb", 82.5, source="mteb"),
        result("clustering", "agnews", 70.0, accuracy_std=1.5, texts=60),
        result("intent", "snips", 90.0, "5-shot", accuracy_std=2.0),
    )
    assert attach_evaluation(tmp_path, "all", everything, "2026-01-03T00:00:00+00:00")
    meta, body = split_card((tmp_path / "README.md").read_text())
    values = {entry["dataset"]["name"]: entry["metrics"][0]["value"] for entry in meta["model-index"][0]["results"]}
    assert values == {"stsb": 82.5, "agnews": 70.0, "snips (5-shot)": 90.0}  # eval all is later than eval sts
    assert meta["metrics"] == ["accuracy", "cosine_spearman"]
    assert (
        "| clustering / agnews | 70.00 +- 1.50 | 60 texts | `eval all`, 2026-01-03T00:00:00+00:00, max length 128 |"
        in body
    )
    assert "sickr" not in body  # its data was missing: no score
    assert CardFacts.from_file(tmp_path / "model_card.json").evaluations.keys() == {"sts", "all"}

"""LoRA adapters refused where they are wrong, never merged into the wrong model: a rank above the
backbone's width (refused by the plan), an adapter config that is no LoRA config of the types PEFT
writes, weights cut short or missing, and an export whose base model moved or differs from the
one it was trained on; config messages that name the key and say what it must be."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import huggingface_hub
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tests.eval_helpers import invoke, make_data
from tests.tiny import tiny_decoder_dir
from tests.train_helpers import write_texts
from vascl_scale.backbone import ADAPTER_CONFIG, ADAPTER_WEIGHTS, BASE_RECORD, LORA_DIR, lora_config, plan_backbone
from vascl_scale.cli import app
from vascl_scale.config import ModelConfig, config_from_dict
from vascl_scale.config.schema import MAX_LORA_RANK
from vascl_scale.encode import resolve_model
from vascl_scale.model import SentenceEncoder

# The tiny decoder's narrowest linear layers: k_proj and v_proj, 32 -> 2 KV heads x 8 = 16.
NARROWEST = 16


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """models/qwen3 (a tiny decoder), a LoRA export of it made with a relative model path from
    here (``export/``: the merged model, ``export/lora``: the adapter) and the eval data."""
    from accelerate import Accelerator

    from vascl_scale.model_card import CardFacts
    from vascl_scale.train.export import export_model

    root = tmp_path_factory.mktemp("lora-workspace")
    tiny_decoder_dir(root / "models" / "qwen3", seed=0)
    make_data(root / "data")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)  # the run's working directory: model.path is relative to it
        model = SentenceEncoder.from_pretrained("models/qwen3", pooling="last_token", lora=lora_config(4, 8, 0, None))
        generator = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name, parameter in model.encoder.named_parameters():
                if "lora_B" in name:  # zeros at creation: the adapter would change nothing
                    parameter.copy_(0.5 * torch.randn(parameter.shape, generator=generator))
        config = config_from_dict(
            {"model": {"path": "models/qwen3", "pooling": "last_token", "lora": {"r": 4}}, "data": {"train": "t"}}
        )
        card = CardFacts(config=config.to_dict(), step=1, world_size=1, zero_stage=0, device_type="cpu",
                         precision="no", embedding_dimension=32, vascl_scale_version="test")  # fmt: skip
        export_model(Accelerator(cpu=True), model, root / "export", max_seq_length=32, card=card)
    return root


def eval_sts(workspace: Path, model: Path, output: Path):
    return invoke(
        "sts", "--data-dir", str(workspace / "data"), "--task", "stsb", "--no-cache", "--precision", "no",
        "--output", str(output), "--model", str(model),
    )  # fmt: skip


def eval_error(workspace: Path, adapter: Path, tmp_path: Path) -> str:
    """The one error line of ``eval sts --model adapter`` (exit 2, no traceback)."""
    result = eval_sts(workspace, adapter, tmp_path / "r.json")
    assert result.exit_code == 2, (result.output, result.exception)
    lines = result.output.strip().splitlines()
    assert lines[-1].startswith("error: "), result.output
    return lines[-1]


def adapter_copy(workspace: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(workspace / "export" / LORA_DIR, tmp_path / "adapter"))


def edit_config(adapter: Path, **values) -> None:
    config = json.loads((adapter / ADAPTER_CONFIG).read_text())
    (adapter / ADAPTER_CONFIG).write_text(json.dumps({**config, **values}))


# --- D8: the rank ---


def train_error(tmp_path: Path, *overrides: str) -> str:
    """The one error line of ``train`` on the tiny decoder with ``overrides`` (exit 2, nothing trained)."""
    decoder = tmp_path / "qwen3"
    if not decoder.is_dir():
        tiny_decoder_dir(decoder)
    config = {
        "model": {"path": str(decoder), "pooling": "last_token", "lora": {"r": 4}},
        "data": {"train": str(write_texts(tmp_path / "train.txt", lines=32))},
        "loss": {"k": 4},
        "train": {"output_dir": str(tmp_path / "run"), "global_batch_size": 8, "max_steps": 1},
        "eval": {"every_steps": 0},
    }
    (tmp_path / "config.yaml").write_text(json.dumps(config))
    overriding = [part for override in overrides for part in ("--set", override)]
    result = CliRunner().invoke(app, ["train", "--config", str(tmp_path / "config.yaml"), *overriding])
    assert result.exit_code == 2, (result.output, result.exception)
    assert not (tmp_path / "run" / "final").exists()
    return result.output.strip().splitlines()[-1]


def test_a_lora_rank_above_the_backbones_narrowest_layer_is_refused_by_the_plan(tmp_path: Path) -> None:
    line = train_error(tmp_path, "model.lora.r=1000")
    assert "model.lora.r = 1000 exceeds the rank" in line, line
    assert f"layers.0.self_attn.k_proj (32 -> 16), is 16 wide; choose r <= {NARROWEST}" in line, line
    line = train_error(tmp_path, f"model.lora.r={10**12}")  # refused by the schema, before any model is read
    assert f"model.lora.r must be <= {MAX_LORA_RANK}; got 1000000000000" in line
    # the width is that of the layers adapted: without k_proj and v_proj, 32
    line = train_error(tmp_path, "model.lora.r=33", "model.lora.target_modules=[q_proj, o_proj]")
    assert "layers.0.self_attn.q_proj (32 -> 32), is 32 wide; choose r <= 32" in line, line
    section = {"path": str(tmp_path / "qwen3"), "pooling": "last_token"}
    plan_backbone(ModelConfig(**section, lora={"r": NARROWEST}), tmp_path / "qwen3", "cpu")  # the widest allowed
    plan_backbone(ModelConfig(**section, lora={"r": 32, "target_modules": ["q_proj"]}), tmp_path / "qwen3", "cpu")


# --- config messages ---


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.lora.target_modules=[]", "model.lora.target_modules must name at least one linear layer; leave"),
        ("train.length_buckets=0", "train.length_buckets must be an integer >= 1 or 'auto'; got 0"),
        ("train.length_buckets=many", "train.length_buckets must be an integer >= 1 or 'auto'; got 'many'"),
        ("model.packed=3", "model.packed must be 'auto' or true or false; got 3"),
    ],
)
def test_config_messages_name_the_key_and_what_it_must_be(tmp_path: Path, override: str, message: str) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps({"model": {"path": "m"}, "data": {"train": "t"}}))
    result = CliRunner().invoke(app, ["train", "--config", str(config), "--set", override])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "constrained" not in result.output and "literal[" not in result.output


# --- D11: the base model of an export ---


def test_a_lora_export_pins_its_base_so_eval_elsewhere_merges_into_that_base_or_refuses(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run trained on models/qwen3 of its working directory; eval runs from another directory
    that holds another models/qwen3: the adapter must go on the base it was trained on."""
    adapter = workspace / "export" / LORA_DIR
    base = workspace / "models" / "qwen3"
    assert json.loads((adapter / ADAPTER_CONFIG).read_text())["base_model_name_or_path"] == str(base.resolve())
    record = json.loads((adapter / BASE_RECORD).read_text())
    assert record["base_model_name_or_path"] == str(base.resolve()) and len(record["sha256"]) == 64
    elsewhere = tmp_path / "elsewhere"
    tiny_decoder_dir(elsewhere / "models" / "qwen3", seed=1)
    monkeypatch.chdir(elsewhere)
    merged = eval_sts(workspace, workspace / "export", tmp_path / "merged.json")
    assert merged.exit_code == 0, merged.output
    from_adapter = eval_sts(workspace, adapter, tmp_path / "adapter.json")
    assert from_adapter.exit_code == 0, from_adapter.output
    scores = [json.loads((tmp_path / f"{name}.json").read_text())["models"][0] for name in ("merged", "adapter")]
    assert scores[1]["model"]["directory"] == str(base.resolve())
    assert scores[1]["results"][0]["primary"] == pytest.approx(scores[0]["results"][0]["primary"], abs=1e-6)

    # the base at that path replaced by another model: refused, naming both digests
    moved = Path(shutil.move(str(base), str(tmp_path / "qwen3-trained-on")))
    try:
        shutil.copytree(elsewhere / "models" / "qwen3", base)
        line = eval_error(workspace, adapter, tmp_path)
        assert f"the LoRA adapter {adapter} was trained on {base.resolve()} (sha256 {record['sha256'][:16]})" in line
        assert f"but the base model {base.resolve()} differs from it (sha256 " in line
        shutil.rmtree(base)  # the base gone: refused, naming where it was
        assert f"was trained on {base.resolve()}, which is not a directory here" in eval_error(
            workspace, adapter, tmp_path
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.move(str(moved), str(base))
    copied = Path(shutil.copytree(base, tmp_path / "copy-of-the-base"))  # the same weights elsewhere: accepted
    alone = adapter_copy(workspace, tmp_path)
    edit_config(alone, base_model_name_or_path=str(copied))
    assert eval_sts(workspace, alone, tmp_path / "copy.json").exit_code == 0


# --- D9, D10: broken adapter directories ---


@pytest.mark.parametrize(
    "text, message",
    [
        ("[1, 2]", "adapter_config.json must hold a JSON object (PEFT's adapter config); got [1, 2]"),
        ("null", "adapter_config.json must hold a JSON object (PEFT's adapter config); got None"),
        ('{"r": 4,', "adapter_config.json: invalid JSON at line 1 column 9: Expecting property name"),
    ],
)
def test_an_adapter_config_that_is_no_json_object_is_refused_naming_the_file(
    workspace: Path, tmp_path: Path, text: str, message: str
) -> None:
    adapter = adapter_copy(workspace, tmp_path)
    (adapter / ADAPTER_CONFIG).write_text(text)
    assert f"error: {adapter}/{message}" in eval_error(workspace, adapter, tmp_path)


@pytest.mark.parametrize(
    "values, message",
    [
        ({"r": 10**12}, f"adapter_config.json: r must be an integer from 1 to {MAX_LORA_RANK}, as PEFT writes it"),
        ({"r": 1000}, f"adapter_config.json = 1000 exceeds the rank .* choose r <= {NARROWEST}"),
        ({"r": 8}, "adapter_model.safetensors does not fit .*adapter_config.json and the base model: .*size mismatch"),
        ({"lora_alpha": 10**400}, "adapter_config.json: lora_alpha must be a number"),
        ({"peft_type": "IA3"}, 'adapter_config.json: peft_type must be "LORA"'),
        ({"modules_to_save": 5}, "adapter_config.json: peft cannot apply it to the base model: TypeError"),
    ],
)
def test_an_adapter_config_peft_cannot_use_is_refused_naming_the_file(
    workspace: Path, tmp_path: Path, values: dict, message: str
) -> None:
    adapter = adapter_copy(workspace, tmp_path)
    edit_config(adapter, **values)
    assert re.search(message, eval_error(workspace, adapter, tmp_path))


def test_adapter_weights_cut_short_or_missing_are_refused_naming_the_file(workspace: Path, tmp_path: Path) -> None:
    adapter = adapter_copy(workspace, tmp_path)
    weights = adapter / ADAPTER_WEIGHTS
    content = weights.read_bytes()
    weights.write_bytes(content[: len(content) // 2])
    line = eval_error(workspace, adapter, tmp_path)
    assert f"error: {weights} is not a complete safetensors file (" in line and "cut short" in line
    weights.unlink()
    assert f"error: {weights} is missing: a LoRA adapter directory holds its weights there" in eval_error(
        workspace, adapter, tmp_path
    )
    from safetensors.torch import save_file

    save_file({"unrelated": torch.zeros(2)}, str(weights))  # complete, but none of the adapter's tensors
    assert f"error: {weights} lacks tensors of the adapter" in eval_error(workspace, adapter, tmp_path)


# --- property: any JSON in adapter_config.json ---

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.sampled_from([0, -1, 4, 2**63, 10**12, 10**400])
    | st.floats()
    | st.sampled_from(["LORA", "IA3", "all-linear", "((", "q_proj", "FEATURE_EXTRACTION", "", "none"])
    | st.text(max_size=8)
)
json_values = st.recursive(
    json_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)  # fmt: skip
# The keys vascl-scale and peft read first, and some peft reads later.
KEYS = [
    "base_model_name_or_path", "peft_type", "r", "lora_alpha", "lora_dropout", "target_modules", "rank_pattern",
    "alpha_pattern", "task_type", "bias", "use_dora", "init_lora_weights", "modules_to_save", "fan_in_fan_out",
]  # fmt: skip


@st.composite
def adapter_configs(draw) -> tuple[str, object]:
    """("whole", any JSON value: a list, null, a number, a mapping, ...) or ("edits", the keys of
    the export's config to give values of any type: huge integers, non-finite floats, lists,
    mappings; ... removes the key)."""
    if draw(st.integers(0, 3)) == 0:
        return "whole", draw(json_values)
    return "edits", draw(st.dictionaries(st.sampled_from(KEYS), json_values | st.just(...), min_size=1, max_size=3))


@settings(
    max_examples=60, derandomize=True, database=None, deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)  # fmt: skip
@given(adapter_configs())
def test_any_json_in_an_adapter_config_loads_or_is_a_value_error_naming_the_file(
    workspace: Path, tmp_path_factory: pytest.TempPathFactory, document: object
) -> None:
    """What eval does with an adapter directory: resolve it (its base, its settings), then load
    the base with the adapter merged. Either works, or a ValueError names the adapter's file."""
    adapter = adapter_copy(workspace, tmp_path_factory.mktemp("adapter"))
    kind, value = document
    if kind == "edits":
        config = json.loads((adapter / ADAPTER_CONFIG).read_text())
        value = {key: value.get(key, old) for key, old in (config | value).items() if value.get(key) is not ...}
    (adapter / ADAPTER_CONFIG).write_text(json.dumps(value))
    try:
        with pytest.MonkeyPatch.context() as patch:  # a base named by a drawn text is looked for in the cache only
            patch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
            spec = resolve_model(adapter, pooling="last_token", max_length=16)
            SentenceEncoder.from_pretrained(spec.directory, pooling="last_token", adapter=spec.adapter)
    except ValueError as err:
        event("refused")
        assert str(adapter) in str(err), err
    else:
        event("loaded")

"""``vascl-scale eval`` on decoder backbones: a raw Qwen3 directory whose tokenizer has no pad
token, a sentence-transformers export with last-token pooling and named prompts (``--prompt``),
a LoRA adapter directory resolved to its base model with the adapter merged in, and the cache
keyed by prompt. Tiny random models, in process."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.eval_helpers import invoke, make_data
from tests.tiny import DECODER_TEXTS, tiny_decoder_dir
from vascl_scale.encode import Embedder, model_fingerprint, resolve_model
from vascl_scale.eval.sts import STSEvaluator
from vascl_scale.model import SentenceEncoder
from vascl_scale.sentence_transformers_format import write_sentence_transformers_files

TEXTS = list(DECODER_TEXTS[:4]) + ["a much longer text about rivers, banks and the money kept in them", "rain"]
PROMPTS = {"anchor": "query: ", "positive": "passage: "}  # model.prompts by column, as training exports them


@pytest.fixture(scope="module")
def decoder(tmp_path_factory) -> Path:
    """A raw tiny Qwen3 saved as Qwen3ForCausalLM; its tokenizer has an EOS and no pad token."""
    return tiny_decoder_dir(tmp_path_factory.mktemp("decoder") / "qwen3", "qwen3")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return make_data(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def st_export(tmp_path_factory, decoder) -> Path:
    """A sentence-transformers directory of the decoder: last-token pooling, max length 32, the
    query and document prompts, and the prepared tokenizer (it appends EOS and pads with it)."""
    export = tmp_path_factory.mktemp("st") / "export"
    model = SentenceEncoder.from_pretrained(decoder, pooling="last_token")
    model.encoder.save_pretrained(export)
    model.tokenizer.save_pretrained(export)
    write_sentence_transformers_files(export, model.hidden_size, "last_token", 32, PROMPTS)
    return export


@pytest.fixture(scope="module")
def lora_export(tmp_path_factory, decoder) -> Path:
    """A LoRA run's export built with peft: the merged model with its sentence-transformers files
    in ``export/`` and the adapter (trained on ``decoder``) with the tokenizer in ``export/lora``."""
    from vascl_scale.backbone import LORA_DIR, apply_lora, lora_config

    export = tmp_path_factory.mktemp("lora") / "export"
    model = SentenceEncoder.from_pretrained(decoder, pooling="last_token")
    wrapped = apply_lora(model.encoder, lora_config(4, 8.0, 0.0, None))
    wrapped.peft_config["default"].base_model_name_or_path = str(decoder)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in wrapped.named_parameters():
            if "lora_B" in name:  # zeros at creation: the adapter would change nothing
                parameter.copy_(0.5 * torch.randn(parameter.shape, generator=generator))
    wrapped.save_pretrained(export / LORA_DIR)
    model.tokenizer.save_pretrained(export / LORA_DIR)
    wrapped.merge_and_unload().save_pretrained(export)
    model.tokenizer.save_pretrained(export)
    write_sentence_transformers_files(export, model.hidden_size, "last_token", 32, {"anchor": "query: "})
    return export


def sts_score(data_dir: Path, encode) -> float:
    """The stsb score ``eval sts`` gives embeddings from ``encode`` (texts -> (N, d))."""
    [result] = STSEvaluator.from_data_dir(data_dir, ["stsb"]).evaluate(encode)
    return result.primary


def run_sts(data_dir: Path, output: Path, *args: str) -> dict:
    """``eval sts`` on stsb in float32: its scores are compared with float32 references (``auto``
    is bf16 on a CPU with native bf16)."""
    common = ["--task", "stsb", "--no-cache", "--precision", "no", "--output", str(output)]
    result = invoke("sts", "--data-dir", str(data_dir), *common, *args)
    assert result.exit_code == 0, result.output
    return json.loads(output.read_text())["models"][0]


def test_raw_decoder_without_pad_token_scores_with_last_token_pooling(decoder, data_dir, tmp_path):
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(str(decoder)).pad_token is None  # what failed to pad before
    record = run_sts(data_dir, tmp_path / "r.json", "--model", str(decoder), "--pooling", "last_token")
    assert record["model"]["pooling"] == "last_token" and record["model"]["adapter"] is None
    assert record["model"]["prompts"] == {} and "prompt" not in record["model"]
    reference = SentenceEncoder.from_pretrained(decoder, pooling="last_token")
    spec = resolve_model(decoder, pooling="last_token")
    assert spec.max_length == 128  # the tiny decoder's position embeddings
    expected = sts_score(data_dir, lambda texts: reference.encode(texts, max_length=spec.max_length))
    assert record["results"][0]["primary"] == pytest.approx(expected, abs=1e-9)
    embedded = Embedder(spec, batch_size=2).embed(TEXTS)(TEXTS)
    np.testing.assert_allclose(embedded, reference.encode(TEXTS, max_length=128), atol=1e-6)
    assert resolve_model(decoder).pooling == "last_token"  # no pooling given: a decoder's last token
    assert resolve_model(decoder, pooling="mean").pooling == "mean"
    assert run_sts(data_dir, tmp_path / "m.json", "--model", str(decoder))["results"][0]["status"] == "ok"


def test_sentence_transformers_export_gives_last_token_pooling_and_prompts(st_export, data_dir, tmp_path):
    spec = resolve_model(st_export)
    assert (spec.pooling, spec.normalize, spec.max_length, spec.adapter) == ("last_token", False, 32, None)
    assert spec.prompts == {"query": "query: ", "document": "passage: "}
    assert spec.describe()["prompts"] == spec.prompts
    reference = SentenceEncoder.from_pretrained(st_export, pooling="last_token")
    embedder = Embedder(spec, batch_size=2)
    plain = embedder.embed(TEXTS)(TEXTS)
    prompted = embedder.embed(TEXTS, spec.prompt_text("query"))(TEXTS)  # looked up by the texts themselves
    np.testing.assert_allclose(plain, reference.encode(TEXTS, max_length=32), atol=1e-6)
    np.testing.assert_allclose(prompted, reference.encode(["query: " + t for t in TEXTS], max_length=32), atol=1e-6)
    assert not np.allclose(plain, prompted, atol=1e-4)

    record = run_sts(data_dir, tmp_path / "q.json", "--model", str(st_export), "--prompt", "query")
    assert record["model"]["prompt"] == "query" and record["model"]["pooling"] == "last_token"
    expected = sts_score(data_dir, lambda texts: reference.encode(["query: " + t for t in texts], max_length=32))
    assert record["results"][0]["primary"] == pytest.approx(expected, abs=1e-9)
    unprompted = run_sts(data_dir, tmp_path / "n.json", "--model", str(st_export))
    assert "prompt" not in unprompted["model"]  # symmetric tasks take no prompt unless asked
    expected = sts_score(data_dir, lambda texts: reference.encode(texts, max_length=32))
    assert unprompted["results"][0]["primary"] == pytest.approx(expected, abs=1e-9)


def test_an_unknown_prompt_name_is_refused_naming_the_models_prompts(st_export, decoder, data_dir, tmp_path):
    common = ["--data-dir", str(data_dir), "--task", "stsb", "--no-cache", "--output", str(tmp_path / "r.json")]
    result = invoke("sts", "--model", str(st_export), "--prompt", "passage", *common)
    output = " ".join(result.output.split())
    assert result.exit_code == 2 and "--prompt 'passage'" in output and "its prompts are document, query" in output
    assert not (tmp_path / "r.json").exists()
    result = invoke("all", "--model", str(decoder), "--prompt", "query", *common)
    assert result.exit_code == 2 and "has no prompt of that name; it has none" in " ".join(result.output.split())
    with pytest.raises(ValueError, match="its prompts are document, query"):
        resolve_model(st_export).prompt_text("instruction")


def test_adapter_directory_resolves_to_base_and_embeds_like_the_merged_model(lora_export, decoder, tmp_path):
    adapter = lora_export / "lora"
    spec = resolve_model(adapter)
    assert spec.directory == decoder and spec.adapter == adapter
    # pooling, length and prompts of the export the adapter lies in
    assert (spec.pooling, spec.max_length, spec.prompts) == ("last_token", 32, {"query": "query: "})
    assert spec.describe()["adapter"] == str(adapter)
    merged = resolve_model(lora_export)
    assert merged.directory == lora_export and merged.adapter is None
    from_adapter = Embedder(spec, batch_size=2).embed(TEXTS)(TEXTS)
    from_merged = Embedder(merged, batch_size=2).embed(TEXTS)(TEXTS)
    np.testing.assert_allclose(from_adapter, from_merged, atol=1e-5)
    base = resolve_model(decoder, pooling="last_token", max_length=32)
    assert not np.allclose(Embedder(base).embed(TEXTS)(TEXTS), from_adapter, atol=1e-3)  # the adapter matters
    assert len({model_fingerprint(spec), model_fingerprint(merged), model_fingerprint(base)}) == 3

    alone = shutil.copytree(adapter, tmp_path / "alone")  # an adapter outside an export: flags and defaults
    assert resolve_model(alone).pooling == "last_token" and resolve_model(alone).prompts == {}  # a decoder base
    spec_alone = resolve_model(alone, pooling="last_token", max_length=32)
    np.testing.assert_allclose(Embedder(spec_alone).embed(TEXTS)(TEXTS), from_merged, atol=1e-5)
    config = json.loads((alone / "adapter_config.json").read_text())
    (alone / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": str(tmp_path / "x")}))
    with pytest.raises(ValueError, match="trained on .*which is not a directory here"):
        resolve_model(alone)


def test_adapter_fingerprint_covers_the_adapter_weights(lora_export, tmp_path):
    adapter = shutil.copytree(lora_export / "lora", tmp_path / "lora")
    before = model_fingerprint(resolve_model(adapter, pooling="last_token"))
    from safetensors.torch import load_file, save_file

    weights = load_file(str(adapter / "adapter_model.safetensors"))
    save_file({name: tensor * 2 for name, tensor in weights.items()}, str(adapter / "adapter_model.safetensors"))
    assert model_fingerprint(resolve_model(adapter, pooling="last_token")) != before


def test_cache_keys_differ_by_prompt_and_a_second_call_reads_the_cache(st_export, tmp_path):
    spec = resolve_model(st_export)
    first = Embedder(spec, batch_size=2, cache_dir=tmp_path)
    plain = first.embed(TEXTS)(TEXTS)
    prompted = first.embed(TEXTS, "query: ")(TEXTS)  # same cache folder, other keys: encoded, not read
    assert first.stats.encoded == 2 * len(TEXTS) and first.stats.from_cache == 0
    assert not np.allclose(plain, prompted, atol=1e-4)

    second = Embedder(spec, batch_size=2, cache_dir=tmp_path)
    np.testing.assert_array_equal(second.embed(TEXTS, "query: ")(TEXTS), prompted)
    np.testing.assert_array_equal(second.embed(TEXTS)(TEXTS), plain)
    assert second.stats.encoded == 0 and second.stats.from_cache == 2 * len(TEXTS)
    assert second.stats.fingerprint == first.stats.fingerprint  # one folder; the rows tell the prompts apart
    # a row is keyed by what the encoder reads: the prompt and the text
    again = second.embed(["query: " + text for text in TEXTS])
    np.testing.assert_array_equal(again(["query: " + text for text in TEXTS]), prompted)
    assert second.stats.encoded == 0


def test_mteb_gives_queries_and_documents_their_prompts_and_other_calls_the_chosen_one(st_export):
    pytest.importorskip("mteb")
    from mteb.types import PromptType

    from vascl_scale.eval.mteb_runner import ProjectEncoder, model_identity, model_meta, mteb_prompts

    spec = resolve_model(st_export)
    embedder = Embedder(spec, batch_size=2)
    prompts = mteb_prompts(spec)
    assert prompts == {"query": "query: ", "document": "passage: ", "other": ""}
    name, revision, _ = model_identity(spec, "no", prompts)
    encoder = ProjectEncoder(embedder, model_meta(spec, name, revision, prompts), prompts)
    inputs = [{"text": TEXTS[:3]}, {"text": TEXTS[3:]}]

    def encode(prompt_type, chosen=encoder):
        return chosen.encode(inputs, task_metadata=None, hf_split="test", hf_subset="default", prompt_type=prompt_type)

    np.testing.assert_array_equal(encode(PromptType.query), embedder.embed(TEXTS, "query: ")(TEXTS))
    np.testing.assert_array_equal(encode(PromptType.document), embedder.embed(TEXTS, "passage: ")(TEXTS))
    np.testing.assert_array_equal(encode(None), embedder.embed(TEXTS)(TEXTS))
    chosen = mteb_prompts(spec, "query")
    assert chosen["other"] == "query: "
    with_query = ProjectEncoder(embedder, encoder.mteb_model_meta, chosen)
    np.testing.assert_array_equal(encode(None, with_query), embedder.embed(TEXTS, "query: ")(TEXTS))
    assert model_identity(spec, "no", chosen)[1] != revision != model_identity(spec, "no")[1]
    with pytest.raises(ValueError, match="its prompts are document, query"):
        mteb_prompts(spec, "passage")

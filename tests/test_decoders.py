"""Decoder backbones: last-token pooling, EOS and padding, LoRA, prompts, over the exact global batch.

Tiny random decoders of real architectures (Qwen3, Llama) built here, with a byte-level BPE
tokenizer trained in the test that has an EOS token and no pad token, saved as causal LMs: as a
user's Qwen3-style checkpoint looks. What the encoders' tests prove, proven again for them: many
gloo ranks equal one process (float64) with LoRA, cached equals uncached, ZeRO-2 and ZeRO-3
through the real CLI equal DDP when stopped and resumed, and the export loads in transformers,
PEFT and sentence-transformers and embeds as training did.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.gloo import mean_over_ranks, run_on_ranks
from tests.step_helpers import assert_same_call, parameter_gradients
from tests.tiny import DECODER_TEXTS, tiny_decoder_dir, tiny_lora_decoder, token_batch
from vascl_scale.backbone import BackbonePlan, is_decoder, plan_backbone, require_peft, tokenizer_appends_eos
from vascl_scale.config import LossConfig, config_from_dict
from vascl_scale.model import SentenceEncoder

ARCHITECTURES = ("qwen3", "llama")


@pytest.fixture(scope="module")
def decoders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("decoders")
    return {name: tiny_decoder_dir(root / name, name) for name in ARCHITECTURES}


# ------------------------------------------------------------------ pooling, EOS, padding


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_last_token_pooling_equals_each_sentence_alone_with_either_padding_side(decoders, architecture) -> None:
    model = SentenceEncoder.from_pretrained(decoders[architecture], pooling="last_token").double().eval()
    tokenizer = model.tokenizer
    assert model.decoder and tokenizer.pad_token == tokenizer.eos_token  # no pad token: EOS pads
    texts = list(DECODER_TEXTS)
    with torch.no_grad():
        alone = torch.cat([model(**tokenizer([text], return_tensors="pt")) for text in texts])  # (N, d), no padding
        for side in ("right", "left"):
            tokenizer.padding_side = side
            batch = tokenizer(texts, padding=True, return_tensors="pt")
            assert (batch["attention_mask"] == 0).any(), "the batch must hold padding, or this proves nothing"
            torch.testing.assert_close(model(**batch), alone, rtol=1e-9, atol=1e-10, msg=f"{side} padding")
            ends = batch["input_ids"][torch.arange(len(texts)), (batch["attention_mask"].cumsum(1)).argmax(1)]
            assert (ends == tokenizer.eos_token_id).all()  # the pooled token is the appended EOS


def test_the_left_out_lm_head_is_not_reported_but_any_other_key_is(decoders, tmp_path) -> None:
    import logging
    import shutil

    from safetensors.torch import load_file, save_file

    records: list[logging.LogRecord] = []
    collector = logging.Handler(logging.WARNING)
    collector.emit = records.append
    report_logger = logging.getLogger("transformers.modeling_utils")
    report_logger.addHandler(collector)
    try:
        SentenceEncoder.from_pretrained(decoders["qwen3"], pooling="last_token")
        assert not [record for record in records if "LOAD REPORT" in record.getMessage()]
        stray = shutil.copytree(decoders["qwen3"], tmp_path / "stray")
        weights = load_file(str(stray / "model.safetensors"))
        weights["stray.weight"] = torch.zeros(2)
        save_file(weights, str(stray / "model.safetensors"), metadata={"format": "pt"})
        SentenceEncoder.from_pretrained(stray, pooling="last_token")
        assert [record for record in records if "stray.weight" in record.getMessage()]
    finally:
        report_logger.removeHandler(collector)


def test_eos_is_appended_for_last_token_pooling_of_a_decoder_only(decoders) -> None:
    from transformers import AutoConfig

    from tests.tiny import packaged_minilm_dir

    qwen = decoders["qwen3"]
    assert is_decoder(AutoConfig.from_pretrained(qwen)) and is_decoder(AutoConfig.from_pretrained(decoders["llama"]))
    assert not is_decoder(AutoConfig.from_pretrained(str(packaged_minilm_dir())))
    assert tokenizer_appends_eos(SentenceEncoder.from_pretrained(qwen, pooling="last_token").tokenizer)
    assert not tokenizer_appends_eos(SentenceEncoder.from_pretrained(qwen, pooling="mean").tokenizer)
    explicit = SentenceEncoder.from_pretrained(qwen, pooling="last_token", append_eos=False).tokenizer
    assert not tokenizer_appends_eos(explicit) and explicit.pad_token_id == explicit.eos_token_id
    # truncation counts the EOS within max_length
    ids = SentenceEncoder.from_pretrained(qwen, pooling="last_token").tokenizer(
        DECODER_TEXTS[0], truncation=True, max_length=5
    )["input_ids"]
    assert len(ids) == 5 and ids[-1] != ids[0]


def test_bfloat16_weights_keep_float32_heads_and_checkpointing_changes_no_gradient(decoders) -> None:
    from vascl_scale.backbone import lora_config

    qwen = decoders["qwen3"]
    half = SentenceEncoder.from_pretrained(qwen, pooling="last_token", dtype=torch.bfloat16)
    assert {p.dtype for p in half.encoder.parameters()} == {torch.bfloat16}
    assert half.head[0].weight.dtype == torch.float32
    batch = half.tokenizer(list(DECODER_TEXTS), padding=True, return_tensors="pt")
    assert half(**batch).dtype == torch.float32  # pooled into the head's dtype
    gradients = []
    for checkpointing in (False, True):
        torch.manual_seed(0)  # the same LoRA initialisation
        model = SentenceEncoder.from_pretrained(
            qwen, pooling="last_token", lora=lora_config(4, 8.0, 0.0, None), gradient_checkpointing=checkpointing
        )
        model = model.double().train()
        model.head(model(**batch)).square().sum().backward()
        gradients.append({name: p.grad for name, p in model.named_parameters() if p.requires_grad})
    assert any(getattr(module, "gradient_checkpointing", False) for module in model.encoder.modules())
    for name, gradient in gradients[0].items():
        torch.testing.assert_close(gradients[1][name], gradient, msg=f"{name} under gradient checkpointing")


def _model_section(path: Path, **values) -> object:
    return config_from_dict(
        {
            "model": {"path": str(path), **values},
            "data": {"train": "unused.txt"},
            "loss": {"k": 4},
            "train": {"global_batch_size": 8},
        }
    ).model


def test_bad_backbone_settings_are_refused_before_any_worker_naming_the_key(decoders, tmp_path, monkeypatch) -> None:
    from transformers import PreTrainedTokenizerFast

    qwen = decoders["qwen3"]
    with pytest.raises(ValueError, match=r"model\.lora\.r"):
        _model_section(qwen, lora={"r": -1})
    with pytest.raises(ValueError, match=r"model\.prompts.*one of \['anchor', 'positive', 'paired', 'negative'\]"):
        _model_section(qwen, prompts={"query": "q: "})
    with pytest.raises(ValueError, match=r"model\.lora\.target_modules: \['nope'\] is not a linear layer.*q_proj"):
        plan_backbone(_model_section(qwen, lora={"r": 4, "target_modules": ["q_proj", "nope"]}), qwen, "cpu")
    # a tokenizer with neither a pad nor an EOS token cannot pad a batch
    bare = tmp_path / "bare"
    tiny_decoder_dir(bare, "qwen3")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(bare)
    tokenizer.eos_token = None
    tokenizer.save_pretrained(bare)
    with pytest.raises(ValueError, match=r"the tokenizer of .*bare has neither a pad token nor an EOS token"):
        plan_backbone(_model_section(bare, pooling="last_token"), bare, "cpu")
    # without peft, LoRA names the extra that installs it
    monkeypatch.setitem(sys.modules, "peft", None)
    with pytest.raises(ValueError, match=r"pip install 'vascl-scale\[lora\]'"):
        require_peft()
    with pytest.raises(ValueError, match=r"model\.lora\.r > 0 needs the peft library"):
        plan_backbone(_model_section(qwen, lora={"r": 4}), qwen, "cpu")


def test_the_plan_decides_eos_and_dtype_once(decoders) -> None:
    qwen = decoders["qwen3"]
    planned = plan_backbone(_model_section(qwen, pooling="last_token"), qwen, "cpu")
    assert planned == BackbonePlan(decoder=True, append_eos=True, dtype="float32", hidden_size=planned.hidden_size)
    assert planned.hidden_size > 0
    assert plan_backbone(_model_section(qwen, pooling="mean"), qwen, "cpu").append_eos is False
    assert plan_backbone(_model_section(qwen, dtype="bfloat16"), qwen, "cpu").dtype == "bfloat16"


def test_prompts_are_tokenised_before_their_column_and_counted_in_max_length(decoders, tmp_path) -> None:
    from tests.data_helpers import make_paired_shards, paired_rows, take_batches
    from vascl_scale.config import DataConfig
    from vascl_scale.data.loader import build_train_stream

    tokenizer = SentenceEncoder.from_pretrained(decoders["qwen3"], pooling="last_token").tokenizer
    # ids stored with this very tokenizer: a prompted column is tokenised from its text all the same
    shards = make_paired_shards(tmp_path / "pairs", paired_rows(8), shard_size=4, tokenizer=tokenizer, max_length=64)
    prompt = "Instruct: find the passage\nQuery: "
    data = DataConfig(train=str(shards), num_workers=0, shuffle_buffer=0, max_length=64)
    stream = build_train_stream(
        data, tokenizer=tokenizer, per_device_batch_size=4, rank=0, world_size=1, seed=0, prompts={"anchor": prompt}
    )
    (batch,) = take_batches(stream, 1)
    anchors = tokenizer.batch_decode(batch["anchor"]["input_ids"], skip_special_tokens=True)
    positives = tokenizer.batch_decode(batch["positive"]["input_ids"], skip_special_tokens=True)
    assert all(text.startswith(prompt + "anchor ") for text in anchors), anchors
    assert all(text.startswith("positive ") for text in positives), positives
    short = build_train_stream(
        data.model_copy(update={"max_length": 6}), tokenizer=tokenizer, per_device_batch_size=4, rank=0,
        world_size=1, seed=0, prompts={"anchor": prompt},
    )  # fmt: skip
    (cut,) = take_batches(short, 1)
    assert cut["anchor"]["input_ids"].shape[1] == 6  # the prompt's tokens count within max_length
    assert (cut["anchor"]["input_ids"][:, -1] == tokenizer.eos_token_id).all()  # EOS still ends the row


def test_a_mixed_source_may_set_its_own_prompts() -> None:
    config = config_from_dict(
        {
            "model": {"path": "m", "prompts": {"anchor": "a: "}},
            "data": {"train": [{"source": "x.txt", "weight": 1}, {"source": "y.txt", "weight": 1, "prompts": {}}]},
            "loss": {"k": 4},
            "train": {"global_batch_size": 8},
        }
    )
    assert config.data.train[0].prompts is None and config.data.train[1].prompts == {}


# ------------------------------------------------------------------ many ranks equal one process

GLOBAL_BATCH = 12
SEQ_LEN = 7


def _rows(ids: torch.Tensor, mask: torch.Tensor, own: slice, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """This slice's rows, trimmed to its own longest as the loader pads; ``left``: padded on the left."""
    ids, mask = ids[own], mask[own]
    if left:
        ids, mask = ids.flip(1), mask.flip(1)
    longest = int(mask.sum(dim=1).max())
    return (ids[:, -longest:], mask[:, -longest:]) if left else (ids[:, :longest], mask[:, :longest])


def lora_objectives_on_slice(rank: int, world_size: int) -> dict[str, dict[str, np.ndarray]]:
    """VaSCL (left padding) and supervised SimCSE with a hard negative (right padding) on a LoRA
    decoder, this rank's slice; world_size 1 (no process group) is the reference. Loss and every
    trainable gradient (adapters and head) averaged over the ranks, as DDP and ZeRO do."""
    from vascl_scale.losses import build_objective

    model = tiny_lora_decoder(seed=0)
    columns = [token_batch(GLOBAL_BATCH, SEQ_LEN, seed=seed) for seed in (1, 2, 4)]
    rows = GLOBAL_BATCH // world_size
    own = slice(rank * rows, (rank + 1) * rows)
    cases = {
        "vascl": (dict(k=3, temperature=0.1, xi=2.0, eps=3.0, power_iters=2), 2, True),
        "simcse_sup": (dict(temperature=0.1, hard_negative_weight=1.5), 3, False),
    }
    results = {}
    for objective, (loss, views, left) in cases.items():
        model.zero_grad(set_to_none=False)
        built = build_objective(objective, LossConfig(**loss).model_dump())
        embeddings = [model(*_rows(ids, mask, own, left)) for ids, mask in columns[:views]]  # (b, d) each
        out = built(embeddings, model.head, torch.Generator().manual_seed(3))
        out.loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.requires_grad])
        mean_loss = out.loss.detach().clone()
        mean_over_ranks(world_size, grads, mean_loss)
        results[objective] = {"loss": mean_loss.numpy(), "grads": grads.numpy()}
    return results


@pytest.mark.e2e
@pytest.mark.parametrize("world_size", [2, pytest.param(4, marks=pytest.mark.slow)])  # 4 ranks: the slow tier
def test_lora_decoder_many_ranks_equal_one_process(world_size: int) -> None:
    reference = lora_objectives_on_slice(0, 1)
    model = tiny_lora_decoder(seed=0)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name or name.startswith("head.") for name in trainable), trainable
    for rank, got in enumerate(run_on_ranks(lora_objectives_on_slice, world_size)):
        for objective, expected in reference.items():
            assert abs(expected["grads"]).max() > 0  # gradients that flow, or equality proves nothing
            for key in ("loss", "grads"):
                torch.testing.assert_close(
                    torch.from_numpy(got[objective][key]), torch.from_numpy(expected[key]),
                    msg=lambda m: f"{objective} {key}, rank {rank} of {world_size}: {m}",
                )  # fmt: skip


# ------------------------------------------------------------------ cached equals uncached


def _lora_step(objective: str, chunk_size: int, lora_dropout: float, fsdp=None, sgd: bool = False):
    """A TrainingStep over the LoRA decoder, as tests/step_helpers.step_parts builds one over BERT
    (``fsdp``: the decoder sharded by these FSDP2 settings; ``sgd``: plain SGD, lr 0.5, for AdamW)."""
    from tests.step_helpers import GLOBAL_BATCH as STEP_BATCH
    from tests.step_helpers import RecordingObjective
    from vascl_scale.train.step import TrainingStep
    from vascl_scale.train.trainer import build_accelerator, build_optimizer, prepare_for_training

    config = config_from_dict(
        {
            "objective": objective,
            "model": {"path": "tiny", "head_dim": 8, "pooling": "last_token", "lora": {"r": 4}},
            "data": {"train": "fixed batches"},
            "loss": {"k": 3, "temperature": 0.1, "xi": 1.0, "eps": 1.0, "power_iters": 2},
            "train": {"global_batch_size": STEP_BATCH, "precision": "no", "seed": 5, "chunk_size": chunk_size},
        }
    )
    model = tiny_lora_decoder(seed=0, lora_dropout=lora_dropout)
    model.train()
    accelerator = build_accelerator(config, None, "no")
    if fsdp is not None:
        from vascl_scale.train.fsdp import shard_model

        shard_model(model, fsdp, "no", accelerator.device)
    rows = config.per_device_batch_size(accelerator.num_processes)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5) if sgd else build_optimizer(model, config)
    prepared, optimizer = prepare_for_training(accelerator, model, optimizer, config.train, rows)
    recorder = RecordingObjective(objective, config.loss)
    step = TrainingStep(
        accelerator, prepared, optimizer, recorder, seed=5, per_device_batch=rows, chunk_size=chunk_size
    )
    return model, step, recorder


def lora_cached_calls(
    rank: int, world_size: int, lora_dropout: float, modes: tuple[str, ...], narrower_negative: bool = True
) -> dict:
    """VaSCL, and supervised SimCSE with a hard-negative column narrower than the anchor (or, with
    ``narrower_negative`` False, SimCSE on pairs: columns of one width) on the LoRA decoder, one
    loss call and its backward in each mode."""
    from tests.step_helpers import CHUNK, call_and_backward, own_batch, portable, same_mask_reference

    results = {}
    second = ("simcse_sup", 1) if narrower_negative else ("simcse", 0)
    for objective, negatives in (("vascl", 0), second):
        for mode in modes:
            model, step, recorder = _lora_step(objective, 0 if mode == "uncached" else CHUNK, lora_dropout)
            batch = own_batch(rank, world_size, positive=objective != "vascl", negatives=negatives)
            if mode == "same_masks":
                out = same_mask_reference(step, batch, 0)
            else:
                out = call_and_backward(step, batch, mode)
            results[objective, mode] = {
                "loss": out.loss.detach(),
                "gradients": parameter_gradients(model),
                "recorded": recorder.calls,
            }
    return portable(results)


@pytest.mark.e2e
@pytest.mark.parametrize("world_size", [pytest.param(1, marks=pytest.mark.slow), 2])  # 1 rank: the slow tier
def test_lora_decoder_cached_equals_uncached(world_size: int) -> None:
    from tests.gloo import run_as_launched

    for rank, got in enumerate(run_as_launched(lora_cached_calls, world_size, 0.0, ("uncached", "cached"))):
        for objective in ("vascl", "simcse_sup"):
            what = f"{objective}, rank {rank} of {world_size}"
            assert_same_call(got[objective, "cached"], got[objective, "uncached"], what)


def lora_fsdp_and_ddp_steps(rank: int, world_size: int) -> dict:
    """VaSCL and supervised SimCSE (a narrower hard negative) on the LoRA decoder, uncached and
    cached: one optimiser step (SGD) under DDP and under FSDP2 full_shard, the loss and the
    trainable parameters (adapters, head) after it, whole."""
    from tests.step_helpers import CHUNK, own_batch, portable
    from vascl_scale.config import FsdpConfig

    results = {}
    for objective, negatives in (("vascl", 0), ("simcse_sup", 1)):
        for mode, chunk_size in (("uncached", 0), ("cached", CHUNK)):
            for engine, fsdp in (("ddp", None), ("fsdp", FsdpConfig())):
                model, step, _ = _lora_step(objective, chunk_size, 0.0, fsdp, sgd=True)
                batch = own_batch(rank, world_size, positive=objective != "vascl", negatives=negatives)
                result = step(iter([batch]), 0)
                trainable = {
                    name: getattr(p, "full_tensor", lambda p=p: p)().detach().clone()
                    for name, p in model.named_parameters()
                    if p.requires_grad
                }
                results[objective, mode, engine] = {"loss": result.terms["loss"], "trainable": trainable}
    return portable(results)


@pytest.mark.e2e
def test_lora_decoder_under_fsdp2_takes_the_ddp_step() -> None:
    from tests.gloo import run_as_launched

    initial = {name: p.detach() for name, p in tiny_lora_decoder(seed=0).named_parameters() if p.requires_grad}
    for rank, got in enumerate(run_as_launched(lora_fsdp_and_ddp_steps, 2)):
        for objective in ("vascl", "simcse_sup"):
            for mode in ("uncached", "cached"):
                ddp, fsdp = got[objective, mode, "ddp"], got[objective, mode, "fsdp"]
                what = f"{objective}, {mode}, rank {rank}"
                torch.testing.assert_close(fsdp["loss"], ddp["loss"], rtol=1e-12, atol=1e-12, msg=what)
                assert sorted(fsdp["trainable"]) == sorted(initial), what  # adapters and head alone train
                for name, value in ddp["trainable"].items():
                    assert not torch.equal(torch.as_tensor(value), initial[name]), f"{what}: {name} did not move"
                    torch.testing.assert_close(
                        fsdp["trainable"][name], value, rtol=1e-9, atol=1e-11, msg=lambda m, n=name: f"{what}, {n}: {m}"
                    )


@pytest.mark.e2e
def test_lora_dropout_is_replayed_by_the_cached_step() -> None:
    from tests.gloo import run_as_launched

    # Columns of one width: the reference encodes the chunks as they come (the cached step widens narrower ones).
    (got,) = run_as_launched(lora_cached_calls, 1, 0.2, ("same_masks", "cached"), False)
    for objective in ("vascl", "simcse"):
        assert_same_call(got[objective, "cached"], got[objective, "same_masks"], f"{objective}, LoRA dropout 0.2")


# ------------------------------------------------------------------ the real CLI: engines, resume, export


@pytest.fixture(scope="module")
def decoder_workspace(decoders, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.train_helpers import write_dev_tsv, write_triplets

    root = tmp_path_factory.mktemp("decoder-runs")
    write_triplets(root)
    write_dev_tsv(root / "dev.tsv")
    return root


PROMPTS = {"anchor": "Instruct: retrieve a paraphrase\nQuery: "}


def _decoder_config(decoders, workspace: Path, path: Path) -> Path:
    from tests.train_helpers import write_config

    config = write_config(
        workspace, path, "simcse_sup",
        model={"path": str(decoders["qwen3"]), "head_dim": 16, "pooling": "last_token",
               "lora": {"r": 4, "alpha": 16}, "prompts": PROMPTS},
        # The tiny tokenizer spells the prompt in 36 tokens (EOS counted): the texts keep theirs.
        data={"max_length": 56},
        train={"chunk_size": 3, "max_steps": 4},
        eval={"every_steps": 0},  # the engines' weights are compared, not dev scores: no export per evaluation
    )  # fmt: skip
    return config


@pytest.fixture(scope="module")
def decoder_ddp_run(decoders, decoder_workspace: Path) -> Path:
    from tests.train_helpers import run_train

    config = _decoder_config(decoders, decoder_workspace, decoder_workspace / "ddp.yaml")
    run_train(config, decoder_workspace / "ddp", "--num-processes", "2")
    return decoder_workspace / "ddp"


def _adapter_and_head(run: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    weights = load_file(str(run / "final" / "lora" / "adapter_model.safetensors"))
    weights.update({f"head.{k}": v for k, v in load_file(str(run / "final" / "head.safetensors")).items()})
    weights.update({f"merged.{k}": v for k, v in load_file(str(run / "final" / "model.safetensors")).items()})
    return weights


# (engine, its option, its file under the repository): ZeRO-2/3, and FSDP2 (its units: the decoder's layers).
# All in the slow tier: in CI, the GPU proof's dry run trains the decoder recipe (LoRA, cached,
# ZeRO-3) on 2 ranks, and the launched gloo tests above prove the LoRA step under DDP and FSDP2.
LORA_ENGINES = [
    pytest.param("zero2", "--deepspeed", "configs/deepspeed/zero2.json", marks=pytest.mark.deepspeed, id="zero2"),
    pytest.param("zero3", "--deepspeed", "configs/deepspeed/zero3.json", marks=pytest.mark.deepspeed, id="zero3"),
    pytest.param("fsdp", "--fsdp", "configs/fsdp/full-shard.yaml", id="fsdp2"),
]


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("engine, option, path", LORA_ENGINES)
def test_sharded_engines_stopped_and_resumed_equal_ddp_with_lora(
    decoders, decoder_workspace, decoder_ddp_run, tmp_path, engine, option, path
):
    from tests.train_helpers import REPO, run_train

    engine_file = str(REPO / path)
    config = _decoder_config(decoders, decoder_workspace, tmp_path / "config.yaml")
    run = tmp_path / "run"
    first = run_train(config, run, "--num-processes", "2", option, engine_file, "--max-steps", "2", timeout=420)
    if engine == "fsdp":
        assert "FSDP2 full_shard over 2 ranks: 2 units (Qwen3DecoderLayer)" in first.stderr
    run_train(config, run, "--num-processes", "2", option, engine_file, "--resume", timeout=300)
    ours, reference = _adapter_and_head(run), _adapter_and_head(decoder_ddp_run)
    assert sorted(ours) == sorted(reference)
    for name, value in reference.items():
        torch.testing.assert_close(ours[name], value, atol=1e-6, rtol=0, msg=f"{engine}: {name} differs from DDP")
    summary = json.loads((run / "run_summary.json").read_text())
    assert summary["resumed_at_step"] == 2 and summary["engine"] == ("fsdp" if engine == "fsdp" else "deepspeed")
    assert summary["zero_stage"] == {"zero2": 2, "zero3": 3, "fsdp": 0}[engine]
    assert 0 < summary["parameters"]["trainable"] < summary["parameters"]["total"]


@pytest.mark.e2e
def test_the_lora_export_loads_everywhere_and_embeds_as_training_did(decoder_ddp_run: Path) -> None:
    from peft import PeftModel
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel

    from vascl_scale.model import last_token_pool

    final = decoder_ddp_run / "final"
    adapter = final / "lora"
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in adapter.iterdir()}
    from safetensors.torch import load_file

    assert not [key for key in load_file(str(final / "model.safetensors")) if "lora" in key]  # merged: plain weights
    texts = list(DECODER_TEXTS)
    query = PROMPTS["anchor"]
    # what training embeds: the model as trained (base + adapters), prompt and EOS through its tokenizer
    trained = SentenceEncoder.from_pretrained(
        json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"],
        pooling="last_token",
        adapter=adapter,
    ).eval()
    expected = trained.encode([query + text for text in texts], max_length=32)  # the export's eval.max_length
    # sentence-transformers, no peft involved: the merged weights, its query prompt from the export
    st = SentenceTransformer(str(final), device="cpu")
    assert st.prompts["query"] == query
    np.testing.assert_allclose(st.encode(texts, prompt_name="query"), expected, atol=1e-5)
    # transformers and PEFT: the base model with the adapter, the export's tokenizer (it appends EOS)
    base = AutoModel.from_pretrained(
        json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"]
    )
    peft_model = PeftModel.from_pretrained(base, str(adapter)).eval()
    batch = st.tokenizer(
        [query + text for text in texts], padding=True, truncation=True, max_length=32, return_tensors="pt"
    )
    assert (
        batch["input_ids"][torch.arange(len(texts)), batch["attention_mask"].sum(1) - 1] == st.tokenizer.eos_token_id
    ).all()
    with torch.no_grad():
        hidden = peft_model(**batch).last_hidden_state
    np.testing.assert_allclose(last_token_pool(hidden, batch["attention_mask"]).numpy(), expected, atol=1e-5)
    card = (final / "README.md").read_text(encoding="utf-8")
    assert "| LoRA | rank 4, alpha 16, dropout 0 on every linear layer" in card
    assert 'prompt_name="query"' in card and "last_token-pooled embeddings" in card
    merged = AutoModel.from_pretrained(str(final))
    with torch.no_grad():
        np.testing.assert_allclose(
            last_token_pool(merged(**batch).last_hidden_state, batch["attention_mask"]).numpy(), expected, atol=1e-5
        )

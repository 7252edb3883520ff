"""Export a trained encoder as a Hugging Face model directory that sentence-transformers loads.

The directory holds the encoder (``config.json``, ``model.safetensors``), the tokenizer, the
sentence-transformers module files (Transformer -> Pooling, no normalisation, so the
embeddings equal :meth:`SentenceEncoder.encode`) and, beside them, the projection head in
``head.safetensors`` (never inside the encoder weights). ``AutoModel.from_pretrained(dir)``,
``SentenceTransformer(dir)`` and ``SentenceEncoder.from_pretrained(dir)`` all load it.

Under ZeRO-3 the parameters are sharded; ``accelerator.get_state_dict`` gathers the full
state on rank 0 (the DeepSpeed config must set ``stage3_gather_16bit_weights_on_model_save``).
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from safetensors.torch import save_file

logger = logging.getLogger(__name__)


def sentence_transformers_files(directory: Path, hidden_size: int, pooling: str, max_seq_length: int) -> None:
    """modules.json, sentence_bert_config.json and 1_Pooling/config.json for ``directory``."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    (directory / "modules.json").write_text(json.dumps(modules, indent=2), encoding="utf-8")
    settings = {"max_seq_length": max_seq_length, "do_lower_case": False}
    (directory / "sentence_bert_config.json").write_text(json.dumps(settings, indent=2), encoding="utf-8")
    pooling_config = {
        "word_embedding_dimension": hidden_size,
        "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_mean_tokens": pooling == "mean",
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
    }
    (directory / "1_Pooling").mkdir(exist_ok=True)
    (directory / "1_Pooling" / "config.json").write_text(json.dumps(pooling_config, indent=2), encoding="utf-8")


def export_model(accelerator, model, target: Path, max_seq_length: int) -> None:
    """Write ``target`` atomically from the (possibly wrapped) model; all ranks call this."""
    state = accelerator.get_state_dict(model)  # full state on the main process (ZeRO-3 gathers)
    if accelerator.is_main_process:
        encoder_module = accelerator.unwrap_model(model)
        encoder_state = {k.removeprefix("encoder."): v.contiguous() for k, v in state.items() if k.startswith("encoder.")}
        head_state = {k.removeprefix("head."): v.contiguous() for k, v in state.items() if k.startswith("head.")}
        target = Path(target)
        staging = target.parent / f".tmp-{target.name}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        encoder_module.encoder.save_pretrained(str(staging), state_dict=encoder_state, safe_serialization=True)
        encoder_module.tokenizer.save_pretrained(str(staging))
        save_file(head_state, str(staging / "head.safetensors"))
        sentence_transformers_files(staging, encoder_module.hidden_size, encoder_module.pooling, max_seq_length)
        # Replace the previous export only once the new one is complete.
        previous = target.parent / f".old-{target.name}"
        if target.exists():
            shutil.rmtree(previous, ignore_errors=True)
            target.rename(previous)
        staging.rename(target)
        shutil.rmtree(previous, ignore_errors=True)
        logger.info("exported %s", target)
    accelerator.wait_for_everyone()

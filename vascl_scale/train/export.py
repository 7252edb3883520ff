"""Export a trained encoder as a Hugging Face model directory that sentence-transformers loads.

A LoRA run's export holds the merged backbone (loads with no peft installed) and, in ``lora/``,
the adapter in PEFT's format with the tokenizer, whose ``base_model_name_or_path`` is the
backbone trained on (``PeftModel.from_pretrained(AutoModel.from_pretrained(base), dir/lora)``),
a local one as its absolute path, recorded with its digest in ``lora/base_model.json``
(:func:`vascl_scale.backbone.save_adapter`), which loading the adapter checks.

The directory holds the encoder (``config.json``, ``model.safetensors``), the tokenizer, the
sentence-transformers module files (Transformer -> Pooling, no normalisation, so the
embeddings equal :meth:`SentenceEncoder.encode`) and, beside them, the projection head in
``head.safetensors`` and a PairSupCon run's pairwise classifier in ``classifier.safetensors``
(never inside the encoder weights), and the model card (``README.md``, rendered from
``model_card.json``: :mod:`vascl_scale.model_card`). ``AutoModel.from_pretrained(dir)``,
``SentenceTransformer(dir)`` and ``SentenceEncoder.from_pretrained(dir)`` all load it.

Under ZeRO-3 the parameters are sharded; ``accelerator.get_state_dict`` gathers the full
state on rank 0 (the DeepSpeed config must set ``stage3_gather_16bit_weights_on_model_save``).
Under FSDP2 :func:`vascl_scale.train.fsdp.full_state_dict` gathers every shard on rank 0 in
CPU memory; the backbone is saved as its own class (``BertModel``, not FSDP2's subclass).
"""

from __future__ import annotations

import logging
from pathlib import Path

from safetensors.torch import save_file

from vascl_scale.backbone import LORA_DIR, lora_copy, save_adapter
from vascl_scale.fs import replace_directory, staging_directory
from vascl_scale.model import CLASSIFIER_FILE
from vascl_scale.model_card import CardFacts, write_model_card
from vascl_scale.sentence_transformers_format import write_sentence_transformers_files
from vascl_scale.train.fsdp import full_state_dict, is_sharded

logger = logging.getLogger(__name__)


def _submodule_state(state: dict, name: str) -> dict:
    """The entries of submodule ``name`` in a model's state, named as in the submodule."""
    prefix = f"{name}."
    return {key.removeprefix(prefix): value.contiguous() for key, value in state.items() if key.startswith(prefix)}


def export_model(
    accelerator, model, target: Path, max_seq_length: int, card: CardFacts, prompts: dict[str, str] | None = None
) -> None:
    """Write ``target`` atomically from the (possibly wrapped) model, with the card of ``card``
    and the query / document ``prompts`` of sentence-transformers (:func:`export_prompts`); all ranks call this."""
    # The full state on the main process: ZeRO-3 and FSDP2 gather their shards.
    state = full_state_dict(model) if is_sharded(model) else accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        encoder_module = accelerator.unwrap_model(model)
        encoder_state, head_state, classifier_state = (
            _submodule_state(state, name) for name in ("encoder", "head", "classifier")
        )
        target = Path(target)
        staging = staging_directory(target)
        if is_lora(encoder_module.encoder):
            _save_lora(encoder_module.encoder, encoder_module.tokenizer, encoder_state, staging)
        else:
            encoder_module.encoder.save_pretrained(str(staging), state_dict=encoder_state, safe_serialization=True)
        encoder_module.tokenizer.save_pretrained(str(staging))
        save_file(head_state, str(staging / "head.safetensors"))
        if classifier_state:
            save_file(classifier_state, str(staging / CLASSIFIER_FILE))
        write_sentence_transformers_files(
            staging, encoder_module.hidden_size, encoder_module.pooling, max_seq_length, prompts or {}
        )
        write_model_card(staging, card)
        replace_directory(staging, target)  # the previous export goes only once the new one is complete
        logger.info("exported %s", target)
    accelerator.wait_for_everyone()


def is_lora(encoder) -> bool:
    """Whether the backbone is wrapped by peft (``model.lora.r`` > 0)."""
    return hasattr(encoder, "peft_config")


def _save_lora(encoder, tokenizer, encoder_state: dict, staging: Path) -> None:
    """The merged backbone in ``staging`` (loads without peft) and the adapter in PEFT's format in
    ``staging/lora`` (adapter_config.json, adapter_model.safetensors; the tokenizer beside it),
    both from a CPU copy rebuilt from the gathered state, so the training model stays as it is."""
    copy = lora_copy(encoder, encoder_state)
    adapter_dir = staging / LORA_DIR
    save_adapter(copy, adapter_dir)
    tokenizer.save_pretrained(str(adapter_dir))
    merged = copy.merge_and_unload()
    merged.save_pretrained(str(staging), safe_serialization=True)

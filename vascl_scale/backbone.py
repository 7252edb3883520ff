"""What a backbone is and how it is made ready to embed: encoder or decoder, padding, EOS, weights, LoRA.

The encoders of the paper (BERT, RoBERTa) and the decoder LLMs fine-tuned as embedders today
(Qwen2/Qwen3, Llama, Mistral, Gemma; e5-mistral, GritLM, gte-Qwen, Qwen3-Embedding) load through
the same ``AutoModel`` call: a checkpoint saved as ``*ForCausalLM`` gives its base model, the LM
head left out. What differs is decided here, once:

- **decoder or encoder** (:func:`is_decoder`): from the checkpoint's architectures
  (``*ForCausalLM``) or, for a base model saved alone, a model type that has a causal LM and no
  masked LM in transformers' registries;
- **padding**: a tokenizer without a pad token pads with its EOS token, as these embedders do
  (the vocabulary is never resized); the attention mask keeps padding out of attention and
  pooling, so either padding side works (:func:`prepare_tokenizer`);
- **EOS** (``model.append_eos``, :func:`append_eos_default`): last-token pooling reads the state
  of a token that has seen the whole text; a decoder's tokenizer that appends no EOS of its own
  gets a post-processor that does, saved with the tokenizer, so every loader of an export
  (transformers, sentence-transformers, ``vascl-scale eval``) embeds what training embedded;
- **weights' dtype** (``model.dtype``, :func:`resolve_dtype`);
- **LoRA** (``model.lora``, :func:`apply_lora`) through the ``peft`` library, injected before the
  engine wraps the model, so DDP and ZeRO see only the adapters as trainable encoder parameters.
"""

from __future__ import annotations

import copy
import json
import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vascl_scale.packing import packs_natively

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
ALL_LINEAR = "all-linear"  # peft's name for every linear layer but the output layer
PROBE_TEXT = "a probe sentence"
LORA_DIR = "lora"  # the adapter beside a merged export: <export>/lora/


def is_decoder(config) -> bool:
    """Whether a transformers config describes a decoder-only LM (last-token pooling's backbone)."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    architectures = getattr(config, "architectures", None) or []
    if any(name.endswith("ForCausalLM") for name in architectures):
        return True
    if any(name.endswith(("ForMaskedLM", "ForPreTraining")) for name in architectures):
        return False
    # BERT and RoBERTa also have causal-LM heads; a decoder has no masked-LM one.
    model_type = getattr(config, "model_type", "")
    return model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES


class _LMHeadLeftOut(logging.Filter):
    """Drops transformers' load report when all it reports is the LM head a ``*ForCausalLM``
    checkpoint holds and ``AutoModel`` leaves out, by design (one warning per rank otherwise); a
    report of any other key still shows."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if "LOAD REPORT" not in text:
            return True
        rows = [line.split("|") for line in text.splitlines() if line.count("|") >= 2]
        flagged = [row for row in rows if row[1].strip() and row[1].strip() != "Status"]
        return not flagged or not all(
            row[0].strip().startswith("lm_head.") and row[1].strip() == "UNEXPECTED" for row in flagged
        )


@contextmanager
def lm_head_left_out() -> Iterator[None]:
    """While loading a base model from a causal-LM checkpoint: no report of its unused LM head."""
    report_logger = logging.getLogger("transformers.modeling_utils")
    quiet = _LMHeadLeftOut()
    report_logger.addFilter(quiet)
    try:
        yield
    finally:
        report_logger.removeFilter(quiet)


def tokenizer_appends_eos(tokenizer) -> bool:
    """Whether the tokenizer ends an encoded text with its EOS token by itself."""
    if tokenizer.eos_token_id is None:
        return False
    ids = tokenizer(PROBE_TEXT)["input_ids"]
    return bool(ids) and ids[-1] == tokenizer.eos_token_id


def append_eos_default(pooling: str, decoder: bool, tokenizer) -> bool:
    """``model.append_eos`` unset: on for last-token pooling of a decoder whose tokenizer does not
    append EOS itself (its last token would otherwise be the text's last word piece)."""
    return pooling == "last_token" and decoder and not tokenizer_appends_eos(tokenizer)


def prepare_tokenizer(tokenizer, append_eos: bool, where: str | Path) -> Any:
    """``tokenizer`` made ready to embed with, in place: a pad token (its EOS token when it has
    none) and, with ``append_eos``, a post-processor that ends every text with EOS. ``where``
    names the model in errors."""
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise ValueError(
                f"the tokenizer of {where} has neither a pad token nor an EOS token, so batches cannot be padded; "
                "give it one (tokenizer.pad_token = ...; tokenizer.save_pretrained(DIR))"
            )
        tokenizer.pad_token = tokenizer.eos_token  # the vocabulary stays as it is: the mask hides padding
    if append_eos and not tokenizer_appends_eos(tokenizer):
        _append_eos(tokenizer, where)
    return tokenizer


def _append_eos(tokenizer, where: str | Path) -> None:
    """Chain a post-processor that appends EOS after the tokenizer's own (BOS templates are kept).
    It is saved in tokenizer.json, and truncation leaves room for it (max_length counts it)."""
    from tokenizers import processors

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or tokenizer.eos_token_id is None:
        raise ValueError(
            f"model.append_eos: the tokenizer of {where} is not a fast tokenizer with an EOS token; "
            "set model.append_eos: false, or use a fast tokenizer (tokenizer.json)"
        )
    eos = tokenizer.eos_token
    template = processors.TemplateProcessing(
        single=f"$A {eos}", pair=f"$A {eos} $B:1 {eos}:1", special_tokens=[(eos, tokenizer.eos_token_id)]
    )
    own = backend.post_processor
    backend.post_processor = template if own is None else processors.Sequence([own, template])
    assert tokenizer_appends_eos(tokenizer), where


def resolve_dtype(requested: str, checkpoint_dtype: Any, device_type: str) -> str:
    """``model.dtype`` resolved: ``float32`` or ``bfloat16``. ``auto`` keeps a bfloat16 checkpoint
    in bfloat16 where ``device_type`` computes in it natively, else loads float32."""
    from vascl_scale.precision import has_native_bf16

    if requested != "auto":
        return requested
    saved = str(checkpoint_dtype).removeprefix("torch.") if checkpoint_dtype is not None else "float32"
    return "bfloat16" if saved == "bfloat16" and has_native_bf16(device_type) else "float32"


def require_peft():
    """The ``peft`` module, or a ValueError naming the extra that installs it."""
    try:
        import peft
    except ImportError:
        raise ValueError(
            "model.lora.r > 0 needs the peft library: pip install 'vascl-scale[lora]' (or pip install peft), "
            "or set model.lora.r: 0 for full fine-tuning"
        ) from None
    return peft


def linear_module_names(module: nn.Module) -> set[str]:
    """Last name parts of every ``nn.Linear`` in ``module`` (what a LoRA ``target_modules`` list names)."""
    return {name.rsplit(".", 1)[-1] for name, child in module.named_modules() if isinstance(child, nn.Linear)}


def check_target_modules(targets: list[str] | None, encoder: nn.Module, key: str = "model.lora.target_modules") -> None:
    """ValueError naming ``key`` when a target is no linear layer of ``encoder``."""
    if targets is None:
        return
    available = linear_module_names(encoder)
    unknown = [name for name in targets if name not in available]
    if unknown:
        raise ValueError(
            f"{key}: {unknown} {'is' if len(unknown) == 1 else 'are'} not a linear layer of the backbone; "
            f"its linear layers are {sorted(available)} (leave the key out for all of them)"
        )


def lora_config(r: int, alpha: float, dropout: float, target_modules: list[str] | None):
    """peft's ``LoraConfig`` of a feature-extraction model (the backbone has no LM head)."""
    peft = require_peft()
    return peft.LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=list(target_modules) if target_modules is not None else ALL_LINEAR,
        task_type=peft.TaskType.FEATURE_EXTRACTION,
    )


def lora_config_of(section):
    """peft's ``LoraConfig`` of the ``model.lora`` section, or None when r = 0 (full fine-tuning)."""
    if section.r == 0:
        return None
    return lora_config(section.r, section.alpha, section.dropout, section.target_modules)


@contextmanager
def _quiet_peft() -> Iterator[None]:
    """peft reads transformers' deprecated ``is_gradient_checkpointing``: a FutureWarning in every
    process that only those libraries can act on."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def apply_lora(encoder: nn.Module, config) -> nn.Module:
    """``encoder`` wrapped by peft with LoRA adapters (``config``: :func:`lora_config`); only the
    adapters train. Adapters are kept in float32 over bfloat16 weights (peft's autocast_adapter_dtype)."""
    peft = require_peft()
    with _quiet_peft():
        return peft.get_peft_model(encoder, config)


def merge_adapter(encoder: nn.Module, adapter: Path) -> nn.Module:
    """``encoder`` with the PEFT adapter in directory ``adapter`` merged into its weights (no peft wrapper left)."""
    peft = require_peft()
    with _quiet_peft():
        return peft.PeftModel.from_pretrained(encoder, str(adapter)).merge_and_unload()


def lora_copy(encoder, encoder_state: dict) -> nn.Module:
    """The peft-wrapped ``encoder`` rebuilt on the CPU from its full state (the export's copy: the
    training model, wrapped and perhaps sharded, is never changed; peft's ``merge_and_unload``
    works in place). The base class is called directly, not through ``from_config``, which under
    ZeRO-3 would build it partitioned across ranks while only rank 0 exports."""
    base, config = encoder.get_base_model(), encoder.peft_config["default"]
    dtype = next(iter(encoder_state.values())).dtype
    rebuilt = apply_lora(type(base)(base.config).to(dtype), copy.deepcopy(config))
    rebuilt.peft_config["default"].base_model_name_or_path = config.base_model_name_or_path  # the backbone trained on
    missing, unexpected = rebuilt.load_state_dict(encoder_state, strict=False)
    assert not missing and not unexpected, (missing[:5], unexpected[:5])
    return rebuilt


def adapter_base_path(directory: Path) -> str | None:
    """The base model an adapter directory was trained on (``adapter_config.json``), or None when
    ``directory`` holds no adapter."""
    config_file = directory / "adapter_config.json"
    if not config_file.is_file():
        return None
    base = json.loads(config_file.read_text(encoding="utf-8")).get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{config_file} names no base model (base_model_name_or_path); cannot load the adapter")
    return str(base)


@dataclass(frozen=True)
class BackbonePlan:
    """A backbone's settings, decided once before any worker starts (:func:`plan_backbone`)."""

    decoder: bool
    append_eos: bool
    dtype: str  # float32 or bfloat16
    packed: bool = False  # rows encoded unpadded (vascl_scale.packing)
    hidden_size: int = 0  # d, the pooled embedding's width (the config's hidden_size; 0 where it names none)


def plan_backbone(model_config, directory: Path, device_type: str) -> BackbonePlan:
    """Check ``model`` (:class:`vascl_scale.config.ModelConfig`) against the checkpoint in
    ``directory`` and decide what it leaves open: a ValueError for a tokenizer that cannot pad
    or append EOS (:func:`prepare_tokenizer`), a missing ``peft``, a LoRA target that is no linear layer."""
    from transformers import AutoConfig, AutoModel

    from vascl_scale.tokenizer import load_tokenizer

    trust = model_config.trust_remote_code
    hf_config = AutoConfig.from_pretrained(str(directory), trust_remote_code=trust)
    tokenizer = load_tokenizer(directory, trust_remote_code=trust)
    decoder = is_decoder(hf_config)
    append_eos = model_config.append_eos
    if append_eos is None:
        append_eos = append_eos_default(model_config.pooling, decoder, tokenizer)
    prepare_tokenizer(tokenizer, append_eos, directory)  # what every worker does to it: its refusals, once, here
    lora = model_config.lora
    if lora.r > 0:
        require_peft()
        with torch.device("meta"):  # the module names without allocating any weight
            skeleton = AutoModel.from_config(hf_config, trust_remote_code=trust)
        check_target_modules(lora.target_modules, skeleton)
    dtype = resolve_dtype(model_config.dtype, getattr(hf_config, "dtype", None), device_type)
    packed = model_config.packed
    if packed == "auto":
        packed = packs_natively(model_config.attn_implementation)
    elif packed and not packs_natively(model_config.attn_implementation):
        logger.info(
            "model.packed: true with attention %s: each row still attends only to itself, through a dense "
            "mask over the packed tokens (exact, not faster; flash_attention_2 packs natively)",
            model_config.attn_implementation or "by transformers' default",
        )
    hidden_size = int(getattr(hf_config, "hidden_size", 0) or 0)
    return BackbonePlan(
        decoder=decoder, append_eos=bool(append_eos), dtype=dtype, packed=bool(packed), hidden_size=hidden_size
    )

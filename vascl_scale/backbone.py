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
import functools
import hashlib
import json
import logging
import math
import pickle
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vascl_scale.config.schema import MAX_LORA_RANK
from vascl_scale.fs import file_sha256
from vascl_scale.log import shown
from vascl_scale.packing import packs_natively

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
ALL_LINEAR = "all-linear"  # peft's name for every linear layer but the output layer
PROBE_TEXT = "a probe sentence"
LORA_DIR = "lora"  # the adapter beside a merged export: <export>/lora/
ADAPTER_CONFIG = "adapter_config.json"  # PEFT's files in an adapter directory
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_PICKLE = "adapter_model.bin"  # what peft wrote before safetensors
BASE_RECORD = "base_model.json"  # beside an exported adapter: its base's absolute path and digest


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


def _targeted_linears(module: nn.Module, targets: str | list[str] | None) -> dict[str, nn.Linear]:
    """The linear layers of ``module`` a LoRA ``target_modules`` adapts, by full name, as peft
    matches them: every one (None, peft's ``all-linear``), those whose full name matches a
    regular expression (a string), or those whose name ends in a listed name (``q_proj``; an
    adapter peft saved lists full names, ``layers.0.self_attn.q_proj``)."""
    linears = {name: child for name, child in module.named_modules() if isinstance(child, nn.Linear)}
    if targets is None or targets == ALL_LINEAR:
        return linears
    if isinstance(targets, str):
        return {name: child for name, child in linears.items() if re.fullmatch(targets, name)}
    return {
        name: child
        for name, child in linears.items()
        if any(name == target or name.endswith(f".{target}") for target in targets)
    }


def check_lora_rank(r: int, module: nn.Module, targets: str | list[str] | None, key: str) -> None:
    """ValueError naming ``key`` when rank ``r`` exceeds the narrowest linear layer LoRA adapts:
    an update B A of a (out x in) weight has rank at most min(in, out), so a larger r adds only
    parameters and memory (B: out x r, A: r x in), none of which the update can use."""
    linears = _targeted_linears(module, targets)
    if not linears:
        return  # no layer to adapt: peft names the targets that match nothing
    name, narrowest = min(linears.items(), key=lambda item: min(item[1].in_features, item[1].out_features))
    width = min(narrowest.in_features, narrowest.out_features)
    if r > width:
        raise ValueError(
            f"{key} = {r} exceeds the rank an update of the backbone's adapted layers can have: the narrowest, "
            f"{name} ({narrowest.in_features} -> {narrowest.out_features}), is {width} wide; choose r <= {width}"
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


def base_digest(directory: Path) -> str:
    """sha256 of what a merged adapter's weights depend on in a base model directory: its
    config.json and its weights files (name and content of each)."""
    files = [directory / "config.json", *sorted(directory.glob("model*.safetensors"))]
    files += sorted(directory.glob("pytorch_model*.bin"))
    return _digest_of(tuple((str(path), path.stat().st_size, path.stat().st_mtime_ns) for path in files))


@functools.lru_cache(maxsize=8)
def _digest_of(files: tuple[tuple[str, int, int], ...]) -> str:
    """The digest of ``files`` (path, size, mtime), computed once per process while they are
    unchanged: a run exports at each evaluation, and a decoder's base weighs gigabytes."""
    digest = hashlib.sha256()
    for path, _, _ in files:
        digest.update(f"{Path(path).name}:{file_sha256(Path(path))}\n".encode())
    return digest.hexdigest()


def save_adapter(peft_model, directory: Path) -> None:
    """Save ``peft_model``'s adapter in PEFT's format in ``directory``, its base pinned: a local
    base directory is written as its absolute path (a relative one would be read against the
    loader's working directory, which may hold another model of that name) and recorded with its
    :func:`base_digest` in :data:`BASE_RECORD`, which :func:`check_adapter_base` checks; a hub
    id stays as it is."""
    config = peft_model.peft_config["default"]
    base = Path(config.base_model_name_or_path or "")
    record = None
    if config.base_model_name_or_path and (base / "config.json").is_file():
        record = {"base_model_name_or_path": str(base.resolve()), "sha256": base_digest(base)}
        config.base_model_name_or_path = record["base_model_name_or_path"]
    peft_model.save_pretrained(str(directory), safe_serialization=True)
    if record is not None:
        (directory / BASE_RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def _read_json_object(path: Path, what: str) -> dict:
    """The JSON object in ``path``; a ValueError naming the file when it is not one."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text; {what} is a JSON file") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: invalid JSON at line {err.lineno} column {err.colno}: {err.msg}") from None
    except RecursionError:
        raise ValueError(f"{path}: invalid JSON: values nested too deeply") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object ({what}); got {shown(data)}")
    return data


def _is_number(value: Any) -> bool:
    """Whether a JSON value is a finite number (true and false are no numbers; an integer too
    large for a float is not finite)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _is_pattern(value: Any) -> bool:
    """Whether a JSON value is a regular expression (peft matches layer names with them)."""
    if not isinstance(value, str):
        return False
    try:
        re.compile(value)
    except re.error:
        return False
    return True


def _is_rank(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_LORA_RANK


def read_adapter_config(directory: Path) -> dict | None:
    """The ``adapter_config.json`` of a LoRA adapter directory, checked before peft reads it
    (peft trusts its types and allocates r x width per layer), or None when ``directory`` holds
    none. A ValueError names the file and the key: the base model, a LoRA adapter, its rank(s)
    (at most :data:`MAX_LORA_RANK`), alpha(s), dropout and targets of the types peft writes."""
    path = directory / ADAPTER_CONFIG
    if not path.is_file():
        return None
    config = _read_json_object(path, "PEFT's adapter config")
    base = config.get("base_model_name_or_path")
    if not isinstance(base, str) or not base.strip():
        raise ValueError(
            f"{path} names no base model (base_model_name_or_path: the model the adapter was trained on); "
            f"got {shown(base)}"
        )
    rules = {  # key: (valid, what it must be)
        "peft_type": (lambda v: v == "LORA", '"LORA" (vascl-scale loads LoRA adapters)'),
        "r": (_is_rank, f"an integer from 1 to {MAX_LORA_RANK}"),
        "lora_alpha": (_is_number, "a number"),
        "lora_dropout": (lambda v: _is_number(v) and 0 <= v < 1, "a number >= 0 and < 1"),
        "target_modules": (
            lambda v: v is None or _is_pattern(v) or isinstance(v, list) and all(isinstance(n, str) for n in v),
            "null, a regular expression or a list of layer names",
        ),
        "rank_pattern": (
            lambda v: v is None or isinstance(v, dict) and all(map(_is_pattern, v)) and all(map(_is_rank, v.values())),
            f"a mapping of regular expressions to integers from 1 to {MAX_LORA_RANK}",
        ),
        "alpha_pattern": (
            lambda v: (
                v is None or isinstance(v, dict) and all(map(_is_pattern, v)) and all(map(_is_number, v.values()))
            ),
            "a mapping of regular expressions to numbers",
        ),
    }
    for key, (valid, rule) in rules.items():
        if key not in config and key not in ("peft_type", "r"):  # peft's default
            continue
        if key not in config or not valid(config[key]):
            got = shown(config[key]) if key in config else "no such key"
            raise ValueError(f"{path}: {key} must be {rule}, as PEFT writes it; got {got}")
    return config


def required_adapter_config(adapter: Path) -> dict:
    """:func:`read_adapter_config` of a directory passed as an adapter: a ValueError when it holds none."""
    config = read_adapter_config(adapter)
    if config is None:
        raise ValueError(f"{adapter} holds no {ADAPTER_CONFIG}; pass a PEFT adapter directory")
    return config


def adapter_base_path(directory: Path) -> str | None:
    """The base model an adapter directory was trained on (:func:`read_adapter_config`), or None
    when ``directory`` holds no adapter."""
    config = read_adapter_config(directory)
    return None if config is None else config["base_model_name_or_path"]


def check_adapter_base(adapter: Path, base: Path) -> None:
    """A ValueError when the base model directory ``base`` is not the one the adapter in
    ``adapter`` was exported against (:data:`BASE_RECORD`, by digest; the same weights elsewhere
    are accepted). An adapter without a record (PEFT's own, or an older export) is loaded as it is."""
    record_file = adapter / BASE_RECORD
    if not record_file.is_file():
        named = required_adapter_config(adapter)["base_model_name_or_path"]
        if not Path(named).is_absolute() and Path(named).is_dir():
            logger.warning(
                "%s names its base model by the relative path %s, read against the working directory here (%s); "
                "check that it is the model the adapter was trained on",
                adapter / ADAPTER_CONFIG,
                named,
                base.resolve(),
            )
        return
    record = _read_json_object(record_file, "the base model an adapter was exported against")
    trained_on, expected = record.get("base_model_name_or_path"), record.get("sha256")
    if not isinstance(trained_on, str) or not isinstance(expected, str):
        raise ValueError(
            f"{record_file} must name the base model (base_model_name_or_path) and its sha256, as an export "
            "writes them; delete the file to load the adapter unchecked"
        )
    actual = base_digest(base)
    if actual != expected:
        raise ValueError(
            f"the LoRA adapter {adapter} was trained on {trained_on} (sha256 {expected[:16]}), but the base model "
            f"{base.resolve()} differs from it (sha256 {actual[:16]}): merging would give another model; put the "
            f"base it was trained on at {trained_on}, or evaluate the merged model instead (a training export "
            f"holds it beside lora/: {adapter.parent})"
        )


def merge_adapter(encoder: nn.Module, adapter: Path) -> nn.Module:
    """``encoder`` with the LoRA adapter in directory ``adapter`` merged into its weights (no peft
    wrapper left); ValueErrors name the adapter's file that peft could not use."""
    peft = require_peft()
    config = required_adapter_config(adapter)
    where = adapter / ADAPTER_CONFIG
    with _quiet_peft():
        try:
            lora = peft.LoraConfig.from_pretrained(str(adapter))
        except (TypeError, ValueError) as err:
            raise ValueError(f"{where}: peft cannot read it as a LoRA config: {err}") from None
    for rank in (config["r"], *(config.get("rank_pattern") or {}).values()):
        check_lora_rank(rank, encoder, config.get("target_modules"), f"r of {where}")
    weights = adapter / ADAPTER_WEIGHTS
    if weights.is_file() or not (adapter / ADAPTER_PICKLE).is_file():
        _check_safetensors(weights)
    else:  # an older peft's format, which peft loads weights-only
        weights = adapter / ADAPTER_PICKLE
    with _quiet_peft():
        # peft warns, and would merge the missing adapters' initial weights: refused instead.
        warnings.filterwarnings("error", message=".*missing adapter keys", category=UserWarning)
        try:
            merged = peft.PeftModel.from_pretrained(encoder, str(adapter), config=lora)
        except UserWarning as err:
            raise ValueError(f"{weights} lacks tensors of the adapter {where} describes: {shown(str(err))}") from None
        except (RuntimeError, ValueError, KeyError, pickle.UnpicklingError) as err:  # e.g. tensors of another shape
            detail = " ".join(str(err).split())[:400] or type(err).__name__
            raise ValueError(f"{weights} does not fit {where} and the base model: {detail}") from None
        except (TypeError, AttributeError, IndexError) as err:  # a key of the config peft trusts, of another type
            raise ValueError(f"{where}: peft cannot apply it to the base model: {type(err).__name__}: {err}") from None
    return merged.merge_and_unload()


def _check_safetensors(path: Path) -> None:
    """A ValueError naming ``path`` when it is missing or no complete safetensors file."""
    from safetensors import SafetensorError, safe_open

    if not path.is_file():
        raise ValueError(
            f"{path} is missing: a LoRA adapter directory holds its weights there (peft's save_pretrained "
            "writes it); copy the whole adapter directory, or export the model again"
        )
    try:
        with safe_open(str(path), framework="pt"):
            pass
    except SafetensorError as err:
        raise ValueError(
            f"{path} is not a complete safetensors file ({err}); it may be cut short: copy or export it again"
        ) from None


@dataclass(frozen=True)
class BackbonePlan:
    """A backbone's settings, decided once before any worker starts (:func:`plan_backbone`)."""

    decoder: bool
    append_eos: bool
    dtype: str  # float32 or bfloat16
    packed: bool = False  # rows encoded unpadded (vascl_scale.packing)
    hidden_size: int = 0  # d, the pooled embedding's width (the config's hidden_size; 0 where it names none)


def meta_skeleton(directory: Path | str, trust_remote_code: bool, attn_implementation: str | None, key: str):
    """The backbone of ``directory`` built on the meta device (no weight allocated), with the
    attention implementation transformers would load: a ValueError naming ``key`` when it cannot."""
    from transformers import AutoConfig, AutoModel

    config = AutoConfig.from_pretrained(str(directory), trust_remote_code=trust_remote_code)
    options = {"attn_implementation": attn_implementation} if attn_implementation is not None else {}
    try:
        with torch.device("meta"):
            return AutoModel.from_config(config, trust_remote_code=trust_remote_code, **options)
    except (ImportError, ValueError) as err:
        if attn_implementation is None:
            raise
        raise ValueError(
            f"{key}: {attn_implementation} cannot be used with {directory} here ({str(err).splitlines()[0]}); install "
            "what it needs (flash-attn on a CUDA machine) or leave the key out for transformers' default (sdpa)"
        ) from None


@dataclass(frozen=True)
class LoadedBackbone:
    """What the plan reads of a backbone, once: its meta-device skeleton (``.config`` its
    transformers config) and its tokenizer, made ready to embed with by :func:`plan_backbone`."""

    skeleton: nn.Module
    tokenizer: Any


def load_backbone(model_config, directory: Path) -> LoadedBackbone:
    """The skeleton (with ``model.attn_implementation``: :func:`meta_skeleton`) and tokenizer of ``directory``."""
    from vascl_scale.tokenizer import load_tokenizer

    trust = model_config.trust_remote_code
    skeleton = meta_skeleton(directory, trust, model_config.attn_implementation, "model.attn_implementation")
    return LoadedBackbone(skeleton, load_tokenizer(directory, trust_remote_code=trust))


def plan_backbone(
    model_config, directory: Path, device_type: str, loaded: LoadedBackbone | None = None
) -> BackbonePlan:
    """Check ``model`` (:class:`vascl_scale.config.ModelConfig`) against the checkpoint in
    ``directory`` (``loaded``: :func:`load_backbone` of it, loaded here when None) and decide what
    it leaves open: a ValueError for a tokenizer that cannot pad or append EOS
    (:func:`prepare_tokenizer`, done to ``loaded.tokenizer`` in place), a missing ``peft``, a
    LoRA target that is no linear layer, a LoRA rank above the narrowest adapted layer's width
    (:func:`check_lora_rank`)."""
    loaded = loaded if loaded is not None else load_backbone(model_config, directory)
    hf_config, tokenizer, skeleton = loaded.skeleton.config, loaded.tokenizer, loaded.skeleton
    decoder = is_decoder(hf_config)
    append_eos = model_config.append_eos
    if append_eos is None:
        append_eos = append_eos_default(model_config.pooling, decoder, tokenizer)
    prepare_tokenizer(tokenizer, append_eos, directory)  # what every worker does to it: its refusals, once, here
    lora = model_config.lora
    if lora.r > 0:
        require_peft()
        check_target_modules(lora.target_modules, skeleton)
        check_lora_rank(lora.r, skeleton, lora.target_modules, "model.lora.r")
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

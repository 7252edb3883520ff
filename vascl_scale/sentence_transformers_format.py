"""The sentence-transformers directory format, written and read in one place.

An export of ``vascl-scale train`` is a Hugging Face model directory plus the module files
sentence-transformers loads (``modules.json``: Transformer + Pooling; ``sentence_bert_config.json``;
``1_Pooling/config.json``). ``vascl-scale eval`` reads the same files of any
sentence-transformers directory (pooling, Normalize, maximum length).
"""

from __future__ import annotations

import json
from pathlib import Path

SETTINGS_FILE = "config_sentence_transformers.json"
# The prompt names sentence-transformers' encode_query / encode_document and MTEB look up.
QUERY, DOCUMENT = "query", "document"


def export_prompts(column_prompts: dict[str, str]) -> dict[str, str]:
    """model.prompts (by column) as sentence-transformers' named prompts: the anchor's is the
    ``query`` prompt, the positive's the ``document`` prompt (only those set)."""
    named = {QUERY: column_prompts.get("anchor", ""), DOCUMENT: column_prompts.get("positive", "")}
    return {name: text for name, text in named.items() if text}


def write_sentence_transformers_files(
    directory: Path, hidden_size: int, pooling: str, max_seq_length: int, column_prompts: dict[str, str]
) -> None:
    """modules.json, sentence_bert_config.json, 1_Pooling/config.json and, with prompts,
    config_sentence_transformers.json (:func:`export_prompts`) for ``directory``."""
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
        "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": pooling == "last_token",
        "include_prompt": True,  # mean pooling counts the prompt's tokens, as training did
    }
    (directory / "1_Pooling").mkdir(exist_ok=True)
    (directory / "1_Pooling" / "config.json").write_text(json.dumps(pooling_config, indent=2), encoding="utf-8")
    prompts = export_prompts(column_prompts)
    if prompts:
        settings = {"prompts": prompts, "default_prompt_name": None, "similarity_fn_name": "cosine"}
        (directory / SETTINGS_FILE).write_text(json.dumps(settings, indent=2), encoding="utf-8")


# Pooling names of sentence-transformers (legacy boolean keys and the newer "pooling_mode" values)
# that SentenceEncoder reproduces.
_LEGACY_POOLING_KEYS = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_lasttoken": "last_token",
}
_SUPPORTED_POOLING = ("mean", "cls", "last_token")


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _pooling_from_config(config_path: Path) -> str:
    """The pooling of a sentence-transformers Pooling module: ``"pooling_mode"`` (v5+) or the
    legacy ``pooling_mode_*`` booleans; none set means mean, as sentence-transformers reads it."""
    config = _read_json(config_path)
    if "pooling_mode" in config:
        modes = config["pooling_mode"]
        modes = [modes] if isinstance(modes, str) else list(modes)
        modes = [{"lasttoken": "last_token"}.get(mode, mode) for mode in modes]
    else:
        modes = [key for key, value in config.items() if key.startswith("pooling_mode_") and value] or ["mean"]
        modes = [_LEGACY_POOLING_KEYS.get(mode, mode) for mode in modes]
    if len(modes) != 1 or modes[0] not in _SUPPORTED_POOLING:
        raise ValueError(
            f"{config_path} asks for pooling {modes}; vascl-scale supports one of {list(_SUPPORTED_POOLING)}"
        )
    return modes[0]


def read_prompts(directory: Path) -> dict[str, str]:
    """The named prompts of a sentence-transformers directory (config_sentence_transformers.json), or none."""
    prompts = _read_json(directory / SETTINGS_FILE).get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(v, str) for v in prompts.values()):
        raise ValueError(f"{directory / SETTINGS_FILE}: prompts must map names to texts; got {prompts!r}")
    return {str(name): text for name, text in prompts.items()}


def read_sentence_transformers_layout(directory: Path) -> tuple[Path, str | None, bool, int | None]:
    """(encoder directory, pooling or None, normalize, max length or None) from modules.json.

    Modules are recognised by class name, so both the old (``sentence_transformers.models.Pooling``)
    and the newer module paths work. The maximum length is ``max_seq_length`` of
    sentence_bert_config.json, else (newer releases) the tokenizer's ``model_max_length``.
    """
    modules = json.loads((directory / "modules.json").read_text(encoding="utf-8"))
    encoder_dir, pooling, normalize, max_length = directory, None, False, None
    for module in modules:
        kind = module.get("type", "")
        where = directory / module.get("path", "")
        name = kind.rsplit(".", 1)[-1]
        if name == "Transformer":
            encoder_dir = where
            max_length = _read_json(where / "sentence_bert_config.json").get("max_seq_length")
            if max_length is None:
                tokenizer_limit = _read_json(where / "tokenizer_config.json").get("model_max_length")
                # tokenizers without a limit store a huge sentinel (int(1e30)): not a length
                max_length = tokenizer_limit if isinstance(tokenizer_limit, int) and tokenizer_limit < 100_000 else None
        elif name == "Pooling":
            pooling = _pooling_from_config(where / "config.json")
        elif name == "Normalize":
            normalize = True
        else:
            raise ValueError(
                f"{directory / 'modules.json'} has a {kind} module, which vascl-scale cannot apply; "
                "supported: Transformer, Pooling (mean or cls), Normalize"
            )
    return encoder_dir, pooling, normalize, max_length

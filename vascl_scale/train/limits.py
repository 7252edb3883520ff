"""What a backbone can take of a run's settings, checked by the plan before any worker starts.

Each check turns what would be a traceback at step 1, or a run that trains on the wrong input
with exit 0, into one error that names the key to change:

- ``data.max_length`` within the backbone's learned position embeddings (a rotary decoder has
  none: its length is not bounded by the checkpoint), and the guide's (:func:`max_positions`);
- every prompt leaves room for text within ``data.max_length`` (:func:`check_prompts`):
  truncation cuts a text's end, so a prompt of ``data.max_length`` tokens or more would leave
  every row the same prompt and the loss at ln(2B - 1);
- ``model.packed`` only on the architectures a test proves exact (:data:`PACKED_EXACT`);
- ``model.attn_implementation`` usable here (its package installed, the model supporting it:
  :func:`vascl_scale.backbone.meta_skeleton`, which builds what these checks read);
- an ``--fsdp`` file's blocks present in the backbone and its shard groups dividing the ranks.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

# The model types whose packed forward tests/test_lengths.py proves equal to the padded one.
# Others are refused: DistilBERT's embeddings take no position ids (each packed row would read
# the positions of its offset in the pack), MPNet's relative position buckets span the pack.
PACKED_EXACT = ("bert", "qwen3", "llama")


def max_positions(skeleton: torch.nn.Module, directory: Path | str) -> int | None:
    """The longest input the model of ``directory`` embeds, where ``skeleton`` (its meta-device
    copy) has a learned position table (:func:`vascl_scale.encode.position_limit`, as eval caps
    it); None where positions are rotary, which a longer input does not index past."""
    from vascl_scale.encode import position_limit

    learned = any(
        isinstance(module, torch.nn.Embedding) and name.endswith("position_embeddings")
        for name, module in skeleton.named_modules()
    )
    return position_limit(Path(directory)) if learned else None


def check_max_length(max_length: int, skeleton: torch.nn.Module, model: str, key: str = "model.path") -> None:
    """ValueError when ``data.max_length`` is longer than the model of ``key`` (directory ``model``) embeds."""
    positions = max_positions(skeleton, model)
    if positions is not None and max_length > positions:
        raise ValueError(
            f"data.max_length = {max_length} is longer than {key} {model} can embed: its position embeddings "
            f"hold {positions} tokens; set data.max_length <= {positions}"
        )


def check_prompts(tokenizer, prompts: dict[str, dict[str, str]], max_length: int) -> None:
    """ValueError when a prompt (``prompts``: the config key that sets them -> column -> text)
    takes ``max_length`` tokens or more with the tokenizer's own special tokens (and EOS)."""
    for key, by_column in prompts.items():
        for column, prompt in by_column.items():
            if not prompt:
                continue
            ids = tokenizer(prompt)["input_ids"]
            if len(ids) >= max_length:
                shown = tokenizer.convert_ids_to_tokens(ids)
                raise ValueError(
                    f"{key}.{column} takes {len(ids)} tokens {shown[:8]}{' ...' if len(ids) > 8 else ''} (with the "
                    f"tokenizer's special tokens) and data.max_length = {max_length}: truncation would leave every "
                    f"{column} text the prompt alone; raise data.max_length above {len(ids)} or shorten the prompt"
                )


def check_packing(packed: bool, requested: bool | str, model_type: str) -> bool:
    """``model.packed`` resolved for a backbone of ``model_type``: ``true`` is refused where no
    test proves packed rows exact (:data:`PACKED_EXACT`); ``auto`` falls back to padded rows there."""
    if not packed or model_type in PACKED_EXACT:
        return packed
    if requested == "auto":
        logger.info("model.packed: auto: padded rows for %s (packing is proven exact on %s)", model_type, PACKED_EXACT)
        return False
    raise ValueError(
        f"model.packed: true on a {model_type} backbone: packed rows are proven to embed as padded ones only on "
        f"{', '.join(PACKED_EXACT)} (others read positions or relative buckets across the pack); "
        "set model.packed: false"
    )


def check_backbone(config, backbone, loaded, fsdp=None, world_size: int = 1):
    """Every check above on a resolved run ``config`` (:class:`vascl_scale.config.RunConfig`),
    its :class:`vascl_scale.backbone.BackbonePlan`, the :class:`vascl_scale.backbone.LoadedBackbone`
    it was planned from (its tokenizer made ready) and FSDP2 settings (or None) on ``world_size``
    ranks; the plan with ``packed`` resolved."""
    from dataclasses import replace

    from vascl_scale.train.fsdp import mesh_shape, transformer_blocks

    model, max_length, skeleton = config.model, config.data.max_length, loaded.skeleton
    check_max_length(max_length, skeleton, model.path)
    if fsdp is not None:  # what each rank would refuse after loading the model
        transformer_blocks(skeleton, fsdp.transformer_layer_cls_to_wrap)
        if fsdp.shard_size:  # unset: one machine's ranks, which divide the world
            mesh_shape(fsdp, world_size, fsdp.shard_size)
    prompts = {"model.prompts": model.prompts}
    if isinstance(config.data.train, list):
        prompts |= {f"data.train[{i}].prompts": s.prompts for i, s in enumerate(config.data.train) if s.prompts}
    check_prompts(loaded.tokenizer, prompts, max_length)
    return replace(backbone, packed=check_packing(backbone.packed, model.packed, skeleton.config.model_type))

"""The configuration of a training run, by job: :mod:`vascl_scale.config.schema` (the typed tree,
validated at construction) and :mod:`vascl_scale.config.loader` (YAML and ``--set``, with
messages that say where). What is derived from a config for one run on one machine (paths
expanded, the batch split, the precision, the resume state) is the run plan's job
(:mod:`vascl_scale.train.plan`).
"""

from vascl_scale.config.loader import MAX_YAML_VALUES, apply_override, load_config, load_fsdp_config, save_config
from vascl_scale.config.schema import (
    ALL_TRACKERS,
    MAX_GLOBAL_BATCH,
    NO_TRACKER,
    TRACKERS,
    CardConfig,
    CheckpointConfig,
    DataConfig,
    EvalConfig,
    FsdpConfig,
    LossConfig,
    MixSource,
    ModelConfig,
    OptimConfig,
    RunConfig,
    TrainConfig,
    config_from_dict,
)

__all__ = [
    "ALL_TRACKERS",
    "MAX_GLOBAL_BATCH",
    "MAX_YAML_VALUES",
    "NO_TRACKER",
    "TRACKERS",
    "CardConfig",
    "CheckpointConfig",
    "DataConfig",
    "FsdpConfig",
    "EvalConfig",
    "LossConfig",
    "MixSource",
    "ModelConfig",
    "OptimConfig",
    "RunConfig",
    "TrainConfig",
    "apply_override",
    "config_from_dict",
    "load_config",
    "load_fsdp_config",
    "save_config",
]

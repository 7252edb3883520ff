"""The run plan: everything derived from a training config, worked out once, before any worker starts.

``vascl-scale train`` loads the config (as written, with its ``--set`` overrides) and makes one
:class:`RunPlan` from it (:func:`make_plan`): the paths expanded (a hub id located in the cache,
its commit pinned), the batch split (per-device batch, accumulation), the precision and why, the
engine (DDP, DeepSpeed with its config file and ZeRO stage, or FSDP2 with its settings), the trackers, the checkpoint to resume
from (checked against the config), the columns of every training batch, and the dev set for model
selection. Every check on the config that needs the machine (files, manifests, installed
packages) is here, so a bad run fails in the launcher with one error instead of in every worker.

The launcher writes the plan to ``<run>/plan.json`` (:func:`write_plan`) and starts its workers
with ``--plan <run>/plan.json``; each worker reads it (:func:`read_plan`), refuses to run if its
own config differs from the one the plan was made from (:meth:`RunPlan.check_worker`), and
builds the trainer from it (:func:`vascl_scale.train.trainer.build_trainer`), which checks
nothing again. Workers of another launcher (torchrun, srun) make the plan themselves, each from
the same config.

The run directory's lock (:class:`vascl_scale.train.run_lock.RunDirectoryLock`) is taken here,
before the directory is checked, by the process that makes the plan: our launcher on machine 0,
or the one process that trains in place; workers of another launcher take it on rank 0 (the
plan says so: :attr:`RunPlan.lock_in_workers`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from vascl_scale.backbone import BackbonePlan, load_backbone, meta_skeleton, plan_backbone
from vascl_scale.config import FsdpConfig, MixSource, RunConfig, config_from_dict, load_fsdp_config
from vascl_scale.config.schema import RETRIEVAL_DEV_METRIC, RETRIEVAL_DEV_PREFIX, STSB_DEV_METRIC
from vascl_scale.data.augment import check_augmenter
from vascl_scale.data.columns import AUGMENTED, columns_to_read
from vascl_scale.data.mix_plan import check_same_columns
from vascl_scale.hub import PACKAGE_PREFIX, locate_model, package_directory
from vascl_scale.losses.spec import objectives_reading_all
from vascl_scale.precision import local_device_type, precision_reason, train_precision
from vascl_scale.train.checkpoint import check_resume_compatible, prepare_run_dir, resolve_resume
from vascl_scale.train.limits import check_backbone, check_max_length
from vascl_scale.train.run_lock import RunDirectoryLock
from vascl_scale.train.tracking import resolve_trackers

logger = logging.getLogger(__name__)

PLAN_FILE = "plan.json"
# The sha256 of the plan a launcher wrote, in its workers' environment: a worker runs that file
# only, unchanged (read_worker_plan), so a plan edited after the launch is refused.
PLAN_DIGEST_ENV = "VASCL_PLAN_SHA256"
# train.length_buckets: auto: measured with bench step on real text (docs/speed.md).
LENGTH_BUCKETS_AUTO = 4
# Every key that names a file or directory and is always used (data.train: each source of a
# list): expanded by resolve_paths, nowhere else (which also expands data.augment_model /
# augment_wordnet when an augmentation uses them).
PATH_KEYS = ("model.path", "data.train", "train.output_dir", "eval.stsb_dev")
# Who holds the run directory's lock: this process (it trains in place, or it is the launcher on
# machine 0); our launcher on machine 0 (for the workers of any machine); rank 0 of the workers
# (another launcher started them).
LockHolder = Literal["here", "launcher", "workers"]
# The keys of a resolved config that resolve_paths may change: every other one is the config's own.
RESOLVED_KEYS = frozenset({*PATH_KEYS, "model.revision", "data.augment_model", "data.augment_wordnet"})


@dataclass(frozen=True)
class RunPlan:
    """One training run, decided: what every worker builds the run from."""

    config: RunConfig
    """paths expanded (:func:`resolve_paths`); ``config.as_written()`` is what config.yaml saves
    (the paths as written, a hub id's revision pinned to the commit loaded)"""
    world_size: int
    per_device_batch: int
    """b = B / W sentences per rank and loss call (:meth:`RunConfig.per_device_batch_size`)"""
    precision: str
    """the training step's: "no", "bf16" or "fp16" (train.precision resolved for this machine)"""
    precision_reason: str
    """what the run computes in and why, for the log"""
    deepspeed_config: str | None
    """a DeepSpeed JSON (``--deepspeed``, or an ``accelerate launch --config_file``'s), or None: DDP"""
    zero_stage: int
    """the DeepSpeed file's ZeRO stage; 0 without DeepSpeed"""
    fsdp: FsdpConfig | None
    """the FSDP2 settings of ``--fsdp FILE`` (:mod:`vascl_scale.train.fsdp`), or None"""
    trackers: tuple[str, ...]
    """where rank 0 sends the metrics (:func:`vascl_scale.train.tracking.resolve_trackers`)"""
    resume_from: str | None
    """a complete checkpoint, checked against the config, or None: a new run"""
    read_columns: tuple[str, ...]
    """the data's columns the training stream reads (those the objective takes)"""
    columns: tuple[str, ...]
    """the columns of every training batch (the read ones, and the positive data.augment makes)"""
    dev_set: DevSet | None
    """the data of model selection (eval.dev_task), checked, or None: off (evaluation off, or no STS-B dev file: warned)"""
    lock_in_workers: bool
    """True when the workers take the run directory's lock (rank 0); else a launcher holds it"""
    loaded_config: dict[str, Any]
    """the config as loaded (``--config`` and ``--set``), which every worker must be started with"""
    backbone: BackbonePlan
    """decoder or encoder, EOS appended or not, the weights' dtype, packed rows or padded
    (:func:`vascl_scale.backbone.plan_backbone`)"""
    length_buckets: int
    """the uncached step's length-sorted forwards per loss call (train.length_buckets resolved, :func:`length_buckets`)"""
    guide: GuidePlan | None = None
    """loss.guide_model located and checked (:func:`_guide`), or None: no guide"""
    run_lock: RunDirectoryLock | None = field(default=None, compare=False, repr=False)
    """the lock this process took when it made the plan (not in plan.json)"""

    @property
    def run_dir(self) -> Path:
        return Path(self.config.train.output_dir)

    @property
    def parameters_sharded(self) -> bool:
        """Whether every forward is a collective (ZeRO-3, FSDP2): then every rank must encode."""
        return self.zero_stage == 3 or self.fsdp is not None

    @property
    def engine(self) -> str:
        """ "ddp", "deepspeed" or "fsdp" (:func:`engine_name`)."""
        return engine_name(self.deepspeed_config, self.fsdp)

    def to_json(self) -> str:
        # Not dataclasses.asdict: it deep-copies every field, the lock's open file included.
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("config", "run_lock")}
        values["config"] = self.config.to_dict()
        values["backbone"] = asdict(self.backbone)
        values["fsdp"] = self.fsdp.model_dump() if self.fsdp is not None else None
        values["dev_set"] = asdict(self.dev_set) if self.dev_set is not None else None
        values["guide"] = asdict(self.guide) if self.guide is not None else None
        values["written_config"] = self.config.as_written().to_dict()
        return json.dumps(values, indent=2)

    @classmethod
    def from_json(cls, text: str) -> RunPlan:
        values = json.loads(text)
        written = config_from_dict(values.pop("written_config"))
        config = config_from_dict(values.pop("config"))
        config._written = written
        tuples = {name: tuple(values.pop(name)) for name in ("trackers", "read_columns", "columns")}
        backbone = BackbonePlan(**values.pop("backbone"))
        fsdp = values.pop("fsdp")
        fsdp = FsdpConfig.model_validate(fsdp) if fsdp is not None else None
        dev_set = values.pop("dev_set")
        dev_set = DevSet(**dev_set) if dev_set is not None else None
        guide = values.pop("guide")
        guide = GuidePlan(**guide) if guide is not None else None
        return cls(config=config, backbone=backbone, fsdp=fsdp, dev_set=dev_set, guide=guide, **tuples, **values)

    def check_worker(self, config: RunConfig, world_size: int, engine: str, where: Path) -> None:
        """ValueError unless a worker started with ``config`` on ``world_size`` ranks under ``engine``
        runs this plan: made from the same config, as loaded, for the same ranks and engine, and with
        no setting of its resolved config other than the worker's own (only paths are expanded)."""
        planned, given = _leaves(self.loaded_config), _leaves(config.to_dict())
        changed = [
            f"{key}: {planned.get(key)!r} -> {given.get(key)!r}"
            for key in sorted(planned.keys() | given.keys())
            if planned.get(key) != given.get(key)
        ]
        if changed:
            raise ValueError(
                f"this worker's config differs from the one the run plan {where} was made from "
                f"({'; '.join(changed)}); start every process with the same --config and --set"
            )
        if world_size != self.world_size:
            raise ValueError(
                f"the run plan {where} is for {self.world_size} processes and this worker is one of {world_size}"
            )
        if engine != self.engine:
            raise ValueError(
                f"the run plan {where} trains under {self.engine} and this worker was started for {engine}; "
                "start every process with the same --deepspeed / --fsdp"
            )
        resolved = _leaves(self.config.to_dict())
        widened = sorted(
            key
            for key in resolved.keys() | given.keys()
            if key not in RESOLVED_KEYS and resolved.get(key) != given.get(key)
        )
        if widened:
            raise ValueError(
                f"the run plan {where} sets {', '.join(f'{key}: {resolved.get(key)!r}' for key in widened)} where "
                "this worker's config says otherwise; a worker runs only what its own config allows"
            )


def _leaves(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A config's values by dotted key (a list is one value)."""
    leaves: dict[str, Any] = {}
    for name, value in tree.items():
        if isinstance(value, dict):
            leaves.update(_leaves(value, f"{prefix}{name}."))
        else:
            leaves[f"{prefix}{name}"] = value
    return leaves


def make_plan(
    config: RunConfig,
    *,
    world_size: int = 1,
    deepspeed: str | os.PathLike | None = None,
    fsdp: str | os.PathLike | None = None,
    resume: str | None = None,
    lock: LockHolder = "here",
) -> RunPlan:
    """The plan of a run of ``config`` (as loaded) on ``world_size`` ranks; every check in one place.

    ``deepspeed``: a DeepSpeed JSON (None: the one an ``accelerate launch --config_file`` of the
    DeepSpeed type passed down, if any; else DDP). ``fsdp``: an FSDP2 settings file (``--fsdp``;
    not together with DeepSpeed). ``resume``: ``"latest"``, a run directory or a
    checkpoint. ``lock``: who holds the run directory (:data:`LockHolder`); with ``"here"`` this
    process takes the lock before the directory is checked and the plan keeps it
    (:attr:`RunPlan.run_lock`).
    """
    resolved = resolve_paths(config)
    train = resolved.train
    per_device_batch = resolved.per_device_batch_size(world_size)
    precision = train_precision(train.precision)
    trackers = resolve_trackers(train.report_to)
    deepspeed_config = _deepspeed_config(deepspeed)
    zero_stage = _zero_stage(deepspeed_config) if deepspeed_config is not None else 0
    fsdp_settings = _fsdp_settings(fsdp, deepspeed_config, precision)
    if train.compile and zero_stage == 3:
        raise ValueError(
            "train.compile: true does not run under ZeRO-3 (its per-layer parameter gathering breaks the compiled "
            "graph); use configs/deepspeed/zero2.json or set train.compile: false"
        )
    read_columns, columns = data_columns(resolved)
    loaded = load_backbone(resolved.model, Path(resolved.model.path))
    backbone = plan_backbone(resolved.model, Path(resolved.model.path), local_device_type(), loaded)
    backbone = check_backbone(resolved, backbone, loaded, fsdp_settings, world_size)
    _check_matryoshka_width(resolved.loss.matryoshka_dims, backbone.hidden_size, resolved.model.path)
    buckets = length_buckets(train.length_buckets, gathers_per_forward(zero_stage, fsdp_settings), backbone.packed)
    dev_set = _dev_set(resolved)
    guide = _guide(resolved)
    run_dir = Path(train.output_dir)
    check_writable(run_dir)
    run_lock = RunDirectoryLock(run_dir).acquire() if lock == "here" else None
    try:
        prepare_run_dir(run_dir, resume)
        resume_from = None
        if resume is not None:
            resume_from = resolve_resume(resume, run_dir)
            engine = engine_name(deepspeed_config, fsdp_settings)
            check_resume_compatible(resume_from, resolved, world_size, columns, engine)
    except BaseException:
        if run_lock is not None:
            run_lock.release()
        raise
    return RunPlan(
        config=resolved,
        world_size=world_size,
        per_device_batch=per_device_batch,
        precision=precision,
        precision_reason=precision_reason(train.precision, precision, local_device_type(), "train.precision"),
        deepspeed_config=deepspeed_config,
        zero_stage=zero_stage,
        fsdp=fsdp_settings,
        trackers=trackers,
        resume_from=str(resume_from) if resume_from is not None else None,
        read_columns=read_columns,
        columns=columns,
        dev_set=dev_set,
        lock_in_workers=lock == "workers",
        loaded_config=config.to_dict(),
        backbone=backbone,
        length_buckets=buckets,
        guide=guide,
        run_lock=run_lock,
    )


def engine_name(deepspeed_config: str | None, fsdp: FsdpConfig | str | os.PathLike | None) -> str:
    """ "ddp", "deepspeed" or "fsdp": what shards (or replicates) the model; each checkpoint records it.
    ``fsdp``: the settings or the ``--fsdp`` file."""
    if fsdp is not None:
        return "fsdp"
    return "deepspeed" if deepspeed_config is not None else "ddp"


def gathers_per_forward(zero_stage: int, fsdp: FsdpConfig | None) -> bool:
    """Whether each forward all-gathers the parameters again: ZeRO-3, FSDP2 but shard_grad_op."""
    if fsdp is not None:
        return fsdp.sharding_strategy != "shard_grad_op"
    return zero_stage == 3


def length_buckets(setting: int | str, gathers_per_forward: bool, packed: bool) -> int:
    """train.length_buckets resolved: ``auto`` is :data:`LENGTH_BUCKETS_AUTO`, except 1 where
    each forward gathers every layer's parameters again (ZeRO-3, FSDP2's full and hybrid
    sharding: :func:`gathers_per_forward`) and with packed rows (nothing padded to
    save); a number is kept."""
    if setting != "auto":
        return int(setting)
    return 1 if gathers_per_forward or packed else LENGTH_BUCKETS_AUTO


def plan_path(run_dir: Path, machine_rank: int = 0) -> Path:
    """Where a launcher writes its plan: ``<run>/plan.json`` on machine 0; each other machine's
    launcher (which made its own, for its workers) beside it as ``plan-machine-<k>.json``."""
    return run_dir / (PLAN_FILE if machine_rank == 0 else f"plan-machine-{machine_rank}.json")


def write_plan(plan: RunPlan, path: Path) -> Path:
    """Write ``plan`` to ``path`` (replacing an older run's plan whole); ``path``."""
    from vascl_scale.fs import replace_file

    path.parent.mkdir(parents=True, exist_ok=True)
    replace_file(path, plan.to_json())
    return path


def plan_digest(plan: RunPlan) -> str:
    """The sha256 of ``plan``'s file (what :func:`write_plan` writes), for :data:`PLAN_DIGEST_ENV`."""
    return hashlib.sha256(plan.to_json().encode("utf-8")).hexdigest()


def read_plan(path: Path) -> RunPlan:
    """The plan a launcher wrote to ``path``."""
    return _parse_plan(_read_plan_bytes(path), path)


def read_worker_plan(path: Path, digest: str | None) -> RunPlan:
    """The plan a worker of our launcher runs: the file at ``path`` only if its sha256 is
    ``digest``, the one its launcher passed down (:data:`PLAN_DIGEST_ENV`)."""
    if not digest:
        raise ValueError(
            f"--plan {path}: only the workers that vascl-scale train starts take --plan ({PLAN_DIGEST_ENV} is unset); "
            "run vascl-scale train without --plan"
        )
    data = _read_plan_bytes(path)
    actual = hashlib.sha256(data).hexdigest()
    if actual != digest:
        raise ValueError(
            f"--plan {path}: not the plan this worker's launcher wrote (sha256 {actual[:16]}..., the launcher's "
            f"{digest[:16]}...): it was changed after the launch; start the run again with vascl-scale train"
        )
    return _parse_plan(data, path)


def _read_plan_bytes(path: Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as err:
        raise ValueError(f"--plan {path}: cannot read the run plan ({err.strerror})") from err


def _parse_plan(data: bytes, path: Path) -> RunPlan:
    try:
        return RunPlan.from_json(data.decode("utf-8"))
    except (ValueError, TypeError, KeyError, AttributeError) as err:  # JSON, schema and shape errors alike
        raise ValueError(f"--plan {path}: not a run plan of this version of vascl-scale ({err})") from err


def check_writable(directory: Path) -> None:
    """Create ``directory`` and prove a file can be written there; a clear error otherwise."""
    import uuid

    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".write-test-{uuid.uuid4().hex}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise ValueError(f"output directory {directory} is not writable ({err.strerror}); pass --output DIR") from err


def worker_engine(deepspeed: str | os.PathLike | None, fsdp: str | os.PathLike | None) -> str:
    """The engine a worker's own ``--deepspeed`` / ``--fsdp`` (and environment) ask for (:func:`engine_name`)."""
    return engine_name(_deepspeed_config(deepspeed), fsdp)


def _deepspeed_config(deepspeed: str | os.PathLike | None) -> str | None:
    """``--deepspeed``, or the DeepSpeed config an ``accelerate launch --config_file`` (DeepSpeed
    type) passed down in the environment; an error when the file does not exist."""
    if deepspeed is None and os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        deepspeed = os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE")
    if deepspeed is None:
        return None
    if not Path(deepspeed).is_file():
        raise ValueError(f"--deepspeed {deepspeed}: no such file")
    return str(deepspeed)


def _fsdp_settings(fsdp: str | os.PathLike | None, deepspeed_config: str | None, precision: str) -> FsdpConfig | None:
    """The validated settings of ``--fsdp``, or None; refused beside a DeepSpeed config, with
    fp16, and under an ``accelerate launch`` of accelerate's own FSDP type."""
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        raise ValueError(
            "accelerate launch was given an FSDP config (distributed_type: FSDP); vascl-scale shards with its own "
            "FSDP2 engine: launch with a plain multi-GPU accelerate config and pass --fsdp configs/fsdp/full-shard.yaml"
        )
    if fsdp is None:
        return None
    if deepspeed_config is not None:
        raise ValueError(
            f"--fsdp {fsdp} and --deepspeed {deepspeed_config} name two engines; pass one of them "
            "(docs/engines.md compares them)"
        )
    settings = load_fsdp_config(fsdp)
    if precision == "fp16":
        raise ValueError(
            f"--fsdp {fsdp} with train.precision fp16: the FSDP2 engine has no loss scaling; "
            "set train.precision to bf16 (or no)"
        )
    return settings


def _zero_stage(deepspeed_config: str) -> int:
    """The ZeRO stage a DeepSpeed JSON asks for (0 when it has no ``zero_optimization``)."""
    try:
        values = json.loads(Path(deepspeed_config).read_text(encoding="utf-8"))
        stage = values.get("zero_optimization", {}).get("stage", 0)
    except (OSError, ValueError, AttributeError) as err:
        raise ValueError(f"--deepspeed {deepspeed_config}: not a DeepSpeed JSON config ({err})") from err
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"--deepspeed {deepspeed_config}: zero_optimization.stage must be 0, 1, 2 or 3; got {stage!r}")
    return stage


def resolve_paths(config: RunConfig) -> RunConfig:
    """A copy of ``config`` with every key of :data:`PATH_KEYS` expanded by :func:`expand_path`.

    An unset variable in a required path is an error, as is a WordNet database or masked LM that
    the augmentation cannot use (:func:`vascl_scale.data.augment.check_augmenter`).
    ``eval.stsb_dev`` is optional: when evaluation is on and the file (or a variable it names) is
    absent, the copy holds "" (no dev set; :func:`make_plan` warns once). A hub id in
    ``model.path`` becomes its snapshot directory in the Hugging Face cache, and the written
    config's ``model.revision`` the commit of that snapshot. The copy remembers the config as
    written (:meth:`RunConfig.as_written`), which the run directory's config.yaml saves. A config
    already resolved is returned as it is.
    """
    if config.as_written() is not config:
        return config
    written = config
    expanded: dict[str, Any] = {key: _expanded(written, key) for key in PATH_KEYS if key != "eval.stsb_dev"}
    expanded["eval.stsb_dev"] = _expanded_dev_set(written)
    model = written.model
    location = locate_model(expanded["model.path"], "model.path", model.revision, model.trust_remote_code)
    expanded["model.path"] = str(location.directory)
    if location.hub_id is not None:
        # Pin the commit loaded, so the saved config.yaml reloads exactly this model.
        logger.info("model %s at revision %s: %s", location.hub_id, location.revision, location.directory)
        pinned = written.model.model_copy(update={"revision": location.revision})
        written = written.model_copy(update={"model": pinned})
    if written.data.augment == "ctxt":  # its masked LM: loaded by every loader worker, found once here
        value = expand_path(written.data.augment_model, "data.augment_model")
        expanded["data.augment_model"] = str(locate_model(value, "data.augment_model").directory)
    if written.data.augment == "wnet":
        expanded["data.augment_wordnet"] = expand_path(written.data.augment_wordnet, "data.augment_wordnet")
    changes: dict[str, dict[str, Any]] = {}
    for key, value in expanded.items():
        section, name = key.split(".")
        changes.setdefault(section, {})[name] = (
            [MixSource(**source) for source in value] if isinstance(value, list) else value
        )
    resolved = written.model_copy(update={s: getattr(written, s).model_copy(update=v) for s, v in changes.items()})
    resolved._written = written
    check_augmenter(resolved.data.augment_spec())  # what the loader's workers will build
    return resolved


def data_columns(config: RunConfig) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The data's columns the training stream reads, and the columns each training batch holds
    (those, and the positive ``data.augment`` makes), of a resolved ``config``.

    ValueError, naming the objective and the columns, when ``data.train`` (each of its sources,
    named) lacks a column the objective needs and has nothing to stand in for it, or has a
    positive of its own under ``data.augment``; or when the sources of a mixed ``data.train``
    give the objective different columns. Reads the manifests only
    (:func:`vascl_scale.data.shards.source_columns`); logs the columns the objective leaves unread.
    """
    from vascl_scale.data.shards import source_columns  # webdataset: kept out of `--help`
    from vascl_scale.losses.spec import objective_spec

    data, spec = config.data, objective_spec(config.objective)
    # Where each source is, in errors (with its path) and in the log (by its key and name).
    if data.mixed:
        sources = {
            (f"data.train[{i}] ({name}: {s.source})", f"data.train[{i}] ({name})"): s.source
            for i, (s, name) in enumerate(zip(data.train, data.source_names()))
        }
    else:
        sources = {(f"data.train {data.train}", "data.train"): data.train}
    augmented = data.augment != "none"
    made = AUGMENTED if augmented else ()
    given = {}  # where -> the columns its batches hold
    read: tuple[str, ...] = ()
    for (where, key), source in sources.items():
        available = source_columns(source)
        read = spec.columns_read(available)
        given[where] = columns_to_read(available, read, augmented, where) + made
        spec.check_columns(available + made, where)
        _log_unread_columns(spec, available, key)
    check_same_columns(given)
    return read, next(iter(given.values()))


def _log_unread_columns(spec, available: tuple[str, ...], where: str) -> None:
    """One line naming the columns of the data ``where`` (``available``) that the objective does not read,
    if any: hard negatives that a user may believe are trained on are ignored by SimCSE and VaSCL."""
    unread = spec.unread_columns(available)
    if not unread:
        return
    readers = [name for name in objectives_reading_all(available) if name != spec.name]
    logger.info(
        "data: %s has the column(s) %s, which objective %r does not read: they are ignored (it reads %s)%s",
        where,
        ", ".join(unread),
        spec.name,
        ", ".join(spec.columns_read(available)),
        f"; every column is read by {' or '.join(repr(name) for name in readers)}" if readers else "",
    )


def _check_matryoshka_width(dims: list[int], hidden_size: int, model: str) -> None:
    """``loss.matryoshka_dims`` hold the model's embedding dimension d as their largest (its term
    trains the head, :class:`vascl_scale.losses.objective.MatryoshkaObjective`); checked here,
    before any worker starts, where the config names d."""
    if dims and hidden_size and max(dims) != hidden_size:
        raise ValueError(
            f"loss.matryoshka_dims must hold the model's embedding dimension {hidden_size} ({model}) as its largest "
            f"(its term trains the head, the others are prefixes of it); got {dims}"
        )


@dataclass(frozen=True)
class GuidePlan:
    """The frozen guide model of ``loss.false_negatives: margin`` (``loss.guide_model``): its
    directory and pooling, as :func:`vascl_scale.encode.resolve_model` reads them."""

    directory: str
    pooling: str


def _guide(config: RunConfig) -> GuidePlan | None:
    """``loss.guide_model`` of a resolved ``config`` located, or None. The guide encodes the
    batch's own token ids (no second tokenisation in the loader), so its tokenizer must be the
    model's: a ValueError naming both otherwise."""
    if config.loss.guide_model is None:
        return None
    from vascl_scale.data.shards import tokenizer_fingerprint
    from vascl_scale.encode import resolve_model
    from vascl_scale.tokenizer import load_tokenizer

    spec = resolve_model(expand_path(config.loss.guide_model, "loss.guide_model"))
    student, guide = load_tokenizer(config.model.path), load_tokenizer(str(spec.directory))
    if tokenizer_fingerprint(student) != tokenizer_fingerprint(guide):
        raise ValueError(
            f"loss.guide_model {config.loss.guide_model}: its tokenizer is not the model's ({config.model.path}); the "
            "guide encodes the batch's own token ids, so choose a guide of the same tokenizer (the starting "
            "checkpoint, or a larger model of its family)"
        )
    guide_skeleton = meta_skeleton(spec.directory, False, None, "loss.guide_model")
    check_max_length(config.data.max_length, guide_skeleton, str(spec.directory), key="loss.guide_model")
    logger.info("false negatives: margin by the frozen guide %s (%s pooling)", spec.directory, spec.pooling)
    return GuidePlan(str(spec.directory), spec.pooling)


@dataclass(frozen=True)
class DevSet:
    """The model-selection data of ``eval.dev_task``: its kind ("stsb" or "retrieval"), its path
    (the STS-B dev TSV, or a BEIR directory) and, for retrieval, the qrels split read."""

    kind: str
    path: str
    split: str | None = None

    @property
    def metric(self) -> str:
        """The name of its score in metrics.jsonl, the log and the model card."""
        return STSB_DEV_METRIC if self.kind == "stsb" else RETRIEVAL_DEV_METRIC

    @property
    def title(self) -> str:
        if self.kind == "stsb":
            return "STS-B dev Spearman"
        return f"retrieval nDCG@10 on {Path(self.path).name} ({self.split})"


def _dev_set(config: RunConfig) -> DevSet | None:
    """The checked model-selection data of a resolved ``config`` (``eval.dev_task``), or None
    when model selection is off. A retrieval directory is read here, before any worker starts
    (:func:`vascl_scale.eval.retrieval.load_retrieval_data`: one line naming a bad file)."""
    if config.eval.every_steps == 0:
        return None
    task = config.eval.dev_task
    if task.startswith(RETRIEVAL_DEV_PREFIX):
        from vascl_scale.eval.retrieval import load_retrieval_data

        directory = expand_path(task[len(RETRIEVAL_DEV_PREFIX) :], "eval.dev_task")
        split = "dev" if (Path(directory) / "qrels" / "dev.tsv").is_file() else "test"
        if not Path(directory).is_dir():
            raise ValueError(
                f"eval.dev_task {task}: {directory} is no directory; give a BEIR-format directory (corpus.jsonl, "
                "queries.jsonl, qrels/dev.tsv or qrels/test.tsv)"
            )
        data = load_retrieval_data(directory, split)
        logger.info(
            "model selection: nDCG@10 on %s (%s split: %d queries, %d documents)",
            directory,
            split,
            len(data.query_ids),
            len(data.document_ids),
        )
        return DevSet("retrieval", directory, split)
    if not config.eval.stsb_dev:
        return None
    from vascl_scale.eval.sts import check_gold_scores, load_sts_tsv

    check_gold_scores(load_sts_tsv(config.eval.stsb_dev), f"eval.stsb_dev {config.eval.stsb_dev}")
    return DevSet("stsb", config.eval.stsb_dev)


def _value(config: RunConfig, dotted: str) -> Any:
    section, name = dotted.split(".")
    return getattr(getattr(config, section), name)


def _expanded(config: RunConfig, key: str) -> str | list[dict[str, Any]]:
    """The value of ``key`` with :func:`expand_path` applied; a mixed ``data.train``: each
    source's (as a mapping), its name fixed from the source as written."""
    if key != "data.train" or not config.data.mixed:
        return expand_path(_value(config, key), key)
    names = config.data.source_names()
    return [
        {
            **source.model_dump(),
            "source": expand_path(source.source, f"data.train[{index}].source"),
            "name": names[index],
        }
        for index, source in enumerate(config.data.train)
    ]


def _expanded_dev_set(config: RunConfig) -> str:
    """``eval.stsb_dev`` expanded, or "" when evaluation is off or the file is unavailable (one warning)."""
    if config.eval.every_steps == 0:
        return ""
    try:
        path = expand_path(config.eval.stsb_dev, "eval.stsb_dev")
    except ValueError as err:
        logger.warning("model selection on STS-B dev is off: %s", err)
        return ""
    if not Path(path).is_file():
        logger.warning("model selection on STS-B dev is off: %s does not exist (set eval.stsb_dev)", path)
        return ""
    return path


_VARIABLE = re.compile(r"\$(\w+|\{[^}]*\})")


def expand_path(value: str, key: str) -> str:
    """Expand ``$VAR`` / ``${VAR}`` and ``package:MODULE/SUBDIR``; an unset variable is an error."""
    missing = [m.group(1).strip("{}") for m in _VARIABLE.finditer(value) if m.group(1).strip("{}") not in os.environ]
    if missing:
        raise ValueError(f"{key} = {value!r} uses the environment variable {missing[0]}, which is not set")
    value = os.path.expanduser(os.path.expandvars(value))
    if value.startswith(PACKAGE_PREFIX):
        value = str(package_directory(value, key))
    return value

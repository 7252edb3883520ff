"""The training loop: one optimiser step = ``grad_accum_steps`` contrastive loss calls over the global batch.

:func:`build_trainer` assembles a run from its config: model, accelerator (DDP, gloo on CPU
or NCCL on GPU, or DeepSpeed ZeRO), the objective, the one :class:`TrainingStep`, the data
stream, the metrics sink. :class:`Trainer` only runs the loop over those parts (so a test can
hand it a stream of fixed batches): steps, logging, model selection on STS-B dev,
checkpoints and the final export. Each rank takes b = B / W sentences per loss call; the
objectives all-gather across ranks internally, so negatives and neighbours come from all B
sentences, and DDP / ZeRO gradient averaging gives the single-process gradient of the global
batch (see :mod:`vascl_scale.distributed` and :mod:`vascl_scale.train.step`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import transformers
from torch import Tensor

from vascl_scale import __version__
from vascl_scale.config import RunConfig, TrainConfig, save_config
from vascl_scale.config.schema import STSB_DEV_METRIC
from vascl_scale.distributed import local_world_size
from vascl_scale.flops import tflops_and_mfu
from vascl_scale.fs import replace_directory, replace_file, staging_directory
from vascl_scale.losses import build_objective
from vascl_scale.losses.spec import objective_spec
from vascl_scale.model import SentenceEncoder
from vascl_scale.model_card import CardFacts
from vascl_scale.train.checkpoint import (
    STATE_FILE,
    TrainerState,
    complete_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from vascl_scale.train.export import export_model
from vascl_scale.train.fsdp import is_sharded, shard_model
from vascl_scale.train.plan import DevSet, GuidePlan, RunPlan
from vascl_scale.train.run_lock import RunDirectoryLock
from vascl_scale.train.step import MODEL_INPUTS, NonFiniteLossError, TrainingStep, chunk_count, rows_per_forward
from vascl_scale.train.tracking import MetricsSink, NullMetricsSink

logger = logging.getLogger(__name__)

SUMMARY_FILE = "run_summary.json"  # what the last invocation did: Trainer._write_summary


@dataclass
class TrainResult:
    run_dir: Path
    steps: int
    best_score: float | None
    sentences_per_second: float  # global sentences per second of optimiser steps (this invocation)
    steady_sentences_per_second: float  # the same without the first step (data workers starting)


def build_accelerator(config: RunConfig, deepspeed_config: str | None, precision: str):
    """An Accelerator for this run: DDP (gloo on CPU, NCCL on GPU) or DeepSpeed ZeRO, in the
    resolved ``precision`` (:attr:`vascl_scale.train.plan.RunPlan.precision`)."""
    from accelerate import Accelerator, DeepSpeedPlugin
    from accelerate.utils import InitProcessGroupKwargs

    cuda = torch.cuda.is_available()
    # On a CPU the training step autocasts itself (TrainingStep): the accelerator stays float32
    # there, so that DeepSpeed keeps float32 weights as DDP does (its bf16 mode would cast them).
    kwargs: dict[str, Any] = {
        "mixed_precision": precision if cuda else "no",
        "gradient_accumulation_steps": config.train.grad_accum_steps,
    }
    if "RANK" in os.environ:  # started by a distributed launcher
        # Without CUDA, accelerate picks no backend for DeepSpeed on its own: name gloo.
        process_group = InitProcessGroupKwargs(
            backend=None if cuda else "gloo", timeout=timedelta(minutes=config.train.dist_timeout_minutes)
        )
        kwargs["kwargs_handlers"] = [process_group]
    if not cuda:
        # DeepSpeed's accelerator detection warns "Setting accelerator to CPU ... unable to detect
        # it" in every process that imports it on a machine without a GPU (each rank of a ZeRO run;
        # without DeepSpeed too, as transformers' save_pretrained and accelerate's unwrap_model
        # import it). Naming the accelerator before that import picks the same CPU accelerator the
        # detection falls back to, without the warning; a user's own DS_ACCELERATOR is kept.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if deepspeed_config is not None:
        # DeepSpeed's ZeRO partitioning calls torch.distributed's old names for these two
        # collectives, which torch now warns about on every rank; only DeepSpeed can change
        # that. Our own collectives (vascl_scale.distributed) use the current names, and the gloo
        # tests run them without this filter.
        warnings.filterwarnings(
            "ignore",
            message=r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated",
            category=FutureWarning,
        )
        kwargs["deepspeed_plugin"] = DeepSpeedPlugin(
            hf_ds_config=str(deepspeed_config),
            gradient_accumulation_steps=config.train.grad_accum_steps,
            gradient_clipping=config.optim.max_grad_norm,
            # The model is built before the Accelerator (see Trainer); ZeRO-3 partitions the
            # whole module at initialisation (fine for encoders of up to a few hundred M params).
            zero3_init_flag=False,
            zero3_save_16bit_model=True,
        )
    else:
        kwargs["cpu"] = not cuda
    return Accelerator(**kwargs)


def freeze_unreached_parameters(model: SentenceEncoder) -> list[str]:
    """Freeze parameters that get no gradient from the loss (e.g. BERT's pooler under mean pooling).

    DDP and ZeRO expect a gradient for every trainable parameter at every step; one probe
    forward/backward on two sentences through every module an objective calls (the head, and
    the pairwise classifier on them as one pair where the model has one) finds the ones the
    objective never reaches.
    """
    batch = model.tokenizer(["a probe sentence", "another"], padding=True, return_tensors="pt")
    e = model(**{k: v for k, v in batch.items() if k in MODEL_INPUTS})  # (2, d)
    probe = model.head(e).sum()
    if model.classifier is not None:
        probe = probe + model.classifier(e[:1], e[1:]).sum()
    probe.backward()
    unreached = [name for name, p in model.named_parameters() if p.requires_grad and p.grad is None]
    for name, p in model.named_parameters():
        p.grad = None
        if name in unreached:
            p.requires_grad_(False)
    return unreached


def build_optimizer(model: SentenceEncoder, config: RunConfig) -> torch.optim.Optimizer:
    """AdamW with the encoder at ``optim.lr`` and the head at ``optim.head_lr`` (Appendix A);
    PairSupCon's classifier is in the head's group (the authors scale both heads' rate alike)."""
    encoder_params = [p for p in model.encoder.parameters() if p.requires_grad]
    heads = [module for module in (model.head, model.classifier) if module is not None]
    head_params = [p for module in heads for p in module.parameters() if p.requires_grad]
    return torch.optim.AdamW(
        [
            {"params": encoder_params, "lr": config.optim.lr},
            {"params": head_params, "lr": config.optim.head_lr},
        ],
        betas=tuple(config.optim.betas),
        eps=config.optim.adam_eps,
        weight_decay=config.optim.weight_decay,
    )


def build_scheduler(optimizer: torch.optim.Optimizer, warmup_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over ``warmup_steps`` optimiser steps, then constant."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warmup_steps) if warmup_steps > 0 else 1.0
    )


def prepare_for_training(
    accelerator, model: torch.nn.Module, optimizer: torch.optim.Optimizer, train: TrainConfig, per_device_batch: int
):
    """``accelerator.prepare`` of the model and optimiser; under DeepSpeed, its "auto" batch
    sizes are filled first from the ``train`` section and the per-device batch (our stream is no
    accelerate DataLoader). A model FSDP2 has sharded (:func:`vascl_scale.train.fsdp.shard_model`,
    its optimiser built on the sharded parameters) is not wrapped: only the optimiser is
    prepared. With ``train.compile`` the encoder is compiled first (:func:`compile_encoder`)."""
    if is_sharded(model):  # FSDP2 (shard_model, which compiles per block): only the optimiser is prepared
        return model, accelerator.prepare(optimizer)
    plugin = accelerator.state.deepspeed_plugin
    if plugin is not None:
        plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = per_device_batch
        plugin.deepspeed_config["train_batch_size"] = train.global_batch_size * train.grad_accum_steps
    if train.compile:
        compile_encoder(model)
    return accelerator.prepare(model, optimizer)


def compile_encoder(model: SentenceEncoder) -> None:
    """``train.compile``: the Hugging Face encoder's forward through ``torch.compile``, in place.

    ``nn.Module.compile`` keeps the module and its parameter names (no ``_orig_mod.`` prefix),
    so checkpoints, exports and resumes are those of an eager run; pooling and the heads stay
    eager (small, and the objectives call the head on views they build). DDP's and ZeRO-2's
    gradient hooks sit on the parameters, outside the compiled graph. ZeRO-3 gathers each
    layer's parameters in hooks around its forward, which would break the graph at every layer:
    the run plan refuses it (:func:`vascl_scale.train.plan.make_plan`). Dropout under inductor
    draws its masks from seeds it takes of the global RNG, so the cached step's replay
    (restoring that RNG) gives the first pass's masks again (tests/test_compile.py).
    """
    model.encoder.compile()
    logger.info(
        "train.compile: the encoder runs through torch.compile; each new input shape compiles once, in the step that meets it"
    )


def lock_run_dir(accelerator, run_dir: Path) -> RunDirectoryLock | None:
    """Hold the run directory on rank 0.

    Every rank learns of a refusal together, so none waits at a later collective.
    """
    lock, error = None, None
    if accelerator.is_main_process:
        try:
            lock = RunDirectoryLock(run_dir).acquire()
        except ValueError as err:
            error = err
    refused = torch.tensor([0.0 if error is None else 1.0], device=accelerator.device)
    if accelerator.reduce(refused, reduction="sum").item() > 0:
        raise error or ValueError(f"run directory {run_dir} is in use by another run (see rank 0's error)")
    return lock


def build_stream(plan: RunPlan, tokenizer, rank: int, text_hashes: bool = False):
    """This rank's training stream, from the ``data`` section (one source, or a mix of several):
    the columns of the data the objective reads (:attr:`RunPlan.read_columns`), and each text
    column's hashes where it masks duplicates (``text_hashes``: its ``needs_text_hashes``)."""
    from vascl_scale.data.loader import build_train_stream
    from vascl_scale.data.mix import build_mixed_stream

    config = plan.config
    build = build_mixed_stream if config.data.mixed else build_train_stream
    return build(
        config.data,
        tokenizer=tokenizer,
        per_device_batch_size=plan.per_device_batch,
        rank=rank,
        world_size=plan.world_size,
        seed=config.train.seed,
        num_nodes=max(1, plan.world_size // local_world_size(plan.world_size)),
        columns=plan.read_columns,
        prompts=config.model.prompts,
        text_hashes=text_hashes,
    )


def build_model(plan: RunPlan) -> SentenceEncoder:
    """The model of ``plan``'s ``model`` section, its backbone as the plan decided (:attr:`RunPlan.backbone`):
    the weights in their dtype, LoRA adapters injected before the engine wraps the model."""
    from vascl_scale.backbone import DTYPES, lora_config_of

    section, backbone = plan.config.model, plan.backbone
    return SentenceEncoder.from_pretrained(
        section.path,
        pooling=section.pooling,
        head_dim=section.head_dim,
        trust_remote_code=section.trust_remote_code,
        pair_classifier=objective_spec(plan.config.objective).classifier,
        append_eos=backbone.append_eos,
        dtype=DTYPES[backbone.dtype],
        lora=lora_config_of(section.lora),
        gradient_checkpointing=section.gradient_checkpointing,
        attn_implementation=section.attn_implementation,
        packed=backbone.packed,
    )


def build_guide(guide: GuidePlan, device: torch.device) -> SentenceEncoder:
    """The frozen guide model of ``loss.guide_model`` on ``device``: evaluation mode (no dropout),
    no parameter trainable, outside every engine (each rank holds it whole)."""
    model = SentenceEncoder.from_pretrained(guide.directory, pooling=guide.pooling).to(device).eval()
    return model.requires_grad_(False)


def parameter_counts(model: torch.nn.Module) -> dict[str, int]:
    """Trainable and total parameters (before an engine shards them), for the log and run_summary.json."""
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"trainable": trainable, "total": total}


def build_trainer(plan: RunPlan) -> Trainer:
    """Assemble the run of ``plan`` (:func:`vascl_scale.train.plan.make_plan`) on every rank;
    resume from its checkpoint when it names one. Everything was checked when the plan was made."""
    config = plan.config
    transformers.utils.logging.disable_progress_bar()
    # Load before the Accelerator exists: once it does, transformers sees the ZeRO-3 config
    # and would build the encoder already partitioned (zero.Init), without the head. ZeRO-3
    # partitions the whole module in prepare() instead.
    torch.manual_seed(config.train.seed)  # the head starts identical on every rank
    model = build_model(plan)
    frozen = freeze_unreached_parameters(model)
    parameters = parameter_counts(model)
    model.train()
    acc = build_accelerator(config, plan.deepspeed_config, plan.precision)
    assert acc.num_processes == plan.world_size, (acc.num_processes, plan.world_size)
    run_dir = plan.run_dir
    # A launcher (or this process, in place) holds the run directory; workers of another launcher take it here.
    run_lock = lock_run_dir(acc, run_dir) if plan.lock_in_workers else plan.run_lock
    resume_from = Path(plan.resume_from) if plan.resume_from is not None else None
    state = TrainerState(step=0, world_size=plan.world_size, scheduler={})
    if resume_from is not None:
        state = TrainerState.from_file(resume_from / STATE_FILE)
    state.engine = plan.engine  # saved with each checkpoint: a resume under another engine is refused
    acc.wait_for_everyone()
    if acc.is_main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
        save_config(config, run_dir / "config.yaml")
    if frozen:
        logger.info("frozen (no gradient from the loss): %s", ", ".join(frozen))
    logger.info(
        "parameters: %d trainable of %d (%.2f%%)%s",
        parameters["trainable"],
        parameters["total"],
        100 * parameters["trainable"] / parameters["total"],
        f"; LoRA rank {config.model.lora.r} on the backbone, the heads in full" if config.model.lora.r else "",
    )

    if plan.fsdp is not None:  # before the optimiser, which must hold the sharded parameters
        logger.info("%s", shard_model(model, plan.fsdp, plan.precision, acc.device, config.train.compile))
    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config.optim.warmup_steps)
    # The scheduler stays outside prepare(): the loop steps it once per optimiser step and
    # saves it in trainer_state.json.
    prepared_model, prepared_optimizer = prepare_for_training(
        acc, model, optimizer, config.train, plan.per_device_batch
    )
    logger.info("training in %s", plan.precision_reason)
    step = TrainingStep(
        acc,
        prepared_model,
        prepared_optimizer,
        build_objective(config.objective, config.loss.model_dump()),
        seed=config.train.seed,
        per_device_batch=plan.per_device_batch,
        grad_accum_steps=config.train.grad_accum_steps,
        max_grad_norm=config.optim.max_grad_norm,
        chunk_size=config.train.chunk_size,
        precision=plan.precision,
        chunk_tokens=config.train.chunk_tokens,
        sort_chunks=config.train.sort_chunks,
        length_buckets=plan.length_buckets,
        reduce_every_backward=plan.fsdp is not None and plan.fsdp.gradient_sync == "backward",
        guide=build_guide(plan.guide, acc.device) if plan.guide is not None else None,
    )
    stream = build_stream(plan, model.tokenizer, acc.process_index, step.objective.needs_text_hashes)
    assert set(stream.columns) == set(plan.columns), (stream.columns, plan.columns)
    state.columns = list(plan.columns)  # saved with each checkpoint: a resume on other columns is refused
    _log_batch_arithmetic(plan, len(step.objective.spec.encoded_columns(plan.columns)))
    if resume_from is not None:
        stream.load_state_dict(load_checkpoint(acc, resume_from, step.sharded_state))
        scheduler.load_state_dict(state.scheduler)
        logger.info("resumed from %s at step %d", resume_from, state.step)
    dev = dev_scorer(plan.dev_set, config.model.prompts) if plan.dev_set is not None else None
    return Trainer(plan, step, scheduler, stream, state, dev, run_lock, parameters)


def dev_scorer(dev_set: DevSet, prompts: dict[str, str]) -> Callable[[Callable], float]:
    """The model-selection score of ``dev_set`` as a function of an ``encode(texts) -> (n, d)``:
    STS-B dev's Spearman x 100, or a retrieval directory's nDCG@10 x 100 (queries after the
    anchor's prompt, documents after the positive's, as the export names them)."""
    if dev_set.kind == "stsb":
        from vascl_scale.eval.sts import load_sts_tsv, spearman_score

        pairs = load_sts_tsv(dev_set.path)
        return lambda encode: spearman_score(encode, pairs)
    from vascl_scale.eval.retrieval import retrieval_dev_score
    from vascl_scale.sentence_transformers_format import export_prompts

    named = export_prompts(prompts)
    return lambda encode: retrieval_dev_score(encode, dev_set.path, dev_set.split, named)


def _log_batch_arithmetic(plan: RunPlan, views: int) -> None:
    """The global and per-device batch, and what one encoder forward holds (``views``: the columns encoded)."""
    cfg, world_size, per_device_batch = plan.config.train, plan.world_size, plan.per_device_batch
    logger.info(
        "global contrastive batch %d sentences = %d ranks x %d per device; %s",
        cfg.global_batch_size,
        world_size,
        per_device_batch,
        "no gradient accumulation"
        if cfg.grad_accum_steps == 1
        else f"gradient accumulation x{cfg.grad_accum_steps}: {cfg.global_batch_size * cfg.grad_accum_steps} "
        f"sentences per update, but each loss still sees only {cfg.global_batch_size} (accumulation adds no negatives)",
    )
    rows = rows_per_forward(per_device_batch, cfg.chunk_size, views)
    if cfg.chunk_size == 0:
        logger.info(
            "the encoder forwards of a loss call hold the activations of %d sentences (%d views of %d)%s",
            rows,
            views,
            per_device_batch,
            "" if plan.length_buckets == 1 else f", in {plan.length_buckets} length-sorted forwards",
        )
        return
    chunks = chunk_count(per_device_batch, cfg.chunk_size)
    order = "rows of similar length (sorted within the device's batch)" if cfg.sort_chunks else "rows in batch order"
    budget = f" and at most {cfg.chunk_tokens} tokens" if cfg.chunk_tokens else ""
    logger.info(
        "cached step: %s%d chunks of up to %d sentences%s per view and device, of %s, each cut to its longest row "
        "(%d x that many forwards without gradient, again with it); activations of at most %d sentences at a time "
        "instead of %d; the loss, its negatives and neighbours still span all %d sentences",
        "at least " if cfg.chunk_tokens else "",
        chunks,
        cfg.chunk_size,
        budget,
        order,
        views,
        rows,
        views * per_device_batch,
        cfg.global_batch_size,
    )


class Trainer:
    """Runs the loop over the parts :func:`build_trainer` assembled."""

    def __init__(
        self,
        plan: RunPlan,
        step: TrainingStep,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        stream,
        state: TrainerState,
        dev_score: Callable[[Callable], float] | None = None,
        run_lock: RunDirectoryLock | None = None,
        parameters: dict[str, int] | None = None,
    ) -> None:
        self.plan = plan
        self.parameters = parameters  # trainable and total (parameter_counts)
        self.config = plan.config
        self.step = step
        self.accelerator = step.accelerator
        self.world_size = plan.world_size
        self.scheduler = scheduler
        self.stream = stream
        self.state = state
        self.run_dir = plan.run_dir
        self.dev_score = dev_score  # dev_scorer's, None when model selection is off
        self.run_lock = run_lock  # held for the life of the trainer
        self.drop_logged = False  # the stream's dropped partial batches are logged once

    def _mean_over_ranks(self, stats: dict[str, float]) -> dict[str, float]:
        names = sorted(stats)
        values = torch.tensor([stats[n] for n in names], dtype=torch.float64, device=self.accelerator.device)
        values = self.accelerator.reduce(values, reduction="mean")
        return dict(zip(names, values.tolist()))

    def _evaluate(self) -> float | None:
        """The dev score (:func:`dev_scorer`) of the encoder alone (no head); None when off."""
        if self.dev_score is None:
            return None
        module = self.accelerator.unwrap_model(self.step.model)

        def encode(texts: list[str]):
            return module.encode(texts, batch_size=self.config.eval.batch_size, max_length=self.config.eval.max_length)

        score = None
        # ZeRO-3 and FSDP2 gather each submodule's shards in its forward: every rank must encode.
        if self.accelerator.is_main_process or self.plan.parameters_sharded:
            score = self.dev_score(encode)
        self.accelerator.wait_for_everyone()
        return score

    def _save(self) -> None:
        self.state.scheduler = self.scheduler.state_dict()
        save_checkpoint(
            self.accelerator,
            self.run_dir,
            self.config,
            self.state,
            self.stream.state_dict(),
            self.config.checkpoint.keep_last,
            self.step.sharded_state,
        )

    def _card(self, dev_score: float | None) -> CardFacts:
        """The model card's facts of the weights now (``dev_score``: their STS-B dev score, if measured)."""
        return CardFacts(
            config=self.config.as_written().to_dict(),
            step=self.state.step,
            world_size=self.world_size,
            zero_stage=self.plan.zero_stage,
            device_type=self.accelerator.device.type,
            precision=self.step.precision,
            embedding_dimension=self.accelerator.unwrap_model(self.step.model).hidden_size,
            vascl_scale_version=__version__,
            dev_score=dev_score if dev_score is not None and math.isfinite(dev_score) else None,
            dev_metric=self.plan.dev_set.metric if self.plan.dev_set is not None else STSB_DEV_METRIC,
            dev_title=self.plan.dev_set.title if self.plan.dev_set is not None else "STS-B dev Spearman",
            fsdp_strategy=self.plan.fsdp.sharding_strategy if self.plan.fsdp is not None else None,
        )

    def _export(self, name: str, dev_score: float | None) -> None:
        """Export the weights now to ``<run>/<name>``, with their card; all ranks call this."""
        export_model(
            self.accelerator,
            self.step.model,
            self.run_dir / name,
            self.config.eval.max_length,
            self._card(dev_score),
            self.config.model.prompts,
        )

    def _select(self, step: int, metrics: MetricsSink | NullMetricsSink) -> float | None:
        """Evaluate; export last/ and, when the dev score improved, best/. Returns the dev score
        (None when off; on rank 0 only, unless the parameters are sharded: ZeRO-3, FSDP2)."""
        score = self._evaluate()
        self._export("last", score)
        if score is None:
            return None
        if not math.isfinite(score):  # constant or non-finite similarities: a collapsed encoder, no candidate
            if self.accelerator.is_main_process:
                logger.warning(
                    "step %d: %s is undefined (the encoder's similarities are constant or not finite); best/ is kept",
                    step,
                    self.plan.dev_set.title,
                )
            return None
        best, best_step = self.state.best_score, self.state.best_step
        improved = best is None or score > best
        if self.accelerator.is_main_process:
            if best is None:
                verdict = "new best (the first evaluation)"
            elif improved:
                verdict = f"new best (the previous best {best:.2f} at step {best_step})"
            else:
                verdict = f"best so far {best:.2f} at step {best_step}"
            logger.info("step %d: %s %.2f, %s", step, self.plan.dev_set.title, score, verdict)
        if improved:
            self.state.best_score, self.state.best_step = score, step
            if self.accelerator.is_main_process:
                best_dir = self.run_dir / "best"
                staging = staging_directory(best_dir)
                shutil.copytree(self.run_dir / "last", staging, dirs_exist_ok=True)
                replace_directory(staging, best_dir)
        metrics.log(step, {self.plan.dev_set.metric: score})
        return score

    def _stopped_by_a_non_finite_loss(self, err: NonFiniteLossError) -> NonFiniteLossError:
        """The error with what is left to resume from."""
        saved = complete_checkpoints(self.run_dir)
        kept = (
            f"the last good checkpoint is {saved[-1]} (resume with --resume)"
            if saved
            else "no checkpoint had been written yet, so the run must start again (lower optim.lr, "
            "or set checkpoint.every_steps to keep good states)"
        )
        return NonFiniteLossError(f"{err}; {kept}")

    def fit(self) -> TrainResult:
        cfg = self.config
        acc = self.accelerator
        sentences_per_step = cfg.train.global_batch_size * cfg.train.grad_accum_steps
        # Rank 0 writes metrics; every other rank gets a sink that drops them.
        metrics = (
            MetricsSink(
                self.run_dir,
                self.state.step,
                cfg.train.max_steps,
                self.plan.trackers,
                cfg.as_written().to_dict(),
            )
            if acc.is_main_process
            else NullMetricsSink()
        )
        batches: Iterator[dict[str, Tensor]] = iter(self.stream)
        start_step = self.state.step
        step_seconds: list[float] = []  # optimiser steps only: evaluation and checkpoints excluded
        window = _Window()
        dev_score = None  # of the weights now: measured at the latest step, if evaluated there
        try:
            for step in range(start_step, cfg.train.max_steps):
                done = step + 1
                logs = done % cfg.train.log_every == 0 or done == cfg.train.max_steps
                step_started = time.perf_counter()
                try:
                    result = self.step(batches, step, with_stats=logs)
                except NonFiniteLossError as err:
                    raise self._stopped_by_a_non_finite_loss(err) from None
                self.scheduler.step()
                step_seconds.append(time.perf_counter() - step_started)
                window.add(result.terms, step_seconds[-1], result.model_flops)
                self.state.step = done
                if logs:
                    self._log_window(done, window, result.stats, step_seconds[-1], sentences_per_step, metrics)
                    window = _Window()
                metrics.advance(done)  # after the window's losses, so a plain progress line carries them
                dev_score = None
                if cfg.eval.every_steps and done % cfg.eval.every_steps == 0:
                    dev_score = self._select(done, metrics)
                if (
                    cfg.checkpoint.every_steps
                    and done % cfg.checkpoint.every_steps == 0
                    and done != cfg.train.max_steps
                ):
                    self._save()
            if cfg.eval.every_steps and self.state.step % cfg.eval.every_steps != 0:
                dev_score = self._select(self.state.step, metrics)
            self._save()
            self._export("final", dev_score)
        finally:
            metrics.close()
        steps_run = len(step_seconds)
        rate = steps_run * sentences_per_step / sum(step_seconds) if steps_run else math.nan
        # The first step also starts the data workers and fills their buffers.
        steady = (steps_run - 1) * sentences_per_step / sum(step_seconds[1:]) if steps_run > 1 else math.nan
        logger.info(
            "finished %d steps (%d in this invocation, %.1f s of steps): %.1f sentences/s, %.1f without the first step; "
            "exported %s",
            self.state.step,
            steps_run,
            sum(step_seconds),
            rate,
            steady,
            self.run_dir / "final",
        )
        if acc.is_main_process:
            self._write_summary(start_step, step_seconds, rate, steady)
        return TrainResult(self.run_dir, self.state.step, self.state.best_score, rate, steady)

    def _write_summary(self, start_step: int, step_seconds: list[float], rate: float, steady: float) -> None:
        """``<run>/run_summary.json``: what this invocation did, for the GPU proof, sweeps and
        benchmarks to read instead of the log's wording (replaced whole by each invocation)."""

        def number(value: float) -> float | None:  # JSON has no NaN
            return value if math.isfinite(value) else None

        plan, steps_run = self.plan, len(step_seconds)
        device = self.accelerator.device
        exports = {
            name: str(self.run_dir / name) for name in ("final", "best", "last") if (self.run_dir / name).is_dir()
        }
        summary = {
            "steps": self.state.step,
            "steps_this_invocation": steps_run,
            "resumed_from": plan.resume_from,
            "resumed_at_step": start_step if plan.resume_from is not None else None,
            "seconds_of_steps": sum(step_seconds),
            "seconds_per_step": sum(step_seconds) / steps_run if steps_run else None,
            "sentences_per_second": number(rate),
            "steady_sentences_per_second": number(steady),
            "peak_memory_mb": torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None,
            "best_dev": (
                {"score": self.state.best_score, "step": self.state.best_step}
                if self.state.best_score is not None
                else None
            ),
            "exports": exports,
            "world_size": plan.world_size,
            "precision": plan.precision,
            "engine": plan.engine,
            "zero_stage": plan.zero_stage,
            "fsdp": plan.fsdp.model_dump() if plan.fsdp is not None else None,
            "parameters": self.parameters,
        }
        replace_file(self.run_dir / SUMMARY_FILE, json.dumps(summary, indent=2, allow_nan=False))

    def end_process_group(self) -> None:
        """After :meth:`fit`, in a process about to exit: once every rank is done, end the process
        group. A worker that exits with gloo's threads still running can abort ("terminate called
        without an active exception", exit -6), failing a run that finished and exported."""
        self.accelerator.wait_for_everyone()
        self.accelerator.end_training()

    def _log_window(
        self,
        step: int,
        window: _Window,
        stats: dict[str, float],
        last_step_seconds: float,
        sentences_per_step: int,
        metrics: MetricsSink | NullMetricsSink,
    ) -> None:
        """Loss terms averaged over the window's steps and the ranks, the logging step's
        diagnostics averaged over the ranks; rank 0 writes them."""
        terms = {name: float(total) / window.steps for name, total in window.terms.items()}  # one sync
        diagnostics = {name: value for name, value in stats.items() if name not in terms}
        means = self._mean_over_ranks({f"loss/{k}": v for k, v in {**terms, **diagnostics}.items()})
        values = {
            **means,
            "sentences_per_second": window.steps * sentences_per_step / window.seconds,
            "step_seconds": last_step_seconds,
            "lr/encoder": self.scheduler.get_last_lr()[0],
            "lr/head": self.scheduler.get_last_lr()[1],
        }
        # Data counters (samples read, per source of a mix too, corrupt shards skipped, ...)
        # summed over the distinct streams read (the ranks; one in global mode, where every rank
        # reads the same), so that nothing the stream drops goes unreported and nothing is
        # counted twice; the epochs (a mix's: data_epoch/<source>) are the mean over ranks.
        data = self._mean_over_ranks({k: float(v) for k, v in self.stream.stats().items()})
        for name, value in data.items():
            values[f"data/{name.removeprefix('data_')}"] = (
                value if name.startswith("data_epoch") else value * self.stream.readers
            )
        if values["data/samples_dropped"] > 0 and not self.drop_logged:
            self._log_first_drop(step, int(round(values["data/samples_dropped"])))
        if window.flops:  # rank 0's device; every rank runs the same shapes but its own padding
            values["tflops_per_device"], mfu = tflops_and_mfu(
                window.flops, window.seconds, self.config.train.peak_tflops
            )
            if mfu is not None:
                values["mfu"] = mfu
        if self.accelerator.device.type == "cuda":  # this rank's peak since the start, for sweeps
            values["peak_memory_mb"] = torch.cuda.max_memory_allocated(self.accelerator.device) / 2**20
        shown = ("loss/loss", "loss/simcse", "loss/neighbourhood")  # all terms go to the JSONL
        summary = " ".join(f"{k.removeprefix('loss/')} {means[k]:.4f}" for k in shown if k in means)
        summary += f" | {values['sentences_per_second']:.1f} sent/s | {values['step_seconds']:.2f} s/step"
        if "tflops_per_device" in values:
            summary += f" | {values['tflops_per_device']:.3g} TFLOP/s" + (
                f", MFU {values['mfu']:.1%}" if "mfu" in values else ""
            )
        metrics.log(step, values, summary)

    def _log_first_drop(self, step: int, dropped: int) -> None:
        """One line, the first time the ranks' streams dropped the end of a data epoch."""
        self.drop_logged = True
        if not self.accelerator.is_main_process:
            return
        first = self.stream.first_drop
        where = f"; rank 0 dropped {first[1]} at the end of data epoch {first[0]}" if first is not None else ""
        logger.info(
            "data: %d samples dropped by step %d%s: the rows left at the end of a data epoch that do not fill a "
            "per-device batch of %d are not trained on (a partial batch would weigh its rows more in the loss "
            "and give them fewer negatives); the next epoch reshuffles. Counted in data/samples_dropped; logged once",
            dropped,
            step,
            where,
            self.stream.batch_size,
        )


@dataclass
class _Window:
    """Loss terms (summed on the device, no host sync) and time of the steps since the last log line."""

    steps: int = 0
    seconds: float = 0.0
    flops: int = 0  # model FLOPs of this device
    terms: dict[str, Tensor] = field(default_factory=dict)

    def add(self, terms: dict[str, Tensor], seconds: float, flops: int = 0) -> None:
        self.steps += 1
        self.seconds += seconds
        self.flops += flops
        for name, value in terms.items():
            self.terms[name] = self.terms.get(name, 0.0) + value

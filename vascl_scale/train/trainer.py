"""The training loop: one optimiser step = ``grad_accum_steps`` contrastive loss calls over the global batch.

Per loss call, each of the W ranks takes b = B / W sentences from its data stream, encodes
them twice in one forward (the batch stacked on itself, (2b, L): dropout gives the two
views), and calls the objective on its slice; the loss all-gathers across ranks internally,
so negatives and neighbours come from all B sentences, and DDP / ZeRO gradient averaging
gives the single-process gradient of the global batch (see :mod:`vascl_scale.distributed`).

Randomness is a function of (seed, loss call, rank): the dropout masks and VaSCL's initial
direction are seeded per loss call, so a resumed run repeats exactly what an uninterrupted
run would have done, whatever the data workers or checkpointing consumed in between.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.nn.functional as F
import transformers
from torch import Tensor

from vascl_scale.config import RunConfig, expand_path, save_config
from vascl_scale.model import SentenceEncoder
from vascl_scale.train.checkpoint import (
    TrainerState,
    check_resume_compatible,
    complete_checkpoints,
    load_checkpoint,
    prepare_run_dir,
    resolve_resume,
    save_checkpoint,
)
from vascl_scale.train.export import export_model
from vascl_scale.train.run_lock import HELD_ENV, RunDirectoryLock
from vascl_scale.train.tracking import MetricsSink

logger = logging.getLogger(__name__)

MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class NonFiniteLossError(RuntimeError):
    """The loss was NaN or infinite on some rank; the step was not applied."""


@dataclass
class TrainResult:
    run_dir: Path
    steps: int
    best_score: float | None
    sentences_per_second: float  # global sentences per second of optimiser steps (this invocation)
    steady_sentences_per_second: float  # the same without the first step (data workers starting)


def deepspeed_path_from_environment() -> str | None:
    """The DeepSpeed config an ``accelerate launch --config_file`` (DeepSpeed type) passed down."""
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        return os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE")
    return None


def build_accelerator(config: RunConfig, deepspeed_config: str | None):
    """An Accelerator for this run: DDP (gloo on CPU, NCCL on GPU) or DeepSpeed ZeRO."""
    from accelerate import Accelerator, DeepSpeedPlugin
    from accelerate.utils import InitProcessGroupKwargs

    cuda = torch.cuda.is_available()
    precision = config.train.precision
    if precision == "auto":
        precision = "bf16" if cuda and torch.cuda.is_bf16_supported() else "no"
    if precision != "no" and not cuda:
        raise ValueError(f"train.precision = {precision!r} needs a CUDA device; use 'no' or 'auto' on CPU")
    kwargs: dict[str, Any] = {"mixed_precision": precision, "gradient_accumulation_steps": config.train.grad_accum_steps}
    if "RANK" in os.environ:  # started by a distributed launcher
        # Without CUDA, accelerate picks no backend for DeepSpeed on its own: name gloo.
        process_group = InitProcessGroupKwargs(
            backend=None if cuda else "gloo", timeout=timedelta(minutes=config.train.dist_timeout_minutes)
        )
        kwargs["kwargs_handlers"] = [process_group]
    if deepspeed_config is not None:
        if not Path(deepspeed_config).is_file():
            raise ValueError(f"--deepspeed {deepspeed_config}: no such file")
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
    forward/backward on two sentences finds the ones the objective never reaches.
    """
    batch = model.tokenizer(["a probe sentence", "another"], padding=True, return_tensors="pt")
    e = model(**{k: v for k, v in batch.items() if k in MODEL_INPUTS})  # (2, d)
    model.head(e).sum().backward()
    unreached = [name for name, p in model.named_parameters() if p.requires_grad and p.grad is None]
    for name, p in model.named_parameters():
        p.grad = None
        if name in unreached:
            p.requires_grad_(False)
    return unreached


def build_optimizer(model: SentenceEncoder, config: RunConfig) -> torch.optim.Optimizer:
    """AdamW with the encoder at ``optim.lr`` and the head at ``optim.head_lr`` (Appendix A)."""
    encoder_params = [p for p in model.encoder.parameters() if p.requires_grad]
    head_params = [p for p in model.head.parameters() if p.requires_grad]
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


def loss_call_seed(seed: int, loss_call: int, rank: int) -> int:
    """Seed of one loss call on one rank (dropout masks, VaSCL's initial direction)."""
    return (seed * 1_000_003 + loss_call * 8191 + rank) % (2**63 - 1)


def contrastive_objective(
    config: RunConfig, head: torch.nn.Module, e1: Tensor, e2: Tensor, generator: torch.Generator
) -> tuple[Tensor, dict[str, float]]:
    """The configured objective on this rank's (b, d) embeddings of the two views."""
    from vascl_scale.losses import simcse_loss, vascl_loss

    loss_cfg = config.loss
    if config.objective == "simcse":
        z1 = F.normalize(head(e1), dim=-1)  # (b, D)
        z2 = F.normalize(head(e2), dim=-1)  # (b, D)
        loss = simcse_loss(z1, z2, temperature=loss_cfg.temperature)
        return loss, {"loss": float(loss.detach()), "simcse": float(loss.detach())}
    return vascl_loss(
        e1,
        e2,
        head,
        k=loss_cfg.k,
        temperature=loss_cfg.temperature,
        xi=loss_cfg.xi,
        eps=loss_cfg.eps,
        power_iters=loss_cfg.power_iters,
        detach=loss_cfg.detach,
        generator=generator,
        similarity=loss_cfg.similarity,
        eps_mode=loss_cfg.eps_mode,
        xi_mode=loss_cfg.xi_mode,
    )


def stsb_dev_pairs(config: RunConfig):
    """STS-B dev pairs for model selection, or None (with one warning) when unavailable."""
    if config.eval.every_steps == 0:
        return None
    try:
        path = Path(expand_path(config.eval.stsb_dev, "eval.stsb_dev"))
    except ValueError as err:
        logger.warning("model selection on STS-B dev is off: %s", err)
        return None
    if not path.is_file():
        logger.warning("model selection on STS-B dev is off: %s does not exist (set eval.stsb_dev)", path)
        return None
    from vascl_scale.eval.sts import load_sts_tsv

    return load_sts_tsv(path)


class Trainer:
    """Builds model, optimiser and data stream for a config, then runs the loop."""

    def __init__(self, config: RunConfig, deepspeed_config: str | None = None, resume: str | None = None) -> None:
        self.config = config
        self.deepspeed = deepspeed_config is not None
        transformers.utils.logging.disable_progress_bar()
        # Load before the Accelerator exists: once it does, transformers sees the ZeRO-3 config
        # and would build the encoder already partitioned (zero.Init), without the head. ZeRO-3
        # partitions the whole module in prepare() instead.
        torch.manual_seed(config.train.seed)  # the head starts identical on every rank
        model = SentenceEncoder.from_pretrained(
            expand_path(config.model.path, "model.path"),
            pooling=config.model.pooling,
            head_dim=config.model.head_dim,
            trust_remote_code=config.model.trust_remote_code,
        )
        frozen = freeze_unreached_parameters(model)
        model.train()
        self.accelerator = build_accelerator(config, deepspeed_config)
        acc = self.accelerator
        self.world_size = acc.num_processes
        self.rank = acc.process_index
        self.per_device_batch = config.per_device_batch_size(self.world_size)
        self.run_dir = Path(config.train.output_dir)
        self.run_lock = self._lock_run_dir()
        prepare_run_dir(self.run_dir, resume)
        self.resume_from = resolve_resume(resume, self.run_dir) if resume is not None else None
        self.state = TrainerState(step=0, world_size=self.world_size, scheduler={})
        if self.resume_from is not None:
            self.state = check_resume_compatible(self.resume_from, config, self.world_size)
        acc.wait_for_everyone()
        if acc.is_main_process:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            save_config(config, self.run_dir / "config.yaml")
        self._log_batch_arithmetic()
        if frozen:
            logger.info("frozen (no gradient from the loss): %s", ", ".join(frozen))

        optimizer = build_optimizer(model, config)
        self.scheduler = build_scheduler(optimizer, config.optim.warmup_steps)
        if self.deepspeed:
            ds_config = acc.state.deepspeed_plugin.deepspeed_config
            # Our data stream is not an accelerate DataLoader, so fill DeepSpeed's "auto" batch sizes.
            ds_config["train_micro_batch_size_per_gpu"] = self.per_device_batch
            ds_config["train_batch_size"] = config.train.global_batch_size * config.train.grad_accum_steps
        # The scheduler stays outside prepare(): we step it once per optimiser step ourselves
        # and save it in trainer_state.json.
        self.model, self.optimizer = acc.prepare(model, optimizer)
        self.tokenizer = model.tokenizer
        self.stream = self._build_stream()

        if self.resume_from is not None:
            data_state = load_checkpoint(acc, self.resume_from)
            self.stream.load_state_dict(data_state)
            self.scheduler.load_state_dict(self.state.scheduler)
            logger.info("resumed from %s at step %d", self.resume_from, self.state.step)
        self.dev_pairs = stsb_dev_pairs(config)

    def _lock_run_dir(self) -> RunDirectoryLock | None:
        """Hold the run directory on rank 0, unless the process that started this run holds it.

        Every rank learns of a refusal together, so none waits at a later collective.
        """
        lock, error = None, None
        if os.environ.get(HELD_ENV) != "1" and self.accelerator.is_main_process:
            try:
                lock = RunDirectoryLock(self.run_dir).acquire()
            except ValueError as err:
                error = err
        refused = torch.tensor([0.0 if error is None else 1.0], device=self.accelerator.device)
        if self.accelerator.reduce(refused, reduction="sum").item() > 0:
            raise error or ValueError(f"run directory {self.run_dir} is in use by another run (see rank 0's error)")
        return lock

    def _log_batch_arithmetic(self) -> None:
        cfg = self.config.train
        logger.info(
            "global contrastive batch %d sentences = %d ranks x %d per device; %s",
            cfg.global_batch_size,
            self.world_size,
            self.per_device_batch,
            "no gradient accumulation"
            if cfg.grad_accum_steps == 1
            else f"gradient accumulation x{cfg.grad_accum_steps}: {cfg.global_batch_size * cfg.grad_accum_steps} "
            f"sentences per update, but each loss still sees only {cfg.global_batch_size} (accumulation adds no negatives)",
        )

    def _build_stream(self):
        from vascl_scale.data.loader import build_train_stream

        data = self.config.data
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", self.world_size))
        return build_train_stream(
            expand_path(data.train, "data.train"),
            tokenizer=self.tokenizer,
            per_device_batch_size=self.per_device_batch,
            max_length=data.max_length,
            rank=self.rank,
            world_size=self.world_size,
            seed=self.config.train.seed,
            num_workers=data.num_workers,
            mode=data.mode,
            num_nodes=max(1, self.world_size // local_world),
            shuffle_buffer=data.shuffle_buffer,
            on_corrupt=data.on_corrupt,
            allow_pipe=data.allow_pipe,
            pipe_timeout=data.pipe_timeout,
        )

    @property
    def head(self) -> torch.nn.Module:
        """The projection head of the unwrapped module (the losses call it directly)."""
        return self.accelerator.unwrap_model(self.model).head

    def _loss_call(self, batch: dict[str, Tensor], loss_call: int) -> tuple[Tensor, dict[str, float]]:
        acc = self.accelerator
        seed = loss_call_seed(self.config.train.seed, loss_call, self.rank)
        torch.manual_seed(seed)  # dropout masks of this loss call
        generator = torch.Generator(device=acc.device).manual_seed(seed)
        # Both dropout views in one forward: (2b, L) -> (2b, d).
        inputs = {k: torch.cat([v, v]).to(acc.device) for k, v in batch.items() if k in MODEL_INPUTS}
        rows = inputs["input_ids"].shape[0] // 2
        if rows != self.per_device_batch:
            raise RuntimeError(f"the data stream gave {rows} rows; expected the per-device batch {self.per_device_batch}")
        embeddings = self.model(**inputs)  # (2b, d)
        e1, e2 = embeddings[:rows], embeddings[rows:]  # (b, d) each
        with acc.autocast():
            return contrastive_objective(self.config, self.head, e1, e2, generator)

    def _require_finite(self, loss: Tensor, step: int) -> None:
        """Stop every rank together when any rank's loss is NaN or infinite (before the update)."""
        bad = torch.tensor([0.0 if torch.isfinite(loss.detach()).all() else 1.0], device=self.accelerator.device)
        if self.accelerator.reduce(bad, reduction="sum").item() > 0:
            saved = complete_checkpoints(self.run_dir)
            kept = (
                f"the last good checkpoint is {saved[-1]} (resume with --resume)"
                if saved
                else "no checkpoint had been written yet, so the run must start again (lower optim.lr, "
                "or set checkpoint.every_steps to keep good states)"
            )
            raise NonFiniteLossError(f"non-finite loss at step {step + 1}; the update was not applied; {kept}")

    def _mean_over_ranks(self, stats: dict[str, float]) -> dict[str, float]:
        names = sorted(stats)
        values = torch.tensor([stats[n] for n in names], dtype=torch.float64, device=self.accelerator.device)
        values = self.accelerator.reduce(values, reduction="mean")
        return dict(zip(names, values.tolist()))

    def _evaluate(self) -> float | None:
        """Spearman x 100 on STS-B dev with the encoder alone (no head); None when off."""
        if self.dev_pairs is None:
            return None
        from vascl_scale.eval.sts import spearman_score

        module = self.accelerator.unwrap_model(self.model)

        def encode(texts: list[str]):
            return module.encode(texts, batch_size=self.config.eval.batch_size, max_length=self.config.eval.max_length)

        score = None
        # ZeRO-3 gathers each submodule's shards in its forward: every rank must encode.
        if self.accelerator.is_main_process or self._zero_stage() == 3:
            score = spearman_score(encode, self.dev_pairs)
        self.accelerator.wait_for_everyone()
        return score

    def _zero_stage(self) -> int:
        if not self.deepspeed:
            return 0
        return int(self.accelerator.state.deepspeed_plugin.zero_stage)

    def _save(self) -> None:
        self.state.scheduler = self.scheduler.state_dict()
        save_checkpoint(
            self.accelerator,
            self.run_dir,
            self.config,
            self.state,
            self.stream.state_dict(),
            self.config.checkpoint.keep_last,
        )

    def _select(self, step: int) -> None:
        """Evaluate; export last/ and, when the dev score improved, best/."""
        score = self._evaluate()
        export_model(self.accelerator, self.model, self.run_dir / "last", self.config.eval.max_length)
        if score is None:
            return
        if self.accelerator.is_main_process:
            logger.info("step %d: STS-B dev Spearman %.2f (best %s)", step, score, self.state.best_score)
        improved = self.state.best_score is None or score > self.state.best_score
        if improved:
            self.state.best_score, self.state.best_step = score, step
            if self.accelerator.is_main_process:
                best = self.run_dir / "best"
                staging = self.run_dir / ".tmp-best"
                shutil.rmtree(staging, ignore_errors=True)
                shutil.copytree(self.run_dir / "last", staging)
                shutil.rmtree(best, ignore_errors=True)
                staging.rename(best)
        if self.metrics is not None:
            self.metrics.log(step, {"stsb_dev_spearman": score})

    def _optimizer_step(self, batches: Iterator[dict[str, Tensor]], step: int) -> dict[str, float]:
        """``grad_accum_steps`` loss calls and one update; their stats averaged."""
        cfg = self.config
        acc = self.accelerator
        accum = cfg.train.grad_accum_steps
        mean_stats: dict[str, float] = {}
        for micro in range(accum):
            batch = next(batches)
            with acc.accumulate(self.model):
                loss, stats = self._loss_call(batch, step * accum + micro)
                self._require_finite(loss, step)
                acc.backward(loss)
                if cfg.optim.max_grad_norm > 0 and acc.sync_gradients and not self.deepspeed:
                    acc.clip_grad_norm_(self.model.parameters(), cfg.optim.max_grad_norm)
                self.optimizer.step()  # a no-op until the last micro step (accelerate / DeepSpeed)
                self.optimizer.zero_grad()
            for name, value in stats.items():
                mean_stats[name] = mean_stats.get(name, 0.0) + value / accum
        self.scheduler.step()
        return mean_stats

    def fit(self) -> TrainResult:
        cfg = self.config
        acc = self.accelerator
        sentences_per_step = cfg.train.global_batch_size * cfg.train.grad_accum_steps
        self.metrics = MetricsSink(self.run_dir, self.state.step, cfg.train.max_steps) if acc.is_main_process else None
        batches: Iterator[dict[str, Tensor]] = iter(self.stream)
        start_step = self.state.step
        step_seconds: list[float] = []  # optimiser steps only: evaluation and checkpoints excluded
        window = _Window()
        try:
            for step in range(start_step, cfg.train.max_steps):
                step_started = time.perf_counter()
                stats = self._optimizer_step(batches, step)
                step_seconds.append(time.perf_counter() - step_started)
                window.add(stats, step_seconds[-1])
                self.state.step = done = step + 1
                if self.metrics is not None:
                    self.metrics.advance(done)
                if done % cfg.train.log_every == 0 or done == cfg.train.max_steps:
                    self._log_window(done, window, step_seconds[-1], sentences_per_step)
                    window = _Window()
                if cfg.eval.every_steps and done % cfg.eval.every_steps == 0:
                    self._select(done)
                if cfg.checkpoint.every_steps and done % cfg.checkpoint.every_steps == 0 and done != cfg.train.max_steps:
                    self._save()
            if cfg.eval.every_steps and self.state.step % cfg.eval.every_steps != 0:
                self._select(self.state.step)
            self._save()
            export_model(acc, self.model, self.run_dir / "final", cfg.eval.max_length)
        finally:
            if self.metrics is not None:
                self.metrics.close()
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
        return TrainResult(self.run_dir, self.state.step, self.state.best_score, rate, steady)

    def _log_window(self, step: int, window: "_Window", last_step_seconds: float, sentences_per_step: int) -> None:
        """Average the window's stats over steps and ranks; rank 0 writes them."""
        means = self._mean_over_ranks({f"loss/{k}": v / window.steps for k, v in window.stats.items()})
        values = {
            **means,
            "sentences_per_second": window.steps * sentences_per_step / window.seconds,
            "step_seconds": last_step_seconds,
            "lr/encoder": self.scheduler.get_last_lr()[0],
            "lr/head": self.scheduler.get_last_lr()[1],
        }
        # Data counters (samples read, corrupt shards skipped, ...) summed over ranks, so that
        # nothing the stream drops goes unreported; the epoch is the mean over ranks.
        data = self._mean_over_ranks({k: float(v) for k, v in self.stream.stats().items()})
        for name, value in data.items():
            values[f"data/{name.removeprefix('data_')}"] = value if name == "data_epoch" else value * self.world_size
        if self.accelerator.device.type == "cuda":  # this rank's peak since the start, for sweeps
            values["peak_memory_mb"] = torch.cuda.max_memory_allocated(self.accelerator.device) / 2**20
        if self.metrics is not None:
            shown = ("loss/loss", "loss/simcse", "loss/neighbourhood")  # all terms go to the JSONL
            terms = " ".join(f"{k.removeprefix('loss/')} {means[k]:.4f}" for k in shown if k in means)
            summary = f"{terms} | {values['sentences_per_second']:.1f} sent/s | {values['step_seconds']:.2f} s/step"
            self.metrics.log(step, values, summary)


@dataclass
class _Window:
    """Stats and time of the optimiser steps since the last metrics line."""

    steps: int = 0
    seconds: float = 0.0
    stats: dict[str, float] = field(default_factory=dict)

    def add(self, stats: dict[str, float], seconds: float) -> None:
        self.steps += 1
        self.seconds += seconds
        for name, value in stats.items():
            self.stats[name] = self.stats.get(name, 0.0) + value

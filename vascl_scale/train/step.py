"""One training step, written once: what ``vascl-scale train`` runs and every benchmark measures.

A loss call: this rank's b sentences enter the encoder twice in one forward, the batch stacked
on itself ((2b, L) -> (2b, d); dropout gives the two views), and the configured objective
(:func:`vascl_scale.losses.build_objective`) runs on the two halves under the accelerator's
autocast, its gathers spanning every rank. An optimiser step: ``grad_accum_steps`` loss calls,
each checked finite on every rank before its backward, then clipping (outside DeepSpeed,
which clips itself) and the update.

Randomness is a function of (seed, loss call, rank): the dropout masks are seeded per loss
call and rank; VaSCL's initial directions come from a generator seeded per loss call only,
the same on every rank, and are drawn for the whole global batch (each rank takes its own
rows), so they do not depend on the number of ranks. A resumed run therefore repeats exactly
what an uninterrupted one would have done.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch
from torch import Tensor

from vascl_scale.losses import Objective, ObjectiveOutput

MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class NonFiniteLossError(RuntimeError):
    """The loss was NaN or infinite on some rank; the step was not applied."""


def loss_call_seed(seed: int, loss_call: int, rank: int) -> int:
    """Seed of one loss call on one rank (rank 0's is also the shared seed of the directions)."""
    return (seed * 1_000_003 + loss_call * 8191 + rank) % (2**63 - 1)


@dataclass
class StepResult:
    """What one optimiser step reports."""

    terms: dict[str, Tensor]  # "loss" and the objective's parts, mean over its loss calls, detached (no sync)
    stats: dict[str, float]  # the objective's diagnostics, mean over its loss calls; {} unless asked for


class TrainingStep:
    """Loss calls and optimiser steps of a prepared model and optimiser (see the module doc)."""

    def __init__(
        self,
        accelerator,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        objective: Objective,
        *,
        seed: int,
        per_device_batch: int,
        grad_accum_steps: int = 1,
        max_grad_norm: float = 0.0,
    ) -> None:
        self.accelerator = accelerator
        self.model = model
        self.optimizer = optimizer
        self.objective = objective
        self.seed = seed
        self.per_device_batch = per_device_batch
        self.grad_accum_steps = grad_accum_steps
        self.max_grad_norm = max_grad_norm
        self.deepspeed = accelerator.state.deepspeed_plugin is not None

    @property
    def head(self) -> torch.nn.Module:
        """The projection head of the unwrapped module (the objectives call it directly)."""
        return self.accelerator.unwrap_model(self.model).head

    def loss_call(self, batch: dict[str, Tensor], loss_call: int, with_stats: bool = False) -> ObjectiveOutput:
        """The objective on one batch of this rank's b sentences (tokenised, (b, L) tensors)."""
        acc = self.accelerator
        torch.manual_seed(loss_call_seed(self.seed, loss_call, acc.process_index))  # dropout masks
        generator = torch.Generator(device=acc.device).manual_seed(loss_call_seed(self.seed, loss_call, 0))
        inputs = {k: torch.cat([v, v]).to(acc.device) for k, v in batch.items() if k in MODEL_INPUTS}  # (2b, L)
        rows = inputs["input_ids"].shape[0] // 2
        if rows != self.per_device_batch:
            raise RuntimeError(f"the data stream gave {rows} rows; expected the per-device batch {self.per_device_batch}")
        embeddings = self.model(**inputs)  # (2b, d)
        with acc.autocast():
            return self.objective(embeddings[:rows], embeddings[rows:], self.head, generator, with_stats)

    def _require_finite(self, loss: Tensor, step: int) -> None:
        """Stop every rank together when any rank's loss is NaN or infinite (before the update)."""
        bad = torch.tensor([0.0 if torch.isfinite(loss.detach()).all() else 1.0], device=self.accelerator.device)
        if self.accelerator.reduce(bad, reduction="sum").item() > 0:
            raise NonFiniteLossError(f"non-finite loss at step {step + 1}; the update was not applied")

    def __call__(self, batches: Iterator[dict[str, Tensor]], step: int, with_stats: bool = False) -> StepResult:
        """Optimiser step ``step`` (0-based): ``grad_accum_steps`` loss calls and one update."""
        acc = self.accelerator
        accum = self.grad_accum_steps
        terms: dict[str, Tensor] = {}
        stats: dict[str, float] = {}
        for micro in range(accum):
            with acc.accumulate(self.model):
                out = self.loss_call(next(batches), step * accum + micro, with_stats)
                self._require_finite(out.loss, step)
                acc.backward(out.loss)
                if self.max_grad_norm > 0 and acc.sync_gradients and not self.deepspeed:
                    acc.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
                self.optimizer.step()  # a no-op until the last micro step (accelerate / DeepSpeed)
                self.optimizer.zero_grad()
            for name, value in {"loss": out.loss.detach(), **out.terms}.items():
                terms[name] = terms.get(name, 0.0) + value.float() / accum
            for name, value in out.stats.items():
                stats[name] = stats.get(name, 0.0) + value / accum
        return StepResult(terms, stats)

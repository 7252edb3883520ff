"""One training step, written once: what ``vascl-scale train`` runs and every benchmark measures.

A loss call: the configured objective (:func:`vascl_scale.losses.build_objective`) declares the
n data columns it encodes (``spec.encoded_columns(batch)``, checked once per run, :mod:`vascl_scale.losses.spec`: its
inputs, then with supervised SimCSE every hard negative of the batch); the batch holds this
rank's b rows of each column (:mod:`vascl_scale.data.columns`), and an input the data lacks is
encoded from its stand-in (SimCSE's and VaSCL's positive: the anchor again, so that dropout
gives the second view; with ``data.augment`` the loader made the positive). The n views are
padded to one width L and enter the encoder in one forward, stacked ((n b, L) -> (n b, d): one
forward, because ZeRO-3 gathers the parameters for each), and the objective runs on the n
blocks of b, all under the run's autocast (:mod:`vascl_scale.precision`), its gathers spanning
every rank. An objective that declares a label column also gets this rank's b labels, and one
that declares the pairwise classifier the model's (PairSupCon: :mod:`vascl_scale.losses.spec`).
An optimiser step: ``grad_accum_steps`` loss calls, each checked finite on every rank before
its backward, then clipping (outside DeepSpeed, which clips itself) and the update.

The cached loss call (``chunk_size`` c > 0; GradCache, Gao et al. 2021, for a neighbourhood
objective) holds the activations of c sentences at a time instead of n b:

1. each view's b rows go through the encoder in chunks of at most c without gradient, the RNG
   state before every (view, chunk) forward kept (the chunks are fixed first: rows of similar
   length, at most ``chunk_tokens`` padded tokens, each cut to its longest row, :meth:`TrainingStep.chunk_plan`);
2. the objective runs on the whole global batch of these embeddings, made leaves (float32 or
   wider), with the rank's b labels where it reads them, and ``autograd.grad`` gives
   d loss / d e (the gathers' backward already sums what every rank's loss sends to this
   rank's rows);
3. each (view, chunk) is encoded again with gradient, its RNG state replayed (the same dropout
   masks, and different ones per view, also where two views encode one column), and the
   surrogate sum(e_chunk * d loss / d e_chunk), whose gradient is the chunk's share of
   d loss / d theta, back-propagated like a loss; the first of these backwards also carries
   the loss itself, for the gradient of the head (and of the pairwise classifier). That
   backward goes through the objective's graph a second time, after ``autograd.grad``; ZeRO-3
   gathers a module's parameters for one backward per forward call, so a head it released
   after the first (PairSupCon's classifier, called once) is gathered again for it.

Step 3 gives the parameters exactly the gradient of the one-forward step whose forwards draw
these masks. Each backward is scaled as a loss is (accumulation, fp16 loss scale). Gradient
reduction happens once per optimiser step: under DDP every backward but the step's last runs
in ``no_sync``; under FSDP2 the backbone's gradient sync is off for them
(``set_requires_gradient_sync(False)``: each rank accumulates unsharded gradients, as DDP
does) unless ``reduce_every_backward`` (the ``--fsdp`` file's ``gradient_sync: backward``), and
the heads, whole on every rank, are averaged once after the step's last backward
(:mod:`vascl_scale.train.fsdp`); under DeepSpeed each backward is one of the engine's
(ZeRO-2/3 reset their gradient hooks per backward) and only the step's last is its
accumulation boundary. ZeRO-2/3 still reduce-scatter the gradients of every backward (their
design: a rank keeps only its partition), so a cached step moves n m times the gradient bytes
of an uncached one there, m chunks per view (``vascl-scale bench comm``).

Randomness is a function of (seed, loss call, rank): the dropout masks are seeded per loss
call and rank; VaSCL's initial directions come from a generator seeded per loss call only,
the same on every rank, and are drawn for the whole global batch (each rank takes its own
rows), so they do not depend on the number of ranks. A resumed run therefore repeats exactly
what an uninterrupted one would have done.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor

from vascl_scale.data.batch import Batch, Padding, widen
from vascl_scale.data.columns import TOKEN_KEYS, text_hash_column
from vascl_scale.distributed import average_gradients
from vascl_scale.flops import EncoderShape
from vascl_scale.lengths import row_lengths, token_budget_groups, trimmed
from vascl_scale.losses import Objective, ObjectiveOutput
from vascl_scale.precision import autocast
from vascl_scale.train.fsdp import clip_grad_norm_, is_sharded, set_gradient_sync

MODEL_INPUTS = TOKEN_KEYS  # what the encoder's forward takes of a column's tensors


class NonFiniteLossError(RuntimeError):
    """The loss was NaN or infinite on some rank; the step was not applied."""


def loss_call_seed(seed: int, loss_call: int, rank: int) -> int:
    """Seed of one loss call on one rank (rank 0's is also the shared seed of the directions)."""
    return (seed * 1_000_003 + loss_call * 8191 + rank) % (2**63 - 1)


def chunk_count(rows: int, chunk_size: int) -> int:
    """Chunks per view of ``rows`` rows cut by ``chunk_size`` alone (a token budget only adds chunks)."""
    assert 0 < chunk_size <= rows, (chunk_size, rows)
    return -(-rows // chunk_size)


def rows_per_forward(per_device_batch: int, chunk_size: int, views: int) -> int:
    """Rows one encoder forward holds activations for: every view (n b) or one chunk (c)."""
    return chunk_size if chunk_size else views * per_device_batch


class RngState:
    """The global RNG state (CPU, and the device's CUDA generator) before one forward, to replay it."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state(self.cuda, self.device)


@dataclass
class StepResult:
    """What one optimiser step reports."""

    terms: dict[str, Tensor]  # "loss" and the objective's parts, mean over its loss calls, detached (no sync)
    stats: dict[str, float]  # the objective's diagnostics, mean over its loss calls; {} unless asked for
    model_flops: int = 0  # this device's (vascl_scale.flops); 0 when the encoder's shape is unknown


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
        chunk_size: int = 0,
        precision: str = "no",
        chunk_tokens: int = 0,
        sort_chunks: bool = True,
        length_buckets: int = 1,
        reduce_every_backward: bool = False,
        guide: torch.nn.Module | None = None,
    ) -> None:
        self.accelerator = accelerator
        self.model = model
        self.optimizer = optimizer
        self.objective = objective
        self.seed = seed
        self.per_device_batch = per_device_batch
        self.grad_accum_steps = grad_accum_steps
        self.max_grad_norm = max_grad_norm
        self.chunk_size = chunk_size
        self.chunk_tokens = chunk_tokens
        self.sort_chunks = sort_chunks
        self.length_buckets = length_buckets
        self.precision = precision  # resolved: no, bf16 or fp16 (vascl_scale.precision)
        self.deepspeed = accelerator.state.deepspeed_plugin is not None
        self.zero3 = self.deepspeed and int(accelerator.state.deepspeed_plugin.zero_stage) == 3
        assert 0 <= chunk_size <= per_device_batch, (
            chunk_size,
            per_device_batch,
        )  # RunConfig.per_device_batch_size checks it
        # DDP (accelerate wraps even one process in it when a launcher started it) needs a
        # gradient for every parameter in the backward that reduces: the heads' came in the
        # cached loss call's first backward, so the last one touches them with zero.
        self.ddp = isinstance(model, torch.nn.parallel.DistributedDataParallel)
        module = accelerator.unwrap_model(model)
        self.fsdp = is_sharded(module)  # FSDP2: the backbone sharded, the heads whole on every rank
        self.reduce_every_backward = reduce_every_backward  # FSDP2 only: sync every backward
        # The frozen guide model whose cosines decide false negatives (loss.guide_model), or None.
        assert (guide is not None) == objective.needs_guide, "a guide model goes with loss.guide_model"
        self.guide = guide
        self.packed = module.packed  # a chunk's tokens are its real ones, not rows x its longest
        self.encoder_shape = EncoderShape.of(module.encoder.config)
        # Views of different widths are padded to one as the tokenizer pads; a model without a
        # tokenizer (the benchmarks', the tests') is right-padded with id 0.
        self.padding = Padding.of(module.tokenizer) if module.tokenizer is not None else Padding()
        self._encoded_columns: dict[tuple[str, ...], tuple[str, ...]] = {}  # a batch's keys -> encoded_columns

    def loss_call_flops(self, views: int, tokens: int) -> int:
        """Model FLOPs of one loss call on this device, each of its n = ``views`` views (b, tokens):
        the encoder's forward and backward of the n views and the objective's head passes and
        similarity products (vascl_scale.flops)."""
        if self.encoder_shape is None:
            return 0
        rows, head, global_rows = (
            self.per_device_batch,
            self.head,
            self.per_device_batch * self.accelerator.num_processes,
        )
        encoder = 3 * self.encoder_shape.forward_flops(views * rows, tokens)
        return encoder + self.objective.model_flops(views, rows, global_rows, head.hidden_size, head.out_dim)

    @property
    def sharded_state(self) -> tuple[torch.nn.Module, torch.optim.Optimizer] | None:
        """Under FSDP2, the model and the (unwrapped) optimiser that checkpoints save through DCP; else None."""
        if not self.fsdp:
            return None
        return self.model, getattr(self.optimizer, "optimizer", self.optimizer)

    @property
    def head(self) -> torch.nn.Module:
        """The projection head of the unwrapped module (the objectives call it directly)."""
        return self.accelerator.unwrap_model(self.model).head

    @property
    def classifier(self) -> torch.nn.Module | None:
        """The pairwise classifier of the unwrapped module, None when it has none."""
        return self.accelerator.unwrap_model(self.model).classifier

    def _head_parameters(self) -> Iterator[torch.nn.Parameter]:
        """The trainable parameters of every module the objective calls besides the encoder."""
        for module in (self.head, self.classifier):
            if module is not None:
                yield from (p for p in module.parameters() if p.requires_grad)

    def _autocast(self) -> AbstractContextManager:
        """The autocast of the encoder forwards and the objective: the accelerator's on CUDA;
        on a CPU the step's own (the accelerator runs in float32 there, see build_accelerator)."""
        if self.accelerator.device.type == "cpu":
            return autocast("cpu", self.precision)
        return self.accelerator.autocast()

    def encoded_columns(self, batch: Batch) -> tuple[str, ...]:
        """The columns encoded for each view of ``batch`` (``spec.encoded_columns``), checked once per
        set of columns: a stream gives every batch the same ones, so a loss call checks nothing again."""
        key = tuple(batch)
        if key not in self._encoded_columns:
            self._encoded_columns[key] = self.objective.spec.encoded_columns(batch)
        return self._encoded_columns[key]

    def view_width(self, batch: Batch) -> int:
        """L, the width every view of ``batch`` is encoded at: the longest of its columns encoded."""
        return max(batch[column]["input_ids"].shape[1] for column in self.encoded_columns(batch))

    def _inputs(self, batch: Batch, loss_call: int) -> tuple[list[dict[str, Tensor]], torch.Generator]:
        """This rank's model inputs of each of the objective's inputs, in order, on the device and
        at one width, (b, L) each (an input encoded from its stand-in is the same tensors again),
        the global RNG seeded for the loss call's dropout masks, and the generator of its
        initial directions."""
        acc = self.accelerator
        columns = self.encoded_columns(batch)
        width = self.view_width(batch)
        on_device = {}
        for column in dict.fromkeys(columns):
            tensors = {k: v.to(acc.device) for k, v in batch[column].items() if k in MODEL_INPUTS}  # (b, L_column)
            rows = tensors["input_ids"].shape[0]
            if rows != self.per_device_batch:
                raise RuntimeError(
                    f"the data stream gave {rows} rows of {column}; expected the per-device batch {self.per_device_batch}"
                )
            on_device[column] = (
                tensors if tensors["input_ids"].shape[1] == width else widen(tensors, width, self.padding)
            )
        torch.manual_seed(loss_call_seed(self.seed, loss_call, acc.process_index))  # dropout masks
        generator = torch.Generator(device=acc.device).manual_seed(loss_call_seed(self.seed, loss_call, 0))
        return [on_device[column] for column in columns], generator

    def _guide_embeddings(self, views: list[dict[str, Tensor]]) -> list[Tensor]:
        """The guide model's embeddings of each view, (b, g) per view, without gradient, a chunk
        (``chunk_size``, else the b rows) at a time; a column encoded for two views once. In
        evaluation mode it draws no dropout mask, so the model's masks are those it would draw
        without a guide."""
        rows = self.chunk_size or self.per_device_batch
        encoded: dict[int, Tensor] = {}
        with torch.no_grad(), self._autocast():
            for view in views:
                key = id(view["input_ids"])
                if key not in encoded:
                    encoded[key] = torch.cat(
                        [
                            self.guide(**{k: v[start : start + rows] for k, v in view.items()})
                            for start in range(0, self.per_device_batch, rows)
                        ]
                    ).float()  # (b, g)
        return [encoded[id(view["input_ids"])] for view in views]

    def _declared_arguments(self, batch: Batch, views: list[dict[str, Tensor]] | None = None) -> dict[str, object]:
        """The keywords the objective declares beyond its views: its label column's b labels of
        this rank (b,) and its teacher scores (b, 1 + N) on the device, the pairwise classifier,
        the text hash of each view's rows ((b,) per view, the loader's) where it masks duplicates,
        and the guide model's embeddings of ``views`` (the model inputs) where a guide decides."""
        spec, arguments, device = self.objective.spec, {}, self.accelerator.device
        if spec.label is not None:
            labels = batch[spec.label]
            assert labels.shape == (self.per_device_batch,), labels.shape  # cut with the rows of the columns
            arguments["labels"] = labels.to(device)
        if spec.scores is not None:
            arguments["scores"] = batch[spec.scores].to(device)  # (b, 1 + N)
        if spec.classifier:
            arguments["classifier"] = self.classifier
        if self.objective.needs_text_hashes:
            arguments["text_hashes"] = [batch[text_hash_column(c)].to(device) for c in self.encoded_columns(batch)]
        if self.guide is not None:
            assert views is not None, "the guide encodes the loss call's model inputs"
            arguments["guide"] = self._guide_embeddings(views)
        return arguments

    def loss_call(self, batch: Batch, loss_call: int, with_stats: bool = False) -> ObjectiveOutput:
        """The objective on one batch of this rank's b rows (tokenised columns, (b, L) tensors)."""
        views, generator = self._inputs(batch, loss_call)
        rows = self.per_device_batch
        stacked = {key: torch.cat([view[key] for view in views]) for key in views[0]}  # (n b, L)
        with self._autocast():
            embeddings = self.model(
                **stacked, length_buckets=self.length_buckets
            )  # (n b, d), view v in rows [v b, (v + 1) b)
            blocks = [embeddings[view * rows : (view + 1) * rows] for view in range(len(views))]  # (b, d) each
            return self.objective(blocks, self.head, generator, with_stats, **self._declared_arguments(batch, views))

    def chunk_plan(self, views: list[dict[str, Tensor]]) -> list[tuple[int, Tensor]]:
        """The cached step's forwards: (view, its rows (c,)) each, every view's b rows once.

        A view's rows are grouped longest first (``sort_chunks``) or in row order, at most
        ``chunk_size`` and, with ``chunk_tokens``, at most that many tokens per forward
        (:func:`vascl_scale.lengths.token_budget_groups`); two views of one column share a plan.
        The plan is fixed before the first pass, so both passes encode the same chunks."""
        plans: dict[int, list[Tensor]] = {}  # id of a view's tensors -> its groups
        spans = []
        for index, view in enumerate(views):
            key = id(view["attention_mask"])
            if key not in plans:
                plans[key] = token_budget_groups(
                    row_lengths(view["attention_mask"]),
                    self.chunk_size,
                    self.chunk_tokens,
                    sort=self.sort_chunks,
                    packed=self.packed,
                )
            spans.extend((index, rows) for rows in plans[key])
        return spans

    def chunk_inputs(self, view: dict[str, Tensor], rows: Tensor) -> dict[str, Tensor]:
        """The model inputs of one chunk: ``rows`` of ``view`` (b, L), cut to their longest row (c, L_c)."""
        return trimmed(view, rows, int(row_lengths(view["attention_mask"][rows]).max()), self.padding.side)

    def cached_loss_call(self, batch: Batch, loss_call: int, step: int, with_stats: bool = False) -> ObjectiveOutput:
        """The loss call in chunks (module doc), its backwards included.

        Returns the objective's output with the loss detached; the gradients are in place.
        """
        views, generator = self._inputs(batch, loss_call)
        rows = self.per_device_batch
        spans = self.chunk_plan(views)
        states, pieces = [], []
        with torch.no_grad(), self._autocast():
            for view, chunk_rows in spans:
                states.append(RngState(self.accelerator.device))
                pieces.append(self.model(**self.chunk_inputs(views[view], chunk_rows)))  # (c, d)
        leaf_dtype = torch.promote_types(pieces[0].dtype, torch.float32)
        leaves = []  # (b, d) per view, in row order
        for view in range(len(views)):
            leaf = torch.empty(rows, pieces[0].shape[1], dtype=leaf_dtype, device=pieces[0].device)
            for (of_view, chunk_rows), piece in zip(spans, pieces):
                if of_view == view:
                    leaf[chunk_rows] = piece.to(leaf_dtype)
            leaves.append(leaf.requires_grad_(True))
        with self._autocast():
            out = self.objective(leaves, self.head, generator, with_stats, **self._declared_arguments(batch, views))
        self._require_finite(out.loss, step)
        # d loss / d e, (b, d) per view in row order; the graph stays for the head's gradient.
        cached = torch.autograd.grad(out.loss, leaves, retain_graph=True)
        final_span = len(spans) - 1
        for index, ((view, chunk_rows), state) in enumerate(zip(spans, states)):
            final = index == final_span and self.accelerator.sync_gradients
            with self._gradient_sync(final):
                state.restore()
                with self._autocast():
                    chunk = self.model(**self.chunk_inputs(views[view], chunk_rows))  # (c, d), the masks of pass 1
                surrogate = (chunk.to(leaf_dtype) * cached[view][chunk_rows]).sum()  # d/d chunk = its cached rows
                if index == 0:
                    # The heads' gradient joins the first backward: ZeRO-3 copies a parameter's
                    # first gradient of a step into its buffer and adds the later ones, so every
                    # parameter must receive one in the step's first backward.
                    surrogate = surrogate + out.loss
                if final and self.ddp:
                    surrogate = surrogate + sum((p * 0).sum() for p in self._head_parameters())
                with self._released_heads_gathered() if index == 0 else nullcontext():
                    self._backward(surrogate, final=final)
        return ObjectiveOutput(out.loss.detach(), out.terms, out.stats)

    def _released_heads_gathered(self) -> AbstractContextManager:
        """Under ZeRO-3, the heads' parameters it has released gathered again, for the backward
        that goes through the objective's graph a second time (module doc): its hooks gather a
        module's parameters for as many backwards as the module had forward calls, and a module
        called once (PairSupCon's classifier) is released after ``autograd.grad``'s."""
        if not self.zero3:
            return nullcontext()
        from deepspeed.runtime.zero.partition_parameters import GatheredParameters, ZeroParamStatus

        released = [p for p in self._head_parameters() if p.ds_status == ZeroParamStatus.NOT_AVAILABLE]
        return GatheredParameters(released)  # a no-op when none is released

    def _gradient_sync(self, sync: bool) -> AbstractContextManager:
        """The coming backwards reduce the gradients over the ranks (``sync``) or only accumulate
        them on each rank: DDP's ``no_sync``, FSDP2's gradient sync flag (module doc)."""
        if self.fsdp:
            set_gradient_sync(self.model, sync or self.reduce_every_backward)
            return nullcontext()
        return nullcontext() if sync or not self.ddp else self.model.no_sync()

    def _backward(self, value: Tensor, *, final: bool) -> None:
        """Back-propagate a loss-like scalar, divided by the accumulation steps (and fp16-scaled);
        ``final``: the optimiser step's last backward on this rank (DeepSpeed's boundary)."""
        if self.deepspeed:
            self.accelerator.deepspeed_engine_wrapped.backward(value, sync_gradients=final)
        else:
            self.accelerator.backward(value)

    def _require_finite(self, loss: Tensor, step: int) -> None:
        """Stop every rank together when any rank's loss is NaN or infinite (before the update)."""
        bad = torch.tensor([0.0 if torch.isfinite(loss.detach()).all() else 1.0], device=self.accelerator.device)
        if self.accelerator.reduce(bad, reduction="sum").item() > 0:
            raise NonFiniteLossError(f"non-finite loss at step {step + 1}; the update was not applied")

    def __call__(self, batches: Iterator[Batch], step: int, with_stats: bool = False) -> StepResult:
        """Optimiser step ``step`` (0-based): ``grad_accum_steps`` loss calls and one update."""
        acc = self.accelerator
        accum = self.grad_accum_steps
        terms: dict[str, Tensor] = {}
        stats: dict[str, float] = {}
        flops = 0
        for micro in range(accum):
            # accelerate's accumulate() skips no_sync for a DDP of one process: reduce once anyway.
            with acc.accumulate(self.model), self._gradient_sync(acc.sync_gradients):
                call = step * accum + micro
                batch = next(batches)
                flops += self.loss_call_flops(len(self.encoded_columns(batch)), self.view_width(batch))
                if self.chunk_size:
                    out = self.cached_loss_call(batch, call, step, with_stats)
                else:
                    out = self.loss_call(batch, call, with_stats)
                    self._require_finite(out.loss, step)
                    self._backward(out.loss, final=acc.sync_gradients)
                if self.fsdp and acc.sync_gradients:  # the heads: whole on every rank, averaged as DDP would
                    average_gradients(list(self._head_parameters()))
                if self.max_grad_norm > 0 and acc.sync_gradients and not self.deepspeed:
                    if self.fsdp:  # sharded and whole gradients: accelerate's clipping takes one kind
                        clip_grad_norm_(list(self.model.parameters()), self.max_grad_norm)
                    else:
                        acc.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
                self.optimizer.step()  # a no-op until the last micro step (accelerate / DeepSpeed)
                self.optimizer.zero_grad()
            for name, value in {"loss": out.loss.detach(), **out.terms}.items():
                terms[name] = terms.get(name, 0.0) + value.float() / accum
            for name, value in out.stats.items():
                stats[name] = stats.get(name, 0.0) + value / accum
        return StepResult(terms, stats, flops)

"""The training stream of a mixed ``data.train``: one :class:`TrainStream` per source, mixed.

What a mix is (the sources, ``data.mix``, the quotas) is :mod:`vascl_scale.data.mix_plan`;
this module streams it. Each source is read by a :class:`~vascl_scale.data.loader.TrainStream`
of its own, built from the ``data`` section with that source as ``data.train`` (and its
``num_workers`` where it sets one), with every guarantee of a single source: the node/worker
split, the corrupt-shard policy, exact resume. So a rank runs S sources x K workers loader
processes (K = ``data.num_workers``, or each source's own): give sources that are rarely drawn
fewer workers (``data.train[i].num_workers``) on a machine short of cores or memory.

per_batch   loss call n (the n-th batch of the stream, counted from the start of the run)
            takes its batch from source s = draw(seed, "mix", n): a stateless draw with
            probability weight_s / sum of weights, the same on every rank without
            communication, so the global batch comes from one source. Only the drawn
            source's stream advances; the others wait (their workers keep a few pieces
            ready). A source's workers start when it is first drawn.
per_sample  every device batch is the concatenation, in source order, of q_s rows of each
            source s (:func:`~vascl_scale.data.mix_plan.sample_quotas` of b): each source's
            stream yields batches of q_s rows, and each column is padded to the longest
            row of the joined batch.

A batch holds the same columns whatever its source: the sources must give the objective the
same columns (refused at build, and before any worker starts by the launcher's check).

Resume (``state_dict`` / ``load_state_dict``): the position is the number of batches yielded
(the draws are a function of it) and each source stream's own state, so a resumed mixed
stream yields exactly the batches of an uninterrupted one. The state::

    {"version": "mix-1",
     "mix": {"mode": "per_batch", "batches_yielded": n, "sources": {name: weight, ...}},
     "sources": {name: <that source's TrainStream.state_dict()>, ...}}

A state of another mix (sources added, dropped or reweighted, another mode) resumes each
source that is in both from its own state, and starts the new ones afresh, with a warning:
a valid continuation, not the one an uninterrupted run would have taken.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import torch

from vascl_scale.data.batch import Padding, concat_padded
from vascl_scale.data.layout import seed_of
from vascl_scale.data.loader import TrainStream, build_train_stream, check_saved_state
from vascl_scale.data.mix_plan import check_same_columns

if TYPE_CHECKING:
    from vascl_scale.config import DataConfig

logger = logging.getLogger(__name__)

MIX_STATE_VERSION = "mix-1"  # not TrainStream's: a single-source stream refuses this state


def batch_source(seed: int, batch: int, weights: Sequence[float]) -> int:
    """The source (index into ``weights``) of batch ``batch`` under ``per_batch``: u in [0, 1)
    from a 64-bit hash of (seed, "mix", batch), the first source whose cumulative share of the
    weights exceeds u. Exact rational arithmetic: every machine draws the same."""
    target = Fraction(seed_of(seed, "mix", batch), 2**64) * sum(Fraction(weight) for weight in weights)
    cumulative = Fraction(0)
    for source, weight in enumerate(weights):
        cumulative += Fraction(weight)
        if target < cumulative:
            return source
    raise AssertionError("u < 1 falls below the last cumulative weight")


class MixedStream:
    """An infinite stream of per-rank batches mixed from several sources; see the module docstring.

    Iterate it once. Batches are those of a :class:`TrainStream` (``{column: {input_ids,
    attention_mask[, token_type_ids]}}``, (b, L_column)); :attr:`columns` are those of every
    source.
    """

    def __init__(
        self, streams: dict[str, TrainStream], weights: Sequence[float], mode: str, seed: int, padding: Padding
    ) -> None:
        assert len(streams) == len(weights) >= 1, (list(streams), weights)
        check_same_columns({f"source {name}": stream.columns for name, stream in streams.items()})
        self.streams = streams
        self.names = tuple(streams)
        self.weights = tuple(float(weight) for weight in weights)
        self.mode = mode
        self.seed = seed
        self.padding = padding
        self.columns = next(iter(streams.values())).columns
        sizes = [stream.batch_size for stream in streams.values()]
        # per_batch: every source yields the whole device batch; per_sample: its quota of it.
        self.batch_size = sizes[0] if mode == "per_batch" else sum(sizes)
        assert mode == "per_sample" or len(set(sizes)) == 1, sizes
        self.batches_yielded = 0
        self._started = False

    def source_of(self, batch: int) -> int:
        """``per_batch``: the index of the source that batch ``batch`` (0-based) comes from."""
        return batch_source(self.seed, batch, self.weights)

    @property
    def readers(self) -> int:
        """The distinct streams the ranks read (:attr:`TrainStream.readers`; the same for every source)."""
        readers = {stream.readers for stream in self.streams.values()}
        assert len(readers) == 1, readers
        return readers.pop()

    @property
    def first_drop(self) -> tuple[int, int] | None:
        """(data epoch, samples) of the first end-of-epoch drop of the first source that dropped
        any, in source order (:attr:`TrainStream.first_drop`)."""
        return next((stream.first_drop for stream in self.streams.values() if stream.first_drop is not None), None)

    def stats(self) -> dict:
        """Counters for the training log: each counter of the sources summed (``data_epoch``,
        meaningless across sources, left out), and per source its samples and epoch."""
        per_source = {name: stream.stats() for name, stream in self.streams.items()}
        totals: dict[str, int] = {}
        for stats in per_source.values():
            for key, value in stats.items():
                if key != "data_epoch":
                    totals[key] = totals.get(key, 0) + value
        for name, stats in per_source.items():
            totals[f"data_samples/{name}"] = stats["data_samples"]
            totals[f"data_epoch/{name}"] = stats["data_epoch"]
        return totals

    def state_dict(self) -> dict:
        """JSON-serialisable position after the last yielded batch (the format in the module docstring)."""
        return {
            "version": MIX_STATE_VERSION,
            "mix": {
                "mode": self.mode,
                "batches_yielded": self.batches_yielded,
                "sources": dict(zip(self.names, self.weights)),
            },
            "sources": {name: stream.state_dict() for name, stream in self.streams.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a position saved by :meth:`state_dict` (before iterating)."""
        check_saved_state(
            state,
            MIX_STATE_VERSION,
            self,
            ": it was not saved by a mixed data.train (a list of sources); resume with the data.train it was saved "
            "with, or start afresh",
        )
        saved = state["mix"]
        mine = {"mode": self.mode, "sources": dict(zip(self.names, self.weights))}
        if {"mode": saved["mode"], "sources": saved["sources"]} != mine:
            logger.warning(
                "data mix changed (%s %s -> %s %s): the sources saved resume from their own positions, new ones "
                "start afresh; a valid continuation, not an exact one",
                saved["mode"],
                saved["sources"],
                self.mode,
                mine["sources"],
            )
        self.batches_yielded = int(saved["batches_yielded"])
        for name, stream in self.streams.items():
            if name in state["sources"]:
                stream.load_state_dict(state["sources"][name])

    def __iter__(self) -> Iterator[dict[str, dict[str, torch.Tensor]]]:
        if self._started:
            raise ValueError("a MixedStream can be iterated once; build another for a second consumer")
        self._started = True
        # Each source's batches, opened (and its workers started) when first needed.
        batches: dict[int, Iterator[dict[str, dict[str, torch.Tensor]]]] = {}

        def next_of(source: int) -> dict[str, dict[str, torch.Tensor]]:
            if source not in batches:
                batches[source] = iter(self.streams[self.names[source]])
            return next(batches[source])

        while True:
            if self.mode == "per_batch":
                batch = next_of(self.source_of(self.batches_yielded))
            else:
                parts = [next_of(source) for source in range(len(self.names))]
                batch = {column: concat_padded([part[column] for part in parts], self.padding) for column in parts[0]}
            self.batches_yielded += 1
            yield batch


def build_mixed_stream(
    data: DataConfig,
    *,
    tokenizer,
    per_device_batch_size: int,
    seed: int,
    prompts: dict[str, str] | None = None,
    **placement: Any,
) -> MixedStream:
    """One rank's stream of a mixed ``data.train`` (a list of sources), built as
    :func:`~vascl_scale.data.loader.build_train_stream` builds a single source's, with the
    same arguments: ``placement`` holds the others (rank, world_size, num_nodes, columns),
    given to every source's stream as they are. Every source's stream is seeded with ``seed``,
    and so are the per_batch draws. ``prompts`` (model.prompts) serve every source that sets none of its own."""
    assert data.mixed, "build_mixed_stream reads a list of sources; build_train_stream reads one"
    names = data.source_names()
    if data.mix == "per_sample":
        rows = data.sample_quotas(per_device_batch_size)
    else:
        rows = (per_device_batch_size,) * len(names)
    streams, processes = {}, 0
    for name, source, source_rows in zip(names, data.train, rows):
        workers = data.num_workers if source.num_workers is None else source.num_workers
        processes += workers
        streams[name] = build_train_stream(
            data.model_copy(update={"train": source.source, "num_workers": workers}),
            tokenizer=tokenizer,
            per_device_batch_size=source_rows,
            seed=seed,
            prompts=prompts if source.prompts is None else source.prompts,
            **placement,
        )
    shares = ", ".join(
        f"{name} (weight {source.weight:g}" + (f", {count} rows)" if data.mix == "per_sample" else ")")
        for name, source, count in zip(names, data.train, rows)
    )
    logger.info(
        "data: mixing %d sources %s: %s; %d loader worker processes on this rank",
        len(names),
        data.mix,
        shares,
        processes,
    )
    return MixedStream(streams, [source.weight for source in data.train], data.mix, seed, Padding.of(tokenizer))

"""The stream's layout and resume position: what vascl-scale adds to webdataset's shard lists.

A rank reads the stream of a reader: in exact and resampled mode its own (reader r of W), in
global mode the one-process stream (reader 0 of 1, on every rank). Reader r's DataLoader worker
w (of K = max(1, num_workers) per rank) is one of R * K slots, R the number of readers. The
stream is a sequence of passes; the main process sets the pass number (the epoch) in shared
memory before each pass, so every worker of every rank uses the same value rather than a
counter of its own (webdataset's ``ResampledShards`` counts its own epochs per process).

exact      pass e: ``webdataset.SimpleShardList`` permutes all shards with a seed of (seed, e);
           reader r takes every R-th of them from the r-th on, and ``webdataset.split_by_worker``
           hands its worker w every K-th of those: across all slots every shard is read exactly
           once per pass. Needs at least W * K shards.
resampled  pass e: a ``webdataset.ResampledShards`` per slot, deterministic, seeded with
           (seed, e) and the slot, draws ceil(S / (W*K)) shards with replacement.
global     exact mode's passes with one reader: every rank reads every shard, in batches of the
           global batch B = W * b, and keeps its rows [r * b, (r + 1) * b) of each (the
           loader's ``TrainStream``). The sequence of global batches is the one-process run's
           for any W; each rank reads W times the rows it uses. Needs at least K shards.
text file  (a ``.txt``/``.txt.gz`` source): slot s = r * K + w reads non-empty lines
           s, s + R*K, ... each pass; always exact (or global).

The rank split is not webdataset's ``split_by_node``: that reads the rank from the environment
or torch.distributed, while a layout has its rank given (the trainer's process index; tests run
several ranks in one process), and the main process must also compute the rank's shards of any
pass to find a resume position.

Resume: the stream is a deterministic function of the layout (source, mode, seed, W, K,
per-device batch -- in global mode the global batch instead of W and b --, shuffle buffer, and
the webdataset version, whose shard lists and shuffle fix the order: a state saved under
another version, or by vascl-scale before webdataset ordered the stream, resumes as a changed
layout). The position is the pass and the rows of it already read by this rank's reader, plus
the batches yielded, which are equal on every rank. A pass gives only full batches (the rows
left at its end, fewer than a batch, are dropped: see :mod:`vascl_scale.data.loader`), so a
rank's position follows from the batch count and its passes' row counts.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import math
import random
from dataclasses import dataclass, field
from itertools import islice

import webdataset as wds
from torch.utils.data import get_worker_info

from vascl_scale.data.shards import ShardSource

logger = logging.getLogger(__name__)

# Consecutive passes without a full batch before a rank gives up (instead of spinning).
MAX_PASSES_WITHOUT_BATCH = 10
GLOBAL = "global"  # the mode in which every rank reads the one-process stream


def seed_of(*parts: object) -> int:
    """A 64-bit seed from the parts' text: the same in every process (no hash() salt)."""
    digest = hashlib.sha256("/".join(str(part) for part in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little")


@dataclass
class StreamLayout:
    """Which shards (or lines) each slot reads per pass, and where this rank's stream stands.

    The layout fields come first and stay fixed; the position (``epoch``, ``rows_into_epoch``:
    the next row to yield; ``batches_yielded``; the origin of the current layout's stream, which
    moves when a state from another layout is loaded) moves as batches are yielded and is what
    :meth:`state_dict` saves.
    """

    source: ShardSource
    mode: str  # "exact", "resampled" or "global"
    seed: int
    rank: int
    world_size: int
    workers: int
    batch_size: int
    shuffle_buffer: int
    epoch: int = 0
    rows_into_epoch: int = 0
    batches_yielded: int = 0
    origin_epoch: int = 0
    origin_batches: int = 0
    # Shard URL -> its first index in the source; non-empty lines of a text source (counted
    # once, only to resume from another rank's state).
    _index: dict[str, int] | None = field(default=None, init=False, repr=False)
    _text_lines: int | None = field(default=None, init=False, repr=False)

    @property
    def reader_rank(self) -> int:
        """The reader whose stream this rank reads: its own rank, or 0 in global mode."""
        return 0 if self.mode == GLOBAL else self.rank

    @property
    def readers(self) -> int:
        """R, the number of distinct streams the ranks read: W, or 1 in global mode."""
        return 1 if self.mode == GLOBAL else self.world_size

    @property
    def stream_batch_size(self) -> int:
        """Rows each batch takes from the reader's stream: b, or in global mode the global batch W * b."""
        return self.batch_size * (self.world_size if self.mode == GLOBAL else 1)

    @property
    def kept_rows(self) -> slice:
        """This rank's rows of each ``stream_batch_size`` rows read: all b, or in global mode [r * b, (r + 1) * b)."""
        first = self.rank * self.batch_size if self.mode == GLOBAL else 0
        return slice(first, first + self.batch_size)

    def key(self) -> dict:
        """Everything that fixes the order of the stream; equal keys resume exactly."""
        # A global stream is the same for any split of its batch over ranks.
        batch = (
            {"global_batch_size": self.stream_batch_size}
            if self.mode == GLOBAL
            else {"world_size": self.world_size, "per_device_batch_size": self.batch_size}
        )
        return {
            "source": self.source.fingerprint(),
            "mode": self.mode,
            **batch,
            "num_workers": self.workers,
            "seed": self.seed,
            "shuffle_buffer": self.shuffle_buffer,
            "webdataset": wds.__version__,
        }

    def slot(self, worker: int) -> int:
        return self.reader_rank * self.workers + worker

    def shuffle_rng(self, epoch: int, worker: int) -> random.Random:
        """The generator of one slot's sample shuffle buffer in pass ``epoch``."""
        return random.Random(seed_of(self.seed, "buffer", epoch, self.reader_rank, worker))

    def _shard_index(self, url: str) -> int:
        if self._index is None:
            self._index = {}
            for index, name in enumerate(self.source.urls):
                self._index.setdefault(name, index)
        return self._index[url]

    def rank_shards(self, epoch: int) -> list[int]:
        """Exact and global mode: indices of the shards all of this rank's workers read in pass ``epoch``."""
        order = wds.SimpleShardList(list(self.source.urls), seed=seed_of(self.seed, "shards", epoch))
        return [self._shard_index(item["url"]) for item in islice(order, self.reader_rank, None, self.readers)]

    def drawn_shards(self, epoch: int, worker: int) -> list[int]:
        """Resampled mode: indices of the shards this rank's ``worker`` draws in pass ``epoch``."""
        slot = self.slot(worker)
        draws = wds.ResampledShards(
            list(self.source.urls),
            nshards=math.ceil(len(self.source.urls) / (self.readers * self.workers)),
            seed=seed_of(self.seed, "resample", epoch),
            worker_seed=lambda: slot,
            deterministic=True,
        )
        return [self._shard_index(item["url"]) for item in draws]

    def worker_shards(self, epoch: int) -> list[int]:
        """In a DataLoader worker (or the main process without workers): its shards of pass ``epoch``."""
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        assert workers == self.workers or info is None, (workers, self.workers)
        if wds.utils.pytorch_worker_info()[2:] != (worker, workers):
            raise RuntimeError(
                "the environment variables WORKER and NUM_WORKERS, which webdataset reads, name another "
                f"DataLoader worker than this one ({worker} of {workers}); unset them"
            )
        if self.mode == "resampled":
            return self.drawn_shards(epoch, worker)
        return list(wds.split_by_worker(self.rank_shards(epoch)))

    def rows_per_epoch(self, epoch: int) -> int | None:
        """Samples this rank reads in pass ``epoch``, from known counts; None when unknown."""
        if self.source.text_file is not None:
            if self._text_lines is None:
                self._text_lines = _count_nonempty_lines(self.source.text_file)
            slots, lines = self.readers * self.workers, self._text_lines
            first = self.slot(0)
            return sum(
                lines // slots + (1 if slot < lines % slots else 0) for slot in range(first, first + self.workers)
            )
        if self.source.total_samples is None:
            return None
        counts = self.source.counts
        if self.mode == "resampled":
            return sum(counts[i] for worker in range(self.workers) for i in self.drawn_shards(epoch, worker))  # type: ignore[misc]
        return sum(counts[index] for index in self.rank_shards(epoch))  # type: ignore[misc]

    def _position_from_batches(self) -> tuple[int, int] | None:
        """This rank's reader's (epoch, rows into it) after ``batches_yielded``, from the shared
        batch count: a pass of R rows gives floor(R / n) batches of n = :attr:`stream_batch_size`
        rows read (its last R mod n rows are dropped). None when the counts are unknown, or when
        no pass in reach gives a batch (no stream got there)."""
        remaining = self.batches_yielded - self.origin_batches  # batches
        epoch, without_batch = self.origin_epoch, 0
        while without_batch < MAX_PASSES_WITHOUT_BATCH:  # the stream itself stops there
            rows = self.rows_per_epoch(epoch)
            if rows is None:
                return None
            batches = rows // self.stream_batch_size
            if remaining <= batches:
                return epoch, remaining * self.stream_batch_size
            remaining -= batches
            without_batch = without_batch + 1 if batches == 0 else 0
            epoch += 1
        return None

    def state_dict(self) -> dict:
        """The position and the layout key (JSON-serialisable)."""
        return {
            "mode": self.mode,
            "epoch": self.epoch,
            "rows_into_epoch": self.rows_into_epoch,
            "rank": self.rank,
            "batches_yielded": self.batches_yielded,
            "samples_yielded": self.batches_yielded * self.batch_size,
            "origin_epoch": self.origin_epoch,
            "origin_batches": self.origin_batches,
            "layout": self.key(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue exactly from a state of the same layout; else restart its epoch under this one."""
        self.batches_yielded = int(state["batches_yielded"])
        if state["layout"] != self.key():
            changed = sorted(k for k, v in self.key().items() if state["layout"].get(k) != v)
            logger.warning(
                "data layout changed (%s): restarting epoch %d under the new layout; statistically "
                "equivalent, not an exact continuation",
                ", ".join(changed),
                state["epoch"],
            )
            self.epoch, self.rows_into_epoch = int(state["epoch"]), 0
            self.origin_epoch, self.origin_batches = self.epoch, self.batches_yielded
            return
        self.origin_epoch, self.origin_batches = int(state["origin_epoch"]), int(state["origin_batches"])
        # In global mode every rank stands where the reader of the one stream stands.
        if self.mode == GLOBAL or int(state["rank"]) == self.rank:
            self.epoch, self.rows_into_epoch = int(state["epoch"]), int(state["rows_into_epoch"])
        else:
            position = self._position_from_batches()
            if position is None:
                logger.warning(
                    "data state saved on rank %d, sample counts unknown: restarting epoch %d on rank %d "
                    "(statistically equivalent); save and load each rank's own state for exact resume",
                    state["rank"],
                    state["epoch"],
                    self.rank,
                )
                position = (int(state["epoch"]), 0)
            self.epoch, self.rows_into_epoch = position
        logger.info(
            "data stream resumes at epoch %d, row %d of the epoch this rank reads (%d batches done)",
            self.epoch,
            self.rows_into_epoch,
            self.batches_yielded,
        )


def _count_nonempty_lines(path: str) -> int:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as handle:
        return sum(1 for line in handle if line.strip())

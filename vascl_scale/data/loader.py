"""The training stream: shards -> tokenised, dynamically padded per-rank batches of columns, forever.

How the work is split
    Each rank runs a ``DataLoader`` with ``num_workers`` workers. Which shards (or text lines)
    each worker reads in each pass, from webdataset's shard lists, and where the stream stands
    is the :class:`~vascl_scale.data.layout.StreamLayout` (see that module for exact and
    resampled mode, and global mode, in which every rank reads the one-process stream). Each
    worker opens its shards one after the other (a :class:`ShardStream` per shard), shuffles
    their samples with ``webdataset.shuffle`` through a buffer whose generator is seeded with
    (seed, e, r, w), r the reader's rank -- so a pass is the same on every run --, cuts them
    into pieces of b = ``per_device_batch_size`` samples (in global mode of the global batch
    W * b) and tokenises each column of a piece with one batched call of the fast tokenizer,
    padded to the piece's longest text in that column. The main process re-cuts pieces into
    batches of exactly that many rows; in global mode rank r keeps rows [r * b, (r + 1) * b)
    of each, so the global batches are the same for any number of ranks. The rows left at the
    end of a pass that do not fill a batch are dropped and counted
    (``TrainStream.samples_dropped``; the trainer logs the first drop once): never a short batch
    into the loss, whose rows would weigh more in the mean and see fewer negatives than a full
    batch's (sentence-transformers #3420), and never a batch spanning two passes, where a
    sample could meet itself as its own in-batch negative. The next pass reshuffles, so
    usually other rows miss it. A rank never runs dry: passes follow each other forever, and
    the trainer stops at its step budget.

    Shards written with ``data prepare --tokenizer`` hold token ids; when the manifest's
    tokenizer fingerprint and ``max_length`` match the loader's, workers pad the stored ids
    instead of tokenising (same tensors, less CPU).

Columns
    A batch is ``{column: {"input_ids", "attention_mask"[, "token_type_ids"]}}`` (b, L_column),
    each column trimmed to its own longest row (:mod:`vascl_scale.data.columns`), and a label
    column (labelled pairs) is one LongTensor (b,), cut and joined with its rows. The stream
    reads the columns it is asked for (an objective's ``spec.columns_read``, any number of hard
    negatives among them) that the data has, as its manifest lists them (a text file, ``pipe:``
    commands and shards without a manifest are single-text: ``anchor``). With ``data.augment``
    the workers make each sample's ``positive`` from its anchor (:mod:`vascl_scale.data.augment`),
    seeded by the sample's place in the reader's pass (in global mode the same on every rank).
    A sample without one of the columns read is skipped and counted (``samples_missing_field``).

Corrupt, mismatched and missing shards
    Each shard is read in one ``try`` block (not through webdataset's ``tarfile_to_samples`` and
    its handler, whose tar parser is kept out for speed: see :func:`iter_tar_samples`), so an
    error is charged to the shard that raised it, with the samples read before it. A read error
    (truncated or corrupt tar, failed ``pipe:`` command) or a sample count that differs from the
    manifest's ends that shard with a warning and a count (``TrainStream.corrupt_shards_skipped``);
    samples read before the error are kept. A shard read to its end whose size or sha256 differs
    from its manifest entry (rewritten or damaged after ``data prepare``) is warned about and
    counted in ``shards_mismatched``: its samples were streamed already and are kept. Only a
    shard read to its end is checked, so a resumed stream or a stopped worker never reports one
    falsely. A shard file listed in the manifest but absent is counted in ``shards_missing``
    each time it is drawn; when files are missing at start the stream is built only with
    ``on_corrupt="skip"``. With ``on_corrupt="fail"`` every one of these raises
    :class:`CorruptShardError` instead. A rank that yields no batch in
    ``MAX_PASSES_WITHOUT_BATCH`` consecutive passes raises instead of looping forever:
    :class:`CorruptShardError` when it read no sample, ``ValueError`` when its passes hold
    fewer rows than one batch.

Resume (``state_dict`` / ``load_state_dict``)
    The stream is a deterministic function of the layout. Same layout: the resumed stream
    continues *exactly* where the saved one stopped: the same batches in the same order as an
    uninterrupted run, in every mode. Workers replay the partly consumed epoch, tokenising only
    the last few pieces before the resume point (cost: reading at most one epoch of this rank's
    shards). A state saved on another rank is also exact when sample counts are known (a
    manifest, also one next to listed shards, or a text file), because positions are
    recomputed from the batch count, which all ranks share; with unknown counts (``pipe:`` or
    foreign shards) each rank must load its own state. In global mode any rank's state is
    exact, and the layout holds the global batch, not how it is split: every rank stands where
    the one stream stands. Exactness also assumes that the same shards are corrupt as before.
    Changed layout (other world size or batch size -- in global mode the global batch --,
    workers, seed, mode or shards): the stream restarts the saved epoch from its beginning
    under the new layout -- statistically equivalent, not exact: in exact and global mode,
    samples seen before the checkpoint in that epoch are seen again, none is missed. In
    resampled mode every continuation is statistically equivalent anyway (shards drawn with
    replacement).
"""

from __future__ import annotations

import gzip
import logging
import multiprocessing
import os
import random
import signal
from collections import deque
from collections.abc import Collection, Iterator
from typing import TYPE_CHECKING

import numpy as np
import torch
import webdataset as wds
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from vascl_scale.data.augment import AugmentSpec, build_augmenter
from vascl_scale.data.batch import Batch, Padding, batch_rows, column_rows, concat_padded
from vascl_scale.data.columns import (
    ANCHOR,
    AUGMENTED,
    LABEL_COLUMNS,
    POSITIVE,
    SCORE_COLUMNS,
    SINGLE_TEXT,
    TOKEN_KEYS,
    VALUE_COLUMNS,
    columns_to_read,
    parse_label,
    parse_scores,
    prompt_of,
    sample_fields,
    text_hash,
    text_hash_column,
)
from vascl_scale.data.layout import GLOBAL, MAX_PASSES_WITHOUT_BATCH, StreamLayout, seed_of
from vascl_scale.data.shards import (
    PIPE_PREFIX,
    ShardMismatchError,
    ShardSource,
    ShardStream,
    iter_tar_samples,
    resolve_source,
    tokenizer_fingerprint,
)

if TYPE_CHECKING:
    from vascl_scale.config import DataConfig

logger = logging.getLogger(__name__)

STATE_VERSION = 1


class CorruptShardError(RuntimeError):
    """A shard could not be read, differs from its manifest entry or is missing, with
    ``on_corrupt="fail"``; or, whatever the policy, a ``pipe:`` command stalled or a rank read no
    sample in ``MAX_PASSES_WITHOUT_BATCH`` passes."""


# Kinds of bad shard (keys of a piece's event lists): what the warning and error call each.
_PROBLEMS = {
    "corrupt": "corrupt shard",
    "mismatched": "shard not matching its manifest entry",
    "missing": "missing shard",
}


def _as_is(piece: dict) -> dict:
    return piece


def _worker_init(worker_id: int) -> None:
    # One worker = one core: the Rust tokenizer's own thread pool would oversubscribe them.
    del worker_id
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    # A stopped trainer terminates its workers (SIGTERM). torch's handler would end a worker where
    # it stands, and a pipe: command it runs, in a session of its own, would live on; raised as
    # KeyboardInterrupt, which torch's worker loop takes as a quiet exit, the stop unwinds and the
    # shard stream kills the command's process group.
    signal.signal(signal.SIGTERM, signal.default_int_handler)


class _PieceDataset(IterableDataset):
    """Runs in each DataLoader worker: one pass of this slot's samples as tokenised pieces.

    A sample is a tuple of one payload per column read (``columns``): a text, or stored token
    id bytes, or a label (an int). A piece is a dict with ``rows`` (samples in it), the URLs of
    the shards found corrupt, mismatched or missing since the last piece (lists under those keys
    of ``_PROBLEMS``), ``missing_field`` (samples lacking a column read, as text or as ids) and,
    unless it is a placeholder for a piece skipped on resume, ``columns``: per text column the
    tokenizer output as int64 NumPy arrays (rows, L_column), per label column an int64 array (rows,).
    """

    def __init__(
        self,
        layout: StreamLayout,
        tokenizer,
        max_length: int,
        on_corrupt: str,
        use_stored_ids: bool,
        pipe_timeout: float,
        augment: AugmentSpec = AugmentSpec(),
        columns: tuple[str, ...] = SINGLE_TEXT,
        prompts: dict[str, str] | None = None,
        text_hashes: bool = False,
    ) -> None:
        super().__init__()
        self.columns = columns  # read from the data; data.augment adds the positive
        self.text_hashes = text_hashes  # each text column's rows hashed (loss.false_negatives: duplicates)
        self.prompts = dict(prompts or {})  # model.prompts: put before a column's texts, tokenised with them
        self.augment = augment
        self._augmenter = None  # built in each worker on first use (a masked LM does not pickle cheaply)
        self.layout = layout
        self.source = layout.source
        self.batch_size = layout.stream_batch_size  # rows per piece
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.on_corrupt = on_corrupt
        self.use_stored_ids = use_stored_ids
        self.pipe_timeout = pipe_timeout
        self.pad_token_id = tokenizer.pad_token_id
        self.left_padding = getattr(tokenizer, "padding_side", "right") == "left"
        self.with_token_types = "token_type_ids" in getattr(tokenizer, "model_input_names", ())
        # Written by the main process before each pass, read by workers when the pass starts.
        self.shared_epoch = multiprocessing.RawValue("q", 0)
        self.shared_skip_pieces = multiprocessing.RawValue("q", 0)

    def __iter__(self) -> Iterator[dict]:
        info = get_worker_info()
        worker = info.id if info is not None else 0
        epoch = int(self.shared_epoch.value)
        skip_pieces = int(self.shared_skip_pieces.value)
        events: dict = {**{kind: [] for kind in _PROBLEMS}, "missing_field": 0}
        samples = self._samples(epoch, worker, events)
        # Fills the whole buffer before the first sample leaves (webdataset's default starts at
        # 100); a size of 0 or 1 passes samples through in order.
        size = self.layout.shuffle_buffer
        shuffled = wds.shuffle(size, initial=size, rng=self.layout.shuffle_rng(epoch, worker))(samples)
        chunk: list = []
        position = 0  # of the chunk's first sample in this worker's pass: seeds its augmentations
        for sample in shuffled:
            chunk.append(sample)
            if len(chunk) == self.batch_size:
                yield self._piece(chunk, events, placeholder=skip_pieces > 0, where=(epoch, worker, position))
                skip_pieces -= 1
                position += len(chunk)
                chunk = []
        if chunk or any(events.values()):
            yield self._piece(chunk, events, placeholder=skip_pieces > 0, where=(epoch, worker, position))

    def _augmented(self, texts: list[str], where: tuple[int, int, int], view: int) -> list[str]:
        """``texts`` augmented, sample i seeded by (seed, epoch, reader rank, worker, position + i, view)."""
        if self._augmenter is None:
            self._augmenter = build_augmenter(self.augment)
        epoch, worker, first = where
        rngs = [
            random.Random(seed_of(self.layout.seed, "augment", epoch, self.layout.reader_rank, worker, first + i, view))
            for i in range(len(texts))
        ]
        return self._augmenter(texts, rngs)

    def _tokens(self, texts: list[str], column: str) -> dict[str, np.ndarray]:
        prompt = prompt_of(self.prompts, column)
        if prompt:  # within max_length: truncation cuts the text's end, never the prompt
            texts = [prompt + text for text in texts]
        # NumPy, not torch: small arrays pickle through the worker queue more cheaply than
        # torch's shared-memory hand-over of every tensor.
        encoded = self.tokenizer(
            texts, padding="longest", truncation=True, max_length=self.max_length, return_tensors="np"
        )
        return {
            key: encoded[key].astype(np.int64, copy=False) for key in TOKEN_KEYS if key in encoded
        }  # (rows, L_column)

    def _piece(self, samples: list[tuple], events: dict, placeholder: bool, where: tuple[int, int, int]) -> dict:
        piece = {"rows": len(samples), **{kind: list(events[kind]) for kind in _PROBLEMS}}
        piece["missing_field"] = events["missing_field"]
        for kind in _PROBLEMS:
            events[kind].clear()
        events["missing_field"] = 0
        if not samples or placeholder:
            return piece
        payloads = {column: [sample[index] for sample in samples] for index, column in enumerate(self.columns)}
        values = {  # (rows,) labels, (rows, n) teacher scores
            column: np.asarray(payloads.pop(column), dtype=np.int64 if column in LABEL_COLUMNS else np.float32)
            for column in self.columns
            if column in VALUE_COLUMNS
        }
        if self.use_stored_ids:
            hashes = self._hashes(payloads)
            piece["columns"] = {
                **{column: self._pad_stored_ids(ids) for column, ids in payloads.items()},
                **values,
                **hashes,
            }
            return piece
        if self.augment.kind != "none":
            # The anchor stays the original text unless both are augmented; the view number in the
            # seed makes the two augmentations of "both" independent.
            anchors = payloads[ANCHOR]
            if self.augment.views == "both":
                payloads[ANCHOR] = self._augmented(anchors, where, 1)
            payloads[POSITIVE] = self._augmented(anchors, where, 2)
        hashes = self._hashes({column: [text.encode("utf-8") for text in texts] for column, texts in payloads.items()})
        piece["columns"] = {
            **{column: self._tokens(texts, column) for column, texts in payloads.items()},
            **values,
            **hashes,
        }
        return piece

    def _hashes(self, payloads: dict[str, list[bytes]]) -> dict[str, np.ndarray]:
        """Each text column's (rows,) int64 text hashes (:func:`vascl_scale.data.columns.text_hash`)
        under its hash key, when the objective masks duplicates; else none. A row's text as read
        (augmented where data.augment changed it, without a prompt), or its stored token ids."""
        if not self.text_hashes:
            return {}
        return {
            text_hash_column(column): np.fromiter((text_hash(p) for p in rows), dtype=np.int64, count=len(rows))
            for column, rows in payloads.items()
        }

    def _pad_stored_ids(self, payloads: list[bytes]) -> dict[str, np.ndarray]:
        """One column's token ids stored by ``data prepare --tokenizer`` -> the tokenizer's padded arrays."""
        rows = [np.frombuffer(payload, dtype="<i4") for payload in payloads]
        width = max(len(row) for row in rows)
        input_ids = np.full((len(rows), width), self.pad_token_id, dtype=np.int64)  # (rows, L_column)
        attention_mask = np.zeros((len(rows), width), dtype=np.int64)
        for index, row in enumerate(rows):
            columns = slice(width - len(row), width) if self.left_padding else slice(0, len(row))
            input_ids[index, columns] = row
            attention_mask[index, columns] = 1
        tensors = {"input_ids": input_ids, "attention_mask": attention_mask}
        if self.with_token_types:
            tensors["token_type_ids"] = np.zeros_like(input_ids)  # one segment per sentence
        return tensors

    def _samples(self, epoch: int, worker: int, events: dict) -> Iterator[tuple]:
        """This slot's samples of one pass: per sample a text, or stored token id bytes, per column."""
        if self.source.text_file is not None:
            yield from self._text_file_lines(worker)
            return
        for index in self.layout.worker_shards(epoch):
            yield from self._shard_samples(index, events)

    def _text_file_lines(self, worker: int) -> Iterator[tuple[str]]:
        slots = self.layout.readers * self.layout.workers
        slot = self.layout.slot(worker)
        opener = gzip.open if self.source.text_file.endswith(".gz") else open
        with opener(self.source.text_file, "rb") as handle:
            index = 0
            for line in handle:
                text = line.decode("utf-8", "replace").strip()
                if not text:
                    continue
                if index % slots == slot:
                    yield (text,)
                index += 1

    def _shard_samples(self, index: int, events: dict) -> Iterator[tuple]:
        url, expected = self.source.urls[index], self.source.counts[index]
        read = 0
        kind = "ids" if self.use_stored_ids else "txt"
        fields = [sample_fields(column, kind) for column in self.columns]
        # A payload as the piece takes it: a label's int, stored ids as they are, a text decoded.
        decoders = [
            parse_label
            if column in LABEL_COLUMNS
            else parse_scores
            if column in SCORE_COLUMNS
            else (bytes if self.use_stored_ids else _utf8)
            for column in self.columns
        ]
        try:
            with ShardStream(url, self.source.checks[index], self.pipe_timeout) as stream:
                for sample in iter_tar_samples(stream):
                    payloads = [next((sample[name] for name in names if name in sample), None) for names in fields]
                    if any(payload is None for payload in payloads):
                        events["missing_field"] += 1
                        continue
                    read += 1
                    yield tuple(decode(payload) for decode, payload in zip(decoders, payloads))
        except FileNotFoundError:
            self._bad_shard("missing", url, "listed in the manifest, but the file is gone", events)
            return
        except ShardMismatchError as err:
            reason = f"{err}, after streaming its {read} samples (changed since `data prepare`?)"
            self._bad_shard("mismatched", url, reason, events)
            return
        except TimeoutError as err:  # a stalled command is a setup problem, not a bad shard: stop
            raise CorruptShardError(f"pipe: source {url} stalled: {err}") from err
        except (OSError, EOFError, ValueError) as err:  # ValueError: bad header, UTF-8, label or scores
            self._bad_shard("corrupt", url, f"{type(err).__name__}: {err} after {read} samples", events)
            return
        if expected is not None and read != expected:
            self._bad_shard("corrupt", url, f"{read} samples where the manifest lists {expected} (truncated?)", events)

    def _bad_shard(self, kind: str, url: str, reason: str, events: dict) -> None:
        """Apply the ``on_corrupt`` policy to a shard of one of the ``_PROBLEMS`` kinds."""
        if self.on_corrupt == "fail":
            raise CorruptShardError(f"{_PROBLEMS[kind]} {url}: {reason}; pass on_corrupt='skip' to skip such shards")
        logger.warning("%s %s: %s; going on (on_corrupt='skip')", _PROBLEMS[kind], url, reason)
        events[kind].append(url)


def check_saved_state(state: dict, version: int | str, stream, mismatch: str) -> None:
    """ValueError unless ``stream`` (a :class:`TrainStream` or a mix of them) has not started
    iterating and ``state`` is of its ``version``; ``mismatch`` follows the versions in the message,
    saying what to do."""
    if stream._started:
        raise ValueError(f"load_state_dict must be called before iterating the {type(stream).__name__}")
    if state.get("version") != version:
        raise ValueError(f"data state version {state.get('version')!r} is not {version!r}{mismatch}")


class TrainStream:
    """An infinite stream of per-rank batches; see the module docstring for the guarantees.

    Iterate it once (one consumer). Each batch maps each text column of :attr:`columns` to a
    dict of LongTensors (b, L_column) with b == ``per_device_batch_size`` and L_column the longest
    tokenised text of that column in the batch (<= ``max_length``): ``input_ids``,
    ``attention_mask`` and, when the tokenizer makes them, ``token_type_ids``; a label column
    to a LongTensor (b,). The position
    lives in :attr:`layout`; this object adds the bad-shard counters.
    """

    def __init__(self, dataset: _PieceDataset, num_workers: int, padding: Padding) -> None:
        self._dataset = dataset
        self.layout = dataset.layout
        self.padding = padding
        # The columns of every batch: those read, and the positive that data.augment makes.
        self.columns = dataset.columns + (AUGMENTED if dataset.augment.kind != "none" else ())
        self._loader = DataLoader(
            dataset,
            batch_size=None,  # pieces are already batched and tokenised in the workers
            num_workers=num_workers,
            persistent_workers=num_workers > 0,
            prefetch_factor=4 if num_workers > 0 else None,
            worker_init_fn=_worker_init if num_workers > 0 else None,
            collate_fn=_as_is,  # the default would turn the NumPy arrays into torch tensors in the worker
        )
        self.batch_size = self.layout.batch_size
        self.mode = self.layout.mode
        self.rank = self.layout.rank
        self.corrupt_shards_skipped = 0
        self.corrupt_shards: set[str] = set()
        self.shards_mismatched = 0
        self.shards_missing = 0
        self.samples_missing_field = 0
        self.samples_dropped = 0  # the rows at the ends of passes that filled no batch
        self.first_drop: tuple[int, int] | None = None  # (epoch, rows) of this stream's first drop
        self._started = False

    @property
    def epoch(self) -> int:
        return self.layout.epoch

    @property
    def batches_yielded(self) -> int:
        return self.layout.batches_yielded

    @property
    def samples_yielded(self) -> int:
        return self.layout.batches_yielded * self.batch_size

    @property
    def readers(self) -> int:
        """The distinct streams the ranks read: W, or 1 in global mode (every rank reads the same)."""
        return self.layout.readers

    def stats(self) -> dict:
        """Counters of what this rank's reader read, for the training log: the run's total is
        :attr:`readers` times their mean over the ranks (in global mode every rank counts the
        same rows and shards, so a sum over ranks would count them W times)."""
        return {
            "data_epoch": self.layout.epoch,
            "data_samples": self.layout.batches_yielded * self.layout.stream_batch_size,  # rows the batches took
            "data_corrupt_shards_skipped": self.corrupt_shards_skipped,
            "data_shards_mismatched": self.shards_mismatched,
            "data_shards_missing": self.shards_missing,
            "data_samples_missing_field": self.samples_missing_field,
            "data_samples_dropped": self.samples_dropped,
        }

    def state_dict(self) -> dict:
        """JSON-serialisable position after the last yielded batch, with the counters."""
        return {
            "version": STATE_VERSION,
            **self.layout.state_dict(),
            "corrupt_shards_skipped": self.corrupt_shards_skipped,
            "shards_mismatched": self.shards_mismatched,
            "shards_missing": self.shards_missing,
            "samples_dropped": self.samples_dropped,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a position saved by :meth:`state_dict` (before iterating)."""
        check_saved_state(
            state, STATE_VERSION, self, "; it was saved by another vascl-scale: start the data stream afresh"
        )
        self.corrupt_shards_skipped = int(state.get("corrupt_shards_skipped", 0))
        self.shards_mismatched = int(state.get("shards_mismatched", 0))
        self.shards_missing = int(state.get("shards_missing", 0))
        self.samples_dropped = int(state.get("samples_dropped", 0))
        self.layout.load_state_dict(state)

    def __iter__(self) -> Iterator[Batch]:
        if self._started:
            raise ValueError("a TrainStream can be iterated once; build another for a second consumer")
        self._started = True
        # Rows of this pass read but not yet yielded: [epoch, first row index in that epoch, per column tensors (rows, L) or (rows,), rows].
        segments: deque[list] = deque()
        pending = 0
        epoch, skip_rows = self.layout.epoch, self.layout.rows_into_epoch
        passes_without_batch = 0
        while True:
            self._dataset.shared_epoch.value = epoch
            # Whole rounds of pieces that are certainly skipped: workers read them without tokenising.
            self._dataset.shared_skip_pieces.value = skip_rows // self._dataset.batch_size // self.layout.workers
            epoch_rows = epoch_batches = 0
            for piece in self._loader:
                self.corrupt_shards_skipped += len(piece["corrupt"])
                self.corrupt_shards.update(piece["corrupt"])
                self.shards_mismatched += len(piece["mismatched"])
                self.shards_missing += len(piece["missing"])
                self.samples_missing_field += piece["missing_field"]
                rows = piece["rows"]
                first = epoch_rows
                epoch_rows += rows
                if skip_rows >= rows:
                    skip_rows -= rows
                    continue
                assert "columns" in piece, "a placeholder piece reached the rows to yield"
                tensors = {
                    column: column_rows(_tensors(arrays), slice(skip_rows, None))
                    for column, arrays in piece["columns"].items()
                }
                segments.append([epoch, first + skip_rows, tensors, rows - skip_rows])
                pending += rows - skip_rows
                skip_rows = 0
                while pending >= self.layout.stream_batch_size:
                    batch = self._take(segments)
                    pending -= self.layout.stream_batch_size
                    self.layout.batches_yielded += 1
                    epoch_batches += 1
                    yield batch
            if pending:  # the pass's last rows, too few for a batch (module doc)
                self._drop(epoch, pending)
                segments.clear()
                pending = 0
            passes_without_batch = passes_without_batch + 1 if epoch_batches == 0 else 0
            if passes_without_batch == MAX_PASSES_WITHOUT_BATCH:
                raise self._ran_dry(epoch) if epoch_rows == 0 else self._too_few_rows(epoch, epoch_rows)
            if skip_rows:
                logger.warning(
                    "resume position is past the end of epoch %d (shards changed?); continuing with the next", epoch
                )
                skip_rows = 0
            epoch += 1

    def _drop(self, epoch: int, rows: int) -> None:
        """Count the ``rows`` left at the end of pass ``epoch``, fewer than a batch, as dropped."""
        self.samples_dropped += rows
        if self.first_drop is None:
            self.first_drop = (epoch, rows)

    def _too_few_rows(self, epoch: int, rows: int) -> ValueError:
        """The error of a rank whose passes hold fewer rows than one batch (all dropped)."""
        return ValueError(
            f"rank {self.rank} read {rows} samples in data epoch {epoch}, fewer than its per-device batch of "
            f"{self.batch_size}, and no full batch in {MAX_PASSES_WITHOUT_BATCH} epochs: a partial batch is dropped, "
            "not trained on; use more data or a smaller train.global_batch_size"
        )

    def _ran_dry(self, epoch: int) -> CorruptShardError:
        """The error of a rank that read no sample in ``MAX_PASSES_WITHOUT_BATCH`` passes, naming the
        corrupt shards (a ``pipe:`` shard names its command)."""
        corrupt = ", ".join(sorted(self.corrupt_shards))
        named = f" (corrupt: {corrupt if len(corrupt) <= 200 else corrupt[:200] + '...'})" if corrupt else ""
        hint = "check the shards (sha256 in manifest.json)"
        if any(url.startswith(PIPE_PREFIX) for url in self.corrupt_shards):
            hint += "; a pipe: command must write a tar shard (webdataset format) to its output, not text"
        return CorruptShardError(
            f"rank {self.rank} read no sample in {MAX_PASSES_WITHOUT_BATCH} data epochs up to {epoch}: every shard it "
            f"drew is corrupt, missing or empty{named}; {hint}"
        )

    def _take(self, segments: deque) -> Batch:
        """Cut the next ``layout.stream_batch_size`` rows off the pending segments, record the
        position, and return this rank's rows of them (``layout.kept_rows``: all, or in global
        mode its b of the global batch)."""
        parts: list[Batch] = []
        kept = self.layout.kept_rows
        needed, cut = self.layout.stream_batch_size, 0  # cut: rows of this batch taken so far
        while needed:
            segment = segments[0]
            seg_epoch, first, tensors, rows = segment
            used = min(needed, rows)
            # The segment holds the batch's rows [cut, cut + used): keep those in ``kept``.
            start, stop = max(kept.start - cut, 0), min(kept.stop - cut, used)
            if start < stop:
                parts.append(batch_rows(tensors, slice(start, stop)))
            needed -= used
            cut += used
            self.layout.epoch, self.layout.rows_into_epoch = seg_epoch, first + used
            if used == rows:
                segments.popleft()
            else:
                segment[1:] = [first + used, batch_rows(tensors, slice(used, rows)), rows - used]
        return {column: self._join([part[column] for part in parts]) for column in parts[0]}

    def _join(self, parts: list) -> dict[str, torch.Tensor] | torch.Tensor:
        """One column's row blocks (r_i, L_i) joined into (b, L), L its longest real row; a label
        column's (r_i,) into (b,)."""
        if isinstance(parts[0], torch.Tensor):
            return torch.cat(parts)
        if len(parts) == 1 and parts[0]["input_ids"].shape[0] == self._dataset.batch_size:
            # The common case: one whole worker piece, already padded to its longest row.
            return parts[0]
        joined = concat_padded(parts, self.padding)  # (b, width)
        width = joined["input_ids"].shape[1]
        longest = int(joined["attention_mask"].sum(dim=1).max())
        keep = slice(width - longest, width) if self.padding.side == "left" else slice(0, longest)
        return {key: value[:, keep].contiguous() for key, value in joined.items()}


def _utf8(payload: bytes) -> str:
    return payload.decode("utf-8")


def _tensors(arrays: dict[str, np.ndarray] | np.ndarray) -> dict[str, torch.Tensor] | torch.Tensor:
    """A piece's column as torch tensors, sharing the arrays' memory: a label's (rows,), or a text's token tensors."""
    if isinstance(arrays, np.ndarray):
        return torch.from_numpy(arrays)
    return {key: torch.from_numpy(array) for key, array in arrays.items()}


def _can_use_stored_ids(source: ShardSource, tokenizer, max_length: int) -> bool:
    """Whether the shards hold ids from this very tokenizer at this truncation length."""
    stored = source.token_ids
    if stored is None:
        return False
    if stored.get("fingerprint") != tokenizer_fingerprint(tokenizer) or stored.get("max_length") != max_length:
        logger.info(
            "shards hold token ids of another tokenizer or max length (%s); tokenising the text instead",
            stored.get("max_length"),
        )
        return False
    return True


def _resolved_mode(shards: ShardSource, mode: str, num_nodes: int, world_size: int, workers: int, source: str) -> str:
    """ "exact", "resampled" or "global" for ``data.mode`` (see :func:`build_train_stream`)."""
    if shards.text_file is not None:
        if mode == "resampled":
            raise ValueError("resampled mode needs shards; run `vascl-scale data prepare` on the text file first")
        return GLOBAL if mode == GLOBAL else "exact"
    if mode == GLOBAL:
        if len(shards.urls) < workers:  # every rank reads every shard: one per worker is enough
            raise ValueError(
                f"global mode needs at least num_workers = {workers} shards, and {source} has {len(shards.urls)}; "
                "prepare smaller shards (--shard-size) or use fewer workers (data.num_workers)"
            )
        return GLOBAL
    slots = world_size * workers  # the slots that each need a shard of their own in exact mode
    resolved = mode if mode != "auto" else ("exact" if num_nodes == 1 else "resampled")
    if resolved == "exact" and len(shards.urls) < slots:
        if mode == "auto":
            logger.warning(
                "%d shards for %d readers (ranks x workers): reading them resampled (with replacement); "
                "prepare at least %d shards for exact epochs",
                len(shards.urls),
                slots,
                slots,
            )
            return "resampled"
        raise ValueError(
            f"exact mode needs at least world_size x workers = {slots} shards, and {source} has "
            f"{len(shards.urls)}; prepare smaller shards (--shard-size), use fewer workers, or use mode='resampled'"
        )
    return resolved


def build_train_stream(
    data: DataConfig,
    *,
    tokenizer,
    per_device_batch_size: int,
    rank: int,
    world_size: int,
    seed: int,
    num_nodes: int = 1,
    columns: Collection[str] | None = None,
    prompts: dict[str, str] | None = None,
    text_hashes: bool = False,
) -> TrainStream:
    """The infinite batch stream of one rank, from the ``data`` section (validated there).

    ``data.train`` is read as it is (expanded by :func:`vascl_scale.train.plan.resolve_paths`,
    which also checks that the WordNet database or masked LM of ``data.augment`` is usable, before
    any worker starts; a stream built without the plan meets a missing one in its loader workers): a
    directory with ``manifest.json``; shards in webdataset's URL syntax (a brace list,
    ``/x/shard-{000000..000019}.tar``, lists joined by ``::``); ``pipe:`` commands (only with
    ``data.allow_pipe``); or a ``.txt``/``.txt.gz`` file with one
    sentence per line. ``data.mode``: "exact" (each sample once per epoch; needs >= world_size *
    max(1, num_workers) shards), "resampled" (shards drawn with replacement), "global" (every
    rank reads the one-process exact stream in batches of world_size * per_device_batch_size
    rows and keeps its own per_device_batch_size of each: the same global batches for any world
    size, at world_size times the reading; needs >= max(1, num_workers) shards and
    ``on_corrupt="fail"``, checked in the config), or "auto": exact on one node (resampled,
    with a warning, when there are too few shards for exact), resampled on several; a text
    file is always read exactly (or globally). ``data.on_corrupt``: "skip" (warn and
    count) or "fail" (raise :class:`CorruptShardError`; also a :class:`ValueError` at once when
    shard files listed in the manifest are missing). ``data.shuffle_buffer`` 0 or 1: no shuffle.

    Args:
        data: the ``data`` section (:class:`vascl_scale.config.DataConfig`).
        tokenizer: a Hugging Face fast tokenizer (called in the workers, batched).
        per_device_batch_size: rows per batch on this rank.
        rank, world_size: this process's global rank and the number of ranks.
        seed: seeds shard order, resampling and shuffle buffers.
        num_nodes: nodes in the run (for ``mode="auto"``).
        columns: the columns to read where the data has them (the objective's ``spec.columns_read``;
            what it lacks is the objective's to stand in for or refuse); None: all the data has.
        prompts: ``model.prompts`` (or a mixed source's own): text put before a column's texts,
            tokenised with them. Shards store texts, and ids stored by ``data prepare --tokenizer``
            hold the text alone (a prompt is a choice of the run, not of the data): a prompted
            column is tokenised from its text.
        text_hashes: give each batch the hash of every text column's rows too, under
            :func:`vascl_scale.data.columns.text_hash_column` ((b,) int64): what
            ``loss.false_negatives: duplicates`` compares across ranks.
    """
    # The section's settings, under the names the stream's code uses.
    source, max_length, num_workers, mode = data.train, data.max_length, data.num_workers, data.mode
    shuffle_buffer, on_corrupt, pipe_timeout = data.shuffle_buffer, data.on_corrupt, data.pipe_timeout
    if per_device_batch_size < 1:
        raise ValueError(f"per_device_batch_size must be >= 1; got {per_device_batch_size}")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size; got rank={rank}, world_size={world_size}")
    if num_nodes < 1:
        raise ValueError(f"num_nodes must be >= 1; got {num_nodes}")
    if tokenizer.pad_token_id is None:
        raise ValueError("the tokenizer has no pad token; set tokenizer.pad_token before building the stream")
    if not getattr(tokenizer, "is_fast", False):
        logger.warning("the tokenizer is not a fast (Rust) tokenizer: expect the data loader to be slow")
    shards = resolve_source(source, allow_pipe=data.allow_pipe)
    if shards.missing:
        count = f"{len(shards.missing)} of {len(shards.urls)}"
        what = f"{count} shards listed in {source} are missing (first: {shards.missing[0]})"
        if on_corrupt == "fail":
            raise ValueError(
                f"{what}; restore them, run `vascl-scale data prepare` again, or pass on_corrupt='skip' "
                "(data.on_corrupt) to train on the rest"
            )
        logger.warning("%s: training on the rest (on_corrupt='skip')", what)
    workers = max(1, num_workers)
    resolved_mode = _resolved_mode(shards, mode, num_nodes, world_size, workers, source)
    augment = data.augment_spec()
    read = columns_to_read(shards.columns, columns, augment.kind != "none", source)
    # Augmentation changes the text: the ids stored in the shards would be those of the original.
    use_stored_ids = augment.kind == "none" and _can_use_stored_ids(shards, tokenizer, max_length)
    prompted = [column for column in read if prompt_of(prompts or {}, column)]
    if use_stored_ids and prompted:
        logger.info("data: model.prompts for %s: tokenising the text (stored ids hold no prompt)", ", ".join(prompted))
        use_stored_ids = False
    layout = StreamLayout(shards, resolved_mode, seed, rank, world_size, workers, per_device_batch_size, shuffle_buffer)
    dataset = _PieceDataset(
        layout, tokenizer, max_length, on_corrupt, use_stored_ids, pipe_timeout, augment, read, prompts, text_hashes
    )
    if augment.kind != "none":
        logger.info(
            "data: %s augmentation of %s of the words, %s view(s)", augment.kind, augment.fraction, augment.views
        )
    what = shards.text_file or f"{len(shards.urls)} shards ({shards.total_samples or 'unknown'} samples)"
    batch = f"batch {per_device_batch_size}"
    if resolved_mode == GLOBAL:
        kept = layout.kept_rows
        batch += f" (rows {kept.start}-{kept.stop - 1} of each global batch of {layout.stream_batch_size}, read whole on every rank)"
    logger.info(
        "data: %s%s, %s mode, rank %d of %d, %d workers, %s, max length %d%s",
        what,
        "" if read == SINGLE_TEXT else f", columns {', '.join(read)}",
        resolved_mode,
        rank,
        world_size,
        num_workers,
        batch,
        max_length,
        ", token ids stored in the shards" if use_stored_ids else "",
    )
    return TrainStream(dataset, num_workers, Padding.of(tokenizer))

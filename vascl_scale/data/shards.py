"""WebDataset shard files: writing, streaming reading, source lists.

A shard is a plain POSIX tar file written by webdataset's ``TarWriter`` (:func:`write_shard`).
Each sample is one member ``<key>.txt`` holding the UTF-8 sentence (plus ``<key>.ids``, int32
token ids, from ``data prepare --tokenizer``), so ``webdataset.WebDataset`` reads the shards as
samples ``{"__key__", "txt"[, "ids"]}``; a sample of several columns has a member per column,
``<key>.anchor.txt``, ``<key>.positive.txt``, ... (:mod:`vascl_scale.data.columns`). Members
carry fixed metadata (mtime 0, uid/gid 0, no user names, mode 0644) so the same sentences in the
same order always give the same bytes and the same sha256.

Source strings follow webdataset's URL syntax (:func:`expand_urls`). A shard is opened by
:class:`ShardStream` rather than webdataset's ``gopen``: for a ``pipe:`` URL, ``gopen`` waits
without a deadline on a stalled command and leaves the command's children running when the
reader stops early; :class:`ShardStream` bounds both and checks the bytes against the
manifest as they stream in. Its bytes are parsed by :func:`iter_tar_samples` (why not
webdataset's parser: see there).

The manifest (``manifest.json`` next to the shards, :mod:`vascl_scale.data.manifest`) records
the columns of the samples and every shard's file name, sample count, sha256 and byte size. A
:class:`ShardStream` opened with the shard's :class:`ShardCheck` hashes the bytes as they
stream in and, once the shard is read to its end, raises :class:`ShardMismatchError` when they
are not the bytes the manifest describes (a shard rewritten or damaged after ``data prepare``).
Its ``columns`` (:func:`source_columns`; absent: single-text shards) name each sample's columns.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import selectors
import signal
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import webdataset as wds

from vascl_scale.data.columns import SINGLE_TEXT, manifest_columns
from vascl_scale.data.manifest import MANIFEST_NAME, read_manifest

logger = logging.getLogger(__name__)

SHARD_PATTERN = "shard-{index:06d}.tar"
PIPE_PREFIX = "pipe:"
TEXT_SUFFIXES = (".txt", ".txt.gz")
# Seconds a ``pipe:`` command may go without output (or without exiting once its output ends).
# Below torch.distributed's default 10-minute collective timeout, so a stalled download names
# its command instead of surfacing as a collective timeout on the other ranks.
PIPE_TIMEOUT = 300.0


class ShardMismatchError(ValueError):
    """A shard read to its end is not the bytes its manifest entry describes (size or sha256)."""


@dataclass(frozen=True)
class ShardCheck:
    """What a manifest entry promises about a shard file's bytes."""

    sha256: str
    size: int | None  # None in manifests written before sizes were recorded


def write_shard(path: Path, samples: Iterable[tuple[str, dict[str, bytes]]]) -> None:
    """Write one tar shard with webdataset's ``TarWriter``: one member ``<key>.<field>`` per field.

    Fixed member metadata (mtime 0, uid/gid 0, no user or group names, mode 0644; members of a
    sample in sorted field order) makes the bytes depend only on the keys and the contents; a
    text-only shard has the same bytes as from the tarfile writer this replaced. A
    failed write (a full disk) raises the ``OSError`` and leaves a partial file for the caller
    to remove.
    """
    with open(path, "wb") as handle:
        writer = wds.TarWriter(handle, user="", group="", mode=0o644, mtime=0, encoder=False)
        try:
            for key, fields in samples:
                assert "." not in key and "/" not in key, f"sample key {key!r} must not contain '.' or '/'"
                writer.write({"__key__": key, **fields})
        except BaseException:
            with contextlib.suppress(OSError):  # releases the writer's buffer; the end blocks fail again
                writer.close()
            raise
        writer.close()


_BLOCK = 512
_END_BLOCK = bytes(_BLOCK)
_FILE_TYPES = (b"0", b"\0", b"7")  # regular file (old and new flags) and contiguous file


def _read_exact(stream: IO[bytes], size: int, what: str) -> bytes:
    data = stream.read(size)
    if len(data) != size:
        raise EOFError(f"tar data ends inside {what} ({len(data)} of {size} bytes)")
    return data


def _header_size(header: bytes) -> int:
    field = header[124:136]
    if field[0] & 0x80:  # GNU base-256 encoding for members over 8 GiB
        return int.from_bytes(field[1:], "big")
    return int(field.strip(b"\0 ") or b"0", 8)


def _pax_path(records: bytes) -> bytes | None:
    """The ``path`` value of a PAX extended header ("<len> key=value\\n" records)."""
    offset = 0
    while offset < len(records):
        length = int(records[offset : records.index(b" ", offset)])
        key, _, value = records[offset : offset + length].partition(b" ")[2].partition(b"=")
        if key == b"path":
            return value[:-1]
        offset += length
    return None


def iter_tar_samples(stream: IO[bytes]) -> Iterator[dict[str, str | bytes]]:
    """Stream the samples of a tar byte stream as webdataset does: ``{"__key__": key, field: bytes}``.

    Members are grouped by key, the member path up to the first dot of its base name (the
    WebDataset rule). Kept instead of webdataset's ``tar_file_expander`` + ``group_by_keys``
    because those parse headers with ``tarfile``: 45-51 us per one-member sample against 6-9
    here (a 10,000-sample shard of wiki1m, one core), which takes ``bench data`` below its
    floor (docs/shards.md). And ``tarfile`` ends a stream silently where the data is
    cut between two members or a header after the first is corrupt; this reader raises
    ``EOFError`` on truncated data and ``ValueError`` on a corrupt header (bad checksum or size
    field).
    Formats: ustar, GNU long names, PAX paths.
    """
    sample: dict[str, str | bytes] | None = None
    long_name: bytes | None = None
    while True:
        header = stream.read(_BLOCK)
        if not header:
            raise EOFError("tar data ends without an end-of-archive block")
        if len(header) != _BLOCK:
            raise EOFError(f"tar data ends inside a header ({len(header)} of {_BLOCK} bytes)")
        if header == _END_BLOCK:
            break
        # Header checksum: byte sum with the 8-byte checksum field counted as spaces (8 * 32).
        try:
            stored = int(header[148:156].strip(b"\0 ") or b"-1", 8)
            size = _header_size(header)
        except ValueError as err:
            raise ValueError(f"corrupt tar header: {err}") from None
        if stored != sum(header) - sum(header[148:156]) + 256:
            raise ValueError("tar header checksum mismatch")
        flag = header[156:157]
        field = None
        if flag in _FILE_TYPES:
            if long_name is not None:
                raw_name, long_name = long_name, None
            else:
                raw_name = header[:100].split(b"\0", 1)[0]
                if header[257:262] == b"ustar" and header[345] != 0:
                    raw_name = header[345:500].split(b"\0", 1)[0] + b"/" + raw_name
            directory, _, base = raw_name.decode("utf-8", "surrogateescape").rpartition("/")
            stem, dot, field = base.partition(".")
            key = f"{directory}/{stem}" if directory else stem
            field = field if dot else ""
            if sample is None or key != sample["__key__"]:
                # The previous sample is complete once the next one starts, even if its data is cut.
                if sample is not None:
                    yield sample
                sample = {"__key__": key}
        payload = _read_exact(stream, size, "a member") if size else b""
        padding = -size % _BLOCK
        if padding:
            _read_exact(stream, padding, "member padding")
        if flag == b"L":  # GNU long name of the next member
            long_name = payload.rstrip(b"\0")
        elif flag == b"x":  # PAX extended header of the next member
            long_name = _pax_path(payload) or long_name
        elif field is not None:
            sample[field] = payload  # type: ignore[index]
    if sample is not None:
        yield sample


class _DigestReader:
    """Passes reads through, keeping the sha256 and byte count of everything read so far."""

    def __init__(self, handle: IO[bytes]) -> None:
        self._handle = handle
        self._digest = hashlib.sha256()
        self._size = 0

    def read(self, size: int = -1) -> bytes:
        data = self._handle.read(size)
        self._digest.update(data)
        self._size += len(data)
        return data

    def close(self) -> None:
        self._handle.close()

    def verify(self, check: ShardCheck) -> None:
        """Compare with the manifest entry; only meaningful once the shard was read to its end."""
        if check.size is not None and self._size != check.size:
            raise ShardMismatchError(f"{self._size} bytes where the manifest lists {check.size}")
        digest = self._digest.hexdigest()
        if digest != check.sha256:
            raise ShardMismatchError(f"sha256 {digest[:12]}... where the manifest lists {check.sha256[:12]}...")


class _PipeReader:
    """A command's stdout, read with a deadline: ``TimeoutError`` after ``timeout`` s without a byte."""

    def __init__(self, process: subprocess.Popen, command: str, timeout: float) -> None:
        assert process.stdout is not None
        self._fd = process.stdout.fileno()
        self._command = command
        self._timeout = timeout
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._fd, selectors.EVENT_READ)
        self._chunk = b""
        self._offset = 0  # bytes of _chunk already returned

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes (all to EOF when negative); fewer only at EOF."""
        end = self._offset + size
        if size >= 0 and end <= len(self._chunk):  # the common case: a tar header or member in the chunk
            data = self._chunk[self._offset : end]
            self._offset = end
            return data
        parts = []
        wanted = size
        while wanted != 0:
            if self._offset == len(self._chunk):
                if not self._selector.select(self._timeout):
                    raise TimeoutError(
                        f"no data for {self._timeout:g} s (pipe_timeout, data.pipe_timeout: raise it for a slow "
                        f"source) from the shard command: {self._command}"
                    )
                self._chunk, self._offset = os.read(self._fd, 1 << 20), 0
                if not self._chunk:
                    break
            end = len(self._chunk) if wanted < 0 else min(len(self._chunk), self._offset + wanted)
            parts.append(self._chunk[self._offset : end])
            if wanted > 0:
                wanted -= end - self._offset
            self._offset = end
        return b"".join(parts)

    def close(self) -> None:
        self._selector.close()


class ShardStream:
    """Context manager giving a byte stream for a local shard path or a ``pipe:`` command.

    A pipe that gives no byte for ``timeout`` seconds, or does not exit that long after its
    output ends, raises ``TimeoutError`` (an ``OSError``); a non-zero exit status after a full
    read raises ``OSError``: a failed download is a corrupt shard, not a short one. The command
    runs in a process group of its own, killed as a whole on an early close or a timeout.

    With ``check``, a stream read to its end (the ``with`` body finished without an exception)
    is compared with the manifest entry: :class:`ShardMismatchError` on a difference. A shard
    left early (an error, a consumer that stopped) is not checked: its digest is unknown.
    """

    def __init__(self, url: str, check: ShardCheck | None = None, timeout: float = PIPE_TIMEOUT) -> None:
        self.url = url
        self.check = check
        self.timeout = timeout
        self._process: subprocess.Popen | None = None
        self._handle: IO[bytes] | _PipeReader | _DigestReader | None = None

    def __enter__(self) -> IO[bytes]:
        if self.url.startswith(PIPE_PREFIX):
            command = self.url[len(PIPE_PREFIX) :]
            logger.debug("running shard command: %s", command)
            self._process = subprocess.Popen(
                command, shell=True, stdout=subprocess.PIPE, bufsize=0, start_new_session=True
            )
            self._handle = _PipeReader(self._process, command, self.timeout)
        else:
            self._handle = open(self.url, "rb", buffering=1 << 20)
        if self.check is not None:
            self._handle = _DigestReader(self._handle)  # type: ignore[arg-type]
        return self._handle  # type: ignore[return-value]

    def __exit__(self, exc_type, exc, traceback) -> None:
        assert self._handle is not None
        complete = False
        try:
            if exc_type is None:
                # Read to the end: the digest covers the tar's trailing padding, and a pipe writer
                # cut off mid-write would exit with SIGPIPE.
                while self._handle.read(1 << 20):
                    pass
                complete = True
        finally:
            self._handle.close()
            if self._process is not None:
                self._end_command(complete)
        if complete and isinstance(self._handle, _DigestReader):
            self._handle.verify(self.check)  # type: ignore[arg-type]

    def _end_command(self, complete: bool) -> None:
        assert self._process is not None and self._process.stdout is not None
        command = self.url[len(PIPE_PREFIX) :]
        self._process.stdout.close()
        if not complete:
            self._kill_group()
        try:
            status = self._process.wait(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            self._kill_group()
            self._process.wait()
            raise TimeoutError(
                f"the shard command did not exit {self.timeout:g} s (pipe_timeout) after its output ended: {command}"
            ) from None
        if complete and status != 0:
            raise OSError(f"shard command exited with status {status}: {command}")

    def _kill_group(self) -> None:
        assert self._process is not None
        try:
            os.killpg(self._process.pid, signal.SIGKILL)  # the shell and everything it started
        except ProcessLookupError:  # already gone
            pass


def tokenizer_fingerprint(tokenizer) -> str | None:
    """sha256 of a fast tokenizer's definition (vocabulary, normalizer, specials); None if not fast.

    The truncation and padding settings are left out: the HF wrapper changes them per call.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    definition = json.loads(backend.to_str())
    definition.pop("truncation", None)
    definition.pop("padding", None)
    return hashlib.sha256(json.dumps(definition, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class ShardSource:
    """What a loader reads: shard URLs with their sample counts and manifest checks, or a text file.

    ``counts[i]`` is None when unknown and 0 for a shard in ``missing`` (listed in the manifest,
    file absent); ``checks[i]`` is None when no manifest describes shard ``i``. ``token_ids`` is
    the manifest's record of token ids stored in the shards (tokenizer fingerprint and
    truncation length), or None. ``columns``: the columns of every sample (:func:`source_columns`).
    """

    urls: tuple[str, ...]
    counts: tuple[int | None, ...]
    checks: tuple[ShardCheck | None, ...]
    text_file: str | None = None
    token_ids: dict | None = None
    missing: tuple[str, ...] = ()
    columns: tuple[str, ...] = SINGLE_TEXT

    @property
    def total_samples(self) -> int | None:
        if any(count is None for count in self.counts):
            return None
        return sum(self.counts)  # type: ignore[arg-type]

    def fingerprint(self) -> str:
        """A short digest of the shard names and counts (or the text file name) for resume checks.

        Local paths count by file name only, so a shard directory can move between runs.
        """
        names = [url if url.startswith(PIPE_PREFIX) else Path(url).name for url in self.urls]
        if self.text_file is not None:
            names = [Path(self.text_file).name]
        digest = hashlib.sha256(json.dumps([names, list(self.counts)]).encode())
        return digest.hexdigest()[:16]


def _shard_check(entry: dict) -> ShardCheck | None:
    """The check of a manifest entry validated by :func:`read_manifest`."""
    return None if entry.get("sha256") is None else ShardCheck(entry["sha256"], entry.get("bytes"))


def _manifest_entries_near(urls: list[str]) -> tuple[list[int | None], list[ShardCheck | None], tuple[str, ...]]:
    """Sample counts and checks of local shards listed in a manifest in their directory, else
    None; and the columns that the manifests of all their directories list (a directory without
    one of ours holds single-text shards)."""
    counts: list[int | None] = [None] * len(urls)
    checks: list[ShardCheck | None] = [None] * len(urls)
    by_directory: dict[Path, dict[str, dict]] = {}
    columns_of: dict[Path, tuple[str, ...]] = {}
    for index, url in enumerate(urls):
        directory = Path(url).parent
        if directory not in by_directory:
            by_directory[directory], columns_of[directory] = {}, SINGLE_TEXT
            if (directory / MANIFEST_NAME).is_file():
                try:
                    manifest = read_manifest(directory)
                except ValueError as err:  # another tool's manifest.json: counts stay unknown
                    logger.info("ignoring %s: %s", directory / MANIFEST_NAME, err)
                    continue
                by_directory[directory] = {entry["name"]: entry for entry in manifest["shards"]}
                columns_of[directory] = manifest_columns(manifest, str(directory / MANIFEST_NAME))
        entry = by_directory[directory].get(Path(url).name)
        if entry is not None:
            counts[index], checks[index] = entry["samples"], _shard_check(entry)
    first, *others = columns_of.values()
    columns = tuple(column for column in first if all(column in other for other in others))
    return counts, checks, columns


def expand_urls(source: str) -> list[str]:
    """webdataset's URL list syntax: ``::`` joins lists, braces expand, ``${NAME}`` is ``$WDS_NAME``."""
    try:
        return wds.shardlists.expand_urls(source)
    except AssertionError:  # webdataset asserts that the WDS_ variable is set
        raise ValueError(
            f"source {source!r} names an unset variable: webdataset replaces ${{NAME}} with the environment "
            "variable WDS_NAME; set it or write the value out"
        ) from None


def source_columns(source: str) -> tuple[str, ...]:
    """The columns every sample of ``source`` holds, from its manifests alone (no shard is read).

    A directory: its manifest's. Listed shards: the columns that the manifests next to them all
    list (shards without one of ours are single-text). A text file, ``pipe:`` commands (no
    manifest describes them) and shards that do not exist (the loader says so):
    :data:`~vascl_scale.data.columns.SINGLE_TEXT`. A manifest that is not one of ours raises
    ``ValueError`` as the loader would.
    """
    if PIPE_PREFIX in source or source.endswith(TEXT_SUFFIXES):
        return SINGLE_TEXT
    path = Path(source)
    if path.is_dir():
        return manifest_columns(read_manifest(path), str(path / MANIFEST_NAME))
    urls = expand_urls(source)
    if not all(Path(url).is_file() for url in urls):
        return SINGLE_TEXT
    return _manifest_entries_near(urls)[2]


def resolve_source(source: str, allow_pipe: bool = False) -> ShardSource:
    """Turn a loader ``source`` string into shard URLs (with counts where known) or a text file.

    Accepted: a directory holding ``manifest.json``; a list of local ``.tar`` paths in
    webdataset's syntax (:func:`expand_urls`); ``pipe:`` commands in that syntax too (only with
    ``allow_pipe``); a ``.txt`` or ``.txt.gz`` file with one sentence per line.
    """
    path = Path(source)
    urls = expand_urls(source) if PIPE_PREFIX in source else []
    if any(url.startswith(PIPE_PREFIX) for url in urls):
        if not allow_pipe:
            raise ValueError(
                f"source {source!r} runs a shell command; pass it on the command line or in the training "
                "config with pipe sources allowed (allow_pipe=True)"
            )
        logger.info("reading %d shards, through shell commands such as %s", len(urls), urls[0])
        return ShardSource(urls=tuple(urls), counts=(None,) * len(urls), checks=(None,) * len(urls))
    if path.is_dir():
        manifest = read_manifest(path)
        urls = [str(path / shard["name"]) for shard in manifest["shards"]]
        if not urls:
            raise ValueError(f"the manifest in {path} lists no shards; run `vascl-scale data prepare` on more text")
        missing = tuple(url for url in urls if not Path(url).is_file())
        if len(missing) == len(urls):
            raise ValueError(
                f"none of the {len(urls)} shards listed in {path / MANIFEST_NAME} exist (first: {missing[0]}); "
                "restore them or run `vascl-scale data prepare` again"
            )
        return ShardSource(
            urls=tuple(urls),
            # A missing shard gives no sample: resume positions computed from counts stay exact.
            counts=tuple(0 if url in missing else shard["samples"] for url, shard in zip(urls, manifest["shards"])),
            checks=tuple(_shard_check(shard) for shard in manifest["shards"]),
            token_ids=manifest.get("token_ids"),
            missing=missing,
            columns=manifest_columns(manifest, str(path / MANIFEST_NAME)),
        )
    if source.endswith(TEXT_SUFFIXES):
        if not path.is_file():
            raise ValueError(f"text file {source} does not exist")
        return ShardSource(urls=(), counts=(), checks=(), text_file=source)
    urls = expand_urls(source)
    missing = [url for url in urls if not Path(url).is_file()]
    if missing:
        raise ValueError(
            f"{len(missing)} of {len(urls)} shards in {source!r} do not exist (first: {missing[0]}); pass a "
            "directory with manifest.json, a list of existing .tar files, or a .txt/.txt.gz file"
        )
    counts, checks, columns = _manifest_entries_near(urls)
    return ShardSource(urls=tuple(urls), counts=tuple(counts), checks=tuple(checks), columns=columns)

"""``data download``: fetch each dataset's original files, convert them, verify the result.

Per dataset (:mod:`vascl_scale.data.registry`):

1. **Present?** When every converted file already exists with its registry digest, nothing is
   fetched (``--force`` redoes it).
2. **Fetch** each original into ``<to>/.downloads/<host>/<path>`` (the URL's host and path), from
   its URL or from ``--mirror``, a directory or URL holding the originals in that same layout.
   Bytes go to ``<file>.part`` first and are renamed only once complete and, where the registry
   pins the original's sha256, verified: a partial download never looks complete. An HTTP
   transfer that stops part-way (or runs past ``--timeout``) keeps its ``.part``; the next run
   asks for the rest with a ``Range`` request, and fetches the whole file afresh when the server
   ignores it or answers from another byte. A directory mirror's symlink must stay inside it.
3. **Convert** into a staging directory inside ``<to>`` (``.staging-<dataset>-*``; one that a
   killed run left is removed by the next), check every converted file against its digest,
   then move the files into place. A mismatch keeps the old files and names the file,
   both digests and what to do. Originals a converter fails on (a cut or damaged archive, an
   error page, a body shorter than the file) are deleted, so the next run fetches them again.
   Where the registry pins no digest for a converted file (the training sets, NanoBEIR), the
   summary prints the sha256 of each unpinned original it came from; it also prints what a
   converter reports (the rows NanoBEIR's converter dropped).

A failure of one dataset (network, checksum, source, conversion, filesystem) is reported and the
others go on; the summary lists what was fetched, converted, skipped as present, and failed, and
why. One download at a time writes into a ``<to>``: it holds an ``flock`` on ``<to>/.download.lock``.
"""

from __future__ import annotations

import http.client
import logging
import os
import shutil
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn
from rich.table import Table

from vascl_scale.data.registry import Dataset, Source
from vascl_scale.fs import FolderLock, file_sha256
from vascl_scale.log import console
from vascl_scale.paths import check_output_dir

logger = logging.getLogger(__name__)

DOWNLOADS = ".downloads"
LOCK_FILE = ".download.lock"
STAGING_PREFIX = ".staging-"  # <to>/.staging-<dataset>-XXXXXXXX: a conversion under way
READ_TIMEOUT_S = 60.0  # per socket operation: a stalled server fails instead of hanging
SIZE_TIMEOUT_S = 10.0  # the HEAD request that sizes a file for the plan: a hint, not worth a minute
PLAN_RATE_MB_S = 10.0  # the link speed the plan's rough time assumes (said in the line it prints)
FILE_TIMEOUT_S = 3600.0  # per file (--timeout): a server dripping bytes fails instead of going on for ever
CHUNK_BYTES = 1 << 20


class DownloadError(Exception):
    """One dataset could not be obtained; ``kind`` is network, checksum, source or conversion
    (a failure to write under ``--to`` is reported as filesystem)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass
class Outcome:
    """What happened to one dataset."""

    name: str
    status: str  # "converted", "present" or "failed"
    fetched: list[Path] = field(default_factory=list)  # originals transferred in this run
    reused: list[Path] = field(default_factory=list)  # originals already complete in .downloads
    reason: str = ""  # "<kind>: <message>" of a failure
    remarks: list[str] = field(default_factory=list)  # withheld parts, digests of unpinned originals


def _check_digest(path: Path, expected: str, what: str, fix: str) -> None:
    actual = file_sha256(path)
    if actual != expected:
        raise DownloadError("checksum", f"{what} has sha256 {actual}, the registry expects {expected}; {fix}")


class Fetcher:
    """Brings original files into ``<to>/.downloads``, from their URLs or a mirror; an HTTP
    transfer that takes more than ``timeout`` seconds fails."""

    def __init__(self, downloads: Path, mirror: str | None, progress: Progress, timeout: float) -> None:
        self.downloads = downloads
        self.mirror = mirror
        self.progress = progress
        self.timeout = timeout

    def location(self, source: Source) -> str:
        """The URL or local path this source is read from."""
        if self.mirror is None:
            return source.url
        if urlsplit(self.mirror).scheme in ("http", "https"):
            return f"{self.mirror.rstrip('/')}/{source.mirror_path}"
        return str(Path(self.mirror) / source.mirror_path)

    def bytes_to_fetch(self, source: Source, force: bool) -> int | None:
        """How many bytes :meth:`fetch` would transfer: 0 for an original already complete in
        ``.downloads``, the rest past a resumable ``.part``, else the whole file's size as the
        mirror's file or an HTTP HEAD reports it; None where the source does not say."""
        target = self.downloads / source.mirror_path
        if target.is_file() and not force:
            return 0  # a pinned one that changed on disk is fetched again; rare enough to leave out here
        where = self.location(source)
        if urlsplit(where).scheme not in ("http", "https"):
            path = Path(where)
            return path.stat().st_size if path.is_file() else None
        request = urllib.request.Request(where, method="HEAD", headers={"User-Agent": "vascl-scale"})
        try:
            with urllib.request.urlopen(request, timeout=min(SIZE_TIMEOUT_S, self.timeout)) as response:
                length = response.headers.get("Content-Length", "")
        except (urllib.error.URLError, OSError, http.client.HTTPException):
            return None  # the fetch itself will say what is wrong
        if not length.isdigit():
            return None
        part = target.with_name(target.name + ".part")
        resumed = part.stat().st_size if not force and part.is_file() and Path(f"{part}.validator").is_file() else 0
        return max(int(length) - resumed, 0)

    def fetch(self, source: Source, force: bool) -> tuple[Path, bool]:
        """(the local original, whether it was transferred now)."""
        target = self.downloads / source.mirror_path
        assert target.resolve().is_relative_to(self.downloads.resolve()), target  # Source refuses . and .. segments
        if target.is_file() and not force:
            if source.sha256 is None or file_sha256(target) == source.sha256:
                return target, False
            target.unlink()  # a pinned original that changed on disk: fetch it again
        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_name(target.name + ".part")
        if force:
            part.unlink(missing_ok=True)
        where = self.location(source)
        if urlsplit(where).scheme in ("http", "https"):
            self._http(where, part)
        else:
            self._copy(Path(where), part)
        if source.sha256 is not None:
            try:
                _check_digest(
                    part,
                    source.sha256,
                    f"the original {where}",
                    "it is deleted; rerun to fetch it again, and if it persists, the source no longer serves "
                    "the file the registry pinned: use an existing copy of the data or report it",
                )
            except DownloadError:
                part.unlink()
                part.with_name(part.name + ".validator").unlink(missing_ok=True)
                raise
        os.replace(part, target)
        return target, True

    def _copy(self, path: Path, part: Path) -> None:
        if not path.is_file():
            raise DownloadError(
                "source",
                f"{path} does not exist; the mirror must hold each original at <mirror>/<host>/<path> of its URL",
            )
        assert self.mirror is not None  # only a directory mirror is copied from
        if not path.resolve().is_relative_to(Path(self.mirror).resolve()):
            raise DownloadError(
                "source",
                f"{path} leads to {path.resolve()}, outside the mirror {self.mirror}; refused: put the file itself in the mirror",
            )
        shutil.copyfile(path, part)

    def _http(self, url: str, part: Path) -> None:
        """Fetch ``url`` into ``part``, continuing a partial ``part`` with a Range request.

        A continuation is taken only when it is one: the server answers 206 from the requested
        byte, and (``If-Range``) only while the file is the one the ``.part`` began with (its
        ETag or Last-Modified, kept in ``<part>.validator``). A 200 reply is the whole file; a 206
        from another byte is discarded and the whole file asked for without Range."""
        validator_file = part.with_name(part.name + ".validator")
        deadline = time.monotonic() + self.timeout
        start = part.stat().st_size if part.exists() and validator_file.is_file() else 0  # no validator: start over
        response = self._request(url, part, start)
        if response is None:
            return  # the .part already holds every byte of this version
        if start and response.status == 206 and _range_start(response.headers) != start:
            response.close()
            logger.info("%s answered the range request from another byte: fetching the whole file", url)
            start = 0
            response = self._request(url, part, 0)
            assert response is not None  # only a range request is answered "already complete"
        if start and response.status != 206:
            logger.info("%s did not continue the partial download: fetching it from the start", url)
            start = 0
        with response:
            if not start and response.status != 200:
                raise DownloadError(
                    "network", f"{url}: HTTP {response.status} to a request for the whole file; report it to the source"
                )
            validator = response.headers.get("ETag") or response.headers.get("Last-Modified")
            if validator:
                validator_file.write_text(validator, encoding="utf-8")
            else:
                validator_file.unlink(missing_ok=True)
            length = response.headers.get("Content-Length", "")
            total = start + int(length) if length.isdigit() else None  # unknown: complete at the end of the stream
            task = self.progress.add_task(Path(urlsplit(url).path).name, total=total, completed=start)
            received = start
            try:
                with part.open("ab" if start else "wb") as out:
                    while True:
                        if time.monotonic() > deadline:
                            raise DownloadError(
                                "network",
                                f"{url}: not complete after {self.timeout:g} s ({received} bytes received); rerun to "
                                "resume, or pass a longer --timeout",
                            )
                        try:
                            chunk = response.read1(CHUNK_BYTES)  # what has arrived: the deadline is checked often
                        except (OSError, http.client.HTTPException) as err:
                            raise DownloadError(
                                "network", f"{url}: transfer stopped after {received} bytes ({err!r}); rerun to resume"
                            ) from None
                        if not chunk:
                            break
                        out.write(chunk)
                        received += len(chunk)
                        self.progress.update(task, completed=received)
            finally:
                self.progress.remove_task(task)
        if total is not None and received != total:
            raise DownloadError(
                "network", f"{url}: connection closed after {received} of {total} bytes; rerun to resume"
            )
        validator_file.unlink(missing_ok=True)

    def _request(self, url: str, part: Path, start: int) -> http.client.HTTPResponse | None:
        """The reply to a GET of ``url`` (from byte ``start`` when not 0), or None when a 416 says
        the ``.part`` already holds the whole file."""
        validator_file = part.with_name(part.name + ".validator")
        headers = {"User-Agent": "vascl-scale"}
        if start:
            headers.update({"Range": f"bytes={start}-", "If-Range": validator_file.read_text(encoding="utf-8")})
        try:
            return urllib.request.urlopen(
                urllib.request.Request(url, headers=headers), timeout=min(READ_TIMEOUT_S, self.timeout)
            )
        except urllib.error.HTTPError as err:
            if err.code == 416:
                validator_file.unlink(missing_ok=True)  # either way this .part is finished with
                if start and _complete_length(err.headers) == start:
                    return None
                part.unlink(missing_ok=True)
                raise DownloadError(
                    "network", f"{url}: the partial download does not fit the file; it is deleted, rerun"
                ) from None
            raise DownloadError("network", f"{url}: HTTP {err.code} {err.reason}") from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as err:
            raise DownloadError("network", f"{url}: {getattr(err, 'reason', err)}") from None


def _range_start(headers) -> int | None:
    """The first byte of a 206 reply (``Content-Range: bytes START-END/TOTAL``)."""
    value = (headers.get("Content-Range") or "").removeprefix("bytes ")
    first = value.partition("-")[0]
    return int(first) if first.isdigit() else None


def _complete_length(headers) -> int | None:
    """The file's length from a 416 reply (``Content-Range: bytes */TOTAL``)."""
    value = (headers.get("Content-Range") or "").rpartition("/")[2] if headers is not None else ""
    return int(value) if value.isdigit() else None


def _names(originals: list[Path]) -> list[str]:
    """Each original's file name, with its folder where two share a name (a Hugging Face
    dataset's ``corpus/train-00000-of-00001.parquet``, ``queries/train-00000-of-00001.parquet``)."""
    names = [path.name for path in originals]
    return [f"{path.parent.name}/{path.name}" if names.count(path.name) > 1 else path.name for path in originals]


def outputs_present(dataset: Dataset, to: Path) -> bool:
    """Every converted file exists and, where pinned, has its registry digest."""
    for relative, digest in dataset.outputs.items():
        path = to / relative
        if not path.is_file() or (digest and file_sha256(path) != digest):
            return False
    return True


def obtain(dataset: Dataset, to: Path, fetcher: Fetcher, force: bool) -> Outcome:
    """Fetch, convert and verify one dataset into ``to`` (the steps of the module docstring)."""
    outcome = Outcome(dataset.name, "converted")
    if dataset.withheld:
        outcome.remarks.append(f"withheld: {dataset.withheld}")
    if not force and outputs_present(dataset, to):
        outcome.status = "present"
        return outcome
    originals = []
    for source in dataset.sources:
        path, transferred = fetcher.fetch(source, force)
        (outcome.fetched if transferred else outcome.reused).append(path)
        originals.append(path)
    with tempfile.TemporaryDirectory(prefix=f"{STAGING_PREFIX}{dataset.name}-", dir=to) as staging:
        stage = Path(staging)
        try:
            converted_remarks = dataset.convert(originals, stage)
        except OSError:
            raise  # writing the staging files under --to (a damaged archive is an OriginalError)
        except Exception as err:  # whatever these bytes make a converter raise fails this dataset only
            for path in originals:
                path.unlink(missing_ok=True)  # never converted from again: the next run fetches it afresh
            detail = str(err) if isinstance(err, ValueError) else f"{type(err).__name__}: {err}"
            deleted = (
                "the originals are deleted: rerun to fetch them"
                if len(originals) > 1
                else "the original is deleted: rerun to fetch it"
            )
            raise DownloadError(
                "conversion",
                f"converting {', '.join(_names(originals))}: {detail}; {deleted} again, and if it persists, "
                "the source serves a damaged file: put a good copy in a --mirror directory or report it",
            ) from None
        written = sorted(str(p.relative_to(stage)) for p in stage.rglob("*") if p.is_file())
        if written != sorted(dataset.outputs):
            raise DownloadError(
                "conversion",
                f"the converter wrote {', '.join(written) or 'nothing'}; the registry lists {', '.join(dataset.outputs)}",
            )
        for relative, digest in dataset.outputs.items():
            if digest:
                _check_digest(
                    stage / relative,
                    digest,
                    f"the converted {relative}",
                    "the converted file is not kept. Rerun with --force to fetch the originals again (a "
                    "damaged transfer); if it persists, the source has changed since the registry was "
                    "written: use an existing copy of the data or report it",
                )
        outcome.remarks += converted_remarks
        if not all(dataset.outputs.values()):
            # Converted files no digest vouches for are named by their original's digest: one however
            # many files it became, and comparable with any other copy of it (a gzip's or tar's bytes
            # may differ with the zlib or Python that wrote them).
            for source, path, name in zip(dataset.sources, originals, _names(originals)):
                if source.sha256 is None:
                    outcome.remarks.append(f"{name}: sha256 {file_sha256(path)} (not pinned)")
        for relative in dataset.outputs:
            (to / relative).parent.mkdir(parents=True, exist_ok=True)
            os.replace(stage / relative, to / relative)
    return outcome


def download_datasets(
    datasets: list[Dataset],
    to: str | Path,
    mirror: str | None = None,
    force: bool = False,
    show_progress: bool = True,
    timeout: float = FILE_TIMEOUT_S,
) -> list[Outcome]:
    """Obtain each dataset into the data directory ``to``; one :class:`Outcome` each, in order.
    ``timeout``: the seconds one file's HTTP transfer may take."""
    to = check_output_dir(to, "--to")
    if mirror is not None and not mirror.strip():  # Path("") would be the working directory
        raise ValueError(
            "--mirror '': empty; name a directory or an http(s) URL holding the originals, or leave it out"
        )
    if mirror is not None and urlsplit(mirror).scheme not in ("http", "https") and not Path(mirror).is_dir():
        raise ValueError(f"--mirror {mirror[:200]}: neither an http(s) URL nor an existing directory")
    if not timeout > 0:
        raise ValueError(f"--timeout {timeout:g}: must be a positive number of seconds")
    try:
        to.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"--to {to}: cannot create the data directory ({err.strerror})") from None
    lock = FolderLock(
        to / LOCK_FILE,
        lambda owner: (
            f"--to {to}: another data download is writing there ({owner}); wait for it to end or stop it, "
            "or pass another --to (the lock is released when that process exits)"
        ),
    )
    with lock:
        _remove_stale_staging(to)
        return _download_all(datasets, to, mirror, force, show_progress, timeout)


def _remove_stale_staging(to: Path) -> None:
    """Remove the staging folders of conversions killed where no cleanup could run (SIGKILL, a
    lost node), converted files in them: with the lock held, no other download converts into ``to``."""
    stale = sorted(path for path in to.glob(f"{STAGING_PREFIX}*") if path.is_dir())
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    if stale:
        logger.info(
            "removed %d staging folders left by interrupted `data download` runs: %s",
            len(stale),
            ", ".join(str(path) for path in stale),
        )


def _download_all(
    datasets: list[Dataset], to: Path, mirror: str | None, force: bool, show_progress: bool, timeout: float
) -> list[Outcome]:
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
        disable=not show_progress,
    )
    outcomes = []
    with progress:
        fetcher = Fetcher(to / DOWNLOADS, mirror, progress, timeout)
        logger.info("%s", transfer_plan(datasets, to, fetcher, force))
        overall = progress.add_task("datasets", total=len(datasets))
        for dataset in datasets:
            try:
                outcome = obtain(dataset, to, fetcher, force)
            except DownloadError as err:
                outcome = Outcome(dataset.name, "failed", reason=f"{err.kind}: {err}")
            except OSError as err:  # writing under --to: a full or read-only disk
                outcome = Outcome(dataset.name, "failed", reason=f"filesystem: {err}")
            logger.info("%s: %s%s", dataset.name, outcome.status, f" ({outcome.reason})" if outcome.reason else "")
            outcomes.append(outcome)
            progress.advance(overall)
    return outcomes


def transfer_plan(datasets: list[Dataset], to: Path, fetcher: Fetcher, force: bool) -> str:
    """One line said before anything is fetched: how many datasets are present, how many files
    and megabytes the others need (their sizes asked of the mirror or the sources, a HEAD request
    each, several at a time) and the rough time that takes at :data:`PLAN_RATE_MB_S`."""
    needed = [dataset for dataset in datasets if force or not outputs_present(dataset, to)]
    present = len(datasets) - len(needed)
    if not needed:
        return (
            f"{'the dataset is' if present == 1 else f'all {present} datasets are'} present in {to}: nothing to fetch"
        )
    sources = list({source.url: source for dataset in needed for source in dataset.sources}.values())
    with ThreadPoolExecutor(max_workers=8) as pool:  # HEAD requests wait on the network, not the CPU
        sizes = list(pool.map(lambda source: fetcher.bytes_to_fetch(source, force), sources))
    known = [size for size in sizes if size is not None]
    unknown = len(sizes) - len(known)
    minutes = sum(known) / 1e6 / PLAN_RATE_MB_S / 60
    line = (
        f"{_count(len(needed), 'dataset')} to fetch and convert ({present} present): "
        f"{_count(len(sources), 'file')}, "
        f"{_size(sum(known))} to transfer from {fetcher.mirror or 'their sources'}"
    )
    if unknown:
        line += f" and {unknown} of unknown size"
    rough = "under a minute" if minutes < 1 else f"about {round(minutes)} min"
    return f"{line}; {rough} at {PLAN_RATE_MB_S:g} MB/s, then seconds to convert each"


def summary_table(outcomes: list[Outcome]) -> Table:
    table = Table(title="data download")
    for column in ("dataset", "result", "fetched", "already here", "reason / remarks"):
        table.add_column(column)
    for outcome in outcomes:
        table.add_row(
            outcome.name,
            outcome.status,
            _files(outcome.fetched),
            _files(outcome.reused),
            "; ".join(([outcome.reason] if outcome.reason else []) + outcome.remarks) or "-",
        )
    counts = {status: sum(o.status == status for o in outcomes) for status in ("converted", "present", "failed")}
    table.caption = ", ".join(f"{count} {status}" for status, count in counts.items())
    return table


def _files(paths: list[Path]) -> str:
    if not paths:
        return "-"
    size = sum(path.stat().st_size for path in paths)
    return f"{_count(len(paths), 'file')}, {_size(size)}"


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _size(size: int) -> str:
    """Megabytes, or kilobytes below a tenth of one (a test's files, a small evaluation set)."""
    return f"{size / 1e6:.1f} MB" if size >= 100_000 else f"{size / 1e3:.1f} kB"


def _source_summary(dataset: Dataset) -> str:
    """The source URL, or the folder URL the sources share and their count."""
    urls = [source.url for source in dataset.sources]
    if len(urls) == 1:
        return urls[0]
    shared = os.path.commonprefix(urls)
    return f"{shared[: shared.rfind('/') + 1]} ({len(urls)} files)"


def registry_table(datasets: list[Dataset]) -> Table:
    """What ``data download --list`` shows: each dataset's files, source and licence."""
    table = Table(title="dataset registry")
    for column in ("dataset", "files", "source", "licence"):
        table.add_column(column)
    for dataset in datasets:
        table.add_row(dataset.name, "\n".join(dataset.outputs), _source_summary(dataset), dataset.licence)
    return table


def registry_markdown(datasets: list[Dataset]) -> str:
    """The registry as docs/data.md's Markdown table (``data download --list --markdown``): a row
    per converted file with its sha256 ("not pinned" where the registry pins none)."""
    lines = ["| dataset | file | sha256 | source | licence |", "|---|---|---|---|---|"]
    for dataset in datasets:
        source = _source_summary(dataset)
        for index, (relative, digest) in enumerate(dataset.outputs.items()):
            first = index == 0
            lines.append(
                f"| {dataset.name if first else ''} | `{relative}` | {f'`{digest}`' if digest else 'not pinned'} "
                f"| {source if first else ''} | {dataset.licence if first else ''} |"
            )
    return "\n".join(lines) + "\n"

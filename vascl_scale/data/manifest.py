"""The shard manifest: ``manifest.json`` beside a set of shards, written by ``data prepare`` and
``data mine`` (:class:`Manifest`) and read by the loader (:func:`read_manifest`).

It records the columns of the samples (``["anchor"]`` for single text), the sample fields
written, the token ids stored (tokenizer fingerprint and truncation length, or null), how
many input lines were read and how many rows were dropped for each reason, the inputs and the
options, and every shard's file name, sample count, sha256 and byte size. ``data mine`` adds
its pool, the model that mined and the mining figures. Readers take only plain file names from
it, resolved inside the manifest's directory: a manifest can never name a ``pipe:`` command or
a path elsewhere.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from vascl_scale.data.columns import written_fields

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "vascl-scale-shards"
MANIFEST_VERSION = 1
_SHA256 = re.compile(r"[0-9a-f]{64}")
_WHERE_THEY_APPLY = ("rows_read", "negative_lines", "pool", "miner", "summary")  # left out when None


@dataclass(frozen=True)
class Manifest:
    """What ``manifest.json`` holds about the shard set beside it.

    ``shards``: per shard ``{"name", "samples", "sha256", "bytes"}``. ``rows_read`` (with
    ``--labelled-pairs``: two rows per triplet) and ``negative_lines`` (NLI JSONL inputs) are
    written only where they apply; so are ``pool``, ``miner`` and ``summary`` (``data mine``).
    """

    columns: tuple[str, ...]
    shards: list[dict]
    lines_read: int
    dropped: dict[str, int]
    sources: list[dict]
    options: dict
    token_ids: dict | None = None
    rows_read: int | None = None
    negative_lines: int | None = None
    pool: dict | None = None
    miner: dict | None = None
    summary: dict | None = None

    @property
    def total_samples(self) -> int:
        return sum(shard["samples"] for shard in self.shards)

    @property
    def fields(self) -> list[str]:
        """The sample fields written for the columns (token id fields only where ids are stored)."""
        pairs = written_fields(self.columns)
        return [
            name for pair in pairs for name in (pair if self.token_ids is not None else pair[:1]) if name is not None
        ]

    def to_json(self) -> dict:
        document = {
            "format": MANIFEST_FORMAT,
            "version": MANIFEST_VERSION,
            "columns": list(self.columns),
            "fields": self.fields,
            "token_ids": self.token_ids,
            "total_samples": self.total_samples,
            "lines_read": self.lines_read,
            "rows_read": self.rows_read,
            "dropped": self.dropped,
            "negative_lines": self.negative_lines,
            "sources": self.sources,
            "pool": self.pool,
            "options": self.options,
            "miner": self.miner,
            "summary": self.summary,
            "shards": self.shards,
        }
        return {key: value for key, value in document.items() if value is not None or key not in _WHERE_THEY_APPLY}

    def write(self, directory: Path) -> None:
        """Write ``manifest.json`` into ``directory`` (a staging directory: the set's writer
        moves it in last, :func:`vascl_scale.data.shard_writer.write_shard_set`)."""
        text = json.dumps(self.to_json(), indent=2) + "\n"
        (Path(directory) / MANIFEST_NAME).write_text(text, encoding="utf-8")


def read_manifest(directory: Path) -> dict:
    """The manifest in ``directory`` as a dict, checked: our format, and every shard entry a
    plain file name with a valid sample count, sha256 and size; else ``ValueError``."""
    path = directory / MANIFEST_NAME
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"cannot read the shard manifest {path}: {err}") from err
    if manifest.get("format") != MANIFEST_FORMAT or not isinstance(manifest.get("shards"), list):
        raise ValueError(f"{path} is not a vascl-scale shard manifest; write shards with `vascl-scale data prepare`")
    for shard in manifest["shards"]:
        name = shard.get("name")
        # Only plain file names: a manifest must never smuggle a pipe: command or another path.
        if not isinstance(name, str) or "/" in name or "\\" in name or ":" in name or name in ("", ".", ".."):
            raise ValueError(f"{path}: shard name {name!r} is not a plain file name")
        samples, sha256, size = shard.get("samples"), shard.get("sha256"), shard.get("bytes")
        for key, value, valid in (
            ("samples", samples, isinstance(samples, int) and samples >= 0),
            ("sha256", sha256, sha256 is None or isinstance(sha256, str) and _SHA256.fullmatch(sha256)),
            ("bytes", size, size is None or isinstance(size, int) and size >= 0),
        ):
            if not valid:
                raise ValueError(
                    f"{path}: shard {name} has {key} {value!r} (expected "
                    f"{'64 hex digits' if key == 'sha256' else 'an integer >= 0'}); write the shards again "
                    "with `vascl-scale data prepare`"
                )
    return manifest

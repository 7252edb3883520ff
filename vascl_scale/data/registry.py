"""The dataset registry: where each dataset comes from and what its converted files must hash to.

``registry.toml`` (beside this module) names, per dataset: its family (the folder of the data
directory it fills), optionally a group (sets fetched together by one name, as NanoBEIR's 13),
the original files (URL and, where pinned, the sha256 of the original), their format, the
converter that turns them into the layout ``eval`` and the demo read, the licence as the source
states it, and the sha256 of every converted file. A converted file's digest is the one of the
copy the evaluator's published figures were measured on wherever the converter reproduces it
byte for byte; ``checked`` says how each converter was checked.
"""

from __future__ import annotations

import importlib.resources
import typing
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import tomllib
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

FAMILIES = ("corpus", "sts", "sts_senteval", "clustering", "intent", "retrieval")
Family = Literal["corpus", "sts", "sts_senteval", "clustering", "intent", "retrieval"]
assert typing.get_args(Family) == FAMILIES


def check_sha256(digest: str, what: str) -> str:
    if len(digest) != 64 or digest.strip("0123456789abcdef"):
        raise ValueError(f"{what} {digest!r} is not 64 lower-case hex digits")
    return digest


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Source(_Strict):
    """One original file: its canonical URL and, where pinned, the sha256 of its bytes."""

    url: str
    sha256: str | None = None

    @field_validator("url")
    @classmethod
    def _absolute_url(cls, url: str) -> str:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc or not parts.path.strip("/"):
            raise ValueError(f"source url {url!r} must be an http(s) URL of a file")
        # The URL's path becomes a path under .downloads and the mirror: no way out of them.
        segments = parts.path.split("/")[1:]
        if any(segment in ("", ".", "..") for segment in segments) or "\\" in parts.path or parts.netloc in (".", ".."):
            raise ValueError(f"source url {url!r} must not hold empty, '.' or '..' path segments")
        return url

    @field_validator("sha256")
    @classmethod
    def _digest(cls, digest: str | None) -> str | None:
        return check_sha256(digest, "sha256") if digest is not None else None

    @property
    def mirror_path(self) -> str:
        """Where a mirror holds this file: the URL's host and path (the layout ``wget -x`` writes)."""
        parts = urlsplit(self.url)
        return f"{parts.netloc}{parts.path}"


class Dataset(_Strict):
    """One dataset of the registry; ``outputs`` maps each converted file (relative to the data
    directory) to its sha256, or to "" where no digest can be pinned (see ``checked``)."""

    name: str
    family: Family
    description: str
    licence: str
    format: str
    converter: str
    options: dict[str, Any] = Field(default_factory=dict)
    sources: list[Source] = Field(min_length=1)
    outputs: dict[str, str] = Field(min_length=1)
    checked: str
    # A name that selects this entry with its siblings (``data download nanobeir``), within a family.
    group: str = ""
    # Parts of the dataset no public source distributes (e.g. STS13's SMT subset).
    withheld: str = ""
    notes: str = ""

    @field_validator("outputs")
    @classmethod
    def _output_digests(cls, outputs: dict[str, str]) -> dict[str, str]:
        for path, digest in outputs.items():
            if not path or Path(path).is_absolute() or ".." in Path(path).parts:
                raise ValueError(f"output {path!r} must be a path inside the data directory")
            if digest:
                check_sha256(digest, f"output {path!r}: sha256")
        return outputs

    @field_validator("converter")
    @classmethod
    def _known_converter(cls, name: str) -> str:
        from vascl_scale.data.converters import CONVERTERS

        if name not in CONVERTERS:
            raise ValueError(f"converter {name!r} is not one of {', '.join(CONVERTERS)}")
        return name

    @model_validator(mode="after")
    def _outputs_in_family(self) -> Dataset:
        for path in self.outputs:
            if Path(path).parts[0] != self.family:
                raise ValueError(f"dataset {self.name}: output {path!r} must lie under {self.family}/")
        # Converters that map original files to outputs (files: name -> output) or outputs to
        # JSON lists (splits: output -> key) must name exactly these outputs.
        named = {
            "files": list(self.options.get("files", {}).values()),
            "splits": list(self.options.get("splits", {})),
        }
        for key, outputs in named.items():
            if key in self.options and sorted(outputs) != sorted(self.outputs):
                raise ValueError(
                    f"dataset {self.name}: options.{key} must map onto exactly the outputs {', '.join(self.outputs)}"
                )
        return self

    def convert(self, originals: list[Path], stage: Path) -> list[str]:
        """Run this entry's converter on local copies of its sources, writing under ``stage``; the
        converter's remarks for the download's summary (rows it dropped), if any."""
        from vascl_scale.data.converters import CONVERTERS

        return CONVERTERS[self.converter](originals, {**self.options, "outputs": list(self.outputs)}, stage) or []


class Registry(_Strict):
    datasets: tuple[Dataset, ...]

    def names(self) -> list[str]:
        return [dataset.name for dataset in self.datasets]

    def groups(self) -> list[str]:
        return list(dict.fromkeys(dataset.group for dataset in self.datasets if dataset.group))

    def select(self, requested: list[str]) -> list[Dataset]:
        """Datasets by name, by family (``sts``, ``clustering``...), by group (``nanobeir``) or
        ``all``, in registry order."""
        wanted = set(requested or ["all"])
        unknown = sorted(wanted - set(self.names()) - set(FAMILIES) - set(self.groups()) - {"all"})
        if unknown:
            groups = f", groups from {', '.join(self.groups())}" if self.groups() else ""
            raise ValueError(
                f"unknown dataset {unknown[0]!r}; choose names from {', '.join(self.names())}, "
                f"families from {', '.join(FAMILIES)}{groups}, or all"
            )
        return [
            d for d in self.datasets if "all" in wanted or d.name in wanted or d.family in wanted or d.group in wanted
        ]


def load_registry(path: str | Path | None = None) -> Registry:
    """The registry at ``path``, by default the one shipped with vascl-scale."""
    if path is None:
        text = (importlib.resources.files("vascl_scale.data") / "registry.toml").read_text(encoding="utf-8")
        where = "vascl_scale/data/registry.toml"
    else:
        text, where = Path(path).read_text(encoding="utf-8"), str(path)
    try:
        table = tomllib.loads(text)
        datasets = tuple(Dataset(name=name, **fields) for name, fields in table.get("datasets", {}).items())
        registry = Registry(datasets=datasets)
    except (tomllib.TOMLDecodeError, ValidationError, TypeError) as err:
        raise ValueError(f"dataset registry {where} is invalid: {err}") from None
    taken = {*registry.names(), *FAMILIES, "all"}
    clashes = [group for group in registry.groups() if group in taken]
    if clashes:
        raise ValueError(f"dataset registry {where}: group {clashes[0]!r} is also a dataset, a family or all")
    outputs = [path for dataset in registry.datasets for path in dataset.outputs]
    duplicated = sorted({path for path in outputs if outputs.count(path) > 1})
    if duplicated:
        raise ValueError(f"dataset registry {where}: {duplicated[0]} is written by two datasets")
    return registry

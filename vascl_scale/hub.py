"""Naming a model: a local directory, ``package:MODULE/SUBDIR``, or a Hugging Face hub id.

A hub id (``roberta-base``, ``sentence-transformers/all-MiniLM-L6-v2``) becomes a local
directory through huggingface_hub's snapshot cache, the cache transformers itself uses
(``HF_HOME`` / ``HF_HUB_CACHE``), so a model downloaded once by either is found by both and
``HF_HUB_OFFLINE=1`` works as it does for transformers. Only what loading needs is fetched
(config, tokenizer files and one weights format), not the TensorFlow, Flax or ONNX copies many
hub repositories also hold. Everything downstream then reads a plain directory.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from vascl_scale.log import shown

PACKAGE_PREFIX = "package:"
PACKAGE_FORM = (
    "a package: name is package:MODULE/SUBDIR, MODULE an installed package's dotted name, SUBDIR a folder inside it"
)
# A hub repository id: "name" or "owner/name" (letters, digits, "-", "_", ".").
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
_CONFIG_AND_TOKENIZER = ["*.json", "*.txt", "*.model", "*.tiktoken"]


@dataclass(frozen=True)
class ModelLocation:
    """Where a model reference points: the local ``directory`` and, for a hub id, the
    ``hub_id`` and the commit ``revision`` it resolved to."""

    directory: Path
    hub_id: str | None = None
    revision: str | None = None


def package_directory(value: str, key: str) -> Path:
    """``package:MODULE/SUBDIR``: a directory shipped inside an installed Python package.

    The path is resolved (``..``, symbolic links) and must stay inside the package's directory.
    """
    module, _, subdir = value[len(PACKAGE_PREFIX) :].partition("/")

    def refused(problem: str) -> ValueError:
        return ValueError(f"{key} = {shown(value)}: {problem}; {PACKAGE_FORM}")

    if not all(part.isidentifier() for part in module.split(".")):
        raise refused(f"{shown(module)} is not a package's dotted name")
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):  # a parent of a dotted name is missing; a module without a spec
        spec = None
    if spec is None:
        raise refused(f"Python package {module!r} is not installed")
    if spec.submodule_search_locations is None:  # Python 3.12's files() would take its folder
        raise refused(f"{module!r} is a module, not a package")
    root = Path(str(importlib.resources.files(module)))
    real_root, target = root.resolve(), (root / subdir).resolve()
    if not target.is_relative_to(real_root):
        raise refused(f"{shown(subdir)} leaves the package's directory {root}")
    return root / target.relative_to(real_root)


def looks_like_hub_id(value: str) -> bool:
    return bool(_HUB_ID.match(value)) and not value.startswith(".")


def locate_model(
    value: str, key: str = "model.path", revision: str | None = None, trust_remote_code: bool = False
) -> ModelLocation:
    """The directory a model reference names; a hub id is fetched into (or found in) the cache.

    ``revision`` (a branch, tag or commit) pins a hub id; the returned revision is always the
    commit the snapshot holds. A local path never looks at the hub, so a typo in a path and a
    hub id nobody can reach both end in one error naming both readings.
    """
    if value.startswith(PACKAGE_PREFIX):
        value = str(package_directory(value, key))
    path = Path(value).expanduser()
    if path.exists() or not looks_like_hub_id(value):
        if revision is not None:
            raise ValueError(f"{key} = {value!r} is a local path; model.revision applies to hub ids only: remove it")
        return ModelLocation(path)
    return ModelLocation(*_snapshot(value, key, revision, trust_remote_code))


def _snapshot(hub_id: str, key: str, revision: str | None, trust_remote_code: bool) -> tuple[Path, str, str]:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    code = ["*.py"] if trust_remote_code else []
    try:
        # One weights format: safetensors where the repository has it, else PyTorch .bin.
        directory = Path(
            snapshot_download(
                hub_id, revision=revision, allow_patterns=_CONFIG_AND_TOKENIZER + code + ["*.safetensors"]
            )
        )
        if not any(directory.glob("*.safetensors")):
            directory = Path(
                snapshot_download(hub_id, revision=revision, allow_patterns=_CONFIG_AND_TOKENIZER + code + ["*.bin"])
            )
    except (LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError, HfHubHTTPError, OSError) as err:
        pinned = f" --revision {revision}" if revision else ""
        raise ValueError(
            f"{key} = {hub_id!r} is not a local directory, and as a Hugging Face hub id it could not be "
            f"loaded ({type(err).__name__}: {str(err).splitlines()[0]}). Without network (or with "
            "HF_HUB_OFFLINE=1) a hub model must already be in the cache: on a machine with internet run "
            f"`hf download {hub_id}{pinned}` and copy the cache ($HF_HOME, default ~/.cache/huggingface), "
            f"or download the model to a directory and set {key} to that directory"
        ) from None
    # A snapshot lives in .../snapshots/<commit>: the commit pins what was loaded.
    return directory, hub_id, directory.name

"""Fixtures shared by several test modules; plain helpers live in tests/*_helpers.py, tests/tiny.py
and tests/gloo.py, which any test module imports (no test module imports another)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.train_helpers import (
    run_train,
    write_config,
    write_dev_tsv,
    write_labelled_pairs,
    write_texts,
    write_tiny_model,
    write_triplets,
)


@pytest.fixture(scope="session")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny model, training text, labelled pairs, triplets and an STS-B-style dev file, shared by all runs."""
    root = tmp_path_factory.mktemp("train")
    write_tiny_model(root / "model")
    write_texts(root / "train.txt")
    write_labelled_pairs(root)
    write_triplets(root)
    write_dev_tsv(root / "dev.tsv")
    return root


@pytest.fixture(scope="session")
def ddp_references(workspace: Path, tmp_path_factory: pytest.TempPathFactory):
    """``reference(objective, chunk_size)``: 4 steps with 2 processes under DDP, run on first
    use, the reference the other engines must reproduce (uncached, or cached in chunks)."""
    runs: dict[tuple[str, int], Path] = {}

    def reference(objective: str, chunk_size: int = 0) -> Path:
        if (objective, chunk_size) not in runs:
            root = tmp_path_factory.mktemp(f"ddp-{objective}-chunk-{chunk_size}")
            config = write_config(workspace, root / "config.yaml", objective, train={"chunk_size": chunk_size})
            result = run_train(config, root / "run", "--num-processes", "2")
            if chunk_size:
                log = " ".join(result.stderr.split())
                assert f"cached step: 3 chunks of up to {chunk_size} sentences per view and device" in log
                # instead of n x 8: every view of the per-device batch (2 for VaSCL, more with hard negatives)
                assert f"activations of at most {chunk_size} sentences at a time instead of " in log
            runs[objective, chunk_size] = root / "run"
        return runs[objective, chunk_size]

    return reference


@pytest.fixture(scope="session")
def ddp_reference(ddp_references) -> Path:
    """The VaSCL run of :func:`ddp_references`."""
    return ddp_references("vascl")

"""``vascl-scale train --fsdp``: FSDP2 runs through the real CLI on 2 gloo ranks, stopped at step 2
and resumed, against the DDP runs of the same configs (tests/conftest.py's ``ddp_references``),
their exports, their checkpoints' checks, and the configurations refused before any worker starts."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch

from tests.train_helpers import (
    REPO,
    ZERO2,
    assert_no_unactionable_warnings,
    assert_same_weights,
    run_train,
    write_config,
)

FULL_SHARD = str(REPO / "configs" / "fsdp" / "full-shard.yaml")
SHARD_GRAD_OP = str(REPO / "configs" / "fsdp" / "shard-grad-op.yaml")
CACHED_CHUNK = 3  # as tests/test_train.py's cached runs: per-device batch 8 in chunks of 3, 3 and 2

# (objective, chunk size, FSDP2 file): the CI tier runs each objective once, uncached or cached
# (PairSupCon under shard_grad_op, whose export and checkpoint checks follow); the slow tier the
# other four. tests/test_fsdp.py runs all eight on launched gloo ranks in float64 every time.
CI_CASES = [
    ("simcse", 0, FULL_SHARD),
    ("simcse_sup", 0, FULL_SHARD),
    ("vascl", CACHED_CHUNK, FULL_SHARD),
    ("pairsupcon", CACHED_CHUNK, SHARD_GRAD_OP),
]
SLOW_CASES = [(o, CACHED_CHUNK if not c else 0, FULL_SHARD) for o, c, _ in CI_CASES]


def _case_id(objective: str, chunk_size: int, fsdp: str) -> str:
    return f"{objective}-{'cached' if chunk_size else 'uncached'}-{Path(fsdp).stem}"


CASES = [
    *(pytest.param(*case, id=_case_id(*case)) for case in CI_CASES),
    *(pytest.param(*case, id=_case_id(*case), marks=pytest.mark.slow) for case in SLOW_CASES),
]


@pytest.mark.e2e
@pytest.mark.parametrize("objective, chunk_size, fsdp", CASES)
def test_fsdp2_stopped_and_resumed_equals_ddp(
    workspace: Path, tmp_path: Path, ddp_references, objective: str, chunk_size: int, fsdp: str
) -> None:
    # The DDP reference encodes in 4 length buckets (train.length_buckets: auto under DDP); auto is 1
    # under full_shard, so the same 4 here, that both draw the same forwards.
    config = write_config(
        workspace, tmp_path / "config.yaml", objective, train={"chunk_size": chunk_size, "length_buckets": 4}
    )
    run, strategy = tmp_path / "run", Path(fsdp).stem.replace("-", "_")
    first = run_train(config, run, "--num-processes", "2", "--fsdp", fsdp, "--max-steps", "2", timeout=420)
    assert_no_unactionable_warnings(first)
    assert f"FSDP2 {strategy} over 2 ranks: 3 units (BertEmbeddings, BertLayer)" in first.stderr
    run_train(config, run, "--num-processes", "2", "--fsdp", fsdp, "--resume", timeout=300)
    checkpoint = run / "checkpoints" / "step-00000004"
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    assert state["engine"] == "fsdp" and {"fsdp/.metadata", "fsdp/__0_0.distcp", "fsdp/__1_0.distcp"} <= set(
        state["files"]
    )
    # FSDP2 reduce-scatters where DDP all-reduces: equal up to float32 rounding. The export is the
    # whole model (every tensor of DDP's, at its full shape), gathered from both ranks' shards.
    assert_same_weights(run, ddp_references(objective, chunk_size), atol=2e-6 if chunk_size else 1e-6)
    summary = json.loads((run / "run_summary.json").read_text())
    assert summary["engine"] == "fsdp" and summary["resumed_at_step"] == 2
    assert summary["fsdp"]["sharding_strategy"] == strategy
    if (objective, chunk_size, fsdp) == CI_CASES[-1]:  # once: they do not depend on the objective
        _assert_the_export_loads_everywhere(run / "final", strategy)
        _assert_a_tampered_metadata_is_refused(config, run, checkpoint, fsdp)


def _assert_the_export_loads_everywhere(final: Path, strategy: str) -> None:
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel

    from vascl_scale.model import SentenceEncoder

    assert json.loads((final / "config.json").read_text())["architectures"] == ["BertModel"]  # not FSDP2's class
    assert f"FSDP2 {strategy}, 2 processes" in (final / "README.md").read_text()
    texts = ["the cat runs quickly", "a big green house by the river"]
    ours = SentenceEncoder.from_pretrained(str(final)).encode(texts, batch_size=2, max_length=32)
    theirs = SentenceTransformer(str(final), device="cpu").encode(texts, convert_to_numpy=True)
    assert torch.allclose(torch.as_tensor(ours), torch.as_tensor(theirs), atol=1e-5)
    AutoModel.from_pretrained(str(final))


def _assert_a_tampered_metadata_is_refused(config: Path, run: Path, checkpoint: Path, fsdp: str) -> None:
    """A DCP .metadata naming a global outside DCP's types, its file list rewritten to match: refused
    before DCP unpickles it."""
    metadata_file = checkpoint / "fsdp" / ".metadata"
    metadata = pickle.loads(metadata_file.read_bytes())
    metadata.planner_data = {"payload": __import__("collections").Counter()}
    metadata_file.write_bytes(pickle.dumps(metadata))
    state_file = checkpoint / "trainer_state.json"
    state = json.loads(state_file.read_text())
    state["files"] = {name: (checkpoint / name).stat().st_size for name in state["files"]}
    state_file.write_text(json.dumps(state))
    failure = run_train(config, run, "--num-processes", "2", "--fsdp", fsdp, "--resume", "--max-steps", "6", expect=1)
    message = " ".join(failure.stderr.split())
    assert ".metadata cannot be loaded safely (UnpicklingError: a DCP .metadata may not name collections.Counter)" in (
        message
    ), message[-3000:]


@pytest.mark.e2e
def test_bad_engine_choices_are_refused_before_any_worker_starts(
    workspace: Path, tmp_path: Path, ddp_references
) -> None:
    config = write_config(workspace, tmp_path / "config.yaml")
    unknown = tmp_path / "zero3.yaml"
    unknown.write_text("sharding_strategy: zero3\n", encoding="utf-8")
    refusals = {
        "unknown strategy": (
            ["--fsdp", str(unknown)],
            f"--fsdp {unknown}: sharding_strategy must be one of 'full_shard', 'shard_grad_op', 'hybrid_shard'; got 'zero3'",
        ),
        "two engines": (["--fsdp", FULL_SHARD, "--deepspeed", ZERO2], "name two engines; pass one of them"),
        # A DDP run's checkpoint: its layout is accelerate's, not DCP's.
        "another engine's checkpoint": (
            [
                "--fsdp",
                FULL_SHARD,
                "--resume-from",
                str(ddp_references("vascl", CACHED_CHUNK) / "checkpoints" / "step-00000002"),
            ],
            "it was written by the DDP engine and this run uses FSDP2; their checkpoints differ in layout, "
            "so resume with the engine that wrote it (neither --deepspeed nor --fsdp)",
        ),
    }
    for case, (options, message) in refusals.items():
        failure = run_train(config, tmp_path / case.replace(" ", "-"), "--num-processes", "2", *options, expect=2)
        text = " ".join(failure.stderr.split())
        assert message in text, f"{case}: {text[-2000:]}"
        assert "rank 0" not in text and "Traceback" not in text, f"{case}: a worker started"

"""Checkpoints that are hostile, damaged, inconsistent or cannot be written: a DCP ``.metadata``
whose pickle names a dotted global is refused before anything runs; a ``.distcp`` changed in place,
a ``trainer_state.json`` whose world size disagrees with the ranks' data positions, and a resume
with nothing to resume are one line each; a full disk during a save or a resume says so, keeps the
previous checkpoint, and leaves no partial one behind.

The hostile pickles call ``os.mkdir`` / ``os.system`` on a marker path: the test asserts that the
marker never appears (the same pickle under plain ``pickle.loads`` makes it)."""

from __future__ import annotations

import errno
import json
import os
import pickle
import re
import shutil
import tempfile
import warnings
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tests.train_helpers import REPO, run_train, write_config
from vascl_scale import fs
from vascl_scale.cli import app
from vascl_scale.config import load_config, save_config
from vascl_scale.train import checkpoint as checkpoints
from vascl_scale.train.checkpoint import STATE_FILE, TrainerState, read_dcp_metadata, verify_checkpoint_files

FULL_SHARD = str(REPO / "configs" / "fsdp" / "full-shard.yaml")
KILL_POINTS = REPO / "tests" / "kill_points"  # its sitecustomize also fails a named write with ENOSPC
METADATA_MODULE = "torch.distributed.checkpoint.metadata"
DEEP = os.environ.get("HYPOTHESIS_PROFILE", "ci") == "deep"  # tests/test_properties.py's profiles


def _text(value: str) -> bytes:
    """A pickle SHORT_BINUNICODE / BINUNICODE pushing ``value``."""
    data = value.encode()
    return (b"\x8c" + bytes([len(data)]) if len(data) < 256 else b"X" + len(data).to_bytes(4, "little")) + data


def call_pickle(module: str, name: str, argument: str) -> bytes:
    """Protocol 4: ``STACK_GLOBAL(module, name)(argument)``, in one frame; the issue's 87 bytes for
    ``torch.distributed.checkpoint.metadata``, ``os.system`` and a 20-character command."""
    body = _text(module) + _text(name) + b"\x93" + _text(argument) + b"\x85R."
    return b"\x80\x04\x95" + len(body).to_bytes(8, "little") + body


def _with_metadata(directory: Path, data: bytes) -> Path:
    """A checkpoint directory whose only file is ``fsdp/.metadata`` holding ``data``."""
    (directory / "fsdp").mkdir(parents=True, exist_ok=True)
    (directory / "fsdp" / ".metadata").write_bytes(data)
    return directory


def _marker_call(marker: Path, module: str, name: str) -> bytes:
    argument = f"touch {marker}" if name.endswith("system") else str(marker)
    return call_pickle(module, name, argument)


# (module, name) pairs that resolve to code through a module an allowed global lives in: the
# dotted names protocol 4 resolves by attribute access, and whole modules.
HOSTILE = [
    (METADATA_MODULE, "os.system"),
    (METADATA_MODULE, "os.mkdir"),
    (METADATA_MODULE, "os.path.join"),
    (METADATA_MODULE, "torch.os.mkdir"),
    (METADATA_MODULE, "Metadata.__init__.__globals__"),
    (METADATA_MODULE, "os"),
    (METADATA_MODULE, "torch"),
    ("torch", "os.mkdir"),
    ("torch.serialization", "os.mkdir"),
    ("torch.distributed.checkpoint.filesystem", "os.mkdir"),
    ("pathlib", "os.mkdir"),
    ("collections", "OrderedDict.__init__"),
    ("os", "mkdir"),
    ("builtins", "exec"),
]


def test_the_issues_87_byte_pickle_runs_under_plain_pickle(tmp_path: Path) -> None:
    """The payload the refusals below meet is live: unrestricted, it runs its command."""
    marker = tmp_path / "pwned-by-87-bytes.txt"
    assert len(call_pickle(METADATA_MODULE, "os.system", "touch /tmp/pwned-xyz")) == 87
    pickle.loads(_marker_call(marker, METADATA_MODULE, "os.system"))
    assert marker.exists()


@pytest.mark.parametrize("module,name", HOSTILE, ids=[f"{m}:{n}" for m, n in HOSTILE])
def test_a_metadata_naming_a_dotted_or_foreign_global_is_refused_without_running_it(
    tmp_path: Path, module: str, name: str
) -> None:
    marker = tmp_path / "marker"
    checkpoint = _with_metadata(tmp_path / "run" / "checkpoints" / "step-00000002", _marker_call(marker, module, name))
    refusal = re.escape(f"a DCP .metadata may not name {module}.{name})")
    with pytest.raises(ValueError, match=refusal) as refused:
        verify_checkpoint_files(checkpoint)
    assert f"refusing checkpoint {checkpoint}: {checkpoint / 'fsdp' / '.metadata'} cannot be loaded safely" in str(
        refused.value
    )
    assert not marker.exists()
    # Protocol 0's GLOBAL opcode names the same pair: refused the same way.
    (checkpoint / "fsdp" / ".metadata").write_bytes(f"c{module}\n{name}\n(V{marker}\ntR.".encode())
    with pytest.raises(ValueError, match=refusal):
        verify_checkpoint_files(checkpoint)
    assert not marker.exists()


def test_a_metadata_that_is_no_dcp_metadata_is_refused(tmp_path: Path) -> None:
    checkpoint = _with_metadata(tmp_path / "step-00000002", pickle.dumps(torch.Size([3, 4])))
    with pytest.raises(ValueError, match=r"\.metadata cannot be loaded safely \(UnpicklingError: it holds a Size"):
        verify_checkpoint_files(checkpoint)


# ---------------------------------------------------------------------------------------------
# A real FSDP2 checkpoint of the project, written once through the CLI (one process).


@pytest.fixture(scope="module")
def fsdp_run(workspace: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(config, run directory) of a 2-step FSDP2 run whose step-00000002 is its checkpoint."""
    root = tmp_path_factory.mktemp("fsdp-run")
    config = write_config(workspace, root / "config.yaml")
    run_train(config, root / "run", "--fsdp", FULL_SHARD, "--max-steps", "2", timeout=300)
    return config, root / "run"


def _copy_of(fsdp_run: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path, Path]:
    """(config, run, its checkpoint) of a copy of the fixture's run, to damage."""
    config, run = fsdp_run
    shutil.copytree(run, tmp_path / "run")
    return config, tmp_path / "run", tmp_path / "run" / "checkpoints" / "step-00000002"


def _resize_marker(checkpoint: Path) -> None:
    """Make trainer_state.json list the files' present sizes, so that the checkpoint counts as complete."""
    state = json.loads((checkpoint / STATE_FILE).read_text())
    state["files"] = {name: (checkpoint / name).stat().st_size for name in state["files"]}
    (checkpoint / STATE_FILE).write_text(json.dumps(state))


class _Recording(pickle.Unpickler):
    """An unrestricted unpickler that notes every global it resolves (for our own, trusted file)."""

    def __init__(self, file) -> None:
        super().__init__(file)
        self.named: set[tuple[str, str]] = set()

    def find_class(self, module: str, name: str):
        self.named.add((module, name))
        return super().find_class(module, name)


@pytest.mark.e2e
def test_the_allowlist_is_the_globals_a_real_fsdp2_checkpoint_names(fsdp_run) -> None:
    checkpoint = fsdp_run[1] / "checkpoints" / "step-00000002"
    with open(checkpoint / "fsdp" / ".metadata", "rb") as handle:
        recording = _Recording(handle)
        recording.load()
    assert recording.named <= checkpoints._DCP_GLOBALS
    # Every name the allowlist takes from DCP's metadata module is one a real checkpoint uses.
    assert {pair for pair in checkpoints._DCP_GLOBALS if pair[0] == METADATA_MODULE} == {
        pair for pair in recording.named if pair[0] == METADATA_MODULE
    }
    assert not any("." in name for _, name in checkpoints._DCP_GLOBALS)
    verify_checkpoint_files(checkpoint)  # the real one passes


@pytest.mark.e2e
def test_resume_from_a_checkpoint_with_a_hostile_metadata_refuses_without_running_it(fsdp_run, tmp_path: Path) -> None:
    config, run, checkpoint = _copy_of(fsdp_run, tmp_path)
    marker = tmp_path / "marker"
    (checkpoint / "fsdp" / ".metadata").write_bytes(_marker_call(marker, METADATA_MODULE, "os.system"))
    _resize_marker(checkpoint)
    failure = run_train(config, run, "--fsdp", FULL_SHARD, "--resume-from", str(checkpoint), expect=2)
    message = " ".join(failure.stderr.split())
    assert "Traceback" not in failure.stderr, failure.stderr[-3000:]
    assert f"may not name {METADATA_MODULE}.os.system)" in message, message[-3000:]
    assert not marker.exists()


@pytest.mark.e2e
def test_a_distcp_changed_in_place_is_one_line_on_resume(fsdp_run, tmp_path: Path) -> None:
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    config, run, checkpoint = _copy_of(fsdp_run, tmp_path)
    metadata = read_dcp_metadata(checkpoint / "fsdp" / ".metadata")
    tensor = next(
        where
        for index, where in metadata.storage_data.items()
        if isinstance(metadata.state_dict_metadata[index.fqn], TensorStorageMetadata)
    )
    shard = checkpoint / "fsdp" / tensor.relative_path
    data = bytearray(shard.read_bytes())
    data[tensor.offset : tensor.offset + 64] = bytes(byte ^ 0xFF for byte in data[tensor.offset : tensor.offset + 64])
    shard.write_bytes(bytes(data))  # the same size: the completeness check cannot see it
    failure = run_train(config, run, "--fsdp", FULL_SHARD, "--resume", expect=2)
    assert "Traceback" not in failure.stderr, failure.stderr[-3000:]
    errors = [line for line in failure.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, failure.stderr[-3000:]
    assert f"could not load checkpoint {checkpoint} (rank 0: " in errors[0]
    assert errors[0].endswith("no earlier complete checkpoint exists; start a new run with another --output")


# ---------------------------------------------------------------------------------------------
# A trainer_state.json that disagrees with the ranks' files; nothing to resume.


def _checkpoint_of(config_path: Path, run: Path, world_size: int, ranks: int) -> Path:
    """A complete-looking step-00000002 of ``run`` whose trainer_state says ``world_size``
    processes and which holds ``ranks`` data positions (what the resume check reads)."""
    checkpoint = run / "checkpoints" / "step-00000002"
    (checkpoint / "data").mkdir(parents=True)
    save_config(load_config(config_path), checkpoint / "config.yaml")
    for rank in range(ranks):
        torch.save({"position": rank}, checkpoints.data_state_path(checkpoint, rank))
    files = {str(p.relative_to(checkpoint)): p.stat().st_size for p in checkpoint.rglob("*") if p.is_file()}
    state = TrainerState(step=2, world_size=world_size, scheduler={}, files=files, engine="ddp")
    (checkpoint / STATE_FILE).write_text(state.to_json())
    return checkpoint


def test_a_trainer_state_edited_to_fewer_ranks_is_refused_naming_both(workspace: Path, tmp_path: Path) -> None:
    config = write_config(workspace, tmp_path / "config.yaml")
    checkpoint = _checkpoint_of(config, tmp_path / "run", world_size=1, ranks=2)
    result = CliRunner().invoke(
        app, ["train", "--config", str(config), "--output", str(tmp_path / "run"), "--resume-from", str(checkpoint)]
    )
    assert result.exit_code == 2, result.output
    assert (
        f"--resume {checkpoint}: its trainer_state.json says 1 processes wrote it, but it holds the data positions "
        "of 2 ranks (data/rank-00000.pt, data/rank-00001.pt)"
    ) in " ".join(result.output.split())


def test_resume_with_nothing_to_resume_says_how_to_start(workspace: Path, tmp_path: Path) -> None:
    config = write_config(workspace, tmp_path / "config.yaml")
    arguments = ["train", "--config", str(config), "--output", str(tmp_path / "run")]
    result = CliRunner().invoke(app, [*arguments, "--resume"])
    assert result.exit_code == 2, result.output
    assert "so there is nothing to resume; to start the run from step 0, run without --resume" in " ".join(
        result.output.split()
    )
    # Only incomplete checkpoints: a plain run would refuse them, so the hint names them.
    _checkpoint_of(config, tmp_path / "run", world_size=1, ranks=1)
    (tmp_path / "run" / "checkpoints" / "step-00000002" / "config.yaml").unlink()
    result = CliRunner().invoke(app, [*arguments, "--resume"])
    assert result.exit_code == 2, result.output
    assert (
        "to start the run from step 0, remove its incomplete step-00000002 (or pass another --output) "
        "and run without --resume"
    ) in " ".join(result.output.split())


# ---------------------------------------------------------------------------------------------
# A full disk.


def test_a_full_disk_is_recognised_with_or_without_an_errno(tmp_path: Path, monkeypatch) -> None:
    from torch.distributed.checkpoint.api import CheckpointException, _wrap_exception

    enospc = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert fs.full_disk(enospc, tmp_path).startswith("the disk is full (no space left on device): ")
    assert fs.full_disk(OSError(errno.EDQUOT, "quota"), tmp_path).startswith("the disk quota is used up: ")
    wrapped = CheckpointException("write", {1: _wrap_exception(enospc)})  # DCP: each rank's error inside
    assert fs.full_disk(wrapped, tmp_path) is not None
    # torch.save's own writer fails without an errno; the file system it wrote to is then full.
    torn = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 3916224 vs 3916112")
    assert fs.full_disk(torn, tmp_path) is None  # this file system has room: another failure
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(fs.shutil, "disk_usage", lambda path: usage._replace(free=4096))
    assert fs.full_disk(torn, tmp_path / "not" / "made" / "yet") == (
        f"the disk is full (no space left on device): 0.0 MiB free on the file system of {tmp_path}/not/made/yet"
    )
    assert fs.full_disk(KeyboardInterrupt(), tmp_path) is None  # a stop is never a full disk


class _Accelerator:
    """What save_checkpoint needs of an Accelerator: one process whose model file is written by
    torch.save, which fails at ``failing_step`` as its writer does on a full disk (no errno)."""

    is_main_process = True
    process_index = 0

    def __init__(self, failing_step: int) -> None:
        self.failing_step = failing_step

    def wait_for_everyone(self) -> None:
        pass

    def save_state(self, directory: str) -> None:
        torch.save({"weight": torch.arange(64.0)}, Path(directory) / "pytorch_model.bin")
        if Path(directory).name.endswith(f"{self.failing_step:08d}"):
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 3916224 vs 3916112")


def test_a_save_that_fills_the_disk_removes_its_staging_and_keeps_the_last_checkpoint(
    tmp_path: Path, monkeypatch
) -> None:
    from vascl_scale.config import config_from_dict

    config = config_from_dict({"model": {"path": "m"}, "data": {"train": "t"}, "train": {"global_batch_size": 64}})
    run, accelerator = tmp_path / "run", _Accelerator(failing_step=4)

    def save(step: int):
        state = TrainerState(step=step, world_size=1, scheduler={})
        return checkpoints.save_checkpoint(accelerator, run, config, state, {"epoch": 0}, keep_last=2)

    kept = save(2)
    with pytest.raises(RuntimeError, match="unexpected pos"):  # the file system has room: not a full disk
        save(4)
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(fs.shutil, "disk_usage", lambda path: usage._replace(free=0))
    with pytest.raises(ValueError) as full:
        save(4)
    assert str(full.value).startswith(
        f"checkpoint {run / 'checkpoints' / 'step-00000004'} not saved: the disk is full (no space left on device): "
        f"0.0 MiB free on the file system of {run / 'checkpoints'}; the last complete checkpoint, {kept}, is intact. "
        "Free space there (while it saves, the run needs room for checkpoint.keep_last + 1 = 3 checkpoints of "
    )
    assert str(full.value).endswith(" MiB) or lower checkpoint.keep_last, then continue from it with --resume")
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-00000002"]
    assert checkpoints.complete_checkpoints(run) == [kept]


def _failing_write(path_regex: str) -> dict[str, str]:
    """The environment that makes every write whose path matches ``path_regex`` fail with ENOSPC."""
    spec = {"call": "open", "path": path_regex, "fail": "ENOSPC"}
    return {"PYTHONPATH": f"{KILL_POINTS}{os.pathsep}{REPO}", "VASCL_TEST_PAUSE": json.dumps(spec)}


@pytest.mark.e2e
def test_a_full_disk_stops_a_save_and_a_resume_in_one_line_and_keeps_the_last_checkpoint(
    workspace: Path, tmp_path: Path
) -> None:
    config, run = write_config(workspace, tmp_path / "config.yaml"), tmp_path / "run"
    checkpoints_dir = run / "checkpoints"
    # FSDP2: DCP writes each rank's shard file and reports the rank's OSError in a CheckpointException.
    failure = run_train(
        config, run, "--fsdp", FULL_SHARD, expect=2, env=_failing_write(r"/\.tmp-step-00000004/fsdp/__0_0\.distcp$")
    )
    assert "Traceback" not in failure.stderr, failure.stderr[-3000:]
    message = " ".join(failure.stderr.split())
    assert (
        f"ERROR checkpoint {checkpoints_dir / 'step-00000004'} not saved: the disk is full (no space left on device): "
        in message
    ), message[-3000:]
    assert (
        f"the last complete checkpoint, {checkpoints_dir / 'step-00000002'}, is intact. Free space there (while it "
        "saves, the run needs room for checkpoint.keep_last + 1 = 3 checkpoints of "
    ) in message
    assert sorted(p.name for p in checkpoints_dir.iterdir()) == ["step-00000002"]  # the partial one removed
    # --resume on the full disk: the launcher's plan.json is its first write.
    failure = run_train(
        config, run, "--fsdp", FULL_SHARD, "--resume", expect=2, env=_failing_write(r"/\.tmp-plan\.json$")
    )
    assert "Traceback" not in failure.stderr, failure.stderr[-3000:]
    assert f"ERROR could not write {run / 'plan.json'}: the disk is full (no space left on device): " in (
        " ".join(failure.stderr.split())
    )
    resumed = run_train(config, run, "--fsdp", FULL_SHARD, "--resume")  # space freed
    assert f"resumed from {checkpoints_dir / 'step-00000002'} at step 2" in " ".join(resumed.stderr.split())


# ---------------------------------------------------------------------------------------------
# Property: whatever a .metadata holds, the unpickler loads allowed types or refuses; nothing runs.

MARKER = "marker-made-by-a-pickle"  # relative: the hostile calls would make it in the working directory
OPCODES = [
    b")",  # EMPTY_TUPLE
    b"\x85",  # TUPLE1
    b"\x86",  # TUPLE2
    b"R",  # REDUCE: call
    b"b",  # BUILD: __setstate__ / __dict__.update
    b"\x81",  # NEWOBJ
    b"}",  # EMPTY_DICT
    b"]",  # EMPTY_LIST
    b"a",  # APPEND
    b"s",  # SETITEM
    b"(",  # MARK
    b"t",  # TUPLE
    b"\x94",  # MEMOIZE
    b"h\x00",  # BINGET 0
    b"0",  # POP
    b"2",  # DUP
    b"N",  # NONE
    b"K\x01",  # BININT1 1
]


@st.composite
def metadata_pickles(draw, real: bytes) -> bytes:
    """The real .metadata, mutated (bytes flipped, a hostile call spliced in), or a protocol-4
    program of globals (allowed and hostile), strings (the marker) and stack opcodes."""
    kind = draw(st.sampled_from(["program", "mutated", "spliced"]))
    if kind == "program":
        body = b""
        for _ in range(draw(st.integers(1, 12))):
            choice = draw(st.integers(0, 3))
            if choice == 0:
                module, name = draw(st.sampled_from(sorted(checkpoints._DCP_GLOBALS)) | st.sampled_from(HOSTILE))
                body += _text(module) + _text(name) + b"\x93"
            elif choice == 1:
                body += _text(draw(st.sampled_from([MARKER, f"touch {MARKER}", "float32", ""])))
            else:
                body += draw(st.sampled_from(OPCODES))
        return b"\x80\x04" + body + b"."
    data = bytearray(real)
    if kind == "mutated":
        for _ in range(draw(st.integers(1, 4))):
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        return bytes(data)
    module, name = draw(st.sampled_from(HOSTILE))
    argument = f"touch {MARKER}" if name.endswith("system") else MARKER
    call = _text(module) + _text(name) + b"\x93" + _text(argument) + b"\x85R0"  # call, result popped
    at = draw(st.integers(2, len(data) - 1))
    return bytes(data[:at] + call + data[at:])


def _real_metadata() -> bytes:
    """A DCP .metadata as one process writes it (tensors and a plain-data entry)."""
    import torch.distributed.checkpoint as dcp

    with tempfile.TemporaryDirectory() as directory, warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled")  # one process: DCP says so
        dcp.save({"weight": torch.ones(3), "lr": 0.5, "step": torch.tensor(2)}, checkpoint_id=directory)
        return (Path(directory) / ".metadata").read_bytes()


REAL_METADATA = _real_metadata()


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
@settings(
    max_examples=300 * (10 if DEEP else 1),
    derandomize=not DEEP,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(metadata_pickles(REAL_METADATA))
@example(REAL_METADATA)
@example(call_pickle(METADATA_MODULE, "os.mkdir", MARKER))
def test_any_metadata_loads_allowed_types_or_is_refused_and_never_runs_code(data: bytes) -> None:
    from torch.distributed.checkpoint.metadata import Metadata

    with tempfile.TemporaryDirectory() as directory:
        checkpoint = _with_metadata(Path(directory) / "step-00000002", data)
        resolved: list[tuple[str, str]] = []
        find_class = checkpoints._DcpMetadataUnpickler.find_class

        def noting(self, module: str, name: str):
            found = find_class(self, module, name)
            resolved.append((module, name))
            return found

        with pytest.MonkeyPatch.context() as patch:
            patch.chdir(directory)  # where the hostile calls' relative MARKER would appear
            patch.setattr(checkpoints._DcpMetadataUnpickler, "find_class", noting)
            try:
                verify_checkpoint_files(checkpoint)
            except ValueError as err:
                assert str(err).startswith(f"refusing checkpoint {checkpoint}: "), err
            else:
                assert isinstance(read_dcp_metadata(checkpoint / "fsdp" / ".metadata"), Metadata)
        assert not (Path(directory) / MARKER).exists()
        assert set(resolved) <= checkpoints._DCP_GLOBALS


@pytest.mark.e2e
def test_a_full_disk_outside_checkpoints_stops_training_in_one_line(workspace: Path, tmp_path: Path) -> None:
    """The metrics, config.yaml and the exports are written by other libraries' writers: a full
    disk there is one line naming it and what to do, not a traceback."""
    config, run = write_config(workspace, tmp_path / "config.yaml"), tmp_path / "run"
    failure = run_train(config, run, expect=2, env=_failing_write(r"/metrics\.jsonl$"))
    assert "Traceback" not in failure.stderr, failure.stderr[-3000:]
    message = " ".join(failure.stderr.split())
    assert f"ERROR training in {run} stopped: the disk is full (no space left on device): " in message, message[-3000:]
    assert "free space there, then continue with --resume" in message

"""Data-layer defects found by probing its input surfaces: shards that differ from their manifest,
missing shard files, hung ``pipe:`` commands, and ``data prepare`` failing half-way or on a bad disk.
"""

from __future__ import annotations

import builtins
import errno
import fcntl
import json
import os
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.data_helpers import (
    assert_same_batches,
    captured_warnings,
    loader_stream,
    make_shards,
    minilm_tokenizer,
    sentences,
    shard_texts,
    stream_texts,
    take_batches,
    time_limit,
)
from tests.processes import group_alive
from vascl_scale.cli import app
from vascl_scale.data.layout import StreamLayout
from vascl_scale.data.loader import CorruptShardError
from vascl_scale.data.prepare import PrepareOptions, prepare_shards
from vascl_scale.data.shards import resolve_source, write_shard


@pytest.fixture(scope="module")
def tokenizer():
    return minilm_tokenizer()


def _rewrite(path: Path, texts: list[str]) -> None:
    """Replace a shard's sentences, keeping its keys and (for equal-length texts) its byte size."""
    size = path.stat().st_size
    write_shard(path, ((f"{index:012d}", {"txt": text.encode()}) for index, text in enumerate(texts)))
    assert path.stat().st_size == size


def test_shards_that_differ_from_the_manifest_are_counted_and_fail(tmp_path, tokenizer, caplog):
    shards = make_shards(tmp_path, sentences(48), shard_size=16)
    _rewrite(shards / "shard-000000.tar", sentences(16, start=80))  # same count, same size: only sha256 differs
    with open(shards / "shard-000001.tar", "ab") as handle:
        handle.write(bytes(1024))  # zeros after the end of the archive: a valid tar, 1024 bytes too long
    stream = loader_stream(shards, tokenizer, num_workers=0, shuffle_buffer=0)
    with captured_warnings(caplog):
        rows = stream_texts(stream, tokenizer, 13)  # 48 rows a pass: into the third, so the second one ended
    assert sorted(rows[:48]) == sorted(sentences(16, start=80) + sentences(32, start=16))  # samples kept (skip)
    assert stream.stats()["data_shards_mismatched"] == 4  # two bad shards in each of two passes
    assert stream.stats()["data_corrupt_shards_skipped"] == 0
    assert "sha256" in caplog.text and "bytes where the manifest lists" in caplog.text
    with pytest.raises(CorruptShardError, match="shard-00000[01].tar"):
        stream_texts(loader_stream(shards, tokenizer, num_workers=0, on_corrupt="fail"), tokenizer, 12)


def test_a_partly_read_or_resumed_shard_is_not_a_mismatch(tmp_path, tokenizer):
    shards = make_shards(tmp_path, sentences(64), shard_size=32)
    layout = StreamLayout(resolve_source(str(shards)), "exact", 5, 0, 1, 1, batch_size=8, shuffle_buffer=0)
    first = layout.rank_shards(0)[0]  # the shard epoch 0 reads first (seed 5, one rank, one worker)
    _rewrite(shards / f"shard-{first:06d}.tar", sentences(32, start=100))
    options = {"num_workers": 0, "shuffle_buffer": 0, "mode": "exact", "on_corrupt": "fail"}
    # 4 batches take all 32 samples but the stream never asks past them: the shard is not read to its end.
    assert len(take_batches(loader_stream(shards, tokenizer, **options), 4)) == 4
    with pytest.raises(CorruptShardError, match="sha256"):
        take_batches(loader_stream(shards, tokenizer, **options), 5)
    # Untouched shards: a stream resumed mid-shard with 2 workers reports nothing and stays exact.
    (tmp_path / "clean").mkdir()
    clean = make_shards(tmp_path / "clean", sentences(64), shard_size=16)  # 4 shards for 2 workers
    reference = take_batches(loader_stream(clean, tokenizer, mode="exact"), 12)
    cut = loader_stream(clean, tokenizer, mode="exact")
    take_batches(cut, 3)
    resumed = loader_stream(clean, tokenizer, mode="exact", on_corrupt="fail")
    resumed.load_state_dict(cut.state_dict())
    assert_same_batches(take_batches(resumed, 9), reference[3:])
    assert resumed.stats()["data_shards_mismatched"] == 0 == resumed.stats()["data_corrupt_shards_skipped"]


def test_missing_shard_files_are_missing_not_corrupt(tmp_path, tokenizer, caplog):
    shards = make_shards(tmp_path, sentences(48), shard_size=16)
    (shards / "shard-000001.tar").unlink()
    with pytest.raises(ValueError, match=r"1 of 3 shards .* missing .*shard-000001.tar.*on_corrupt"):
        loader_stream(shards, tokenizer, on_corrupt="fail")
    with captured_warnings(caplog):
        stream = loader_stream(shards, tokenizer, num_workers=0, shuffle_buffer=0)  # workers' logs reach caplog
        rows = stream_texts(stream, tokenizer, 8)  # 32 rows a pass: two passes
    assert sorted(rows[:32]) == sorted(rows[32:]) == sorted(sentences(16) + sentences(16, start=32))
    assert "missing shard" in caplog.text and "corrupt shard" not in caplog.text
    assert stream.stats()["data_shards_missing"] >= 1 and stream.stats()["data_corrupt_shards_skipped"] == 0
    for path in shards.glob("shard-*.tar"):
        path.unlink()
    with pytest.raises(ValueError, match="none of the 3 shards"):
        loader_stream(shards, tokenizer)


def test_manifest_entries_are_validated(tmp_path, tokenizer):
    shards = make_shards(tmp_path, sentences(16), shard_size=8)
    manifest = json.loads((shards / "manifest.json").read_text())
    for key, value in (("samples", "8"), ("sha256", 7), ("bytes", -1)):
        entry = dict(manifest["shards"][0], **{key: value})
        (shards / "manifest.json").write_text(json.dumps(dict(manifest, shards=[entry, manifest["shards"][1]])))
        with pytest.raises(ValueError, match=f"shard-000000.tar.*{key}"):
            loader_stream(shards, tokenizer)
    del manifest["shards"][0]["samples"]
    (shards / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="samples"):
        loader_stream(shards, tokenizer)


@pytest.mark.parametrize("hang", ["before", "after"])
def test_a_pipe_command_that_stops_producing_times_out(tmp_path, tokenizer, hang):
    shards = make_shards(tmp_path, sentences(16), shard_size=16)
    pid_file = tmp_path / "command.pid"
    cat = f"cat {shards}/shard-000000.tar"
    command = f"echo $$ > {pid_file}; " + (f"sleep 60; {cat}" if hang == "before" else f"{cat}; sleep 60")
    start = time.monotonic()
    with time_limit(30), pytest.raises(CorruptShardError, match=r"sleep 60.*1 s|1 s.*sleep 60"):
        # 3 batches of 8 from a 16-sample shard: the stream must read to the command's end.
        options = {"num_workers": 0, "allow_pipe": True, "on_corrupt": "skip", "pipe_timeout": 1}  # fatal even so
        stream = loader_stream(f"pipe:{command}", tokenizer, **options)
        stream_texts(stream, tokenizer, 3)
    assert time.monotonic() - start < 10
    deadline = time.monotonic() + 5
    while group_alive(int(pid_file.read_text())) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not group_alive(int(pid_file.read_text())), "the command's sleep outlived the timeout"
    with pytest.raises(ValueError, match="pipe_timeout"):
        loader_stream(f"pipe:{cat}", tokenizer, allow_pipe=True, pipe_timeout=0)


def _contents(output: Path) -> dict[str, bytes | None]:
    """Every entry of ``output`` with its bytes (None for a directory, e.g. a staging one left behind)."""
    return {path.name: path.read_bytes() if path.is_file() else None for path in output.iterdir()}


def _five_shard_set(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    (tmp_path / "good.txt").write_text("\n".join(sentences(10)) + "\n")
    output = tmp_path / "out"
    prepare_shards([tmp_path / "good.txt"], output, PrepareOptions(shard_size=2), show_progress=False)
    return output, _contents(output)


def test_overwrite_replaces_the_old_set_only_when_the_new_one_is_complete(tmp_path):
    output, before = _five_shard_set(tmp_path)
    bad = tmp_path / "bad.jsonl"
    lines = [json.dumps({"text": text}) for text in sentences(3, start=50)] + [json.dumps({"body": "x"})]
    bad.write_text("\n".join(lines) + "\n")  # line 4 lacks the text field
    with pytest.raises(ValueError, match="bad.jsonl:4"):
        prepare_shards([bad], output, PrepareOptions(shard_size=1), overwrite=True, show_progress=False)
    assert _contents(output) == before  # old shards and manifest untouched, nothing staged left behind
    (tmp_path / "new.txt").write_text("\n".join(sentences(3, start=70)) + "\n")
    options = PrepareOptions(shard_size=2, shuffle_seed=1)
    prepare_shards([tmp_path / "new.txt"], output, options, overwrite=True, show_progress=False)
    assert sorted(_contents(output)) == ["manifest.json", "shard-000000.tar", "shard-000001.tar"]
    assert sorted(shard_texts(output)) == sentences(3, start=70)


def test_staging_left_by_a_killed_prepare_is_removed_and_a_live_one_kept(tmp_path):
    output, before = _five_shard_set(tmp_path)
    killed = output / ".prepare-killed01"  # a prepare SIGKILLed mid-write: nobody holds its lock
    killed.mkdir()
    (killed / "shard-000000.tar").write_bytes(bytes(1 << 16))
    (output / ".prepare-killed01.lock").touch()
    unlocked = output / ".prepare-oldstyle"  # written before staging directories had locks
    unlocked.mkdir()
    (unlocked / "shard-000000.tar").write_bytes(bytes(512))
    live = output / ".prepare-running1"  # a concurrent prepare's, still at work
    live.mkdir()
    (live / "shard-000000.tar").write_bytes(bytes(512))
    with open(output / ".prepare-running1.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another open file: the prepare below sees it held
        arguments = [
            "data",
            "prepare",
            str(tmp_path / "good.txt"),
            "-o",
            str(output),
            "--shard-size",
            "2",
            "--overwrite",
        ]
        result = CliRunner().invoke(app, arguments)
    assert result.exit_code == 0, result.output
    assert not killed.exists() and not (output / ".prepare-killed01.lock").exists() and not unlocked.exists()
    assert live.is_dir() and (output / ".prepare-running1.lock").is_file()
    text = " ".join(result.output.split())
    assert f"removed 2 staging directories left by interrupted `data prepare` runs: {killed}, {unlocked}" in text
    assert {name: data for name, data in _contents(output).items() if "running1" not in name} == before


def _failing_open(monkeypatch, code: int, after_bytes: int) -> None:
    """Make shard files fail like a full (ENOSPC) or read-only (EROFS) disk after ``after_bytes``."""
    real_open = open

    class Failing:
        def __init__(self, path, mode):
            self._handle = real_open(path, mode)
            self.written = 0

        def write(self, data) -> int:
            if self.written + len(data) > after_bytes:
                raise OSError(code, os.strerror(code))
            self.written += len(data)
            return self._handle.write(data)

        def __getattr__(self, name):
            return getattr(self._handle, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc_info):
            self._handle.close()

    def fake_open(path, mode="r", *args, **kwargs):
        if "w" in str(mode) and Path(path).name.startswith("shard-"):
            if after_bytes == 0:
                raise OSError(code, os.strerror(code), str(path))
            return Failing(path, mode)
        return real_open(path, mode, *args, **kwargs)

    # The shard writer opens its files with the built-in open: the lowest level a test can reach.
    monkeypatch.setattr(builtins, "open", fake_open)


@pytest.mark.parametrize("code,after_bytes", [(errno.ENOSPC, 3000), (errno.EROFS, 0)])
def test_write_errors_name_the_path_and_leave_nothing_partial(tmp_path, monkeypatch, code, after_bytes):
    output, before = _five_shard_set(tmp_path)
    _failing_open(monkeypatch, code, after_bytes)
    with pytest.raises(ValueError, match=rf"{output}.*{os.strerror(code)}"):
        prepare_shards([tmp_path / "good.txt"], output, PrepareOptions(shard_size=4), True, show_progress=False)
    assert _contents(output) == before
    fresh = tmp_path / "fresh" / "out"
    result = CliRunner().invoke(app, ["data", "prepare", str(tmp_path / "good.txt"), "-o", str(fresh)])
    message = " ".join(result.output.replace("\u2502", " ").split())  # unwrap the error box
    assert result.exit_code == 2 and os.strerror(code) in message, result.output
    assert "Traceback" not in result.output and not fresh.exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_read_only_output_directory_is_a_clean_error(tmp_path):
    (tmp_path / "good.txt").write_text("\n".join(sentences(4)) + "\n")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    with pytest.raises(ValueError, match=f"{locked}.*Permission denied"):
        prepare_shards([tmp_path / "good.txt"], locked / "out", PrepareOptions(), show_progress=False)


def test_unreadable_gzip_input_is_a_clean_error(tmp_path):
    import gzip

    data = gzip.compress(("\n".join(sentences(2000)) + "\n").encode())
    (tmp_path / "cut.txt.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="cannot read input .*cut.txt.gz"):
        prepare_shards([tmp_path / "cut.txt.gz"], tmp_path / "out", PrepareOptions(), show_progress=False)
    assert not (tmp_path / "out").exists()

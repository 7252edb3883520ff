"""``data download``: converters on original-format fixtures, and fetch / verify / resume through a
loopback HTTP server (no internet needed); the shipped registry against ../shared/data."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import tarfile
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vascl_scale.cli import app
from vascl_scale.data import download as download_module
from vascl_scale.data.converters import CONVERTERS
from vascl_scale.data.download import download_datasets
from vascl_scale.data.registry import load_registry

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
HOST = "example.org"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def zip_bytes(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def tar_gz_bytes(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


# Original-format fixtures (as the releases hold them) and the layout files they must become.
ORIGINALS = {
    # An STS year's release zip: the SentEval layout in a folder, a pair without gold, a subset
    # named "surprise.*", a third source column (as STS16 has), a file of another folder ignored.
    "sts/STS2012-en-test.zip": zip_bytes({
        "test-gold/STS.input.MSRpar.txt": b"A b.\tC \"d\".\nNo gold\there\n",
        "test-gold/STS.gs.MSRpar.txt": b"4.400\n\n",
        "test-gold/STS.input.surprise.OnWN.txt": "x y\tz\u00e9\tsource\n".encode(),
        "test-gold/STS.gs.surprise.OnWN.txt": b"5.000\n",
        "other/STS.input.MSRpar.txt": b"never\tread\n",
    }),
    "sts/Stsbenchmark.tar.gz": tar_gz_bytes({
        "stsbenchmark/sts-train.csv": b"main-captions\tMSRvid\t2012test\t0001\t5.000\tA plane.\tAn air plane.\n"
        b"main-news\theadlines\t2013\t0002\t0.500\tOne \"q\tTwo\tsrc1\tsrc2\n",
        "stsbenchmark/readme.txt": b"readme",
    }),
    "sts/sick_train.zip": zip_bytes({
        "SICK_train.txt": b"pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\r\n"
        b"1\tA dog runs\tA dog is running\t4.7\tENTAILMENT\r\n2\tX\tY\t1\tNEUTRAL\r\n",
        "readme.txt": b"readme",
    }),
    "clustering/T": b"2\tfoo bar\t\r\n1\tbaz \"q\" x\r\n",
    "intent/train.csv": b'text,category\r\n"hi\nthere",card_arrival\r\n ok ,top_up\r\n',
    "intent/data_full.json": json.dumps(
        {"train": [["a b", "x"]], "val": [["c", "y"]], "test": [['say "d"', "z"]], "oos_train": [["e", "oos"]]}
    ).encode(),
    "intent/seq.in": "hello there \nwhat\u2028time\n".encode(),
    "intent/label": b"greet\ntime\n",
    "corpus/wiki.txt": b"First sentence here.\nSecond one.\n",
}
EXPECTED = {
    "sts/s12/test.tsv": 'sentence1\tsentence2\tscore\tsubset\nA b.\t"C ""d""."\t4.4\tMSRpar\nx y\tz\u00e9\t5.0\tOnWN\n'.encode(),
    "sts/b/train.tsv": b'sentence1\tsentence2\tscore\nA plane.\tAn air plane.\t5.0\n"One ""q"\tTwo\t0.5\n',
    "sts/k/train.tsv": b"sentence1\tsentence2\tscore\nA dog runs\tA dog is running\t4.7\nX\tY\t1.0\n",
    "clustering/t.tsv": b'text\tlabel\nfoo bar\t2\n"baz ""q"" x"\t1\n',
    "intent/b/train.tsv": b"text\tlabel\nhi there\tcard_arrival\nok\ttop_up\n",
    "intent/c/train.tsv": b"text\tlabel\na b\tx\n",
    "intent/c/valid.tsv": b"text\tlabel\nc\ty\n",
    "intent/c/test.tsv": b'text\tlabel\n"say ""d"""\tz\n',
    "intent/p/train.tsv": "text\tlabel\nhello there\tgreet\nwhat\u2028time\ttime\n".encode(),
}


def url(name: str) -> str:
    return f"https://{HOST}/{name}"


def registry_text(expected: dict[str, bytes], original_digests: dict[str, str] | None = None) -> str:
    """A registry of the fixtures; ``expected`` gives the converted digests it pins."""
    pins = original_digests or {}

    def source(name: str) -> str:
        pin = f', sha256 = "{pins[name]}"' if name in pins else ""
        return f'{{ url = "{url(name)}"{pin} }}'

    def outputs(*paths: str) -> str:
        return ", ".join(f'"{path}" = "{sha256(expected[path]) if path in expected else ""}"' for path in paths)

    common = 'description = "d"\nlicence = "l"\nformat = "f"\nchecked = "fixtures"\n'
    return f"""
[datasets.s12]
family = "sts"
{common}converter = "senteval_sts"
options = {{ folder = "test-gold/", subsets = ["MSRpar", "surprise.OnWN"] }}
sources = [{source("sts/STS2012-en-test.zip")}]
outputs = {{ {outputs("sts/s12/test.tsv")} }}

[datasets.b]
family = "sts"
{common}converter = "stsb_csv"
options = {{ folder = "stsbenchmark/", files = {{ "sts-train.csv" = "sts/b/train.tsv" }} }}
sources = [{source("sts/Stsbenchmark.tar.gz")}]
outputs = {{ {outputs("sts/b/train.tsv")} }}

[datasets.k]
family = "sts"
{common}converter = "sick_semeval"
options = {{ files = {{ "SICK_train.txt" = "sts/k/train.tsv" }} }}
sources = [{source("sts/sick_train.zip")}]
outputs = {{ {outputs("sts/k/train.tsv")} }}

[datasets.t]
family = "clustering"
{common}converter = "label_tab_text"
sources = [{source("clustering/T")}]
outputs = {{ {outputs("clustering/t.tsv")} }}

[datasets.bk]
family = "intent"
{common}converter = "csv_text_category"
sources = [{source("intent/train.csv")}]
outputs = {{ {outputs("intent/b/train.tsv")} }}

[datasets.c]
family = "intent"
{common}converter = "json_splits"
options = {{ splits = {{ "intent/c/train.tsv" = "train", "intent/c/valid.tsv" = "val", "intent/c/test.tsv" = "test" }} }}
sources = [{source("intent/data_full.json")}]
outputs = {{ {outputs("intent/c/train.tsv", "intent/c/valid.tsv", "intent/c/test.tsv")} }}

[datasets.p]
family = "intent"
{common}converter = "parallel_lines"
sources = [{source("intent/seq.in")}, {source("intent/label")}]
outputs = {{ {outputs("intent/p/train.tsv")} }}

[datasets.wiki]
family = "corpus"
{common}converter = "gzip_text"
sources = [{source("corpus/wiki.txt")}]
outputs = {{ "corpus/wiki.txt.gz" = "" }}
"""


class Mirror:
    """A loopback HTTP server holding original files at /<host>/<path>, with Range and If-Range
    support (an ETag per file) unless ``ranges`` is off (a server that ignores Range).

    ``cut_after[path] = n`` ends the first response for ``path`` after n bytes of its body (a
    dropped connection); every request's path and Range header is recorded.
    """

    def __init__(self, files: dict[str, bytes], ranges: bool = True) -> None:
        self.files = {f"/{HOST}/{name}": data for name, data in files.items()}
        self.cut_after: dict[str, int] = {}
        self.requests: list[tuple[str, str | None]] = []
        mirror = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep the test output clean
                pass

            def do_GET(self) -> None:
                mirror.requests.append((self.path, self.headers.get("Range")))
                data = mirror.files.get(self.path)
                if data is None:
                    self.send_error(404)
                    return
                etag = f'"{sha256(data)[:16]}"'
                start = 0
                wanted = self.headers.get("Range") and ranges and self.headers.get("If-Range") == etag
                if wanted:
                    start = int(self.headers["Range"].removeprefix("bytes=").rstrip("-"))
                    if start >= len(data):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(data)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                body = data[start:]
                self.send_header("ETag", etag)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                cut = mirror.cut_after.pop(self.path, None)
                self.wfile.write(body if cut is None else body[:cut])
                if cut is not None:
                    self.close_connection = True

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "Mirror":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


@pytest.fixture(autouse=True)
def short_timeouts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(download_module, "READ_TIMEOUT_S", 10.0)  # a hung loopback fails the test fast


def run_download(registry: Path, to: Path, mirror: str, *names: str):
    return CliRunner().invoke(
        app, ["data", "download", *names, "--to", str(to), "--mirror", mirror, "--registry", str(registry)]
    )


def test_converters_turn_each_original_format_into_the_layout(tmp_path: Path) -> None:
    (tmp_path / "registry.toml").write_text(registry_text(EXPECTED))
    with Mirror(ORIGINALS) as mirror:
        result = run_download(tmp_path / "registry.toml", tmp_path / "data", mirror.url)
        assert result.exit_code == 0, result.output
        for relative, data in EXPECTED.items():
            assert (tmp_path / "data" / relative).read_bytes() == data, relative
        corpus = (tmp_path / "data" / "corpus" / "wiki.txt.gz").read_bytes()
        assert gzip.decompress(corpus) == ORIGINALS["corpus/wiki.txt"]
        assert "8 converted" in result.output and "not pinned" in result.output
        assert sha256(corpus) in result.output  # the unpinned digest is reported

        # Everything present: nothing is fetched again.
        count = len(mirror.requests)
        again = run_download(tmp_path / "registry.toml", tmp_path / "data", mirror.url)
        assert again.exit_code == 0 and "8 present" in again.output and len(mirror.requests) == count
        # --force converts again, from the downloaded originals re-fetched.
        forced = CliRunner().invoke(app, ["data", "download", "t", "--to", str(tmp_path / "data"), "--mirror",
                                          mirror.url, "--registry", str(tmp_path / "registry.toml"), "--force"])
        assert forced.exit_code == 0 and "1 converted" in forced.output and len(mirror.requests) == count + 1
    # The gzip bytes carry no timestamp: converting again gives the same file.
    download_datasets(load_registry(tmp_path / "registry.toml").select(["wiki"]), tmp_path / "again", mirror=str(tmp_path / "data" / ".downloads"), show_progress=False)
    assert (tmp_path / "again" / "corpus" / "wiki.txt.gz").read_bytes() == corpus


def test_a_converted_file_that_differs_from_its_checksum_fails_clearly_and_is_not_kept(tmp_path: Path) -> None:
    (tmp_path / "registry.toml").write_text(registry_text(EXPECTED))
    corrupt = {**ORIGINALS, "clustering/T": ORIGINALS["clustering/T"].replace(b"foo", b"fOo")}
    with Mirror(corrupt) as mirror:
        result = run_download(tmp_path / "registry.toml", tmp_path / "data", mirror.url)
    assert result.exit_code == 1
    expected, actual = sha256(EXPECTED["clustering/t.tsv"]), sha256(EXPECTED["clustering/t.tsv"].replace(b"foo", b"fOo"))
    flat = " ".join(result.output.split())
    assert "checksum" in flat and "clustering/t.tsv" in flat, result.output
    assert "--force" in flat and "1 failed" in flat and "7 converted" in flat  # the others went on
    failure = download_datasets(load_registry(tmp_path / "registry.toml").select(["t"]), tmp_path / "data",
                                mirror=str(tmp_path / "data" / ".downloads"), show_progress=False)[0]
    assert failure.status == "failed" and failure.reason.startswith("checksum:")
    assert expected in failure.reason and actual in failure.reason
    assert not (tmp_path / "data" / "clustering" / "t.tsv").exists()
    assert not list((tmp_path / "data").glob(".staging-*"))


def test_a_pinned_original_with_other_bytes_is_refused_and_deleted(tmp_path: Path) -> None:
    pins = {"intent/train.csv": sha256(b"something else")}
    (tmp_path / "registry.toml").write_text(registry_text(EXPECTED, pins))
    with Mirror(ORIGINALS) as mirror:
        outcome = download_datasets(load_registry(tmp_path / "registry.toml").select(["bk"]), tmp_path / "data",
                                    mirror=mirror.url, show_progress=False)[0]
    assert outcome.status == "failed" and "the original" in outcome.reason and pins["intent/train.csv"] in outcome.reason
    assert not list((tmp_path / "data" / ".downloads").rglob("train.csv*"))


def test_an_interrupted_download_resumes_where_it_stopped(tmp_path: Path) -> None:
    (tmp_path / "registry.toml").write_text(registry_text(EXPECTED))
    datasets = load_registry(tmp_path / "registry.toml").select(["c"])
    with Mirror(ORIGINALS) as mirror:
        mirror.cut_after[f"/{HOST}/intent/data_full.json"] = 10
        first = download_datasets(datasets, tmp_path / "data", mirror=mirror.url, show_progress=False)[0]
        assert first.status == "failed" and first.reason.startswith("network:") and "rerun to resume" in first.reason
        part = tmp_path / "data" / ".downloads" / HOST / "intent" / "data_full.json.part"
        assert part.stat().st_size == 10  # kept, and never taken for the whole file
        assert not (tmp_path / "data" / ".downloads" / HOST / "intent" / "data_full.json").exists()
        second = download_datasets(datasets, tmp_path / "data", mirror=mirror.url, show_progress=False)[0]
        assert second.status == "converted"
        assert mirror.requests[-1] == (f"/{HOST}/intent/data_full.json", "bytes=10-")
    for relative in ("intent/c/train.tsv", "intent/c/valid.tsv", "intent/c/test.tsv"):
        assert (tmp_path / "data" / relative).read_bytes() == EXPECTED[relative]


def test_an_unreachable_source_is_a_network_failure_and_the_rest_go_on(tmp_path: Path) -> None:
    (tmp_path / "registry.toml").write_text(registry_text(EXPECTED))
    files = {name: data for name, data in ORIGINALS.items() if name != "intent/label"}
    with Mirror(files) as mirror:
        outcomes = download_datasets(load_registry(tmp_path / "registry.toml").select(["intent"]), tmp_path / "data",
                                     mirror=mirror.url, show_progress=False)
    by_name = {outcome.name: outcome for outcome in outcomes}
    assert by_name["p"].status == "failed" and "HTTP 404" in by_name["p"].reason
    assert by_name["bk"].status == by_name["c"].status == "converted"
    with pytest.raises(ValueError, match="unknown dataset 'nope'"):
        load_registry(tmp_path / "registry.toml").select(["nope"])
    with pytest.raises(ValueError, match="neither an http"):
        download_datasets([], tmp_path / "data", mirror=str(tmp_path / "absent"))


def test_the_shipped_registry_is_valid_and_names_a_licence_and_digest_for_every_evaluation_file() -> None:
    registry = load_registry()
    for dataset in registry.datasets:
        assert dataset.converter in CONVERTERS, dataset.name
        assert dataset.licence and dataset.checked, dataset.name
        if dataset.family != "corpus":
            assert all(dataset.outputs.values()), f"{dataset.name}: every evaluation file has a pinned sha256"


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="needs ../shared/data")
def test_the_registry_digests_are_those_of_the_evaluators_copy() -> None:
    from vascl_scale.data.shards import file_sha256

    checked = 0
    for dataset in load_registry().datasets:
        for relative, digest in dataset.outputs.items():
            if digest and (SHARED_DATA / relative).is_file():
                assert file_sha256(SHARED_DATA / relative) == digest, relative
                checked += 1
    assert checked >= 19


@pytest.mark.skipif(not (SHARED_DATA / "raw").is_dir(), reason="needs ../shared/data/raw")
def test_converting_the_original_files_in_shared_data_reproduces_the_evaluators_copy(tmp_path: Path) -> None:
    """The release files kept in ../shared/data/raw, through the registry's own converters and
    options: the STS Benchmark csv files and SentEval's STS12 folder."""
    from vascl_scale.data.shards import file_sha256

    registry = {dataset.name: dataset for dataset in load_registry().datasets}
    raw = SHARED_DATA / "raw"
    cases = [
        ("stsb", sorted((raw / "stsbenchmark").glob("sts-*.csv"))),
        ("sts12-senteval", sorted((raw / "senteval" / "STS" / "STS12-en-test").glob("STS.*.txt"))),
    ]
    for name, originals in cases:
        dataset = registry[name]
        dataset.convert(originals, tmp_path / name)
        for relative, digest in dataset.outputs.items():
            assert file_sha256(tmp_path / name / relative) == digest == file_sha256(SHARED_DATA / relative), relative


def test_the_readme_table_of_sources_is_the_registrys() -> None:
    from vascl_scale.data.download import registry_markdown

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    assert registry_markdown(list(load_registry().datasets)) in readme


def test_resume_starts_over_when_the_server_ignores_range_or_the_file_changed(tmp_path: Path) -> None:
    (tmp_path / "registry.toml").write_text(registry_text(EXPECTED))
    datasets = load_registry(tmp_path / "registry.toml").select(["c"])
    part = tmp_path / "data" / ".downloads" / HOST / "intent" / "data_full.json.part"
    with Mirror(ORIGINALS, ranges=False) as mirror:
        mirror.cut_after[f"/{HOST}/intent/data_full.json"] = 10
        assert download_datasets(datasets, tmp_path / "data", mirror=mirror.url, show_progress=False)[0].status == "failed"
        assert part.stat().st_size == 10
        assert download_datasets(datasets, tmp_path / "data", mirror=mirror.url, show_progress=False)[0].status == "converted"
    assert (tmp_path / "data" / "intent" / "c" / "test.tsv").read_bytes() == EXPECTED["intent/c/test.tsv"]
    # A .part of another version of the file (its ETag no longer matches): fetched afresh.
    shutil.rmtree(tmp_path / "data")
    changed = {**ORIGINALS, "intent/data_full.json": ORIGINALS["intent/data_full.json"].replace(b'"a b"', b'"A B"')}
    with Mirror(changed) as mirror:
        mirror.cut_after[f"/{HOST}/intent/data_full.json"] = 10
        download_datasets(datasets, tmp_path / "data", mirror=mirror.url, show_progress=False)
    with Mirror(ORIGINALS) as mirror:
        outcome = download_datasets(datasets, tmp_path / "data", mirror=mirror.url, show_progress=False)[0]
        assert outcome.status == "converted" and mirror.requests[-1][0].endswith("data_full.json")
    assert (tmp_path / "data" / "intent" / "c" / "train.tsv").read_bytes() == EXPECTED["intent/c/train.tsv"]


def test_a_complete_part_file_is_finished_without_refetching(tmp_path: Path) -> None:
    """A .part holding every byte (a run stopped before the rename): the server answers 416."""
    (tmp_path / "registry.toml").write_text(registry_text(EXPECTED))
    datasets = load_registry(tmp_path / "registry.toml").select(["c"])
    downloads = tmp_path / "data" / ".downloads" / HOST / "intent"
    downloads.mkdir(parents=True)
    data = ORIGINALS["intent/data_full.json"]
    (downloads / "data_full.json.part").write_bytes(data)
    (downloads / "data_full.json.part.validator").write_text(f'"{sha256(data)[:16]}"')
    with Mirror(ORIGINALS) as mirror:
        assert download_datasets(datasets, tmp_path / "data", mirror=mirror.url, show_progress=False)[0].status == "converted"
        assert mirror.requests == [(f"/{HOST}/intent/data_full.json", f"bytes={len(data)}-")]


def test_direct_urls_a_directory_mirror_and_broken_originals(tmp_path: Path) -> None:
    with Mirror(ORIGINALS) as mirror:
        # The registry's URLs themselves (no --mirror), here on the loopback server.
        text = registry_text(EXPECTED).replace(f"https://{HOST}/", f"{mirror.url}/{HOST}/")
        (tmp_path / "direct.toml").write_text(text)
        outcome = download_datasets(load_registry(tmp_path / "direct.toml").select(["t"]), tmp_path / "direct", show_progress=False)[0]
        assert outcome.status == "converted" and outcome.fetched
    assert (tmp_path / "direct" / "clustering" / "t.tsv").read_bytes() == EXPECTED["clustering/t.tsv"]
    # A directory mirror (<mirror>/<host>/<path>) lacking a file: a source failure naming the layout.
    mirror_dir = tmp_path / "mirror" / HOST
    (mirror_dir / "clustering").mkdir(parents=True)
    (mirror_dir / "clustering" / "T").write_bytes(ORIGINALS["clustering/T"])
    (tmp_path / "registry.toml").write_text(registry_text(EXPECTED))
    registry = load_registry(tmp_path / "registry.toml")
    done, missing = download_datasets(registry.select(["t", "bk"]), tmp_path / "data", mirror=str(tmp_path / "mirror"), show_progress=False)
    assert done.status == "converted"
    assert missing.status == "failed" and missing.reason.startswith("source:") and "<mirror>/<host>/<path>" in missing.reason
    # An original that is no archive (an error page): a conversion failure that says --force.
    (mirror_dir / "sts").mkdir()
    (mirror_dir / "sts" / "STS2012-en-test.zip").write_bytes(b"<html>Service unavailable</html>")
    broken = download_datasets(registry.select(["s12"]), tmp_path / "data", mirror=str(tmp_path / "mirror"), show_progress=False)[0]
    assert broken.status == "failed" and broken.reason.startswith("conversion:") and "--force" in broken.reason


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda t: t.replace(f"https://{HOST}/clustering/T", f"https://{HOST}/../../etc/passwd"), "'..' path segments"),
        (lambda t: t.replace('converter = "label_tab_text"', 'converter = "nope"'), "converter 'nope' is not one of"),
        (lambda t: t.replace('"clustering/t.tsv" =', '"intent/t.tsv" ='), "must lie under clustering/"),
        (lambda t: t.replace('"intent/c/valid.tsv" = "val"', '"intent/c/other.tsv" = "val"'), "must map onto exactly the outputs"),
    ],
)
def test_a_bad_registry_is_one_clear_error(tmp_path: Path, change, message: str) -> None:
    (tmp_path / "registry.toml").write_text(change(registry_text(EXPECTED)))
    with pytest.raises(ValueError, match=message):
        load_registry(tmp_path / "registry.toml")

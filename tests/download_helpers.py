"""What the tests of ``data download`` share: original-format fixtures as the releases hold them,
the layout files they must become, a registry of them, and a loopback HTTP mirror."""

from __future__ import annotations

import hashlib
import io
import json
import sys
import tarfile
import threading
import time
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

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


def parquet_bytes(columns: dict[str, list]) -> bytes:
    """A parquet file of these columns (pyarrow infers each column's type from its values)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(pa.table(columns), buffer)
    return buffer.getvalue()


def beir_parquet_files(
    corpus: list[tuple[object, object]], queries: list[tuple[object, object]], qrels: list[tuple[object, object]]
) -> tuple[bytes, bytes, bytes]:
    """A NanoBEIR set as its Hugging Face repository holds it: the corpus, queries and qrels parquet
    files, in the order of the registry's sources, from (id, text) and (query id, document id) rows."""
    return (
        parquet_bytes({"_id": [row[0] for row in corpus], "text": [row[1] for row in corpus]}),
        parquet_bytes({"_id": [row[0] for row in queries], "text": [row[1] for row in queries]}),
        parquet_bytes({"query-id": [row[0] for row in qrels], "corpus-id": [row[1] for row in qrels]}),
    )


# Original-format fixtures (as the releases hold them) and the layout files they must become.
ORIGINALS = {
    # An STS year's release zip: the SentEval layout in a folder, a pair without gold, a subset
    # named "surprise.*", a third source column (as STS16 has), a file of another folder ignored.
    "sts/STS2012-en-test.zip": zip_bytes(
        {
            "test-gold/STS.input.MSRpar.txt": b'A b.\tC "d".\nNo gold\there\n',
            "test-gold/STS.gs.MSRpar.txt": b"4.400\n\n",
            "test-gold/STS.input.surprise.OnWN.txt": "x y\tz\u00e9\tsource\n".encode(),
            "test-gold/STS.gs.surprise.OnWN.txt": b"5.000\n",
            "other/STS.input.MSRpar.txt": b"never\tread\n",
        }
    ),
    "sts/Stsbenchmark.tar.gz": tar_gz_bytes(
        {
            "stsbenchmark/sts-train.csv": b"main-captions\tMSRvid\t2012test\t0001\t5.000\tA plane.\tAn air plane.\n"
            b'main-news\theadlines\t2013\t0002\t0.500\tOne "q\tTwo\tsrc1\tsrc2\n',
            "stsbenchmark/readme.txt": b"readme",
        }
    ),
    "sts/sick_train.zip": zip_bytes(
        {
            "SICK_train.txt": b"pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\r\n"
            b"1\tA dog runs\tA dog is running\t4.7\tENTAILMENT\r\n2\tX\tY\t1\tNEUTRAL\r\n",
            "readme.txt": b"readme",
        }
    ),
    "clustering/T": b'2\tfoo bar\t\r\n1\tbaz "q" x\r\n',
    "intent/train.csv": b'text,category\r\n"hi\nthere",card_arrival\r\n ok ,top_up\r\n',
    "intent/data_full.json": json.dumps(
        {"train": [["a b", "x"]], "val": [["c", "y"]], "test": [['say "d"', "z"]], "oos_train": [["e", "oos"]]}
    ).encode(),
    "intent/seq.in": "hello there \nwhat\u2028time\n".encode(),
    "intent/label": b"greet\ntime\n",
    "corpus/wiki.txt": b"First sentence here.\nSecond one.\n",
    # SimCSE's nli_for_simcse.csv: quoted fields (a comma, doubled quotes) and a row without a
    # hard negative, which the conversion drops and counts.
    "corpus/nli_for_simcse.csv": b'sent0,sent1,hard_neg\n"A man, a plan, a canal.",A plan.,No plan at all.\n'
    b"The cat sat.,A cat sits.,A dog stands.\nan anchor,a positive,\n"
    b'"She said ""hi"".",She spoke.,She was silent.\nTwo birds fly.,Birds fly.,Nothing flies.\n',
}
# The rows of that CSV the conversion keeps, as (anchor, positive, negative_0).
NLI_TRIPLETS = [
    ("A man, a plan, a canal.", "A plan.", "No plan at all."),
    ("The cat sat.", "A cat sits.", "A dog stands."),
    ('She said "hi".', "She spoke.", "She was silent."),
    ("Two birds fly.", "Birds fly.", "Nothing flies."),
]
NLI_SHARD_SIZE = 3
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

[datasets.nli]
family = "corpus"
{common}converter = "nli_shards"
options = {{ shard_size = {NLI_SHARD_SIZE}, shuffle_seed = 0, labelled_pairs = "corpus/nli-pairs" }}
sources = [{source("corpus/nli_for_simcse.csv")}]
outputs = {{ "corpus/nli/manifest.json" = "", "corpus/nli/shard-000000.tar" = "", "corpus/nli/shard-000001.tar" = "", "corpus/nli-pairs/manifest.json" = "", "corpus/nli-pairs/shard-000000.tar" = "", "corpus/nli-pairs/shard-000001.tar" = "", "corpus/nli-pairs/shard-000002.tar" = "" }}
"""


class _QuietServer(ThreadingHTTPServer):
    """A client that gives up mid-body (the refused second download, a timeout test) is what the
    tests make happen: its broken pipe is not printed into the output a test reads."""

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


class Mirror:
    """A loopback HTTP server holding original files at /<host>/<path>, with Range and If-Range
    support (an ETag per file) unless ``ranges`` is off (a server that ignores Range).

    ``cut_after[path] = n`` ends the first response for ``path`` after n bytes of its body (a
    dropped connection); every request's path and Range header is recorded. Misbehaving servers:
    ``lengths[path]`` is the Content-Length announced (None: no header) whatever the body,
    ``range_from`` the first byte a 206 reply starts at whatever was asked, ``drip`` sends the
    body one byte every that many seconds, and a request waits for ``hold`` (an Event) to be set
    (``waiting`` is set once one does). A HEAD request (its path recorded in ``heads``) is
    answered with the file's Content-Length, or ``lengths[path]``.
    """

    def __init__(self, files: dict[str, bytes], ranges: bool = True) -> None:
        self.files = {f"/{HOST}/{name}": data for name, data in files.items()}
        self.cut_after: dict[str, int] = {}
        self.requests: list[tuple[str, str | None]] = []
        self.heads: list[str] = []
        self.lengths: dict[str, int | None] = {}
        self.range_from: int | None = None
        self.drip: float | None = None
        self.hold: threading.Event | None = None
        self.waiting = threading.Event()
        mirror = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep the test output clean
                pass

            def do_HEAD(self) -> None:  # what the download plan asks to size a file
                mirror.heads.append(self.path)
                data = mirror.files.get(self.path)
                if data is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                length = mirror.lengths.get(self.path, len(data))
                if length is not None:
                    self.send_header("Content-Length", str(length))
                self.end_headers()

            def do_GET(self) -> None:
                mirror.requests.append((self.path, self.headers.get("Range")))
                if mirror.hold is not None:
                    mirror.waiting.set()
                    mirror.hold.wait(timeout=10)
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
                    start = start if mirror.range_from is None else mirror.range_from
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                body = data[start:]
                self.send_header("ETag", etag)
                length = mirror.lengths.get(self.path, len(body))
                if length is not None:
                    self.send_header("Content-Length", str(length))
                self.end_headers()
                cut = mirror.cut_after.pop(self.path, None)
                body = body if cut is None else body[:cut]
                if mirror.drip is None:
                    self.wfile.write(body)
                else:
                    for index in range(len(body)):  # stops with BrokenPipeError once the client gives up
                        self.wfile.write(body[index : index + 1])
                        time.sleep(mirror.drip)
                if cut is not None:
                    self.close_connection = True

        self.server = _QuietServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Mirror:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)

"""Encoding and the evaluation commands under hostile input: a long document is cut before it
reaches the tokenizer, yet embeds bit for bit as if whole; a full disk neither destroys an earlier
results file nor fails an evaluation through its embedding cache; a symbolic link loop under
``retrieval/`` is skipped; and BEIR directories full of odd lines load or give one ValueError
naming the file (property-based, hypothesis)."""

from __future__ import annotations

import errno
import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import event, example, given
from hypothesis import strategies as st
from transformers import AutoTokenizer
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from tests.eval_helpers import WORDS, invoke, make_data, save_tiny_bert
from tests.test_properties import assert_refused, examples, mostly
from tests.test_retrieval import toy_beir, write_beir
from tests.tiny import tiny_decoder_dir
from vascl_scale.encode import Embedder, resolve_model
from vascl_scale.eval.retrieval import RetrievalEvaluator, load_retrieval_data
from vascl_scale.model import SentenceEncoder
from vascl_scale.tokenizer import max_token_chars, token_prefixes


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return save_tiny_bert(tmp_path_factory.mktemp("model") / "tiny")


@pytest.fixture(scope="module")
def decoder(tmp_path_factory) -> Path:
    """A tiny Qwen3 with a byte-level BPE tokenizer; last-token pooling appends EOS to every text."""
    return tiny_decoder_dir(tmp_path_factory.mktemp("decoder") / "qwen3")


def words(count: int, seed: int = 0) -> str:
    return " ".join(np.random.default_rng(seed).choice(WORDS, size=count))


# --- D12: a long text is cut before tokenising, never changing the tokens kept ---


def long_texts(bound: int) -> dict[str, str]:
    """Long texts, each past ``bound`` characters, that take a cut each way: plain words (cut at
    the first try); control characters that make no WordPiece token between the spaces (the first
    prefixes fall short of max_length tokens and are tried again, longer); a whitespace run with
    no cut point in it; one word, no cut point at all (whole)."""
    silent = ("\x07" * 40 + " ") * (3 * bound // 41)
    return {
        "words": words(30_000),
        "control characters": "start " + silent + words(2_000, seed=1),
        "whitespace run": "start " + " " * (3 * bound) + words(300, seed=2),
        "one word": "x" * (3 * bound),
    }


@pytest.mark.parametrize("model", ["bert", "decoder"])
def test_a_cut_document_embeds_bit_equal_to_the_whole_one(model, tiny_model, decoder):
    directory = tiny_model if model == "bert" else decoder
    spec = resolve_model(directory)
    embedder = Embedder(spec, batch_size=1)
    reference = SentenceEncoder.from_pretrained(directory, pooling=spec.pooling).eval()
    tokenizer = reference.tokenizer
    bound = spec.max_length * max_token_chars(tokenizer)
    for name, text in long_texts(bound).items():
        [kept] = token_prefixes([text], tokenizer, spec.max_length, bound)
        assert len(kept) < len(text) or name in ("whitespace run", "one word"), name
        assert kept == text or name != "one word"

        def tokens(texts):
            return tokenizer(texts, truncation=True, max_length=spec.max_length)["input_ids"]

        assert tokens([kept]) == tokens([text]), name
        if model == "bert" and name == "control characters":  # the first prefix alone would lose tokens
            assert tokens([text[:bound]]) != tokens([text])
        whole = tokenizer([text], truncation=True, max_length=spec.max_length, return_tensors="pt")  # no cut
        with torch.no_grad():
            expected = reference(**whole).float().numpy()
        np.testing.assert_array_equal(embedder.embed([text])([text]), expected, err_msg=name)


def test_eval_retrieval_never_hands_the_tokenizer_a_whole_long_document(tiny_model, tmp_path, monkeypatch):
    spec = resolve_model(tiny_model)
    bound = spec.max_length * max_token_chars(AutoTokenizer.from_pretrained(str(tiny_model)))
    document = words(40_000)  # about 250,000 characters, 64 tokens kept
    assert len(document) > 100 * bound
    data = toy_beir(tmp_path / "toy")
    with (data / "corpus.jsonl").open("a", encoding="utf-8") as handle:
        handle.write(json.dumps({"_id": "long", "text": document}) + "\n")
    handed: list[int] = []  # the length of every text the tokenizer is given
    tokenize = PreTrainedTokenizerBase.__call__

    def recording(self, text=None, *args, **kwargs):
        handed.extend(len(one) for one in ([text] if isinstance(text, str) else text or []))
        return tokenize(self, text, *args, **kwargs)

    monkeypatch.setattr(PreTrainedTokenizerBase, "__call__", recording)
    common = ["--model", str(tiny_model), "--data", str(data), "--no-cache", "--precision", "no"]
    result = invoke("retrieval", *common, "--output", str(tmp_path / "r.json"))
    assert result.exit_code == 0, result.output
    assert handed and max(handed) <= bound + max(map(len, WORDS)) + 1, (max(handed), bound)
    # scored as the whole document is: its embedding from the encoder given it whole
    encoder = SentenceEncoder.from_pretrained(tiny_model)
    monkeypatch.undo()
    [task] = json.loads((tmp_path / "r.json").read_text())["models"][0]["results"]
    [direct] = RetrievalEvaluator({"toy": load_retrieval_data(data)}).evaluate(
        lambda texts: encoder.encode(texts, max_length=spec.max_length)
    )
    assert task["details"]["documents"] == 25 and direct.primary == pytest.approx(task["primary"], abs=1e-4)


# --- D23: a full disk ---


def test_a_full_disk_leaves_the_earlier_results_file_as_it_was(tiny_model, tmp_path, monkeypatch):
    data = toy_beir(tmp_path / "toy")
    output = tmp_path / "r.json"
    common = ["--model", str(tiny_model), "--data", str(data), "--no-cache", "--output", str(output)]
    assert invoke("retrieval", *common).exit_code == 0
    earlier = output.read_text()
    write_text = Path.write_text

    def full_disk(self, text, *args, **kwargs):
        """As a full disk writes: the file is opened (truncated), part of it written, then ENOSPC."""
        if self.name.endswith(("r.json", "r.md")):
            with open(self, "w", encoding="utf-8") as handle:
                handle.write(text[:100])
            raise OSError(errno.ENOSPC, "No space left on device")
        return write_text(self, text, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_disk)
    result = invoke("retrieval", *common)
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    message = " ".join(result.output.split())
    assert "error: " in message and "disk is full" in message and str(output) in message, message
    assert output.read_text() == earlier and sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "r.md", "toy"]


def test_a_full_disk_under_the_embedding_cache_warns_once_and_evaluates(tiny_model, tmp_path, monkeypatch):
    data = toy_beir(tmp_path / "toy")
    uncached = tmp_path / "uncached.json"
    common = ["--model", str(tiny_model), "--data", str(data), "--batch-size", "1"]  # two cache parts to write
    assert invoke("retrieval", *common, "--no-cache", "--output", str(uncached)).exit_code == 0
    savez = np.savez
    calls = []

    def full_disk(handle, *args, **kwargs):
        calls.append(handle)
        handle.write(b"PK")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "savez", full_disk)
    cache = tmp_path / "cache"
    result = invoke("retrieval", *common, "--cache-dir", str(cache), "--output", str(tmp_path / "r.json"))
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.output.splitlines() if "embedding cache" in line]
    assert len(warnings) == 1 and len(calls) == 1, result.output
    assert f"cannot write the embedding cache {cache}/" in warnings[0] and "going on without caching" in warnings[0]
    scores = [json.loads(path.read_text())["models"][0]["results"] for path in (uncached, tmp_path / "r.json")]
    assert scores[0] == scores[1]
    assert not [path for path in cache.rglob("*") if path.is_file()]  # no half-written part left
    monkeypatch.setattr(np, "savez", savez)


# --- a symbolic link loop under retrieval/ ---


def test_a_symlink_loop_under_retrieval_is_skipped_naming_the_link(tiny_model, tmp_path):
    data_dir = make_data(tmp_path / "data")
    toy_beir(data_dir / "retrieval" / "nanobeir" / "toy")
    loop = data_dir / "retrieval" / "nanobeir" / "loop"
    loop.symlink_to(data_dir / "retrieval")
    output = tmp_path / "r.json"
    result = invoke(
        "retrieval", "--model", str(tiny_model), "--data-dir", str(data_dir), "--no-cache", "--output", str(output)
    )
    assert result.exit_code == 0, result.output
    assert [r["task"] for r in json.loads(output.read_text())["models"][0]["results"]] == ["nanobeir-toy"]
    warning = f"WARNING skipping {loop}: a symbolic link to {data_dir / 'retrieval'}, a folder above it (a loop)"
    assert warning in result.output, result.output


# --- property-based: BEIR directories of odd lines ---

ODD_IDS = st.one_of(
    st.sampled_from(["", " ", "a\tb", "a\nb", "a\rb", '"q"', "\u2028", "\x00", "\u00e9", "d1 ", "q0"]),
    st.integers(-3, 3),
    st.text(max_size=4),
)


def ids(prefix: str, number: st.SearchStrategy = st.integers(0, 2)) -> st.SearchStrategy:
    """An id of the files' own (``d0``, ``q1``, ...), or now and then an odd one."""
    return mostly(number.map(lambda i: f"{prefix}{i}"), ODD_IDS, one_in=10)


TEXTS = mostly(st.sampled_from(["a b", "river bank"]), st.sampled_from(["", " ", "\n", "\u2028", "x\ty"]), one_in=10)
ODD_LINES = [
    "",
    "   ",
    "{",
    "[1]",
    "null",
    '"text"',
    "{}",
    '{"_id": true, "text": "a"}',
    '{"_id": null, "text": "a"}',
    '{"_id": 1.5, "text": "a"}',
    '{"_id": "x", "text": 3}',
    '{"_id": "x", "title": ["a"], "text": "b"}',
    '{"_id": "x", "text": NaN}',
    '{"_id": "x", "text": "\\ud800"}',
    "\ufeff{}",
    '{"_id": 1' + "0" * 5000 + ', "text": "a"}',  # an integer past Python's 4300 digits
    "[" * 100_000 + "]" * 100_000,  # nested past the parser's recursion limit
]
GIANT, DEEP = ODD_LINES[-2:]


COUNTS = mostly(st.integers(1, 5), st.just(0))  # lines or rows of a file; now and then none


@st.composite
def jsonl_file(draw, kind: str) -> str:
    """A corpus or queries file: JSON objects, mostly with ids of their own and plain texts, and odd lines."""
    lines = []
    for line in range(draw(COUNTS)):
        record = {"_id": draw(ids("d" if kind == "corpus" else "q", st.just(line))), "text": draw(TEXTS)}
        if kind == "corpus" and draw(st.booleans()):
            record["title"] = draw(st.sampled_from(["", "t", None]))
        valid = json.dumps(record, ensure_ascii=draw(st.booleans()))
        lines.append(draw(mostly(st.just(valid), st.sampled_from(ODD_LINES), one_in=10)))
    return "".join(line + draw(st.sampled_from(["\n", "\r\n"])) for line in lines)


@st.composite
def qrels_file(draw) -> str:
    """A qrels TSV: mostly its header and rows of known ids graded 1 or 2, now and then odd ones."""
    header = draw(mostly(st.just("query-id\tcorpus-id\tscore"), st.sampled_from(["", "query-id\tcorpus-id", "q\td"])))
    score = mostly(st.sampled_from(["1", "2", "0"]), st.sampled_from(["-1", "x", "1.5", "9" * 30, " 1", ""]))
    row = st.tuples(ids("q"), ids("d"), score)
    odd_row = st.one_of(st.tuples(ids("q"), ids("d")), st.tuples(ids("q"), ids("d"), score, ODD_IDS))
    rows = [draw(mostly(row, odd_row, one_in=10)) for _ in range(draw(COUNTS))]
    return "".join(line + "\n" for line in ([header] if header else []) + ["\t".join(map(str, r)) for r in rows])


VALID_QRELS = "query-id\tcorpus-id\tscore\nq0\td0\t1\n"
VALID_QUERIES = '{"_id": "q0", "text": "a"}\n'


@examples(150)
@given(
    jsonl_file("corpus"), jsonl_file("queries"), qrels_file(), mostly(st.just(""), st.sampled_from(["corpus", "qrels"]))
)
# json.loads raised a ValueError that named no file for a number past 4300 digits, and a RecursionError;
# a grade past int64 an OverflowError
@example('{"_id": "d0", "text": "a"}\n', VALID_QUERIES + GIANT + "\n", VALID_QRELS, "")
@example('{"_id": "d0", "text": "a"}\n' + DEEP + "\n", VALID_QUERIES, VALID_QRELS, "")
@example('{"_id": "d0", "text": "a"}\n', VALID_QUERIES, VALID_QRELS.replace("\t1\n", "\t" + "9" * 30 + "\n"), "")
def test_a_beir_directory_loads_or_gives_one_line_naming_the_file(corpus, queries, qrels, missing):
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory) / "set"
        write_beir(root, [], [], [])
        files = {"corpus": root / "corpus.jsonl", "queries": root / "queries.jsonl", "qrels": root / "qrels/test.tsv"}
        for name, text in (("corpus", corpus), ("queries", queries), ("qrels", qrels)):
            files[name].write_text(text, encoding="utf-8", errors="surrogatepass")
        if missing:
            files[missing].unlink()
        try:
            data = load_retrieval_data(root)
        except ValueError as err:
            assert_refused(err, *files.values())
        else:
            event("loaded")
            assert data.query_ids and len(data.documents) == len(data.document_ids) >= 1

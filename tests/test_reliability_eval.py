"""Bad evaluation input is refused where it is, never scored: stray quotes in a TSV, non-finite
gold scores, a damaged embedding cache, and tables that must keep every digit in a log file;
files no metric can score, broken models, and output paths or devices that cannot be used
(refused before any work)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.data_helpers import captured_warnings
from tests.eval_helpers import WORDS, invoke, make_data, save_tiny_bert, write_tsv
from vascl_scale.data.converters import CONVERTERS
from vascl_scale.encode import Embedder, resolve_model
from vascl_scale.eval.clustering import CLUSTERING_TASKS, load_labelled_texts
from vascl_scale.eval.intent import load_intent_dataset
from vascl_scale.eval.sts import load_sts_tsv


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return save_tiny_bert(tmp_path_factory.mktemp("model") / "tiny")


def _load_intent_train(path: Path):
    return load_intent_dataset(path.parents[2], path.parent.name)


# Every loader of a headed TSV: (file under tmp_path, header, one row, the text column that a
# stray quote opens, the loader).
TSV_LOADERS: dict[str, tuple[str, list[str], Callable[[int], list[str]], int, Callable]] = {
    "sts": (
        "sts/stsb/test.tsv",
        ["sentence1", "sentence2", "score"],
        lambda i: [f"one {i}", f"two {i}", str(i % 5)],
        0,
        load_sts_tsv,
    ),
    "clustering": (
        "clustering/agnews.tsv",
        ["text", "label"],
        lambda i: [f"text {i}", str(i % 3)],
        0,
        load_labelled_texts,
    ),
    "intent": (
        "intent/toy/train.tsv",
        ["text", "label"],
        lambda i: [f"book {i}", f"intent_{i % 3}"],
        0,
        _load_intent_train,
    ),
}


def _write_with_quotes(
    path: Path,
    header: list[str],
    row: Callable[[int], list[str]],
    column: int,
    rows: int,
    opened: int,
    closed: int | None,
) -> Path:
    """A TSV whose physical line ``opened`` starts field ``column`` with a stray quote; line
    ``closed`` (if any) holds an ordinary in-text quote, which is where the parser closes it."""
    lines = ["\t".join(header)]
    for i in range(rows):
        fields = row(i)
        line = len(lines) + 1
        if line == opened:
            fields[column] = '"' + fields[column]
        if line == closed:
            fields[column] = f'she said "hi {fields[column]}'
        lines.append("\t".join(fields))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    if path.name == "train.tsv":  # the intent loader also needs a test split
        write_tsv(path.parent / "test.tsv", "text\tlabel", ["fine\tintent_0"])
    return path


@pytest.mark.parametrize("kind", list(TSV_LOADERS))
def test_quote_that_merges_rows_is_reported_where_it_opened(tmp_path, kind):
    name, header, row, column, load = TSV_LOADERS[kind]
    path = _write_with_quotes(tmp_path / name, header, row, column, rows=20, opened=4, closed=9)
    with pytest.raises(ValueError, match=rf"{Path(name).name}:4: .*{header[column]!r}.* lines 4 to 9"):
        load(path)


@pytest.mark.parametrize("rows", [10, 40_000])  # 40,000 rows overflow the csv module's field limit
@pytest.mark.parametrize("kind", list(TSV_LOADERS))
def test_never_closed_quote_is_reported_where_it_opened(tmp_path, kind, rows):
    name, header, row, column, load = TSV_LOADERS[kind]
    path = _write_with_quotes(tmp_path / name, header, row, column, rows=rows, opened=4, closed=None)
    with pytest.raises(ValueError, match=rf"{Path(name).name}:4: .*quote"):
        load(path)


NON_FINITE = ["nan", "NaN", "inf", "-inf", "Infinity", "1e999"]


@pytest.mark.parametrize("value", NON_FINITE)
def test_non_finite_gold_scores_are_rejected_in_every_format(tmp_path, value):
    sts = tmp_path / "t.tsv"
    sts.write_text(f"sentence1\tsentence2\tscore\na\tb\t1\nc\td\t{value}\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"t\.tsv:3: score '{value}' is not a finite number"):
        load_sts_tsv(sts)
    sick = tmp_path / "SICK.txt"
    sick.write_text(f"pair_ID\tsentence_A\tsentence_B\trelatedness_score\n1\ta\tb\t{value}\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"SICK\.txt:2: relatedness_score '{value}' is not a finite number"):
        CONVERTERS["sick_semeval"]([sick], {"files": {sick.name: "sick.tsv"}}, tmp_path / "stage")
    stsb = tmp_path / "sts-test.csv"
    stsb.write_text(f"main\tMSRvid\t2012\t0001\t{value}\tOne.\tTwo.\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"sts-test\.csv:1: score '{value}' is not a finite number"):
        CONVERTERS["stsb_csv"]([stsb], {"files": {stsb.name: "stsb.tsv"}}, tmp_path / "stage")
    senteval = tmp_path / "senteval"
    senteval.mkdir()
    (senteval / "STS.input.x.txt").write_text("a .\tb .\nc .\td .\n", encoding="utf-8")
    (senteval / "STS.gs.x.txt").write_text(f"1\n{value}\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"STS\.gs\.x\.txt:2: score '{value}' is not a finite number"):
        CONVERTERS["senteval_sts"](
            sorted(senteval.iterdir()), {"subsets": ["x"], "outputs": ["x.tsv"]}, tmp_path / "stage"
        )


@pytest.mark.parametrize(
    "content, where",
    [
        (
            "".join(f"one {i}\ttwo {i}\t{i % 5}\n" if i != 2 else f'"one {i}\ttwo {i}\t1\n' for i in range(30))
            + 'she said "hi\tthere\t2\n',
            "test.tsv:4: ",
        ),
        ("one\ttwo\t1\nthree\tfour\tnan\n", "test.tsv:3: score 'nan' is not a finite number"),
    ],
    ids=["stray-quote", "nan-score"],
)
def test_cli_shows_bad_data_as_a_clean_error(tiny_model, tmp_path, content, where):
    path = tmp_path / "data" / "sts" / "stsb" / "test.tsv"
    path.parent.mkdir(parents=True)
    path.write_text("sentence1\tsentence2\tscore\n" + content, encoding="utf-8")
    result = invoke(
        "sts",
        "--model",
        str(tiny_model),
        "--data-dir",
        str(tmp_path / "data"),
        "--task",
        "stsb",
        "--max-length",
        "32",
        "--no-cache",
        "--output",
        str(tmp_path / "r.json"),
    )
    assert result.exit_code == 2, result.output
    assert where in result.output and "Traceback" not in result.output
    assert not (tmp_path / "r.json").exists()


def _flip_a_stored_byte(part: Path) -> None:
    data = bytearray(part.read_bytes())
    data[data.rindex(b"\x93NUMPY") + 200] ^= 0xFF  # inside the embeddings member: its CRC-32 fails
    part.write_bytes(bytes(data))


def _rewrite(part: Path, rows: int | None = None, width: int | None = None, value: float = 1.0) -> None:
    with np.load(part) as stored:
        keys, embeddings = stored["keys"], stored["embeddings"]
    rows = len(keys) if rows is None else rows
    width = embeddings.shape[1] if width is None else width
    np.savez(part, keys=keys, embeddings=np.full((rows, width), value, dtype=np.float32))


CORRUPTIONS: dict[str, Callable[[Path], None]] = {
    "empty": lambda part: part.write_bytes(b""),
    "truncated": lambda part: part.write_bytes(part.read_bytes()[: part.stat().st_size // 2]),
    "bad-crc": _flip_a_stored_byte,
    "not-npz": lambda part: part.write_text("not an archive", encoding="utf-8"),
    "wrong-width": lambda part: _rewrite(part, width=5),
    "fewer-rows-than-keys": lambda part: _rewrite(part, rows=2),
    "non-finite": lambda part: _rewrite(part, value=float("nan")),
}


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_damaged_cache_part_is_a_miss_with_a_warning(tiny_model, tmp_path, caplog, corruption):
    texts = ["river bank money", "music and a guitar", "football goal", "cloud rain storm"]
    spec = resolve_model(tiny_model)
    reference = Embedder(spec, cache_dir=tmp_path).embed(texts)(texts)  # (4, 32); writes one part
    [part] = tmp_path.glob("*/part-*.npz")
    CORRUPTIONS[corruption](part)
    embedder = Embedder(spec, cache_dir=tmp_path)
    with captured_warnings(caplog):
        again = embedder.embed(texts)(texts)
    assert embedder.stats.encoded == len(texts) and embedder.stats.from_cache == 0
    np.testing.assert_allclose(again, reference, atol=1e-6)
    assert part.name in caplog.text and "encoding its texts again" in caplog.text


def test_wide_tables_keep_every_number_when_output_is_not_a_terminal(tiny_model, tmp_path, monkeypatch):
    """Eight clustering columns do not fit the 80 columns rich assumes for a file or a pipe."""
    monkeypatch.setenv("COLUMNS", "80")
    for task in CLUSTERING_TASKS:
        write_tsv(
            tmp_path / "clustering" / f"{task}.tsv",
            "text\tlabel",
            [f"{WORDS[i % 12]} {WORDS[(i * 5) % 12]} {i}\t{i % 3}" for i in range(12)],
        )
    result = invoke(
        "clustering",
        "--model",
        str(tiny_model),
        "--data-dir",
        str(tmp_path),
        "--no-cache",
        "--output",
        str(tmp_path / "c.json"),
    )
    assert result.exit_code == 0, result.output
    table = "\n".join(line for line in result.output.splitlines() if "│" in line or "┃" in line)
    scores = [r["primary"] for r in json.loads((tmp_path / "c.json").read_text())["models"][0]["results"]]
    assert "…" not in table
    for cell in [*CLUSTERING_TASKS, *(f"{score:.2f}" for score in scores), f"{np.mean(scores):.2f}"]:
        assert cell in table


def test_senteval_sentences_may_hold_unicode_line_separators(tmp_path):
    """Only line ends end a line: str.splitlines would also split at U+0085 (mojibake of a
    cp1252 ellipsis), U+2028 or a form feed and misalign the sentences with their gold scores."""
    (tmp_path / "STS.input.x.txt").write_text("wait\x85 what .\tno .\nyes \u2028 .\tok\x0c .\n", encoding="utf-8")
    (tmp_path / "STS.gs.x.txt").write_text("1\n2\n", encoding="utf-8")
    originals = sorted(tmp_path.glob("STS.*.txt"))
    CONVERTERS["senteval_sts"](originals, {"subsets": ["x"], "outputs": ["x.tsv"]}, tmp_path / "stage")
    pairs = load_sts_tsv(tmp_path / "stage" / "x.tsv")
    assert [(p.sentence1, p.sentence2, p.score) for p in pairs] == [
        ("wait\x85 what .", "no .", 1.0),
        ("yes \u2028 .", "ok\x0c .", 2.0),
    ]


# --- issue 25: eval commands (D7, D10, D11 and the weak spots) -------------------------------


@pytest.fixture(scope="module")
def eval_data(tmp_path_factory) -> Path:
    return make_data(tmp_path_factory.mktemp("eval-data"))


def _model_filled_with(tiny_model: Path, directory: Path, value: float) -> Path:
    """A copy of ``tiny_model`` whose every float weight is ``value`` (NaN: a diverged run;
    0: an encoder that maps every text to the zero vector)."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(tiny_model, directory)
    weights = load_file(directory / "model.safetensors")
    filled = {name: torch.full_like(w, value) if w.is_floating_point() else w for name, w in weights.items()}
    save_file(filled, directory / "model.safetensors", metadata={"format": "pt"})
    return directory


def _sts_rows(root: Path, scores: list[float], subsets: str = "") -> None:
    rows = [f"a {i}\tb {i}\t{score}\t{subsets[i % len(subsets)] if subsets else ''}" for i, score in enumerate(scores)]
    write_tsv(root / "sts" / "stsb" / "test.tsv", "sentence1\tsentence2\tscore\tsubset", rows)


def _labelled_rows(path: Path, labels: list[str]) -> None:
    write_tsv(path, "text\tlabel", [f"text {i}\t{label}" for i, label in enumerate(labels)])


def _clustering_rows(root: Path, labels: list[str]) -> None:
    _labelled_rows(root / "clustering" / "agnews.tsv", labels)


def _intent_rows(root: Path, labels: list[str]) -> None:
    for split in ("train", "test"):
        _labelled_rows(root / "intent" / "snips" / f"{split}.tsv", labels)


# (command, what it writes under the data dir, what the one-line error must say)
BAD_FILES = {
    "sts-constant-gold": ("sts", lambda root: _sts_rows(root, [3] * 8), "stsb/test.tsv: every gold score is 3"),
    "sts-constant-subset": (
        "sts",
        lambda root: _sts_rows(root, [0, 3, 2, 3, 4, 3, 6, 3], subsets="AB"),
        "stsb/test.tsv (subset 'B'): every gold score is 3",
    ),
    "sts-header-only": ("sts", lambda root: _sts_rows(root, []), "stsb/test.tsv has a header but no rows"),
    "sts-one-row": ("sts", lambda root: _sts_rows(root, [1]), "stsb/test.tsv has 1 pair"),
    "clustering-header-only": (
        "clustering",
        lambda root: _clustering_rows(root, []),
        "agnews.tsv has a header but no rows",
    ),
    "clustering-one-label": (
        "clustering",
        lambda root: _clustering_rows(root, ["sport"] * 6),
        "agnews.tsv has the single label 'sport'",
    ),
    "clustering-one-row": (
        "clustering",
        lambda root: _clustering_rows(root, ["1"]),
        "agnews.tsv has the single label '1'",
    ),
    "clustering-one-text-per-label": (
        "clustering",
        lambda root: _clustering_rows(root, [str(i) for i in range(6)]),
        "agnews.tsv: each of its 6 labels has one text",
    ),
    "intent-one-row": (
        "intent",
        lambda root: _intent_rows(root, ["x"]),
        "snips/train.tsv: class 'x' has 1 examples, too few for 5-shot sampling",
    ),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_unscorable_evaluation_file_is_refused_naming_it(tiny_model, tmp_path, case):
    """Constant gold scores gave Spearman nan (and NaN in the JSON); one label or one text per
    label clustered to 100.00; empty and one-row files failed in scipy, sklearn or the sampler."""
    command, make, message = BAD_FILES[case]
    make(tmp_path / "data")
    result = invoke(
        command,
        "--model",
        str(tiny_model),
        "--data-dir",
        str(tmp_path / "data"),
        "--no-cache",
        "--task",
        {"sts": "stsb", "clustering": "agnews", "intent": "snips"}[command],
        "--output",
        str(tmp_path / "r.json"),
    )
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split()) and "Traceback" not in result.output
    assert not (tmp_path / "r.json").exists()


def test_clustering_subsample_down_to_one_text_per_label_is_refused(tiny_model, eval_data, tmp_path):
    result = invoke(
        "clustering",
        "--model",
        str(tiny_model),
        "--data-dir",
        str(eval_data),
        "--task",
        "agnews",
        "--clustering-max-texts",
        "2",
        "--no-cache",
        "--output",
        str(tmp_path / "r.json"),
    )
    assert result.exit_code == 2, result.output
    expected = "agnews.tsv subsampled by --clustering-max-texts 2 (raise it): each of its 3 labels has one text"
    assert expected in " ".join(result.output.split()) and not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("command, task", [("sts", "stsb"), ("clustering", "agnews"), ("intent", "snips")])
def test_non_finite_embeddings_are_refused_naming_the_model(tiny_model, eval_data, tmp_path, command, task):
    broken = _model_filled_with(tiny_model, tmp_path / "diverged", float("nan"))
    result = invoke(
        command,
        "--model",
        str(broken),
        "--data-dir",
        str(eval_data),
        "--task",
        task,
        "--cache-dir",
        str(tmp_path / "cache"),
        "--output",
        str(tmp_path / "r.json"),
    )
    assert result.exit_code == 2, result.output
    assert f"{broken}: the encoder gave non-finite embeddings" in " ".join(result.output.split())
    assert not (tmp_path / "r.json").exists() and not list((tmp_path / "cache").glob("*/part-*"))


def test_constant_similarities_are_refused_naming_the_model(tiny_model, eval_data, tmp_path):
    collapsed = _model_filled_with(tiny_model, tmp_path / "collapsed", 0.0)  # every embedding is zero
    result = invoke(
        "sts",
        "--model",
        str(collapsed),
        "--data-dir",
        str(eval_data),
        "--task",
        "stsb",
        "--no-cache",
        "--output",
        str(tmp_path / "r.json"),
    )
    assert result.exit_code == 2, result.output
    assert f"{collapsed}: stsb: every pair has the same cosine similarity" in " ".join(result.output.split())
    assert not (tmp_path / "r.json").exists()


def test_results_json_never_holds_nan(tmp_path):
    from vascl_scale.eval.report import EvalReport, ModelReport
    from vascl_scale.eval.results import TaskResult

    report = EvalReport([ModelReport({"name": "m"}, {}, {}, [TaskResult("sts", "stsb", "spearman", float("nan"))])])
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        report.save(tmp_path / "r.json")
    assert not (tmp_path / "r.json").exists()


def _corpus(tmp_path: Path) -> Path:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(" ".join(WORDS[(i + j) % len(WORDS)] for j in range(6)) for i in range(12)) + "\n")
    return corpus


# (command and its own arguments, the output option, the path under tmp_path that a file blocks)
OUTPUTS = [
    ("sts", "--output", "afile/x.json"),
    ("sts", "--markdown", "afile/x.md"),
    ("sts", "--cache-dir", "afile"),
    ("sts", "--cache-dir", "afile/cache"),
    ("neighbours", "--output", "afile/x.json"),
    ("neighbours", "--plot", "afile/x.png"),
    ("neighbours", "--cache-dir", "afile"),
    ("augmentation", "--output", "afile/x.json"),
    ("augmentation", "--plot", "afile/x.png"),
]


def _command_args(command: str, tiny_model: Path, data: Path, tmp_path: Path) -> list[str]:
    common = ["--model", str(tiny_model), "--data-dir", str(data)]
    if command == "sts":
        return ["sts", *common, "--task", "stsb"]
    if command == "neighbours":
        return ["neighbours", *common, "--dataset", "agnews", "--k", "1"]
    return ["augmentation", *common, "--corpus", str(_corpus(tmp_path)), "--samples", "4"]


@pytest.mark.parametrize("command, option, blocked", OUTPUTS)
def test_output_path_under_a_file_is_refused_before_any_work(tiny_model, eval_data, tmp_path, command, option, blocked):
    (tmp_path / "afile").write_text("not a folder")
    defaults = {
        "--output": str(tmp_path / "o.json"),
        "--plot": str(tmp_path / "o.png"),
        "--cache-dir": str(tmp_path / "c"),
    }
    chosen = {**defaults, option: str(tmp_path / blocked)}
    if command == "sts":
        chosen.pop("--plot")
    args = [part for pair in chosen.items() for part in pair]
    result = invoke(*_command_args(command, tiny_model, eval_data, tmp_path), *args)
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"error: {option} {tmp_path / blocked}: ") and "is a file" in result.output, (
        result.output
    )
    assert "distinct texts" not in result.output and "Traceback" not in result.output  # nothing was encoded
    assert not list(tmp_path.glob("o.*"))


@pytest.mark.parametrize("command", ["sts", "neighbours", "augmentation"])
@pytest.mark.parametrize(
    "device, message",
    [
        ("bogus", "--device 'bogus' is not a device; use cpu, cuda or cuda:N"),
        ("cuda", "--device 'cuda': CUDA is not available here"),
        ("cuda:1", "--device 'cuda:1': CUDA is not available here"),
        ("meta", "--device 'meta': evaluation runs on cpu or cuda"),
    ],
)
def test_unusable_device_is_refused_before_any_work(
    tiny_model, eval_data, tmp_path, monkeypatch, command, device, message
):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # also on a machine with a GPU
    result = invoke(
        *_command_args(command, tiny_model, eval_data, tmp_path),
        "--device",
        device,
        "--no-cache",
        "--output",
        str(tmp_path / "o.json"),
    )
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"error: {message}") and len(result.output.strip().splitlines()) == 1, result.output


def test_cuda_device_index_beyond_the_visible_gpus_is_refused(tiny_model, eval_data, tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    result = invoke(*_command_args("sts", tiny_model, eval_data, tmp_path), "--device", "cuda:1", "--no-cache")
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: --device 'cuda:1': this machine has 1 CUDA device (cuda:0)"), result.output


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")  # torch's note on the protocol, not the refusal
def test_pickle_that_is_not_weights_is_refused_and_never_run(tiny_model, eval_data, tmp_path):
    import pickle

    marker = tmp_path / "payload-ran"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))  # unpickling would create the marker file

    evil = tmp_path / "evil"
    shutil.copytree(tiny_model, evil)
    (evil / "model.safetensors").unlink()
    (evil / "pytorch_model.bin").write_bytes(pickle.dumps(Payload()))
    result = invoke(
        "sts",
        "--model",
        str(evil),
        "--data-dir",
        str(eval_data),
        "--task",
        "stsb",
        "--no-cache",
        "--output",
        str(tmp_path / "r.json"),
    )
    assert result.exit_code == 2, result.output
    expected = f"{evil / 'pytorch_model.bin'} is not a weights file; only safetensors or weights-only pickles load"
    assert expected in " ".join(result.output.split()) and "Traceback" not in result.output
    assert not marker.exists()


def test_max_length_beyond_the_position_embeddings_is_clamped_with_a_line(tiny_model, tmp_path):
    """The tiny BERT has 64 position embeddings; texts of 120 tokens crashed at --max-length 1000."""
    long_text = " ".join(["river bank money"] * 40)
    write_tsv(
        tmp_path / "data" / "sts" / "stsb" / "test.tsv",
        "sentence1\tsentence2\tscore",
        [f"{long_text} {i}\tmusic {i}\t{i % 5}" for i in range(6)],
    )
    result = invoke(
        "sts",
        "--model",
        str(tiny_model),
        "--data-dir",
        str(tmp_path / "data"),
        "--task",
        "stsb",
        "--no-cache",
        "--max-length",
        "1000",
        "--output",
        str(tmp_path / "r.json"),
    )
    assert result.exit_code == 0, result.output
    assert "--max-length 1000 exceeds the model's 64 position embeddings; using 64" in " ".join(result.output.split())
    assert json.loads((tmp_path / "r.json").read_text())["models"][0]["model"]["max_length"] == 64


@pytest.mark.parametrize("kind", list(TSV_LOADERS))
def test_utf8_byte_order_mark_is_accepted(tmp_path, kind):
    name, header, row, _, load = TSV_LOADERS[kind]
    path = _write_with_quotes(tmp_path / name, header, row, 0, rows=6, opened=0, closed=None)
    plain = load(path)
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    assert load(path) == plain


@pytest.mark.parametrize("kind", list(TSV_LOADERS))
def test_header_only_file_is_refused_naming_it(tmp_path, kind):
    name, header, row, _, load = TSV_LOADERS[kind]
    path = _write_with_quotes(tmp_path / name, header, row, 0, rows=0, opened=0, closed=None)
    with pytest.raises(ValueError, match=rf"{Path(name).name} has a header but no rows"):
        load(path)


@pytest.mark.parametrize("kind", list(TSV_LOADERS))
def test_non_utf8_file_is_refused_naming_file_and_line(tmp_path, kind):
    name, header, row, column, load = TSV_LOADERS[kind]
    path = _write_with_quotes(tmp_path / name, header, row, column, rows=6, opened=0, closed=None)
    lines = path.read_bytes().split(b"\n")
    lines[4] = lines[4].replace(b" ", "\u00e9".encode("latin-1"), 1)  # a Latin-1 e-acute on line 5
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(ValueError, match=rf"{Path(name).name}:5: not UTF-8 text \(byte 0xe9\)"):
        load(path)


@pytest.mark.parametrize("kind", list(TSV_LOADERS))
def test_overlong_unquoted_field_is_reported_as_too_long(tmp_path, kind):
    name, header, row, column, load = TSV_LOADERS[kind]
    path = _write_with_quotes(tmp_path / name, header, row, column, rows=6, opened=0, closed=None)
    lines = path.read_text(encoding="utf-8").split("\n")
    fields = lines[3].split("\t")
    fields[column] = "word " * 40_000  # 200 kB, no quote anywhere
    lines[3] = "\t".join(fields)
    path.write_text("\n".join(lines), encoding="utf-8")
    with pytest.raises(ValueError, match=rf"{Path(name).name}:4: a field on this line is longer than 131072 ") as err:
        load(path)
    assert "quoted field" not in str(err.value)

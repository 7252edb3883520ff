"""More data-layer defects found by probing: teacher scores that overflow (a 400-digit integer,
1e300, 3e38: ``data prepare`` refuses them naming the file and record, as the loader and ``data
mine --teacher`` do), a reranker teacher with fewer positions than the max length, and a
teacher's ``config.json`` that is no JSON object; with property-based tests (hypothesis) of the
score values and the teacher configs. The NanoBEIR conversion's: test_download_nanobeir.py.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from tests.data_helpers import pairs_tsv, shard_rows, tiny_bert_dir
from tests.test_properties import examples
from vascl_scale.cli import app
from vascl_scale.data.columns import SCORE_LIMIT, parse_scores
from vascl_scale.data.mine import MineOptions, mine_shards
from vascl_scale.data.prepare import PrepareOptions, prepare_shards
from vascl_scale.teacher import is_reranker

SCORED = PrepareOptions(text_field="q,p", score_field="s")  # one candidate: one score per row


def _prepare(*arguments: object):
    return CliRunner().invoke(app, ["data", "prepare", *map(str, arguments)])


def _error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("error:")]


# --- D16, D17: scores that overflow a float, or float32, or margin_mse's squares ---

HUGE = 10**400  # 400 digits: float() of it raises OverflowError


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
@pytest.mark.parametrize(
    ("scores", "shown"),
    [
        ([HUGE, 0], "100000000000000000...000"),  # shown cut short
        ([1e300, 0], "1e+300"),  # finite in float64, not in float32
        ([3e38, -3e38], "3e+38"),  # a float32, whose difference and square are not
        ([1.0, 1e30], "1e+30"),  # margin_mse squares the margin
        ([1.0, 10001], "10001"),
    ],
    ids=["400-digits", "1e300", "3e38", "1e30", "just-over"],
)
def test_a_score_past_the_limit_is_refused_naming_the_file_and_record(tmp_path, suffix, scores, shown):
    rows = [("a query", "its passage", "a negative", [2.5, -1.0]), ("another query", "a passage", "another", scores)]
    source = tmp_path / f"scored{suffix}"
    if suffix == ".jsonl":
        source.write_text("".join(json.dumps({"q": q, "p": p, "n": n, "s": s}) + "\n" for q, p, n, s in rows))
    else:
        source.write_text("q,p,n,s\n" + "".join(f'{q},{p},{n},"{json.dumps(s)}"\n' for q, p, n, s in rows))
    result = _prepare(source, "-o", tmp_path / "out", "--text-field", "q,p,n", "--score-field", "s")
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    (line,) = _error_lines(result.output)
    assert line.startswith(f"error: {source}: record 2: --score-field s holds the score {shown}"), line
    assert f"not a finite number within +-{SCORE_LIMIT:g}" in line and "divide larger scores by a constant" in line
    assert not (tmp_path / "out").exists()


def test_scores_at_the_limit_are_kept_and_the_loader_refuses_a_member_past_it(tmp_path):
    source = tmp_path / "scored.jsonl"
    source.write_text(json.dumps({"q": "a", "p": "b", "n": "c", "s": [10000, -10000.0]}) + "\n")
    result = _prepare(source, "-o", tmp_path / "out", "--text-field", "q,p,n", "--score-field", "s")
    assert result.exit_code == 0, result.output
    assert json.loads(shard_rows(tmp_path / "out")[0][-1]) == [10000.0, -10000.0]
    # A shard written by hand: the loader's reading of a scores member takes the same range.
    assert parse_scores(b"[10000, -0.5]") == (10000.0, -0.5)
    for payload, message in (
        (f"[{HUGE}, 0]".encode(), "a scores member holds the score 1000"),
        (b"[1e300]", "a scores member holds the score 1e+300, not a finite number within +-10000"),
        (b"[NaN]", "a scores member holds the score nan"),
        (b"[]", "a scores member holds an empty list"),
        (b"[" * 100_000, "a scores member is not JSON"),
    ):
        with pytest.raises(ValueError, match=re.escape(message)):
            parse_scores(payload)


def test_a_teacher_giving_a_score_past_the_limit_stops_mining(tmp_path):
    pairs_tsv(tmp_path / "pairs.tsv", 8)

    def encode(texts: list[str]) -> np.ndarray:
        return np.random.default_rng(0).standard_normal((len(texts), 8))

    def teacher(anchors: list[str], candidates: list[str]) -> np.ndarray:
        return np.full(len(anchors), 2e4, dtype=np.float32)

    options = MineOptions(text_field="query,answer", margin=None, search="exact")
    with pytest.raises(
        ValueError, match=r"the --teacher's list of scores for the row of anchor '.*' holds the score 20000\.0"
    ):
        mine_shards([tmp_path / "pairs.tsv"], tmp_path / "out", options, encode, {}, teacher=teacher)
    assert not (tmp_path / "out").exists()


# Property: whatever numbers (or other JSON) a score field holds, data prepare writes them as
# they are when each is a number within the limit, else stops with a ValueError naming the file
# and the record; never an OverflowError or a traceback.
_NUMBERS = st.one_of(
    st.integers(),
    st.integers(min_value=-(10**1000), max_value=10**1000),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=-2 * SCORE_LIMIT, max_value=2 * SCORE_LIMIT),
    st.sampled_from([SCORE_LIMIT, -SCORE_LIMIT, 3.4e38, 3e38, 1e300, 1e30, math.ulp(0.0)]),
)
_JSON = st.recursive(
    st.none() | st.booleans() | _NUMBERS | st.text(max_size=20), lambda inner: st.lists(inner, max_size=3), max_leaves=6
)


def _in_range(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and -SCORE_LIMIT <= value <= SCORE_LIMIT


@examples(60)
@given(value=st.one_of(st.lists(_NUMBERS, min_size=1, max_size=1), _JSON))
def test_property_a_score_field_is_written_exactly_or_refused_naming_the_record(value):
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "scored.jsonl"
        good = {"q": "a query", "p": "its passage", "s": [0.5]}
        source.write_text(json.dumps(good) + "\n" + json.dumps({**good, "s": value}) + "\n")
        is_scores = isinstance(value, list) and len(value) == 1 and _in_range(value[0])
        try:
            result = prepare_shards([source], Path(folder) / "out", SCORED, show_progress=False)
        except ValueError as err:
            assert not is_scores, err
            assert str(err).startswith(f"{source}: record 2: --score-field s "), err
            return
        # Kept: the scores as written; or no value (null, "", []... of a string): missing_column.
        written = [json.loads(row[-1]) for row in shard_rows(Path(folder) / "out")]
        if is_scores:
            assert written == [[0.5], [float(value[0])]]
        else:
            assert value is None or isinstance(value, str), value  # a string is parsed as the scores' JSON text
            assert written[0] == [0.5] and result.dropped["missing_column"] + result.samples == 2


@examples(40)
@given(cell=st.one_of(_NUMBERS.map(lambda number: f"[{number}]"), st.text(max_size=30)))
def test_property_a_csv_score_cell_is_written_or_refused_naming_the_record(cell):
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "scored.csv"
        quoted = '"' + cell.replace('"', '""') + '"'
        source.write_text(f'q,p,s\na query,its passage,"[0.5]"\nanother,its answer,{quoted}\n', encoding="utf-8")
        try:
            prepare_shards([source], Path(folder) / "out", SCORED, show_progress=False)
        except ValueError as err:
            assert str(err).startswith(f"{source}: record 2: --score-field s "), err
            return
        written = [json.loads(row[-1]) for row in shard_rows(Path(folder) / "out")]
        assert all(len(scores) == 1 and abs(scores[0]) <= SCORE_LIMIT for scores in written), written


# --- D14, D15: the teacher's positions and its config.json ---


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return tiny_bert_dir(tmp_path_factory.mktemp("model") / "tiny")


def _mine(tmp_path: Path, model: Path, teacher: Path, *options: str):
    return CliRunner().invoke(
        app,
        [
            "data", "mine", str(tmp_path / "pairs.tsv"), "--model", str(model), "--text-field", "query,answer",
            "--output", str(tmp_path / "mined"), "--margin", "none", "--no-cache", "--teacher", str(teacher), *options,
        ],
    )  # fmt: skip


def test_a_reranker_with_fewer_positions_than_the_max_length_scores_pairs_cut_to_them(tmp_path, tiny_model):
    reranker = tiny_bert_dir(tmp_path / "reranker", seed=1, num_labels=1)  # 32 positions
    rows = [
        (f"question {i} " + "about a long subject " * 6, f"answer {i} " + "on the same subject " * 6) for i in range(6)
    ]
    (tmp_path / "pairs.tsv").write_text("query\tanswer\n" + "".join(f"{q}\t{a}\n" for q, a in rows))
    result = _mine(tmp_path, tiny_model, reranker, "--max-length", "64")
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    flat = " ".join(result.output.split())
    assert (
        f"--teacher {reranker}: --max-length 64 exceeds the teacher's 32 position embeddings; its pairs are cut to 32 tokens"
        in flat
    )
    manifest = json.loads((tmp_path / "mined" / "manifest.json").read_text())
    assert manifest["miner"]["teacher"]["max_length"] == 32 and manifest["columns"][-1] == "scores"
    assert len(shard_rows(tmp_path / "mined")) == 6


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("[]", "config.json holds [], not a JSON object"),
        ('"BertModel"', "config.json holds 'BertModel', not a JSON object"),
        ("{not json", "config.json cannot be read as JSON (Expecting property name"),
        ('{"architectures": "BertForSequenceClassification"}', "\"architectures\" is 'BertForSequenceClassification'"),
    ],
    ids=["list", "string", "invalid", "architectures-a-string"],
)
def test_a_teacher_config_that_is_no_json_object_is_one_line_naming_the_file(tmp_path, tiny_model, config, message):
    teacher = tmp_path / "teacher"
    teacher.mkdir()
    (teacher / "config.json").write_text(config)
    pairs_tsv(tmp_path / "pairs.tsv", 6)
    result = _mine(tmp_path, tiny_model, teacher)
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    (line,) = _error_lines(result.output)
    assert f"error: --teacher: {teacher / 'config.json'}" in line and message in line, line
    assert "restore the model's config.json" in line and not (tmp_path / "mined").exists()


_CONFIGS = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=3),
    max_leaves=8,
)


@examples(80)
@given(
    config=st.one_of(
        _CONFIGS.map(json.dumps),
        st.dictionaries(st.just("architectures"), _CONFIGS | st.lists(st.text(max_size=30))).map(json.dumps),
        st.text(max_size=40),
        st.binary(max_size=40).map(lambda raw: raw.decode("latin-1")),
    )
)
def test_property_a_teacher_config_is_read_or_refused_naming_the_file(config):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "config.json"
        path.write_text(config, encoding="utf-8")
        try:
            kind = is_reranker(Path(folder))
        except ValueError as err:
            assert f"--teacher: {path}" in str(err) and "\n" not in str(err), err
            return
        architectures = json.loads(config).get("architectures") or []
        assert kind == any(name.endswith("ForSequenceClassification") for name in architectures)

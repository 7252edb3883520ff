"""tools/decoder_memory.py: its counts against sums written out by hand, and the page that prints it."""

from __future__ import annotations

from pathlib import Path

from tools import decoder_memory

REPO = Path(__file__).resolve().parents[1]


def test_qwen3_0_6b_counts_match_a_hand_computed_sum() -> None:
    qwen3 = next(m for m in decoder_memory.MODELS if m.name == "Qwen3-0.6B")
    # r (in + out) per linear layer of one layer: q 1024 -> 2048, k and v 1024 -> 1024, o 2048 -> 1024,
    # gate and up 1024 -> 3072, down 3072 -> 1024; 28 layers.
    per_layer = 16 * ((1024 + 2048) + 2 * (1024 + 1024) + (2048 + 1024) + 2 * (1024 + 3072) + (3072 + 1024))
    assert per_layer == 360_448
    assert qwen3.lora_parameters(16) == 28 * per_layer == 10_092_544
    # Embeddings, 28 x (7 weights, 2 RMSNorms of 1024, q and k norms of 128), the final norm.
    weights = 1024 * 2048 + 2 * 1024 * 1024 + 2048 * 1024 + 2 * 1024 * 3072 + 3072 * 1024
    assert qwen3.parameters() == 151_936 * 1024 + 28 * (weights + 2 * 1024 + 2 * 128) + 1024 == 596_049_920
    assert qwen3.head_parameters() == 1024 * 1024 + 1024 * 128  # ProjectionHead: no biases


def test_the_head_count_is_the_models() -> None:
    from vascl_scale.model import ProjectionHead

    qwen3 = decoder_memory.MODELS[0]
    head = ProjectionHead(qwen3.hidden, decoder_memory.HEAD_DIM)
    assert sum(p.numel() for p in head.parameters()) == qwen3.head_parameters()


def test_memory_terms_follow_their_formulas() -> None:
    qwen3 = decoder_memory.MODELS[0]
    terms = decoder_memory.memory(qwen3, 2048, devices=8, chunk=64, length=512, views=3)
    assert terms["embeddings"] == 2 * 256 * 3 * 1024 * 4  # b = 2048 / 8 rows, 3 columns, float32, and gradients
    assert terms["logits"] == 3 * 256 * 2 * 2048 * 4
    assert terms["activations"] == 28 * qwen3.stored[0] * 64 * 512 * 1024
    assert terms["checkpointed"] < terms["activations"]
    chunk = decoder_memory.largest_chunk(qwen3, 2048)
    assert decoder_memory.totals(decoder_memory.memory(qwen3, 2048, chunk=chunk))[0] <= 70 * 2**30
    assert decoder_memory.totals(decoder_memory.memory(qwen3, 2048, chunk=chunk + 1))[0] > 70 * 2**30


def test_the_page_holds_the_tables_as_the_tool_prints_them() -> None:
    page = (REPO / "docs" / "batch-arithmetic.md").read_text(encoding="utf-8")
    assert decoder_memory.main_tables() in page, "rerun `python -m tools.decoder_memory` and paste its output"

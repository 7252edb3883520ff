"""The exact chunked top-k search that ``data mine`` and ``eval retrieval`` share: against one
matrix product and a float64 brute force, its tie order (the earlier row; -0.0 equal to 0.0) in
every chunking, its keys, and faiss against torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vascl_scale import search
from vascl_scale.search import top_k_search

needs_faiss = pytest.mark.skipif(search.faiss_module() is None, reason="faiss is not installed (pip install faiss-cpu)")


def integer_vectors(seed: int, rows: int, duplicates: bool = False) -> np.ndarray:
    """Small integer coordinates: every inner product is an exact float32 integer whatever the
    order of summation, so the backends see the same scores and many exact ties."""
    rng = np.random.default_rng(seed)
    vectors = rng.integers(-2, 3, size=(rows, 6)).astype(np.float32)
    if duplicates:
        vectors[rows // 2 :] = vectors[: rows - rows // 2]  # each document of the first half again, later
    return vectors


def unit_vectors(rows: int, width: int, seed: int) -> np.ndarray:
    vectors = np.random.default_rng(seed).standard_normal((rows, width)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def full_ranking(queries: np.ndarray, documents: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    scores = queries @ documents.T  # (Q, N), exact integers
    rows = np.argsort(-scores, axis=1, kind="stable")[:, :k]  # equal scores in corpus order
    return np.take_along_axis(scores, rows, axis=1), rows


@pytest.mark.parametrize("chunk_size, query_block", [(1, 4), (7, 3), (100, 1000), (1000, 5)])
def test_chunked_search_equals_one_matrix_search(chunk_size, query_block):
    queries, documents = integer_vectors(0, 23), integer_vectors(1, 250, duplicates=True)
    expected_scores, expected_rows = full_ranking(queries, documents, 100)
    scores, rows = top_k_search(queries, documents, 100, "torch", chunk_size, query_block)
    np.testing.assert_array_equal(rows, expected_rows)
    np.testing.assert_array_equal(scores, expected_scores)
    # fewer documents than k: every document, ranked
    scores, rows = top_k_search(queries, documents[:40], 100, "torch", chunk_size, query_block)
    np.testing.assert_array_equal(rows, full_ranking(queries, documents[:40], 40)[1])


@pytest.mark.parametrize("chunk_size", [1, 3, 16, 53, 100])
def test_real_valued_search_equals_a_float64_brute_force(chunk_size):
    anchors, pool = unit_vectors(9, 6, seed=1), unit_vectors(53, 6, seed=2)
    full = anchors.astype(np.float64) @ pool.astype(np.float64).T  # (9, 53)
    for k in (1, 7, 53):
        order = np.array([sorted(range(len(pool)), key=lambda j: (-row[j], j))[:k] for row in full])
        scores, rows = top_k_search(anchors, pool, k, "torch", chunk_size, chunk_size)
        assert scores.shape == rows.shape == (9, k)
        np.testing.assert_array_equal(rows, order)
        np.testing.assert_allclose(scores, np.take_along_axis(full, order, axis=1), atol=1e-6)


def test_ties_go_to_the_earlier_row_and_negative_scores_rank_right():
    documents = np.array([[1.0, 0.0], [-1.0, 0.0], [1.0, 0.0], [0.0, 0.0], [-0.5, 0.0], [1.0, 0.0]], np.float32)
    scores, rows = top_k_search(np.array([[1.0, 0.0], [-1.0, 0.0]], np.float32), documents, 4, "torch", 2)
    assert rows.tolist() == [[0, 2, 5, 3], [1, 4, 3, 0]]
    assert scores.tolist() == [[1.0, 1.0, 1.0, 0.0], [1.0, 0.5, 0.0, -1.0]]
    # -0.0 and 0.0 are one score: the last query scores 0 with every row but 2, -0.0 with row 5
    pool = np.array([[1, 0], [2, 0], [0, 1], [2, 0], [1, 0], [-1, 0], [0, 0], [2, 0]], dtype=np.float32)
    anchors = np.array([[1, 0], [-1, 0], [1, 1], [0, -1]], dtype=np.float32)
    expected = [[1, 3, 7, 0, 4], [5, 2, 6, 0, 4], [1, 3, 7, 0, 2], [0, 1, 3, 4, 5]]
    for chunk_size in (1, 2, 3, 8):
        scores, rows = top_k_search(anchors, pool, 5, "torch", chunk_size, 2)
        assert rows.tolist() == expected, chunk_size
        np.testing.assert_array_equal(scores, np.take_along_axis(anchors @ pool.T, rows, axis=1))


def test_keys_decode_to_the_scores_and_rows_they_encode():
    scores = torch.tensor([[0.5, -0.5, 0.0, -0.0, 1e-30, -1e-30, 3.0, -3.0]])
    rows = torch.arange(8)[None, :]
    keys = search._keys(scores, rows)
    decoded_scores, decoded_rows = search._decode(keys)
    np.testing.assert_array_equal(decoded_scores, (scores + 0.0).numpy())  # -0.0 comes back as 0.0
    np.testing.assert_array_equal(decoded_rows, rows.numpy())
    # descending keys: scores descending; 0.0 and -0.0 are one score, so the earlier row comes first
    assert torch.argsort(keys[0], descending=True).tolist() == [6, 0, 4, 2, 3, 5, 1, 7]


@needs_faiss
@pytest.mark.parametrize("chunk_size", [60, 10_000])
def test_faiss_and_torch_give_the_same_top_k(chunk_size):
    queries, documents = integer_vectors(2, 30), integer_vectors(3, 400, duplicates=True)
    by_faiss = top_k_search(queries, documents, 100, "faiss", chunk_size, 8)
    by_torch = top_k_search(queries, documents, 100, "torch", chunk_size, 8)
    np.testing.assert_array_equal(by_faiss[1], by_torch[1])
    np.testing.assert_array_equal(by_faiss[0], by_torch[0])
    np.testing.assert_array_equal(by_torch[1], full_ranking(queries, documents, 100)[1])
    # real-valued unit vectors: the same rows, scores equal up to the last bits
    queries, documents = unit_vectors(40, 16, seed=3), unit_vectors(500, 16, seed=4)
    by_faiss = top_k_search(queries, documents, 100, "faiss", chunk_size)
    by_torch = top_k_search(queries, documents, 100, "torch", chunk_size)
    np.testing.assert_array_equal(by_faiss[1][:, :10], by_torch[1][:, :10])
    np.testing.assert_allclose(by_faiss[0], by_torch[0], atol=1e-6)


def test_search_without_faiss_falls_back_to_torch(monkeypatch):
    monkeypatch.setattr(search, "faiss_module", lambda: None)
    assert search.resolve_search("auto") == "torch"
    with pytest.raises(ValueError, match="faiss is not installed"):
        search.resolve_search("faiss")

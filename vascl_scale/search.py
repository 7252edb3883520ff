"""Exact top-k search by inner product, in chunks: how ``data mine`` finds its candidates and
``eval retrieval`` its documents.

The documents (N, d) are scored a chunk of ``chunk_size`` rows at a time against a block of
``query_block`` queries, each chunk's candidates merged into a running top-k, so the search's own
memory stays about ``40 * query_block * chunk_size`` bytes (scores, their keys and the merge's
temporaries: about 200 MB at the defaults) beside the vectors, never queries x documents. A chunk
is scored by a flat inner-product faiss index (``IndexFlatIP``, exact) when faiss imports
(``search`` auto or faiss), else by a torch matrix product (torch); the two agree up to the last
bits of a score.

Each candidate is ranked by one integer key, the score's order in its high 32 bits and the
document's row in its low 32, so equal scores go to the earlier row and a result does not depend
on the chunking; faiss, which picks freely among rows tied at its last place, is asked for one
more, and a query whose last two are tied is scored by torch for that chunk.
"""

from __future__ import annotations

import numpy as np
import torch

from vascl_scale.log import LoopProgress

SEARCHES = ("auto", "faiss", "torch")
CHUNK_SIZE = 8192  # documents scored at a time
QUERY_BLOCK = 512  # queries scored at a time
# A candidate's key (_keys): the score's order in the high 32 bits, ROW_LIMIT - its row in the low 32.
_SHIFT = 1 << 32
_ROW_LIMIT = _SHIFT - 1
_MAGNITUDE = 0x7FFFFFFF


def faiss_module():
    """The faiss module, or None when it is not installed (the ``faiss`` extra)."""
    try:
        import faiss
    except ImportError:
        return None
    return faiss


def resolve_search(search: str = "auto") -> str:
    """``faiss`` or ``torch``: ``auto`` is faiss when it imports."""
    if search not in SEARCHES:
        raise ValueError(f"search must be one of {', '.join(SEARCHES)}; got {search!r}")
    if search == "faiss" and faiss_module() is None:
        raise ValueError("search 'faiss': faiss is not installed; pip install 'vascl-scale[faiss]', or use torch")
    if search == "auto":
        return "faiss" if faiss_module() is not None else "torch"
    return search


def _keys(scores: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """One int64 key per candidate, larger for a higher score and, on equal scores, for the
    earlier corpus row: the float32 score mapped onto an int32 of the same order (a negative
    float's magnitude bits flipped; + 0.0 first makes -0.0 equal to 0.0) times 2^32, plus
    ROW_LIMIT - row."""
    bits = (scores.float() + 0.0).view(torch.int32)
    ordered = bits ^ ((bits >> 31) & _MAGNITUDE)  # (..., n) int32 in the floats' order
    return ordered.to(torch.int64) * _SHIFT + (_ROW_LIMIT - rows)


def _decode(keys: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """(scores float32, rows int64) of :func:`_keys`' keys, its inverse."""
    ordered = torch.div(keys, _SHIFT, rounding_mode="floor")  # the int32 of the score, as int64
    rows = _ROW_LIMIT - (keys - ordered * _SHIFT)
    bits = (ordered ^ ((ordered >> 31) & _MAGNITUDE)).to(torch.int32)
    return bits.view(torch.float32).numpy(), rows.numpy()


def _torch_candidates(block: torch.Tensor, chunk: np.ndarray, start: int) -> torch.Tensor:
    """Keys (b, c) of every document of ``chunk`` (rows ``start ..``) for the queries ``block``."""
    scores = block @ torch.from_numpy(chunk).T  # (b, c)
    return _keys(scores, torch.arange(start, start + len(chunk))[None, :])


def _faiss_candidates(index, block: torch.Tensor, chunk: np.ndarray, start: int, depth: int) -> torch.Tensor:
    """Keys (b, <= depth) of the chunk's best documents for each query, by faiss's search of
    ``index`` (the chunk's). faiss picks freely among documents tied at its last place, so it
    is asked for one more: a query whose last two scores are equal may have left out an
    earlier document of that score, and its keys come from :func:`_torch_candidates`."""
    wanted = min(depth + 1, len(chunk))
    scores, rows = index.search(block.numpy(), wanted)  # (b, wanted) each, best first
    kept = min(depth, wanted)
    candidates = _keys(torch.from_numpy(scores[:, :kept]), torch.from_numpy(rows[:, :kept]) + start)
    if wanted > depth:
        tied = np.flatnonzero(scores[:, depth - 1] == scores[:, depth])  # a tie across faiss's cut
        if len(tied):
            exact = _torch_candidates(block[tied], chunk, start)  # (t, c)
            candidates[tied] = torch.topk(exact, depth, dim=1).values
    return candidates


def top_k_search(
    queries: np.ndarray,
    documents: np.ndarray,
    k: int,
    search: str = "auto",
    chunk_size: int = CHUNK_SIZE,
    query_block: int = QUERY_BLOCK,
    show_progress: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` documents of highest inner product with each query, exactly.

    ``queries`` (Q, d) and ``documents`` (N, d) float32 (unit rows for cosine). Returns scores
    (Q, min(k, N)) float32 and corpus rows (Q, min(k, N)) int64, best first, equal scores in
    corpus order. ``search``: faiss, torch or auto (:func:`resolve_search`); both are exact and
    agree up to the last bits of a score (see the module docstring for the chunking).
    ``show_progress``: a progress line per chunk when there are several (off inside a caller's own).
    """
    backend = resolve_search(search)
    if chunk_size < 1 or query_block < 1 or k < 1:
        raise ValueError(f"k, chunk_size and query_block must be >= 1; got {k}, {chunk_size}, {query_block}")
    if len(documents) > _ROW_LIMIT:
        raise ValueError(f"a corpus of {len(documents)} documents is more than this search's 2^32 - 1")
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    documents = np.ascontiguousarray(documents, dtype=np.float32)
    depth = min(k, len(documents))
    best = torch.empty((len(queries), 0), dtype=torch.int64)  # (Q, <= depth) keys of the chunks so far
    query_tensor = torch.from_numpy(queries)  # (Q, d)
    chunks = range(0, len(documents), chunk_size)
    progress = LoopProgress("searching", len(documents), "documents") if show_progress and len(chunks) > 1 else None
    if progress is not None:
        progress.start()
    try:
        for start in chunks:
            chunk = documents[start : start + chunk_size]  # (c, d)
            if backend == "faiss":
                index = faiss_module().IndexFlatIP(chunk.shape[1])
                index.add(chunk)
            blocks = []
            for first in range(0, len(queries), query_block):
                block = query_tensor[first : first + query_block]  # (b, d)
                if backend == "faiss":
                    candidates = _faiss_candidates(index, block, chunk, start, depth)  # (b, <= depth)
                else:
                    candidates = _torch_candidates(block, chunk, start)  # (b, c)
                merged = torch.cat([best[first : first + query_block], candidates], dim=1)  # (b, <= depth + c)
                blocks.append(torch.topk(merged, min(depth, merged.shape[1]), dim=1).values)  # sorted, best first
            best = torch.cat(blocks) if blocks else best
            if progress is not None:
                progress.update(start + len(chunk))
    finally:
        if progress is not None:
            progress.stop()
    return _decode(best)

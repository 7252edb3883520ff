"""``vascl-scale bench encode``: texts/s of evaluation's encoder on real text, batched by token
length, against the character-sorted batches it used before and against sentence-transformers.

Every system encodes the same ``--texts`` lines of a text file, end to end (tokenising included)
and float32 out, in rounds (A B C A B C ...) so that drift of a shared machine hits all alike,
after one untimed pass of each over its first batch; medians of the rounds are reported. The
systems:

- character-sorted: :meth:`SentenceEncoder.encode` as it was before it batched by tokens
  (:func:`character_sorted_encode`): texts sorted by characters, longest first, ``batch_size``
  at a time, each batch tokenised and padded to its longest;
- token-sorted: :meth:`SentenceEncoder.encode` (one row per ``--max-tokens`` budget): tokenised
  once, sorted by tokens, batches of at most ``batch_size`` texts and ``max_tokens`` padded
  tokens (:func:`vascl_scale.lengths.token_budget_groups`);
- the peer (``--compare``): ``SentenceTransformer.encode`` on the same model directory, which
  sorts by characters as the first does (without flash attention it pads every batch).

Padding is counted per batch from the texts' token lengths: padded tokens are rows x the batch's
longest row, and the real-token share is real tokens over padded ones. Model FLOPs are each
text's encoder forward at its own length (:meth:`vascl_scale.flops.EncoderShape.forward_flops`):
the work any system has to do, so model TFLOP/s (and MFU against ``--peak-tflops``) rank the
systems as texts/s do; computed TFLOP/s count the forwards as padded, what the device ran.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vascl_scale.bench import text_lines
from vascl_scale.flops import EncoderShape, tflops_and_mfu
from vascl_scale.lengths import token_budget_groups
from vascl_scale.model import SentenceEncoder
from vascl_scale.precision import autocast, local_device_type, precision_name, resolve_precision

CHARACTER_SORTED = "character-sorted (before)"
PEERS = ("sentence-transformers",)


def token_sorted_name(max_tokens: int) -> str:
    """The row of :meth:`SentenceEncoder.encode` under the token budget ``max_tokens`` (0: none)."""
    return f"token-sorted, {max_tokens}-token budget" if max_tokens else "token-sorted"


def character_batches(texts: Sequence[str], batch_size: int) -> list[list[int]]:
    """Text indices by characters, longest first (ties in input order), cut into ``batch_size`` rows."""
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]), reverse=True)
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


def peer_batches(texts: Sequence[str], batch_size: int) -> list[list[int]]:
    """The batches ``SentenceTransformer.encode`` forms: ``np.argsort`` of minus the characters (not a
    stable sort), cut into ``batch_size`` rows."""
    order = np.argsort([-len(text) for text in texts]).tolist()
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


@torch.no_grad()
def character_sorted_encode(
    model: SentenceEncoder, texts: Sequence[str], batch_size: int, max_length: int
) -> np.ndarray:
    """Embeddings (N, d) float32, in input order, as :meth:`SentenceEncoder.encode` made them before
    it batched by tokens: :func:`character_batches`, each tokenised and padded to its longest."""
    out = np.zeros((len(texts), model.hidden_size), dtype=np.float32)
    device = next(model.parameters()).device
    for rows in character_batches(texts, batch_size):
        batch = model.tokenizer(
            [texts[i] for i in rows], padding=True, truncation=True, max_length=max_length, return_tensors="pt"
        ).to(device)  # (r, L)
        inputs = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
        out[rows] = model(**inputs).float().cpu().numpy()  # (r, d)
    return out


def batch_costs(batches: Sequence[Sequence[int]], lengths: Sequence[int], shape: EncoderShape | None) -> dict[str, Any]:
    """Batches, padded tokens (rows x longest, summed) and the FLOPs of the padded forwards (0
    for an encoder that is not BERT-shaped)."""
    padded = computed = 0
    for rows in batches:
        longest = max(lengths[i] for i in rows)
        padded += len(rows) * longest
        computed += shape.forward_flops(len(rows), longest) if shape is not None else 0
    return {"batches": len(batches), "padded_tokens": padded, "computed_flops": computed}


def run_encode_bench(
    model: str,
    text: Path,
    texts: int = 2000,
    batch_size: int = 128,
    max_length: int = 128,
    precision: str = "auto",
    max_tokens: Sequence[int] = (0,),
    compare: str | None = None,
    repeats: int = 3,
    peak_tflops: float = 0.0,
) -> dict[str, Any]:
    """Time the character-sorted encode, the token-sorted one per budget of ``max_tokens`` and
    the peer (``compare``) on the first ``texts`` lines of ``text``, ``repeats`` alternating
    rounds; ValueError naming the option for a bad one, before the model loads."""
    import transformers

    from vascl_scale.hub import locate_model

    for option, value in (("--texts", texts), ("--batch-size", batch_size), ("--max-length", max_length)):
        if value < 1:
            raise ValueError(f"{option} must be >= 1; got {value}")
    if repeats < 1:
        raise ValueError(f"--repeats must be >= 1; got {repeats}")
    if not max_tokens or min(max_tokens) < 0:
        raise ValueError(f"--max-tokens takes budgets >= 0 (0: none), comma separated; got {list(max_tokens)}")
    if compare is not None and compare not in PEERS:
        raise ValueError(f"--compare takes {', '.join(PEERS)}; got {compare!r}")
    if precision == "fp16":
        raise ValueError("--precision takes auto, no or bf16 for evaluation; got 'fp16'")
    device = local_device_type()
    run_precision = resolve_precision(precision, device, "--precision")
    rows = text_lines(text, texts)
    directory = locate_model(model, "--model").directory
    transformers.utils.logging.disable_progress_bar()  # a bar per loaded model is noise in the report
    encoder = SentenceEncoder.from_pretrained(directory).to(device).eval()
    lengths = [len(ids) for ids in encoder.tokenizer(rows, truncation=True, max_length=max_length)["input_ids"]]
    shape = EncoderShape.of(encoder.encoder.config)
    model_flops = sum(shape.forward_flops(1, length) for length in lengths) if shape is not None else 0

    systems: dict[str, Callable[[list[str]], np.ndarray]] = {
        CHARACTER_SORTED: lambda batch: character_sorted_encode(encoder, batch, batch_size, max_length)
    }
    costs = {CHARACTER_SORTED: batch_costs(character_batches(rows, batch_size), lengths, shape)}
    for budget in dict.fromkeys(max_tokens):

        def ours(batch: list[str], budget: int = budget) -> np.ndarray:
            return encoder.encode(batch, batch_size=batch_size, max_length=max_length, max_tokens=budget)

        systems[token_sorted_name(budget)] = ours
        groups = token_budget_groups(torch.tensor(lengths), batch_size, budget)
        costs[token_sorted_name(budget)] = batch_costs([g.tolist() for g in groups], lengths, shape)
    if compare is not None:
        from sentence_transformers import SentenceTransformer

        peer = SentenceTransformer(str(directory), device=device)
        peer.max_seq_length = max_length

        def peer_encode(batch: list[str]) -> np.ndarray:
            return peer.encode(batch, batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False)

        systems[compare] = peer_encode
        costs[compare] = batch_costs(peer_batches(rows, batch_size), lengths, shape)

    times: dict[str, list[float]] = {name: [] for name in systems}
    embeddings: dict[str, np.ndarray] = {}
    cuda = device == "cuda"
    with autocast(device, run_precision):
        for run in systems.values():  # untimed: first calls allocate and pick kernels
            run(rows[:batch_size])
        for _ in range(repeats):
            for name, run in systems.items():
                if cuda:
                    torch.cuda.synchronize()
                started = time.perf_counter()
                embeddings[name] = run(rows)  # (N, d)
                if cuda:
                    torch.cuda.synchronize()
                times[name].append(time.perf_counter() - started)

    real_tokens = sum(lengths)
    reference = _unit_rows(embeddings[CHARACTER_SORTED])
    systems_report = {}
    for name, values in times.items():
        median = statistics.median(values)
        tflops, mfu = tflops_and_mfu(model_flops, median, peak_tflops)
        cost = costs[name]
        systems_report[name] = {
            **cost,
            "median_s": median,
            "times_s": values,
            "texts_per_s": len(rows) / median,
            "real_tokens_per_s": real_tokens / median,
            "real_token_share": real_tokens / cost["padded_tokens"],
            "model_tflops": tflops,
            "computed_tflops": cost["computed_flops"] / median / 1e12,
            "mfu": mfu,
            # rows compared at unit length: the peer's model ends in Normalize, ours does not normalise
            "max_abs_difference_unit_rows": float(np.abs(_unit_rows(embeddings[name]) - reference).max()),
        }
    result: dict[str, Any] = {
        "model": model,
        "text": str(text),
        "texts": len(rows),
        "real_tokens": real_tokens,
        "model_flops": model_flops,
        "batch_size": batch_size,
        "max_length": max_length,
        "precision": run_precision,
        "device": device,
        "threads": torch.get_num_threads(),
        "repeats": repeats,
        "peak_tflops": peak_tflops,
        "compare": compare,
        "systems": systems_report,
    }
    old = systems_report[CHARACTER_SORTED]["median_s"]
    result["speedup_over_character_sorted"] = {name: old / row["median_s"] for name, row in systems_report.items()}
    if compare is not None:
        peer_median = systems_report[compare]["median_s"]
        result["speedup_over_peer"] = {name: peer_median / row["median_s"] for name, row in systems_report.items()}
    return result


def _unit_rows(matrix: np.ndarray) -> np.ndarray:
    """Rows (N, d) scaled to unit length (a zero row stays zero)."""
    return matrix / np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)


def encode_table(result: dict[str, Any]):
    from rich.table import Table

    title = (
        f"bench encode: {result['texts']} texts of {result['text']} ({result['real_tokens']} tokens), batch "
        f"{result['batch_size']}, max length {result['max_length']}, {result['device']}, {result['threads']} threads, "
        f"{precision_name(result['precision'])}, medians of {result['repeats']} rounds"
    )
    table = Table(title=title)
    columns = ["system", "batches", "median s", "texts/s", "real tokens/s", "real-token share"]
    columns += ["model TFLOP/s", "computed TFLOP/s", "MFU", "x character-sorted"]
    columns += [f"x {result['compare']}"] if result["compare"] else []
    for column in columns:
        table.add_column(column, justify="right")
    for name, row in result["systems"].items():
        cells = [
            name,
            str(row["batches"]),
            f"{row['median_s']:.3f}",
            f"{row['texts_per_s']:.1f}",
            f"{row['real_tokens_per_s']:,.0f}",
            f"{row['real_token_share']:.1%}",
            f"{row['model_tflops']:.3g}",
            f"{row['computed_tflops']:.3g}",
            "-" if row["mfu"] is None else f"{row['mfu']:.1%}",
            f"{result['speedup_over_character_sorted'][name]:.2f}",
        ]
        cells += [f"{result['speedup_over_peer'][name]:.2f}"] if result["compare"] else []
        table.add_row(*cells)
    return table

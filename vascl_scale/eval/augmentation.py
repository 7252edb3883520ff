"""Figure 3(b): how far an explicit augmentation moves a sentence in a model's space.

For each model, augmentation (WDel, WNet, CTxt; :mod:`vascl_scale.data.augment`) and share of
words changed, the mean (and std) over a sample of sentences of cos(e(x), e(x')) between each
sentence x and its augmentation x'. The sample is drawn from a corpus file with a seeded
reservoir (one pass, constant memory); each sentence's augmentation is seeded by its index, so
every model sees the same augmented texts.
"""

from __future__ import annotations

import gzip
import random
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from vascl_scale.data.layout import seed_of
from vascl_scale.eval.sts import cosine_similarity_rows
from vascl_scale.figures import save_figure

Encode = Callable[[list[str]], np.ndarray]


def sample_sentences(path: str | Path, count: int, seed: int = 0, min_words: int = 3) -> list[str]:
    """``count`` non-empty lines of at least ``min_words`` words from a .txt[.gz] file, drawn
    uniformly (reservoir sampling), in file order."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"corpus {path} not found; pass --corpus FILE (one sentence a line, .txt or .txt.gz)")
    rng = random.Random(seed)
    chosen: list[tuple[int, str]] = []
    seen = 0
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        for number, line in enumerate(handle):
            text = line.strip()
            if len(text.split()) < min_words:
                continue
            seen += 1
            if len(chosen) < count:
                chosen.append((number, text))
            else:
                slot = rng.randrange(seen)
                if slot < count:
                    chosen[slot] = (number, text)
    if not chosen:
        raise ValueError(f"{path} has no line of {min_words} words or more")
    return [text for _, text in sorted(chosen)]


def augmented_texts(texts: Sequence[str], augmenter, kind: str, fraction: float, seed: int = 0) -> list[str]:
    """Each text through ``augmenter`` (:mod:`vascl_scale.data.augment`), text i seeded by
    (seed, kind, fraction, i): every model is compared on the same augmented texts."""
    rngs = [random.Random(seed_of(seed, "eval-augmentation", kind, fraction, i)) for i in range(len(texts))]
    return augmenter(list(texts), rngs)


def augmentation_cosines(encode: Encode, originals: Sequence[str], augmented: Sequence[str]) -> dict:
    """Mean, std and count of cos(e(x), e(x')) over the pairs (float64)."""
    cosines = cosine_similarity_rows(encode(list(originals)), encode(list(augmented)))  # (N,)
    unchanged = sum(a == b for a, b in zip(originals, augmented))
    return {"mean": float(cosines.mean()), "std": float(cosines.std()), "pairs": len(cosines), "unchanged": unchanged}


def plot_augmentation_cosines(results: dict[str, dict[str, dict[str, dict]]], path: str | Path) -> Path:
    """One line per (model, augmentation): mean cosine against the share of words changed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6.4, 4.2))
    markers = {"wdel": "o", "wnet": "s", "ctxt": "^"}
    for model, by_kind in results.items():
        for kind, by_fraction in by_kind.items():
            fractions = sorted(by_fraction, key=float)
            axis.plot(
                [100 * float(f) for f in fractions],
                [by_fraction[f]["mean"] for f in fractions],
                marker=markers.get(kind, "x"),
                label=f"{model}: {kind}",
            )
    axis.set_xlabel("words changed (%)")
    axis.set_ylabel("mean cos(e(x), e(x'))")
    axis.set_title("Explicit augmentations in embedding space (Figure 3b)")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    return save_figure(figure, path)

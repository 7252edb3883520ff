"""Writing matplotlib figures: one helper for every plot the commands save."""

from __future__ import annotations

from pathlib import Path


def save_figure(figure, path: str | Path, dpi: int = 120) -> Path:
    """Save ``figure`` as ``path`` (its folder made), close it, and return the path."""
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=dpi)
    plt.close(figure)
    return path

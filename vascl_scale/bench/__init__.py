"""Benchmarks: every performance claim of the project comes from one of these commands.

- :mod:`vascl_scale.bench.step`: ``bench step``, the training step's time (VaSCL vs SimCSE);
- :mod:`vascl_scale.bench.comm`: ``bench comm``, bytes of the gathers against gradient traffic;
- :mod:`vascl_scale.bench.data`: ``bench data``, the training stream against the bare tokenizer;
- :mod:`vascl_scale.bench.matmul`: ``bench matmul``, a large matrix product's TFLOP/s (the practical peak);
- :mod:`vascl_scale.bench.encode`: ``bench encode``, evaluation's texts/s against sentence-transformers'.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def text_lines(path: Path, count: int, repeat: bool = False) -> list[str]:
    """The first ``count`` non-blank lines of ``--text`` (``.gz`` read as gzip), stripped; a file
    with fewer is cycled when ``repeat``, else refused. ValueError naming ``--text``."""
    import gzip

    if not path.is_file():
        raise ValueError(f"--text {path}: no such file; pass a text file of one sentence per line (.gz allowed)")
    opener = gzip.open if path.name.endswith(".gz") else open
    lines: list[str] = []
    with opener(path, "rt", encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if line.strip():
                lines.append(line.strip())
                if len(lines) == count:
                    return lines
    if not lines:
        raise ValueError(f"--text {path}: holds no non-blank line")
    if not repeat:
        raise ValueError(f"--text {path} has {len(lines)} non-blank lines; --texts {count} asks for more")
    return [lines[index % len(lines)] for index in range(count)]


def save_result(result: dict[str, Any], path: Path) -> None:
    """Write a benchmark's result as JSON (``--output``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")

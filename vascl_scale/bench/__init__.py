"""Benchmarks: every performance claim of the project comes from one of these commands.

- :mod:`vascl_scale.bench.step`: ``bench step``, the training step's time (VaSCL vs SimCSE);
- :mod:`vascl_scale.bench.comm`: ``bench comm``, bytes of the gathers against gradient traffic;
- :mod:`vascl_scale.bench.data`: ``bench data``, the training stream against the bare tokenizer;
- :mod:`vascl_scale.bench.matmul`: ``bench matmul``, a large matrix product's TFLOP/s (the practical peak).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def save_result(result: dict[str, Any], path: Path) -> None:
    """Write a benchmark's result as JSON (``--output``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")

"""The named columns of a training sample: what a batch holds and objectives encode.

A sample holds one text per column: ``anchor`` (every sample has one) and ``positive``, its
second view. Which columns an objective encodes, and what stands in for a column the data
lacks, is its declaration (:mod:`vascl_scale.losses.spec`).

No torch: the config and the objectives' declarations import it.
"""

from __future__ import annotations

ANCHOR = "anchor"
POSITIVE = "positive"

"""What a mixed ``data.train`` is: its sources' names, the rows each gives a batch, the rules.

``data.train`` may list several sources, each ``{source, weight[, name, num_workers]}``
(:class:`vascl_scale.config.MixSource`); ``data.mix`` says how their samples meet in a batch
(:mod:`vascl_scale.data.mix` streams them):

per_batch   each global batch comes from one source, drawn with probability weight / sum of
            weights, so in-batch negatives share a domain (FlagEmbedding's
            ``same_dataset_within_batch``).
per_sample  each device batch of b rows holds a fixed number of rows of every source: the
            largest-remainder split of b by the weights (:func:`sample_quotas`), the same on
            every rank.

Every source must give the objective the same columns (:func:`check_same_columns`): a batch of
one source and a batch of another are the same kind of batch. No torch: the config imports this.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from fractions import Fraction

MIX_MODES = ("per_batch", "per_sample")
# A source's name: a key of the metrics (data/samples/<name>) and of the stream's saved state.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
# Endings stripped from a source's last path part to name it: "/data/wiki1m.txt.gz" -> "wiki1m".
_ENDINGS = (".gz", ".txt", ".tar")


def check_source_name(name: str) -> None:
    """ValueError unless ``name`` is a plain word (letters, digits, ``_.-``); the config names the key."""
    if not _NAME.fullmatch(name):
        raise ValueError(f"must be letters, digits, '_', '.' or '-' (it names the source in the metrics); got {name!r}")


def default_source_name(source: str, index: int) -> str:
    """The last path part of ``source`` without its endings, when a plain word; else ``source<index>``."""
    name = source.rstrip("/").rpartition("/")[2]
    while name.endswith(_ENDINGS):
        name = name[: name.rfind(".")]
    return name if _NAME.fullmatch(name) else f"source{index}"


def source_names(sources: Sequence[tuple[str, str | None]]) -> tuple[str, ...]:
    """Each (source, name or None) pair's name, given or :func:`default_source_name`; ValueError
    when two sources would share one (``data.train[i].name`` tells them apart)."""
    names = tuple(
        name if name is not None else default_source_name(source, index) for index, (source, name) in enumerate(sources)
    )
    for index, name in enumerate(names):
        first = names.index(name)
        if first != index:
            raise ValueError(
                f"data.train[{first}] and data.train[{index}] are both named {name!r}; give each source "
                "a distinct name (data.train[i].name)"
            )
    return names


def sample_quotas(weights: Sequence[float], names: Sequence[str], rows: int) -> tuple[int, ...]:
    """The rows of each source in a device batch of ``rows`` under ``per_sample``.

    Largest remainder (Hamilton's method) in exact rational arithmetic, so every machine gets
    the same split: source s first gets floor(rows * w_s / W), W the sum of weights, and the
    rows left go one each to the largest remainders, ties to the earlier source. A source left
    with no row would never be read: ValueError naming it.
    """
    total = sum(Fraction(weight) for weight in weights)
    shares = [Fraction(weight) * rows / total for weight in weights]
    quotas = [math.floor(share) for share in shares]
    by_remainder = sorted(range(len(shares)), key=lambda s: (quotas[s] - shares[s], s))
    for source in by_remainder[: rows - sum(quotas)]:
        quotas[source] += 1
    for index, quota in enumerate(quotas):
        if quota == 0:
            raise ValueError(
                f"data.train[{index}] ({names[index]}, weight {weights[index]:g}) gets none of the {rows} rows of a "
                "device batch under data.mix = per_sample; raise its weight or train.global_batch_size, or set "
                "data.mix to per_batch"
            )
    assert sum(quotas) == rows, (quotas, rows)
    return tuple(quotas)


def check_same_columns(columns: Mapping[str, Sequence[str]]) -> None:
    """ValueError unless every source (``where`` -> the columns it gives the objective) gives the
    same set: a mixed stream's batches all hold the same columns."""
    (first, expected), *rest = columns.items()
    for where, given in rest:
        if set(given) != set(expected):
            raise ValueError(
                f"{where} gives the objective the columns {', '.join(given)}, and {first} gives "
                f"{', '.join(expected)}: every source of a mixed data.train must give the same columns; "
                "prepare the sources with the same columns, or train on them in separate runs"
            )

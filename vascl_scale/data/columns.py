"""The named columns of a training sample: what shards store, a batch holds and objectives encode.

A sample holds one text per text column: ``anchor`` (every sample has one), ``positive``, then
hard negatives ``negative_0``, ``negative_1``, ... In a shard each text column is a tar member
``<key>.<column>.txt`` (UTF-8), with ``<key>.<column>.ids`` (int32 token ids) when ``data prepare
--tokenizer`` stored them; the single-text members ``<key>.txt`` / ``<key>.ids`` (shards written
before columns existed) are the anchor. ``manifest.json`` lists the columns under ``"columns"``;
a manifest without the list describes single-text shards, ``["anchor"]``.

Labelled pairs (PairSupCon's (text1, text2, pairsimi) rows) are the columns ``anchor``, ``paired``
and ``label`` (:data:`LABELLED_PAIR`): ``paired`` is the text paired with the anchor, similar to
it or not (so never read as a ``positive``), and ``label`` an integer column, 1 where the pair is
similar (an entailment) and 0 where it is not (a contradiction), stored as the tar member
``<key>.label.cls``: the label in ASCII digits (webdataset's ``cls`` convention), no token ids.

A batch of the training stream (:mod:`vascl_scale.data.loader`) maps each text column it holds
to the tokenizer's tensors, ``{column: {"input_ids", "attention_mask"[, "token_type_ids"]}}``,
each (b, L_column): every column padded to its own longest row; and a label column to one
LongTensor (b,). Which columns an objective encodes, what stands in for a column the data
lacks, and which label it reads, is its declaration (:mod:`vascl_scale.losses.spec`).

No torch: the config and the objectives' declarations import it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Collection, Sequence
from typing import Any

from vascl_scale.log import shown

ANCHOR = "anchor"
POSITIVE = "positive"
PAIRED = "paired"  # the text of a labelled pair beside its anchor: similar to it (label 1) or not (0)
LABEL = "label"
# Teacher scores per row: its anchor against each of its candidates, the positive then every hard
# negative (a tar member <key>.scores.json, a JSON list of numbers): distillation's column.
SCORES = "scores"
LABELS = (0, 1)  # the values of a label: 0 the pair is not similar, 1 it is
# Columns of one integer per sample (a tar member <key>.<column>.cls) instead of a text.
LABEL_COLUMNS = (LABEL,)
# Columns of a list of numbers per sample (a tar member <key>.<column>.json).
SCORE_COLUMNS = (SCORES,)
# The largest teacher score, in absolute value, that the scores column takes. A reranker's logits
# lie within about +-20 and a cosine within +-1; far beyond, the float32 the losses compute in
# keeps few digits of a margin (1e7 is a float32 step of 1), and margin_mse squares the margins
# (1e20 squared is past float32's 3.4e38). Within the limit every difference of two scores, and
# its square, is an exact-enough float32.
SCORE_LIMIT = 1e4
# The columns of numbers, not texts: nothing in them is tokenised.
VALUE_COLUMNS = LABEL_COLUMNS + SCORE_COLUMNS
# The columns of labelled pairs, in order.
LABELLED_PAIR = (ANCHOR, PAIRED, LABEL)
# The columns of a single-text sample: one sentence, which every objective reads as its anchor.
SINGLE_TEXT = (ANCHOR,)
# The columns that data.augment makes from each anchor.
AUGMENTED = (POSITIVE,)
TOKEN_KEYS = ("input_ids", "attention_mask", "token_type_ids")
# The keys of model.prompts: a text column, "negative" standing for every negative_<k>.
NEGATIVE = "negative"
PROMPT_COLUMNS = (ANCHOR, POSITIVE, PAIRED, NEGATIVE)
# What a column's name may be: it is also a tar member's name part, between two dots.
_COLUMN_NAME = re.compile(r"[a-z][a-z0-9_]*")


def text_hash(payload: bytes) -> int:
    """A row's text as a signed 64-bit integer (BLAKE2b): what ``loss.false_negatives:
    duplicates`` compares across ranks instead of the text, which never leaves its rank. Two
    different texts collide with probability about 2^-64 per pair."""
    return int.from_bytes(hashlib.blake2b(payload, digest_size=8).digest(), "little", signed=True)


def text_hash_column(column: str) -> str:
    """The batch key of ``column``'s text hashes, (b,) int64 (the loader's, when the objective
    masks duplicates): not a column name (it holds a dot), so it never meets a data column."""
    return f"{column}.hash"


def negative(index: int) -> str:
    """The name of hard negative ``index`` (0-based): ``negative_0``, ``negative_1``, ..."""
    return f"negative_{index}"


def prompt_of(prompts: dict[str, str], column: str) -> str:
    """The text put before ``column``'s texts (model.prompts): its own, "negative"'s for a hard
    negative, else none."""
    key = NEGATIVE if re.fullmatch(r"negative_[0-9]+", column) else column
    return prompts.get(key, "")


def negative_columns(available: Collection[str]) -> tuple[str, ...]:
    """The hard-negative columns of ``available``, in order: ``negative_0``, ``negative_1``, ... up
    to the first one it lacks (``data prepare`` numbers them from 0 without gaps)."""
    count = 0
    while negative(count) in available:
        count += 1
    return tuple(negative(index) for index in range(count))


def columns_of(count: int) -> tuple[str, ...]:
    """The columns of samples with ``count`` texts, in order: ``anchor``, ``positive``, ``negative_0``, ..."""
    assert count >= 1, count
    return (ANCHOR, POSITIVE, *(negative(index) for index in range(count - 2)))[:count]


def written_fields(columns: Sequence[str]) -> list[tuple[str, str | None]]:
    """The (value, token ids) sample fields ``data prepare`` writes for each column, in column
    order: ``<column>.txt`` / ``<column>.ids`` for a text, ``<column>.cls`` and no ids for a label.
    A single-text sample keeps ``txt`` / ``ids``, so its shards stay the bytes they were before
    columns existed (a reader takes them as the anchor, :func:`sample_fields`)."""
    if tuple(columns) == SINGLE_TEXT:
        return [("txt", "ids")]
    return [
        (f"{column}.cls", None)
        if column in LABEL_COLUMNS
        else (f"{column}.json", None)
        if column in SCORE_COLUMNS
        else (f"{column}.txt", f"{column}.ids")
        for column in columns
    ]


def sample_fields(column: str, kind: str) -> tuple[str, ...]:
    """The fields of a tar sample (``iter_tar_samples``) that hold ``column``'s ``kind``, ``"txt"``
    or ``"ids"``, in the order they are looked up: ``anchor.txt``, then the single-text ``txt``.
    A label column has one field whatever the kind, ``<column>.cls``."""
    if column in LABEL_COLUMNS:
        return (f"{column}.cls",)
    if column in SCORE_COLUMNS:
        return (f"{column}.json",)
    own = f"{column}.{kind}"
    return (own, kind) if column == ANCHOR else (own,)


def parse_label(payload: bytes) -> int:
    """The label a ``<key>.label.cls`` member holds; ValueError unless it is one of :data:`LABELS`."""
    text = payload.decode("ascii", "replace").strip()
    if text not in {str(value) for value in LABELS}:
        raise ValueError(f"a label member holds {shown(text)}, not one of {', '.join(map(str, LABELS))}")
    return int(text)


def checked_scores(values: object) -> tuple[float, ...]:
    """``values`` as teacher scores: a list of numbers (no booleans), each within
    +-:data:`SCORE_LIMIT` (so finite, whatever an integer's size); ValueError saying which is not,
    as the rest of a sentence that starts with what holds them ("holds ...")."""
    if not isinstance(values, list) or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        raise ValueError(f"holds {shown(values)}, not a list of numbers")
    # A comparison, not float(): an integer of 400 digits makes float() raise OverflowError.
    outside = next((v for v in values if not -SCORE_LIMIT <= v <= SCORE_LIMIT), None)  # NaN fails it too
    if outside is not None:
        raise ValueError(
            f"holds the score {shown(outside)}, not a finite number within +-{SCORE_LIMIT:g}, the range of a teacher "
            "score (a reranker's logit lies within about +-20, a cosine within +-1; divide larger scores by a "
            "constant, and for distill_kl loss.teacher_temperature by it too)"
        )
    return tuple(float(v) for v in values)


def parse_scores(payload: bytes) -> tuple[float, ...]:
    """The teacher scores a ``<key>.scores.json`` member holds: a non-empty JSON list of numbers
    within +-:data:`SCORE_LIMIT` (:func:`checked_scores`); ValueError otherwise."""
    try:
        values = json.loads(payload)
    except (ValueError, RecursionError) as err:  # ValueError: not UTF-8 or JSON, or an integer of 4300+ digits
        raise ValueError(f"a scores member is not JSON ({err})") from err
    if values == []:
        raise ValueError("a scores member holds an empty list, not one score per candidate")
    try:
        return checked_scores(values)
    except ValueError as err:
        raise ValueError(f"a scores member {err}") from None


def columns_to_read(
    available: Sequence[str], wanted: Collection[str] | None, augmented: bool, where: str
) -> tuple[str, ...]:
    """The columns a training stream reads of those the data has (``available``, in its order):
    the ``wanted`` ones, or all when None. ``data.augment`` (``augmented``) makes each positive
    from its anchor, so data with a positive of its own to read is refused, ``where`` named."""
    read = tuple(column for column in available if wanted is None or column in wanted)
    if augmented and POSITIVE in read:
        raise ValueError(
            f"data.augment makes each sample's {POSITIVE} from its {ANCHOR}, and {where} has a {POSITIVE} "
            f"column of its own; set data.augment to none to train on the data's {POSITIVE}s"
        )
    return read


def manifest_columns(manifest: dict[str, Any], where: str) -> tuple[str, ...]:
    """The columns a shard manifest lists (``SINGLE_TEXT`` without the list); ``where`` names the
    manifest in the error."""
    columns = manifest.get("columns", list(SINGLE_TEXT))
    valid = (
        isinstance(columns, list)
        and all(isinstance(column, str) and _COLUMN_NAME.fullmatch(column) for column in columns)
        and len(set(columns)) == len(columns)
        and ANCHOR in columns
    )
    if not valid:
        raise ValueError(
            f"{where}: columns {shown(columns)} must be a list of distinct column names (lower-case letters, digits, "
            f"'_') that holds {ANCHOR!r}; write the shards again with `vascl-scale data prepare`"
        )
    return tuple(columns)

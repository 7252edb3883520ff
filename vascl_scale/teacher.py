"""A teacher's scores of (anchor, candidate) pairs: what ``data mine --teacher`` writes as the
``scores`` column for ``distill_kl`` and ``margin_mse`` (:mod:`vascl_scale.losses.distill`).

Two kinds of teacher, told apart by the model directory's ``config.json``:

- a **reranker** (a cross-encoder: ``*ForSequenceClassification`` with one label, as
  sentence-transformers' CrossEncoder and BGE / MiniLM rerankers are saved) reads each pair
  together and scores it with its logit; its scores are in logit units (``loss.teacher_temperature``
  scales them for ``distill_kl``);
- an **encoder** (anything :func:`vascl_scale.encode.resolve_model` loads) embeds every distinct
  text once, through the embedding cache, and scores a pair by the cosine of its two embeddings:
  the student's own scale, which ``margin_mse`` needs.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np

from vascl_scale.hub import locate_model
from vascl_scale.log import LoopProgress, shown

logger = logging.getLogger(__name__)

# (anchors, candidates), as many of each -> (n,) float32 scores, pair i of anchors[i] and candidates[i]
TeacherScore = Callable[[list[str], list[str]], np.ndarray]


def is_reranker(directory: Path) -> bool:
    """Whether the model directory holds a cross-encoder (its config's architecture classifies
    sequences). A ``config.json`` that is not a JSON object, or whose ``architectures`` is not a
    list of class names, is a ValueError naming the file."""
    path = directory / "config.json"
    if not path.is_file():
        return False
    fix = "restore the model's config.json (save_pretrained writes it)"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as err:  # ValueError: not UTF-8, not JSON
        raise ValueError(f"--teacher: {path} cannot be read as JSON ({err}); {fix}") from None
    if not isinstance(config, dict):
        raise ValueError(f"--teacher: {path} holds {shown(config)}, not a JSON object; {fix}")
    architectures = config.get("architectures")
    if architectures is None:
        return False
    if not isinstance(architectures, list) or not all(isinstance(name, str) for name in architectures):
        raise ValueError(
            f'--teacher: {path}: "architectures" is {shown(architectures)}, not a list of class names such as '
            f'["BertForSequenceClassification"]; {fix}'
        )
    return any(name.endswith("ForSequenceClassification") for name in architectures)


def pair_length(directory: Path, max_length: int | None) -> int:
    """Tokens of a reranker's (anchor, candidate) pair: ``max_length`` (``--max-length``, else
    ``DEFAULT_MAX_LENGTH``), capped at the teacher's position embeddings and logged (a warning when
    asked for), as :func:`vascl_scale.encode.resolve_model` caps an encoder's: a longer pair would
    index past them."""
    from vascl_scale.encode import DEFAULT_MAX_LENGTH, position_limit

    length = max_length or DEFAULT_MAX_LENGTH
    limit = position_limit(directory)
    if limit is not None and length > limit:
        origin = "--max-length" if max_length else "the default max length"
        logger.log(
            logging.WARNING if max_length else logging.INFO,
            "--teacher %s: %s %d exceeds the teacher's %d position embeddings; its pairs are cut to %d tokens",
            directory, origin, length, limit, limit,
        )  # fmt: skip
        length = limit
    return length


class RerankerTeacher:
    """A cross-encoder's logit of each (anchor, candidate) pair, read together, in batches."""

    def __init__(self, directory: Path, batch_size: int, max_length: int, device: str) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(directory))
        self.model = AutoModelForSequenceClassification.from_pretrained(str(directory)).to(device).eval()
        labels = self.model.config.num_labels
        if labels != 1:
            raise ValueError(
                f"--teacher {directory} classifies pairs into {labels} labels; a reranker scores each pair with one "
                "logit (num_labels 1), as sentence-transformers' CrossEncoder saves it. Use such a reranker, or an "
                "encoder (its cosines)"
            )
        self.batch_size, self.max_length, self.device, self.torch = batch_size, max_length, device, torch

    def __call__(self, anchors: list[str], candidates: list[str]) -> np.ndarray:
        assert len(anchors) == len(candidates), (len(anchors), len(candidates))
        scores = np.empty(len(anchors), dtype=np.float32)
        with LoopProgress("teacher: reranking", len(anchors), "pairs") as progress, self.torch.inference_mode():
            for start in range(0, len(anchors), self.batch_size):
                stop = min(start + self.batch_size, len(anchors))
                inputs = self.tokenizer(
                    anchors[start:stop],
                    candidates[start:stop],
                    padding=True,
                    truncation=True,
                    max_length=self.max_length,
                    return_tensors="pt",
                ).to(self.device)
                logits = self.model(**inputs).logits  # (n, 1)
                scores[start:stop] = logits[:, 0].float().cpu().numpy()
                progress.update(stop)
        return scores


class EncoderTeacher:
    """The cosine of each pair's embeddings, every distinct text embedded once (``embed``: texts
    -> (len(texts), d), row i for texts[i])."""

    def __init__(self, embed: Callable[[list[str]], np.ndarray]) -> None:
        self.embed = embed

    def __call__(self, anchors: list[str], candidates: list[str]) -> np.ndarray:
        assert len(anchors) == len(candidates), (len(anchors), len(candidates))
        texts = list(dict.fromkeys([*anchors, *candidates]))
        row = {text: index for index, text in enumerate(texts)}
        vectors = np.asarray(self.embed(texts), dtype=np.float64)
        vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)  # (T, d) unit rows
        left = vectors[[row[text] for text in anchors]]
        right = vectors[[row[text] for text in candidates]]
        return np.einsum("nd,nd->n", left, right).astype(np.float32)  # (n,)


def load_teacher(
    model: str, embed_with: Callable[[str], Callable[[list[str]], np.ndarray]], batch_size: int,
    max_length: int | None, device: str,
) -> tuple[TeacherScore, dict]:  # fmt: skip
    """The teacher ``model`` (a reranker or an encoder, module doc) and what the manifest records
    of it. ``embed_with(model)``: the encoder's embedding function, built as the command builds
    its miner's (cache, precision, device, ``max_length``); a reranker's pairs are cut to
    :func:`pair_length` tokens."""
    directory = locate_model(model, "--teacher").directory
    if is_reranker(directory):
        length = pair_length(directory, max_length)
        return RerankerTeacher(directory, batch_size, length, device), {
            "model": model,
            "directory": str(directory),
            "kind": "reranker",
            "scores": "logit",
            "max_length": length,
        }
    return EncoderTeacher(embed_with(model)), {"model": model, "kind": "encoder", "scores": "cosine"}

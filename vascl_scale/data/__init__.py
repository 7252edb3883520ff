"""Data: ``data download`` obtains the datasets, ``data prepare`` writes WebDataset shards, the loader streams them.

- :mod:`vascl_scale.data.registry` / :mod:`~vascl_scale.data.download` / :mod:`~vascl_scale.data.converters`:
  the datasets' sources and checksums, fetching and verifying, original formats to the layout.
- :mod:`vascl_scale.data.augment`: the explicit augmentations of section 4.4 (WDel, WNet, CTxt).

- :mod:`vascl_scale.data.prepare`: inputs -> filtered, optionally shuffled shards + manifest;
  :mod:`~vascl_scale.data.mine`: (anchor, positive) pairs -> hard negatives mined with an encoder.
- The formats: :mod:`~vascl_scale.data.shards` (tar shards, reading them), :mod:`~vascl_scale.data.manifest`
  (``manifest.json``), :mod:`~vascl_scale.data.shard_writer` (the row filter, the sink and the atomic
  swap that prepare and mine share), :mod:`~vascl_scale.data.batch` (the batch the loader yields and
  the training step takes).
- :mod:`vascl_scale.data.loader`: :func:`build_train_stream`, the infinite per-rank batch stream.
- :mod:`vascl_scale.data.layout`: which shards each rank and worker reads per epoch, and the resume position.
"""

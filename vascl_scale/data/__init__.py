"""Streaming training data: ``data prepare`` writes WebDataset shards, the loader streams them.

- :mod:`vascl_scale.data.prepare`: inputs -> filtered, optionally shuffled shards + manifest.
- :mod:`vascl_scale.data.loader`: :func:`build_train_stream`, the infinite per-rank batch stream.
- :mod:`vascl_scale.data.layout`: which shards each rank and worker reads per epoch, and the resume position.
"""

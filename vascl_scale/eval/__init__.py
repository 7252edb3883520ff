"""Evaluation of sentence encoders on the paper's three task families (Tables 1-3).

Evaluators take an ``encode(texts) -> (N, d) array`` callable, so embedding stays separate from
scoring: ``eval all`` passes cached embeddings of every distinct text, the trainer passes
``model.encode``.
"""

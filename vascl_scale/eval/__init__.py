"""Evaluation of sentence encoders on the paper's three task families (Tables 1-3) and retrieval.

Evaluators take an ``encode(texts) -> (N, d) array`` callable, so embedding stays separate from
scoring: ``eval all`` passes cached embeddings of every distinct text, the trainer passes
``model.encode``. The retrieval evaluator takes two, one for queries and one for documents, so
that each side can be embedded after its own prompt.
"""

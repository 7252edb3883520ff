"""The project's tooling, apart from the product (``vascl_scale``): the GPU proof's Python helpers
(``gpu_proof_tools.py``), the generator of ``docs/reference/`` (``docs_reference.py``), the pairs
study's table (``pairs_study_table.py``) and engineering notes (``notes/``). Run from the
repository root; nothing here is installed with the package."""

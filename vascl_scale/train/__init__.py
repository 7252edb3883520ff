"""``vascl-scale train``: the training engine.

config (:mod:`vascl_scale.config`) -> launch (:mod:`.launch`) -> loop (:mod:`.trainer`) ->
checkpoints (:mod:`.checkpoint`) -> export (:mod:`.export`). Submodules are imported where
used, so the command line starts without loading torch.
"""

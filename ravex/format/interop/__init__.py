"""Interop: a step for other tools, with no Ravex needed to read what they get.

Exports to one safetensors file or a plain Zarr v3 directory (:mod:`.export`); a read-only
zarr-python store over a step (:mod:`.zarr_store`); a tensorstore spec that reads a step in
place (:mod:`.tensorstore_spec`). All go through :mod:`ravex.format.store` and the step's key
view. Independent of the reports room.
"""

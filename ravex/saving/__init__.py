"""The saving pipeline below the runtime: the backend interface (:mod:`.backend`) and its two
backends (:mod:`.zarr`, :mod:`.torch_save`), the stager (:mod:`.stager`, :mod:`.copier`), the
writer thread (:mod:`.writer_thread`), the torch <-> numpy bridge (:mod:`.dtypes`), and
``ravex.load`` (:mod:`.load`) with its ``.pt`` export (:mod:`.export`).

It takes typed plans (:mod:`.plan`) from the runtime and never imports it.
"""

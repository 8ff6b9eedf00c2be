"""Steps: what a step is on storage, and reading it.

A rank's manifest (:mod:`.manifest`); the catalog of a store's steps, their manifests and
which are complete (:mod:`.catalog`); the reader that merges the ranks' manifests and fetches
and verifies chunks (:mod:`.reader`); a step's Zarr key view (:mod:`.keyview`) and its
fsspec rendering, ``refs.json`` (:mod:`.refs`); rank 0 handing a step's manifests to the
other ranks (:mod:`.handoff`); and which part of a training step an array path is in
(:mod:`.sections`). Built on objects, history (timelines) and storage.
"""

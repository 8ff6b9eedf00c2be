"""Ravex behind other libraries' checkpoint interfaces.

Each integration is a module (or package) of its own, imported only by whoever uses it, so importing
this package costs nothing (in particular, no torch):

- :mod:`ravex.integrations.dcp`: ``torch.distributed.checkpoint`` storage
  (``RavexStorageWriter``, ``RavexStorageReader``).
- :mod:`ravex.integrations.hf`: HuggingFace ``Trainer`` resumed exactly, zero-code (installed
  by :mod:`ravex.runtime.starting.frameworks` when ``transformers.trainer`` is imported; ``ravex[hf]``).
- :mod:`ravex.integrations.lightning`: ``RavexCheckpointIO``, Lightning's checkpoints in a Ravex
  store, and the same zero-code under ``ravex enable``, for ``lightning`` and the standalone
  ``pytorch_lightning`` alike (``ravex[lightning]``).

Integrations sit between the runtime and the saving layer: they use ``ravex.saving`` and
``ravex.format``, never the runtime or the faces (what a zero-code one asks of the runtime is a
``Protocol`` of its own, handed to it).
"""

"""Ravex behind other libraries' checkpoint interfaces.

Each integration is a module of its own, imported only by whoever uses it, so importing
this package costs nothing (in particular, no torch):

- :mod:`ravex.integrations.dcp`: ``torch.distributed.checkpoint`` storage
  (``RavexStorageWriter``, ``RavexStorageReader``).

Integrations sit between the runtime and the saving layer: they use ``ravex.saving`` and
``ravex.format``, never the runtime or the faces.
"""

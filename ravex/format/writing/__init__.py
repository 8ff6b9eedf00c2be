"""Writing: a step's commit, and sharded arrays.

:mod:`.writer` plans chunks, hashes, reuses unchanged chunks, encodes and writes, then the
manifest and, once the step is complete, ``refs.json``; :mod:`.reshard` writes a rank's
dim-0 shard as whole chunks and reads any rank's rows back. Built on every room below it;
:mod:`ravex.format.store` opens writers.
"""

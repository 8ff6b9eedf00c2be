"""Writing: a step's commit, and sharded arrays.

:mod:`.writer` hashes, reuses unchanged chunks, encodes and writes, then the manifest and, once
the step is complete, ``refs.json``; :mod:`.planning` says what each array's chunks are before a
byte is hashed, :mod:`.packs` lays small chunks out into packs and picks those a commit covers too
little of, :mod:`.stats` holds a commit's figures; :mod:`.reshard` writes a rank's dim-0 shard as
whole chunks and reads any rank's rows back. Built on every room below it; :mod:`ravex.format.store`
opens writers.
"""

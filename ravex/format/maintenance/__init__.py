"""Maintenance: retention and garbage collection, safe against a concurrent writer.

:mod:`.gc` decides which steps to keep, deletes the others' manifests and then the objects no
kept step names, honouring tags and the timelines' leases; :mod:`.repack` copies the live
chunks of mostly-dead packs into new packs. Built on steps (catalog, manifests, refs) and
history. The writer imports one value from here, the grace period it must agree on with GC
(``gc.DEFAULT_GRACE_SECONDS``), so writing sits above this room.
"""

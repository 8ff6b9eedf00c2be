"""Objects and chunks: the bytes of one chunk and the names they are stored under.

Content hashing (:mod:`.hashing`), the chunk codecs (:mod:`.codecs`), the Zarr data types
(:mod:`.dtypes`), typed JSON for a tree's non-tensor values (:mod:`.values`), names on
storage and object keys (:mod:`.names`), one chunk entry (:mod:`.chunkref`), an array's
entries as columns (:mod:`.chunktable`) and the row arithmetic of a table's delta
(:mod:`.tabledelta`). Pure functions over bytes and arrays: nothing here touches storage.
This room imports only :mod:`ravex.format.errors`; every other room builds on it.
"""

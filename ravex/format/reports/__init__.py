"""Reports: what the tools show about a store.

Summaries of steps, sizes and shared chunks (:mod:`.summary`), the diff of two steps
(:mod:`.diff`) and validation, every way a store can be damaged (:mod:`.validate`). They
read through :mod:`ravex.format.store` and the steps room; ``ravex ls/show/diff/validate``
and ``ravex inspect`` call them. Independent of the interop room.
"""

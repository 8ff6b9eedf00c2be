"""A run's steps around their writing: :mod:`.forks`, which timeline they go to; after this rank
committed one, :mod:`.settler`, rank 0's watch over the steps several ranks write, until each is
complete or known failed, and :mod:`.tiers`, its copy from the local tier to the durable one
(``local:``).
"""

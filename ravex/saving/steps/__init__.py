"""What becomes of a step after this rank committed it: :mod:`.settler`, rank 0's watch over the
steps several ranks write, until each is complete or known failed; :mod:`.tiers`, its copy from
the local tier to the durable one (``local:``).
"""

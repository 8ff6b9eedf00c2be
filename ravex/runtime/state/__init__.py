"""The training state a checkpoint holds: the live objects in creation order and the names a
user knows them by, what to save of them and in what chunks, their RNG streams and DataLoader
positions (workers, a sampler's epoch, a wrapper's look-ahead), and putting them back in place.

The bottom room of the runtime: it decides nothing about *when*, and imports nothing of the
rooms above it, so the ranks' layout (:mod:`..distributed`) and the loop position
(:mod:`..position`) build on it.
"""

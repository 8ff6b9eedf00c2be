"""Counting the run's steps and taking its checkpoints: when one is due (interval, clock,
signal), the step boundary where it is taken, and what it is handed to the backend as.

Above :mod:`..restoring`: a checkpoint restores a found step first, so that it never saves
the state the run started with.
"""

"""Resuming a rerun: which step, read once and agreed on by the ranks, put back into the live
objects before training touches them, and the loops and DataLoaders put back where they were.

What a step holds and how each piece goes back in place is :mod:`..state`'s; this room decides
when, and in what order.
"""

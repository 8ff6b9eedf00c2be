"""Starting the runtime: the one runtime of a process, its start and shutdown, and what it
watches for from the outside (frameworks imported later, processes ``multiprocessing`` starts).

It sits on top of the other rooms: :mod:`.lifecycle` assembles what :mod:`..counting` and
:mod:`..restoring` do into the runtime that :mod:`ravex` hands out, and nothing below imports
it (a framework integration asks its runtime for what it needs through the object it is given).
"""

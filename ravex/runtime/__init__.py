"""The process's runtime: configuration, activation, cadence, resume and what to save.

Importing this package imports nothing else: the CLI imports :mod:`ravex.runtime.config`
and :mod:`ravex.runtime.autoload` without paying for torch.
"""

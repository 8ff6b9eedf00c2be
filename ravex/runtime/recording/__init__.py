"""What the runtime records about a run beside its checkpoints: the loss of each step, where
and how the run was started (provenance), the resume witness's verdict, and the last run's
outcome for ``ravex status``.

Below the rooms that count and restore, which feed it; it reads only the configuration and the
ranks' collectives.
"""

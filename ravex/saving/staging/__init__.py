"""What :class:`ravex.saving.stager.Stager` builds on: its buffers (:mod:`.buffers`) and the
rules that tell it a tensor is unchanged since its last copy (:mod:`.probes`).
"""

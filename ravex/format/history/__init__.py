"""History: the store's small JSON documents about who wrote what, and when.

Timelines, the branches of a store's history (:mod:`.timelines`); tags that keep a step
(:mod:`.tags`); the lease of a timeline's one writer (:mod:`.leases`); run records
(:mod:`.runs`); a step's witness (:mod:`.witness`); with the clock every document stamps
(:mod:`.clock`) and the one reader of a JSON document (:mod:`.jsondoc`). Each is a document
on :mod:`ravex.format.storage` named with :mod:`ravex.format.objects.names`; none knows
manifests or chunks, so the step catalog above can ask which steps a timeline holds.
"""

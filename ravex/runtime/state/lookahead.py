"""Loaders that look ahead: how many of the batches a DataLoader handed out its wrapper still holds.

A checkpoint records where each DataLoader epoch stands, and a rerun skips that many batches at
the sampler. Ravex sees the batches the loader hands out, not the ones the loop consumes: a wrapper
that fetches before the loop asks (Accelerate's prepared loader, the "prefetcher" that keeps the
next batch on the device, a queue of k filled in the loop's own thread) holds batches that no step
has trained on yet. Counted as consumed, they would be skipped by the rerun and never trained on.

One rule for every wrapper. Its depth shows in the order of fetches and forward passes at the start
of each epoch: let ``first`` be the batches this epoch's iterator had handed out when a forward pass
first ran, and ``second`` when one first ran after the next batch was handed out; ``second - first``
is what one use of the model takes (one batch; two for a loop that draws pairs), and ``first -
(second - first)`` is the depth. A plain loop measures 0 (``1, 2``), a one-ahead prefetcher 1
(``2, 3``), a queue of k, k (``k+1, k+2``), a loop drawing two batches per step 0 (``2, 4``). A
forward pass run while a batch is fetched (a transform that is a module, in the main process) is no
use. Until ``second`` is seen, the depth is the last epoch's, or ``first - 1`` in the first epoch.

With depth d, an optimizer step has consumed the batches handed out when it ran, less d; once the
iterator is exhausted, each later step consumes as many of the d held as a step took before (one;
two with gradient accumulation over two batches). A checkpoint records the batches
consumed (:func:`held` is the difference), and the workers' RNG streams as of the last one. A loader
with depth 0, or no step in its epoch (an evaluation pass), is recorded as it is handed out.

Not covered: a wrapper that fetches in a thread of its own (how far ahead it stands depends on the
thread's timing, and so differs run to run). The resume witness names that case when it happens.
"""

from __future__ import annotations

import collections
from typing import Any

from torch.nn.modules.module import register_module_forward_pre_hook

from .registry import LoaderState

#: how many batches' worker RNG states are kept to undo the ones a wrapper holds
WORKER_LOG = 64


class LookAhead:
    """Measures each DataLoader epoch's depth with one global forward pre-hook that lives from the
    epoch's start to its second use of the model, and counts the steps that consume its batches."""

    def __init__(self) -> None:
        self._measuring: list[LoaderState] = []
        self._feeding: list[LoaderState] = []  # epochs under way, or draining what they hold
        self._hook: Any = None
        self.fetching = 0  # > 0 while a DataLoader iterator fetches a batch

    def epoch_began(self, st: LoaderState) -> None:
        """A new iterator over ``st``'s loader (or a persistent one reset): measure from here."""
        st.ahead_start, st.ahead_first, st.ahead_wait = st.yielded, None, 0
        st.step_yielded, st.tail_steps = None, 0
        if st not in self._feeding:
            self._feeding.append(st)
        if st not in self._measuring:
            self._measuring.append(st)
        if self._hook is None:
            self._hook = register_module_forward_pre_hook(self._before_forward)

    def ran_out(self, st: LoaderState) -> None:
        """``st``'s iterator is exhausted: an epoch that never reached a second use is not measured."""
        self._stop_measuring(st)

    def stepped(self) -> None:
        """An optimizer step: it consumed what each feeding loader had handed out, less its depth.
        A loader whose second use has not come two steps after its first feeds no step (a batch
        drawn once, for a shape): it is measured no longer."""
        for st in list(self._measuring):
            if st.ahead_first is not None:
                st.ahead_wait += 1
                if st.ahead_wait > 2:
                    self._stop_measuring(st)
        for st in list(self._feeding):
            if not st.exhausted:
                if st.step_yielded is not None:
                    st.step_batches = max(1, st.yielded - st.step_yielded)
                st.step_yielded = st.yielded
                continue
            st.tail_steps += 1
            if held(st) == 0:
                self._feeding.remove(st)
                self._stop_measuring(st)

    def _before_forward(self, module: Any, args: Any) -> None:
        if self.fetching:
            return
        for st in list(self._measuring):
            handed = st.yielded - st.ahead_start
            if handed <= 0:
                continue
            if st.ahead_first is None:
                st.ahead_first = handed
            elif handed > st.ahead_first:
                st.ahead = max(0, 2 * st.ahead_first - handed)
                st.ahead_known = True
                self._stop_measuring(st)

    def _stop_measuring(self, st: LoaderState) -> None:
        if st in self._measuring:
            self._measuring.remove(st)
        if not self._measuring:
            self._drop_hook()

    def _drop_hook(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def close(self) -> None:
        """Remove the hook (the runtime shuts down)."""
        self._measuring.clear()
        self._feeding.clear()
        self._drop_hook()


def depth(st: LoaderState) -> int:
    """How many batches ahead of the loop ``st``'s loader is fetched (see the module's rule)."""
    if st.ahead_known or st.ahead_first is None:
        return st.ahead
    return max(0, st.ahead_first - 1)


def held(st: LoaderState) -> int:
    """Batches ``st``'s loader handed out that the loop has not consumed yet."""
    d = depth(st)
    if d == 0:
        return 0
    if st.step_yielded is None and st.tail_steps == 0:  # no step in this epoch yet
        return 0 if st.exhausted else min(d, st.yielded - st.ahead_start)
    base = st.ahead_start if st.step_yielded is None else max(st.ahead_start, st.step_yielded - d)
    return st.yielded - min(st.yielded, base + st.tail_steps * st.step_batches)


def log_worker_batch(st: LoaderState, worker: int, state: Any) -> None:
    """Batch ``st.yielded`` of epoch ``st.epoch`` (counted already) came from ``worker``, which
    stood at ``state`` after loading it."""
    if st.worker_log is None:
        st.worker_log = collections.deque(maxlen=WORKER_LOG)
    st.worker_log.append(((st.epoch, st.yielded), worker, state))


def consumed_worker_rng(st: LoaderState, consumed: int) -> dict[int, Any]:
    """Each worker's RNG streams after the last batch it loaded that the loop consumed. A worker
    whose last batch is still held goes back to what its batch before left; one with no batch
    before it in this iterator's life (or in the log) is left out, and a rerun's worker starts
    fresh, as the first run's did."""
    states = dict(st.worker_rng)
    if st.worker_log is None or consumed >= st.yielded:
        return states
    cut = (st.epoch, consumed)
    undone = {worker for key, worker, _ in st.worker_log if key > cut}
    for key, worker, state in reversed(st.worker_log):
        if key <= cut and worker in undone:
            states[worker] = state
            undone.discard(worker)
    for worker in undone:
        states.pop(worker, None)
    return states

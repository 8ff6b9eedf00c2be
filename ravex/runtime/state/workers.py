"""DataLoader worker processes carried across a resume: their base seed, where each one's RNG
streams stand, and which worker the next batch goes to.

A worker seeds torch, ``random`` and numpy from ``base_seed + worker_id`` when it starts, and its
streams advance with every sample it loads (a random augmentation). A resumed epoch skips the
consumed batches at the sampler, so no worker loads them again: the resumed workers' streams are
set to where the first run's stood instead. Each batch comes back from its worker with the
worker's RNG state after loading it (:class:`Reporting` wraps the collate function, :class:`Batch`
carries the pair); the main process keeps, per worker, the state of the last batch it consumed
(:func:`unwrap`), and a checkpoint saves those (:func:`for_tree`). A resumed iterator's workers
start from them (:class:`Adopt`, around ``worker_init_fn``), and the next batch goes to the worker
it went to in the first run: the in-order iterator deals batch ``i`` of an epoch to worker
``i % num_workers`` (:func:`resume_workers`).

Persistent workers (``persistent_workers=True``) outlive their epoch: the iterator is reset, not
made again, so no new base seed is drawn and the streams go on. A rerun has to make a new iterator,
which draws a base seed; the patch of its ``__init__`` puts back the RNG that draw moved and gives
the iterator the first run's seed, so the epoch's shuffle is drawn from the same state.

Map-style datasets only: an iterable dataset's workers make their own batches, and a resumed
epoch loads and drops the consumed ones, which replays the workers' streams by itself.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import get_worker_info

from ravex.saving.dtypes import as_tensor


def streams() -> dict[str, Any]:
    """This process's RNG streams, cheap to send through a worker's result queue."""
    out: dict[str, Any] = {"torch": torch.get_rng_state().numpy().tobytes(), "python": random.getstate()}
    np = sys.modules.get("numpy")
    if np is not None:
        kind, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
        out["numpy"] = (kind, keys.tobytes(), int(pos), int(has_gauss), float(gauss))
    return out


def set_streams(state: dict[str, Any]) -> None:
    """Set this process's RNG streams to ``state`` (as :func:`streams` or a checkpoint has it)."""
    torch.set_rng_state(_bytes_tensor(state["torch"]))
    version, internal, gauss_next = state["python"]
    random.setstate((int(version), tuple(int(x) for x in internal), gauss_next))
    saved = state.get("numpy")
    np = sys.modules.get("numpy")
    if saved is not None and np is not None:
        kind, keys, pos, has_gauss, gauss = saved
        np.random.set_state((kind, np.frombuffer(_as_bytes(keys), dtype=np.uint32), int(pos),
                             int(has_gauss), float(gauss)))


@dataclass
class Batch:
    """A batch on its way from worker ``worker``, with that worker's RNG streams after it.

    Not a tuple: the pin-memory thread and collate helpers would take it apart."""

    batch: Any
    worker: int
    rng: dict[str, Any]

    def pin_memory(self) -> Batch:
        """The pin-memory thread pins what the batch holds, not the wrapper."""
        from torch.utils.data._utils.pin_memory import pin_memory

        return Batch(pin_memory(self.batch), self.worker, self.rng)  # type: ignore[no-untyped-call]


class Reporting:
    """A collate function that sends the worker's RNG state back with each batch."""

    def __init__(self, collate: Callable[[Any], Any]) -> None:
        self.collate = collate

    def __call__(self, samples: Any) -> Any:
        batch = self.collate(samples)
        info = get_worker_info()
        return batch if info is None else Batch(batch, info.id, streams())


class Adopt:
    """A ``worker_init_fn`` that starts each worker where the first run's stood: the script's
    own function runs first (its side effects happen), then the saved streams replace the
    fresh seeding, since they already hold what that function drew or seeded."""

    def __init__(self, init: Callable[[int], None] | None, states: dict[int, Any]) -> None:
        self.init = init
        self.states = states

    def __call__(self, worker_id: int) -> None:
        if self.init is not None:
            self.init(worker_id)
        state = self.states.get(worker_id)
        if state is not None:
            set_streams(state)


def unwrap(data: Any, states: dict[int, Any]) -> Any:
    """The batch the script sees; the worker's streams recorded in ``states``."""
    if type(data) is Batch:
        states[data.worker] = data.rng
        return data.batch
    return data


def tracks(iterator: Any) -> bool:
    """Whether ``iterator`` is one whose workers' streams are recorded and dealt in order."""
    from torch.utils.data import dataloader

    return bool(iterator._num_workers and iterator._dataset_kind == dataloader._DatasetKind.Map
                and getattr(iterator, "_in_order", True))


def resume_workers(iterator: Any, loader: Any, states: dict[int, Any], skip: int) -> None:
    """Start ``iterator``'s workers from ``states`` and deal its first batch, the epoch's
    ``skip``-th, to worker ``skip % num_workers``, as the first run did. Called from the
    iterator's ``__init__`` before it starts its workers; its first ``_reset`` (the last step of
    that ``__init__``, the workers started) puts the script's ``worker_init_fn`` back."""
    init = loader.worker_init_fn
    if states:
        loader.worker_init_fn = Adopt(init, dict(states))
    first = skip % iterator._num_workers
    reset = iterator._reset

    def _reset(loader_: Any, first_iter: bool = False) -> None:
        del iterator.__dict__["_reset"]
        loader.worker_init_fn = init
        prefetch, iterator._prefetch_factor = iterator._prefetch_factor, 0
        try:
            reset(loader_, first_iter)  # makes the dealing cycle, primes nothing
        finally:
            iterator._prefetch_factor = prefetch
        for _ in range(first):
            next(iterator._worker_queue_idx_cycle)
        for _ in range(prefetch * iterator._num_workers):  # the priming torch's _reset does
            iterator._try_put_index()

    iterator._reset = _reset


def for_tree(states: dict[int, Any]) -> dict[int, Any]:
    """A copy of the workers' streams for a checkpoint (the live dict goes on changing)."""
    return {w: {**s, "torch": torch.frombuffer(bytearray(s["torch"]), dtype=torch.uint8)}
            for w, s in states.items()}


def from_tree(saved: dict[Any, Any] | None) -> dict[int, Any]:
    """The workers' streams as a checkpoint holds them, keyed by worker id."""
    return {int(w): {**s, "torch": _as_bytes(s["torch"])} for w, s in (saved or {}).items()}


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    return bytes(as_tensor(value).to(torch.uint8).numpy().tobytes())


def _bytes_tensor(value: Any) -> torch.Tensor:
    return torch.frombuffer(bytearray(_as_bytes(value)), dtype=torch.uint8)

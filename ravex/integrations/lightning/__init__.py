"""PyTorch Lightning checkpoints in a Ravex store: ``RavexCheckpointIO``, a ``CheckpointIO`` plugin.

    >>> trainer = Trainer(plugins=[RavexCheckpointIO("./store")],
    ...                   callbacks=[ModelCheckpoint(dirpath="ckpts", save_last=True, every_n_train_steps=50)])
    >>> trainer.fit(model, loader, ckpt_path="last")

Either Lightning works: ``lightning`` (``lightning.pytorch``) and the standalone
``pytorch_lightning`` are separate copies of the same code, each checking its own classes, so this
module names neither in its classes: the plugins are registered as a ``CheckpointIO`` of each
Lightning imported (an ABC registration), and the zero-code callback is made, once per package,
from that package's ``Callback``.

**What a save writes.** Lightning's whole checkpoint dict (weights, optimizer and scheduler
states, the loops' progress, callbacks' states, hyper-parameters) becomes one Ravex step of the
store at ``url``: tensors as arrays under their keys (``state_dict/net.0.weight``,
``optimizer_states/0/state/0/exp_avg``), everything else as typed JSON (int keys, tuples and
floats kept exactly). A value typed JSON cannot hold (an object in ``hyper_parameters``) is
refused, naming its key: nothing is pickled, and nothing is unpickled on load. Each save is the
next step number (or, ``numbering="global_step"``, the step of its global step). One writer serves
every save, so each step is a delta on the one before: chunks that did not change (frozen weights,
the second save of a step as ``last.ckpt``) are reused, not written again. ``loss``, when given,
is read at each save and recorded as the step's training loss (``ravex ls`` shows it).

**Async.** A save copies the tensors to CPU on the caller's thread (the training loop may change
them right after) and returns; a background thread writes the step, then the pointer file. Saves
and removals run in the order Lightning asked for them. At most ``max_queued`` saves wait or run
at once (each holds a copy of the state): one more waits for the oldest, so a cadence faster than
storage slows training rather than filling memory. Loading, ``teardown`` (the end of ``fit``)
and :meth:`RavexCheckpointIO.flush` wait for what is queued, and a failed write is raised there
or by the next save. ``async_writes=False`` writes within the call. A process killed mid-write
leaves the pointer files naming the previous durable steps, never a partial one.

**The file Lightning sees.** At the path Lightning names (``ckpts/last.ckpt``,
``ckpts/epoch=0-step=50.ckpt``) the plugin writes a small JSON pointer, atomically, once the step
is durable: the store's URL and the step (and Lightning's epoch and global step in it). So
Lightning's own file logic keeps working: ``ckpt_path="last"`` finds the newest ``last*.ckpt``,
``save_top_k`` removes files. A step no pointer names any more (its file removed, or replaced as
``last.ckpt`` is at each save) loses its manifest too; ``ravex gc`` reclaims its objects.
``ravex ls``, ``show``, ``diff`` and ``inspect`` read the store. Loading reads only the step the
pointer names. Pointer files live on a local path; the store may be remote.

**Zero-code.** Under ``ravex enable`` (:mod:`ravex.runtime.starting.frameworks`) :func:`install` gives each
Trainer with Lightning's default CheckpointIO a callback that saves every ``checkpoint_every``
global steps into the configured store through this plugin, one step per global step, numbered
by it (raised above any steps of the runtime's own the timeline already holds) and carrying the
training loss, and the newest of them as its ``ckpt_path``. Each step's manifest says it is
Lightning's (:data:`~ravex.saving.backend.LIGHTNING_KEY`): the runtime, which reads the store when
it starts, before any Trainer exists, never restores one as a tree of its own. A store with no
Lightning step is resumed from ``<storage>-lightning`` when earlier versions of Ravex left steps
there. Every save logs the line every Ravex checkpoint logs (``ravex: checkpoint step N: stall
... -> <store>``, on the ``ravex`` logger, which ``ravex enable`` shows) from the rank that
writes: rank 0, the one Lightning hands its checkpoint to under DDP. Every other save
(``ModelCheckpoint``'s, the script's own ``trainer.save_checkpoint``) stays the file Lightning's
own CheckpointIO writes (:class:`ZeroCodeIO`): the script's files are what they were without Ravex.
The callback also makes the resume exact where Lightning's checkpoint alone is not: it carries
each rank's RNG streams and the train loader's place in its epoch, so a plain shuffled DataLoader
(or the DistributedSampler Lightning gives it under DDP) resumes mid-epoch on the same order, and
a finished run rerun trains nothing and leaves the state as the first run left it.

Needs the ``lightning`` extra: ``pip install 'ravex[lightning]'`` (``lightning``, which brings
``pytorch_lightning``; either one alone is enough).
"""

from __future__ import annotations

import importlib
import sys

from .plugin import GLOBAL_STEP_KEY, PACKAGES, RavexCheckpointIO, ZeroCodeIO, _register, from_tree, to_tree
from .pointers import POINTER_FORMAT, Ref, read_pointer, write_pointer
from .settings import ZeroCode
from .zerocode import LightningRuntime, Replace, TrainingLoss, _start, install

EXTRA = "ravex[lightning]"

__all__ = [
    "EXTRA",
    "GLOBAL_STEP_KEY",
    "PACKAGES",
    "POINTER_FORMAT",
    "LightningRuntime",
    "RavexCheckpointIO",
    "Ref",
    "Replace",
    "TrainingLoss",
    "ZeroCode",
    "ZeroCodeIO",
    "_start",
    "from_tree",
    "install",
    "read_pointer",
    "to_tree",
    "write_pointer",
]


def _import_lightning() -> None:
    """At import, after every name above exists (a Lightning imported here may run
    :mod:`ravex.runtime.starting.frameworks`' installer, which uses this module): the Lightning a script
    imported, or else one that is installed; none is the one-line error naming the extra."""
    if not any(f"{fabric}.plugins.io.checkpoint_io" in sys.modules for fabric in PACKAGES.values()):
        for fabric in PACKAGES.values():
            try:
                importlib.import_module(f"{fabric}.plugins.io.checkpoint_io")
                break
            except ImportError:
                continue
        else:
            raise ImportError(f"ravex.integrations.lightning needs PyTorch Lightning: pip install '{EXTRA}'")
    _register()


_import_lightning()

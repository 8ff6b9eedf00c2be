"""Staging buffers: CPU memory for a tensor's bytes, page-aligned where it can be, and the tensors
the writer may read in place instead (over the staging cap).

Kept apart from :mod:`ravex.saving.stager` because they are memory, not staging policy: the
prepare thread, the stage and the direct-write tests all ask for the same aligned blocks.
"""

from __future__ import annotations

import mmap
from typing import Any

import numpy as np
import torch

from ravex.format.storage.direct import ALIGN

from ..copier import byte_view
from ..dtypes import numpy_view


def _staging_buffer(src: torch.Tensor) -> torch.Tensor:
    """A CPU buffer for ``src``'s bytes: pinned for a CUDA tensor, else an aligned block
    (:func:`_aligned_block`). It starts on a page (:data:`ALIGN`), so that a local store
    writes its chunks straight from it to the disk (``ravex.format.storage.direct``)."""
    if src.is_cuda and torch.cuda.is_available():
        return torch.empty(src.shape, dtype=src.dtype, device="cpu", pin_memory=True)
    nbytes = src.numel() * src.element_size()
    if not _fits_block(src):
        return torch.empty(src.shape, dtype=src.dtype, device="cpu")
    return _aligned_block(nbytes).view(src.dtype).view(src.shape)



def _fits_block(src: torch.Tensor) -> bool:
    """Whether ``src``'s buffer can be a view of an aligned byte block (dtypes a uint8 tensor
    can be viewed as; complex and bool cannot)."""
    return src.numel() > 0 and not src.dtype.is_complex and src.dtype != torch.bool


def _aligned_block(nbytes: int) -> torch.Tensor:
    """``nbytes`` as a flat uint8 tensor starting on a page (:data:`ALIGN`): a mapping of its
    own from :data:`MAPPED_MIN_BYTES` on, numpy's memory below."""
    if nbytes >= MAPPED_MIN_BYTES:
        mapped = _mapped_block(nbytes)
        if mapped is not None:
            return torch.from_numpy(mapped)
    block = np.empty(nbytes + ALIGN, dtype=np.uint8)
    skip = -block.ctypes.data % ALIGN  # page-aligned: the writer can hand it to the disk as it is
    return torch.from_numpy(block[skip:skip + nbytes])


#: Blocks of at least this size get an anonymous mapping of their own (:func:`_mapped_block`).
MAPPED_MIN_BYTES = 1 << 20


def _mapped_block(nbytes: int) -> np.ndarray | None:
    """``nbytes`` of anonymous memory mapped for this block alone (page-aligned by the kernel), as
    a flat uint8 array that unmaps it when the last view goes; None where ``mmap`` cannot.

    Not numpy's memory: numpy asks for transparent huge pages on large blocks (``MADV_HUGEPAGE``),
    and where the kernel's ``defrag`` setting is ``madvise`` (these machines, and the usual
    default) the first fault of each huge page waits while the kernel compacts memory to find
    one. Measured here, faulting in 1 GiB: 0.57-2.4 s that way the first time in a process,
    against 0.24 s for this mapping's 4 KiB pages populated by one ``madvise`` call
    (:func:`ravex.saving.copier.touch`); a 1 GiB copy into either took 0.117 and 0.084 s. That
    first fault is the first checkpoint's stall, or the prepare thread's work before it.
    """
    try:
        mapped = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (AttributeError, OSError, ValueError, TypeError):  # no anonymous mmap here (Windows)
        return None
    return np.frombuffer(mapped, dtype=np.uint8)


def _live(src: torch.Tensor, as_numpy: bool) -> Any:
    """``src`` as the writer can read it in place (``as_numpy``: a numpy view, for the format), or None where
    it must be staged anyway (CUDA, non-contiguous, conjugate or negative bits, no numpy view)."""
    if src.device.type != "cpu" or byte_view(src) is None:
        return None
    if not as_numpy:
        return src
    try:
        return numpy_view(src)
    except (TypeError, RuntimeError, ValueError):
        return None

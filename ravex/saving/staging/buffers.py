"""Staging buffers: CPU memory for a tensor's bytes, page-aligned where it can be, and the tensors
the writer may read in place instead (over the staging cap).

Kept apart from :mod:`ravex.saving.stager` because they are memory, not staging policy: the
prepare thread, the stage and the direct-write tests all ask for the same aligned blocks.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ravex.format.storage.direct import ALIGN

from ..copier import byte_view
from ..dtypes import numpy_view


def _staging_buffer(src: torch.Tensor) -> torch.Tensor:
    """A CPU buffer for ``src``'s bytes: pinned for a CUDA tensor, else numpy's memory.

    numpy asks the kernel for huge pages on large allocations (``madvise``, which is what
    these machines' transparent huge pages wait for) and torch does not: copies into such
    a buffer took 12.1 ms against 13.2 ms for 200 MiB (fewer TLB misses), and the writer
    reads them back faster too. It starts on a page (:data:`ALIGN`), so that a local store
    writes its chunks straight from it to the disk (``ravex.format.storage.direct``).
    """
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
    """``nbytes`` of numpy's memory as a flat uint8 tensor starting on a page (:data:`ALIGN`)."""
    block = np.empty(nbytes + ALIGN, dtype=np.uint8)
    skip = -block.ctypes.data % ALIGN  # page-aligned: the writer can hand it to the disk as it is
    return torch.from_numpy(block[skip:skip + nbytes])


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

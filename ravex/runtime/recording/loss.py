"""The training loss of the step being checkpointed: the tensor ``backward()`` was last called on.

Read without an extra device sync per step: each ``backward()`` only keeps a detached
reference to its tensor (no copy, no ``.item()``), and the value is read once per checkpoint,
when the checkpoint is taken. A tensor that is not one floating-point element (a backward
pass through a non-scalar, such as the recomputation inside ``torch.utils.checkpoint``) is
not a loss and leaves the last one in place.

Under AMP, ``GradScaler.scale(loss).backward()`` runs backward on ``loss * scale``; the scaler
tells :meth:`LastLoss.scaled` which tensor it made from which, and the loss kept is the
unscaled one.
"""

from __future__ import annotations

import weakref
from typing import Any


class LastLoss:
    """The last scalar floating-point tensor ``backward()`` ran on, detached."""

    def __init__(self) -> None:
        self._tensor: Any = None
        self._scaled: weakref.ref[Any] | None = None
        self._unscaled: Any = None

    def scaled(self, result: Any, loss: Any) -> None:
        """``GradScaler.scale(loss)`` returned ``result``: a backward on it is a backward on ``loss``."""
        try:
            self._scaled = weakref.ref(result)
        except TypeError:
            return
        self._unscaled = loss.detach()

    def seen(self, tensor: Any) -> None:
        """``backward()`` was called on ``tensor`` (any value ``torch.autograd.backward`` takes)."""
        if isinstance(tensor, (list, tuple)):
            if len(tensor) != 1:
                return
            tensor = tensor[0]
        try:
            if tensor.numel() != 1 or not tensor.is_floating_point():
                return
        except AttributeError:
            return
        if self._scaled is not None and self._scaled() is tensor:
            self._tensor = self._unscaled
        else:
            self._tensor = tensor.detach()

    def value(self) -> float | None:
        """The loss as a Python float (one device sync), or None before any backward pass."""
        tensor = self._tensor
        if tensor is None:
            return None
        return float(tensor.item())

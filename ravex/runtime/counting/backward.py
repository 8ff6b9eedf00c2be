"""Counting the steps of a loop that steps no ``torch.optim`` optimizer and wraps no loop in
``ravex.loop``: each backward pass is one.

Apart from :class:`.cadence.Cadence` because it is a watch of its own, with hooks of its own
on the user's modules and parameters, which it removes once an optimizer or a wrapped loop
counts the steps instead; it only tells the cadence that a step is done.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from ..position import main_loop_site
from ..state.registry import Registry

logger = logging.getLogger("ravex")


class Stepping(Protocol):
    """What counting backward passes asks of the cadence it serves."""

    enabled: bool
    loops_used: bool
    registry: Registry

    def on_backward_step(self) -> None: ...


class BackwardSteps:
    """Counts the training steps of a loop that steps no ``torch.optim`` optimizer and wraps
    no loop in ``ravex.loop`` (parameters updated by hand, word_language_model's default):
    each backward pass is a step, so its checkpoints are taken (at the loop's head, like any
    other) instead of nothing being saved. It stands down for good once an optimizer exists
    or a loop is wrapped, which count the steps themselves.

    Cheap by construction: a global forward pre-hook only until the first backward pass
    (it puts a post-accumulate-grad hook on one parameter of each module it sees), then
    that one hook per backward pass.
    """

    def __init__(self, cadence: Stepping) -> None:
        import torch
        from torch.nn.modules.module import register_module_forward_pre_hook

        self.grad_enabled = torch.is_grad_enabled
        self.cadence = cadence
        self.said = False
        self.counted: int | None = None  # id of the parameter whose hook counts the passes
        self.armed: set[int] = set()
        self.handles: list[Any] = []
        self.forward: Any = register_module_forward_pre_hook(self._arm)

    def _arm(self, module: Any, args: Any) -> None:
        if not self.grad_enabled() or len(self.armed) >= 64:
            return
        for param in module.parameters(recurse=False):
            if param.requires_grad:
                if id(param) not in self.armed:
                    self.armed.add(id(param))
                    self.handles.append(param.register_post_accumulate_grad_hook(self._backward))
                return

    def _backward(self, param: Any) -> None:
        if self.counted is None:
            self.counted = id(param)
            self._drop_forward()
        if id(param) != self.counted:
            return
        cadence = self.cadence
        if cadence.loops_used or cadence.registry.live("optimizers") or not cadence.enabled:
            self.close()
            return
        if not self.said:
            self.said = True
            site = main_loop_site()
            logger.info("ravex: no torch.optim optimizer%s: each backward pass counts as a training "
                        "step (parameters updated by hand)", f" in the loop at {site}" if site else "")
        cadence.on_backward_step()

    def _drop_forward(self) -> None:
        forward, self.forward = self.forward, None
        if forward is not None:
            forward.remove()

    def close(self) -> None:
        self._drop_forward()
        while self.handles:
            self.handles.pop().remove()

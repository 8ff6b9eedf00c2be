"""The look-ahead rule on the event orders of the loops it must tell apart (fetches, forward
passes of a real module, optimizer steps), without a subprocess: what a checkpoint taken at each
point would record as consumed. The kill/resume proof is test_lookahead.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ravex.runtime.state.lookahead import LookAhead, held
from ravex.runtime.state.registry import LoaderState

X = torch.zeros(1, 2)


_loops: list[Loop] = []


@pytest.fixture(autouse=True)
def _no_hook_left():
    yield
    while _loops:
        _loops.pop().rule.close()


class Loop:
    """One epoch of ``n`` batches, driven event by event."""

    def __init__(self, n: int, rule: LookAhead | None = None) -> None:
        self.rule = rule or LookAhead()
        # submodules: several hook calls per use; a local, so that no later test's runtime finds
        # it alive
        self.model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
        self.st = LoaderState()
        self.n = n
        self.rule.epoch_began(self.st)
        _loops.append(self)

    def fetch(self) -> bool:
        self.rule.fetching += 1
        try:
            self.model[0](X)  # a transform that is a module, run while fetching: no use
        finally:
            self.rule.fetching -= 1
        if self.st.yielded == self.n:
            self.st.exhausted = True
            self.rule.ran_out(self.st)
            return False
        self.st.yielded += 1
        return True

    def use(self) -> None:
        self.model(X)

    def step(self) -> None:
        self.rule.stepped()

    @property
    def consumed(self) -> int:
        return self.st.yielded - held(self.st)


def test_a_plain_loop_consumes_what_it_fetched():
    loop = Loop(4)
    seen = []
    while loop.fetch():
        loop.use()
        loop.step()
        seen.append(loop.consumed)
    assert seen == [1, 2, 3, 4] and loop.st.ahead == 0 and loop.consumed == 4


def test_one_ahead_holds_one_batch_until_its_loader_ran_out():
    loop = Loop(5)
    loop.fetch()
    at_boundary = []
    while True:
        at_boundary.append(loop.consumed)  # where a checkpoint at the next fetch records
        more = loop.fetch()
        loop.use()
        loop.step()
        if not more:
            break
    assert loop.st.ahead == 1
    # the first boundary, before any use of the first epoch, has nothing to tell the depth by
    # (no checkpoint is due there: no step yet)
    assert at_boundary[1:] == [1, 2, 3, 4] and loop.consumed == 5


def test_a_queue_of_two_drains_after_its_loader_ran_out():
    loop = Loop(6)
    loop.fetch(), loop.fetch()
    after_steps = []
    for _ in range(6):
        loop.fetch()
        loop.use()
        loop.step()
        after_steps.append(loop.consumed)
    assert loop.st.ahead == 2 and after_steps == [1, 2, 3, 4, 5, 6]


def test_a_loop_drawing_pairs_is_no_look_ahead():
    loop = Loop(8)
    after_steps = []
    while loop.fetch() and loop.fetch():
        loop.use()
        loop.step()
        after_steps.append(loop.consumed)
    # the run's first step guesses one batch per use (depth 1): measured at the second use
    assert loop.st.ahead == 0 and after_steps[1:] == [4, 6, 8]


def test_gradient_accumulation_behind_one_ahead():
    loop = Loop(8)
    loop.fetch()
    after_steps = []
    for micro in range(8):
        loop.fetch()
        loop.use()
        if micro % 2 == 1:
            loop.step()
            after_steps.append(loop.consumed)
    assert loop.st.ahead == 1 and after_steps == [2, 4, 6, 8]


def test_an_evaluation_pass_without_steps_is_recorded_as_handed_out():
    rule = LookAhead()
    evaluation = Loop(3, rule)
    evaluation.fetch()
    while evaluation.fetch():
        evaluation.use()
    evaluation.use()
    assert evaluation.st.exhausted and held(evaluation.st) == 0


def test_the_hook_is_gone_once_measured():
    loop = Loop(4)
    while loop.fetch():
        loop.use()
        loop.step()
    assert loop.rule._hook is None

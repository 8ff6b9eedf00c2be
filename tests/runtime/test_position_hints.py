"""The one-line hint for a loop whose position a rerun cannot find fits the loop it names:
a ``while`` is not told to wrap a ``range``."""

from __future__ import annotations

import sys

from ravex.runtime.position import advice


def test_a_while_loop_is_told_how_a_while_loop_becomes_exact():
    said = []
    n = 0
    while n < 1:
        said.append(advice(sys._getframe()))
        n += 1
    line = sys._getframe().f_code.co_firstlineno + 3
    assert f"the while loop at test_position_hints.py:{line}" in said[0]
    assert "itertools.count()" in said[0] and "range(" not in said[0]


def test_a_for_loop_is_told_to_wrap_its_iterable():
    for _ in range(1):
        said = advice(sys._getframe())
    assert "`for i in ravex.loop(range(...)):` around its iterable" in said

"""A finished run, rerun: its training loop's own condition decides whether it trains on.

A run that ended normally records its outermost training loop as the loop left it (mode
``"end"``, :func:`.capture.capture_end`): the variables the loop carries, and for a ``for``
over ``range`` the last item it drew. The rerun goes back into that loop with them and
lets the script decide, as one long run would have: the ``range`` the ``for`` builds now is
handed to it positioned just past the recorded item (a larger bound goes on at the old one,
the same bound is spent at once), and a ``while`` tests again, on the restored variables,
the ``if ...: break`` statements that end it and then its own condition. With the same
bounds the loop ends at once and the code after it runs on the restored state; with
larger ones it trains exactly the added iterations.

Only shapes where that decision is read from the source without running anything twice are
taken: every ``break`` of the loop ends an ``if`` directly in its body, or in ``if`` statements
nested in such an ``if``'s body, whose tests only read values (no call), and a ``for``
iterates ``range(...)`` into one name its body never rebinds, with no ``else`` where it
breaks. Other loops keep the jump past them (:func:`.source.after`).
"""

from __future__ import annotations

import ast
import builtins
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from . import source

#: what a break test may hold: reading values, comparing and combining them, never a call
_PURE = (ast.Name, ast.Constant, ast.Compare, ast.BoolOp, ast.UnaryOp, ast.BinOp, ast.Attribute,
         ast.Subscript, ast.Tuple, ast.List, ast.Slice, ast.expr_context, ast.cmpop, ast.boolop,
         ast.unaryop, ast.operator)


@dataclass(frozen=True)
class Ending:
    """How a loop decides whether it runs another iteration (:func:`ending`)."""

    kind: str  #: ``"for"`` (over ``range``) or ``"while"``
    line: int  #: the loop statement's line
    body: int  #: its body's first line
    target: str | None  #: the name a ``for`` binds
    #: per ``break``, in body order: the line of the ``if`` it ends and that ``if``'s test
    tests: tuple[tuple[int, ast.expr], ...]
    tested: bool  #: a ``while`` whose condition is not a constant: its line tests it again


def ending(filename: str, name: str, first_line: int, line: int) -> Ending | None:
    """The way the loop at ``line`` ends, where a rerun can let it decide again (see the
    module docstring); None for any other loop."""
    loop = source.loop_at(filename, name, first_line, line)
    if loop is None:
        return None
    tests = [test for test in map(_break_test, loop.body) if test is not None]
    if sum(1 for _ in _breaks(loop.body)) != len(tests):
        return None  # a break the source cannot test again
    body = loop.body[0].lineno
    if isinstance(loop, ast.While):
        constant = isinstance(loop.test, ast.Constant) and bool(loop.test.value)
        return Ending("while", loop.lineno, body, None, tuple(tests), not constant)
    call = loop.iter
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "range"
            and not call.keywords and isinstance(loop.target, ast.Name)):
        return None
    if source.assigns(ast.Module(body=loop.body, type_ignores=[]), loop.target.id) or (tests and loop.orelse):
        return None
    return Ending("for", loop.lineno, body, loop.target.id, tuple(tests), False)


def _break_test(stmt: ast.stmt) -> tuple[int, ast.expr] | None:
    """For an ``if`` of the loop's body that holds one ``break``, at the end of its body or of
    the body of an ``if`` nested in it the same way (pytorch-template's early stop, inside the
    ``if`` that checks a metric is monitored), every test on the way read-only: the line of the
    innermost ``if`` and the tests joined by ``and``. None for any other statement."""
    if not (isinstance(stmt, ast.If) and _pure(stmt.test)) or sum(1 for _ in _breaks([stmt])) != 1:
        return None
    if isinstance(stmt.body[-1], ast.Break):
        return stmt.lineno, stmt.test
    holder = next((inner for inner in stmt.body if any(True for _ in _breaks([inner]))), None)
    nested = _break_test(holder) if holder is not None else None
    if nested is None:
        return None
    line, test = nested
    return line, ast.copy_location(ast.BoolOp(op=ast.And(), values=[stmt.test, test]), stmt.test)


def _pure(test: ast.expr) -> bool:
    return all(isinstance(node, _PURE) for node in ast.walk(test))


def _breaks(stmts: list[ast.stmt]) -> Iterator[ast.Break]:
    """The ``break`` statements of the loop whose body is ``stmts`` (not those of a nested
    loop's body, nor of a nested def)."""
    for stmt in stmts:
        if isinstance(stmt, ast.Break):
            yield stmt
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        elif isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)):
            yield from _breaks(stmt.orelse)
        else:
            for block in ("body", "orelse", "finalbody"):
                yield from _breaks(getattr(stmt, block, []) or [])
            for handler in getattr(stmt, "handlers", []) or []:
                yield from _breaks(handler.body)
            for case in getattr(stmt, "cases", []) or []:
                yield from _breaks(case.body)


def breaks_now(end: Ending, frame: FrameType) -> int | None:
    """The line of the first ``if`` whose ``break`` ends the loop on ``frame``'s variables
    now; None where none does. A test that fails to evaluate does not break."""
    scope = frame.f_globals if frame.f_code.co_name == "<module>" else frame.f_locals
    for line, test in end.tests:
        try:
            if eval(compile(ast.Expression(body=test), frame.f_code.co_filename, "eval"),
                    frame.f_globals, scope):
                return line
        except Exception:
            continue
    return None


def next_line(end: Ending, frame: FrameType) -> int:
    """A ``while`` back at its body's first line with the finished run's variables: where
    control goes on, as the loop itself would decide: the ``if`` of a ``break`` that now
    ends it, else the loop's condition, else (``while True``) the body it is already at."""
    line = breaks_now(end, frame)
    if line is not None:
        return line
    return end.line if end.tested else end.body


@dataclass(eq=False)
class RangeAt:
    """``range`` for the one ``for`` statement of a finished run's loop: put into the
    script's globals while that statement builds its iterable, it hands the loop the
    ``range``'s iterator positioned just past ``last`` (the finished run's last item), once
    ``restore`` has put the finished state back; any other call is the builtin's."""

    frame: FrameType
    end: Ending
    last: int
    restore: Callable[[], None]
    lost: Callable[[str], None]
    used: bool = field(default=False, init=False)
    installed: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self._scope = self.frame.f_globals
        self.installed = "range" not in self._scope  # the script's own range is left alone
        if self.installed:
            self._scope["range"] = self

    def uninstall(self) -> None:
        if self.installed and self._scope.get("range") is self:
            del self._scope["range"]
        self.installed = False

    def __call__(self, *args: Any) -> Any:
        span = builtins.range(*args)
        caller = sys._getframe(1)
        if caller is not self.frame or caller.f_lineno != self.end.line:
            return span
        self.uninstall()
        self.used = True
        iterator = iter(span)
        if self.last in span:
            iterator.__setstate__(span.index(self.last) + 1)  # type: ignore[attr-defined]
        elif not span or (self.last - span[-1]) * span.step > 0:
            iterator.__setstate__(len(span))  # type: ignore[attr-defined]
        else:
            self.lost(f"the loop at line {self.end.line} runs over {span}, which does not hold "
                      f"{self.end.target} = {self.last} (the script started it elsewhere itself)")
            return iterator
        self.restore()
        if breaks_now(self.end, self.frame) is not None:
            iterator.__setstate__(len(span))  # type: ignore[attr-defined]  # the loop ended at its break
        return iterator

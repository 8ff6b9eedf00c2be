"""The running frames of the main script: finding them, writing their variables, and
reading the iterators their ``for`` statements hold.

Resuming a loop written in a script means putting back what the loop keeps in its frame:
its variables, and for each ``for`` statement the iterator it is drawing from. Python
exposes the first (``f_locals`` plus ``PyFrame_LocalsToFast`` for a function frame,
``f_globals`` at module level) but not the second: a ``for`` keeps its iterator on the
interpreter's value stack. CPython 3.11 and 3.12 lay a frame out the same way, and while a
trace function runs for a frame its stack top is stored in it, so the iterators can be read
there (:func:`loop_iterators`). :func:`supported` proves the layout on a frame of known
content before any of it is trusted; where it does not hold, the caller falls back to
saying what it cannot do.
"""

from __future__ import annotations

import ctypes
import dis
import functools
import os
import site
import sys
import sysconfig
from collections.abc import Callable, Iterator
from types import CodeType, FrameType
from typing import Any

#: byte offsets in CPython 3.11 / 3.12 (64-bit, release build): ``PyFrameObject.f_frame``;
#: ``_PyInterpreterFrame.stacktop`` and ``.localsplus``
_F_FRAME, _STACKTOP, _LOCALSPLUS = 24, 64, 72
_POINTER = ctypes.sizeof(ctypes.c_void_p)


def is_main(frame: FrameType) -> bool:
    """A frame running code of the main script (its module or a function it defines)."""
    return frame.f_globals.get("__name__") == "__main__"


def is_user(frame: FrameType) -> bool:
    """A frame running the user's own code: the main script, or a module of theirs (one not
    in the standard library, an installed distribution or Ravex; a package installed
    editable lives in the user's tree and counts as theirs). Its loops are the ones a rerun
    must resume. A tool's ``__main__`` (``python -m pytest``) is not the user's script: under
    it, the outermost frame of the user's code is a test function, not a script. Nor is code
    with no file (``python -c``, which is how ``multiprocessing`` starts a spawned process:
    its ranks' and workers' outermost frame)."""
    if frame.f_code.co_filename.startswith("<"):
        return False
    if is_main(frame):  # a script, or a console script without .py; not pytest's or another tool's __main__
        return not _installed_file(frame.f_code.co_filename)
    return user_code(frame.f_code)


@functools.lru_cache(maxsize=4096)
def _user_file(filename: str) -> bool:
    if not filename or filename.startswith("<") or not filename.endswith(".py"):
        return False
    return not _installed_file(filename)


def _installed_file(filename: str) -> bool:
    """A file of the standard library, an installed distribution or Ravex."""
    path = os.path.realpath(filename)
    return any(path == root or path.startswith(root + os.sep) for root in _installed_roots())


@functools.lru_cache(maxsize=1)
def _installed_roots() -> tuple[str, ...]:
    """Where the interpreter's own and installed code lives, and Ravex itself."""
    roots = {os.path.dirname(os.path.dirname(os.path.realpath(__file__)))}
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix}:
        paths = sysconfig.get_paths(vars={"base": prefix, "platbase": prefix, "installed_base": prefix,
                                          "installed_platbase": prefix})
        roots.update(os.path.realpath(paths[key]) for key in ("stdlib", "platstdlib", "purelib", "platlib"))
    roots.update(os.path.realpath(p) for p in site.getsitepackages())
    # another environment's packages on the path (a .pth file, PYTHONPATH)
    roots.update(os.path.realpath(p) for p in sys.path
                 if os.path.basename(os.path.normpath(p)) in ("site-packages", "dist-packages"))
    user_site = site.getusersitepackages()
    if isinstance(user_site, str):
        roots.add(os.path.realpath(user_site))
    return tuple(sorted(roots))


def main_file() -> str | None:
    """The main script's path, while it runs (the interpreter removes ``__main__.__file__``
    once the script has ended); None for an interactive session or ``-c``."""
    return getattr(sys.modules.get("__main__"), "__file__", None)


def user_frames(frame: FrameType | None) -> list[FrameType]:
    """The frames of the user's code (:func:`is_user`) from ``frame`` outward, outermost first."""
    found = []
    while frame is not None:
        if is_user(frame):
            found.append(frame)
        frame = frame.f_back
    return found[::-1]


def code_key(code: CodeType) -> str:
    """How a rerun recognises the same code: file base name, name, first line."""
    return f"{os.path.basename(code.co_filename)}:{code.co_name}:{code.co_firstlineno}"


def read_variables(frame: FrameType, names: frozenset[str]) -> dict[str, Any]:
    """The values of ``names`` in ``frame``: variables, and ``obj.attr`` for an attribute of
    one of its objects (a counter on ``self``)."""
    return read_module(frame.f_globals if frame.f_code.co_name == "<module>" else frame.f_locals, names)


def read_module(scope: dict[str, Any], names: frozenset[str]) -> dict[str, Any]:
    """The values of ``names`` (variables and ``obj.attr``) in a namespace."""
    values = {}
    for name in sorted(names):
        base, dot, attr = name.partition(".")
        if not dot:
            if name in scope:
                values[name] = scope[name]
        elif base in scope and _has_own(scope[base], attr):
            values[name] = getattr(scope[base], attr)
    return values


@functools.lru_cache(maxsize=1024)
def has_loop(code: CodeType) -> bool:
    """Whether the code object holds a loop (a backward jump), read from its bytecode: no
    need to parse its file's source to know that a function without one has none."""
    return any("BACKWARD" in op.opname for op in dis.get_instructions(code))


def user_code(code: CodeType) -> bool:
    """Code of a module of the user's (:func:`is_user`)."""
    return _user_file(code.co_filename)


def _has_own(obj: Any, attr: str) -> bool:
    """An attribute the object holds itself (its ``__dict__`` or slots), not a method or a
    property its class computes."""
    try:
        return attr in vars(obj)
    except TypeError:
        return False


def write_variables(frame: FrameType, values: dict[str, Any]) -> None:
    """Set variables of a running frame (globals at module level, else its fast locals),
    then the attributes of its objects."""
    if not values:
        return
    plain = {k: v for k, v in values.items() if "." not in k}
    if frame.f_code.co_name == "<module>" and frame.f_locals is frame.f_globals:
        frame.f_globals.update(plain)
    elif plain:
        frame.f_locals.update(plain)
        ctypes.pythonapi.PyFrame_LocalsToFast(ctypes.py_object(frame), ctypes.c_int(0))
    scope = frame.f_globals if frame.f_code.co_name == "<module>" else frame.f_locals
    for name, value in values.items():
        base, dot, attr = name.partition(".")
        if dot and base in scope:
            setattr(scope[base], attr, value)


def _nlocalsplus(code: CodeType) -> int:
    return len(set(code.co_varnames) | set(code.co_cellvars)) + len(code.co_freevars)


def value_stack(frame: FrameType) -> list[Any] | None:
    """The values on ``frame``'s stack, bottom first. Valid only inside a trace function
    called for ``frame`` (the only time its stack top is stored); None on an interpreter
    whose layout this does not know."""
    if not _layout_known():
        return None
    frame_ptr = ctypes.c_void_p.from_address(id(frame) + _F_FRAME).value
    if not frame_ptr:
        return None
    top = ctypes.c_int.from_address(frame_ptr + _STACKTOP).value
    base = _nlocalsplus(frame.f_code)
    if top < base or top - base > 64:
        return None
    values = []
    for slot in range(base, top):
        address = ctypes.c_void_p.from_address(frame_ptr + _LOCALSPLUS + slot * _POINTER).value
        if not address:
            return None
        values.append(ctypes.cast(address, ctypes.py_object).value)
    return values


def loop_iterator(frame: FrameType, stacked: tuple[tuple[str, int], ...], line: int) -> Iterator[Any] | None:
    """The iterator of the ``for`` statement at ``line`` around the frame's current line,
    given the blocks around it that keep a value on the stack (``stacked``, from
    :mod:`.source`); None when the stack does not hold exactly those."""
    values = value_stack(frame)
    if values is None or len(values) != len(stacked):
        return None
    for value, (kind, at) in zip(values, stacked, strict=True):
        if kind == "for" and at == line:
            return value if hasattr(type(value), "__next__") else None
    return None


def _layout_known() -> bool:
    return (sys.implementation.name == "cpython" and sys.version_info[:2] in ((3, 11), (3, 12))
            and _POINTER == 8 and not hasattr(sys, "gettotalrefcount"))


_proven: bool | None = None


def supported() -> bool:
    """Whether this interpreter lets a rerun re-enter a script's loops: its frame layout
    proven on a loop of known iterator, and no other trace function in the way."""
    global _proven
    if sys.gettrace() is not None:
        return False
    if _proven is None:
        _proven = _layout_known() and _prove()
    return _proven


def _prove() -> bool:
    marker = iter(range(3))
    seen: list[object] = []

    def local(frame: FrameType, event: str, arg: Any) -> Callable[..., Any] | None:
        if event == "line" and frame.f_lineno == body_line and not seen:
            seen.append(loop_iterator(frame, (("for", loop_line),), loop_line))
        return local

    def probe() -> None:
        for _ in marker:
            pass  # the line the probe watches

    loop_line = probe.__code__.co_firstlineno + 1
    body_line = loop_line + 1
    sys.settrace(lambda frame, event, arg: local if frame.f_code is probe.__code__ else None)
    try:
        probe()
    finally:
        sys.settrace(None)
    return bool(seen) and seen[0] is marker

"""Where the main script's loops stood at a checkpoint: what a checkpoint records of them.

A checkpoint is taken between two iterations of the script's training loop: at the
DataLoader's ``next()`` (the loop's header, ``"header"``) or, for a loop without one, at the
first line of its body (``"head"``, found by :class:`.headwatch.HeadWatch`; where the batch
its ``for`` just drew is one a wrapper ahead of the loader still holds, ``"drawn"``, recorded
as the loop's header). :func:`capture`
records, for every frame of the main script on the stack, the loops around its line (from
the source, :mod:`.source`), the values a ``for`` of each outer loop had bound
(``epoch = 3``) and the variables the loops carry (:func:`.source.place`'s live set);
:func:`capture_variables` only the variables, where ``ravex.loop`` saves the positions
(``"loop"``); :func:`capture_end` the outermost loop of a run that finished, as it ended
(``"end"``, :mod:`.ending`), and where that loop cannot decide again on a rerun,
:func:`capture_after` the line after it (``"after"``). A rerun goes back there with
:class:`.reentry.Reentry` and puts the variables back with :func:`put_variables`.
"""

from __future__ import annotations

import inspect
import os
import sys
from types import CodeType, FrameType
from typing import Any

import torch
from torch.utils.data.dataloader import _BaseDataLoaderIter

from . import frames, source
from .ending import ending


def capture(frame: FrameType, mode: str, wanted: str | list[str]) -> tuple[dict[str, Any] | None, list[str]]:
    """The script's position with ``frame`` (the innermost main-script frame) at ``mode``
    (``"head"``, ``"header"`` or ``"drawn"``): the subtree a checkpoint stores, or None where
    the loops cannot be re-entered; and the loop variables that could not be saved.

    ``"drawn"`` is a head whose ``for`` drew an item the look-ahead rule counts as not
    consumed (a wrapper that drained its loader handed it over): recorded as that loop's
    header, whose next draw a rerun's loader gives back."""
    stack = frames.user_frames(frame)
    if not stack or stack[-1] is not frame:
        return None, []
    line = frame.f_lineno
    if mode == "drawn":
        code = frame.f_code
        head = source.place(code.co_filename, code.co_name, code.co_firstlineno, line, "head")
        mode = "head"
        if head is not None and head.loops and head.loops[-1].kind == "for":
            mode, line = "header", head.loops[-1].line
    recorded = []
    unsaved: list[str] = []
    for f in stack:
        at = mode if f is frame else "call"
        code = f.f_code
        lineno = line if f is frame else f.f_lineno
        place = source.place(code.co_filename, code.co_name, code.co_firstlineno, lineno, at)
        if place is None or not place.exact:
            return None, []
        loops = []
        for i, site in enumerate(place.loops):
            targets = None
            if site.kind == "for" and not (at == "header" and i == len(place.loops) - 1):
                targets = frames.read_variables(f, frozenset(site.targets))
                shift = place.shifts[i] if i < len(place.shifts) else {}
                if (shift is None or len(targets) != len(site.targets)
                        or not all(map(_comparable, targets.values()))):
                    return None, []
                for name, added in shift.items():
                    targets[name] = _unshift(targets[name], added)
                    if targets[name] is None:
                        return None, []
            loops.append({"line": site.line, "body": site.body, "kind": site.kind, "targets": targets})
        carried = place.live | _method_stores(f, place)
        recorded.append({"code": frames.code_key(code), "file": _file_key(code.co_filename),
                         "line": lineno, "loops": loops,
                         "variables": _variables(f, carried, wanted, unsaved)})
    if not any(r["loops"] for r in recorded):
        return None, []
    return {"mode": mode, "frames": recorded}, unsaved


def _unshift(value: Any, shift: float) -> Any:
    """The item a ``for`` drew, from its variable's value now and what the body added to it
    since (:attr:`.source.Place.shifts`); None where that cannot be undone exactly."""
    if not shift:
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    item = value - shift
    return int(item) if isinstance(value, int) and float(shift).is_integer() else item


def _method_stores(frame: FrameType, place: source.Place) -> frozenset[str]:
    """What the methods the loops call on the frame's objects assign on them
    (``self.train_step()`` doing ``self.global_step += 1``), where those objects' attributes
    may be read again: counters a loop keeps on an object through its methods. Followed
    through the methods those call on the same object, three calls deep."""
    if not place.loops:
        return frozenset()
    code = frame.f_code
    calls = source.method_calls(code.co_filename, code.co_name, code.co_firstlineno, place.loops[0].line)
    scope = frame.f_globals if code.co_name == "<module>" else frame.f_locals
    found: set[str] = set()
    for base, method in calls:
        if f"{base}.*" in place.reads and base in scope:
            found.update(f"{base}.{attr}" for attr in _receiver_stores(type(scope[base]), method))
    return frozenset(found)


def _receiver_stores(cls: type, method: str) -> set[str]:
    """The attributes ``cls.method`` assigns on its object, followed through the methods it
    calls on it, three calls deep; only methods of the user's own code are read."""
    found: set[str] = set()
    todo, seen = [(method, 0)], set()
    while todo:
        name, depth = todo.pop()
        code = getattr(getattr(cls, name, None), "__code__", None)
        if code is None or name in seen or depth > 3 or not frames.user_code(code):
            continue
        seen.add(name)
        stores, nested = source.receiver_stores(code.co_filename, code.co_name, code.co_firstlineno)
        found.update(stores)
        todo.extend((n, depth + 1) for n in nested)
    return found


def _file_key(filename: str) -> str:
    """How a record names its code's file: relative to the main script's folder where it lies
    below it (a rerun from another clone finds it again), else the absolute path."""
    path = os.path.realpath(filename)
    main = frames.main_file()
    if main:
        base = os.path.dirname(os.path.realpath(main))
        if path.startswith(base + os.sep):
            return os.path.relpath(path, base)
    return path


def _resolve_file(record: dict[str, Any], main_file: str) -> str:
    """The file a record's code is in, for this run (:func:`_file_key`'s inverse); a record
    of a checkpoint from before files were recorded is in the main script."""
    key = record.get("file")
    if key is None:
        return main_file
    return key if os.path.isabs(key) else os.path.join(os.path.dirname(os.path.realpath(main_file)), key)


def capture_variables(frame: FrameType, wanted: str | list[str]) -> tuple[dict[str, Any] | None, list[str]]:
    """Only the variables the main script's loops carry, with ``frame`` (the innermost
    main-script frame) at the ``for`` of a loop wrapped in ``ravex.loop``, which saves the
    loops' positions itself (mode ``"loop"``): a hidden state or a running total carried
    across the iterations of a function's loop is restored with them."""
    recorded: list[dict[str, Any]] = []
    unsaved: list[str] = []
    for f in frames.user_frames(frame):
        code = f.f_code
        place = source.place(code.co_filename, code.co_name, code.co_firstlineno, f.f_lineno,
                             "header" if f is frame else "call")
        if place is None or not place.loops or not place.exact:
            continue
        recorded.append({"code": frames.code_key(code), "line": f.f_lineno, "loops": [],
                         "variables": _variables(f, place.live, wanted, unsaved)})
    if not recorded:
        return None, []
    return {"mode": "loop", "frames": recorded}, unsaved


def _variables(frame: FrameType, live: frozenset[str], wanted: str | list[str], unsaved: list[str]) -> dict[str, Any]:
    """``frame``'s variables to save: ``live`` (``wanted == "auto"``) or the names asked
    for, encoded; those that cannot be saved are named in ``unsaved`` (not a function, a
    module, or a DataLoader's iterator, which the resume puts back itself)."""
    names = live if wanted == "auto" else frozenset(() if wanted == "none" else wanted)
    variables = {}
    for name, value in frames.read_variables(frame, names).items():
        encoded = _encode(value)
        if encoded is _UNSAVEABLE:
            if not callable(value) and not isinstance(value, (type(sys), _BaseDataLoaderIter)):
                unsaved.append(f"{name} ({type(value).__name__})")
            continue
        variables[name] = encoded
    return variables


def live_frames(script: dict[str, Any], frame: FrameType | None) -> list[FrameType]:
    """The running frames from ``frame`` outward that match ``script``'s recorded ones,
    outermost first."""
    found = {frames.code_key(f.f_code): f for f in frames.user_frames(frame)}
    return [found[r["code"]] for r in script["frames"] if r["code"] in found]


def put_variables(script: dict[str, Any], live: list[FrameType]) -> None:
    """Write ``script``'s recorded variables into the matching ``live`` frames."""
    by_key = {frames.code_key(f.f_code): f for f in live}
    for record in script["frames"]:
        frame = by_key.get(record["code"])
        if frame is not None and record["variables"]:
            frames.write_variables(frame, {k: decode(v) for k, v in record["variables"].items()})


def capture_after(last: dict[str, Any], filename: str, wanted: str | list[str]) -> dict[str, Any] | None:
    """The script ran to its end: its position just past its training (mode ``"after"``), so
    that a rerun of a finished run skips it instead of training again. ``last`` is the
    position of this run's last checkpoint in a loop, ``filename`` the main script (the
    interpreter has removed ``__main__.__file__`` by exit). Taken at exit, when no frame of
    the script is left: the way past may need no variable of a function, and what it needs
    of the main module (its globals, attributes of its objects) must be saveable. The
    innermost frame of ``last`` that qualifies is used, from the frame of the outermost loop
    (skip that loop) out to the main module (skip the call that ran it; past the module's last
    statement, the rerun ends there). None where none qualifies (:func:`.source.after`)."""
    main = sys.modules.get("__main__")
    records = last["frames"]
    outermost = next((i for i, r in enumerate(records) if r["loops"]), None)
    if main is None or outermost is None:
        return None
    scope = vars(main)
    # a frame below the outermost loop's runs once per iteration of it: skipping a loop there
    # would leave the outer loop to train again
    for index in range(outermost, -1, -1):
        record = records[index]
        _, name, first = record["code"].rsplit(":", 2)
        line = record["loops"][0]["line"] if record["loops"] else record["line"]
        way = source.after(_resolve_file(record, filename), name, int(first), line)
        if way is None:
            continue
        if name != "<module>" or index != 0:
            if way.carried or (way.call is not None and way.reads):
                continue  # the function's own variables died with its frame
            variables: dict[str, Any] | None = {}
        else:
            variables = _module_variables(scope, way, wanted)
            if variables is None:
                continue
        frames_out = [dict(r, loops=[], variables={}) for r in records[:index + 1]]
        frames_out[0]["variables"] = variables
        frames_out[-1]["after"] = {"loop": way.statement, "line": way.target}
        return {"mode": "after", "frames": frames_out}
    return None


def capture_end(last: dict[str, Any], filename: str, held: list[FrameType],
                wanted: str | list[str]) -> dict[str, Any] | None:
    """The script's training loop as it ended (mode ``"end"``, :mod:`.ending`): the outermost
    loop of ``last`` (this run's last position in the loops) with the last item its ``for``
    drew, and the final values of the variables ``last`` recorded in each frame out to it,
    read from ``held`` (the frames of that position, which keep their variables once they
    have returned) or, at module level, from the main module. A rerun goes back into that
    loop and lets it decide whether it trains on. None where the loop's ending cannot be
    decided again (:func:`.ending.ending`), a frame is not held, or a value cannot be saved."""
    main = sys.modules.get("__main__")
    records = last["frames"]
    outermost = next((i for i, r in enumerate(records) if r["loops"]), None)
    if main is None or outermost is None:
        return None
    by_key = {frames.code_key(f.f_code): f for f in held}
    recorded: list[dict[str, Any]] = []
    for index, record in enumerate(records[:outermost + 1]):
        _, name, first = record["code"].rsplit(":", 2)
        if name == "<module>":
            scope = vars(main)
        elif record["code"] in by_key:
            scope = by_key[record["code"]].f_locals
        else:
            return None
        names = set(record["variables"])
        loops: list[dict[str, Any]] = []
        end = None
        if index == outermost:
            loop = record["loops"][0]
            end = ending(_resolve_file(record, filename), name, int(first), loop["line"])
            if end is None:
                return None
            if end.target is not None:
                names.add(end.target)
        variables = {}
        for key, value in frames.read_module(scope, frozenset(names)).items():
            encoded = _encode(value)
            if encoded is _UNSAVEABLE:
                return None
            variables[key] = encoded
        if end is not None:
            targets = None
            if end.target is not None:
                item = variables.get(end.target)
                if isinstance(item, bool) or not isinstance(item, int):
                    return None  # the loop never drew an item
                targets = {end.target: item}
            loops = [dict(record["loops"][0], targets=targets)]
        recorded.append(dict(record, loops=loops, variables=variables))
    return {"mode": "end", "frames": recorded}


def capture_past(last: dict[str, Any], filename: str, frame: FrameType,
                 wanted: str | list[str]) -> dict[str, Any] | None:
    """:func:`capture_after`'s position taken while ``frame`` is alive, standing at the line
    right past the outermost loop of ``last`` (or past the call that ran it): a function's
    own variables can be read there too. None where ``frame`` is not there."""
    records = last["frames"]
    outermost = next((i for i, r in enumerate(records) if r["loops"]), None)
    key = frames.code_key(frame.f_code)
    index = next((i for i, r in enumerate(records) if r["code"] == key), None)
    if outermost is None or index is None or index > outermost:
        return None
    record = records[index]
    _, name, first = record["code"].rsplit(":", 2)
    line = record["loops"][0]["line"] if record["loops"] else record["line"]
    way = source.after(_resolve_file(record, filename), name, int(first), line)
    if way is None or way.target != frame.f_lineno:
        return None
    scope = frame.f_globals if name == "<module>" else frame.f_locals
    variables = _module_variables(scope, way, wanted)
    if variables is None:
        return None
    frames_out = [dict(r, loops=[], variables={}) for r in records[:index + 1]]
    frames_out[-1]["variables"] = variables
    frames_out[-1]["after"] = {"loop": way.statement, "line": way.target}
    return {"mode": "after", "frames": frames_out}


def _module_variables(scope: dict[str, Any], way: source.After, wanted: str | list[str]) -> dict[str, Any] | None:
    """The values the code after a skipped statement needs, read from ``scope`` (the main
    module's globals, or a live frame's variables), encoded; None when one cannot be saved
    (then the statement cannot be skipped)."""
    carried = set(way.carried)
    if way.call is not None and way.call[0] in scope:
        base, method = way.call
        stores = _receiver_stores(type(scope[base]), method)
        carried |= source.carried(way.reads, frozenset(f"{base}.{attr}" for attr in stores))
    names = frozenset(carried) if wanted == "auto" else frozenset(() if wanted == "none" else wanted)
    variables = {}
    for key, value in frames.read_module(scope, names).items():
        encoded = _encode(value)
        if encoded is _UNSAVEABLE:
            return None
        variables[key] = encoded
    return variables


def changed(script: dict[str, Any], filename: str) -> str | None:
    """Why this run, whose main script is ``filename``, no longer has the loops ``script``
    recorded where it recorded them (the script was edited or renamed since, or another
    script is running), or None when it still has."""
    main = script["frames"][0]
    if os.path.basename(filename) != main["code"].split(":")[0]:
        return f"the checkpoint was taken in {main['code'].split(':')[0]}, this run is {os.path.basename(filename)}"
    for record in script["frames"]:
        base, name, first = record["code"].rsplit(":", 2)
        where = f"{base}:{name}"
        path = _resolve_file(record, filename)
        for loop in record["loops"]:
            place = source.place(path, name, int(first), loop["body"], "head")
            sites = place.loops if place is not None else ()
            if not any((s.line, s.body, s.kind) == (loop["line"], loop["body"], loop["kind"]) for s in sites):
                return f"the {loop['kind']} loop of {where} at line {loop['line']} is no longer there"
        after = record.get("after")
        if after is not None:
            way = source.after(path, name, int(first), after["loop"])
            if way is None or (way.statement, way.target) != (after["loop"], after["line"]):
                return f"the code of {where} at line {after['loop']} is no longer there"
    return None


def describe(script: dict[str, Any]) -> str:
    """``train.py:255`` for a recorded position: the innermost loop's file and line (the
    line after the loop, for a finished run)."""
    if script["mode"] == "after":
        record = script["frames"][-1]
        return f"{record['code'].split(':')[0]}:{record['after']['line'] or 'end'}"
    inner = [r for r in script["frames"] if r["loops"]][-1]
    return f"{inner['code'].split(':')[0]}:{inner['loops'][-1]['line']}"


def drawn_explicitly(frame: FrameType | None) -> bool:
    """A DataLoader's ``next()`` called with ``frame`` its caller: True where the user's own
    code calls ``next(it)`` in a statement of a loop (a ``while True:`` drawing batches),
    False where a ``for`` draws it or a framework's code calls it."""
    if frame is None or not frames.is_user(frame):
        return False
    code = frame.f_code
    place = source.place(code.co_filename, code.co_name, code.co_firstlineno, frame.f_lineno, "call")
    return (place is not None and bool(place.loops)
            and not source.drawn_by_for(code.co_filename, code.co_name, code.co_firstlineno, frame.f_lineno))


def feeding_loop(frame: FrameType, stepping: frozenset[CodeType]) -> FrameType:
    """``frame``, or where it is a generator of the user's that only feeds a ``for`` of its caller
    (its code did not step: not in ``stepping``, the code on the stack at the step that made the
    checkpoint due; empty, unknown: nothing is passed over), that caller, and so on outward.
    Such a generator (a prefetcher, a queue ahead of the loader) holds no position of the
    training's: the batches it held are the look-ahead rule's, and a rerun makes it anew."""
    while stepping and frame.f_code not in stepping and (caller := iterating(frame)) is not None:
        frame = caller
    return frame


def iterating(frame: FrameType) -> FrameType | None:
    """The frame whose ``for`` header is running ``frame``, a generator of the user's, through
    any library code between them (``tqdm(prefetch(loader))``); None where ``frame`` is not one
    or another statement drew from it."""
    if not frame.f_code.co_flags & inspect.CO_GENERATOR:
        return None
    caller = innermost_frame(frame.f_back)
    if caller is None:
        return None
    code = caller.f_code
    return caller if source.drawn_by_for(code.co_filename, code.co_name, code.co_firstlineno, caller.f_lineno) else None


def innermost_frame(frame: FrameType | None) -> FrameType | None:
    """The innermost frame of the user's code at or outside ``frame``."""
    while frame is not None and not frames.is_user(frame):
        frame = frame.f_back
    return frame


# ── values ──────────────────────────────────────────────────────────────

_UNSAVEABLE = object()
_PLAIN = (type(None), bool, int, float, str, bytes)


def _comparable(value: Any) -> bool:
    if isinstance(value, _PLAIN):
        return True
    return isinstance(value, tuple) and all(map(_comparable, value))


def _encode(value: Any) -> Any:
    """A variable as state-tree values: plain values and containers as they are, a tensor
    detached with its device; anything else cannot be saved."""
    if isinstance(value, _PLAIN):
        return value
    if type(value) is torch.Tensor and value.layout == torch.strided:
        return {"ravex_tensor": value.detach(), "device": str(value.device),
                "requires_grad": value.requires_grad}
    if isinstance(value, (tuple, list)) and type(value) in (tuple, list):
        items = [_encode(v) for v in value]
        if any(i is _UNSAVEABLE for i in items):
            return _UNSAVEABLE
        return tuple(items) if isinstance(value, tuple) else items
    if type(value) is dict and all(isinstance(k, str) for k in value):
        out = {k: _encode(v) for k, v in value.items()}
        if "ravex_tensor" in out or any(v is _UNSAVEABLE for v in out.values()):
            return _UNSAVEABLE
        return out
    return _UNSAVEABLE


def decode(value: Any) -> Any:
    """The inverse of :func:`_encode` on a read tree (arrays as numpy or tensors)."""
    from ravex.saving.dtypes import as_tensor

    if isinstance(value, dict) and "ravex_tensor" in value:
        data = value["ravex_tensor"]
        tensor = data if isinstance(data, torch.Tensor) else as_tensor(data)
        tensor = tensor.to(value["device"])
        return tensor.requires_grad_(bool(value["requires_grad"]))
    if isinstance(value, tuple):
        return tuple(decode(v) for v in value)
    if isinstance(value, list):
        return [decode(v) for v in value]
    if isinstance(value, dict):
        return {k: decode(v) for k, v in value.items()}
    return value

"""Where the main script's loops stood at a checkpoint: what a checkpoint records of them.

A checkpoint is taken between two iterations of the script's training loop: at the
DataLoader's ``next()`` (the loop's header, ``"header"``) or, for a loop without one, at the
first line of its body (``"head"``, found by :class:`.headwatch.HeadWatch`). :func:`capture`
records, for every frame of the main script on the stack, the loops around its line (from
the source, :mod:`.source`), the values a ``for`` of each outer loop had bound
(``epoch = 3``) and the variables the loops carry (:func:`.source.place`'s live set);
:func:`capture_variables` only the variables, where ``ravex.loop`` saves the positions
(``"loop"``); :func:`capture_after` the line after the outermost loop of a run that
finished (``"after"``). A rerun goes back there with :class:`.reentry.Reentry` and puts the
variables back with :func:`put_variables`.
"""

from __future__ import annotations

import os
import sys
from types import FrameType
from typing import Any

import torch

from . import frames, source


def capture(frame: FrameType, mode: str, wanted: str | list[str]) -> tuple[dict[str, Any] | None, list[str]]:
    """The script's position with ``frame`` (the innermost main-script frame) at ``mode``
    (``"head"`` or ``"header"``): the subtree a checkpoint stores, or None where the loops
    cannot be re-entered; and the loop variables that could not be saved."""
    stack = frames.main_frames(frame)
    if not stack or stack[-1] is not frame:
        return None, []
    recorded = []
    unsaved: list[str] = []
    for f in stack:
        at = mode if f is frame else "call"
        code = f.f_code
        place = source.place(code.co_filename, code.co_name, code.co_firstlineno, f.f_lineno, at)
        if place is None or not place.exact:
            return None, []
        loops = []
        for i, site in enumerate(place.loops):
            targets = None
            if site.kind == "for" and not (at == "header" and i == len(place.loops) - 1):
                targets = frames.read_variables(f, frozenset(site.targets))
                if len(targets) != len(site.targets) or not all(map(_comparable, targets.values())):
                    return None, []
            loops.append({"line": site.line, "body": site.body, "kind": site.kind, "targets": targets})
        recorded.append({"code": frames.code_key(code), "line": f.f_lineno, "loops": loops,
                         "variables": _variables(f, place.live, wanted, unsaved)})
    if not any(r["loops"] for r in recorded):
        return None, []
    return {"mode": mode, "frames": recorded}, unsaved


def capture_variables(frame: FrameType, wanted: str | list[str]) -> tuple[dict[str, Any] | None, list[str]]:
    """Only the variables the main script's loops carry, with ``frame`` (the innermost
    main-script frame) at the ``for`` of a loop wrapped in ``ravex.loop``, which saves the
    loops' positions itself (mode ``"loop"``): a hidden state or a running total carried
    across the iterations of a function's loop is restored with them."""
    recorded: list[dict[str, Any]] = []
    unsaved: list[str] = []
    for f in frames.main_frames(frame):
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
    for, encoded; those that cannot be saved are named in ``unsaved``."""
    names = live if wanted == "auto" else frozenset(() if wanted == "none" else wanted)
    variables = {}
    for name, value in frames.read_variables(frame, names).items():
        encoded = _encode(value)
        if encoded is _UNSAVEABLE:
            if not callable(value) and not isinstance(value, type(sys)):
                unsaved.append(f"{name} ({type(value).__name__})")
            continue
        variables[name] = encoded
    return variables


def live_frames(script: dict[str, Any], frame: FrameType | None) -> list[FrameType]:
    """The running frames from ``frame`` outward that match ``script``'s recorded ones,
    outermost first."""
    found = {frames.code_key(f.f_code): f for f in frames.main_frames(frame)}
    return [found[r["code"]] for r in script["frames"] if r["code"] in found]


def put_variables(script: dict[str, Any], live: list[FrameType]) -> None:
    """Write ``script``'s recorded variables into the matching ``live`` frames."""
    by_key = {frames.code_key(f.f_code): f for f in live}
    for record in script["frames"]:
        frame = by_key.get(record["code"])
        if frame is not None and record["variables"]:
            frames.write_variables(frame, {k: decode(v) for k, v in record["variables"].items()})


def capture_after(last: dict[str, Any], filename: str, wanted: str | list[str]) -> dict[str, Any] | None:
    """The script ran to its end: its position just after the outermost loop of ``last``
    (the position of this run's last checkpoint in a loop, in the main script ``filename``:
    the interpreter has removed ``__main__.__file__`` by exit), mode ``"after"``, so that a
    rerun of a finished run skips that loop instead of training again. Taken at exit, when
    no frame of the script is left: only a loop at module level qualifies (its variables are
    the main module's globals), or one in a function whose loop assigns nothing that the
    code after it reads. None where neither holds."""
    main = sys.modules.get("__main__")
    records = [r for r in last["frames"] if r["loops"]]
    if main is None or not records:
        return None
    outer = last["frames"].index(records[0])
    record = records[0]
    _, name, first = record["code"].rsplit(":", 2)
    loop_line = record["loops"][0]["line"]
    after = source.after_loop(filename, name, int(first), loop_line)
    if after is None:
        return None
    line, live = after
    scope = vars(main)
    module_live = live if name == "<module>" else live & frozenset(scope)
    if name != "<module>" and live - module_live:
        return None  # the function's own variables died with its frame
    names = module_live if wanted == "auto" else frozenset(() if wanted == "none" else wanted)
    variables = {}
    for key in sorted(names & frozenset(scope)):
        encoded = _encode(scope[key])
        if encoded is not _UNSAVEABLE:
            variables[key] = encoded
    frames_out = [dict(r, loops=[], variables={}) for r in last["frames"][:outer + 1]]
    frames_out[0]["variables"] = variables if frames_out[0]["code"].split(":")[1] == "<module>" else {}
    frames_out[-1]["after"] = {"loop": loop_line, "line": line}
    return {"mode": "after", "frames": frames_out}


def changed(script: dict[str, Any], filename: str) -> str | None:
    """Why the main script ``filename`` no longer has the loops ``script`` recorded where it
    recorded them (the script was edited or renamed since), or None when it still has."""
    for record in script["frames"]:
        base, name, first = record["code"].rsplit(":", 2)
        where = f"{base}:{name}"
        if os.path.basename(filename) != base:
            return f"the checkpoint was taken in {base}, this run is {os.path.basename(filename)}"
        for loop in record["loops"]:
            place = source.place(filename, name, int(first), loop["body"], "head")
            sites = place.loops if place is not None else ()
            if not any((s.line, s.body, s.kind) == (loop["line"], loop["body"], loop["kind"]) for s in sites):
                return f"the {loop['kind']} loop of {where} at line {loop['line']} is no longer there"
        after = record.get("after")
        if after is not None:
            found = source.after_loop(filename, name, int(first), after["loop"])
            if found is None or found[0] != after["line"]:
                return f"the loop of {where} at line {after['loop']} is no longer there"
    return None


def describe(script: dict[str, Any]) -> str:
    """``train.py:255`` for a recorded position: the innermost loop's file and line (the
    line after the loop, for a finished run)."""
    if script["mode"] == "after":
        record = script["frames"][-1]
        return f"{record['code'].split(':')[0]}:{record['after']['line']}"
    inner = [r for r in script["frames"] if r["loops"]][-1]
    return f"{inner['code'].split(':')[0]}:{inner['loops'][-1]['line']}"


def innermost_frame(frame: FrameType | None) -> FrameType | None:
    """The innermost main-script frame at or outside ``frame``."""
    while frame is not None and not frames.is_main(frame):
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

"""Typed JSON: the state tree's structure and non-tensor values, without pickle.

JSON alone cannot tell ``1`` from ``1.0``, has no NaN, tuples, bytes or int keys.
The encoding keeps JSON's own types where they are exact and tags the rest with a
single-key object whose key starts with ``$``:

==================  ==========================================
Python              JSON
==================  ==========================================
None, bool, str     null, true/false, "..."
int                 integer
float               {"$float": "0.1"} (repr: nan, inf, -inf too)
bytes               {"$bytes": "<base64>"}
list                [...]
tuple               {"$tuple": [...]}
dict, str keys      {...} (when no key starts with "$")
other dict          {"$dict": [[key, value], ...]} (keys typed too)
array leaf          {"$array": "<array path>"}
==================  ==========================================

Decoding never executes anything from the store: it only builds these types. Its string keys,
and short name-like string values, are interned, as the attribute names and literals of the
program that wrote them were: ``pickle`` writes a string it has met before in the same dump as a
reference, but only when it is the same object, so a state dict restored with strings of its own
made the user's ``torch.save`` of it (the same values) other bytes.
"""

from __future__ import annotations

import base64
import sys
from collections.abc import Callable
from typing import Any

from ..errors import ManifestError, UnsupportedValueError

ARRAY_TAG = "$array"

#: The leaf types a state tree holds besides arrays (the first rows of the table above).
PLAIN_TYPES = frozenset({type(None), bool, int, float, str, bytes})


def all_plain(items: list[Any] | tuple[Any, ...]) -> bool:
    """Whether every item is a plain value: one pass in C, no Python call per item (Python's
    RNG state, 625 ints, is in every runtime checkpoint and is walked at every stage and load)."""
    return set(map(type, items)) <= PLAIN_TYPES


def encode_value(value: Any, on_array: Callable[[Any, tuple[Any, ...]], str], path: tuple[Any, ...] = ()) -> Any:
    """Encode ``value`` as typed JSON.

    ``on_array(leaf, path)`` is called for each leaf it does not handle itself (arrays);
    it returns the array path to record, or raises :class:`UnsupportedValueError`.
    ``path`` is the tuple of keys leading here, for error messages and array names.
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return {"$float": repr(float(value))}
    if isinstance(value, (bytes, bytearray)):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, list):
        return [encode_value(v, on_array, (*path, i)) for i, v in enumerate(value)]
    if isinstance(value, tuple):
        return {"$tuple": [encode_value(v, on_array, (*path, i)) for i, v in enumerate(value)]}
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("$") for k in value):
            return {k: encode_value(v, on_array, (*path, k)) for k, v in value.items()}
        return {
            "$dict": [
                [_encode_key(k, path), encode_value(v, on_array, (*path, k))]
                for k, v in value.items()
            ]
        }
    return {ARRAY_TAG: on_array(value, path)}


def _encode_key(key: Any, path: tuple[Any, ...]) -> Any:
    if isinstance(key, (str, int, float, tuple, type(None))):
        return encode_value(key, _no_arrays, path)
    raise UnsupportedValueError(
        f"dict key {key!r} at {_show(path)} has type {type(key).__name__}; "
        "keys must be str, int, float, bool, None or tuples of those"
    )


def _no_arrays(value: Any, path: tuple[Any, ...]) -> str:
    raise UnsupportedValueError(f"value at {_show(path)} of type {type(value).__name__} cannot be a key")


def decode_value(doc: Any, on_array: Callable[[str], Any], where: str = "tree") -> Any:
    """Invert :func:`encode_value`; ``on_array(path)`` supplies each array leaf."""
    if isinstance(doc, str):
        return _as_literal(doc)
    if doc is None or isinstance(doc, (bool, int)):
        return doc
    if isinstance(doc, list):
        return [decode_value(v, on_array, where) for v in doc]
    if isinstance(doc, float):
        raise ManifestError(f"{where}: bare JSON float {doc!r}; floats must be tagged {{'$float': ...}}")
    if not isinstance(doc, dict):
        raise ManifestError(f"{where}: unexpected JSON value {doc!r}")
    if len(doc) == 1:
        ((tag, body),) = doc.items()
        if tag.startswith("$"):
            return _decode_tagged(tag, body, on_array, where)
    for k in doc:
        if k.startswith("$"):
            raise ManifestError(f"{where}: untagged object with '$' key {k!r}")
    return {sys.intern(k): decode_value(v, on_array, where) for k, v in doc.items()}


def _decode_tagged(tag: str, body: Any, on_array: Callable[[str], Any], where: str) -> Any:
    try:
        if tag == "$float":
            return float(body) if isinstance(body, str) else _bad(tag, body, where)
        if tag == "$bytes":
            return base64.b64decode(body, validate=True)
        if tag == "$tuple":
            return tuple(decode_value(v, on_array, where) for v in body)
        if tag == "$dict":
            return {
                _hashable(decode_value(k, on_array, where)): decode_value(v, on_array, where)
                for k, v in body
            }
        if tag == ARRAY_TAG:
            return on_array(body) if isinstance(body, str) else _bad(tag, body, where)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ManifestError):
            raise
        raise ManifestError(f"{where}: malformed {tag} value {body!r}: {exc}") from None
    raise ManifestError(f"{where}: unknown tag {tag!r}; written by a newer Ravex?")


#: Longest string value interned as a literal of the same text would be (:func:`_as_literal`).
LITERAL_MAX_CHARS = 64


def _as_literal(text: str) -> str:
    """``text`` as the program that wrote it most likely held it: CPython interns a short
    string literal made of name characters (``"min"``, ``"weight_decay"``), so such a value is
    interned here too; any other string is left as decoded (interned strings live forever)."""
    if len(text) <= LITERAL_MAX_CHARS and text.isascii() and text.replace("_", "a").isalnum():
        return sys.intern(text)
    return text


def _hashable(key: Any) -> Any:
    if isinstance(key, (list, dict)):
        raise ManifestError(f"dict key {key!r} is not hashable")
    return sys.intern(key) if isinstance(key, str) else key


def _bad(tag: str, body: Any, where: str) -> Any:
    raise ManifestError(f"{where}: malformed {tag} value {body!r}")


def _show(path: tuple[Any, ...]) -> str:
    return "/".join(str(p) for p in path) or "<root>"

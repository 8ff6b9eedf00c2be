"""Walking a state tree: nested dicts, lists and tuples with tensors, arrays and plain values
at the leaves.

A list or tuple of plain values only (Python's RNG state: 625 ints) is a leaf here: it holds
nothing to map, and is checked in one pass in C instead of one Python call per item.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from ravex.format.objects.values import all_plain


def tree_map(fn: Callable[[Any], Any], tree: Any) -> Any:
    """``tree`` with every leaf replaced by ``fn(leaf)``; containers rebuilt, sequences of
    plain values kept as they are."""
    if isinstance(tree, dict):
        return {k: tree_map(fn, v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        if all_plain(tree):
            return tree
        if isinstance(tree, list):
            return [tree_map(fn, v) for v in tree]
        return tuple(tree_map(fn, v) for v in tree)
    return fn(tree)


def leaves(tree: Any) -> Iterator[Any]:
    """Every leaf of ``tree``, depth first, in the order :func:`tree_map` visits them."""
    if isinstance(tree, dict):
        for v in tree.values():
            yield from leaves(v)
    elif isinstance(tree, (list, tuple)):
        if not all_plain(tree):
            for v in tree:
                yield from leaves(v)
    else:
        yield tree

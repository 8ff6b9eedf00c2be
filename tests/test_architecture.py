"""The import structure of ``ravex/`` that docs/ARCHITECTURE.md describes.

The layering itself (faces -> runtime -> saving -> format, the format free of torch and of
the rest of ravex) is import-linter's contract in pyproject.toml, run by scripts/test.sh.
What import-linter does not check is a cycle between a package and one of its own
modules (``ravex/__init__.py`` importing a module that imports ``ravex`` back), so the
whole graph's cycles are found here, imports inside functions included.
"""

from __future__ import annotations

import grimp


def _cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(graph[nxt])))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def _ravex_graph() -> dict[str, list[str]]:
    graph = grimp.build_graph("ravex")
    return {m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}


def test_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"], "e": []}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_no_import_cycle_in_ravex() -> None:
    cycles = _cycles(_ravex_graph())
    assert not cycles, "import cycles in ravex/: " + "; ".join(" <-> ".join(c) for c in cycles)

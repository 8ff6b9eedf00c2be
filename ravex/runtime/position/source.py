"""Reading the main script's source: which loops hold a line, and which variables a loop
carries from one iteration to the next.

A script's training loop keeps its position in ordinary variables (nanoGPT's ``iter_num``,
a best metric, a batch fetched ahead) and in the iterators of its ``for`` statements. A
checkpoint taken at the head of a loop must save the first kind to resume exactly; this
module finds them by reading the source: a variable is saved when the loops around the
checkpoint assign it *and* some path from the checkpoint reads it before writing it again
(it is *live*, in the compiler's sense). Configuration the loops never assign is not
saved, so a rerun with new flags keeps them; a temporary the loop always writes before
reading (``loss``, ``logits``) costs nothing.

The analysis is a classic backward liveness pass over the statements of one function (or
the module), over-approximating where control flow is not tracked exactly: a variable
wrongly thought live is saved for nothing, one wrongly thought dead would be lost, so every
approximation errs toward live.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

_Scope = ast.Module | ast.FunctionDef | ast.AsyncFunctionDef
_LOOPS = (ast.For, ast.AsyncFor, ast.While)
#: blocks whose statement keeps a value on the interpreter's stack while its body runs
_STACKED = (ast.For, ast.AsyncFor, ast.With, ast.AsyncWith)


@dataclass(frozen=True)
class LoopSite:
    """One loop statement around a line."""

    line: int  #: the loop statement's first line
    body: int  #: its body's first line: where an iteration starts
    kind: str  #: ``"for"`` or ``"while"``
    end: int  #: its last line
    targets: tuple[str, ...] = ()  #: the names a ``for`` binds, in order
    target: ast.expr | None = field(default=None, compare=False)  #: the ``for`` target itself


@dataclass(frozen=True)
class Place:
    """A line of a function (or the module) seen from the loops around it."""

    loops: tuple[LoopSite, ...]  #: the loops around the line, outermost first
    #: the enclosing blocks that keep a value on the stack, outermost first: (kind, line)
    stacked: tuple[tuple[str, int], ...]
    live: frozenset[str]  #: variables the loops assign that may be read after this point before written
    exact: bool  #: False where a block the analysis cannot place encloses the line
    #: everything that may be read after this point (``obj.*``: any attribute of ``obj``)
    reads: frozenset[str] = frozenset()
    #: per loop: what the body has added to its ``for`` variables by this point (``epoch += 1``
    #: at the top of the body: ``{"epoch": 1}``), so the item drawn is the value less that;
    #: None where the body rebinds them otherwise (the item cannot be told)
    shifts: tuple[dict[str, float] | None, ...] = ()


def place(filename: str, name: str, first_line: int, line: int, mode: str) -> Place | None:
    """The loops around ``line`` in the code object ``name`` starting at ``first_line`` of
    ``filename``, and what is live there. ``mode`` says where in ``line`` the point is:
    ``"head"``, the start of the innermost loop's body (``line`` is its first line, a
    ``for``'s variables bound); ``"header"``, a loop statement about to take its next item
    (``line`` is the loop's own); ``"call"``, a call in progress in the statement holding
    ``line``. None when the file cannot be read or the code is not found in it."""
    scope = _scope(filename, name, first_line)
    if scope is None:
        return None
    chain = _chain(scope.body, line)
    if not chain:
        return None
    analysis = _Liveness(chain)
    last = chain[-1]
    loops = [c.owner for c in chain if isinstance(c.owner, _LOOPS) and c.block == "body"]
    stacked = [c.owner for c in chain if isinstance(c.owner, _STACKED) and c.block == "body"]
    header = last.stmts[last.index]
    if mode == "header":
        if not isinstance(header, _LOOPS):
            return None
        loops.append(header)
        if isinstance(header, _STACKED):
            stacked.append(header)
        live = _loop_head(header, analysis.after(len(chain) - 1), analysis.loop_ctx(len(chain) - 1))
    elif mode == "head":
        if not loops:
            return None
        level = max(i for i, c in enumerate(chain) if c.owner is loops[-1] and c.block == "body")
        live = analysis.before_block(level, 0)
    else:
        live = analysis.before_block(len(chain) - 1, last.index)
    # What functions declare ``global`` and assign is state they change for the loop,
    # wherever the module frame itself stands.
    declared = _globals_assigned(scope)
    if not loops:
        return Place((), (), declared, True, live)
    sites = tuple(_site(loop) for loop in loops)
    exact = not any(c.block in ("handler", "finally") for c in chain)
    bound = {n for s in sites for n in s.targets}
    shifts = tuple(_shift(chain, loop, started=not (mode == "head" and loop is loops[-1])) for loop in loops)
    return Place(sites, tuple(("for" if isinstance(b, (ast.For, ast.AsyncFor)) else "with", b.lineno)
                              for b in stacked),
                 frozenset((carried(live, _changes(loops[0]) | declared) | declared) - bound), exact, live,
                 shifts)


def _shift(chain: list[_Link], loop: ast.stmt, started: bool) -> dict[str, float] | None:
    """What the statements of ``loop``'s body before the chain's point add to its ``for``
    variables: constants added or taken by ``name += c`` / ``name -= c`` at the top of the
    body (minGPT-ddp's ``epoch += 1``); None where they rebind them in any other way.
    ``started``: the statement holding the point has begun (a call in it is running)."""
    if not isinstance(loop, (ast.For, ast.AsyncFor)):
        return {}
    names = set(_names(loop.target))
    link = next((c for c in chain if c.owner is loop and c.block == "body"), None)
    if link is None:
        return {}
    shift: dict[str, float] = {}
    for stmt in link.stmts[:link.index]:
        hit = names & _stores(stmt)
        if not hit:
            continue
        if not (isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name)
                and isinstance(stmt.op, (ast.Add, ast.Sub)) and isinstance(stmt.value, ast.Constant)
                and isinstance(stmt.value.value, (int, float)) and not isinstance(stmt.value.value, bool)):
            return None
        step = float(stmt.value.value) * (1 if isinstance(stmt.op, ast.Add) else -1)
        shift[stmt.target.id] = shift.get(stmt.target.id, 0.0) + step
    current = link.stmts[link.index]
    if started and names & _stores(current) and any(_blocks(current)):
        return None  # a compound statement may have rebound them before the point
    return shift


def after(filename: str, name: str, first_line: int, line: int) -> After | None:
    """A finished run's way past its training in the code object ``name`` starting at
    ``first_line``: the statement to skip (the outermost loop around ``line``, or where no
    loop holds it, the statement holding ``line``: the call that ran the loop), the line
    control goes to next (through the end of an ``if``, or of a ``try`` body with handlers
    only, as word_language_model's ``try: for epoch ...``; None at the end of the module), and
    what the skipped statement assigns that the code after it reads (it must come back from
    the checkpoint). None where there is no such way: the statement is the last of a
    function, or sits in an exception handler."""
    scope = _scope(filename, name, first_line)
    chain = _chain(scope.body, line) if scope is not None else []
    if not chain or scope is None:
        return None
    loops = [i for i, c in enumerate(chain) if isinstance(c.stmts[c.index], _LOOPS)]
    k = loops[0] if loops else len(chain) - 1
    if any(c.block in ("handler", "finally") for c in chain[:k + 1]):
        return None
    stmt = chain[k].stmts[chain[k].index]
    declared = _globals_assigned(scope)
    level, index = k, chain[k].index + 1
    while index >= len(chain[level].stmts):
        if level == 0:
            return After(stmt.lineno, None, declared, None) if isinstance(scope, ast.Module) else None
        owner = chain[level].owner
        if not (isinstance(owner, ast.If) or (isinstance(owner, ast.Try) and chain[level].block == "body"
                                               and not owner.orelse and not owner.finalbody)):
            return None  # falling off this block runs code of its own (an else, a finally, __exit__)
        level -= 1
        index = chain[level].index + 1
    live = _Liveness(chain).before_block(level, index)
    call = None
    if not loops and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        func = stmt.value.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            call = (func.value.id, func.attr)
    return After(stmt.lineno, chain[level].stmts[index].lineno,
                 carried(live, _changes(stmt) | declared) | declared, call, live)


@dataclass(frozen=True)
class After:
    """A finished run's way past its training (:func:`after`)."""

    statement: int  #: the line of the statement skipped
    target: int | None  #: where control goes on; None: the end of the module
    carried: frozenset[str]  #: what the statement assigns that the code after it reads
    #: the statement is ``obj.method()``: what the method assigns on ``obj`` is carried too
    call: tuple[str, str] | None
    reads: frozenset[str] = frozenset()  #: everything the code after it may read


def loop_at(filename: str, name: str, first_line: int, line: int) -> ast.For | ast.While | None:
    """The ``for`` or ``while`` statement starting at ``line`` of the code object ``name``
    starting at ``first_line`` (not one of a nested def); None where there is none."""
    scope = _scope(filename, name, first_line)
    chain = _chain(scope.body, line) if scope is not None else []
    if not chain:
        return None
    stmt = chain[-1].stmts[chain[-1].index]
    return stmt if isinstance(stmt, (ast.For, ast.While)) and stmt.lineno == line else None


def assigns(node: ast.AST, name: str) -> bool:
    """Whether ``node`` assigns the plain name ``name`` (outside nested defs)."""
    return name in _stores(node)


def carried(live: frozenset[str], changed: frozenset[str]) -> frozenset[str]:
    """What of ``changed`` is live: a name or attribute read later, or an attribute of an
    object whose attributes may all be read (``obj.*`` live: a method of it is called)."""
    return frozenset(n for n in changed
                     if n in live or ("." in n and f"{n.split('.', 1)[0]}.*" in live))


def method_calls(filename: str, name: str, first_line: int, loop_line: int) -> frozenset[tuple[str, str]]:
    """The methods the loop at ``loop_line`` calls on a named object (``self.step()`` ->
    ``("self", "step")``): what they assign on it is carried too (:func:`receiver_stores`)."""
    scope = _scope(filename, name, first_line)
    if scope is None:
        return frozenset()
    loop = next((n for n in ast.walk(scope) if isinstance(n, _LOOPS) and n.lineno == loop_line), None)
    if loop is None:
        return frozenset()
    return frozenset((n.func.value.id, n.func.attr) for n in ast.walk(loop)
                     if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                     and isinstance(n.func.value, ast.Name))


def receiver_stores(filename: str, name: str, first_line: int) -> tuple[frozenset[str], frozenset[str]]:
    """For a method (the function ``name`` at ``first_line``): the attributes it assigns on its
    first parameter (``self.global_step += 1`` -> ``global_step``), and the methods it calls
    on it, to follow in turn."""
    scope = _scope(filename, name, first_line)
    if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) or not scope.args.args:
        return frozenset(), frozenset()
    receiver = scope.args.args[0].arg
    stores = frozenset(n.split(".", 1)[1] for n in _stores(scope) if n.startswith(receiver + "."))
    calls = frozenset(n.func.attr for n in ast.walk(scope)
                      if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                      and isinstance(n.func.value, ast.Name) and n.func.value.id == receiver)
    return stores, calls


@functools.lru_cache(maxsize=256)
def drawn_by_for(filename: str, name: str, first_line: int, line: int) -> bool:
    """Whether ``line`` of a code object is the header of a ``for`` statement (a ``next()``
    there is the loop's own), rather than a statement calling ``next()`` itself."""
    scope = _scope(filename, name, first_line)
    chain = _chain(scope.body, line) if scope is not None else []
    if not chain:
        return False
    stmt = chain[-1].stmts[chain[-1].index]
    return isinstance(stmt, (ast.For, ast.AsyncFor)) and stmt.lineno == line


def _site(loop: ast.stmt) -> LoopSite:
    body = loop.body[0]  # type: ignore[attr-defined]
    first = min([body.lineno] + [d.lineno for d in getattr(body, "decorator_list", [])])
    end = loop.end_lineno or loop.lineno
    if isinstance(loop, (ast.For, ast.AsyncFor)):
        return LoopSite(loop.lineno, first, "for", end, tuple(_names(loop.target)), loop.target)
    return LoopSite(loop.lineno, first, "while", end)


@functools.lru_cache(maxsize=8)
def _parse(filename: str) -> ast.Module | None:
    try:
        with open(filename, encoding="utf-8") as f:
            return ast.parse(f.read(), filename)
    except (OSError, SyntaxError, ValueError):
        return None


def _scope(filename: str, name: str, first_line: int) -> _Scope | None:
    tree = _parse(filename)
    if tree is None:
        return None
    if name == "<module>":
        return tree
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            starts = {node.lineno} | {d.lineno for d in node.decorator_list}
            if first_line in starts:
                return node
    return None


@dataclass(frozen=True)
class _Link:
    """One step of the way down to a line: the statement ``owner`` holds the line in its
    ``block`` (``body``, ``orelse``, ``handler``, ``finally``, ``case``) at ``index``; the
    first link's owner is the scope itself."""

    owner: ast.AST
    block: str
    stmts: Sequence[ast.stmt]
    index: int


def _chain(body: Sequence[ast.stmt], line: int) -> list[_Link]:
    """The statements holding ``line``, outermost first, not entering nested defs."""
    chain: list[_Link] = []
    owner: ast.AST | None = None
    block = "body"
    stmts = body
    while True:
        index = next((i for i, s in enumerate(stmts)
                      if s.lineno <= line <= (s.end_lineno or s.lineno)), None)
        if index is None:
            return chain
        chain.append(_Link(owner if owner is not None else ast.Module(body=[], type_ignores=[]),
                           block, stmts, index))
        stmt = stmts[index]
        inner = next(((name, blk) for name, blk in _blocks(stmt)
                      if blk and blk[0].lineno <= line <= (blk[-1].end_lineno or blk[-1].lineno)),
                     None)
        if inner is None:
            return chain
        owner, (block, stmts) = stmt, inner


def _blocks(stmt: ast.stmt) -> list[tuple[str, Sequence[ast.stmt]]]:
    """The statement lists a compound statement holds, named for how control reaches them."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return []
    if isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar":
        return ([("body", stmt.body)] + [("handler", h.body) for h in stmt.handlers]  # type: ignore[attr-defined]
                + [("orelse", stmt.orelse), ("finally", stmt.finalbody)])  # type: ignore[attr-defined]
    if isinstance(stmt, ast.Match):
        return [("case", c.body) for c in stmt.cases]
    return [(name, getattr(stmt, name)) for name in ("body", "orelse") if getattr(stmt, name, None)]


class _Liveness:
    """Backward liveness over the blocks of one chain (see the module docstring)."""

    def __init__(self, chain: list[_Link]) -> None:
        self.chain = chain
        self._after: dict[int, frozenset[str]] = {}

    def before_block(self, level: int, index: int) -> frozenset[str]:
        """Live before statement ``index`` of the block at chain ``level``."""
        link = self.chain[level]
        live = _block(link.stmts[index:], self.block_out(level), self.loop_ctx(level))
        if link.block == "body" and isinstance(link.owner, (ast.Try,)):
            live |= self._handlers_live(level)
        return live

    def after(self, level: int) -> frozenset[str]:
        """Live after the statement at chain ``level`` (the owner of ``level + 1``)."""
        if level not in self._after:
            link = self.chain[level]
            self._after[level] = _block(link.stmts[link.index + 1:], self.block_out(level),
                                        self.loop_ctx(level))
        return self._after[level]

    def block_out(self, level: int) -> frozenset[str]:
        """Live when control falls off the end of the block at ``level``."""
        if level == 0:
            return frozenset()
        link, parent = self.chain[level], level - 1
        owner = link.owner
        if isinstance(owner, _LOOPS) and link.block == "body":
            return _loop_head(owner, self.after(parent), self.loop_ctx(parent))
        if isinstance(owner, ast.Try) and link.block in ("body", "orelse", "handler"):
            return (_block(owner.orelse, _block(owner.finalbody, self.after(parent), self.loop_ctx(parent)),
                           self.loop_ctx(parent)) if link.block == "body"
                    else _block(owner.finalbody, self.after(parent), self.loop_ctx(parent)))
        return self.after(parent)

    def _handlers_live(self, level: int) -> frozenset[str]:
        owner = self.chain[level].owner
        assert isinstance(owner, ast.Try)
        out = _block(owner.finalbody, self.after(level - 1), self.loop_ctx(level - 1))
        live: frozenset[str] = frozenset()
        for h in owner.handlers:
            live |= _block(h.body, out, self.loop_ctx(level - 1))
        return live

    def loop_ctx(self, level: int) -> _Ctx:
        """Where ``break`` and ``continue`` lead from the block at ``level``."""
        for lvl in range(level, 0, -1):
            link = self.chain[lvl]
            if isinstance(link.owner, _LOOPS) and link.block == "body":
                after = self.after(lvl - 1)
                return _Ctx(after, _loop_head(link.owner, after, self.loop_ctx(lvl - 1)))
        return _Ctx(frozenset(), frozenset())


@dataclass(frozen=True)
class _Ctx:
    brk: frozenset[str]
    cont: frozenset[str]


def _loop_head(loop: ast.AST, out: frozenset[str], ctx: _Ctx) -> frozenset[str]:
    """Live at the head of ``loop`` (where each iteration starts), by fixpoint."""
    head: frozenset[str] = frozenset()
    orelse = _block(getattr(loop, "orelse", []), out, ctx)
    for _ in range(16):
        inner = _Ctx(out, head)
        body = _block(loop.body, head, inner)  # type: ignore[attr-defined]
        if isinstance(loop, ast.While):
            new = _uses(loop.test) | body | orelse | out
        else:
            assert isinstance(loop, (ast.For, ast.AsyncFor))
            new = (body - set(_names(loop.target))) | _uses(loop.target) | orelse | out
        if new == head:
            break
        head = new
    return head


def _block(stmts: Sequence[ast.stmt], out: frozenset[str], ctx: _Ctx) -> frozenset[str]:
    live = out
    for stmt in reversed(stmts):
        live = _stmt(stmt, live, ctx)
    return live


def _stmt(stmt: ast.stmt, out: frozenset[str], ctx: _Ctx) -> frozenset[str]:
    if isinstance(stmt, ast.Break):
        return ctx.brk
    if isinstance(stmt, ast.Continue):
        return ctx.cont
    if isinstance(stmt, (ast.Return, ast.Raise)):
        return _uses(stmt)
    if isinstance(stmt, ast.If):
        return _uses(stmt.test) | _block(stmt.body, out, ctx) | _block(stmt.orelse, out, ctx)
    if isinstance(stmt, _LOOPS):
        head = _loop_head(stmt, out, ctx)
        return head | (_uses(stmt.iter) if isinstance(stmt, (ast.For, ast.AsyncFor)) else frozenset())
    if isinstance(stmt, (ast.With, ast.AsyncWith)):
        bound = {n for item in stmt.items if item.optional_vars is not None
                 for n in _names(item.optional_vars)}
        return frozenset().union(*(_uses(i.context_expr) for i in stmt.items)) | (
            _block(stmt.body, out, ctx) - bound)
    if isinstance(stmt, ast.Try):
        after = _block(stmt.finalbody, out, ctx)
        handlers = frozenset().union(*(_block(h.body, after, ctx) for h in stmt.handlers))
        return _block(stmt.body, _block(stmt.orelse, after, ctx) | handlers, ctx) | handlers | after
    if isinstance(stmt, ast.Match):
        return _uses(stmt.subject) | frozenset().union(*(_block(c.body, out, ctx) for c in stmt.cases)) | out
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return (out - {stmt.name}) | _free_uses(stmt)
    uses = _uses(stmt)
    if isinstance(stmt, ast.AugAssign):
        return (out - set(_assigned(stmt.target))) | uses | set(_assigned(stmt.target))
    return (out - _defs(stmt)) | uses


def _uses(node: ast.AST | None) -> frozenset[str]:
    """Names read anywhere in ``node`` (nested functions and comprehensions included): plain
    names, an object's attribute read as ``obj.attr``, and ``obj.*`` where the object goes
    somewhere its attributes may all be read (a method call, an argument, a call of it)."""
    if node is None:
        return frozenset()
    found: set[str] = set()
    roots: set[int] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name):
            roots.add(id(n.value))
            if isinstance(n.ctx, ast.Load):
                found.add(f"{n.value.id}.{n.attr}")
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name):
            found.add(f"{n.func.value.id}.*")
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            found.add(n.id)
            if id(n) not in roots:
                found.add(f"{n.id}.*")
    return frozenset(found)


def _free_uses(node: ast.AST) -> frozenset[str]:
    return _uses(node)


def _defs(stmt: ast.stmt) -> frozenset[str]:
    """Names a simple statement surely assigns (its own targets, not a comprehension's)."""
    if isinstance(stmt, ast.Assign):
        return frozenset(n for t in stmt.targets for n in _assigned(t))
    if isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
        return frozenset(_assigned(stmt.target))
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return frozenset((a.asname or a.name).split(".")[0] for a in stmt.names)
    return frozenset()


def _assigned(target: ast.AST) -> list[str]:
    """What an assignment target binds: its plain names and ``obj.attr`` for an attribute of
    a named object (``logits, self.loss = ...`` -> logits, self.loss)."""
    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
        return [f"{target.value.id}.{target.attr}"]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for elt in target.elts for n in _assigned(elt)]
    if isinstance(target, ast.Starred):
        return _assigned(target.value)
    return _names(target)


def _names(target: ast.AST) -> list[str]:
    """The plain names a target binds, in order (``a, (b, c)`` -> a, b, c)."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for elt in target.elts for n in _names(elt)]
    if isinstance(target, ast.Starred):
        return _names(target.value)
    return []


_NESTED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.ListComp, ast.SetComp,
           ast.DictComp, ast.GeneratorExp)


def _own_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """Every node inside ``node`` but those of nested functions, classes and comprehensions
    (their names are their own)."""
    todo = [node]
    while todo:
        for child in ast.iter_child_nodes(todo.pop()):
            if not isinstance(child, _NESTED):
                yield child
                todo.append(child)


def _stores(node: ast.AST) -> frozenset[str]:
    """Every name assigned inside ``node``, outside nested functions and classes."""
    found: set[str] = set()
    for child in _own_nodes(node):
        if isinstance(child, ast.Name) and isinstance(child.ctx, (ast.Store, ast.Del)):
            found.add(child.id)
        elif (isinstance(child, ast.Attribute) and isinstance(child.value, ast.Name)
              and isinstance(child.ctx, ast.Store)):
            found.add(f"{child.value.id}.{child.attr}")
    return frozenset(found)


#: methods that grow a list, dict or deque in place: ``results.append(x)`` in a loop carries
#: ``results`` as surely as ``total += x`` carries ``total``. Not ``update``, ``add`` or ``pop``:
#: objects of every kind have those (``scaler.update()``, ``meter.update(v)``), and a loop
#: calling one would be said to carry what no checkpoint holds
_MUTATORS = frozenset({"append", "extend", "insert", "setdefault", "appendleft", "extendleft"})


def _changes(node: ast.AST) -> frozenset[str]:
    """What ``node`` changes (outside nested functions and classes): the names it assigns
    (:func:`_stores`), and those it changes in place (``results.append(x)``, ``seen[k] = v``)."""
    found = set(_stores(node))
    for child in _own_nodes(node):
        if (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute)
                and isinstance(child.func.value, ast.Name) and child.func.attr in _MUTATORS):
            found.add(child.func.value.id)
        elif (isinstance(child, ast.Subscript) and isinstance(child.value, ast.Name)
              and isinstance(child.ctx, (ast.Store, ast.Del))):
            found.add(child.value.id)
    return frozenset(found)


def _globals_assigned(scope: _Scope) -> frozenset[str]:
    """At module level: the names functions of the module declare ``global`` (state they
    change on the loop's behalf)."""
    if not isinstance(scope, ast.Module):
        return frozenset()
    return frozenset(n for node in ast.walk(scope) if isinstance(node, ast.Global) for n in node.names)


def bind(target: ast.expr | None, item: object) -> dict[str, object] | None:
    """The names a ``for`` target binds to ``item`` (``batch, i`` from ``(3, 60)``); None
    when the target is not plain names or ``item`` does not unpack to it."""
    if target is None:
        return None
    if isinstance(target, ast.Name):
        return {target.id: item}
    if isinstance(target, (ast.Tuple, ast.List)) and not any(isinstance(e, ast.Starred) for e in target.elts):
        try:
            items = list(item)  # type: ignore[call-overload]
        except TypeError:
            return None
        if len(items) != len(target.elts):
            return None
        out: dict[str, object] = {}
        for elt, value in zip(target.elts, items, strict=True):
            sub = bind(elt, value)
            if sub is None:
                return None
            out.update(sub)
        return out
    return None

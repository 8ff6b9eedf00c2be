"""What to save, and how to put it back: the plan half of DCP's plan/storage split.

:func:`collect` turns the registry into one state tree (tensors live, not copied: the
backend stages them). :func:`restore` puts a tree back into the registry's objects after
checking that they are the same objects (creation order, type, parameter shapes); a
changed architecture is an error, never a silent partial load.

A resume from the format backend hands :func:`restore` a *lazy* tree: model and optimizer
tensors are :class:`~ravex.format.ArrayRef` leaves, read only after every check passed,
straight into the live tensors' memory (one parallel read, no second copy, no fresh pages),
so ``load_state_dict`` then finds each tensor already in place. :func:`read_small` reads
the rest of such a tree (RNG, loaders, schedulers) when the step is chosen.

Tree layout (lists are indexed by creation order)::

    ravex       {"step", "format": 1}
    models      [{"type", "state": {name: tensor}}]
    optimizers  [{"type", "shapes", "steps", "state": optimizer.state_dict()}]
    schedulers  [{"type", "state"}]      scalers  [{"type", "state"}]
    loaders     [{"type", "length", "batch_size", "epoch", "yielded", "exhausted",
                  "active", "epoch_rng"}]
    rng         {"python", "numpy", "torch", "cuda": [...]}
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
from torch.autograd.graph import increment_version

from ravex._registry import LoaderState, Registry
from ravex.errors import RestoreError
from ravex.format import ArrayRef

TREE_FORMAT = 1


# ── RNG ─────────────────────────────────────────────────────────────────


def capture_rng() -> dict[str, Any]:
    """Every RNG stream a training step draws from. CUDA only if already initialised."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    cuda: list[torch.Tensor] = []
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        cuda = list(torch.cuda.get_rng_state_all())
    return {
        "python": random.getstate(),
        "numpy": {"kind": kind, "keys": keys, "pos": int(pos), "has_gauss": int(has_gauss),
                  "gauss": float(gauss)},
        "torch": torch.get_rng_state(),
        "cuda": cuda,
    }


def restore_rng(state: dict[str, Any]) -> None:
    version, internal, gauss_next = state["python"]
    random.setstate((int(version), tuple(int(x) for x in internal), gauss_next))
    n = state["numpy"]
    np.random.set_state(
        (n["kind"], np.asarray(n["keys"], dtype=np.uint32), n["pos"], n["has_gauss"], n["gauss"])
    )
    torch.set_rng_state(as_tensor(state["torch"]).to(torch.uint8))
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([as_tensor(s).to(torch.uint8) for s in state["cuda"]])


def capture_epoch_rng(loader: Any) -> dict[str, Any]:
    """The RNG a DataLoader draws from when an epoch starts (worker seed, shuffle order)."""
    out: dict[str, Any] = {"torch": torch.get_rng_state()}
    for name, gen in _loader_generators(loader):
        out[name] = gen.get_state()
    return out


def restore_epoch_rng(loader: Any, state: dict[str, Any]) -> None:
    torch.set_rng_state(as_tensor(state["torch"]).to(torch.uint8))
    for name, gen in _loader_generators(loader):
        if state.get(name) is not None:
            gen.set_state(as_tensor(state[name]).to(torch.uint8))


def _loader_generators(loader: Any) -> list[tuple[str, torch.Generator]]:
    gens = []
    seen: set[int] = set()
    for name, owner in (("generator", loader), ("sampler_generator", getattr(loader, "sampler", None)),
                        ("batch_sampler_generator",
                         getattr(getattr(loader, "batch_sampler", None), "sampler", None))):
        gen = getattr(owner, "generator", None) if owner is not None else None
        if isinstance(gen, torch.Generator) and id(gen) not in seen:
            seen.add(id(gen))
            gens.append((name, gen))
    return gens


# ── tensors ─────────────────────────────────────────────────────────────


def as_tensor(value: Any) -> torch.Tensor:
    """A tensor from a restored leaf: a tensor (torch_save) or a numpy array (format)."""
    if isinstance(value, torch.Tensor):
        return value
    arr = np.asarray(value)
    view = _ML_DTYPES.get(arr.dtype.name)
    if view is not None:
        int_np, torch_dtype = view
        arr = arr.view(int_np)
        return torch.from_numpy(np.array(arr, copy=not arr.flags.writeable)).view(torch_dtype)
    if not arr.flags.writeable:
        arr = arr.copy()
    return torch.from_numpy(arr)


_ML_DTYPES = {
    "bfloat16": (np.int16, torch.bfloat16),
    "float8_e4m3fn": (np.uint8, torch.float8_e4m3fn),
    "float8_e5m2": (np.uint8, torch.float8_e5m2),
}


def tensors_in(tree: Any, read: dict[str, torch.Tensor] | None = None) -> Any:
    """``tree`` with every array leaf turned into a tensor; an :class:`ArrayRef` leaf becomes
    the tensor ``read`` holds for its path (or is read now, on its own)."""
    if isinstance(tree, dict):
        return {k: tensors_in(v, read) for k, v in tree.items()}
    if isinstance(tree, list):
        return [tensors_in(v, read) for v in tree]
    if isinstance(tree, tuple):
        return tuple(tensors_in(v, read) for v in tree)
    if isinstance(tree, np.ndarray):
        return as_tensor(tree)
    if isinstance(tree, ArrayRef):
        found = (read or {}).get(tree.path)
        return found if found is not None else as_tensor(tree.read())
    return tree


# ── collect ─────────────────────────────────────────────────────────────


def collect(registry: Registry, step: int, active_loader: LoaderState | None) -> dict[str, Any]:
    """The whole training state as one tree, tensors aliasing live memory."""
    tree: dict[str, Any] = {"ravex": {"step": step, "format": TREE_FORMAT}}
    tree["models"] = [
        {"type": type(m).__name__, "state": dict(m.state_dict())} for m in registry.models()
    ]
    tree["optimizers"] = [
        {
            "type": type(o).__name__,
            "shapes": _optimizer_shapes(o),
            "steps": int(o.__dict__.get("_ravex_steps", 0)),
            "state": o.state_dict(),
        }
        for o in registry.live("optimizers")
    ]
    tree["schedulers"] = [
        {"type": type(s).__name__, "state": s.state_dict()} for s in registry.live("schedulers")
    ]
    tree["scalers"] = [
        {"type": type(s).__name__, "state": s.state_dict()} for s in registry.live("scalers")
    ]
    loaders = []
    for loader in registry.live("loaders"):
        st = registry.loader_state(loader)
        loaders.append(
            {
                **_loader_identity(loader),
                "epoch": st.epoch,
                "yielded": st.yielded,
                "exhausted": st.exhausted,
                "active": st is active_loader,
                "epoch_rng": st.epoch_rng,
            }
        )
    tree["loaders"] = loaders
    tree["rng"] = capture_rng()
    return tree


def _optimizer_shapes(opt: torch.optim.Optimizer) -> list[list[list[int]]]:
    return [[list(p.shape) for p in group["params"]] for group in opt.param_groups]


def _loader_identity(loader: Any) -> dict[str, Any]:
    try:
        length: int | None = len(loader)
    except TypeError:
        length = None
    return {"type": type(loader).__name__, "length": length, "batch_size": loader.batch_size}


# ── restore ─────────────────────────────────────────────────────────────


def restore(registry: Registry, tree: dict[str, Any], where: str) -> None:
    """Put ``tree`` back into the live objects; check everything before changing anything."""
    fmt = tree.get("ravex", {}).get("format")
    if fmt != TREE_FORMAT:
        raise RestoreError(f"{where}: state tree format {fmt!r} is not {TREE_FORMAT}; "
                           "written by an incompatible Ravex")
    models = registry.models()
    optimizers = registry.live("optimizers")
    schedulers = registry.live("schedulers")
    scalers = registry.live("scalers")
    _check_counts(where, "model", models, tree["models"])
    _check_counts(where, "optimizer", optimizers, tree["optimizers"])
    _check_counts(where, "LR scheduler", schedulers, tree["schedulers"])
    _check_counts(where, "GradScaler", scalers, tree["scalers"])
    for i, (model, saved) in enumerate(zip(models, tree["models"], strict=True)):
        _check_model(where, i, model, saved)
    for i, (opt, saved) in enumerate(zip(optimizers, tree["optimizers"], strict=True)):
        _check_type(where, f"optimizer #{i}", opt, saved)
        if _optimizer_shapes(opt) != _as_lists(saved["shapes"]):
            raise RestoreError(
                f"{where}: optimizer #{i} ({type(opt).__name__}) holds parameters of shapes "
                f"{_optimizer_shapes(opt)} but the checkpoint's has {_as_lists(saved['shapes'])}."
                + _FIX
            )
    for i, (obj, saved) in enumerate(zip(schedulers, tree["schedulers"], strict=True)):
        _check_type(where, f"LR scheduler #{i}", obj, saved)
    for i, (obj, saved) in enumerate(zip(scalers, tree["scalers"], strict=True)):
        _check_type(where, f"GradScaler #{i}", obj, saved)

    plan = _InPlace()
    for model, saved in zip(models, tree["models"], strict=True):
        live = model.state_dict(keep_vars=True)
        for key, value in saved["state"].items():
            if isinstance(value, ArrayRef):
                target = live[key]
                plan.add(value, target, target.device)
    for opt, saved in zip(optimizers, tree["optimizers"], strict=True):
        _plan_optimizer(plan, opt, saved["state"])
    read = plan.read(where)  # the only step that changes live memory before load_state_dict
    with torch.no_grad():  # a tensor already in place makes its copy_ a no-op
        for model, saved in zip(models, tree["models"], strict=True):
            model.load_state_dict(tensors_in(saved["state"], read), strict=True)
    for opt, saved in zip(optimizers, tree["optimizers"], strict=True):
        opt.load_state_dict(tensors_in(saved["state"], read))
        opt.__dict__["_ravex_steps"] = int(saved["steps"])
    for obj, saved in zip(schedulers, tree["schedulers"], strict=True):
        obj.load_state_dict(tensors_in(saved["state"]))
    for obj, saved in zip(scalers, tree["scalers"], strict=True):
        if saved["state"]:
            obj.load_state_dict(tensors_in(saved["state"]))
    restore_rng(tree["rng"])


def check_loader(where: str, index: int, loader: Any, saved: dict[str, Any]) -> None:
    """A DataLoader must be the same one: type, length and batch size."""
    mine = _loader_identity(loader)
    theirs = {k: saved.get(k) for k in mine}
    if mine != theirs:
        raise RestoreError(
            f"{where}: DataLoader #{index} is {mine} in this run but {theirs} in the checkpoint; "
            "the dataset or batch size changed." + _FIX
        )


_FIX = (" Start a fresh run: point `storage` at a new location, or set `resume: never` "
        "(RAVEX_RESUME=never).")


def _check_counts(where: str, what: str, live: list[Any], saved: list[Any]) -> None:
    if len(live) != len(saved):
        raise RestoreError(
            f"{where}: the checkpoint holds {len(saved)} {what}(s) but this run has created "
            f"{len(live)} by the first training step ({[type(o).__name__ for o in live]} vs "
            f"{[s['type'] for s in saved]})." + _FIX
        )


def _check_type(where: str, what: str, obj: Any, saved: dict[str, Any]) -> None:
    if type(obj).__name__ != saved["type"]:
        raise RestoreError(
            f"{where}: {what} is a {type(obj).__name__} in this run but a {saved['type']} in the "
            "checkpoint." + _FIX
        )


def _check_model(where: str, index: int, model: torch.nn.Module, saved: dict[str, Any]) -> None:
    _check_type(where, f"model #{index}", model, saved)
    live = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    stored = {k: tuple(_shape(v)) for k, v in saved["state"].items()}
    missing = sorted(set(stored) - set(live))
    extra = sorted(set(live) - set(stored))
    if missing or extra:
        raise RestoreError(
            f"{where}: model #{index} ({type(model).__name__}) does not match the checkpoint: "
            f"not in this model {missing[:5]}, not in the checkpoint {extra[:5]}." + _FIX
        )
    for key, shape in live.items():
        if stored[key] != shape:
            raise RestoreError(
                f"{where}: model #{index} ({type(model).__name__}) tensor {key!r} has shape "
                f"{list(shape)} but {list(stored[key])} in the checkpoint." + _FIX
            )
    for key, tensor in model.state_dict(keep_vars=True).items():
        theirs = torch_dtype(saved["state"][key])
        if theirs is not None and theirs != tensor.dtype:
            raise RestoreError(
                f"{where}: model #{index} ({type(model).__name__}) tensor {key!r} is {tensor.dtype} "
                f"but {theirs} in the checkpoint (a resume would not be exact)." + _FIX
            )


def torch_dtype(value: Any) -> torch.dtype | None:
    """The torch dtype of a saved leaf: tensor, numpy array or :class:`ArrayRef`."""
    if isinstance(value, torch.Tensor):
        return value.dtype
    dtype = getattr(value, "dtype", None)
    if not isinstance(dtype, np.dtype):
        return None
    view = _ML_DTYPES.get(dtype.name)
    if view is not None:
        return view[1]
    try:
        return torch.from_numpy(np.empty(0, dtype)).dtype
    except TypeError:
        return None


def _shape(value: Any) -> tuple[int, ...]:
    return tuple(getattr(value, "shape", ()))


def _as_lists(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_as_lists(v) for v in value]
    return value


# ── lazy trees: reading into the live tensors ─────────────────────────────

#: Tensor classes whose memory is exactly what ``numpy()`` shows (no DTensor, no wrappers).
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _deferred(tree: dict[str, Any]) -> list[ArrayRef]:
    """The leaves :func:`restore` reads in place: model and optimizer state tensors."""
    refs = [v for m in tree.get("models", []) for v in (m.get("state") or {}).values()]
    for opt in tree.get("optimizers", []):
        for entry in ((opt.get("state") or {}).get("state") or {}).values():
            if isinstance(entry, dict):
                refs.extend(entry.values())
    return [r for r in refs if isinstance(r, ArrayRef)]


def read_small(tree: dict[str, Any]) -> dict[str, Any]:
    """A lazy tree made ready for :func:`restore`: every array read except the model and
    optimizer tensors, whose objects are checked present instead. A step with a missing or
    truncated object is thus rejected here, before anything live has changed, and the
    runtime can fall back to an older one."""
    deferred = _deferred(tree)
    if deferred:
        deferred[0].reader.check_objects([r.path for r in deferred])
    return read_refs(tree, keep={id(r) for r in deferred})


def read_refs(tree: Any, keep: set[int] | frozenset[int] = frozenset()) -> Any:
    """``tree`` with every :class:`ArrayRef` leaf (but those whose ``id`` is in ``keep``)
    replaced by its array, all of them fetched in one parallel read."""
    refs: list[ArrayRef] = []

    def note(value: Any) -> None:
        if isinstance(value, ArrayRef):
            if id(value) not in keep:
                refs.append(value)
        elif isinstance(value, dict):
            for v in value.values():
                note(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                note(v)

    note(tree)
    if not refs:
        return tree
    arrays = refs[0].reader.read_arrays([r.path for r in refs])

    def fill(value: Any) -> Any:
        if isinstance(value, ArrayRef):
            return value if id(value) in keep else arrays[value.path]
        if isinstance(value, dict):
            return {k: fill(v) for k, v in value.items()}
        if isinstance(value, list):
            return [fill(v) for v in value]
        if isinstance(value, tuple):
            return tuple(fill(v) for v in value)
        return value

    return fill(tree)


def _plan_optimizer(plan: _InPlace, opt: torch.optim.Optimizer, saved: dict[str, Any]) -> None:
    """Targets for an optimizer's saved state: its live state tensors where they exist and
    match (after a step), else new tensors on the CPU (before the first step)."""
    params = [p for group in opt.param_groups for p in group["params"]]
    for pid, entry in (saved.get("state") or {}).items():
        if not isinstance(entry, dict) or not isinstance(pid, int) or not 0 <= pid < len(params):
            continue
        param = params[pid]
        live = opt.state.get(param) or {}
        for key, value in entry.items():
            if isinstance(value, ArrayRef):
                plan.add(value, live.get(key), param.device)


class _InPlace:
    """Where each deferred array of a lazy tree lands, then one parallel read into all of them.

    A live CPU tensor of the same shape and dtype is the destination itself (its numpy view);
    anything else (a CUDA tensor, optimizer state not created yet, a non-contiguous or
    wrapped tensor) gets a new CPU tensor, pinned when it is bound for a GPU, which
    ``load_state_dict`` then copies or adopts as it always did.
    """

    def __init__(self) -> None:
        self.refs: list[ArrayRef] = []
        self.outs: dict[str, np.ndarray] = {}
        self.tensors: dict[str, torch.Tensor] = {}
        self.live: list[torch.Tensor] = []  # written behind autograd's back: versions to bump
        self._claimed: set[int] = set()

    def add(self, ref: ArrayRef, live: Any, device: torch.device) -> None:
        dtype = torch_dtype(ref)
        if dtype is None:
            return  # read on its own by tensors_in
        if self._fits(live, ref, dtype):
            target = live
            self.live.append(live)
            if live.numel():
                self._claimed.add(live.data_ptr())  # tied weights: the second one reads apart
        else:
            pin = device.type == "cuda" and torch.cuda.is_available()
            target = torch.empty(ref.shape, dtype=dtype, pin_memory=pin)
        self.refs.append(ref)
        self.outs[ref.path] = _numpy_view(target)
        self.tensors[ref.path] = target

    def _fits(self, live: Any, ref: ArrayRef, dtype: torch.dtype) -> bool:
        return (
            type(live) in _PLAIN
            and live.device.type == "cpu"
            and live.dtype == dtype
            and tuple(live.shape) == tuple(ref.shape)
            and live.is_contiguous()
            and not live.is_conj() and not live.is_neg()
            and (live.numel() == 0 or live.data_ptr() not in self._claimed)
        )

    def read(self, where: str) -> dict[str, torch.Tensor]:
        """Read every planned array into its target; the tensors, by path."""
        by_reader: dict[int, list[ArrayRef]] = {}
        for ref in self.refs:
            by_reader.setdefault(id(ref.reader), []).append(ref)
        for refs in by_reader.values():
            try:
                refs[0].reader.read_arrays([r.path for r in refs], outs={r.path: self.outs[r.path] for r in refs})
            except Exception as exc:
                raise RestoreError(
                    f"{where}: reading the checkpoint failed midway ({type(exc).__name__}: {exc}); the "
                    "model and optimizer are partly overwritten, so this run cannot go on. Run `ravex "
                    "validate`, then resume from a good step (`resume: <step>`) or start fresh."
                ) from exc
        for tensor in self.live:  # as an in-place copy_ would: whoever caches by _version sees it
            increment_version(tensor)
        return self.tensors


def _numpy_view(tensor: torch.Tensor) -> np.ndarray:
    """A writable numpy array over ``tensor``'s memory (bfloat16/float8 as same-size ints)."""
    t = tensor.detach()
    try:
        return t.numpy()
    except TypeError:  # no numpy dtype: the reader only needs the element size to match
        return t.view(_INT_OF_SIZE[t.element_size()]).numpy()

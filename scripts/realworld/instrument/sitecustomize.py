"""Harness instrumentation, loaded by every run through PYTHONPATH (the scripts are not edited).

Active only when RS_DUMP is set. Once torch has been imported (after Ravex's own autoloader
has activated on the same import), it:
- counts optimizer steps with a global post-step hook (per optimizer; "step" = the most any one
  optimizer has taken in this process, the same rule Ravex uses) and backward() calls, and writes
  "<step> <backwards>" to RS_PROGRESS after each, so the harness can kill at a chosen step;
- keeps a strong reference to every module that runs forward, every optimizer that steps and every
  LR scheduler that steps (locals of main() would otherwise be gone at exit);
- at exit, torch.save()s their state_dicts to RS_DUMP, plus the counters.
Holding references keeps these objects alive until exit; nothing else in the run changes, except
with RS_SEED set: then torch.manual_seed(RS_SEED) right after `import torch`, for scripts that seed
nothing (the same in every run, so runs can be compared).

Under torchrun the launcher (`python -m torch.distributed.run`) is left alone and each worker is
instrumented, writing RS_DUMP as rs_dump.rank<R>.pt and RS_PROGRESS as rs_progress.rank<R>. With
RS_SPAWNED (ranks started by torch.multiprocessing.spawn) every process is instrumented and writes
those files only once it has a process group, under its rank then (the spawning process and
DataLoader workers never have one, so they write nothing).
"""

import atexit
import os
import sys

_DUMP = os.environ.get("RS_DUMP")
_PROGRESS = os.environ.get("RS_PROGRESS")
_SPAWNED = bool(os.environ.get("RS_SPAWNED"))


def _per_rank(path, rank):
    """The rank's own file for ``path``: rs_dump.pt -> rs_dump.rank<R>.pt, rs_progress -> rs_progress.rank<R>."""
    base, ext = os.path.splitext(path)
    return f"{base}.rank{rank}{ext}"


def _install():
    import torch
    from torch.nn.modules.module import register_module_forward_pre_hook
    from torch.optim.optimizer import register_optimizer_step_post_hook

    modules = {}      # id -> module, in order of first forward
    optimizers = {}   # id -> optimizer, in order of first step
    schedulers = {}   # id -> scheduler, in order of first step
    counts = {}       # id(optimizer) -> steps in this process
    state = {"step": 0, "calls": 0, "backwards": 0, "first_forward_step": None}

    def ranked(path):
        """``path``, or with RS_SPAWNED the rank's file once this process has a process group
        (the rank is kept: the script may destroy the group before the dump at exit)."""
        if not _SPAWNED or not path:
            return path
        dist = torch.distributed
        if state.get("rank") is None and dist.is_available() and dist.is_initialized():
            state["rank"] = dist.get_rank()
        return None if state.get("rank") is None else _per_rank(path, state["rank"])

    def progress():
        target = ranked(_PROGRESS)
        if target:
            tmp = target + ".tmp"
            with open(tmp, "w") as fh:
                fh.write(f"{state['step']} {state['backwards']}\n")
            os.replace(tmp, target)

    def on_forward(module, args):
        # inside a torch.compile'd forward the modules are dynamo's to trace (touching them
        # here fails the trace: "already tracked for mutation"); the compiled wrapper itself
        # was recorded eagerly when it was called
        if torch.compiler.is_compiling():
            return
        if id(module) not in modules:
            modules[id(module)] = module

    def on_step(optimizer, args, kwargs):
        optimizers.setdefault(id(optimizer), optimizer)
        counts[id(optimizer)] = counts.get(id(optimizer), 0) + 1
        state["calls"] += 1
        state["step"] = max(state["step"], counts[id(optimizer)])
        progress()

    if os.environ.get("RS_SEED"):
        torch.manual_seed(int(os.environ["RS_SEED"]))

    register_module_forward_pre_hook(on_forward)
    register_optimizer_step_post_hook(on_step)

    backward = torch.Tensor.backward

    def counted_backward(self, *a, **k):
        out = backward(self, *a, **k)
        state["backwards"] += 1
        progress()
        return out

    torch.Tensor.backward = counted_backward

    from torch.optim import lr_scheduler

    sched_step = lr_scheduler.LRScheduler.step

    def counted_sched_step(self, *a, **k):
        schedulers.setdefault(id(self), self)
        return sched_step(self, *a, **k)

    lr_scheduler.LRScheduler.step = counted_sched_step

    def dump():
        target = ranked(_DUMP)
        if not target:
            return
        try:
            mods = list(modules.values())
            children = set()
            for m in mods:
                for c in m.modules():
                    if c is not m:
                        children.add(id(c))
            top = [m for m in mods if id(m) not in children]

            def cpu(sd):
                return {k: (v.detach().clone() if torch.is_tensor(v) else v) for k, v in sd.items()}

            out = {
                "modules": [type(m).__name__ for m in top],
                "params": [cpu(dict(m.named_parameters())) for m in top],
                "buffers": [cpu(dict(m.named_buffers())) for m in top],
                "optimizers": [(type(o).__name__, o.state_dict()) for o in optimizers.values()],
                "schedulers": [(type(s).__name__, s.state_dict()) for s in schedulers.values()],
                "step": state["step"],
                "optimizer_step_calls": state["calls"],
                "backwards": state["backwards"],
            }
            torch.save(out, target)
        except Exception as exc:  # the harness reports a missing dump
            print(f"[rs-instrument] dump failed: {exc!r}", file=sys.stderr)

    atexit.register(dump)


class _AfterTorch:
    """Meta path finder: after `import torch` finishes (and Ravex's hook ran), install ours."""

    busy = False

    def find_spec(self, fullname, path=None, target=None):
        # A probe (importlib.util.find_spec("torch"), as datasets and transformers do before importing
        # it) also lands here: stay on sys.meta_path until torch's module is really executed.
        if fullname != "torch" or self.busy:
            return None
        from ravex.runtime.finders import after_exec, spec_from_others  # not before: every process loads this file

        self.busy = True
        try:
            spec = spec_from_others(self, fullname, path, target)
        finally:
            self.busy = False

        def then():
            sys.meta_path[:] = [f for f in sys.meta_path if f is not self]
            _install()

        return after_exec(spec, then)


def _launcher():
    """This process is torchrun's launcher (its workers are instrumented, not it)."""
    argv = getattr(sys, "orig_argv", [])
    return "torch.distributed.run" in argv or any(os.path.basename(a) == "torchrun" for a in argv[:2])


if _DUMP and "torch" not in sys.modules and (_SPAWNED or not os.environ.get("RS_CHILD")) and not _launcher():
    if "RANK" in os.environ and "LOCAL_RANK" in os.environ:  # a torchrun worker: one dump per rank
        _rank = os.environ["RANK"]
        _DUMP = _per_rank(_DUMP, _rank)
        _PROGRESS = _PROGRESS and _per_rank(_PROGRESS, _rank)
    os.environ["RS_CHILD"] = "1"  # DataLoader workers or other subprocesses: no instrumentation
    sys.meta_path.insert(0, _AfterTorch())

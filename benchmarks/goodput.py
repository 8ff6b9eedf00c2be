"""``python -m benchmarks goodput``: the training time a checkpoint costs a busy training run (scenario (h)).

The stall (scenario (a)) is what the loop waits for; it is not what a checkpoint costs when
the loop keeps every core busy: background hashing, copying and writeback compete with the
training threads for cores and memory bandwidth. Issue 17 defines the cost as the wall time
of a run that checkpoints every EVERY (3) iterations, plus its final flush, less the same
iterations without checkpointing, per checkpoint. This scenario measures that quantity in
pairs, so that another process's load (the machine is shared) lands on both sides of each
difference: every contender's process alternates

    a quiet cycle:       EVERY iterations
    a checkpoint cycle:  checkpoint, EVERY iterations, wait until it is durable

and a checkpoint's cost is its cycle less the quiet one before it: the stall, the iterations
its background work slowed, and what of the write was left after them (what the next
checkpoint of a steady run would wait for). Each figure is the median over CHECKPOINTS (6)
pairs (the first checkpoint, which allocates buffers, and a burst of someone else's load land in
the tails; the JSON has the mean too), then the median over ``--reps`` processes.

State: ``LAYERS`` (6) ``Linear(4096)`` + AdamW (1.125 GiB), and a 90%-frozen model (10 layers,
the first 9 frozen: a checkpoint's changed part is a tenth of the weights plus their moments).

Contenders, each in its own process, one after the other: ``ravex`` (``ravex.activate()`` and
``ravex.checkpoint()``), ``dcp.async_save`` (``FileSystemWriter(sync_files=True)``),
``torch.save`` + fsync (blocking) and a bare copy of what changed into reused, faulted-in
buffers. ``--ab`` adds Ravex with one of its background measures undone (the module settings
in :data:`VARIANTS`). Beside the lost time, each cycle's process CPU (all threads) gives the
CPU a checkpoint spent: what competes with training, and a figure other load blurs far less.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

CONTENDERS = ("bare copy", "ravex", "dcp.async_save", "torch.save", "copy + O_DIRECT write")
#: Ravex with one measure undone or changed, set on the child's modules before ``activate()``:
#: ``{name: {"module:attribute": value}}``, or ``"activate:key"`` for an ``activate()`` keyword
#: (``--ab NAME,...``; ``--ab all``).
VARIANTS: dict[str, dict[str, Any]] = {
    "ravex, page cache": {"ravex.format.storage.local:LocalStorage.DIRECT": False},
    # issue 35: the write's interference: one thread fsyncing the commit's objects (8 by default),
    # and the resume witness off (its recording after each checkpoint)
    "ravex, 1 sync thread": {"ravex.format.storage.local:LocalStorage.SYNC_THREADS": 1},
    "ravex, witness off": {"activate:witness": "off"},
    # issue 35: a local disk's commit threads (by default one per two usable cores, at most 4)
    "ravex, 1 writer thread": {"ravex.format.writing.threads:LOCAL_THREADS": 1},
    "ravex, 2 writer threads": {"ravex.format.writing.threads:LOCAL_THREADS": 2},
    "ravex, 4 writer threads": {"ravex.format.writing.threads:LOCAL_THREADS": 4},
    "ravex, 8 writer threads": {"ravex.format.writing.threads:LOCAL_THREADS": 8},
    # issue 35: fewer, larger objects (a 64 MiB tensor in one chunk instead of four)
    "ravex, 64 MiB chunks": {"ravex.format.writing.writer:DEFAULT_CHUNK_BYTES": 64 << 20,
                             "ravex.saving.stager:DEFAULT_CHUNK_BYTES": 64 << 20},
    # issue 26: staging memory faulted in before the first checkpoint, on idle cores (as shipped),
    # at normal priority, or not at all
    "ravex, prepare at normal priority": {"ravex.saving.stager:PREPARE_IDLE": False},
    "ravex, no prepare": {"ravex.saving.stager:PREPARE_MIN_BYTES": 1 << 62},
    # issue 26: the writer hashes the staged chunks (a second pass over their bytes)
    "ravex, hash after copying": {"ravex.saving.stager:HASH_WHILE_COPYING": False},
    # issue 26: a host that cannot hold a second copy of the state (an ``activate()`` keyword)
    "ravex, staging cap 256 MiB": {"activate:staging_max_bytes": 256 << 20},
}
MODES = ("full", "frozen")
#: the user's loop, measured whole against the same loop unchecked (:mod:`benchmarks.goodput_loop`)
LOOP = "loop"
#: Ravex's figure over each peer's: (contender, ratio key)
PEERS = (("dcp.async_save", "dcp_async"), ("torch.save", "torch_save"), ("bare copy", "bare_copy"),
         ("copy + O_DIRECT write", "copy_write"))


@dataclass
class Config:
    width: int = 4096
    layers: int = 6  # full mode
    frozen_layers: tuple[int, int] = (9, 10)  # frozen mode: (frozen, of layers)
    batch: int = 16
    checkpoints: int = 6
    every: int = 3  # iterations per cycle
    warmup: int = 2
    #: torch's intra-op threads in the loop; None: torch's default (every core). 1 on this
    #: 2-core machine leaves a core idle, as a GPU-bound loop leaves the host's cores
    threads: int | None = None
    #: where the model trains (``python -m benchmarks gpu`` runs the loop mode on ``cuda``)
    device: str = "cpu"
    reps: int = 1
    modes: tuple[str, ...] = MODES
    contenders: tuple[str, ...] = CONTENDERS
    variants: tuple[str, ...] = ()
    scratch: str = "/tmp"
    log: Any = field(default=print, repr=False)


def quick() -> Config:
    """A tiny state, 2 checkpoints, the full model and the user's loop: checks that every contender runs, in seconds."""
    return Config(width=256, batch=8, checkpoints=2, every=2, warmup=1, modes=("full", LOOP))


# ---- the child: one contender, one mode, one process ---------------------------------------------


def _build(spec: dict[str, Any]) -> tuple[Any, Any]:
    import torch

    torch.manual_seed(0)
    if spec["mode"] == "full":
        n, frozen = spec["layers"], 0
    else:
        frozen, n = spec["frozen_layers"]
    model = torch.nn.Sequential(*[torch.nn.Linear(spec["width"], spec["width"]) for _ in range(n)])
    model = model.to(spec.get("device", "cpu"))
    for layer in list(model)[:frozen]:
        layer.requires_grad_(False)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    return model, opt


def _state(model: Any, opt: Any) -> dict[str, Any]:
    return {"model": model.state_dict(), "optim": opt.state_dict()}


class _BareCopy:
    """The floor: a copy of what changed (each trainable parameter and AdamW's two moments of
    it) into buffers allocated and faulted in beforehand. The moments are looked up at each
    checkpoint: the user's loop (``--modes loop``) builds this before the first step creates them."""

    def __init__(self, model: Any, opt: Any, spec: dict[str, Any]) -> None:
        self.opt = opt
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.dst = [self._buffer(p) for p in self.params for _ in range(3)]

    def _sources(self) -> list[Any]:
        return [t.detach() for p in self.params
                for t in (p, self.opt.state[p]["exp_avg"], self.opt.state[p]["exp_avg_sq"])]

    def _buffer(self, t: Any) -> Any:
        """A buffer for ``t``'s bytes in host memory, faulted in now (pinned for a CUDA tensor)."""
        import torch

        return torch.zeros(t.shape, dtype=t.dtype, pin_memory=t.is_cuda)

    def checkpoint(self, step: int) -> None:
        import torch

        for s, d in zip(self._sources(), self.dst, strict=True):
            d.copy_(s, non_blocking=s.is_cuda)
        if self.params[0].is_cuda:
            torch.cuda.synchronize()

    def finish(self) -> None:
        pass


class _CopyAndWrite(_BareCopy):
    """The floor of any checkpointer that writes the bytes: the bare copy into page-aligned
    buffers, then one background thread writing each buffer to its own file with ``O_DIRECT``
    and an fsync, as Ravex's objects are written; no hashing, no format, no manifest."""

    def __init__(self, model: Any, opt: Any, spec: dict[str, Any]) -> None:
        import torch

        super().__init__(model, opt, spec)
        self.torch, self.dir, self.thread = torch, spec["dir"], None
        self.folders: list[str] = []

    def _buffer(self, t: Any) -> Any:
        """Page-aligned, as ``O_DIRECT`` wants (Ravex's staging buffers are the same)."""
        from ravex.saving.stager import _aligned_block

        return _aligned_block(t.numel() * t.element_size()).view(t.dtype).view(t.shape).zero_()

    def checkpoint(self, step: int) -> None:
        import threading

        self.finish()
        super().checkpoint(step)
        self.thread = threading.Thread(target=self._write, args=(step,))
        self.thread.start()

    def _write(self, step: int) -> None:
        from ravex.format.storage.atomic import fsync_path
        from ravex.format.storage.direct import write_direct

        folder = os.path.join(self.dir, f"step{step}")
        os.makedirs(folder)
        self.folders.append(folder)
        for i, d in enumerate(self.dst):
            path = os.path.join(folder, str(i))
            data = memoryview(d.view(self.torch.uint8).numpy())
            if not write_direct(path, data):
                with open(path, "wb") as f:
                    f.write(data)
            fsync_path(path)
        while len(self.folders) > 2:  # disk: keep two, as Ravex's keep_last=2
            shutil.rmtree(self.folders.pop(0), ignore_errors=True)

    def finish(self) -> None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None


class _TorchSave:
    def __init__(self, model: Any, opt: Any, spec: dict[str, Any]) -> None:
        from .contenders import torch_save

        self.save, self.model, self.opt, self.dir = torch_save, model, opt, spec["dir"]
        self.paths: list[str] = []

    def checkpoint(self, step: int) -> None:
        path = os.path.join(self.dir, f"step{step}.pt")
        self.save(_state(self.model, self.opt), path)
        self.paths.append(path)
        while len(self.paths) > 2:  # disk: keep two, as Ravex's keep_last=2
            os.unlink(self.paths.pop(0))

    def finish(self) -> None:
        pass


class _DcpAsync:
    def __init__(self, model: Any, opt: Any, spec: dict[str, Any]) -> None:
        import torch.distributed.checkpoint as dcp

        self.dcp, self.model, self.opt, self.dir = dcp, model, opt, spec["dir"]
        self.fut: Any = None
        self.paths: list[str] = []

    def _wait(self) -> None:
        if self.fut is not None:
            getattr(self.fut, "upload_completion", self.fut).result()
            self.fut = None

    def checkpoint(self, step: int) -> None:
        self._wait()
        path = os.path.join(self.dir, f"step{step}")
        self.fut = self.dcp.async_save(_state(self.model, self.opt),
                                       storage_writer=self.dcp.FileSystemWriter(path, sync_files=True), no_dist=True)
        self.paths.append(path)
        while len(self.paths) > 3:  # the one in flight and two durable ones
            shutil.rmtree(self.paths.pop(0), ignore_errors=True)

    def finish(self) -> None:
        self._wait()


def apply_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """A variant's :data:`VARIANTS` entry set on Ravex's modules (before ``activate()``); the
    ``activate:`` keywords it names, returned for the call."""
    import importlib

    keywords: dict[str, Any] = {}
    for target, value in settings.items():
        module, attr = target.split(":")
        if module == "activate":
            keywords[attr] = value
            continue
        owner: Any = importlib.import_module(module)
        *outer, last = attr.split(".")
        for name in outer:  # "Class.ATTRIBUTE"
            owner = getattr(owner, name)
        setattr(owner, last, value)
    return keywords


class _Ravex:
    """``ravex.activate()`` on the live model and optimizer; each checkpoint is ``ravex.checkpoint()``
    at the step boundary (what the cadence does at the next forward pass), ``finish`` is ``ravex.flush()``."""

    def __init__(self, model: Any, opt: Any, spec: dict[str, Any]) -> None:
        import ravex

        keywords = apply_settings(spec.get("settings", {}))
        self.ravex = ravex
        ravex.activate(storage=os.path.join(spec["dir"], "ravex"), checkpoint_every=None, keep_last=2,
                       resume="never", checkpoint_on_exit=False, checkpoint_on_signal=[], log_level="WARNING",
                       **keywords)

    def checkpoint(self, step: int) -> None:
        if not self.ravex.checkpoint():
            raise RuntimeError(f"ravex.checkpoint() failed: {self.ravex.status()['last_error']}")

    def finish(self) -> None:
        self.ravex.flush()


_KINDS = {"bare copy": _BareCopy, "torch.save": _TorchSave, "dcp.async_save": _DcpAsync, "ravex": _Ravex,
          "copy + O_DIRECT write": _CopyAndWrite}


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """Warm up, then ``checkpoints`` pairs of cycles of ``every`` iterations each: a quiet one,
    then one that starts with a checkpoint and ends when it is durable. Each pair's
    difference is what that checkpoint cost the loop: the stall, the iterations it slowed
    and whatever of its write was still running after them (which the next checkpoint of a
    steady run would wait for). Seconds and process CPU of every cycle."""
    import torch

    warnings.filterwarnings("ignore")
    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    model, opt = _build(spec)
    x = torch.randn(spec["batch"], spec["width"], generator=torch.Generator().manual_seed(1))

    def iteration() -> None:
        loss = model(x).square().mean()
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()

    def cycle() -> None:
        for _ in range(spec["every"]):
            iteration()

    for _ in range(spec["warmup"]):
        iteration()
    is_ravex = spec["contender"].startswith("ravex")
    kind = _KINDS["ravex" if is_ravex else spec["contender"]]
    rss_before = _rss_reset_peak()
    ck = kind(model, opt, spec)
    out: dict[str, Any] = {"quiet_s": [], "quiet_cpu_s": [], "checkpoint_s": [], "checkpoint_cpu_s": [],
                           "blocks_s": [], "busy_s": [], "flush_s": [], "phases": []}
    step = spec["warmup"]
    out["threads_cpu_s"] = []
    for _ in range(spec["checkpoints"]):
        t0, c0, h0 = time.perf_counter(), time.process_time(), _thread_cpu()
        cycle()
        t1, c1, h1 = time.perf_counter(), time.process_time(), _thread_cpu()
        step += spec["every"]
        ck.checkpoint(step)
        t2 = time.perf_counter()
        cycle()
        t3 = time.perf_counter()
        ck.finish()
        t4, c4, h4 = time.perf_counter(), time.process_time(), _thread_cpu()
        out["threads_cpu_s"].append({k: h4.get(k, 0.0) - h1.get(k, 0.0) - (h1.get(k, 0.0) - h0.get(k, 0.0))
                                     for k in set(h0) | set(h1) | set(h4)})
        out["quiet_s"].append(t1 - t0)
        out["quiet_cpu_s"].append(c1 - c0)
        out["checkpoint_s"].append(t4 - t1)
        out["checkpoint_cpu_s"].append(c4 - c1)
        out["blocks_s"].append(t2 - t1)
        out["busy_s"].append(t3 - t2)
        out["flush_s"].append(t4 - t3)
        if is_ravex:  # where this checkpoint's time went, as the backend measured it
            import ravex

            out["phases"].append(dict(ravex.status()["last_write_seconds"] or {}))
        step += spec["every"]
    out["rss_before_bytes"], out["rss_peak_bytes"] = rss_before, _rss_peak()
    if spec["contender"].startswith("ravex"):
        import ravex

        st = ravex.status()
        out["checkpoints_written"], out["last_error"] = st["checkpoints_written"], st["last_error"]
        out["staging_prepared"] = st["staging_prepared"]  # bytes faulted in before the first checkpoint
        if st["last_error"] or st["checkpoints_written"] != spec["checkpoints"]:
            raise RuntimeError(f"ravex wrote {st['checkpoints_written']} checkpoints: {st['last_error']}")
        ravex.deactivate()
    return out


def _thread_cpu() -> dict[str, float]:
    """CPU seconds of this process's threads so far, by kind: the training thread, torch's
    intra-op threads (threads Python did not start) and each named Python thread pool
    (``ravex-stage``, ``ravex-write``, ...), so that a checkpoint cycle's CPU less the quiet
    cycle's says which threads spent it."""
    import threading

    names = {t.native_id: t.name.split("_")[0].rstrip("0123456789-") for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended
            continue
        kind = names.get(int(tid), "intra-op")
        kind = "training" if kind == "MainThread" else kind
        out[kind] = out.get(kind, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def _proc_status(field: str) -> int:
    """A ``/proc/self/status`` figure in bytes (``VmRSS``, ``VmHWM``); 0 where there is none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _rss_reset_peak() -> int:
    """The resident set now, with the peak (``VmHWM``) reset to it (``clear_refs`` 5, Linux), so
    that the peak read at the end is what the contender added on top of the trained state."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    return _proc_status("VmRSS")


def _rss_peak() -> int:
    return _proc_status("VmHWM")


# ---- the parent: every contender in turn ----------------------------------------------------------


def _state_bytes(cfg: Config, mode: str) -> tuple[int, int]:
    """(checkpoint bytes, bytes that change per checkpoint) of a mode: fp32 weights and biases,
    and two AdamW moments of the trainable ones."""
    layer = (cfg.width * cfg.width + cfg.width) * 4
    if mode == "full":
        return 3 * cfg.layers * layer, 3 * cfg.layers * layer
    frozen, n = cfg.frozen_layers
    return n * layer + 2 * (n - frozen) * layer, 3 * (n - frozen) * layer


def run_child(module: str, spec: dict[str, Any], label: str) -> dict[str, Any]:
    """``python -m <module> <spec> <out>`` in its own process; the JSON it wrote. The contender's
    folder (``spec["dir"]``) and the JSON are removed whatever happens."""
    out = spec["dir"] + ".json"
    try:
        proc = subprocess.run([sys.executable, "-m", module, json.dumps(spec), out], cwd=REPO,
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{label} failed:\n{proc.stderr[-3000:]}")
        with open(out) as f:
            res: dict[str, Any] = json.load(f)
    finally:
        shutil.rmtree(spec["dir"], ignore_errors=True)
        if os.path.exists(out):
            os.unlink(out)
    return res


def _run_one(cfg: Config, mode: str, name: str) -> dict[str, Any]:
    folder = tempfile.mkdtemp(prefix=f"goodput-{mode}-", dir=cfg.scratch)
    spec = {k: v for k, v in asdict(cfg).items() if k in ("width", "layers", "frozen_layers", "batch", "checkpoints",
                                                          "every", "warmup", "threads")}
    spec.update(mode=mode, contender=name, dir=folder, settings=VARIANTS.get(name, {}))
    res = run_child("benchmarks.goodput", spec, f"goodput child {name!r} ({mode})")
    res["iteration_s"] = statistics.median(res["quiet_s"]) / cfg.every
    res["lost_s"] = [c - q for c, q in zip(res["checkpoint_s"], res["quiet_s"], strict=True)]
    res["cpu_lost_s"] = [c - q for c, q in zip(res["checkpoint_cpu_s"], res["quiet_cpu_s"], strict=True)]
    # the median pair: the first checkpoint (allocating buffers) and another engineer's burst
    # land in the tails; each figure is still one checkpoint's whole cost
    res["lost_per_checkpoint_s"] = statistics.median(res["lost_s"])
    res["cpu_per_checkpoint_s"] = statistics.median(res["cpu_lost_s"])
    res["mean_lost_per_checkpoint_s"] = statistics.fmean(res["lost_s"])
    # the lost time in three parts: the stall, the iterations the background work slowed, and
    # the write still running after them (what the next checkpoint would wait for)
    res["slowed_s"] = [b - q for b, q in zip(res["busy_s"], res["quiet_s"], strict=True)]
    res["slowed_per_checkpoint_s"] = statistics.median(res["slowed_s"])
    res["flush_per_checkpoint_s"] = statistics.median(res["flush_s"])
    # issue 26: the first checkpoint of a process (fresh staging memory) against the later ones
    res["first_stall_s"] = res["blocks_s"][0]
    later = res["blocks_s"][1:]
    res["later_stall_s"] = statistics.median(later) if later else None
    res["first_over_later_stall"] = (res["first_stall_s"] / res["later_stall_s"]
                                     if res["later_stall_s"] else None)
    # host memory the contender added on top of the trained state, at its peak
    res["rss_added_bytes"] = max(0, res["rss_peak_bytes"] - res["rss_before_bytes"])
    nbytes, _ = _state_bytes(cfg, mode)
    res["rss_added_over_state"] = res["rss_added_bytes"] / nbytes
    kinds = sorted({k for t in res["threads_cpu_s"] for k in t})
    res["threads_cpu_median_s"] = {k: statistics.median(t.get(k, 0.0) for t in res["threads_cpu_s"]) for k in kinds}
    if res["phases"]:  # Ravex's own timers, median over the checkpoints
        keys = sorted({k for p in res["phases"] for k in p})
        res["phase_median_s"] = {k: statistics.median(p.get(k, 0.0) for p in res["phases"]) for k in keys}
    return res


def _median_or_none(values: list[Any]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 4) if known else None


def _rounded(v: Any) -> Any:
    """``v`` with its floats (in lists and dicts too) to 4 places, for the JSON."""
    if isinstance(v, float):
        return round(v, 4)
    if isinstance(v, list):
        return [_rounded(x) for x in v]
    if isinstance(v, dict):
        return {k: _rounded(x) for k, x in v.items()}
    return v


def run(cfg: Config) -> dict[str, Any]:
    names = list(cfg.contenders) + list(cfg.variants)
    load = list(os.getloadavg())
    modes: dict[str, Any] = {}
    for mode in (m for m in cfg.modes if m != LOOP):
        nbytes, changed = _state_bytes(cfg, mode)
        cfg.log(f"goodput {mode}: {nbytes / (1 << 30):.3f} GiB state ({changed / (1 << 30):.3f} GiB changing), "
                f"{cfg.checkpoints} checkpoints, each against {cfg.every} quiet iterations, {cfg.reps} rep(s) ...")
        runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
        for rep in range(cfg.reps):
            order = names[rep % len(names):] + names[:rep % len(names)]
            for name in order:
                r = _run_one(cfg, mode, name)
                runs[name].append(r)
                cfg.log(f"  rep {rep + 1}/{cfg.reps} {name:<40} lost {r['lost_per_checkpoint_s']:7.3f} s/ckpt "
                        f"(mean {r['mean_lost_per_checkpoint_s']:.3f}), cpu {r['cpu_per_checkpoint_s']:6.3f} s/ckpt, "
                        f"blocks {statistics.median(r['blocks_s']):.3f} s (first {r['first_stall_s']:.3f}), "
                        f"slowed {r['slowed_per_checkpoint_s']:.3f} s, flush {r['flush_per_checkpoint_s']:.3f} s, "
                        f"rss +{r['rss_added_bytes'] / (1 << 30):.2f} GiB (iteration {r['iteration_s']:.3f} s; "
                        f"load {os.getloadavg()[0]:.1f}; pairs {' '.join(f'{x:.2f}' for x in r['lost_s'])})")
                cfg.log("      CPU s / ckpt by thread (median): " + ", ".join(
                    f"{k} {v:+.3f}" for k, v in r["threads_cpu_median_s"].items() if abs(v) >= 0.001))
                if r.get("phase_median_s"):
                    cfg.log("      phases (median s): " + ", ".join(f"{k} {v:.3f}" for k, v in
                                                                      r["phase_median_s"].items()))
        figures = {
            key: {n: _median_or_none([r[key] for r in rs]) for n, rs in runs.items()}
            for key in ("lost_per_checkpoint_s", "cpu_per_checkpoint_s", "mean_lost_per_checkpoint_s",
                        "iteration_s", "slowed_per_checkpoint_s", "flush_per_checkpoint_s", "first_stall_s",
                        "later_stall_s", "first_over_later_stall", "rss_added_bytes", "rss_added_over_state")
        }
        phases = {n: {k: round(statistics.median(r["phase_median_s"].get(k, 0.0) for r in rs), 4)
                      for k in rs[0]["phase_median_s"]} for n, rs in runs.items() if rs[0].get("phase_median_s")}
        figures["blocks_s"] = {n: round(statistics.median(b for r in rs for b in r["blocks_s"]), 4)
                               for n, rs in runs.items()}
        figures["threads_cpu_median_s"] = {  # CPU per checkpoint by thread, median over the processes
            n: {k: round(statistics.median(r["threads_cpu_median_s"].get(k, 0.0) for r in rs), 4)
                for k in sorted({k for r in rs for k in r["threads_cpu_median_s"]})} for n, rs in runs.items()}
        lost = figures["lost_per_checkpoint_s"]
        entry: dict[str, Any] = {
            "state_bytes": nbytes, "changed_bytes": changed, **figures, "phase_median_s": phases,
            "runs": {n: [{k: _rounded(v) for k, v in r.items()} for r in rs] for n, rs in runs.items()},
        }
        ratios: dict[str, float | None] = {}
        if "ravex" in lost:
            for peer, key in PEERS:
                if peer in lost:
                    ratios[f"ravex_over_{key}"] = round(lost["ravex"] / lost[peer], 3) if lost[peer] > 0 else None
            for v in cfg.variants:
                ratios[f"{v}_over_ravex"] = round(lost[v] / lost["ravex"], 3) if lost["ravex"] > 0 else None
        entry["ratios"] = ratios
        modes[mode] = entry
    return {"config": {k: v for k, v in asdict(cfg).items() if k != "log"}, "modes": modes,
            "loadavg_start": load, "loadavg_end": list(os.getloadavg())}


if __name__ == "__main__":
    spec_json, out_path = sys.argv[1], sys.argv[2]
    result = child(json.loads(spec_json))
    with open(out_path, "w") as fh:
        json.dump(result, fh)

"""``python -m benchmarks gpu``: what issue 34 asks of a GPU, in one run that fits a lent device's minutes.

**resume** (items 1 and 5). ``benchmarks/gpu_trainee.py``, a small GPT with dropout and AdamW, under
Ravex on the device: bf16 autocast, and fp16 autocast with a ``GradScaler``. Each runs uninterrupted,
then again SIGKILLed right after step ``kill`` and rerun in the same folder; the final states
(model, optimizer, scaler) must be bitwise equal, and the rerun's witness line is kept. Then the
same kill and rerun without the deterministic settings (``torch.use_deterministic_algorithms``,
``CUBLAS_WORKSPACE_CONFIG``) and with ``witness: tolerant``: what the witness says there.

**stall** (items 2 and 4). In one process: ``layers`` Linear(width) layers and AdamW's state on the
device (8.25 GiB at the defaults), one step taken; a bare device-to-host copy of the same tensors
into pinned buffers allocated beforehand, and ``ravex.checkpoint()``'s stall as its own line
reports it, each twice after Ravex's first (which allocates its pinned buffers, and is reported
apart); each checkpoint of 8 GiB is written to the disk too, three in all. Then the newest step read back onto
the device by ``ravex.load``, against ``torch.save`` + ``torch.load(map_location=device)``.

**goodput** (item 3). Benchmark (h)'s user loop on the device, one round (:func:`goodput`).

``--device cpu --quick`` rehearses every part on the CPU (no pinned memory there).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from .goodput_loop import StallLines

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
_WITNESS = re.compile(r"^ravex: resume (verified|not verified|diverged)[^\n]*", re.M)


def _trainee(folder: str, device: str, amp: str, steps: int, every: int, kill_at: int = 0,
             deterministic: bool = True, witness: str = "exact", out: str = "final.pt") -> subprocess.CompletedProcess:
    env = dict(os.environ, G_DEVICE=device, G_AMP=amp, G_STEPS=str(steps), G_KILL_AT=str(kill_at),
               G_DETERMINISTIC="1" if deterministic else "0", G_OUT=os.path.join(folder, out),
               RAVEX_STORAGE=os.path.join(folder, "checkpoints"), RAVEX_CHECKPOINT_EVERY=str(every),
               RAVEX_WITNESS=witness, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, os.path.join(HERE, "gpu_trainee.py")], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=600)


def _equal(a: Any, b: Any) -> bool:
    """Whether two states loaded from ``torch.save`` are bitwise equal (tensors by their bytes)."""
    import torch

    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and bool(
            torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def resume(device: str, steps: int, every: int, kill_at: int, log: Any) -> dict[str, Any]:
    """Item 1 (bf16; fp16 with a GradScaler) and item 5 (the witness with and without determinism)."""
    import torch

    out: dict[str, Any] = {}
    cases = [("bf16", True, "exact"), ("fp16", True, "exact"), ("bf16", False, "tolerant")]
    for amp, deterministic, witness in cases:
        name = f"{amp}{'' if deterministic else ', non-deterministic'}"
        with tempfile.TemporaryDirectory(prefix="gpu-resume-") as tmp:
            ref_dir, run_dir = os.path.join(tmp, "ref"), os.path.join(tmp, "run")
            os.makedirs(ref_dir)
            os.makedirs(run_dir)
            ref = _trainee(ref_dir, device, amp, steps, every, 0, deterministic, witness)
            killed = _trainee(run_dir, device, amp, steps, every, kill_at, deterministic, witness)
            rerun = _trainee(run_dir, device, amp, steps, every, 0, deterministic, witness)
            ok = ref.returncode == 0 and killed.returncode == -9 and rerun.returncode == 0
            case: dict[str, Any] = {"returncodes": [ref.returncode, killed.returncode, rerun.returncode]}
            if ok:
                a = torch.load(os.path.join(ref_dir, "final.pt"), weights_only=False)
                b = torch.load(os.path.join(run_dir, "final.pt"), weights_only=False)
                case["bitwise"] = _equal(a, b)
            else:
                case["stderr_tail"] = (rerun.stderr or killed.stderr or ref.stderr)[-2000:]
            case["witness"] = [m.group(0) for m in _WITNESS.finditer(rerun.stderr)]
            case["resumed"] = next((line for line in rerun.stderr.splitlines() if "resumed from step" in line), None)
            out[name] = case
            log(f"  resume {name:<22} bitwise {case.get('bitwise')}; {case['witness'][:1] or case.get('stderr_tail')}")
    return out


def stall(device: str, width: int, layers: int, reps: int, log: Any) -> dict[str, Any]:
    """Item 2: Ravex's stall per checkpoint against a bare device-to-host copy of the same bytes."""
    import torch

    import ravex

    folder = tempfile.mkdtemp(prefix="gpu-stall-")
    lines = StallLines()
    logging.getLogger("ravex").addHandler(lines)
    ravex.activate(storage=os.path.join(folder, "checkpoints"), checkpoint_every=None, keep_last=1,
                   resume="never", checkpoint_on_exit=False, checkpoint_on_signal=[])
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)]).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def train_step() -> None:  # every tensor changes: each checkpoint copies them all
            model(torch.randn(8, width, device=device)).square().mean().backward()
            opt.step()
            opt.zero_grad()

        train_step()
        tensors = [p.detach() for p in model.parameters()] + [
            v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.ndim]
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        pinned = device != "cpu" and torch.cuda.is_available()
        buffers = [torch.empty(t.shape, dtype=t.dtype, pin_memory=pinned) for t in tensors]
        copies = []
        for _ in range(reps):
            _sync(device)
            t0 = time.perf_counter()
            for t, b in zip(tensors, buffers, strict=True):
                b.copy_(t, non_blocking=pinned)
            _sync(device)
            copies.append(time.perf_counter() - t0)
        del buffers
        for _ in range(reps + 1):
            train_step()
            if not ravex.checkpoint():
                raise RuntimeError(f"ravex.checkpoint() failed: {ravex.status()['last_error']}")
            ravex.flush()
        ravex.deactivate()
        restore = _restore(model, opt, folder, device)
    finally:
        ravex.deactivate()
        logging.getLogger("ravex").removeHandler(lines)
        shutil.rmtree(folder, ignore_errors=True)  # 8 GiB a checkpoint
    copy = statistics.median(copies)
    later = statistics.median(lines.stalls[1:]) if len(lines.stalls) > 1 else None
    res = {"state_bytes": nbytes, "pinned": pinned, "bare_copy_s": copies, "ravex_stalls_s": lines.stalls, **restore,
           "ravex_first_stall_s": lines.stalls[0] if lines.stalls else None, "ravex_later_stall_s": later,
           "ratio": round(later / copy, 3) if later and copy else None, "store": folder}
    log(f"  stall: {nbytes / (1 << 30):.2f} GiB on {device}; bare copy {copy:.3f} s (pinned {pinned}), "
        f"Ravex first {res['ravex_first_stall_s']}, later {later} s: {res['ratio']}x (goal 1.3x); restore: "
        f"ravex.load {res['ravex_load_s']:.3f} s, torch.load {res['torch_load_s']:.3f} s")
    return res


def _restore(model: Any, opt: Any, folder: str, device: str) -> dict[str, float]:
    """Item 4, from the same disk, the page cache dropped of neither: ``ravex.load`` of the newest step
    onto the device and the model's ``load_state_dict``, against ``torch.save``'s file read back by
    ``torch.load(map_location=device)`` and both ``load_state_dict`` calls. (A resume also restores the
    optimizer from Ravex's tree; ``ravex.load`` reads its tensors to the device all the same.)"""
    import torch

    import ravex

    path = os.path.join(folder, "state.pt")
    torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, path)
    _sync(device)
    t0 = time.perf_counter()
    tree = ravex.load(os.path.join(folder, "checkpoints"), device=device)
    model.load_state_dict(tree["models"][0]["state"])
    _sync(device)
    t1 = time.perf_counter()
    del tree
    state = torch.load(path, map_location=device, weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])
    _sync(device)
    t2 = time.perf_counter()
    return {"ravex_load_s": t1 - t0, "torch_load_s": t2 - t1}


def goodput(device: str, quick: bool, log: Any) -> dict[str, Any]:
    """Item 3: benchmark (h)'s user loop (``--modes loop``) on the device, one round: a busy loop of
    Linear(8192) layers and AdamW (3 GiB of state), Ravex against DCP ``async_save``, ``torch.save``
    and the floor (a pinned copy, then one O_DIRECT writer)."""
    from . import goodput as bench
    from . import goodput_loop

    cfg = bench.quick() if quick else bench.Config(width=8192, layers=4, batch=4096)
    cfg.device, cfg.reps, cfg.scratch, cfg.log = device, 1, tempfile.gettempdir(), log
    cfg.contenders = ("copy + O_DIRECT write", "ravex", "dcp.async_save", "torch.save")
    return goodput_loop.run_loop(cfg)


def _sync(device: str) -> None:
    import torch

    if device != "cpu" and torch.cuda.is_available():
        torch.cuda.synchronize()


def run(device: str, quick: bool, parts: list[str], log: Any) -> dict[str, Any]:
    import torch

    res: dict[str, Any] = {"device": device, "quick": quick, "torch": torch.__version__,
                           "gpu": torch.cuda.get_device_name() if device != "cpu" and torch.cuda.is_available()
                           else None}
    if "resume" in parts:
        res["resume"] = resume(device, steps=12 if quick else 40, every=4 if quick else 10,
                               kill_at=7 if quick else 27, log=log)
    if "goodput" in parts:
        res["goodput"] = goodput(device, quick, log)
    if "stall" in parts:
        res["stall"] = stall(device, width=256 if quick else 8192, layers=2 if quick else 11,
                             reps=2, log=log)
    return res


def table(res: dict[str, Any]) -> str:
    """The run as lines of text for the note and RESULTS.md."""
    lines = [f"device: {res['gpu'] or res['device']} (torch {res['torch']}){' quick' if res['quick'] else ''}"]
    for name, case in res.get("resume", {}).items():
        lines.append(f"resume {name}: bitwise {case.get('bitwise')}; resumed: {case.get('resumed')}; "
                     f"witness: {' / '.join(case['witness']) or '-'}")
    gp = res.get("goodput")
    if gp:
        lost = gp["lost_per_checkpoint_s"]
        lines.append("goodput (lost s / checkpoint, whole run): " + ", ".join(f"{k} {v:.3f}" for k, v in lost.items())
                     + f"; Ravex / DCP async_save {gp['ratios'].get('ravex_over_dcp_async')}x (goal 0.3x)")
    st = res.get("stall")
    if st:
        lines.append(f"stall: {st['state_bytes'] / (1 << 30):.2f} GiB; bare device-to-host copy "
                     f"{statistics.median(st['bare_copy_s']):.3f} s (pinned {st['pinned']}); Ravex first "
                     f"{st['ravex_first_stall_s']} s, later {st['ravex_later_stall_s']} s: {st['ratio']}x (goal 1.3x)")
        lines.append(f"restore: ravex.load to the device + the model's load_state_dict {st['ravex_load_s']:.3f} s; "
                     f"torch.load(map_location) + both load_state_dict {st['torch_load_s']:.3f} s")
    return "\n".join(lines)

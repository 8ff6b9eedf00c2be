"""Kill-and-rerun harness: real public scripts, unchanged, under Ravex zero-code.

usage: python harness.py CHECKOUT --src DIR [--scripts a,b] [--trials 3] [--seed 0] [--out DIR] [--extend-only]
(normally called by run_all.sh, which builds the venv this runs in)

Per script: a plain run (no ravex.yaml: Ravex inactive), an uninterrupted run under Ravex (the
reference), then per trial a run SIGKILLed at a random step between two checkpoints (after the
first checkpoint is complete in the store) and the same command rerun in the same directory.
The final state (parameters, buffers, optimizers, schedulers; dumped at exit by
instrument/sitecustomize.py) and the script's own output files are compared with the reference.
Last, a run to the end in a fresh directory and the same command rerun there: are the script's
output files still exactly as the first run left them, and did the rerun train again?
Then, for a script with an `extend` entry, a finished run rerun with a larger bound (more iterations
or epochs) beside a straight run with that bound from scratch: did the rerun train exactly the added
steps, and does it end where the straight run ends?
Killing stops and then SIGKILLs the whole process tree (torchrun's workers run in sessions of
their own, out of reach of a process-group kill).
"""

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import PurePath

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import scripts  # noqa: E402
from scripts import SCRIPTS  # noqa: E402

YAML = "storage: ./checkpoints\ncheckpoint_every: {every}\nkeep_last: 3\n"
# the runtime's own resume, or a Lightning Trainer's that zero-code handed it (integrations/lightning)
RESUMED = re.compile(r"ravex: resumed from step (\d+)|RavexCheckpointIO; resuming from step (?:\w[\w.-]*@)?(\d+)")
CKPT = re.compile(r"^ravex: checkpoint step \d+( \(\d+ ranks\))?:")  # torchrun's rank 0 says "(2 ranks)"


def resumed_step(out: str) -> str | None:
    """The step a rerun's output says it resumed from, whichever path resumed it."""
    m = RESUMED.search(out)
    return (m.group(1) or m.group(2)) if m else None


def env_for(workdir, spec):
    env = dict(os.environ)
    path = [os.path.join(HERE, "instrument")] + [os.path.normpath(os.path.join(workdir, p))
                                                 for p in spec.get("pythonpath", [])]
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONHASHSEED="0", PYTHONPATH=os.pathsep.join(path),
               RS_DUMP=os.path.join(workdir, "rs_dump.pt"), RS_PROGRESS=os.path.join(workdir, "rs_progress"))
    for k in ("RAVEX_CONFIG", "RS_CHILD", "RS_SEED", "RS_SPAWNED", "RANK", "LOCAL_RANK", "WORLD_SIZE"):
        env.pop(k, None)
    if "seed" in spec:
        env["RS_SEED"] = str(spec["seed"])
    if spec.get("spawned"):
        env["RS_SPAWNED"] = "1"
    env.update(spec.get("env", {}))
    return env


def store_steps(workdir, nproc=1):
    """Complete steps in the store: every rank's manifest is there."""
    d = os.path.join(workdir, "checkpoints", "steps")
    try:
        return sorted(int(s) for s in os.listdir(d)
                      if s.isdigit() and all(os.path.exists(os.path.join(d, s, f"rank-{r}.json"))
                                             for r in range(nproc)))
    except FileNotFoundError:
        return []


def _progress_files(workdir):
    return [f for f in os.listdir(workdir) if re.fullmatch(r"rs_progress(\.rank\d+)?", f)]


def read_progress(workdir):
    """(step, backward calls) of the process, or the furthest rank under torchrun."""
    best = (0, 0)
    for f in _progress_files(workdir):
        try:
            with open(os.path.join(workdir, f)) as fh:
                step, backwards = fh.read().split()
            best = max(best, (int(step), int(backwards)))
        except (FileNotFoundError, ValueError):
            pass
    return best


def _children():
    kids = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    return kids


def kill_tree(pid):
    """SIGSTOP pid and all its descendants until no new one appears (none can fork or restart a
    worker any more), then SIGKILL them all: a crash of the whole job at one moment."""
    seen = []
    while True:
        kids, todo, new = _children(), [pid], []
        while todo:
            p = todo.pop()
            if p not in seen:
                new.append(p)
            todo += kids.get(p, [])
        if not new:
            break
        for p in new:
            try:
                os.kill(p, signal.SIGSTOP)
            except ProcessLookupError:
                pass
        seen += new
    for p in seen:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run(workdir, cmd, python, spec, kill_at=None, unit="step", need_store=True, timeout=600, log_name=None):
    """Run cmd in workdir; with kill_at, SIGKILL the process tree once progress >= kill_at."""
    for f in os.listdir(workdir):
        if re.fullmatch(r"rs_dump(\.rank\d+)?\.pt|rs_progress(\.rank\d+)?", f):
            os.remove(os.path.join(workdir, f))
    nproc = spec.get("nproc", 1)
    log_name = log_name or ("rs_log.txt" if kill_at is None else "rs_log_killed.txt")
    log = open(os.path.join(workdir, log_name), "w")
    t0 = time.monotonic()
    p = subprocess.Popen([python, *cmd.split()], cwd=workdir, env=env_for(workdir, spec), stdout=log,
                         stderr=subprocess.STDOUT, start_new_session=True)
    killed = None
    store_at_kill = None
    while p.poll() is None:
        if time.monotonic() - t0 > timeout:
            kill_tree(p.pid)
            break
        if kill_at is not None:
            step, backwards = read_progress(workdir)
            pos = step if unit == "step" else backwards
            if pos >= kill_at and (not need_store or store_steps(workdir, nproc)):
                kill_tree(p.pid)
                p.wait()
                killed = read_progress(workdir)
                store_at_kill = store_steps(workdir, nproc)
                break
        time.sleep(0.002)
    p.wait()
    log.close()
    with open(log.name) as fh:
        out = fh.read()
    return dict(rc=p.returncode, out=out, secs=time.monotonic() - t0, killed=killed, store_at_kill=store_at_kill,
                dump=load_dump(workdir, nproc) if kill_at is None else None)


def load_dump(workdir, nproc=1):
    """The final state; under torchrun the ranks' dumps in one (lists concatenated in rank order,
    counters the furthest rank's), None when any is missing."""
    if nproc == 1:
        path = os.path.join(workdir, "rs_dump.pt")
        return torch.load(path, weights_only=False) if os.path.exists(path) else None
    dumps = []
    for r in range(nproc):
        path = os.path.join(workdir, f"rs_dump.rank{r}.pt")
        if not os.path.exists(path):
            return None
        dumps.append(torch.load(path, weights_only=False))
    out = {k: [x for d in dumps for x in d[k]] for k in ("modules", "params", "buffers", "optimizers", "schedulers")}
    out["modules"] = [f"rank{r}:{m}" for r, d in enumerate(dumps) for m in d["modules"]]
    for k in ("step", "optimizer_step_calls", "backwards"):
        out[k] = max(d[k] for d in dumps)
    return out


# ── comparison ─────────────────────────────────────────────────────────────

def compare(a, b, path="", diffs=None, norm=None, depth=0):
    """Walk two nested structures; return list of (path, max_abs_diff or None for non-tensor mismatch).
    norm: applied to strings and paths before comparing them (run ids made of the clock)."""
    if diffs is None:
        diffs = []
    if depth > 30:
        return diffs
    if torch.is_tensor(a) and torch.is_tensor(b):
        if a.shape != b.shape or a.dtype != b.dtype:
            diffs.append((path, float("inf")))
        elif not torch.equal(a, b):
            if a.is_floating_point() or a.is_complex():
                d = (a.double() - b.double()).abs()
                d = d[~torch.isnan(d)]
                diffs.append((path, float(d.max()) if d.numel() else float("nan")))
            else:
                diffs.append((path, float((a.long() - b.long()).abs().max())))
    elif isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                diffs.append((f"{path}/{k}", None))
            else:
                compare(a[k], b[k], f"{path}/{k}", diffs, norm, depth + 1)
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            diffs.append((f"{path}[len {len(a)}!={len(b)}]", None))
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            compare(x, y, f"{path}[{i}]", diffs, norm, depth + 1)
    elif hasattr(a, "state_dict") and hasattr(b, "state_dict") and isinstance(a, torch.nn.Module):
        compare(a.state_dict(), b.state_dict(), path, diffs, norm, depth + 1)
    elif norm and isinstance(a, (str, PurePath)) and isinstance(b, (str, PurePath)):
        if norm(str(a)) != norm(str(b)):
            diffs.append((path, None))
    elif (hasattr(a, "__dict__") and not isinstance(a, type) and type(a).__eq__ is object.__eq__
          and (type(a).__module__, type(a).__qualname__) == (type(b).__module__, type(b).__qualname__)):
        # a pickled object of the script's own class (loaded from two folders: two classes): its fields
        compare(vars(a), vars(b), path, diffs, norm, depth + 1)
    elif isinstance(a, argparse.Namespace) and isinstance(b, argparse.Namespace):
        # the flags a script saves beside its weights (timm's checkpoints): which flag differs
        compare(vars(a), vars(b), path, diffs, norm, depth + 1)
    else:
        try:
            same = a == b
            same = bool(same)
        except Exception:
            same = repr(a) == repr(b)
        if not same:
            diffs.append((path, None))
    return diffs


def state_diffs(dump, ref):
    """Per category (params, buffers, optimizer, scheduler): (equal, max abs diff, first paths)."""
    res = {}
    if dump is None or ref is None:
        return None
    for cat in ("params", "buffers", "optimizers", "schedulers"):
        d = compare(dump[cat], ref[cat], cat)
        nums = [x for _, x in d if x is not None]
        res[cat] = dict(equal=not d, max=max(nums) if nums else (0.0 if not d else None),
                        where=[p for p, _ in d[:4]], n=len(d))
    return res


def user_files(workdir, outputs):
    found = []
    for o in outputs:
        p = os.path.join(workdir, o)
        if os.path.isfile(p):
            found.append(o)
        elif os.path.isdir(p):
            for root, _, files in os.walk(p):
                found += [os.path.relpath(os.path.join(root, f), workdir) for f in files]
    return sorted(found)


def load_any(path, workdir):
    """A .pt/.pth/.pth.tar file as objects (a pickled object needs the script's folder importable: its modules
    are imported from there and forgotten after), else bytes."""
    if path.endswith((".pt", ".pth", ".pth.tar")):  # timm saves torch.save files as .pth.tar
        before = dict(sys.modules)
        sys.path.insert(0, workdir)
        try:
            return torch.load(path, weights_only=False, map_location="cpu")
        finally:
            sys.path.remove(workdir)
            for name in [n for n in sys.modules if n not in before]:
                del sys.modules[name]
            sys.modules.update(before)
    with open(path, "rb") as fh:
        return fh.read()


def renamer(spec):
    """The script's rename rule as a function on strings (identity without one)."""
    if "rename" not in spec:
        return None
    rx, repl = spec["rename"]
    return lambda s: re.sub(rx, repl, s)


def named_files(workdir, outputs, norm):
    """{name after the rename rule: newest path}, and the names that more than one path had."""
    by = {}
    for f in user_files(workdir, outputs):
        by.setdefault(norm(f) if norm else f, []).append(f)
    newest = {k: max(v, key=lambda f: os.stat(os.path.join(workdir, f)).st_mtime_ns) for k, v in by.items()}
    return newest, sorted(k for k, v in by.items() if len(v) > 1)


def file_diffs(workdir, refdir, outputs, norm=None):
    """The script's output files that differ from the reference's (after the rename rule; of several
    files of one name, the newest)."""
    mine, _ = named_files(workdir, outputs, norm)
    ref, _ = named_files(refdir, outputs, norm)
    out = []
    for f in sorted(set(mine) | set(ref)):
        if f not in mine:
            out.append(f"{f} missing")
        elif f not in ref:
            out.append(f"{f} extra")
        else:
            d = compare(load_any(os.path.join(workdir, mine[f]), workdir),
                        load_any(os.path.join(refdir, ref[f]), refdir), f, norm=norm)
            if d:
                nums = [x for _, x in d if x is not None]
                out.append(f"{f} differs" + (f" (max {max(nums):.3g})" if nums else f" ({d[0][0]})"))
    return out


def file_hashes(workdir, outputs):
    """{path: (sha256, mtime_ns)} of the script's output files."""
    out = {}
    for f in user_files(workdir, outputs):
        p = os.path.join(workdir, f)
        with open(p, "rb") as fh:
            out[f] = (hashlib.sha256(fh.read()).hexdigest(), os.stat(p).st_mtime_ns)
    return out


def counter_lines(out, regex):
    return [m.groups() for m in (re.match(regex, line) for line in out.splitlines()) if m]


def normalize(line):
    """Drop timing figures so lines of two runs compare."""
    line = re.sub(r"time:? *[\d.]+ ?m?s", "time", line)
    line = re.sub(r"ms/batch +[\d.]+", "ms/batch", line)
    line = re.sub(r"mfu -?[\d.]+%", "mfu", line)
    line = re.sub(r"iter_dt [\d.]+ms", "iter_dt", line)
    return line.strip()


def script_lines(out, norm=None):
    return [(norm or str)(normalize(x)) for x in out.splitlines() if x.strip()
            and not x.startswith(("ravex", "[rs-")) and "Warning" not in x and not x.startswith(" ")]


def steps_taken(dump, unit):
    """The steps a run took by ``unit`` (optimizer steps, or backward() calls), from its dump; None without one."""
    return (dump["step"] if unit == "step" else dump["backwards"]) if dump else None


def ravex_notes(out):
    """Ravex's own messages other than checkpoint statistics and the resume line."""
    return [x for x in out.splitlines() if x.startswith("ravex") and not CKPT.match(x) and not RESUMED.search(x)]


# ── driver ─────────────────────────────────────────────────────────────────

def fresh(template, dst, sub, yaml):
    if os.path.exists(dst):
        shutil.rmtree(dst)
    shutil.copytree(template, dst, symlinks=True)
    if yaml:
        with open(os.path.join(dst, sub, "ravex.yaml"), "w") as fh:
            fh.write(yaml)


def finished_rerun(spec, tpl, sub, yaml, base, python, unit):
    """Run to the end in a fresh directory, then the same command again: what the second run did to
    the script's output files (bytes, sha256) and whether it trained again."""
    fresh(tpl, os.path.join(base, "finished"), sub, yaml)
    workdir = os.path.join(base, "finished", sub)
    first = run(workdir, spec["cmd"], python, spec)
    before = file_hashes(workdir, spec["outputs"])
    time.sleep(0.05)  # a rewrite shows in st_mtime_ns even on a coarse clock
    again = run(workdir, spec["cmd"], python, spec, log_name="rs_log_rerun.txt")
    after = file_hashes(workdir, spec["outputs"])
    d = again["dump"]
    counters = counter_lines(again["out"], spec["counter"])
    new = sorted(f for f in after if f not in before)
    norm = renamer(spec)
    new_vs_first = []  # a new file of a name the first run wrote (a new run directory): is it the same?
    if norm:
        by_name = {norm(f): f for f in before}
        for f in new:
            if norm(f) in by_name:
                diff = compare(load_any(os.path.join(workdir, f), workdir),
                               load_any(os.path.join(workdir, by_name[norm(f)]), workdir), norm(f), norm=norm)
                if diff:
                    nums = [x for _, x in diff if x is not None]
                    new_vs_first.append(f"{norm(f)} differs" + (f" (max {max(nums):.3g})" if nums else
                                                                f" ({diff[0][0]})"))
    return dict(
        first_rc=first["rc"], rerun_rc=again["rc"], rerun_secs=round(again["secs"], 1),
        first_steps=first["dump"]["step"] if first["dump"] else None,
        rerun_ran=steps_taken(d, unit),
        rerun_backwards=d["backwards"] if d else None,
        changed=sorted(f for f in before if f in after and after[f][0] != before[f][0]),
        rewritten=sorted(f for f in before if f in after and after[f] != before[f] and after[f][0] == before[f][0]),
        new=new, new_vs_first=new_vs_first, gone=sorted(f for f in before if f not in after),
        n_files=len(before), counter_lines=len(counters), first_counter=counters[0] if counters else None,
        resumed=resumed_step(again["out"]),
        ravex_notes=ravex_notes(again["out"])[:6], tail=again["out"].strip().splitlines()[-3:],
    )


def extend_run(spec, tpl, sub, yaml, base, python, unit):
    """A run to the end with bound B1 in a fresh directory (`extended/`), then rerun there with the
    bound raised to B2; beside it a straight run with B2 from scratch (`straight/`). The extending
    rerun should train exactly the added steps and end with the straight run's state and files."""
    ext = spec["extend"]
    cmd1 = ext.get("cmd", spec["cmd"])
    cmd2 = ext.get("cmd2", cmd1)
    edit = ext.get("edit")  # a bound kept in a file the script reads (pytorch-template's config)
    nproc = spec.get("nproc", 1)
    norm = renamer(spec)
    fresh(tpl, os.path.join(base, "extended"), sub, yaml)
    workdir = os.path.join(base, "extended", sub)
    first = run(workdir, cmd1, python, spec)
    first_store = store_steps(workdir, nproc)
    if edit:
        edit(workdir)
    again = run(workdir, cmd2, python, spec, log_name="rs_log_extend.txt")
    fresh(tpl, os.path.join(base, "straight"), sub, yaml)
    sdir = os.path.join(base, "straight", sub)
    if edit:
        edit(sdir)
    straight = run(sdir, cmd2, python, spec)

    counters = counter_lines(again["out"], spec["counter"])
    straight_lines = script_lines(straight["out"], norm)
    foreign = [x for x in script_lines(again["out"], norm) if x not in straight_lines]
    b1, b2 = steps_taken(first["dump"], unit), steps_taken(straight["dump"], unit)
    return dict(
        bound=ext["bound"], cmd=cmd1, cmd2=cmd2, steps_declared=ext["steps"],
        first_rc=first["rc"], rerun_rc=again["rc"], straight_rc=straight["rc"],
        first_steps=b1, straight_steps=b2, steps_added=b2 - b1 if b1 is not None and b2 is not None else None,
        first_store=first_store, rerun_ran=steps_taken(again["dump"], unit),
        rerun_backwards=again["dump"]["backwards"] if again["dump"] else None,
        rerun_secs=round(again["secs"], 1), resumed=resumed_step(again["out"]),
        state=state_diffs(again["dump"], straight["dump"]), files=file_diffs(workdir, sdir, spec["outputs"], norm),
        same_name=named_files(workdir, spec["outputs"], norm)[1],
        first_counter=counters[0] if counters else None, counter_lines=len(counters),
        counter_lines_straight=len(counter_lines(straight["out"], spec["counter"])),
        foreign_lines=foreign[:6], n_foreign=len(foreign), ravex_notes=ravex_notes(again["out"])[:8],
        tail=again["out"].strip().splitlines()[-3:],
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkout")
    ap.add_argument("--scripts", default=",".join(SCRIPTS))
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="results directory (default: ./results/<sha>)")
    ap.add_argument("--src", default=scripts.SRC,
                    help="holds nanoGPT/, examples/, minGPT/, pytorch-template/ (default: $RAVEX_RS_SRC or ./src)")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--extend-only", action="store_true",
                    help="only the extension phase (scripts with an `extend` entry); other results are kept")
    args = ap.parse_args()
    sha = subprocess.run(["git", "-C", args.checkout, "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    scripts.SRC = os.path.abspath(args.src)
    outdir = os.path.abspath(args.out or os.path.join("results", sha))
    os.makedirs(outdir, exist_ok=True)
    names = args.scripts.split(",")
    results = []
    rpath = os.path.join(outdir, "results.json")
    if os.path.exists(rpath):  # keep the other scripts' rows of an earlier run of this checkout
        with open(rpath) as fh:
            results = [r for r in json.load(fh) if args.extend_only or r["script"] not in names]
    if args.extend_only:
        for n in names:
            if "extend" not in SCRIPTS[n]:
                print(f"[{n}] no extend entry: skipped", flush=True)
        names = [n for n in names if "extend" in SCRIPTS[n]]
    for name in names:
        spec = SCRIPTS[name]
        rng = random.Random(f"{args.seed}-{name}")  # a script's kill points do not depend on which others run
        base = os.path.join(outdir, name)
        tpl = os.path.join(base, "template")
        if os.path.exists(tpl):
            shutil.rmtree(tpl)
        os.makedirs(tpl)
        sub = spec["build"](tpl)
        yaml = YAML.format(every=spec["every"])

        def wd(run_name, base=base, sub=sub):
            return os.path.join(base, run_name, sub)

        if args.extend_only:
            # the unit of the full run's summary row, else steps (every script with a bound steps an optimizer)
            row = next((r for r in results if r["script"] == name and r.get("summary")), None)
            extended = extend_run(spec, tpl, sub, yaml, base, args.python, (row or {}).get("unit", "step"))
            print_extend(name, extended)
            if row is None:
                row = dict(script=name, summary=True)
                results.append(row)
            row["extend"] = extended
            with open(rpath, "w") as fh:
                json.dump(results, fh, indent=1, default=str)
            continue
        nproc = spec.get("nproc", 1)
        norm = renamer(spec)
        fresh(tpl, os.path.join(base, "plain"), sub, None)
        plain = run(wd("plain"), spec["cmd"], args.python, spec)
        fresh(tpl, os.path.join(base, "ref"), sub, yaml)
        ref = run(wd("ref"), spec["cmd"], args.python, spec)
        rd = ref["dump"]
        unit = "step" if rd and rd["step"] > 0 else "backward"
        total = rd["step"] if unit == "step" else rd["backwards"]
        ref_store = store_steps(wd("ref"), nproc)
        every = spec["every"]
        print(f"[{name}] plain rc={plain['rc']} {plain['secs']:.1f}s; ref rc={ref['rc']} {ref['secs']:.1f}s "
              f"total={total} {unit}s store={ref_store}", flush=True)
        plain_vs_ref = state_diffs(plain["dump"], rd)
        lo = every + 1 if ref_store else 5
        candidates = [s for s in range(lo, total) if s % every != 0]
        ref_lines = script_lines(ref["out"], norm)
        if not candidates:  # the reference trained nothing (it failed): no kill point, no trial
            print(f"[{name}] no step to kill at (reference rc={ref['rc']}, total={total}): no trial", flush=True)
        for t in range(args.trials if candidates else 0):
            target = rng.choice(candidates)
            tdir = os.path.join(base, f"trial{t}")
            fresh(tpl, tdir, sub, yaml)
            k = run(wd(f"trial{t}"), spec["cmd"], args.python, spec, kill_at=target, unit=unit,
                    need_store=bool(ref_store))
            r = run(wd(f"trial{t}"), spec["cmd"], args.python, spec)
            step = resumed_step(r["out"])
            resumed = int(step) if step is not None else None
            d = r["dump"]
            ran = steps_taken(d, unit)
            expected = total - (resumed or 0) if unit == "step" else total
            rerun_lines = script_lines(r["out"], norm)
            foreign = [x for x in rerun_lines if x not in ref_lines]
            counters = counter_lines(r["out"], spec["counter"])
            killed_counters = counter_lines(k["out"], spec["counter"])
            row = dict(
                script=name, trial=t, unit=unit, total=total, target=target,
                killed_at=(k["killed"][0] if unit == "step" else k["killed"][1]) if k["killed"] else None,
                killed_rc=k["rc"], store_at_kill=k["store_at_kill"], resumed_from=resumed,
                rerun_ran=ran, rerun_expected=expected, rerun_rc=r["rc"], rerun_secs=round(r["secs"], 1),
                first_counter_rerun=counters[0] if counters else None,
                last_counter_killed=killed_counters[-1] if killed_counters else None,
                counter_lines_total=len(counters) + len(killed_counters),
                counter_lines_ref=len(counter_lines(ref["out"], spec["counter"])),
                state=state_diffs(d, rd), files=file_diffs(wd(f"trial{t}"), wd("ref"), spec["outputs"], norm),
                same_name=named_files(wd(f"trial{t}"), spec["outputs"], norm)[1],
                foreign_lines=foreign[:6], n_foreign=len(foreign), ravex_notes=ravex_notes(r["out"])[:6],
                backwards_rerun=d["backwards"] if d else None,
            )
            results.append(row)
            st = row["state"]
            eq = all(v["equal"] for v in st.values()) if st else None
            print(f"[{name}] trial {t}: kill@{row['killed_at']} resumed={resumed} ran={ran}/{expected} "
                  f"bitwise={eq} files={row['files']}", flush=True)
        finished = finished_rerun(spec, tpl, sub, yaml, base, args.python, unit)
        print(f"[{name}] finished rerun: ran={finished['rerun_ran']} files changed={finished['changed']} "
              f"rewritten={finished['rewritten']} new={finished['new'][:3]}", flush=True)
        extended = None
        if "extend" in spec:
            extended = extend_run(spec, tpl, sub, yaml, base, args.python, unit)
            print_extend(name, extended)
        results.append(dict(script=name, summary=True, plain_vs_ref=plain_vs_ref, ref_store=ref_store,
                            total=total, unit=unit, ref_rc=ref["rc"], plain_rc=plain["rc"],
                            ref_notes=ravex_notes(ref["out"])[:6], cmd=spec["cmd"], finished=finished,
                            extend=extended))
        with open(rpath, "w") as fh:
            json.dump(results, fh, indent=1, default=str)
    print(rpath)


def print_extend(name, e):
    st = e["state"]
    eq = all(v["equal"] for v in st.values()) if st else None
    # the witness's verdict, else what Ravex said first (e.g. that it would not train again)
    said = [x for x in e["ravex_notes"] if "verified" in x or "diverged" in x] or e["ravex_notes"]
    print(f"[{name}] extend {e['bound']}: ran={e['rerun_ran']}/{e['steps_declared']} (straight - first = "
          f"{e['steps_added']}) resumed={e['resumed']} bitwise vs straight={eq} files={e['files']} "
          f"rc={e['first_rc']},{e['rerun_rc']},{e['straight_rc']} ravex={said[:1]}", flush=True)


if __name__ == "__main__":
    main()

"""Kill-and-rerun harness: real public scripts, unchanged, under Ravex zero-code.

usage: python harness.py CHECKOUT --src DIR [--scripts a,b] [--trials 3] [--seed 0] [--out DIR]
(normally called by run_all.sh, which builds the venv this runs in)

Per script: a plain run (no ravex.yaml: Ravex inactive), an uninterrupted run under Ravex (the
reference), then per trial a run SIGKILLed at a random step between two checkpoints (after the
first checkpoint is complete in the store) and the same command rerun in the same directory.
The final state (parameters, buffers, optimizers, schedulers; dumped at exit by
instrument/sitecustomize.py) and the script's own output files are compared with the reference.
"""

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import scripts  # noqa: E402
from scripts import SCRIPTS  # noqa: E402

YAML = "storage: ./checkpoints\ncheckpoint_every: {every}\nkeep_last: 3\n"
RESUMED = re.compile(r"ravex: resumed from step (\d+)")
CKPT = re.compile(r"^ravex: checkpoint step \d+:")


def env_for(workdir):
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONHASHSEED="0",
               PYTHONPATH=os.path.join(HERE, "instrument"),
               RS_DUMP=os.path.join(workdir, "rs_dump.pt"), RS_PROGRESS=os.path.join(workdir, "rs_progress"))
    env.pop("RAVEX_CONFIG", None)
    env.pop("RS_CHILD", None)
    return env


def store_steps(workdir):
    d = os.path.join(workdir, "checkpoints", "steps")
    try:
        return sorted(int(s) for s in os.listdir(d)
                      if s.isdigit() and os.path.exists(os.path.join(d, s, "rank-0.json")))
    except FileNotFoundError:
        return []


def read_progress(workdir):
    try:
        with open(os.path.join(workdir, "rs_progress")) as fh:
            step, backwards = fh.read().split()
        return int(step), int(backwards)
    except (FileNotFoundError, ValueError):
        return 0, 0


def run(workdir, cmd, python, kill_at=None, unit="step", need_store=True, timeout=600):
    """Run cmd in workdir; with kill_at, SIGKILL the process group once progress >= kill_at."""
    for f in ("rs_dump.pt", "rs_progress"):
        if os.path.exists(os.path.join(workdir, f)):
            os.remove(os.path.join(workdir, f))
    log = open(os.path.join(workdir, "rs_log.txt" if kill_at is None else "rs_log_killed.txt"), "w")
    t0 = time.monotonic()
    p = subprocess.Popen([python, *cmd.split()], cwd=workdir, env=env_for(workdir), stdout=log,
                         stderr=subprocess.STDOUT, start_new_session=True)
    killed = None
    store_at_kill = None
    while p.poll() is None:
        if time.monotonic() - t0 > timeout:
            os.killpg(p.pid, signal.SIGKILL)
            break
        if kill_at is not None:
            step, backwards = read_progress(workdir)
            pos = step if unit == "step" else backwards
            if pos >= kill_at and (not need_store or store_steps(workdir)):
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                killed = read_progress(workdir)
                store_at_kill = store_steps(workdir)
                break
        time.sleep(0.002)
    p.wait()
    log.close()
    with open(log.name) as fh:
        out = fh.read()
    return dict(rc=p.returncode, out=out, secs=time.monotonic() - t0, killed=killed, store_at_kill=store_at_kill,
                dump=load_dump(workdir) if kill_at is None else None)


def load_dump(workdir):
    path = os.path.join(workdir, "rs_dump.pt")
    if not os.path.exists(path):
        return None
    return torch.load(path, weights_only=False)


# ── comparison ─────────────────────────────────────────────────────────────

def compare(a, b, path="", diffs=None):
    """Walk two nested structures; return list of (path, max_abs_diff or None for non-tensor mismatch)."""
    if diffs is None:
        diffs = []
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
                compare(a[k], b[k], f"{path}/{k}", diffs)
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            diffs.append((f"{path}[len {len(a)}!={len(b)}]", None))
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            compare(x, y, f"{path}[{i}]", diffs)
    elif hasattr(a, "state_dict") and hasattr(b, "state_dict") and isinstance(a, torch.nn.Module):
        compare(a.state_dict(), b.state_dict(), path, diffs)
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
    """A .pt/.pth file as objects (a pickled module needs the script's folder importable), else bytes."""
    if path.endswith((".pt", ".pth")):
        saved = sys.modules.pop("model", None)
        sys.path.insert(0, workdir)
        try:
            return torch.load(path, weights_only=False, map_location="cpu")
        finally:
            sys.path.remove(workdir)
            sys.modules.pop("model", None)
            if saved is not None:
                sys.modules["model"] = saved
    with open(path, "rb") as fh:
        return fh.read()


def file_diffs(workdir, refdir, outputs):
    mine, ref = set(user_files(workdir, outputs)), set(user_files(refdir, outputs))
    out = []
    for f in sorted(mine | ref):
        if f not in mine:
            out.append(f"{f} missing")
        elif f not in ref:
            out.append(f"{f} extra")
        else:
            d = compare(load_any(os.path.join(workdir, f), workdir), load_any(os.path.join(refdir, f), refdir), f)
            if d:
                nums = [x for _, x in d if x is not None]
                out.append(f"{f} differs" + (f" (max {max(nums):.3g})" if nums else ""))
    return out


def counter_lines(out, regex):
    return [m.groups() for m in (re.match(regex, line) for line in out.splitlines()) if m]


def normalize(line):
    """Drop timing figures so lines of two runs compare."""
    line = re.sub(r"time:? *[\d.]+ ?m?s", "time", line)
    line = re.sub(r"ms/batch +[\d.]+", "ms/batch", line)
    line = re.sub(r"mfu -?[\d.]+%", "mfu", line)
    return line.strip()


def script_lines(out):
    return [normalize(x) for x in out.splitlines() if x.strip() and not x.startswith(("ravex", "[rs-"))
            and "Warning" not in x and not x.startswith(" ")]


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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkout")
    ap.add_argument("--scripts", default=",".join(SCRIPTS))
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="results directory (default: ./results/<sha>)")
    ap.add_argument("--src", default=scripts.SRC, help="holds nanoGPT/ and examples/ (default: $RAVEX_RS_SRC or ./src)")
    ap.add_argument("--python", default=sys.executable)
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
            results = [r for r in json.load(fh) if r["script"] not in names]
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

        fresh(tpl, os.path.join(base, "plain"), sub, None)
        plain = run(wd("plain"), spec["cmd"], args.python)
        fresh(tpl, os.path.join(base, "ref"), sub, yaml)
        ref = run(wd("ref"), spec["cmd"], args.python)
        rd = ref["dump"]
        unit = "step" if rd and rd["step"] > 0 else "backward"
        total = rd["step"] if unit == "step" else rd["backwards"]
        ref_store = store_steps(wd("ref"))
        every = spec["every"]
        print(f"[{name}] plain rc={plain['rc']} {plain['secs']:.1f}s; ref rc={ref['rc']} {ref['secs']:.1f}s "
              f"total={total} {unit}s store={ref_store}", flush=True)
        plain_vs_ref = state_diffs(plain["dump"], rd)
        lo = every + 1 if ref_store else 5
        candidates = [s for s in range(lo, total) if s % every != 0]
        ref_lines = script_lines(ref["out"])
        for t in range(args.trials):
            target = rng.choice(candidates)
            tdir = os.path.join(base, f"trial{t}")
            fresh(tpl, tdir, sub, yaml)
            k = run(wd(f"trial{t}"), spec["cmd"], args.python, kill_at=target, unit=unit, need_store=bool(ref_store))
            r = run(wd(f"trial{t}"), spec["cmd"], args.python)
            m = RESUMED.search(r["out"])
            resumed = int(m.group(1)) if m else None
            d = r["dump"]
            ran = (d["step"] if unit == "step" else d["backwards"]) if d else None
            expected = total - (resumed or 0) if unit == "step" else total
            rerun_lines = script_lines(r["out"])
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
                state=state_diffs(d, rd), files=file_diffs(wd(f"trial{t}"), wd("ref"), spec["outputs"]),
                foreign_lines=foreign[:6], n_foreign=len(foreign), ravex_notes=ravex_notes(r["out"])[:6],
                backwards_rerun=d["backwards"] if d else None,
            )
            results.append(row)
            st = row["state"]
            eq = all(v["equal"] for v in st.values()) if st else None
            print(f"[{name}] trial {t}: kill@{row['killed_at']} resumed={resumed} ran={ran}/{expected} "
                  f"bitwise={eq} files={row['files']}", flush=True)
        results.append(dict(script=name, summary=True, plain_vs_ref=plain_vs_ref, ref_store=ref_store,
                            total=total, unit=unit, ref_rc=ref["rc"], plain_rc=plain["rc"],
                            ref_notes=ravex_notes(ref["out"])[:6], cmd=spec["cmd"]))
        with open(rpath, "w") as fh:
            json.dump(results, fh, indent=1, default=str)
    print(rpath)


if __name__ == "__main__":
    main()

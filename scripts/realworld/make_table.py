"""results.json -> markdown table. usage: python make_table.py results.json CHECKOUT"""

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from scripts import SCRIPTS

res = json.load(open(sys.argv[1]))
checkout = sys.argv[2]
# run_all.sh records the checkout as the run started; HEAD now may be a later commit
sha = os.environ.get("RS_CHECKOUT_DESC") or subprocess.run(
    ["git", "-C", checkout, "log", "-1", "--format=%h %s"], capture_output=True, text=True).stdout.strip()


def fmt_max(x):
    if x is None:
        return "n/a"
    return "0" if x == 0 else f"{x:.3g}"


def cell(text):
    return text.replace("|", "\\|").replace("\t", " ")


def replayed(r):
    if r["rerun_ran"] is None or r["rerun_expected"] is None or r["rerun_ran"] == r["rerun_expected"]:
        return ""
    return f" (**{r['rerun_ran'] - r['rerun_expected']:+d}**)"


def bitwise(st):
    if st is None:
        return "no dump"
    return "yes" if all(v["equal"] for v in st.values()) else "**no**"


def eq(st, cat):
    if st is None:
        return "no dump"
    v = st[cat]
    return "=" if v["equal"] else f"≠ ({v['n']})"


print(f"""# Real public scripts killed and rerun under Ravex

Checkout: `{checkout}` ({sha}). Reproduce, against this or any other checkout:

```bash
git worktree add ../ravex-<sha> <sha>
bash scripts/realworld/run_all.sh ../ravex-<sha> --work DIR --trials 3 --seed 14
```

Each script runs from a copy of its source (karpathy/nanoGPT, pytorch/examples, karpathy/minGPT,
victoresque/pytorch-template; unchanged but for the CPU/gloo edits of the torchrun scripts in
`scripts.py` PATCHES), with the commands listed below, `OMP_NUM_THREADS=1`, on CPU, with
`ravex enable` and a `ravex.yaml` beside it (`storage: ./checkpoints`, `checkpoint_every: 20`, 10 for
mingpt-ddp, `keep_last: 3`). The reference is the same command
run uninterrupted under Ravex. "step" is Ravex's rule: the most optimizer steps any one optimizer took
(dcgan: iterations). wlm (no `torch.optim`) is measured in `backward()` calls. Kill = SIGKILL to the
process group once the step counter reached a random target that is not a checkpoint step, with at
least one complete step in the store (torchrun: the whole process tree, every rank's manifest).
Final state is dumped at exit by `instrument/sitecustomize.py`
(PYTHONPATH; global forward/step hooks, no edit to the scripts).

Columns: *kill* = step reached when killed; *store* = complete steps in the store then; *resumed* =
Ravex's "resumed from step"; *ran / left* = steps the rerun process executed / steps that were left
(total − resumed), with the surplus in bold; *bitwise* = the whole final state equals the reference;
*params, buffers, optim, sched* = bitwise equal to the reference (≠ (n): n entries differ);
*max* = max |Δ| over parameters (buffers); *first printed* = the script's first progress line of the
rerun (its own counter); *files* = the script's own output files that differ from the
reference run's; *other* = rerun lines no uninterrupted run prints, Ravex's messages.
wlm's "yes" rows are a rerun from scratch (nothing was ever checkpointed), not a resume.
""")

print("| script | trial | kill | store | resumed | ran / left | bitwise | params | buffers | optim | sched "
      "| max params (buffers) | first printed | files differing | other |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for r in res:
    if r.get("summary"):
        continue
    st = r["state"]
    mx = "n/a" if st is None else f"{fmt_max(st['params']['max'])} ({fmt_max(st['buffers']['max'])})"
    other = []
    if r["rerun_rc"] != 0:
        other.append(f"rerun rc {r['rerun_rc']}")
    if r["n_foreign"]:
        other.append(f"{r['n_foreign']} lines not in ref, e.g. `{cell(r['foreign_lines'][0][:70])}`")
    for n in r["ravex_notes"][:2]:
        other.append(f"`{cell(n[:120])}`")
    if r.get("same_name"):
        other.append(f"{len(r['same_name'])} output names written twice (a new run directory), the newest compared")
    if r["unit"] == "backward":
        other.append(f"rerun ran {r['backwards_rerun']} backward() of {r['total']}")
    desc = SCRIPTS[r["script"]]["counter_desc"]
    first = f"{desc} = {','.join(r['first_counter_rerun'])}" if r["first_counter_rerun"] else "-"
    store = ",".join(map(str, r["store_at_kill"] or [])) or "empty"
    resumed = r["resumed_from"] if r["resumed_from"] is not None else "none"
    print(f"| {r['script']} | {r['trial']} | {r['killed_at']} | {store} | {resumed} "
          f"| {r['rerun_ran']} / {r['rerun_expected']}{replayed(r)} | {bitwise(st)} | {eq(st, 'params')} | "
          f"{eq(st, 'buffers')} | "
          f"{eq(st, 'optimizers')} | {eq(st, 'schedulers')} | {mx} | {first} | "
          f"{'; '.join(r['files']) or '-'} | {'; '.join(other) or '-'} |")

print("\n## Per script\n")
print("| script | command (cwd: the script's folder) | total | store after the uninterrupted run "
      "| uninterrupted under Ravex vs without Ravex | Ravex messages (uninterrupted) |")
print("|---|---|---|---|---|---|")
for r in res:
    if not r.get("summary") or "cmd" not in r:  # a row of --extend-only alone
        continue
    pv = r["plain_vs_ref"]
    same = "no dump" if pv is None else ("bitwise equal" if all(v["equal"] for v in pv.values()) else
                                         "differs: " + ", ".join(k for k, v in pv.items() if not v["equal"]))
    notes = "; ".join(f"`{cell(n[:140])}`" for n in r["ref_notes"]) or "-"
    print(f"| {r['script']} | `python {r['cmd']}` | {r['total']} {r['unit']}s | "
          f"{','.join(map(str, r['ref_store'])) or 'empty'} | {same} | {notes} |")

def table_rows(header, key):
    """Print a table's header row (``header``: the columns joined by `` | ``) and its rule; the
    scripts' summary rows that hold ``key``."""
    print(f"| {header} |")
    print("|" + "---|" * len(header.split(" | ")))
    return [r for r in res if r.get("summary") and r.get(key)]


print("\n## A finished run, rerun\n")
print("Run to the end in a fresh directory, then the same command again. *ran*: optimizer steps the "
      "second run took (0: it trained no more); *printed*: its progress lines; *files*: the script's own "
      "output files (of n) whose bytes the second run changed, rewrote with the same bytes (mtime), "
      "created or removed; *new vs first*: a new file of a name the first run also wrote (a new run "
      "directory) compared with the first run's.\n")
for r in table_rows("script | ran | printed | resumed | files changed | rewritten, same bytes | new files "
                    "| new vs first | rc | Ravex messages", "finished"):
    f = r["finished"]

    def lst(xs):
        return "; ".join(cell(x) for x in xs[:3]) + (f" (+{len(xs) - 3})" if len(xs) > 3 else "") if xs else "-"
    desc = SCRIPTS[r["script"]]["counter_desc"]
    printed = (f"{f['counter_lines']}, from {desc} = {','.join(f['first_counter'])}"
               if f["first_counter"] else "0")
    notes = "; ".join(f"`{cell(n[:100])}`" for n in f["ravex_notes"][:2]) or "-"
    print(f"| {r['script']} | {f['rerun_ran']} of {f['first_steps']} | {printed} | {f['resumed'] or 'none'} | "
          f"{lst(f['changed'])} (of {f['n_files']}) | {lst(f['rewritten'])} | {lst(f['new'])} | "
          f"{lst(f.get('new_vs_first', []))} | {f['rerun_rc']} "
          f"| {notes} |")

print("\n## A finished run, extended\n")
print("A run to the end in a fresh directory with bound B1, rerun there with the bound raised to B2, beside a "
      "straight run with B2 from scratch. *ran*: optimizer steps the extending rerun took, of the steps B2 "
      "adds (declared in `scripts.py`; the straight run minus the first run, measured, in brackets when it "
      "differs); *bitwise*: its final state equals the straight run's; *files differing*: the script's own "
      "output files that differ from the straight run's (the first three); *rc*: the first run's, the "
      "rerun's, the straight run's; *Ravex messages*: the rerun's other than the resume line (the witness's "
      "verdict among them).\n")
for r in table_rows("script | bound | ran / added | resumed | bitwise | params | buffers | optim | sched "
                    "| max params (buffers) | first printed | files differing | rc | Ravex messages", "extend"):
    e = r["extend"]
    st = e["state"]
    mx = "n/a" if st is None else f"{fmt_max(st['params']['max'])} ({fmt_max(st['buffers']['max'])})"
    added = str(e["steps_declared"])
    if e["steps_added"] != e["steps_declared"]:
        added += f" ({e['steps_added']} measured)"
    ran = e["rerun_ran"]
    if ran is not None and ran != e["steps_declared"]:
        ran = f"**{ran}**"
    desc = SCRIPTS[r["script"]]["counter_desc"]
    first = f"{desc} = {','.join(e['first_counter'])}" if e["first_counter"] else "-"
    notes = "; ".join(f"`{cell(n[:220])}`" for n in e["ravex_notes"][:3]) or "-"  # the resume line: *resumed*
    files = "; ".join(cell(f) for f in e["files"][:3]) + (f" (+{len(e['files']) - 3})" if len(e["files"]) > 3 else "")
    print(f"| {r['script']} | {cell(e['bound'])} | {ran} / {added} | {e['resumed'] or 'none'} | {bitwise(st)} "
          f"| {eq(st, 'params')} | {eq(st, 'buffers')} | {eq(st, 'optimizers')} | {eq(st, 'schedulers')} | {mx} "
          f"| {first} | {files or '-'} "
          f"| {e['first_rc']}, {e['rerun_rc']}, {e['straight_rc']} | {notes} |")

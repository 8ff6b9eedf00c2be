"""The performance budget (the targets in benchmarks/RESULTS.md) against a run's figures: tables and a PNG plot."""

from __future__ import annotations

from typing import Any

from .report import Table, _f, _mib

#: (key, goal text, getter, op, threshold): op ">=" means the measured ratio must reach the threshold
GOALS: list[tuple[str, str, Any, str, float]] = [
    ("(a) stall / bare copy into reused buffers", "<= 1.3x",
     lambda r: r["a_stall"]["ratios"]["stall_over_bare_copy"], "<=", 1.3),
    ("(a) torch.save blocking / Ravex stall", ">= 20x",
     lambda r: r["a_stall"]["ratios"]["torch_save_blocking_over_stall"], ">=", 20.0),
    ("(a) DCP async_save blocking / Ravex stall", ">= 1x (not slower)",
     lambda r: r["a_stall"]["ratios"]["dcp_async_blocking_over_stall"], ">=", 1.0),
    ("(a) background write / disk bandwidth (the best of 4 ways: median of same-round ratios)", ">= 0.9x",
     lambda r: r["a_stall"]["ratios"]["background_write_fraction_of_disk"], ">=", 0.9),
    ("(b) bytes written / bytes changed", "<= 1.05x",
     lambda r: r["b_frozen"]["ratios"]["written_over_changed"], "<=", 1.05),
    ("(b) stall / bare copy of the changed state", "<= 1.3x",
     lambda r: r["b_frozen"]["ratios"]["stall_over_bare_copy_of_changed"], "<=", 1.3),
    ("(c) full checkpoint / bytes written (runtime default chunking, manifest counted)", ">= 6x",
     lambda r: r["c_sparse"]["ratios"]["full_over_written"], ">=", 6.0),
    ("(c) the same, refs.json counted too", ">= 6x",
     lambda r: r["c_sparse"]["ratios"].get("full_over_written_with_refs"), ">=", 6.0),
    ("(i) sparse table (c), CPU per checkpoint: JSON chunk maps / chunk tables", ">= 4x",
     lambda r: r["i_sparse_cpu"]["ratios"]["map_over_table_cpu"], ">=", 4.0),
    ("(i) the same, manifest bytes: JSON chunk maps / chunk tables", ">= 2x",
     lambda r: r["i_sparse_cpu"]["ratios"]["map_over_table_manifest_bytes"], ">=", 2.0),
    ("(d) Ravex store du / (1st full + 1.05 x changed per later ckpt)", "<= 1x",
     lambda r: _d_over_goal(r), "<=", 1.0),
    ("(e) ravex.load / torch.load", "<= 0.8x",
     lambda r: r["e_load"]["ratios"]["ravex_load_over_torch_load"], "<=", 0.8),
    ("(e) resume, `ravex enable` (objects seen as built) / torch.load+load_state_dict", "<= 0.8x",
     lambda r: r["e_load"]["ratios"].get("ravex_resume_registered_over_torch_resume"), "<=", 0.8),
    ("(e) resume, activate() after building (heap scan) / torch.load+load_state_dict", "<= 0.8x",
     lambda r: r["e_load"]["ratios"]["ravex_resume_over_torch_resume"], "<=", 0.8),
    ("(f) per-step patch overhead, A/B of training steps (95% interval)", "< 1%",
     lambda r: r["f_patch_overhead"]["overhead_fraction"], "<", 0.01),
    ("(f) patches alone (empty loop) / training step", "< 1%",
     lambda r: r["f_patch_overhead"]["overhead_fraction_isolated"], "<", 0.01),
    ("(h) training time lost per full checkpoint, busy loop: Ravex / DCP async_save", "<= 0.3x",
     lambda r: r["h_goodput"]["modes"]["full"]["ratios"]["ravex_over_dcp_async"], "<=", 0.3),
    ("(h) the user's loop, Ravex's own cadence: lost per checkpoint, Ravex / DCP async_save", "<= 0.3x",
     lambda r: r["h_goodput"]["modes"]["loop"]["ratios"]["ravex_over_dcp_async"], "<=", 0.3),
    ("(h) the user's loop, in the process: Ravex / copy + O_DIRECT write (the floor of writing the bytes)",
     "<= 1.2x", lambda r: r["h_goodput"]["modes"]["loop"]["ratios"]["in_process_ravex_over_copy_write"], "<=", 1.2),
]


def _loop_table(c: dict[str, Any], m: dict[str, Any]) -> tuple[str, list[str], list[list[str]]]:
    """(h) as the user's loop sees it: whole runs against the unchecked loop, per round."""
    lost = m["lost_per_checkpoint_s"]
    inside = m.get("in_process_lost_per_checkpoint_s", {})
    floor = inside.get("copy + O_DIRECT write")
    return (f"(h) the user's loop (Ravex's own cadence, a checkpoint every {c['every']} steps, keep_last 2): "
            f"whole run less the unchecked run, per checkpoint, median of {c['reps']} rounds; in the process: "
            f"its iterations over its own plain ones, and the wait at the end (iteration "
            f"{_f(m['iteration_s'])} s; Ravex's stall first {_f(m.get('ravex_first_stall_s'))} s, later "
            f"{_f(m.get('ravex_later_stall_s'))} s)",
            ["contender", "lost s / checkpoint", "per round", "in the process", "per round",
             "checkpoint iteration +s", "next iteration +s", "/ copy + write, in the process"],
            [[n, _f(v), " ".join(_f(x) for x in m["lost_per_round_s"][n]), _f(inside.get(n)),
              " ".join(_f(x) for x in m.get("in_process_lost_per_round_s", {}).get(n, [])),
              _f(m["checkpoint_iteration_over_s"][n]), _f(m["next_iteration_over_s"][n]),
              _f(inside[n] / floor, ".2f") + "x" if floor and floor > 0 and n in inside else "-"]
             for n, v in lost.items()])


def _d_over_goal(r: dict[str, Any]) -> float:
    """(d)'s store against what the delta goal allows: the first (full) checkpoint, then
    1.05x the changed bytes for each later one."""
    b, d = r["b_frozen"], r["d_ten_checkpoints"]
    first = b["checkpoints"][0]["new_bytes"] + b["checkpoints"][0]["manifest_bytes"]
    allowed = first + (d["checkpoints"] - 1) * 1.05 * b["state"]["changed_expected_bytes"]
    return round(d["ravex_store_du"] / allowed, 3)


def budget(res: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for name, goal, get, op, thr in GOALS:
        try:
            v = get(res)
        except (KeyError, TypeError):
            continue
        ci = _interval(name, res)
        if v is None:
            met = None
        elif ci is not None and ci[0] < thr <= ci[1]:
            met = None  # the interval straddles the goal: this run cannot tell
        elif op == ">=":
            met = v >= thr
        elif op == "<=":
            met = v <= thr
        else:
            met = v < thr
        rows.append({"goal": name, "target": goal, "measured": v, "op": op, "threshold": thr, "met": met,
                     "interval": ci})
    return rows


def _interval(goal: str, res: dict[str, Any]) -> tuple[float, float] | None:
    """The 95% interval a goal's figure comes with, where the suite computes one."""
    if goal.startswith("(f) per-step patch overhead, A/B"):
        ci = res.get("f_patch_overhead", {}).get("overhead_fraction_ci95")
        return (ci[0], ci[1]) if ci and None not in ci else None
    if goal.startswith("(a) background write / disk bandwidth"):
        ci = res.get("a_stall", {}).get("ratios", {}).get("background_write_fraction_of_disk_ci95")
        return (ci[0], ci[1]) if ci and None not in ci else None
    return None


def _fmt(row: dict[str, Any]) -> str:
    v = row["measured"]
    if v is None:
        return "-"
    ci = row.get("interval")
    if not row["goal"].startswith("(f)"):
        return f"{v:.3g}x ({ci[0]:.3g}..{ci[1]:.3g})" if ci else f"{v:.3g}x"
    return f"{v:+.2%} ({ci[0]:+.1%}..{ci[1]:+.1%})" if ci else f"{v:+.2%}"


def tables(res: dict[str, Any]) -> list[Table]:
    out: list[Table] = []
    rows = budget(res)
    if rows:
        out.append(("Performance budget (ratios from one run)", ["goal", "target", "measured", "met"],
                    [[r["goal"], r["target"], _fmt(r), {True: "yes", False: "NO", None: "noise"}[r["met"]]]
                     for r in rows]))
    a = res.get("a_stall")
    if a:
        copy = a["blocking"]["bare copy into reused buffers"]["median_s"]
        trs = []
        for n, d in a["blocking"].items():
            du = a["durable"][n]
            trs.append([n, _f(d["median_s"]), _f(d["median_s"] / copy, ".2f") + "x", _f(du["median_s"]),
                        _f(du.get("gib_s"))])
        first = a["first_checkpoint"]
        out.append((
            f"(a) {a['state']['tensor_gib']:.2f} GiB dense + AdamW: blocking time vs time to durable "
            f"(steady state, median of {len(a['blocking']['torch.save']['times_s'])}; first ravex checkpoint "
            f"stalls {_f(first['ravex.checkpoint']['stall_s'])} s, first DCP async_save blocks "
            f"{_f(first['dcp.async_save']['blocking_s'])} s)",
            ["contender", "blocks s", "blocks / bare copy", "durable s", "durable GiB/s"], trs))
        rounds = a.get("background_write_rounds")
        if rounds:
            gib = a["state"]["tensor_bytes"] / (1 << 30)
            out.append((
                "(a) background write against the disk, round by round (a training step, then Ravex and the "
                "disk's ways of writing the same bytes back to back, fsync'd, os.sync() before each; the disk's "
                "fastest way in that round; the median of these is "
                f"{a['ratios'].get('background_write_fraction_of_disk_round_best')}x, stricter than the goal row)",
                ["round", "ravex background s", "disk fastest s", "fastest way", "disk GiB/s", "fraction"],
                [[str(i + 1), _f(r["ravex_background_s"]), _f(r["disk_s"]), r["disk_reference"],
                  _f(gib / r["disk_s"]) if r["disk_s"] else "-", _f(r["fraction"], ".3f") + "x"]
                 for i, r in enumerate(rounds)]))
            ways = a["ratios"].get("background_write_fraction_of_disk_by_reference") or {}
            out.append(("(a) background write / disk, each way of writing the same bytes: median over the rounds "
                        "of (the way's time / Ravex's, same round); the goal row is the best way",
                        ["way", "median ratio", "median s", "GiB/s"],
                        [[n, _f(v, ".3f") + "x", _f(a["bandwidth_rounds_s"][n]["median_s"]),
                          _f(a["bandwidth_rounds_s"][n].get("gib_s"))] for n, v in ways.items()]))
    h = res.get("h_goodput")
    if h:
        c = h["config"]
        for mode, m in h["modes"].items():
            if mode == "loop":
                out.append(_loop_table(c, m))
                continue
            lost = m["lost_per_checkpoint_s"]
            copy = lost.get("bare copy")
            out.append((
                f"(h) {mode} model, {m['state_bytes'] / (1 << 30):.3f} GiB state ({m['changed_bytes'] / (1 << 30):.3f} "
                f"GiB changing): training time lost per checkpoint, busy loop{_threads(c)} "
                f"({c['every']} quiet iterations vs "
                f"checkpoint + {c['every']} iterations + flush, median of {c['checkpoints']} pairs, median of "
                f"{c['reps']} processes; load {h['loadavg_start'][0]:.1f} at start)",
                ["contender", "iteration s", "blocks s", "lost s / checkpoint", "/ ravex", "/ bare copy",
                 "CPU s / checkpoint"],
                [[n, _f(m["iteration_s"][n]), _f(m["blocks_s"][n]), _f(v),
                  _f(v / lost["ravex"], ".2f") + "x" if lost.get("ravex") else "-",
                  _f(v / copy, ".2f") + "x" if copy and copy > 0 else "-",
                  _f(m["cpu_per_checkpoint_s"][n])] for n, v in lost.items()]))
            if "first_stall_s" in m:  # issue 26: where the lost time goes, first checkpoint, host memory
                out.append((
                    f"(h) {mode} model: the lost time in parts (stall + iterations slowed + write left at the end), "
                    "the first checkpoint's stall against the later ones', and the peak RSS added",
                    ["contender", "stall s", "slowed s", "flush s", "first stall s", "later stall s", "first / later",
                     "RSS added GiB", "/ state"],
                    [[n, _f(m["blocks_s"][n]), _f(m["slowed_per_checkpoint_s"][n]), _f(m["flush_per_checkpoint_s"][n]),
                      _f(m["first_stall_s"][n]), _f(m["later_stall_s"][n]),
                      _f(m["first_over_later_stall"][n], ".2f") + "x" if m["first_over_later_stall"][n] else "-",
                      _f(m["rss_added_bytes"][n] / (1 << 30)), _f(m["rss_added_over_state"][n], ".2f") + "x"]
                     for n in lost]))
            for n, ph in (m.get("phase_median_s") or {}).items():
                out.append((f"(h) {mode} model, {n}: its own timers per checkpoint, median (hash, encode, write: "
                            "seconds summed over the writer's threads)", list(ph), [[_f(v) for v in ph.values()]]))
    e = res.get("e_load")
    if e:
        out.append((f"(e) load and resume, {e['bytes'] / (1 << 30):.2f} GiB, warm page cache",
                    ["loader", "median s", "GiB/s", "/ torch.load"],
                    [[n, _f(d["median_s"]), _f(d.get("gib_s")), _f(d["over_torch_load"], ".2f") + "x"]
                     for n, d in e["loads"].items()]))
    f = res.get("f_patch_overhead")
    if f:
        out.append((f"(f) per-step patch overhead: {f['pairs']} interleaved off/on pairs of {f['steps_per_block']} "
                    "steps, thread CPU time, median",
                    ["loop", "step off ms", "step on ms", "overhead", "us/step"],
                    [[f["model"], _f(f["step_s_off"]["median"] * 1e3), _f(f["step_s_on"]["median"] * 1e3),
                      f"{f['overhead_fraction']:+.2%}", _f(f["overhead_us_per_step"], ".1f")],
                     *([["patches alone: next() + optimizer.step() on one scalar", _f(f["empty_step_us_off"] / 1e3),
                         _f(f["empty_step_us_on"] / 1e3), f"{f['overhead_fraction_isolated']:+.2%} of a step",
                         _f(f["patch_us_per_step_isolated"], ".1f")]] if "empty_step_us_off" in f else [])]))
    b, d = res.get("b_frozen"), res.get("d_ten_checkpoints")
    if b:
        ck = b["checkpoints"]
        rows2 = [[str(i + 1), _mib(c["changed_tensor_bytes"]), _mib(c["new_bytes"] + c["manifest_bytes"]),
                  _f(c["stall_s"]), _f(c["background_s"]), _mib(c["store_du_after"])] for i, c in enumerate(ck)]
        out.append((
            f"(b)/(d) 90% frozen, {_mib(b['state']['tensor_bytes'])} MiB state, one optimizer step between "
            f"checkpoints (bare copy of the changed {_mib(b['state']['changed_expected_bytes'])} MiB: "
            f"{_f(b['bare_copy_of_changed_s']['median_s'])} s; torch.save {_f(b['torch_save_s']['median_s'])} s)",
            ["ckpt", "changed MiB", "written MiB", "stall s", "background s", "store du MiB"], rows2))
    if d:
        out.append(("(d) ten checkpoints on storage", ["what", "du MiB"], [
            ["Ravex store", _mib(d["ravex_store_du"])],
            ["ten torch.save files", _mib(d["torch_save_files_du"])],
            ["ratio", _f(d["ratios"]["torch_save_over_ravex_du"], ".2f") + "x"]]))
    c = res.get("c_sparse")
    if c:
        t = c["table"]
        sw = c["chunk_sweep"]
        ck = c["checkpoints"][0]

        def x(v: Any) -> str:
            return "-" if v is None else _f(v, ".2f") + "x"

        rows3 = [["runtime (activate()), default chunking", _mib(t["state_bytes"]),
                  _mib(ck["new_bytes"] + ck["manifest_bytes"]), _mib(ck.get("refs_bytes")),
                  x(c["ratios"]["full_over_written"]), x(c["ratios"].get("full_over_written_with_refs")),
                  _f(ck["durable_s"])]]
        rows3 += [[f"writer, {r['chunk_bytes'] >> 10} KiB chunks ({sw['rows']} rows)", _mib(r["full_bytes"]),
                   _mib(r["written_bytes"]), _mib(r.get("refs_bytes")), x(r["full_over_written"]),
                   x(r.get("full_over_written_with_refs")), _f(r["commit_s"])]
                  for r in sw["results"]]
        out.append((
            f"(c) sparse embedding {t['rows']} x {t['dim']} + SparseAdam, {t['rows_changed_per_interval']} rows "
            f"(Zipf s={t['zipf_s']}) per interval; largest chunk meeting 6x: "
            f"{'-' if sw['largest_chunk_meeting_6x'] is None else str(sw['largest_chunk_meeting_6x'] >> 10) + ' KiB'}",
            ["writer", "full MiB", "written MiB (objects + manifest)", "refs.json MiB", "full / written",
             "with refs.json", "commit s"], rows3))
    i = res.get("i_sparse_cpu")
    if i:
        t = i["table"]
        out.append((
            f"(i) sparse table {t['rows']} x {t['dim']} + SparseAdam ({_mib(t['state_bytes'])} MiB, {t['chunks']} "
            f"chunks of 2 KiB), {t['rows_changed_per_interval']} rows per interval: CPU per checkpoint",
            ["form", "CPU s (median)", "checkpoint -> durable s", "manifest MiB", "new MiB"],
            [[form, _f(f["median_cpu_s"]), _f(f["median_durable_s"]), _mib(f["median_manifest_bytes"]),
              _mib(f["median_new_bytes"])] for form, f in i["forms"].items()]
            + [["map / table", _f(i["ratios"]["map_over_table_cpu"], ".1f") + "x",
                _f(i["ratios"]["map_over_table_durable"], ".1f") + "x",
                _f(i["ratios"]["map_over_table_manifest_bytes"], ".1f") + "x", ""]]))
    g = res.get("g_bf16")
    if g:
        out.append((f"(g) bf16 state {_mib(g['state_bytes'])} MiB: durable write, bytes stored",
                    ["writer", "median s", "GiB/s", "stored MiB", "ratio"],
                    [[n, _f(w["median_s"]), _f(w.get("gib_s")), _mib(w["bytes_apparent"]),
                      _f(w["compression_ratio"])] for n, w in g["writes"].items()]))
    return out


def plot(res: dict[str, Any], path: str) -> None:
    """Two panels: every budget goal as (measured vs target, >1 = met, log scale); (a)'s blocking
    time of each contender as a multiple of a bare copy into reused buffers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in budget(res) if r["measured"] is not None]
    fig, axes = plt.subplots(1, 2, figsize=(13, 6.5), gridspec_kw={"width_ratios": [1.3, 1]})
    ax = axes[0]
    names, vals, cols = [], [], []
    for r in rows:
        v, thr = r["measured"], r["threshold"]
        if r["goal"].startswith("(f)"):  # a fraction; margin = goal / measured on 1 + x
            margin = (1 + thr) / (1 + max(v, -0.99))
        elif r["op"] == ">=":
            margin = v / thr
        else:
            margin = thr / v if v > 0 else 100.0
        names.append(f"{r['goal']}\ngoal {r['target']}, measured {_fmt(r)}")
        vals.append(margin)
        cols.append({True: "#3a923a", False: "#c0392b", None: "#999999"}[r["met"]])
    ax.barh(range(len(vals)), vals, color=cols)
    ax.set_xscale("log")
    ax.axvline(1.0, color="k", lw=1)
    ax.set_yticks(range(len(vals)), names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("measured vs goal (>1: met, green; grey: within the run's noise)")
    ax.set_title("Performance budget", fontsize=10)
    a = res.get("a_stall")
    ax = axes[1]
    if a:
        copy = a["blocking"]["bare copy into reused buffers"]["median_s"]
        items = [(n, d["median_s"] / copy, a["durable"][n]["median_s"] / copy) for n, d in a["blocking"].items()
                 if not n.startswith("disk")]
        ys = range(len(items))
        ax.barh([y + 0.2 for y in ys], [i[1] for i in items], height=0.4, color="#2c6fbb", label="blocks training")
        ax.barh([y - 0.2 for y in ys], [i[2] for i in items], height=0.4, color="#bbbbbb", label="until durable")
        ax.set_yticks(list(ys), [i[0] for i in items], fontsize=8)
        ax.set_xscale("log")
        ax.axvline(1.3, color="#3a923a", ls="--", lw=1, label="1.3x bare copy")
        ax.legend(fontsize=7, loc="lower right")
        ax.set_xlabel("x bare copy into reused buffers (log)")
        ax.set_title(f"(a) {a['state']['tensor_gib']:.2f} GiB dense + AdamW: stall", fontsize=10)
    fig.suptitle(f"Ravex benchmarks{' (--quick: tiny states, figures meaningless)' if res.get('quick') else ''}"
                 f" - {res.get('started_utc', '')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _threads(config: dict[str, Any]) -> str:
    """The goodput loop's torch threads where a run set them (``--threads``)."""
    return f", torch threads {config['threads']}" if config.get("threads") else ""

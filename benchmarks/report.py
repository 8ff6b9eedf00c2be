"""Turn a results document into tables: rich in a terminal, plain text, or Markdown."""

from __future__ import annotations

import sys
from typing import Any

from .util import GIB, MIB

Table = tuple[str, list[str], list[list[str]]]


def _f(x: Any, fmt: str = ".3f") -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and x != x:
        return "-"
    return format(x, fmt)


def _range(d: dict[str, Any]) -> str:
    t = d.get("times_s") or []
    return f"{min(t):.2f}-{max(t):.2f}" if t else "-"


def _mib(n: Any) -> str:
    return "-" if n is None else f"{n / MIB:,.1f}"


def tables(res: dict[str, Any]) -> list[Table]:
    out: list[Table] = []
    st = res.get("state", {})
    if "write" in res:
        rows = []
        for name, d in res["write"].items():
            rows.append([
                name,
                _f(d["median_s"]),
                _range(d),
                _f(d.get("gib_s")),
                _f(d.get("speedup_vs_torch_save"), ".2f") + "x",
                _f(d.get("fraction_of_disk_one_file"), ".2f"),
                _mib(d.get("bytes_apparent")),
            ])
        out.append((
            f"Durable full-checkpoint write, {st.get('tensor_gib', 0):.2f} GiB state, median of {len(d['times_s'])}",
            ["writer", "median s", "range s", "GiB/s", "speed vs torch.save", "x disk (1 file)", "stored MiB"],
            rows,
        ))
    phases = [(n, d["ravex"]) for n, d in res.get("write", {}).items() if d.get("ravex")]
    if phases:
        rows = []
        for name, r in phases:
            sec = r.get("seconds", {})
            rows.append([
                name, _f(sec.get("total")), _f(sec.get("hash")), _f(sec.get("encode")), _f(sec.get("write")),
                _f(sec.get("manifest")), f"{r.get('new_chunks', '-')}", _mib(r.get("new_bytes")),
            ])
        out.append((
            "Ravex commit phases, first repetition (hash/encode/write: thread-seconds summed over the pool)",
            ["writer", "wall s", "hash", "encode", "write+fsync", "sync+manifest", "new chunks", "new MiB"],
            rows,
        ))
    if "read" in res:
        rows = []
        has_cold = any("cold" in d for d in res["read"].values())
        for name, d in res["read"].items():
            row = [name]
            for which in ("cold", "warm") if has_cold else ("warm",):
                x = d.get(which, {})
                row += [_f(x.get("median_s")), _range(x), _f(x.get("gib_s")),
                        _f(x.get("speedup_vs_torch_load"), ".2f") + "x"]
            rows.append(row)
        head = ["loader"]
        for which in ("cold", "warm") if has_cold else ("warm",):
            head += [f"{which} s", "range", f"{which} GiB/s", f"{which} vs torch.load"]
        title = (
            "Load: page cache dropped before each cold load; warm = the same load again"
            if has_cold else "Load (warm page cache only: the page cache was not dropped)"
        )
        out.append((title, head, rows))
    if "limits" in res:
        lim = res["limits"]
        cpu = lim["cpu_one_core"]
        rows = [
            ["copy into reused buffers", _f(lim["copy_into_reused_buffers"]["gib_s"]) + " GiB/s"],
            ["copy into fresh allocations", _f(lim["copy_into_fresh_allocations"]["gib_s"]) + " GiB/s"],
            ["xxh3-128, 1 core", _f(cpu["xxh3_128_gb_s"]) + " GB/s"],
            ["zstd-1 encode, 1 core", f"{_f(cpu['zstd1_gb_s'])} GB/s, ratio {_f(cpu['zstd1_ratio'])}"],
            ["blosc lz4+bitshuffle encode", f"{_f(cpu['blosc_lz4_bitshuffle_gb_s'])} GB/s, "
             f"ratio {_f(cpu['blosc_lz4_bitshuffle_ratio'])}"],
        ]
        w = res.get("write", {})
        for key in ("disk: one file + fsync", "disk: 4 MiB objects x4 threads, each fsync'd",
                    "disk: 4 MiB objects x4 threads, fsyncs at end"):
            if key in w:
                rows.append([key, _f(w[key]["gib_s"]) + " GiB/s"])
        r = res.get("read", {}).get("disk: read one file")
        if r:
            both = f"{_f(r.get('cold', {}).get('gib_s'))} / {_f(r['warm']['gib_s'])}"
            rows.append(["disk: read one file (cold / warm GiB/s)", both])
        out.append(("Physical limits, same run", ["limit", "figure"], rows))
    if "delta" in res:
        d = res["delta"]
        rows = []
        u = d.get("unchanged")
        if u:
            rows.append([
                "(a) unchanged state, 2nd commit", _mib(u["state_bytes"]), "0.0", _mib(u["second_commit_new_bytes"]),
                _mib(u["disk_bytes_added_by_second"]), "-", "-", _f(u["second_commit_s"]),
            ])
        fz = d.get("frozen_90")
        if fz:
            rows.append([
                "(b) 90% frozen + AdamW, 2nd commit",
                _mib(fz["full_checkpoint_tensor_bytes"]),
                _mib(fz["changed_chunk_bytes"]),
                _mib(fz["second_commit_new_bytes"]),
                _mib(fz["disk_bytes_added_by_second"]),
                _f(fz["new_over_changed_chunks"]),
                _f(fz["new_over_full_state"]) + f" (expect {_f(fz['expected_fraction_of_full'])})",
                _f(fz["second_commit_s"]),
            ])
            rows.append(["    torch.save of the same state", _mib(fz["full_checkpoint_tensor_bytes"]), "-",
                         _mib(fz["torch_save_bytes"]), "-", "-", "1.000", _f(fz["torch_save_s"])])
        out.append((
            "Delta: bytes written by a second checkpoint (compression none)",
            ["case", "state MiB", "changed MiB", "new MiB", "du +MiB", "new/changed", "new/full", "s"],
            rows,
        ))
    if "sweep" in res:
        sw = res["sweep"]
        rows = []
        for r in sw["rows"]:
            rows.append([r["compression"], str(r["chunk_mib"]), str(r["threads"]), _f(r["median_s"]), _range(r),
                         _f(r["gib_s"])])
        best = ", ".join(f"{k}: {v['chunk_mib']} MiB x {v['threads']} threads" for k, v in sw["best"].items())
        out.append((
            f"Ravex writer sweep on {sw['state_bytes'] / GIB:.2f} GiB (best: {best})",
            ["compression", "chunk MiB", "threads", "median s", "range s", "GiB/s"],
            rows,
        ))
    return out


def render_plain(tabs: list[Table]) -> str:
    lines = []
    for title, head, rows in tabs:
        widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=True)]
        lines.append("")
        lines.append(title)
        lines.append("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
        lines.append("  ".join("-" * w for w in widths))
        for r in rows:
            lines.append("  ".join(str(x).ljust(w) for x, w in zip(r, widths, strict=True)))
    return "\n".join(lines)


def render_markdown(tabs: list[Table]) -> str:
    lines = []
    for title, head, rows in tabs:
        lines += ["", f"**{title}**", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def show(res: dict[str, Any], plain: bool = False) -> None:
    show_tables(tables(res), plain=plain)


def show_tables(tabs: list[Table], plain: bool = False) -> None:
    if not plain and sys.stdout.isatty():
        try:
            from rich.console import Console
            from rich.table import Table as RichTable

            console = Console()
            for title, head, rows in tabs:
                t = RichTable(title=title, title_justify="left")
                for i, h in enumerate(head):
                    t.add_column(h, justify="left" if i == 0 else "right")
                for r in rows:
                    t.add_row(*r)
                console.print(t)
            return
        except ImportError:
            pass
    print(render_plain(tabs))

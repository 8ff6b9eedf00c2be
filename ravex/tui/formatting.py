"""Pure formatting shared by the CLI verbs and the TUI: text in, text out, no Textual import.

Tests call these directly; widgets and rich tables only arrange what they return.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ravex.format.objects.names import unescape_key

if TYPE_CHECKING:
    from ravex.format.history.runs import RunRecord

SPARK = "▁▂▃▄▅▆▇█"
BAR_EIGHTHS = " ▏▎▍▌▋▊▉█"


def one_line(exc: BaseException) -> str:
    """An exception as one line of text (its message's whitespace collapsed), for a status line."""
    return " ".join(str(exc).split()) or type(exc).__name__


def display_path(path: str) -> str:
    """An array path as the user's keys: each segment unescaped (``layer%2F0`` -> ``layer/0``)."""
    return "/".join(unescape_key(seg) for seg in path.split("/"))


def human_bytes(n: float | None) -> str:
    """``1536`` -> ``1.5 KiB``; ``None`` -> ``-``."""
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def short_bytes(n: float | None) -> str:
    """At most five characters: ``0``, ``980``, ``42.3K``, ``1.1M``, ``12G``."""
    if n is None:
        return "-"
    n = float(n)
    for unit in ("", "K", "M", "G", "T", "P"):
        if abs(n) < 1000 or unit == "P":
            if not unit:
                return str(int(n))
            return f"{n:.1f}{unit}" if abs(n) < 99.95 else f"{n:.0f}{unit}"
        n /= 1024
    raise AssertionError("unreachable")


def percent(x: float | None) -> str:
    """``0.953`` -> ``95%``; ``None`` -> ``-``."""
    return "-" if x is None else f"{x * 100:.0f}%"


def number(x: float | None, digits: int = 4) -> str:
    """A float for a table cell: compact, with ``-`` for missing, ``nan``/``inf`` spelled out."""
    if x is None:
        return "-"
    if isinstance(x, int):
        return str(x)
    if math.isnan(x) or math.isinf(x):
        return str(x)
    if x == 0:
        return "0"
    if 1e-3 <= abs(x) < 1e5:
        return f"{x:.{digits}g}"
    return f"{x:.{max(1, digits - 2)}e}"


def shape_text(shape: Sequence[int] | None) -> str:
    """``(4, 8)`` -> ``4×8``; a scalar -> ``scalar``."""
    if shape is None:
        return "-"
    return "×".join(str(s) for s in shape) if len(shape) else "scalar"


def bar(value: float, maximum: float, width: int) -> str:
    """A horizontal bar of ``width`` cells, ``value / maximum`` of it filled, in eighths."""
    if width <= 0:
        return ""
    if maximum <= 0 or value <= 0:
        return " " * width
    eighths = round(min(1.0, value / maximum) * width * 8)
    eighths = max(eighths, 1)
    full, part = divmod(eighths, 8)
    text = "█" * full + (BAR_EIGHTHS[part] if part else "")
    return text.ljust(width)


def sparkline(values: Sequence[float], width: int | None = None) -> str:
    """One character per value (or per group of values when ``width`` is smaller), scaled to the max."""
    vals = [max(0.0, float(v)) for v in values]
    if not vals:
        return ""
    if width and len(vals) > width:
        per = len(vals) / width
        vals = [max(vals[int(i * per) : max(int(i * per) + 1, int((i + 1) * per))]) for i in range(width)]
    top = max(vals)
    if top <= 0:
        return SPARK[0] * len(vals)
    return "".join(SPARK[min(len(SPARK) - 1, int(v / top * (len(SPARK) - 1) + 0.5))] for v in vals)


def histogram_lines(counts: Sequence[int], edges: Sequence[float], width: int = 30) -> list[str]:
    """A vertical list of bins, one line each: ``[lo, hi)  ████▌ count``."""
    if not counts:
        return ["(no finite values)"]
    top = max(counts) or 1
    labels = [f"{number(edges[i], 3):>9} .. {number(edges[i + 1], 3):<9}" for i in range(len(counts))]
    return [f"{label} {bar(c, top, width)} {c}" for label, c in zip(labels, counts, strict=True)]


def chunk_map(statuses: Sequence[str], width: int = 64) -> str:
    """One cell per chunk: ``█`` changed or new, ``░`` shared with the previous step.

    When there are more chunks than ``width`` cells, each cell covers a group and shows
    ``▓`` where the group is mixed.
    """
    if not statuses:
        return ""
    if len(statuses) <= width:
        return "".join("░" if s == "shared" else "█" for s in statuses)
    per = len(statuses) / width
    out = []
    for i in range(width):
        group = statuses[int(i * per) : max(int(i * per) + 1, int((i + 1) * per))]
        shared = sum(1 for s in group if s == "shared")
        out.append("░" if shared == len(group) else "█" if shared == 0 else "▓")
    return "".join(out)


def change_style(rel: float | None, status: str = "changed") -> str:
    """A rich style for a relative change: red when large, yellow when notable, green when small."""
    if status in ("added", "removed", "reshaped"):
        return "bold magenta"
    if rel is None:
        return "cyan"
    if math.isnan(rel) or rel >= 0.1:
        return "bold red"
    if rel >= 1e-3:
        return "yellow"
    if rel > 0:
        return "green"
    return "dim"


def step_label(step: int) -> str:
    return f"step_{step}"


def short_time(iso: str) -> str:
    """``2026-12-02T18:33:20.650+00:00`` -> ``2026-12-02 18:33:20``."""
    return iso[:19].replace("T", " ") if iso else "-"


def run_lines(record: RunRecord) -> list[str]:
    """A run record (spec §20) as ``key: value`` lines: the command, script, git, host and
    versions, then only the configuration values that did not come from the defaults."""
    chosen = [f"{k}={_plain(v)} ({src})" for k, (v, src) in record.config.items() if src != "default"]
    return [
        f"command: {shlex.join(record.argv)}",
        f"script: {record.script or '-'}  (cwd {record.cwd})",
        f"git: {record.git.describe()}",
        f"host: {record.hostname}, world size {record.world_size}, started {record.created_at}",
        "versions: " + ", ".join(f"{k} {v}" for k, v in record.versions.items()),
        "config: " + ("; ".join(chosen) if chosen else "all defaults"),
        *([f"resume: {record.resume.describe()}"] if record.resume is not None else []),
    ]


def loss_sparkline(losses: Sequence[float], width: int | None = None) -> str:
    """The losses of successive steps as a sparkline from their lowest (▁) to their highest (█),
    so that a spike late in training stands out; values that are not finite are left out."""
    finite = [v for v in losses if math.isfinite(v)]
    low = min(finite, default=0.0)
    return sparkline([v - low for v in finite], width=width)


def _plain(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


"""(m) The stall's two parts: Ravex's stage copy alone, and the same copy hashing each chunk as it
lands (what content addressing adds to the stall), through the stage's own copier.

Benchmark (h) compares the loop's loss with a floor that copies and writes the bytes but names
nothing. Ravex names every chunk by its XXH3-128 digest, and hashes it in the stall while it is
in the cache (``ravex.saving.copier``). This suite measures that part alone, on the threads the
stage uses, so that the floor ratio of (h) can be read against it: the hash's seconds per
checkpoint are a part of Ravex's loss that no write path can win back. Each repetition runs
every variant once, in turn; the figures are medians.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

#: chunk length the stage hashes in (the writer's default chunk for a large tensor)
CHUNK_BYTES = 16 << 20


def run(mib: int, reps: int, blocks_kib: tuple[int, ...] = (1024, 256)) -> dict[str, Any]:
    """Seconds to copy ``mib`` MiB of fresh source into faulted-in staging memory: alone, and
    hashing in blocks of each of ``blocks_kib`` (the first is the shipped one)."""
    from ravex.saving import copier
    from ravex.saving.staging.buffers import _aligned_block

    nbytes = mib << 20
    src = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    dst = _aligned_block(nbytes).numpy()
    copier.touch(dst)
    stage = copier.Copier()
    shipped = copier.HASH_BLOCK_BYTES
    variants: dict[str, int | None] = {"copy": None, **{f"copy + hash, {k} KiB blocks": k << 10 for k in blocks_kib}}
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    try:
        for _ in range(reps + 1):  # the first round warms the threads and caches; not counted
            for name, block in variants.items():
                if block is not None:
                    copier.HASH_BLOCK_BYTES = block
                stage.add(src, dst, CHUNK_BYTES if block else None, {} if block else None)
                started = time.perf_counter()
                stage.run()
                seconds[name].append(time.perf_counter() - started)
    finally:
        copier.HASH_BLOCK_BYTES = shipped
        stage.close()
    rows = []
    base = statistics.median(seconds["copy"][1:])
    for name, values in seconds.items():
        median = statistics.median(values[1:])
        rows.append({"variant": name, "median_s": median, "per_gib_s": median / (mib / 1024),
                     "over_copy_s": median - base, "runs_s": values[1:]})
    return {"mib": mib, "reps": reps, "threads": 1 + copier.HELPERS, "chunk_bytes": CHUNK_BYTES, "rows": rows}


def table(res: dict[str, Any]) -> str:
    lines = [f"(m) the stage: {res['mib']} MiB on {res['threads']} thread(s), {res['reps']} reps, medians",
             f"{'variant':<34} {'s':>8} {'s / GiB':>8} {'+ over the copy':>16}"]
    for row in res["rows"]:
        lines.append(f"{row['variant']:<34} {row['median_s']:>8.3f} {row['per_gib_s']:>8.3f} "
                     f"{row['over_copy_s']:>16.3f}")
    return "\n".join(lines)

"""Coverage-guided fuzzing of the manifest and ``ravex.json`` parsers with atheris (libFuzzer).

Not run by CI (``pytest`` collects only ``test_*.py``); ``tests/format/test_fuzz_parsers.py`` is
the bounded hypothesis version that is. Run for as long as you like::

    pip install atheris
    python tests/fuzz/atheris_manifest.py -max_total_time=600          # seeds from a real store
    python tests/fuzz/atheris_manifest.py CORPUS_DIR -runs=100000      # or your own corpus

The property: whatever the bytes, parsing a manifest, opening a store whose ``ravex.json`` they
are, and listing / reading / validating a store whose step manifest they are raise only
``RavexError``. Anything else (a TypeError, a RecursionError, a MemoryError) is a crash that
libFuzzer reports with the input that caused it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile

import atheris

with atheris.instrument_imports():
    import numpy as np

    from ravex.format import RavexError, open_store
    from ravex.format.objects.names import manifest_key
    from ravex.format.reports.validate import validate
    from ravex.format.steps.manifest import Manifest

WORK = tempfile.mkdtemp(prefix="ravex-atheris-")
atexit.register(shutil.rmtree, WORK, ignore_errors=True)
STORE = os.path.join(WORK, "store")


def _seed_store() -> list[bytes]:
    """A real store (steps 1, 2) to mutate; returns its step-2 manifest and root document."""
    store = open_store(STORE, create=True)
    with store.writer(compression="zstd", chunk_bytes=16 << 10) as w:
        for s in (1, 2):
            w.commit(s, {"w": np.arange(8192, dtype=np.float32) + s, "b": np.ones(9, np.float16),
                         "opt": {"lr": 0.1, "betas": (0.9, 0.99), 3: b"\x00"}})
    with open(os.path.join(STORE, manifest_key(2, 0)), "rb") as f:
        manifest = f.read()
    with open(os.path.join(STORE, "ravex.json"), "rb") as f:
        root = f.read()
    return [b"M" + manifest, b"R" + root, b"S" + manifest]


SEEDS = _seed_store()
MANIFEST, ROOT = SEEDS[0][1:], SEEDS[1][1:]


def _swap(key: str, data: bytes, original: bytes, check) -> None:
    path = os.path.join(STORE, key)
    with open(path, "wb") as f:
        f.write(data)
    try:
        check()
    except RavexError:
        pass
    finally:
        with open(path, "wb") as f:
            f.write(original)


def _verbs() -> None:
    store = open_store(STORE)
    for info in store.steps():
        if info.complete:
            try:
                store.read(info.step)
            except RavexError:
                pass
    validate(STORE, full=True)
    store.gc(keep_last=1, dry_run=True)


def test_one_input(data: bytes) -> None:
    """First byte picks the target: M = manifest parser, R = ravex.json, S = the store's verbs."""
    if not data:
        return
    mode, body = data[:1], data[1:]
    if mode == b"R":
        _swap("ravex.json", body, ROOT, lambda: open_store(STORE))
    elif mode == b"S":
        _swap(manifest_key(2, 0), body, MANIFEST, _verbs)
    else:
        try:
            Manifest.from_bytes(body, "fuzz")
        except RavexError:
            pass


def main() -> None:
    argv = list(sys.argv)
    if not any(not a.startswith("-") for a in argv[1:]):  # no corpus given: seed one
        corpus = os.path.join(WORK, "corpus")
        os.makedirs(corpus)
        for i, seed in enumerate(SEEDS):
            with open(os.path.join(corpus, f"seed-{i}"), "wb") as f:
                f.write(seed)
        argv.append(corpus)
    atheris.Setup(argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()

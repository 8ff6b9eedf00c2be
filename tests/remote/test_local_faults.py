"""Local storage faults at the format level: disk full, read-only store, permission denied, EIO.

Each: the commit raises a StorageError (a RavexError and an OSError, errno kept) that
names the store; earlier steps stay intact and readable; no temp file is left; every
object on disk is whole (its bytes hash to its name: objects are renamed into place
only when complete). Mounting a tmpfs needs root (or CAP_SYS_ADMIN): skipped otherwise.
"""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from rhelpers import assert_same, objects_all_whole

import ravex
from ravex.format import open_store
from ravex.format.errors import RavexError, StorageError
from ravex.format.reports.validate import validate
from ravex.format.storage import LocalStorage


def _tree(step: int, mib: float) -> dict:
    rng = np.random.default_rng(step)
    n = int(mib * (1 << 20) / 4)
    return {"w": rng.standard_normal(n).astype("float32"), "b": rng.standard_normal(3000).astype("float32"),
            "step": step}


def _leftovers(root: str | Path) -> list[str]:
    return [os.path.join(d, f) for d, _, files in os.walk(root) for f in files if f.startswith(".tmp-")]


def _mount_tmpfs(where: Path, size: str) -> None:
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"mount -t tmpfs is not permitted here: {r.stderr.strip() or r.returncode}")


def _umount(where: Path) -> None:
    if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "disk"
    _mount_tmpfs(mnt, "2m")
    yield mnt
    _umount(mnt)


def test_disk_full_mid_commit(small_disk):
    url = str(small_disk / "store")
    store = open_store(url, create=True)
    with store.writer(chunk_bytes=256 << 10) as w:
        w.commit(1, _tree(1, 0.5))
        with pytest.raises(StorageError) as info:
            w.commit(2, _tree(2, 3.0))  # 3 MiB on a 2 MiB disk that holds 0.5 already
        err = info.value
        assert isinstance(err, RavexError) and isinstance(err, OSError)
        assert err.errno == errno.ENOSPC, err
        assert url in str(err) and "No space left" in str(err), err
        assert "\n" not in str(err)

        assert _leftovers(small_disk) == []
        assert objects_all_whole(store.storage) == []
        assert store.complete_steps() == [1]
        assert_same(open_store(url).read("latest"), _tree(1, 0.5))
        assert validate(url, full=True).ok

        # space comes back (GC drops the failed commit's orphans): the same writer goes on
        store.gc(grace_seconds=0)
        w.commit(3, _tree(3, 0.5))
    assert store.complete_steps() == [1, 3]
    assert_same(open_store(url).read(3), _tree(3, 0.5))


def test_read_only_store(tmp_path):
    mnt = tmp_path / "ro"
    _mount_tmpfs(mnt, "8m")
    try:
        url = str(mnt / "store")
        store = open_store(url, create=True)
        with store.writer() as w:
            w.commit(1, _tree(1, 0.3))
        r = subprocess.run(["mount", "-o", "remount,ro", str(mnt)], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"remount,ro is not permitted here: {r.stderr.strip()}")
        with store.writer() as w, pytest.raises(StorageError) as info:
            w.commit(2, _tree(2, 0.3))
        assert info.value.errno == errno.EROFS and url in str(info.value), info.value
        ro = open_store(url)
        assert ro.complete_steps() == [1]
        assert_same(ro.read("latest"), _tree(1, 0.3))
        assert validate(ro, full=True).ok
    finally:
        _umount(mnt)


_AS_NOBODY = r"""
import json, sys
sys.path.insert(0, sys.argv[2])
from ravex.format import open_store
from ravex.format.errors import StorageError
import numpy as np
store = open_store(sys.argv[1])
out = {"latest": store.latest_step(), "w0": float(store.read("latest")["w"][0])}
try:
    with store.writer() as w:
        w.commit(2, {"w": np.ones(100000, "float32"), "step": 2})
    out["committed"] = True
except StorageError as exc:
    out.update(error=str(exc), errno=exc.errno)
print(json.dumps(out))
"""


_IMPORTED = r"""
import json, sys
print(json.dumps(sorted({name.split(".")[0] for name, m in list(sys.modules.items())
                         if "site-packages" in (getattr(m, "__file__", None) or "")
                         and not m.__file__.startswith(sys.argv[2])})))
"""


def _copy_dependencies(lib: Path, url: str, base: Path) -> None:
    """Copy into ``lib`` the installed packages the child's code imports (found by running it
    as root on a scratch copy of the store): where they are installed (a venv inside a clone
    under a 0700 folder) may be unreadable to nobody too."""
    scratch = base / "scratch-store"
    shutil.copytree(url, scratch)
    probe = subprocess.run([sys.executable, "-c", _AS_NOBODY + _IMPORTED, str(scratch), str(lib)],
                           capture_output=True, text=True, timeout=120, cwd=base)
    assert probe.returncode == 0, probe.stderr
    shutil.rmtree(scratch)
    for name in json.loads(probe.stdout.strip().splitlines()[-1]):
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None, name
        if spec.submodule_search_locations:
            src = Path(next(iter(spec.submodule_search_locations)))
            shutil.copytree(src, lib / src.name, ignore=shutil.ignore_patterns("__pycache__", "tests"))
            vendored = src.with_name(f"{src.name}.libs")  # wheels' bundled shared libraries
            if vendored.is_dir():
                shutil.copytree(vendored, lib / vendored.name)
        else:
            shutil.copy(spec.origin, lib)


def test_permission_denied_as_unprivileged_user():
    """The writer runs as nobody (uid 65534) on a store only root may write. The child imports
    a copy of the ravex package and of the packages it uses, made in the world-readable temp
    folder, so the test does not depend on where the checkout or its venv sit (a clone under a
    0700 folder is unreadable to nobody)."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("needs root and setpriv(1) to run the writer as an unprivileged user")
    base = Path(tempfile.mkdtemp(prefix="ravex-perm-"))
    try:
        os.chmod(base, 0o755)
        url = str(base / "store")
        store = open_store(url, create=True)
        with store.writer() as w:
            w.commit(1, _tree(1, 0.2))
        lib = base / "lib"
        shutil.copytree(Path(ravex.__file__).parent, lib / "ravex", ignore=shutil.ignore_patterns("__pycache__"))
        _copy_dependencies(lib, url, base)
        for d, dirs, files in os.walk(base):  # readable by all, writable by root only
            for name in dirs:
                os.chmod(os.path.join(d, name), 0o755)
            for name in files:
                os.chmod(os.path.join(d, name), 0o644)
        r = subprocess.run(
            [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", _AS_NOBODY, url,
             str(lib)],
            capture_output=True, text=True, timeout=120, cwd=base,
            env={"PATH": os.environ.get("PATH", ""), "HOME": "/", "PYTHONDONTWRITEBYTECODE": "1"},
        )
        if r.returncode != 0 and "Operation not permitted" in r.stderr:
            pytest.skip(f"setpriv cannot drop privileges here: {r.stderr.strip()[-200:]}")
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert out["latest"] == 1 and out["w0"] == float(_tree(1, 0.2)["w"][0])
        assert "committed" not in out, out
        assert out["errno"] == errno.EACCES and url in out["error"] and "Permission denied" in out["error"], out
        assert _leftovers(base) == []
        assert open_store(url).complete_steps() == [1]
        assert validate(url, full=True).ok
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize(("prefix", "err"), [("objects/", errno.EIO), ("steps/", errno.ENOSPC)])
def test_eio_or_enospc_on_objects_or_manifest_leaves_no_partial_file(tmp_path, monkeypatch, prefix, err):
    """The fsync of a temp file below ``prefix`` fails with ``err``: the temp file exists and
    holds the data when the error comes (a chunk object's fsync runs at publish, in parallel)."""
    real_fsync = os.fsync
    url = str(tmp_path / "store")
    failing = {"on": False}

    def fsync(fd):
        path = os.readlink(f"/proc/self/fd/{fd}")
        if failing["on"] and os.path.basename(path).startswith(".tmp-") and \
                os.path.relpath(path, os.path.realpath(url)).startswith(prefix):
            raise OSError(err, os.strerror(err))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    store = open_store(url, create=True)
    with store.writer() as w:
        w.commit(1, _tree(1, 0.3))
    failing["on"] = True
    with store.writer() as w, pytest.raises(StorageError) as info:
        w.commit(2, _tree(2, 0.3))
    assert info.value.errno == err and url in str(info.value)
    assert _leftovers(url) == []
    assert objects_all_whole(LocalStorage(url)) == []
    again = open_store(url)
    assert again.complete_steps() == [1]
    assert_same(again.read(1), _tree(1, 0.3))
    assert validate(again, full=True).ok


def test_pending_objects_start_writeback_before_publish_and_stay_durable(tmp_path, monkeypatch):
    """Each chunk object's temp file is handed to the disk (sync_file_range) as soon as it is
    written, before the commit's fsyncs: the disk works while later chunks are hashed. The
    hint replaces no fsync: every temp file is still fsync'd before its rename."""
    from ravex.format.storage import atomic as storage_mod

    events: list[tuple[str, str]] = []
    real_start, real_fsync = storage_mod.start_writeback, os.fsync

    def start(fd):
        events.append(("writeback", os.readlink(f"/proc/self/fd/{fd}")))
        real_start(fd)

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    store = open_store(tmp_path / "store", create=True)
    monkeypatch.setattr(storage_mod, "start_writeback", start)
    monkeypatch.setattr(os, "fsync", fsync)
    with store.writer(chunk_bytes=1 << 20) as w:
        w.commit(1, _tree(1, 4))
    temps = [p for kind, p in events if kind == "writeback"]
    assert len(temps) >= 4 and all(os.path.basename(p).startswith(".tmp-") for p in temps)
    synced = [p for kind, p in events if kind == "fsync"]
    assert set(temps) <= set(synced)  # the hint never stands in for the fsync
    first_fsync = next(i for i, (kind, _) in enumerate(events) if kind == "fsync")
    assert all(events.index(("writeback", p)) < first_fsync for p in temps)  # before publish
    assert_same(open_store(tmp_path / "store").read(1), _tree(1, 4))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sync_file_range is Linux's")
def test_start_writeback_reaches_libc(tmp_path):
    from ravex.format.storage.writeback import load_sync_file_range

    fn = load_sync_file_range()
    assert fn, "libc's sync_file_range was not found"
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    try:
        os.write(fd, b"x" * 65536)
        assert fn(fd, 0, 0, 2) == 0
    finally:
        os.close(fd)

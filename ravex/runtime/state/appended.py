"""Files the script appends to: cut back at a resume to the size they had at the checkpoint.

The steps between a checkpoint and a crash run again after the resume, and what they appended to
a file the rerun appends once more: timm's ``train.py`` writes a row of ``summary.csv`` at the
end of each epoch (``open(..., mode="a")``), and a run killed after an epoch's end, resumed from
a step before it, held that epoch's row twice. A log written through ``logging.FileHandler``
(mode ``"a"`` by default) held the replayed steps' lines twice.

So every file this process opens for appending is noted (``open`` with an ``"a"`` mode,
:mod:`ravex.runtime.patches`), each checkpoint records the size of each such file (its open file
objects flushed first, so that the bytes written before the checkpoint are counted), and a resume
cuts each file that has grown past its recorded size back to it, saying so once. A file that is
now smaller than it was (rewritten, truncated), or another file by its name (replaced), is left as
it is and named. Files opened for writing or reading are not touched: a file rewritten whole comes
out the same either way. What another process appended to a noted file after the checkpoint is
cut too: the line says how many bytes each file lost.
"""

from __future__ import annotations

import logging
import os
import weakref
from typing import Any

logger = logging.getLogger("ravex")


class AppendedFiles:
    """The files this process opened for appending, and their sizes at a checkpoint."""

    def __init__(self) -> None:
        #: absolute path -> the file objects opened on it for appending (weakly: the script's)
        self._files: dict[str, weakref.WeakSet[Any]] = {}

    def opened(self, file: Any, mode: Any, handle: Any) -> None:
        """``open(file, mode)`` returned ``handle``: note it where the mode appends."""
        if not isinstance(mode, str) or "a" not in mode or not isinstance(file, (str, bytes, os.PathLike)):
            return
        try:
            path = os.path.abspath(os.fsdecode(file))
        except (TypeError, ValueError):
            return
        handles = self._files.setdefault(path, weakref.WeakSet())
        try:
            handles.add(handle)
        except TypeError:  # an object without weak references: the path alone is noted
            pass

    def capture(self) -> list[dict[str, Any]]:
        """Each noted file's size and inode now, ``[{"path", "size", "inode"}]`` (files gone are
        left out)."""
        sizes = []
        for path, handles in list(self._files.items()):
            for handle in list(handles):
                try:
                    if not handle.closed:
                        handle.flush()
                except (OSError, ValueError, AttributeError):
                    pass
            try:
                st = os.stat(path)
            except OSError:
                continue
            sizes.append({"path": path, "size": st.st_size, "inode": st.st_ino})
        return sizes

    def rewind(self, saved: list[dict[str, Any]], step: int) -> None:
        """Cut each file of ``saved`` (:meth:`capture` at ``step``) back to its size there, and
        note it again: the steps this run replays append to it as the first run did."""
        cut, left = [], []
        for entry in saved:
            path, size = str(entry["path"]), int(entry["size"])
            self._files.setdefault(path, weakref.WeakSet())
            try:
                st = os.stat(path)
            except OSError:
                continue
            now = st.st_size
            if entry.get("inode", st.st_ino) != st.st_ino:
                left.append(f"{_shown(path)} (another file by that name now)")
                continue
            if now < size:
                left.append(f"{_shown(path)} ({now} bytes, {size} at the checkpoint)")
                continue
            if now == size:
                continue
            try:
                os.truncate(path, size)
            except OSError as exc:
                left.append(f"{_shown(path)} ({exc})")
                continue
            cut.append(f"{_shown(path)} ({now - size} bytes)")
        if cut:
            logger.warning("ravex: cut back to their size at step %d, since the steps after it run again and "
                           "append once more: %s", step, ", ".join(cut))
        if left:
            logger.warning("ravex: not cut back to their size at step %d, so the steps after it may append "
                           "twice: %s", step, ", ".join(left))


def _shown(path: str) -> str:
    """``path`` relative to the working folder where it lies under it."""
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return path
    return path if relative.startswith("..") else relative

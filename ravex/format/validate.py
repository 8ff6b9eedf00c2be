"""Validation: every way a store can be damaged, reported distinctly.

Findings name the step, rank, tensor and chunk involved. Kinds:

- ``missing_root``, ``bad_root``, ``unknown_version``: the root document.
- ``malformed_manifest``, ``unsafe_name``: a manifest that cannot be trusted.
- ``incomplete_step``: a step missing the manifest of some rank (or mixing runs).
- ``missing_object``, ``size_mismatch``: an object a manifest names is absent or
  the wrong size (checked by listing, no reads).
- ``hash_mismatch``: an object's bytes do not hash to its name (``full=True`` reads them).
- ``orphan_object``: an object no manifest names (garbage, not damage: a warning).
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .codecs import pipeline
from .dtypes import data_type
from .errors import FormatVersionError, ManifestError, RavexError, StoreNotFoundError, UnsafeNameError
from .hashing import digest
from .keyview import decoded_chunk_size
from .manifest import ArrayEntry, ChunkRef, Manifest
from .names import manifest_ranks, object_key, step_dir
from .storage import Storage
from .summary import Progress, no_progress

if TYPE_CHECKING:
    from .store import CheckpointStore

ERROR_KINDS = {
    "missing_root",
    "bad_root",
    "unknown_version",
    "malformed_manifest",
    "unsafe_name",
    "missing_object",
    "size_mismatch",
    "hash_mismatch",
}
WARNING_KINDS = {"incomplete_step", "orphan_object"}


@dataclass(frozen=True)
class Finding:
    kind: str
    message: str
    step: int | None = None
    rank: int | None = None
    tensor: str | None = None
    chunk: str | None = None
    object: str | None = None

    @property
    def severity(self) -> str:
        return "error" if self.kind in ERROR_KINDS else "warning"

    def to_json(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if v is not None}
        d["severity"] = self.severity
        return d


@dataclass
class ValidationReport:
    url: str
    steps_checked: list[int] = field(default_factory=list)
    objects_checked: int = 0
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No errors (incomplete steps and orphans are warnings: a crash leaves them)."""
        return not any(f.severity == "error" for f in self.findings)

    def kinds(self) -> set[str]:
        return {f.kind for f in self.findings}

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "ok": self.ok,
            "steps_checked": self.steps_checked,
            "objects_checked": self.objects_checked,
            "findings": [f.to_json() for f in self.findings],
        }


def _chunk_damaged(data: bytes, ref: ChunkRef, entry: ArrayEntry) -> bool:
    """Whether one chunk's bytes inside a (damaged) object no longer decode to its ``raw``.

    Decodes into a buffer of exactly the chunk's decoded size, as a reader does: a damaged
    (or hostile) object cannot make validate allocate more than its shape allows."""
    start = ref.offset or 0
    stored = data[start : start + ref.size]
    if len(stored) != ref.size:
        return True
    try:
        pipe = pipeline(entry.codecs)
        if pipe.compressor is None:
            return digest(stored) != ref.raw
        decoded = pipe.decode(stored, decoded_chunk_size(entry))
    except Exception:
        return True
    return digest(decoded) != ref.raw


def _array_problems(step: int, manifests: list[Manifest]) -> list[Finding]:
    """What a reader would refuse in a complete step's merged arrays, without reading a chunk:
    an unknown data type or codec, a chunk map that is not exactly the chunk grid."""
    from .manifest import check_chunks_present, merge_arrays

    try:
        arrays = merge_arrays(manifests)
    except ManifestError as exc:
        return [Finding("malformed_manifest", str(exc), step)]
    found = []
    for path, entry in arrays.items():
        where = f"step {step} tensor {path!r}"
        try:
            data_type(entry.data_type)
            pipeline(entry.codecs, where)
            check_chunks_present(path, entry, step)
        except RavexError as exc:
            message = str(exc) if str(exc).startswith("step ") else f"{where}: {exc}"
            found.append(Finding("malformed_manifest", message, step, tensor=path))
    return found


def validate(
    url_or_store: object,
    full: bool = False,
    steps: list[int] | None = None,
    storage_options: dict[str, Any] | None = None,
    progress: Progress | None = None,
) -> ValidationReport:
    """Check a store. ``full=True`` also reads every object and verifies its hash.

    ``progress(done, total, what)`` is called as each step's manifests are reached (``what``
    is ``"step N"``), then, with ``full``, as each object is rehashed (``what`` is its name).
    Only the store's bounded manifest cache holds parsed manifests, and each object remembers
    the one chunk that first names it, so that 100 steps of 10,000 tensors fit in memory.
    """
    from .store import CheckpointStore, open_store

    progress = progress or no_progress
    if isinstance(url_or_store, CheckpointStore):
        store = url_or_store
    else:
        try:
            store = open_store(str(url_or_store), storage_options=storage_options)
        except StoreNotFoundError as exc:
            return ValidationReport(str(url_or_store), findings=[Finding("missing_root", str(exc))])
        except FormatVersionError as exc:
            return ValidationReport(str(url_or_store), findings=[Finding("unknown_version", str(exc))])
        except ManifestError as exc:
            return ValidationReport(str(url_or_store), findings=[Finding("bad_root", str(exc))])
    report = ValidationReport(store.url)
    storage: Storage = store.storage
    sizes = {o.key.rsplit("/", 1)[-1]: (o.key, o.size) for o in storage.walk("objects")}
    first_use: dict[str, _Use] = {}  # object -> the first chunk that names it
    sound: set[str] = set()  # objects some chunk finds present and large enough: the ones rehashed

    numbers = [s for s in store.step_numbers() if steps is None or s in steps]
    progress(0, len(numbers), "manifests")
    for i, step in enumerate(numbers):
        progress(i, len(numbers), f"step {step}")
        report.steps_checked.append(step)
        ranks = manifest_ranks(storage.list_dir(step_dir(step)))
        info = store.step_info(step, ranks)  # a complete step's manifests are parsed once, here
        good = True
        manifests = []
        for rank in ranks:
            try:
                m = store.manifest(step, rank)
            except UnsafeNameError as exc:
                report.findings.append(Finding("unsafe_name", str(exc), step, rank))
                good = False
                continue
            except FormatVersionError as exc:
                report.findings.append(Finding("unknown_version", str(exc), step, rank))
                good = False
                continue
            except (RavexError, OSError) as exc:
                report.findings.append(Finding("malformed_manifest", str(exc), step, rank))
                good = False
                continue
            manifests.append(m)
            for path, entry in m.arrays.items():
                for key, ref in entry.chunks.items():
                    if ref.object is None:
                        continue
                    first_use.setdefault(ref.object, _Use(step, rank, path, key))
                    problem = _listing_problem(ref, sizes.get(ref.object))
                    if problem is None:
                        sound.add(ref.object)
                    else:
                        kind, text = problem
                        report.findings.append(Finding(
                            kind, f"step {step} rank {rank} tensor {path!r} chunk {key}: object {ref.object} {text}",
                            step, rank, path, key, ref.object,
                        ))
        if good and not info.complete:
            report.findings.append(
                Finding("incomplete_step", f"step {step}: {info.problem} (ignored by readers)", step)
            )
        elif good:
            report.findings.extend(_array_problems(step, manifests))
    progress(len(numbers), len(numbers), "manifests")

    if full:
        names = sorted(sound)  # an object only ever too small is reported as that, not rehashed

        def check(name: str) -> list[Finding]:
            try:
                data = storage.read(object_key(name))
            except FileNotFoundError:
                return []  # deleted since the listing: a concurrent GC, not damage
            if digest(data) == name:
                return []
            use = first_use[name]
            return damaged_chunks(store, name, data, report.steps_checked) or [Finding(
                "hash_mismatch",
                f"step {use.step} rank {use.rank} tensor {use.tensor!r} chunk {use.chunk}: object {name} "
                "does not match its hash (corrupt bytes)",
                use.step, use.rank, use.tensor, use.chunk, name,
            )]

        progress(0, len(names), "objects")
        with ThreadPoolExecutor(max_workers=8) as pool:
            for i, (name, findings) in enumerate(zip(names, pool.map(check, names), strict=True)):
                progress(i, len(names), name)
                report.findings.extend(findings)
        report.objects_checked = len(names)
        progress(len(names), len(names), "")

    if steps is None:
        for name, (key, _size) in sizes.items():
            if name not in first_use:
                report.findings.append(
                    Finding("orphan_object", f"{key} is named by no manifest (garbage; `ravex gc` removes it)",
                            object=name)
                )
    return report


@dataclass(frozen=True)
class _Use:
    """Where an object is first named: step, rank, tensor and chunk."""

    step: int
    rank: int
    tensor: str
    chunk: str


def _listing_problem(ref: ChunkRef, found: tuple[str, int] | None) -> tuple[str, str] | None:
    """``(kind, message)`` when the listing shows the chunk's object absent or too small."""
    if found is None or found[0] != object_key(ref.object or ""):
        return "missing_object", "is missing"
    if ref.offset is None and found[1] != ref.size:
        return "size_mismatch", f"has {found[1]} bytes, manifest says {ref.size}"
    if ref.offset is not None and found[1] < ref.offset + ref.size:
        return "size_mismatch", f"has {found[1]} bytes, manifest says at least {ref.offset + ref.size}"
    return None


def damaged_chunks(store: CheckpointStore, name: str, data: bytes, steps: Iterable[int]) -> list[Finding]:
    """The chunks held in a damaged object whose bytes no longer decode to their raw digest.

    A pack object holds the chunks of many tensors; a flipped byte damages one of them. Each
    damaged chunk is reported once, at the oldest of ``steps`` that names it.
    """
    found: dict[tuple[str, str, str], Finding] = {}
    for step in steps:
        for rank in store.step_info(step).ranks:
            try:
                m = store.manifest(step, rank)
            except (RavexError, OSError):
                continue  # already a finding of its own
            for path, entry in m.arrays.items():
                for key, ref in entry.chunks.items():
                    if ref.object != name or (path, key, ref.raw) in found or not _chunk_damaged(data, ref, entry):
                        continue
                    found[(path, key, ref.raw)] = Finding(
                        "hash_mismatch",
                        f"step {step} rank {rank} tensor {path!r} chunk {key}: its bytes in object {name} "
                        "are corrupt (the object does not match its hash)",
                        step, rank, path, key, name,
                    )
    return list(found.values())

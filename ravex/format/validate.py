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

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from .codecs import pipeline
from .dtypes import data_type
from .errors import FormatVersionError, ManifestError, RavexError, StoreNotFoundError, UnsafeNameError
from .hashing import digest
from .keyview import decoded_chunk_size
from .manifest import ArrayEntry, ChunkRef, Manifest
from .names import manifest_ranks, object_key, step_dir
from .storage import Storage

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

    def to_json(self) -> dict:
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

    def to_json(self) -> dict:
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
    from .reader import check_chunks_present, merge_arrays

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
    url_or_store: object, full: bool = False, steps: list[int] | None = None, storage_options: dict | None = None
) -> ValidationReport:
    """Check a store. ``full=True`` also reads every object and verifies its hash."""
    from .store import CheckpointStore, open_store

    if isinstance(url_or_store, CheckpointStore):
        store = url_or_store
    else:
        try:
            store = open_store(str(url_or_store), storage_options=storage_options)
        except StoreNotFoundError as exc:
            report = ValidationReport(str(url_or_store))
            report.findings.append(Finding("missing_root", str(exc)))
            return report
        except FormatVersionError as exc:
            report = ValidationReport(str(url_or_store))
            report.findings.append(Finding("unknown_version", str(exc)))
            return report
        except ManifestError as exc:
            report = ValidationReport(str(url_or_store))
            report.findings.append(Finding("bad_root", str(exc)))
            return report
    report = ValidationReport(store.url)
    storage: Storage = store.storage
    sizes = {o.key.rsplit("/", 1)[-1]: (o.key, o.size) for o in storage.walk("objects")}
    referenced: dict[str, list[tuple[int, int, str, str, ChunkRef, ArrayEntry]]] = {}

    for step in store.step_numbers():
        if steps is not None and step not in steps:
            continue
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
                    referenced.setdefault(ref.object, []).append((step, rank, path, key, ref, entry))
                    found = sizes.get(ref.object)
                    where = f"step {step} rank {rank} tensor {path!r} chunk {key}"
                    if found is None or found[0] != object_key(ref.object):
                        report.findings.append(
                            Finding("missing_object", f"{where}: object {ref.object} is missing",
                                    step, rank, path, key, ref.object)
                        )
                    elif (found[1] != ref.size) if ref.offset is None else (found[1] < ref.offset + ref.size):
                        want = ref.size if ref.offset is None else f"at least {ref.offset + ref.size}"
                        report.findings.append(
                            Finding("size_mismatch",
                                    f"{where}: object {ref.object} has {found[1]} bytes, manifest says {want}",
                                    step, rank, path, key, ref.object)
                        )
        if good and not info.complete:
            report.findings.append(
                Finding("incomplete_step", f"step {step}: {info.problem} (ignored by readers)", step)
            )
        elif good:
            report.findings.extend(_array_problems(step, manifests))

    if full:
        def check(name: str) -> list[Finding]:
            try:
                data = storage.read(object_key(name))
            except FileNotFoundError:
                return []  # already reported as missing
            if digest(data) == name:
                return []
            # Name every chunk the damage reaches (a pack holds many: check each one's bytes).
            found, seen = [], set()
            for step, rank, path, key, ref, entry in referenced[name]:
                if (step, path, key) in seen or not _chunk_damaged(data, ref, entry):
                    continue
                seen.add((step, path, key))
                found.append(Finding("hash_mismatch",
                                     f"step {step} rank {rank} tensor {path!r} chunk {key}: object {name} "
                                     "does not match its hash (corrupt bytes)", step, rank, path, key, name))
            if not found:  # damage outside every chunk's bytes: name the object's first user
                step, rank, path, key, _ref, _entry = referenced[name][0]
                found.append(Finding("hash_mismatch",
                                     f"step {step} rank {rank} tensor {path!r} chunk {key}: object {name} "
                                     "does not match its hash (corrupt bytes)", step, rank, path, key, name))
            return found

        present = [n for n in referenced if n in sizes]
        with ThreadPoolExecutor(max_workers=8) as pool:
            for findings in pool.map(check, present):
                report.findings.extend(findings)
        report.objects_checked = len(present)

    if steps is None:
        for name, (key, _size) in sizes.items():
            if name not in referenced:
                report.findings.append(
                    Finding("orphan_object", f"{key} is named by no manifest (garbage; `ravex gc` removes it)",
                            object=name)
                )
    return report

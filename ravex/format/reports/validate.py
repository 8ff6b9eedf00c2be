"""Validation: every way a store can be damaged, reported distinctly.

Findings name the step, rank, tensor and chunk involved. Kinds:

- ``missing_root``, ``bad_root``, ``unknown_version``: the root document.
- ``malformed_manifest``, ``unsafe_name``: a manifest that cannot be trusted.
- ``incomplete_step``: a step missing the manifest of some rank (or mixing runs).
- ``missing_object``, ``size_mismatch``: an object a manifest names is absent or
  the wrong size (checked by listing, no reads).
- ``hash_mismatch``: a chunk's stored bytes are damaged (``full=True`` reads every object and
  every inline chunk): the finding names that chunk and its byte range in the object.
- ``unread_damage``: an object does not hash to its name, but no chunk a checked step reads
  from it is damaged: the damage lies in bytes no step reads (the dead region of a pack, an
  orphan object). A warning naming the object and the byte ranges that hold it.
- ``orphan_object``: an object no manifest names (garbage, not damage: a warning).
- ``malformed_lease``: a timeline's lease document (spec §21) does not parse: no reader minds,
  but the next run of that timeline waits for it to go stale before taking it over (a warning).
- ``malformed_witness``: a step's witness (spec §22) does not parse: its steps read exactly, but
  a run resuming from it cannot check itself (a warning).
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..errors import FormatVersionError, ManifestError, RavexError, StoreNotFoundError, UnsafeNameError
from ..history.leases import STALE_SECONDS, lease_problems
from ..history.witness import read_witness, witness_ranks
from ..objects.chunkref import ChunkRef
from ..objects.codecs import pipeline
from ..objects.dtypes import data_type
from ..objects.hashing import digest
from ..objects.names import check_object_name, manifest_ranks, object_key
from ..steps.keyview import decoded_chunk_size
from ..steps.manifest import ArrayEntry, Manifest
from ..storage import Storage
from .summary import Progress, no_progress

if TYPE_CHECKING:
    from ..store import CheckpointStore

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
WARNING_KINDS = {"incomplete_step", "orphan_object", "unread_damage", "malformed_lease", "malformed_witness"}


@dataclass(frozen=True)
class Finding:
    kind: str
    message: str
    step: int | None = None
    rank: int | None = None
    tensor: str | None = None
    chunk: str | None = None
    object: str | None = None
    #: ``[start, end)`` byte ranges of ``object`` the finding is about.
    ranges: tuple[tuple[int, int], ...] | None = None
    #: The timeline of ``step`` when it is not ``main`` (spec §19); None: main's step.
    timeline: str | None = None

    @property
    def severity(self) -> str:
        return "error" if self.kind in ERROR_KINDS else "warning"

    def to_json(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if v is not None}
        if self.ranges is not None:
            d["ranges"] = [list(r) for r in self.ranges]
        d["severity"] = self.severity
        return d


@dataclass
class ValidationReport:
    url: str
    #: main's steps as numbers, another timeline's as ``exp@60``.
    steps_checked: list[int | str] = field(default_factory=list)
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


#: What the stored bytes of one chunk are, as far as its ``raw`` digest and its codecs tell.
_INTACT, _DAMAGED, _UNPROVEN = "intact", "damaged", "unproven"


def _decoded(stored: bytes | memoryview, ref: ChunkRef, entry: ArrayEntry) -> bytes | memoryview | None:
    """A chunk's stored bytes decoded, or ``None`` when they do not decode to its ``raw`` digest
    (a reader refuses them). Decodes into a buffer of exactly the chunk's decoded size, as a
    reader does: damaged (or hostile) bytes cannot make validate allocate more than the shape allows."""
    if len(stored) != ref.size:
        return None
    try:
        decoded = pipeline(entry.codecs).decode(stored, decoded_chunk_size(entry))
    except Exception:
        return None
    return decoded if digest(decoded) == ref.raw else None


def _chunk_state(stored: bytes | memoryview, ref: ChunkRef, entry: ArrayEntry) -> str:
    """``_DAMAGED`` when a packed chunk's bytes do not decode to its ``raw`` digest; ``_INTACT``
    when they are exactly what encoding the decoded bytes gives; ``_UNPROVEN`` when they decode
    correctly but differ from a fresh encoding (a byte the codec ignores was hit, or the codec
    library encodes differently)."""
    decoded = _decoded(stored, ref, entry)
    if decoded is None:
        return _DAMAGED
    pipe = pipeline(entry.codecs)
    if pipe.compressor is None:
        return _INTACT
    try:
        again = pipe.encode(memoryview(decoded))
    except Exception:
        return _UNPROVEN
    return _INTACT if bytes(again) == bytes(stored) else _UNPROVEN


def _array_problems(step: int, manifests: list[Manifest], label: str) -> list[Finding]:
    """What a reader would refuse in a complete step's merged arrays, without reading a chunk:
    an unknown data type or codec, a chunk map that is not exactly the chunk grid."""
    from ..steps.manifest import check_chunks_present, merge_arrays

    try:
        arrays = merge_arrays(manifests)
    except ManifestError as exc:
        return [Finding("malformed_manifest", f"{label}: {exc}", step)]
    found = []
    for path, entry in arrays.items():
        where = f"{label} tensor {path!r}"
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
    Only the store's bounded manifest cache holds parsed manifests, and the only other state
    is the set of object names, so that 100 steps of 10,000 tensors fit in memory. An object
    that does not hash to its name is read again against every chunk the checked steps read
    from it (:func:`_object_damage`), so that the finding names the damaged chunks.
    """
    from ..store import CheckpointStore, open_store

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
    named: set[str] = set()  # objects some checked manifest names
    sound: set[str] = set()  # objects some chunk finds present and large enough: the ones rehashed
    parsed: list[tuple[CheckpointStore, int, int]] = []  # (timeline, step, rank) of every manifest that parsed

    every_step = steps is None
    views = [store]
    if every_step:  # every timeline's steps (spec §19): one's objects are never another's orphans
        try:
            views += _other_timelines(store)
        except (RavexError, OSError) as exc:
            report.findings.append(Finding("malformed_manifest", f"timelines: {exc}"))
    work = [(view, s) for view in views for s in view.step_numbers() if steps is None or s in steps]
    progress(0, len(work), "manifests")
    for i, (view, step) in enumerate(work):
        label = _step_label(view, step)
        progress(i, len(work), label)
        report.steps_checked.append(step if view is store else label.removeprefix("step "))
        found: list[Finding] = []
        names = storage.list_dir(view.step_dir(step))
        ranks = manifest_ranks(names)
        info = view.step_info(step, ranks)  # a complete step's manifests are parsed once, here
        good = True
        manifests = []
        for rank in ranks:
            try:
                m = view.manifest(step, rank)
            except UnsafeNameError as exc:
                found.append(Finding("unsafe_name", str(exc), step, rank))
                good = False
                continue
            except FormatVersionError as exc:
                found.append(Finding("unknown_version", str(exc), step, rank))
                good = False
                continue
            except (RavexError, OSError) as exc:
                found.append(Finding("malformed_manifest", f"{label}: {exc}" if view is not store else str(exc),
                                     step, rank))
                good = False
                continue
            manifests.append(m)
            parsed.append((view, step, rank))
            for path, entry in m.arrays.items():
                for key, ref in entry.chunks.items():
                    if ref.object is None:
                        if full and ref.inline is not None and _decoded(ref.inline, ref, entry) is None:
                            found.append(Finding(
                                "hash_mismatch", f"{label} rank {rank} tensor {path!r} chunk {key}: its inline "
                                "bytes in the manifest do not decode to its raw digest (corrupt manifest)",
                                step, rank, path, key,
                            ))
                        continue
                    named.add(ref.object)
                    problem = _listing_problem(ref, sizes.get(ref.object))
                    if problem is None:
                        sound.add(ref.object)
                    else:
                        kind, text = problem
                        found.append(Finding(
                            kind, f"{label} rank {rank} tensor {path!r} chunk {key}: object {ref.object} {text}",
                            step, rank, path, key, ref.object,
                        ))
        found.extend(_witness_problems(view, step, witness_ranks(names), label))
        if good and not info.complete:
            found.append(Finding("incomplete_step", f"{label}: {info.problem} (ignored by readers)", step))
        elif good:
            found.extend(_array_problems(step, manifests, label))
        report.findings.extend(_on_timeline(f, view, store) for f in found)
    progress(len(work), len(work), "manifests")

    orphans = [name for name in sizes if name not in named] if every_step else []
    if full:
        # an object only ever too small is reported as that, not rehashed; an orphan is rehashed
        # when it is a finished object (named by a digest, in its place), not a writer's temp file
        names = sorted(sound) + [n for n in orphans if _is_object(n, sizes[n][0])]

        def check(name: str) -> list[Finding]:
            try:
                data = storage.read(object_key(name))
            except FileNotFoundError:
                return []  # deleted since the listing: a concurrent GC, not damage
            if digest(data) == name:
                return []
            if name not in named:
                return [Finding(
                    "unread_damage",
                    f"{object_key(name)} is named by no manifest and does not match its hash: its bytes "
                    f"[0, {len(data)}) are damaged, and no step reads them",
                    object=name, ranges=((0, len(data)),),
                )]
            return _object_damage(store, name, data, parsed, every_step)

        progress(0, len(names), "objects")
        with ThreadPoolExecutor(max_workers=8) as pool:
            for i, (name, findings) in enumerate(zip(names, pool.map(check, names), strict=True)):
                progress(i, len(names), name)
                report.findings.extend(findings)
        report.objects_checked = len(names)
        progress(len(names), len(names), "")

    for name in orphans:
        report.findings.append(Finding(
            "orphan_object", f"{sizes[name][0]} is named by no manifest (garbage; `ravex gc` removes it)", object=name
        ))
    if every_step:
        for lease, trouble in lease_problems(storage):
            report.findings.append(Finding(
                "malformed_lease", f"{trouble}: the next run of timeline {lease.split('/')[1]!r} waits until it is "
                f"{STALE_SECONDS:.0f} s old to take it over; delete it if no run writes that timeline"))
    return report


def _witness_problems(view: CheckpointStore, step: int, ranks: list[int], label: str) -> list[Finding]:
    """A ``malformed_witness`` for each witness of the step that does not parse (spec §22)."""
    found = []
    for rank in ranks:
        try:
            read_witness(view.storage, view.steps_prefix, step, rank)
        except (RavexError, OSError) as exc:
            found.append(Finding("malformed_witness", f"{label} rank {rank}: {exc}; a run resuming from it "
                                 "cannot check itself (the step reads exactly)", step, rank))
    return found


def _other_timelines(store: CheckpointStore) -> list[CheckpointStore]:
    """Every timeline of the store but ``store``'s own, as views (spec §19)."""
    timelines = store.timelines()
    return [store.on_timeline(name, timelines) for name in timelines if name != store.timeline.name]


def _step_label(view: CheckpointStore, step: int) -> str:
    """``step 60`` on the store's main timeline, ``step exp@60`` on another: how messages name a step."""
    from ..history.timelines import MAIN

    return f"step {step}" if view.timeline.name == MAIN else f"step {view.timeline.name}@{step}"


def _on_timeline(finding: Finding, view: CheckpointStore, store: CheckpointStore) -> Finding:
    """``finding`` with its timeline set when it is about another timeline's step than ``store``'s
    (a bare step number would name the wrong step)."""
    from ..history.timelines import MAIN

    name = view.timeline.name
    return finding if view is store and name == MAIN else replace(finding, timeline=name)


def _is_object(name: str, key: str) -> bool:
    """Whether a file under ``objects/`` is where an object of that name belongs."""
    try:
        check_object_name(name, key)
    except UnsafeNameError:
        return False
    return key == object_key(name)


def _listing_problem(ref: ChunkRef, found: tuple[str, int] | None) -> tuple[str, str] | None:
    """``(kind, message)`` when the listing shows the chunk's object absent or too small."""
    if found is None or found[0] != object_key(ref.object or ""):
        return "missing_object", "is missing"
    if ref.offset is None and found[1] != ref.size:
        return "size_mismatch", f"has {found[1]} bytes, manifest says {ref.size}"
    if ref.offset is not None and found[1] < ref.offset + ref.size:
        return "size_mismatch", f"has {found[1]} bytes, manifest says at least {ref.offset + ref.size}"
    return None


def _object_damage(
    store: CheckpointStore, name: str, data: bytes, parsed: Iterable[tuple[CheckpointStore, int, int]],
    every_step: bool,
) -> list[Finding]:
    """Where the damage lies in an object that does not hash to its name.

    A pack holds the chunks of many tensors and, once GC has collected the steps that used
    some of them, bytes no step reads. Each chunk the manifests ``parsed`` read from the object
    is judged on its own bytes: a whole object's one chunk is damaged with it (a reader checks
    it against the object's name), a packed chunk when it does not decode to its ``raw`` digest.
    Damaged chunks are errors, each reported once, at the oldest step that names it. When no
    chunk is damaged, the damage lies in the bytes no step reads: a warning about the object
    naming those byte ranges. When every byte is read, it lies in the chunks whose bytes decode
    correctly but differ from a fresh encoding.
    """
    damaged: dict[tuple[str, str, str], Finding] = {}
    unproven: dict[tuple[str, str, str], Finding] = {}
    judged: set[tuple[str, str, str]] = set()
    spans: list[tuple[int, int]] = []
    for view, step, rank in parsed:
        try:
            m = view.manifest(step, rank)
        except (RavexError, OSError):
            continue  # already a finding of its own
        for path, entry in m.arrays.items():
            for key, ref in entry.chunks.items():
                if ref.object != name:
                    continue
                start = ref.offset or 0
                span = (start, start + ref.size)
                spans.append(span)
                if (path, key, ref.raw) in judged:
                    continue
                judged.add((path, key, ref.raw))
                state = _DAMAGED if ref.offset is None else _chunk_state(data[span[0] : span[1]], ref, entry)
                where = f"{_step_label(view, step)} rank {rank} tensor {path!r} chunk {key}: its bytes in object {name}"
                if state == _DAMAGED:
                    damaged[(path, key, ref.raw)] = _on_timeline(Finding(
                        "hash_mismatch", f"{where} are corrupt (the object does not match its hash)",
                        step, rank, path, key, name, (span,),
                    ), view, store)
                elif state == _UNPROVEN:
                    unproven[(path, key, ref.raw)] = _on_timeline(Finding(
                        "hash_mismatch", f"{where} are not what was written (the object does not match its hash), "
                        "though they still decode to the chunk",
                        step, rank, path, key, name, (span,),
                    ), view, store)
    if damaged:
        return list(damaged.values())
    unread = _unread(len(data), spans)
    if unread:
        reader = "no step" if every_step else "no step checked"
        return [Finding(
            "unread_damage",
            f"{object_key(name)} does not match its hash, but every chunk read from it is intact: the damage is "
            f"in bytes {_show_ranges(unread)}, which {reader} reads",
            object=name, ranges=tuple(unread),
        )]
    if unproven:
        return list(unproven.values())
    return [Finding(
        "hash_mismatch", f"{object_key(name)} does not match its hash, though every chunk read from it is intact "
        "(the object is misnamed)", object=name, ranges=((0, len(data)),),
    )]


def _unread(size: int, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The ``[start, end)`` ranges of ``[0, size)`` that no span covers."""
    gaps = []
    at = 0
    for start, end in sorted(spans):
        if start > at:
            gaps.append((at, min(start, size)))
        at = max(at, end)
    if at < size:
        gaps.append((at, size))
    return [(a, b) for a, b in gaps if a < b]


def _show_ranges(ranges: list[tuple[int, int]], limit: int = 3) -> str:
    shown = ", ".join(f"[{a}, {b})" for a, b in ranges[:limit])
    return shown if len(ranges) <= limit else f"{shown} and {len(ranges) - limit} more ranges"

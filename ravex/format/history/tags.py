"""Tags: names for steps that retention and GC never collect (spec/FORMAT.md §19).

A tag is one small document, ``tags/<name>.json``, naming a timeline and a step. It is
created once, exclusively (:meth:`~ravex.format.storage.Storage.create`), and deleted whole;
it is never rewritten, so tagging needs no lock. GC reads every tag before it decides what to
keep: a tagged step, and so every object its manifests name, stays.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import NameTakenError, StepNotFoundError
from ..objects.names import MAX_LABEL, check_label
from . import clock
from .jsondoc import load_named
from .timelines import DOC_VERSION, MAIN

if TYPE_CHECKING:
    from ..storage import Storage

TAGS = "tags"
TAG_FORMAT = "ravex-tag"


@dataclass(frozen=True)
class Tag:
    """A named step: ``timeline@step``."""

    name: str
    timeline: str
    step: int
    created_at: str = ""

    @property
    def ref(self) -> str:
        """``60`` on ``main``, ``exp@60`` elsewhere: what a verb takes as a step."""
        return str(self.step) if self.timeline == MAIN else f"{self.timeline}@{self.step}"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "timeline": self.timeline, "step": self.step, "created_at": self.created_at}


def tag_key(name: str) -> str:
    return f"{TAGS}/{name}.json"


def parse_tag(data: bytes, key: str) -> Tag:
    """A tag document, checked; a malformed one is a :class:`ManifestError` naming ``key``."""
    doc = load_named(data, key, "tag", TAG_FORMAT, "timeline", "step")
    return Tag(doc["name"], doc["timeline"], doc["step"], str(doc.get("created_at") or ""))


def read_tags(storage: Storage) -> dict[str, Tag]:
    """Every tag, by name. A document that does not parse is an error: GC must not guess
    which step it protects."""
    found: dict[str, Tag] = {}
    for entry in storage.list_dir(TAGS):
        name = entry.removesuffix(".json")
        if entry == name or len(name) > MAX_LABEL:
            continue
        try:
            check_label(name, "tag")
        except ValueError:
            continue  # a temp file or a name the layout never writes
        try:
            data = storage.read(tag_key(name))
        except FileNotFoundError:
            continue  # deleted between the listing and the read
        found[name] = parse_tag(data, tag_key(name))
    return found


def create_tag(storage: Storage, name: str, timeline: str, step: int) -> Tag:
    """Write tag ``name`` for ``timeline@step``, once. The caller checks that the step is complete."""
    check_label(name, "tag")
    tag = Tag(name, timeline, int(step), clock.now_iso())
    doc = {"format": TAG_FORMAT, "version": DOC_VERSION, **tag.to_json()}
    if not storage.create(tag_key(name), json.dumps(doc, indent=2).encode() + b"\n"):
        raise NameTakenError(
            f"tag {name!r} already exists in {storage.url!r}; tags are never moved: "
            f"`ravex tag --delete {name}` first, or pick another name"
        )
    return tag


def delete_tag(storage: Storage, name: str) -> Tag:
    """Remove tag ``name`` (its step becomes collectable again); the tag it was."""
    check_label(name, "tag")
    tags = read_tags(storage)
    if name not in tags:
        known = ", ".join(sorted(tags)[:10]) or "none"
        raise StepNotFoundError(f"no tag {name!r} in {storage.url!r}; tags: {known}")
    storage.delete([tag_key(name)])
    return tags[name]

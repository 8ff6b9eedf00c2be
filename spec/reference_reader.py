"""Reference reader for the Ravex checkpoint format, version 1.x (see spec/FORMAT.md).

Stand-alone: the standard library, numpy and numcodecs; nothing from Ravex, zarr or
torch. ``ml_dtypes`` (bfloat16, float8) and ``xxhash`` (checking chunk digests) are
used when importable: without ml_dtypes those tensors come back as their raw bits
(uint16 / uint8), without xxhash the digests are not checked.

    arrays, tree = read_step("path/to/store", "latest")
    python spec/reference_reader.py path/to/store [step]
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
import sys

import numcodecs
import numpy as np

try:
    import ml_dtypes
except ImportError:  # pragma: no cover - depends on the environment
    ml_dtypes = None
try:
    import xxhash
except ImportError:  # pragma: no cover
    xxhash = None

MAJOR = 1
VERSION = re.compile(r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$")
DECIMAL = re.compile(r"^(0|[1-9][0-9]*)$")
OBJECT_NAME = re.compile(r"^[0-9a-f]{32}$")
SEGMENT = re.compile(r"^[A-Za-z0-9._%-]+$")
CHUNK_KEY = re.compile(r"^c(/[0-9]+)*$")
SHUFFLE = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}
ROW_BYTES = 32  # a chunk table's row: raw digest 16, object index 4, offset 8, size 4 (spec §5.1)
MAX_ITEMSIZE = 16  # complex128: the stored-size bound of a chunk entry (§5) assumes it
DTYPES = {name: np.dtype(name).newbyteorder("<") for name in (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128")}
for _name, _bits in (("bfloat16", "<u2"), ("float8_e4m3fn", "u1"), ("float8_e5m2", "u1")):
    DTYPES[_name] = np.dtype(getattr(ml_dtypes, _name)) if ml_dtypes else np.dtype(_bits)


class FormatError(ValueError):
    """The store or a manifest breaks the spec."""


def load_json(path):
    with open(path, "rb") as f:
        return json.loads(f.read())


def check_version(doc, where):
    version = doc.get("version")
    if not isinstance(version, str) or not VERSION.match(version) or int(version.partition(".")[0]) != MAJOR:
        raise FormatError(f"{where}: format version {version!r}; this reader reads {MAJOR}.x")


def complete_steps(root):
    """Steps whose manifests rank-0 .. rank-(W-1) all exist, with the same W and run."""
    found = []
    steps_dir = os.path.join(root, "steps")
    for name in os.listdir(steps_dir) if os.path.isdir(steps_dir) else []:
        if not DECIMAL.match(name):
            continue
        try:
            first = load_json(os.path.join(steps_dir, name, "rank-0.json"))
            world = int(first["world_size"])
            ranks = [load_json(os.path.join(steps_dir, name, f"rank-{r}.json")) for r in range(world)]
        except (OSError, ValueError, KeyError):
            continue
        if all(m["world_size"] == first["world_size"] and m.get("run") == first.get("run")
               and m["step"] == int(name) and m["rank"] == r for r, m in enumerate(ranks)):
            found.append(int(name))
    return sorted(found)


def decode_value(doc, arrays):
    """Typed JSON (spec/FORMAT.md, "Values") to Python, with arrays looked up by path."""
    if doc is None or isinstance(doc, (bool, str, int)):
        return doc
    if isinstance(doc, list):
        return [decode_value(v, arrays) for v in doc]
    if not isinstance(doc, dict):
        raise FormatError(f"unexpected JSON value {doc!r} in the tree")
    if len(doc) == 1:
        ((tag, body),) = doc.items()
        if tag == "$float":
            return float(body)
        if tag == "$bytes":
            return base64.b64decode(body)
        if tag == "$tuple":
            return tuple(decode_value(v, arrays) for v in body)
        if tag == "$dict":
            return {decode_value(k, arrays): decode_value(v, arrays) for k, v in body}
        if tag == "$array":
            return arrays[body]
        if tag.startswith("$"):
            raise FormatError(f"unknown tag {tag!r}")
    return {k: decode_value(v, arrays) for k, v in doc.items()}


def codec(codecs, where):
    """The compressor of a codec list ``bytes[, zstd | blosc]`` (None for plain bytes)."""
    if not codecs or codecs[0]["name"] != "bytes" or len(codecs) > 2:
        raise FormatError(f"{where}: unsupported codecs {codecs!r}")
    if codecs[0].get("configuration", {}).get("endian", "little") != "little":
        raise FormatError(f"{where}: big-endian chunks")
    if len(codecs) == 1:
        return None
    name, conf = codecs[1]["name"], codecs[1].get("configuration", {})
    if name == "zstd":
        return numcodecs.Zstd(level=conf.get("level", 0), checksum=conf.get("checksum", False))
    if name == "blosc":
        return numcodecs.Blosc(cname=conf["cname"], clevel=conf["clevel"],
                               shuffle=SHUFFLE[conf["shuffle"]], blocksize=conf.get("blocksize", 0))
    raise FormatError(f"{where}: unknown codec {name!r}")


def grid_of(meta):
    """Chunks along each dimension (``()`` for 0-d: one chunk)."""
    shape, cshape = meta["shape"], meta["chunk_grid"]["configuration"]["chunk_shape"]
    if len(shape) != len(cshape) or min(cshape, default=1) < 1:
        raise FormatError(f"chunk shape {cshape} does not fit shape {shape}")
    return tuple(math.ceil(n / c) for n, c in zip(shape, cshape, strict=True))


def table_chunks(meta, table, where):
    """A chunk table (spec §5.1, since 1.2) as the packed chunk entries it stands for. Its rows
    are four little-endian columns one after the other (raw digests n x 16 bytes, object index
    n x uint32, offset n x uint64, size n x uint32); row i is grid index np.unravel_index(i, grid)."""
    grid = grid_of(meta)
    n = math.prod(grid)
    objects = table.get("objects") if isinstance(table, dict) else None
    if not isinstance(objects, list) or not all(isinstance(o, str) and OBJECT_NAME.match(o) for o in objects):
        raise FormatError(f"{where}: table 'objects' is not a list of object names")
    try:
        rows = base64.b64decode(table["rows"], validate=True)
    except (KeyError, TypeError, ValueError) as exc:
        raise FormatError(f"{where}: table 'rows' is not base64 ({exc})") from None
    if len(rows) != n * ROW_BYTES:
        raise FormatError(f"{where}: table rows hold {len(rows)} bytes, the grid {list(grid)} needs {n * ROW_BYTES}")
    raw = rows[: 16 * n].hex()
    index, offset, size = (np.frombuffer(rows, t, n, at).tolist()
                           for t, at in (("<u4", 16 * n), ("<u8", 20 * n), ("<u4", 28 * n)))
    if n and max(index) >= len(objects):
        raise FormatError(f"{where}: a table row names object {max(index)} of {len(objects)}")
    return {"/".join(["c", *map(str, key)]): {"object": objects[index[i]], "offset": offset[i], "size": size[i],
                                               "raw": raw[32 * i : 32 * i + 32]}
            for i, key in enumerate(np.ndindex(*grid))}


def read_chunk(root, ref, where):
    """The stored (encoded) bytes of one chunk entry."""
    if "inline" in ref:
        return base64.b64decode(ref["inline"])
    name = ref["object"]
    if not OBJECT_NAME.match(name):
        raise FormatError(f"{where}: bad object name {name!r}")
    with open(os.path.join(root, "objects", name[:2], name), "rb") as f:
        f.seek(ref.get("offset", 0))
        data = f.read(ref["size"])
    if len(data) != ref["size"]:
        raise FormatError(f"{where}: object {name} is truncated")
    return data


def read_array(root, path, meta, chunks):
    """One Zarr v3 array (regular grid, default "/" chunk keys) from its chunk entries."""
    dtype = DTYPES[meta["data_type"]]
    shape, cshape = tuple(meta["shape"]), tuple(meta["chunk_grid"]["configuration"]["chunk_shape"])
    compressor = codec(meta["codecs"], path)
    grid = list(grid_of(meta))
    if len(chunks) != (math.prod(grid) if math.prod(shape) else 0) or min(cshape, default=1) < 1:
        raise FormatError(f"tensor {path!r}: {len(chunks)} chunks for a grid of {grid}")  # before allocating
    limit = MAX_ITEMSIZE * math.prod(cshape)
    limit += limit // 64 + 4096  # what any codec chain makes of a full chunk, at most (§5)
    sizes = [len(ref["inline"]) * 3 // 4 if "inline" in ref else ref.get("size") for ref in chunks.values()]
    if not all(isinstance(n, (int, np.integer)) and not isinstance(n, bool) and 0 <= n <= limit for n in sizes):
        raise FormatError(f"tensor {path!r}: a chunk's stored size exceeds {limit} bytes or is not an integer; "
                          "the manifest is corrupt")  # (inline: base64 is 4 characters per 3 bytes)
    fill = meta["fill_value"]
    out = np.full(shape, complex(*fill) if isinstance(fill, list) else fill, dtype)
    for key, ref in chunks.items():
        where = f"tensor {path!r} chunk {key}"
        if not CHUNK_KEY.match(key):
            raise FormatError(f"{where}: bad chunk key")
        stored = read_chunk(root, ref, where)
        size = math.prod(cshape) * dtype.itemsize
        try:
            raw = bytes(stored) if compressor is None else compressor.decode(stored, np.empty(size, "u1")).tobytes()
        except (RuntimeError, ValueError) as exc:
            raise FormatError(f"{where}: does not decode to {size} bytes ({exc})") from None
        if len(raw) != size:
            raise FormatError(f"{where}: decoded to {len(raw)} bytes, expected {size}")
        if xxhash is not None and xxhash.xxh3_128_hexdigest(raw) != ref["raw"]:
            raise FormatError(f"{where}: bytes do not match the digest {ref['raw']}")
        block = np.frombuffer(raw, dtype).reshape(cshape)
        index = tuple(int(i) for i in key.split("/")[1:])
        if len(index) != len(shape) or any(i >= g for i, g in zip(index, grid, strict=True)):
            raise FormatError(f"{where}: key outside the array's chunk grid {grid}")
        region = tuple(slice(i * c, min((i + 1) * c, s)) for i, c, s in zip(index, cshape, shape, strict=True))
        out[region] = block[tuple(slice(0, r.stop - r.start) for r in region)]  # crop edge chunks
    return out


def read_step(root, step="latest", rank=0):
    """``(arrays, tree)``: every tensor of the step by path, and rank ``rank``'s state tree."""
    check_version(load_json(os.path.join(root, "ravex.json")), "ravex.json")
    steps = complete_steps(root)
    if step == "latest":
        if not steps:
            raise FormatError(f"{root!r} has no complete step")
        step = steps[-1]
    if int(step) not in steps:
        raise FormatError(f"step {step} is not complete in {root!r}; complete: {steps}")
    folder = os.path.join(root, "steps", str(int(step)))
    first = load_json(os.path.join(folder, "rank-0.json"))
    manifests = [load_json(os.path.join(folder, f"rank-{r}.json")) for r in range(first["world_size"])]
    metas, chunks = {}, {}
    for m in manifests:
        check_version(m, f"step {step} rank {m['rank']}")
        for path, entry in m["arrays"].items():
            if not all(SEGMENT.match(s) and set(s) != {"."} for s in path.split("/")):
                raise FormatError(f"unsafe array path {path!r}")
            if metas.setdefault(path, entry["zarr"]) != entry["zarr"]:
                raise FormatError(f"tensor {path!r}: ranks disagree on its metadata")
            if ("chunks" in entry) == ("table" in entry):
                raise FormatError(f"tensor {path!r}: an array entry holds exactly one of 'chunks' and 'table'")
            held = entry["chunks"] if "chunks" in entry else table_chunks(entry["zarr"], entry["table"], path)
            chunks.setdefault(path, {}).update(held)  # ranks hold disjoint chunks
    arrays = {path: read_array(root, path, metas[path], chunks[path]) for path in metas}
    return arrays, decode_value(manifests[rank]["tree"], arrays)


if __name__ == "__main__":
    arrays, tree = read_step(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "latest")
    for path, array in sorted(arrays.items()):
        print(f"{path}\t{array.dtype}\t{list(array.shape)}")

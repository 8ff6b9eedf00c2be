"""Another machine's store over one TCP connection: :class:`PeerStorage` and :class:`StorageServer`.

Two machines of one job each keep a local tier (``local:``) that the other cannot open. Each
serves its tier with a :class:`StorageServer`, and the other reaches it as a :class:`PeerStorage`:
a :class:`~.base.Storage` whose every method is one request answered by the server's storage.
Everything above the seam (``copy_step``, GC, ``fetch``) then works on the other machine's tier
as on any store, with the same ordering guarantees: each call returns only once the server's
storage has done it, so objects land (and are synced) before the manifest that names them.

Wire format, both ways: a frame is two big-endian uint64 lengths (header, payload), a JSON
header, then the payload bytes. The first frame of a connection carries the job's token (a
random string both sides got from the job's rendezvous): a connection without it is closed.
Times travel as ages or with the server's clock beside them, never as bare timestamps: the two
machines' clocks may differ, and GC's grace period must hold on the server's files whatever
they say. Nothing here knows about ranks or torch.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from .base import BytesLike, ObjectInfo, Storage

logger = logging.getLogger("ravex")

_LENGTHS = struct.Struct("!QQ")
#: a request's answer may take this long before the connection counts as lost (an object
#: of ~16 MiB over a slow link, a walk of a large tier)
REQUEST_TIMEOUT_S = 120.0
#: errors the server's storage raised that travel back as themselves (the callers branch on them)
_ERRORS: dict[str, type[OSError]] = {
    "FileNotFoundError": FileNotFoundError,
    "NotADirectoryError": NotADirectoryError,
    "FileExistsError": FileExistsError,
}


def _send(sock: socket.socket, header: dict[str, Any], payload: BytesLike = b"") -> None:
    head = json.dumps(header).encode()
    sock.sendall(_LENGTHS.pack(len(head), len(payload)) + head)
    if len(payload):
        sock.sendall(payload)


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    out = bytearray(size)
    view = memoryview(out)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:], size - got)
        if n == 0:
            raise ConnectionError("the peer closed the connection")
        got += n
    return bytes(out)


#: the largest first frame a server reads from a connection not yet known to hold the token
HELLO_MAX_BYTES = 4096


def _recv(sock: socket.socket, most: int | None = None) -> tuple[dict[str, Any], bytes]:
    """One frame; with ``most``, a frame larger than that is refused unread (a caller not yet
    known to hold the token gets no buffer of the size it names)."""
    head_len, payload_len = _LENGTHS.unpack(_recv_exact(sock, _LENGTHS.size))
    if most is not None and head_len + payload_len > most:
        raise ConnectionError(f"a frame of {head_len + payload_len} bytes where at most {most} were expected")
    header = json.loads(_recv_exact(sock, head_len))
    if not isinstance(header, dict):
        raise ConnectionError("a frame's header is not a JSON object")
    return header, _recv_exact(sock, payload_len)


def _check_key(key: Any) -> str:
    """A key as :class:`Storage` takes it: relative, ``/``-separated, no ``..``: a peer's request
    reaches nothing outside the served store."""
    if not isinstance(key, str) or key.startswith("/") or ".." in key.split("/") or "\\" in key:
        raise ValueError(f"{key!r} is not a key of this store")
    return key


class StorageServer:
    """Serves ``storage`` to :class:`PeerStorage` clients on ``host`` (port chosen by the system),
    one daemon thread per connection. ``token``: what a client must present first."""

    def __init__(self, storage: Storage, host: str, token: str) -> None:
        self.storage = storage
        self.token = token
        self._listener = socket.create_server((host, 0))
        self.host, self.port = self._listener.getsockname()[:2]
        self._closed = threading.Event()
        self._byes = threading.Condition()
        self.byes = 0  # clients that said they are done (:meth:`PeerStorage.bye`)
        threading.Thread(target=self._accept, name="ravex-peer-accept", daemon=True).start()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def wait_for_byes(self, count: int, timeout: float) -> bool:
        """Wait up to ``timeout`` s until ``count`` clients said bye; whether they did."""
        with self._byes:
            return self._byes.wait_for(lambda: self.byes >= count, timeout)

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), name="ravex-peer-serve", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                hello, _ = _recv(conn, HELLO_MAX_BYTES)
                if not hmac.compare_digest(str(hello.get("token", "")), self.token):
                    logger.warning("ravex: a connection to the local tier's server without this job's token "
                                   "was refused")
                    return
                _send(conn, {"ok": True})
                while not self._closed.is_set():
                    header, payload = _recv(conn)
                    _send(conn, *self._answer(header, payload))
            except (ConnectionError, OSError, ValueError):
                return  # the client went away (or spoke nonsense): its calls fail on its side

    def _answer(self, header: dict[str, Any], payload: bytes) -> tuple[dict[str, Any], BytesLike]:
        op = header.get("op")
        handler = _HANDLERS.get(str(op))
        if handler is None:
            return {"error": "ValueError", "message": f"unknown request {op!r}"}, b""
        if op == "bye":
            with self._byes:
                self.byes += 1
                self._byes.notify_all()
            return {"ok": True}, b""
        try:
            result, data = handler(self.storage, header, payload)
        except Exception as exc:
            return {"error": type(exc).__name__, "message": str(exc)}, b""
        return {"ok": True, "result": result}, data


Handler = Callable[[Storage, dict[str, Any], bytes], tuple[Any, BytesLike]]


def _walk(storage: Storage, header: dict[str, Any], payload: bytes) -> tuple[Any, bytes]:
    items = [[o.key, o.size, o.mtime] for o in storage.walk(_check_key(header["key"]))]
    return {"now": time.time(), "items": items}, b""


def _write(storage: Storage, header: dict[str, Any], payload: bytes) -> tuple[Any, bytes]:
    storage.write(_check_key(header["key"]), payload)
    return None, b""


def _sync(storage: Storage, header: dict[str, Any], payload: bytes) -> tuple[Any, bytes]:
    storage.sync()
    return None, b""


def _delete(storage: Storage, header: dict[str, Any], payload: bytes) -> tuple[Any, bytes]:
    storage.delete([_check_key(k) for k in header["keys"]])
    return None, b""


def _remove_empty_dir(storage: Storage, header: dict[str, Any], payload: bytes) -> tuple[Any, bytes]:
    storage.remove_empty_dir(_check_key(header["key"]))
    return None, b""


_HANDLERS: dict[str, Handler] = {
    "bye": lambda s, h, p: (None, b""),
    "read": lambda s, h, p: (None, s.read(_check_key(h["key"]))),
    "read_range": lambda s, h, p: (None, s.read_range(_check_key(h["key"]), int(h["start"]), int(h["end"]))),
    "write": _write,
    "create": lambda s, h, p: (s.create(_check_key(h["key"]), p), b""),
    "sync": _sync,
    "exists": lambda s, h, p: (s.exists(_check_key(h["key"])), b""),
    "size": lambda s, h, p: (s.size(_check_key(h["key"])), b""),
    "list_dir": lambda s, h, p: (s.list_dir(_check_key(h["key"])), b""),
    "walk": _walk,
    "delete": _delete,
    "delete_if_older": lambda s, h, p: (s.delete_if_older(_check_key(h["key"]), time.time() - float(h["age"])), b""),
    "remove_empty_dir": _remove_empty_dir,
}


class PeerStorage(Storage):
    """The store a :class:`StorageServer` at ``host:port`` serves, one request per call. Calls
    from several threads each take a connection of their own (opened as needed, kept for the
    next call); a connection that fails is dropped and the call raises :class:`ConnectionError`."""

    def __init__(self, host: str, port: int, token: str, name: str | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.host, self.port, self.token = host, int(port), token
        self.clock = clock  # this machine's (a test skews it against the server's)
        self._name = name or f"peer://{host}:{port}"
        self._idle: list[socket.socket] = []
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return self._name

    def _connect(self) -> socket.socket:
        sock = socket.create_connection((self.host, self.port), timeout=REQUEST_TIMEOUT_S)
        try:
            _send(sock, {"token": self.token})
            answer, _ = _recv(sock)
            if not answer.get("ok"):
                raise ConnectionError(f"{self._name} refused this job's token")
        except BaseException:
            sock.close()
            raise
        return sock

    def _call(self, op: str, payload: BytesLike = b"", **args: Any) -> tuple[Any, bytes]:
        with self._lock:
            sock = self._idle.pop() if self._idle else None
        if sock is None:
            sock = self._connect()
        try:
            _send(sock, {"op": op, **args}, payload)
            answer, data = _recv(sock)
        except BaseException:
            sock.close()
            raise
        with self._lock:
            self._idle.append(sock)
        if "error" in answer:
            kind = _ERRORS.get(str(answer["error"]), OSError)
            raise kind(f"{self._name}: {answer.get('message', '')}")
        return answer.get("result"), data

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for sock in idle:
            sock.close()

    def bye(self) -> None:
        """Tell the server this client is done (it may be waiting to exit until then)."""
        self._call("bye")

    def read(self, key: str) -> bytes:
        return self._call("read", key=key)[1]

    def read_range(self, key: str, start: int, end: int) -> bytes:
        return self._call("read_range", key=key, start=start, end=end)[1]

    def write(self, key: str, data: BytesLike) -> None:
        self._call("write", data, key=key)

    def create(self, key: str, data: BytesLike) -> bool:
        return bool(self._call("create", data, key=key)[0])

    def sync(self) -> None:
        self._call("sync")

    def exists(self, key: str) -> bool:
        return bool(self._call("exists", key=key)[0])

    def size(self, key: str) -> int:
        return int(self._call("size", key=key)[0])

    def list_dir(self, prefix: str) -> list[str]:
        return [str(name) for name in self._call("list_dir", key=prefix)[0]]

    def walk(self, prefix: str) -> Iterator[ObjectInfo]:
        """The server's listing, its modification times moved onto this machine's clock (by the
        difference of the two clocks when it answered): ages computed here (GC's grace, the
        objects ``copy_step`` trusts) hold whatever the machines' clocks say."""
        answer = self._call("walk", key=prefix)[0]
        shift = self.clock() - float(answer["now"])
        for key, size, mtime in answer["items"]:
            yield ObjectInfo(str(key), int(size), float(mtime) + shift)

    def delete(self, keys: Iterable[str]) -> None:
        self._call("delete", keys=list(keys))

    def delete_if_older(self, key: str, cutoff: float) -> bool:
        """Sent as an age (``cutoff`` on this machine's clock), checked on the server's clock."""
        return bool(self._call("delete_if_older", key=key, age=self.clock() - cutoff)[0])

    def remove_empty_dir(self, prefix: str) -> None:
        self._call("remove_empty_dir", key=prefix)

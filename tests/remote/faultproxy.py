"""A small fault-injecting HTTP/1.1 proxy for S3 tests, on loopback.

It sits in front of a real S3 server (moto) and, per request, by seeded
probabilities: forwards it; resets the connection (before forwarding, so the
request is lost, or after, so it took effect but its answer is lost); answers
500 InternalError or 503 SlowDown with an S3-style XML body without forwarding;
or delays it. ``outage`` makes it fail every request the same way (a persistent
outage). It counts requests by method and by S3 operation (``LIST`` is a GET on
a bucket, ``DELETE_MULTI`` a POST ``?delete``) and keeps a log.

    with FaultProxy(upstream_port, seed=1) as proxy:
        proxy.configure(reset=0.05, error=0.1)
        ... endpoint_url=proxy.url ...
        proxy.counts["PUT"]
"""

from __future__ import annotations

import http.client
import random
import socket
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade", "expect"}

_ERRORS = {
    500: ("InternalError", "We encountered an internal error. Please try again."),
    502: ("BadGateway", "Bad gateway."),
    503: ("SlowDown", "Please reduce your request rate."),
    403: ("AccessDenied", "Access Denied"),
}


@dataclass
class Faults:
    """Probabilities per request (they add up to at most 1) and the delay's length."""

    reset: float = 0.0
    error: float = 0.0  # half 500 InternalError, half 503 SlowDown
    delay: float = 0.0
    delay_seconds: tuple[float, float] = (0.05, 0.3)
    #: None, or how every request fails: "reset", 500, 503 or 403.
    outage: str | int | None = None
    #: Only requests whose method is in this set are faulted (None: all).
    methods: frozenset[str] | None = None


@dataclass
class Record:
    method: str
    op: str
    path: str
    fault: str  # "" when forwarded untouched
    status: int | None


@dataclass
class _State:
    faults: Faults = field(default_factory=Faults)
    counts: Counter = field(default_factory=Counter)
    ops: Counter = field(default_factory=Counter)
    faults_done: Counter = field(default_factory=Counter)
    log: list[Record] = field(default_factory=list)
    in_flight: Counter = field(default_factory=Counter)
    max_in_flight: Counter = field(default_factory=Counter)


class FaultProxy:
    """Start with ``start()`` (or ``with``); ``url`` is its endpoint."""

    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1", seed: int = 0) -> None:
        self.upstream = (upstream_host, upstream_port)
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._state = _State()
        proxy = self

        class Handler(_Handler):
            owner = proxy

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    # ---- control -----------------------------------------------------------------------

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FaultProxy:
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def configure(self, seed: int | None = None, **faults: object) -> None:
        """Replace the fault settings (unnamed ones reset to 0 / None)."""
        with self._lock:
            self._state.faults = Faults(**faults)  # type: ignore[arg-type]
            if seed is not None:
                self._rng = random.Random(seed)

    def reset_counts(self) -> None:
        with self._lock:
            self._state.counts.clear()
            self._state.ops.clear()
            self._state.faults_done.clear()
            self._state.log.clear()
            self._state.max_in_flight.clear()

    @property
    def counts(self) -> Counter:
        """Requests received, by HTTP method (faulted ones included)."""
        with self._lock:
            return Counter(self._state.counts)

    @property
    def ops(self) -> Counter:
        """Requests received, by S3 operation: GET, PUT, HEAD, LIST, DELETE, DELETE_MULTI, ..."""
        with self._lock:
            return Counter(self._state.ops)

    @property
    def faults_injected(self) -> Counter:
        with self._lock:
            return Counter(self._state.faults_done)

    @property
    def max_in_flight(self) -> Counter:
        """The most requests of each method that were being served at the same time."""
        with self._lock:
            return Counter(self._state.max_in_flight)

    def _enter(self, method: str) -> None:
        with self._lock:
            self._state.in_flight[method] += 1
            n = self._state.in_flight[method]
            if n > self._state.max_in_flight[method]:
                self._state.max_in_flight[method] = n

    def _leave(self, method: str) -> None:
        with self._lock:
            self._state.in_flight[method] -= 1

    @property
    def log(self) -> list[Record]:
        with self._lock:
            return list(self._state.log)

    # ---- per request -------------------------------------------------------------------

    def _decide(self, method: str) -> str:
        """"" (forward), "reset-before", "reset-after", "500", "503", "403", or "delay:<s>"."""
        with self._lock:
            f = self._state.faults
            if f.methods is not None and method not in f.methods:
                return ""
            if f.outage is not None:
                return "reset-before" if f.outage == "reset" else str(f.outage)
            x = self._rng.random()
            if x < f.reset:
                return "reset-before" if self._rng.random() < 0.5 else "reset-after"
            x -= f.reset
            if x < f.error:
                return "500" if self._rng.random() < 0.5 else "503"
            x -= f.error
            if x < f.delay:
                return f"delay:{self._rng.uniform(*f.delay_seconds):.3f}"
            return ""

    def _record(self, method: str, path: str, fault: str, status: int | None) -> None:
        op = _operation(method, path)
        with self._lock:
            self._state.counts[method] += 1
            self._state.ops[op] += 1
            if fault:
                self._state.faults_done[fault.split(":")[0]] += 1
            self._state.log.append(Record(method, op, path, fault, status))


def _operation(method: str, path: str) -> str:
    parts = urlsplit(path)
    query = parse_qs(parts.query, keep_blank_values=True)
    segments = [s for s in parts.path.split("/") if s]
    if method == "GET" and len(segments) <= 1:
        return "LIST"  # path-style: /bucket?list-type=2&prefix=...
    if method == "POST" and "delete" in query:
        return "DELETE_MULTI"
    if "uploads" in query or "uploadId" in query:
        return f"MULTIPART_{method}"
    return method


class _Handler(BaseHTTPRequestHandler):
    owner: FaultProxy
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def handle_expect_100(self) -> bool:
        return True  # answered in _serve, once the fault is known

    def _serve(self) -> None:
        self.owner._enter(self.command)
        try:
            self._serve_one()
        finally:
            self.owner._leave(self.command)

    def _serve_one(self) -> None:
        owner = self.owner
        method = self.command
        fault = owner._decide(method)
        expects = self.headers.get("Expect", "").lower() == "100-continue"
        if fault == "reset-before":
            owner._record(method, self.path, fault, None)
            self._reset()
            return
        if fault in ("500", "502", "503", "403"):
            owner._record(method, self.path, fault, int(fault))
            self._discard_body(expects)
            self._send_error(int(fault))
            return
        if expects:
            self.send_response_only(100)
            self.end_headers()
        body = self._read_body()
        if fault.startswith("delay:"):
            time.sleep(float(fault.split(":")[1]))
        try:
            status, headers, payload = self._forward(method, body)
        except OSError:
            owner._record(method, self.path, "upstream-down", None)
            self._reset()
            return
        owner._record(method, self.path, fault, status)
        if fault == "reset-after":
            self._reset()
            return
        self.send_response(status)
        for name, value in headers:
            if name.lower() not in _HOP and name.lower() not in ("content-length", "server", "date"):
                self.send_header(name, value)
        if method == "HEAD":
            length = next((v for n, v in headers if n.lower() == "content-length"), "0")
            self.send_header("Content-Length", length)
        else:
            self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if method != "HEAD" and payload:
            self.wfile.write(payload)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _serve

    # ---- helpers -----------------------------------------------------------------------

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _discard_body(self, expects: bool) -> None:
        if expects:
            self.close_connection = True  # the client never sent the body
        else:
            self._read_body()

    def _forward(self, method: str, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(*self.owner.upstream, timeout=30)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
            if body or method in ("PUT", "POST"):
                headers["Content-Length"] = str(len(body))
            conn.request(method, self.path, body=body if body else None, headers=headers)
            resp = conn.getresponse()
            payload = resp.read()
            return resp.status, resp.getheaders(), payload
        finally:
            conn.close()

    def _send_error(self, status: int) -> None:
        code, message = _ERRORS[status]
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{code}</Code><Message>{message}</Message>"
            "<RequestId>FAULTPROXY</RequestId></Error>"
        ).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        if status in (500, 503):
            self.send_header("Retry-After", "0")
        self.end_headers()
        if self.command != "HEAD":  # a HEAD response has no body (S3's neither): a client reads the next response there
            self.wfile.write(body)

    def _reset(self) -> None:
        """Close with RST instead of FIN: the client sees 'connection reset by peer'."""
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        self.close_connection = True
        try:
            self.connection.close()
        except OSError:
            pass
